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


EDGE_TEXTS = ["", " ", "\t\n", "short", "UPPER lower MiXeD", "émoji 🎉 text", "日本語のテキスト",
              "[CLS] [SEP] [PAD] [MASK] [UNK]", "a" * 3000, "word " * 600,
              "don't stop-believing... (really?!)", "\u200b\u00a0zero width"]


@pytest.mark.parametrize("max_tokens", [3, 8, 64, 256])
def test_the_rust_tokenizers_ids_equal_transformers_call_for_every_text(max_tokens):
    """encode_ids reads the Rust tokenizer directly: the ids of transformers' own call
    (truncation=True, max_length) for the shipped model on the regression set and edge cases,
    one by one (a request's few texts) and as a batch (more than SERIAL_TEXTS)."""
    from serve.common.regression import load_set
    from serve.recipes.source import SERIAL_TEXTS, encode_ids, load_tokenizer

    settings = Settings()
    tokenizer, _, digest = load_tokenizer(settings)
    texts = [*EDGE_TEXTS, *(e.text for e in load_set().examples)]
    assert len(texts) > SERIAL_TEXTS
    expected = tokenizer(texts, truncation=True, max_length=max_tokens,
                         padding=False)["input_ids"]
    assert encode_ids(tokenizer, texts, max_tokens) == expected  # the batch path
    for start in range(0, len(texts), 5):  # the one-by-one path
        chunk = texts[start:start + 5]
        assert encode_ids(tokenizer, chunk, max_tokens) == expected[start:start + 5]
    assert max(len(ids) for ids in expected) == max_tokens
    assert load_tokenizer(settings)[2] == digest  # the digest reads the untouched definition


def test_a_tokenizer_without_a_rust_one_is_called_as_before():
    from serve.recipes.source import encode_ids, truncating

    class Plain:  # e.g. a slow (pure Python) tokenizer
        def __call__(self, texts, truncation, max_length, padding):
            assert truncation and padding is False
            return {"input_ids": [[len(t)][:max_length] for t in texts]}

    plain = Plain()
    assert truncating(plain, 4) is None
    assert encode_ids(plain, ["ab", "abc"], 4) == [[2], [3]]
