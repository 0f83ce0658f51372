"""A generative arm's model deployment (serve.replica.generate_server) on the real Ray Serve of
the integration session, serving the real small LM: tokens streamed through Serve's streaming
handle are the model's greedy ones, what can never fit the KV budget is refused before the
first token, and a caller that stops reading frees its sequence and its cache."""

from __future__ import annotations

import time

import pytest
from ray import serve
from transformers import AutoModelForCausalLM, AutoTokenizer

from rollout.settings import Settings
from serve.replica.generate_server import GenerateServer, kv_budget_bytes
from tests.causal_lm import assert_greedy

APP = "generate-test"


@pytest.fixture(scope="module")
def generator(gateway, small_lm):
    """The deployment beside the session's gateway app (its Ray): half a MiB of KV cache, 256
    of the small LM's fp32 tokens."""
    settings = Settings(model_path=str(small_lm), kv_cache_mib=0.5, max_batch_size=8)
    app = GenerateServer.options(name="generate-baseline",
                                 ray_actor_options={"num_cpus": 0.1}).bind(settings, "baseline")
    handle = serve.run(app, name=APP, route_prefix=None)
    yield handle
    serve.delete(APP)


@pytest.fixture(scope="module")
def lm(small_lm):
    return (AutoModelForCausalLM.from_pretrained(small_lm).eval(),
            AutoTokenizer.from_pretrained(small_lm))


def stream(handle, prompt, **sampling):
    return handle.options(stream=True).generate.remote(prompt, sampling, 30.0)


def test_streamed_tokens_are_the_models_greedy_ones(generator, lm):
    model, tokenizer = lm
    prompt = tokenizer("The hospital reviewed the")["input_ids"]
    events = list(stream(generator, prompt, max_tokens=16, temperature=0))
    *tokens, last = events
    assert last["finish"] in ("length", "stop") and last["prompt_tokens"] == len(prompt)
    ids = [e["token"] for e in tokens]
    assert last["completion_tokens"] == len(ids) > 0
    assert "".join(e["text"] for e in events) == tokenizer.decode(ids, skip_special_tokens=True)
    assert_greedy(model, prompt, ids)
    info = generator.info.remote().result()
    assert info["tasks"] == ["generate"] and info["recipe"] == "fp32"
    assert info["kv_budget_bytes"] == 1 << 19 and info["kv_token_bytes"] == 2048
    assert info["kv_peak_bytes"] > 0


def test_what_can_never_fit_is_refused_before_the_first_token(generator, lm):
    _, tokenizer = lm
    prompt = tokenizer("The hospital reviewed the")["input_ids"]
    with pytest.raises(Exception, match="KV cache budget holds 256"):
        next(iter(stream(generator, prompt, max_tokens=300, temperature=0)))
    assert generator.info.remote().result()["sequences_waiting"] == 0


def test_a_caller_that_stops_reading_frees_its_sequence(generator, lm):
    _, tokenizer = lm
    prompt = tokenizer("Local news: the")["input_ids"]
    response = stream(generator, prompt, max_tokens=240, temperature=0, ignore_eos=True)
    events = iter(response)
    assert [next(events)["finish"] for _ in range(3)] == [None, None, None]
    assert generator.info.remote().result()["sequences_running"] == 1
    response.cancel()
    deadline = time.monotonic() + 20
    while (info := generator.info.remote().result())["sequences_running"] \
            or info["kv_in_use_bytes"]:
        assert time.monotonic() < deadline, info
        time.sleep(0.1)


def test_the_default_budget_is_a_quarter_of_available_memory(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 8000000 kB\nMemAvailable: 4000000 kB\n")
    assert kv_budget_bytes(0, str(meminfo)) == 4000000 * 1024 // 4
    assert kv_budget_bytes(3, str(meminfo)) == 3 << 20
    assert kv_budget_bytes(0.5, str(meminfo)) == 1 << 19
    assert kv_budget_bytes(0, str(tmp_path / "none")) > 0
