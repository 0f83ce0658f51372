"""`rollout verify` with a causal LM judges the arms by their tokens (ops.verify.token_runner),
with the real small LM: the int8 recipe's and bf16's figures per slice, judged by the gates; a
copy of the model whose weights were rounded to 4 bits per tensor fails; the verdict is stored
in a real Redis against the versions the generative replicas serve; what cannot be compared is
refused. `auto` measures the recipes that apply, serves the fastest that keeps the tokens (or
fp32), and verify and a generative replica judge and serve the same cached choice."""

from __future__ import annotations

import io
import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ops import cli
from ops.bench.generate_recipes import damaged_4bit
from rollout import Settings
from rollout.redis_store import RedisStateStore
from rollout.verdict import Thresholds
from serve.recipes.auto import causal
from serve.recipes.auto.choose import detect_hardware
from serve.recipes.source import variant_version, weights_digest


@pytest.fixture(scope="module")
def damaged(small_lm, tmp_path_factory):
    """The small LM with every Linear weight rounded to 16 levels per tensor: damage made by
    construction, brought as its own folder (a checkpoint a team quantized badly)."""
    folder = tmp_path_factory.mktemp("damaged-lm")
    model = AutoModelForCausalLM.from_pretrained(small_lm, dtype=torch.float32)
    damaged_4bit(model).save_pretrained(folder)
    AutoTokenizer.from_pretrained(small_lm).save_pretrained(folder)
    return folder


def _verify(monkeypatch, small_lm, *args, redis_url=None, **env):
    monkeypatch.setenv("CANARY_MODEL_PATH", str(small_lm))
    monkeypatch.setenv("CANARY_VERIFY_BATCH_SIZES", "8")
    monkeypatch.setenv("CANARY_VERIFY_SPEED_BATCH", "8")
    for name, value in env.items():
        monkeypatch.setenv(name, str(value))
    out, err = io.StringIO(), io.StringIO()
    head = ["--redis-url", redis_url, "--app", "verify-lm", "--actor", "ci"] if redis_url else []
    code = cli.main([*head, "verify", "--quiet", *args], stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_the_int8_recipe_is_judged_by_its_tokens_and_its_verdict_stored(
        monkeypatch, small_lm, redis_url):
    code, out, err = _verify(monkeypatch, small_lm, "--json", redis_url=redis_url,
                             CANARY_OPTIMIZED_RECIPE="int8-dynamic-per-channel")
    assert code in (0, 1), err
    doc = json.loads(out)
    assert doc["task"] == "generate" and doc["split"] == "held-out"
    assert doc["n"] >= 150 and doc["continuation_tokens"] == 32  # of 200 prompts
    assert doc["kld"] < 0.01 and doc["kld_upper_bound"] < 0.01, doc["failures"]
    assert doc["agreement_lower_bound"] >= 0.95, doc["failures"]
    assert 0 < doc["token_kld_mean"] <= doc["token_kld_p99"] <= doc["token_kld_max"]
    assert 0 < doc["identical"] < 1 and doc["perplexity_optimized"] > 1
    judged = [row for row in doc["slices"] if row["judged"]]
    assert {"script:latin", "length:1-16"} <= {row["slice"] for row in judged}
    assert all(row["kld_interval"][0] <= row["kld"] <= row["kld_interval"][1] for row in judged)
    assert len(doc["responses"]) == doc["n"] and doc["responses"][0]["prompt"]
    assert doc["passed"] == (doc["speedup"] >= 1.0) == (code == 0)  # fidelity passed: speed
    store = RedisStateStore(redis_url, "verify-lm")
    try:
        verdict = store.get_verdict(doc["baseline_version"], doc["optimized_version"])
    finally:
        store.close()
    assert verdict.task == "generate" and verdict.kld == doc["kld"]
    assert verdict.agreement == doc["agreement"] and verdict.n == doc["n"]
    assert verdict.thresholds.max_kld == 0.01 and verdict.speed_judged
    # the versions a generative replica serves (serve.replica.generate_server)
    assert doc["optimized_version"] == variant_version(weights_digest(small_lm),
                                                       "int8-dynamic-per-channel")


def test_bf16_prints_its_figures_per_slice_and_passes_its_token_gates(monkeypatch, small_lm):
    code, out, err = _verify(monkeypatch, small_lm, "--no-store", "--no-speed",
                             CANARY_OPTIMIZED_RECIPE="bf16")
    assert code == 0, out + err
    for shown in ("KL divergence, nats (clipped at 1)", "top-1 token agreement",
                  "per token (shown): KLD mean", "greedy continuations identical",
                  "perplexity of the baseline's continuations", "by slice, worst agreement",
                  "script:latin", "speed: not measured", "verdict: PASS"):
        assert shown in out, shown


def test_weights_rounded_to_4_bits_fail_by_kl_divergence_and_token_agreement(
        monkeypatch, small_lm, damaged):
    code, out, err = _verify(monkeypatch, small_lm, "--no-store", "--json", "--no-speed",
                             CANARY_OPTIMIZED_MODEL_PATH=damaged,
                             CANARY_OPTIMIZED_RECIPE="fp32")
    assert code == 1, err
    doc = json.loads(out)
    assert doc["kld"] > 0.01 and doc["agreement"] < 0.95 and not doc["passed"]
    assert any(f.startswith("KL divergence") for f in doc["failures"])
    assert any(f.startswith("top-1 token agreement") for f in doc["failures"])
    assert any(f.startswith("slice script:latin KL divergence") for f in doc["failures"])


def test_what_cannot_be_compared_is_refused_before_scoring(
        monkeypatch, small_lm, tmp_path):
    code, _, err = _verify(monkeypatch, small_lm, "--no-store", CANARY_OPTIMIZED_RECIPE="fp32",
                           CANARY_VERIFY_CONTINUATION_TOKENS=600)
    assert code == 2 and "no prompt of the set fits the model's context of 512" in err
    monkeypatch.delenv("CANARY_VERIFY_CONTINUATION_TOKENS")
    other = tmp_path / "other-tokenizer"
    AutoModelForCausalLM.from_pretrained(small_lm).save_pretrained(other)
    tokenizer = AutoTokenizer.from_pretrained(small_lm)
    tokenizer.add_tokens(["zzqx-new-token"])
    tokenizer.save_pretrained(other)
    code, _, err = _verify(monkeypatch, small_lm, "--no-store", CANARY_OPTIMIZED_RECIPE="fp32",
                           CANARY_OPTIMIZED_MODEL_PATH=other)
    assert code == 2 and "the arms' tokenizers differ" in err


def test_captured_prompts_replay_whole_through_verify(monkeypatch, small_lm, tmp_path):
    """A set `rollout flips --export` wrote from parted generated answers (rollout.flips): each
    text is given whole as the prompt, judged as an external set."""
    from rollout.flips import FlipRecord, to_regression_row

    texts = ["The hospital reviewed the", "Local news: the minister", "Why the mental health"]
    rows = [to_regression_row(FlipRecord(
        ts=1.0, request_id=f"r{i}", task="generate", text=text, baseline_label="",
        baseline_margin=0.0, optimized_label="", optimized_margin=0.0, parted_at=1, kld=0.02))
        for i, text in enumerate(texts)]
    path = tmp_path / "parted.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    code, out, err = _verify(monkeypatch, small_lm, "--no-store", "--no-speed", "--json",
                             "--set", str(path), CANARY_OPTIMIZED_RECIPE="bf16")
    assert code in (0, 1), err
    doc = json.loads(out)
    assert doc["split"] == "external"
    tokenizer = AutoTokenizer.from_pretrained(small_lm)
    given = {tuple(r["prompt_ids"]) for r in doc["responses"]}
    assert given <= {tuple(tokenizer(text)["input_ids"]) for text in texts} and given


def test_auto_serves_the_fastest_recipe_that_keeps_the_tokens_and_replicas_find_it(
        monkeypatch, small_lm, tmp_path):
    code, out, err = _verify(monkeypatch, small_lm, "--no-store", "--json", "--no-speed",
                             CANARY_OPTIMIZED_RECIPE="auto",
                             CANARY_AUTO_CHOICE_DIR=tmp_path / "choices")
    assert code == 0, err
    doc = json.loads(out)
    auto = doc["auto"]
    assert auto["recipe"] == doc["recipe"] and not auto["fallback"], auto["reason"]
    assert [e["recipe"] for e in auto["evidence"]] == list(
        causal.candidates(detect_hardware("cpu")))  # bf16 first where it is native
    won = next(e for e in auto["evidence"] if e["recipe"] == auto["recipe"])
    assert won["passed"] and won["speedup"] > 1.0 and won["n"] >= 150
    # timed at the replica's batch (max_batch_size 16) and verify's (8 here), the lower kept
    assert set(won["speedups"]) == {"8", "16"} and won["speedup"] == min(won["speedups"].values())
    assert won["kld_upper_bound"] <= 0.009 and won["lower_bound"] >= 0.955  # auto's margin
    assert all(e["passed"] or e["failures"] for e in auto["evidence"])
    assert doc["optimized_version"] == variant_version(weights_digest(small_lm), auto["recipe"])
    # a generative replica finds the stored choice: nothing is measured again
    from serve.replica.generate_server import GenerateServer

    def measured(*_, **__):
        raise AssertionError("measured again")

    monkeypatch.setattr(causal, "reference", measured)
    server = GenerateServer.func_or_class(Settings(), "optimized")
    try:
        assert server.version == doc["optimized_version"] and server.recipe == auto["recipe"]
        assert server.info()["auto"].startswith(f"auto → {auto['recipe']} (measured ")
    finally:
        server.runner.close()


def test_auto_serves_fp32_when_no_candidate_keeps_the_tokens(monkeypatch, small_lm, tmp_path):
    # every candidate timed faster: on a busy machine the timing alone could refuse them all,
    # before the tokens this test is about are judged
    monkeypatch.setattr("serve.recipes.auto.causal._speedups",
                        lambda found, _model, _bar: ({b: 2.0 for b in found.batches}, False))
    code, out, err = _verify(monkeypatch, small_lm, "--no-store", "--json", "--no-speed",
                             CANARY_OPTIMIZED_RECIPE="auto", CANARY_VERIFY_MAX_KLD="0.000001",
                             CANARY_VERIFY_PROMPTS=40, CANARY_AUTO_CHOICE_DIR=tmp_path)
    assert code == 0, err  # fp32 against fp32: nothing parts
    doc = json.loads(out)
    assert doc["auto"]["fallback"] and doc["recipe"] == "fp32" and doc["kld"] == 0
    assert "no candidate passed the gate" in doc["auto"]["reason"]
    judged = [e for e in doc["auto"]["evidence"] if e["kld"] is not None]
    assert judged and all(f.startswith("KL divergence") for e in judged
                          for f in e["failures"][:1])


def test_a_candidate_far_slower_than_its_bar_is_refused_by_the_screen(small_lm):
    settings = Settings(model_path=str(small_lm), verify_prompts=8, verify_batch_sizes=(4,),
                        verify_speed_batch=4)
    fp32 = AutoModelForCausalLM.from_pretrained(small_lm, dtype=torch.float32).eval()
    found = causal.reference(settings, fp32, AutoTokenizer.from_pretrained(small_lm), (2, 4))
    assert 0 < len(found.responses) <= 8 and len(found.sample) == 8
    evidence = causal.measure_candidate(found, "int8-dynamic", Thresholds(min_speedup=50.0))
    assert not evidence.passed and evidence.kld is None  # its tokens were never scored
    assert evidence.failures[0].startswith("speedup screened at ")
    assert evidence.failures[0].endswith("on 2 sequences of 8 tokens < 50.0x")

