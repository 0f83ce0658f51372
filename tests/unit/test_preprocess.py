"""Gateway-side tokenization (serve.gateway.preprocess) against the model's own, on the tiny
encoder."""

import asyncio

import pytest

from rollout import Settings
from serve.gateway.preprocess import Preprocessor
from serve.recipes.source import Encoded
from serve.recipes.variants import Variant
from tests.tiny_model import make_tiny_encoder
from tests.variant_settings import groups

TEXTS = ["short", "a somewhat longer input with more words in it " * 40, "émoji 🎉 text"]


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory):
    return make_tiny_encoder(tmp_path_factory.mktemp("enc"))


def _info(variant: Variant) -> dict:
    return {"tokenizer": variant.tokenizer_digest}


def test_gateway_ids_equal_the_models_and_carry_their_time(encoder_dir):
    settings = Settings(model_path=str(encoder_dir), max_tokens=64)
    variant = Variant(groups(settings), "baseline")
    pre = Preprocessor(settings, settings, [_info(variant), _info(variant)])
    assert pre.enabled
    encoded = asyncio.run(pre.encode(TEXTS))
    assert isinstance(encoded, Encoded)
    assert encoded.ids == variant.encode(TEXTS).ids and len(encoded.ids[1]) == 64  # truncated
    assert encoded.preprocess_ms is not None and encoded.preprocess_ms >= 0
    pre.close()


def test_texts_go_through_when_the_models_tokenize_differently(encoder_dir):
    settings = Settings(model_path=str(encoder_dir), max_tokens=64)
    other = Variant(groups(settings.model_copy(update={"max_tokens": 32})), "baseline")
    pre = Preprocessor(settings, settings, [_info(other), _info(other)])  # other truncation
    assert not pre.enabled
    assert asyncio.run(pre.encode(TEXTS)) is TEXTS


def test_zero_threads_turns_it_off(encoder_dir):
    settings = Settings(model_path=str(encoder_dir), gateway_tokenize_threads=0)
    pre = Preprocessor(settings, settings, [{"tokenizer": "anything"}])
    assert not pre.enabled and asyncio.run(pre.encode(TEXTS)) is TEXTS


def test_a_tokenizer_failure_sends_the_texts(encoder_dir):
    settings = Settings(model_path=str(encoder_dir))
    variant = Variant(groups(settings), "baseline")
    pre = Preprocessor(settings, settings, [_info(variant)])

    def broken(*args, **kwargs):
        raise RuntimeError("tokenizer broke")

    pre.tokenizer = broken
    assert asyncio.run(pre.encode(TEXTS)) is TEXTS
    pre.close()


def test_large_requests_are_tokenized_in_the_pool_small_ones_inline(encoder_dir):
    from serve.gateway.preprocess import INLINE_CHARS

    settings = Settings(model_path=str(encoder_dir), max_tokens=512)
    variant = Variant(groups(settings), "baseline")
    pre = Preprocessor(settings, settings, [_info(variant)])
    threads = []
    real = pre.tokenizer

    def spy(*args, **kwargs):
        import threading

        threads.append(threading.current_thread().name)
        return real(*args, **kwargs)

    pre.tokenizer = spy
    small, large = ["a short one"], ["word " * (INLINE_CHARS // 5 + 1)]
    assert asyncio.run(pre.encode(small)).ids == variant.encode(small).ids
    assert asyncio.run(pre.encode(large)).ids == variant.encode(large).ids
    assert threads[0] == "MainThread" and threads[1].startswith("tokenize")
    pre.close()
