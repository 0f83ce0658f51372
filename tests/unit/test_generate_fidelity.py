"""Teacher-forced fidelity of a causal LM to fp32 (serve.generative.fidelity) and the recipes'
bench on the small LM (ops.bench.generate_recipes): identical models score zero, a faithful
recipe scores far below a model damaged by construction, and the bench says why it refuses."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ops.bench import generate_recipes
from ops.bench.generate_loop import prompts
from serve.generative.fidelity import compare, continuation_logits, first_divergence, greedy


@pytest.fixture(scope="module")
def lm(small_lm):
    return (AutoModelForCausalLM.from_pretrained(small_lm).eval(),
            AutoTokenizer.from_pretrained(small_lm))


def test_a_model_against_itself_scores_zero_divergence(lm):
    model, tokenizer = lm
    prompt = tokenizer("The hospital reviewed the")["input_ids"]
    continuation = [5, 9, 12, 40]
    logits = continuation_logits(model, prompt, continuation)
    assert logits.shape == (4, model.config.vocab_size)
    scored = compare(logits, logits.clone(), continuation)
    assert max(scored.kld) < 1e-6 and all(scored.same_top)
    assert scored.reference_nll == scored.other_nll


def test_kl_divergence_is_the_reference_weighted_log_ratio():
    p = torch.tensor([[2.0, 1.0, 0.0]])
    q = torch.tensor([[0.0, 1.0, 2.0]])
    scored = compare(p, q, [0])
    lp, lq = p.log_softmax(-1), q.log_softmax(-1)
    assert scored.kld[0] == pytest.approx(float((lp.exp() * (lp - lq)).sum()), rel=1e-6)
    assert scored.same_top == [False]
    assert scored.reference_nll[0] == pytest.approx(float(-lp[0, 0]))


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2, 3], [1, 2]) == 2


def test_a_faithful_recipe_scores_far_below_damage_made_by_construction(lm):
    model, tokenizer = lm
    requests = prompts(tokenizer, 10)
    reference = greedy(model, tokenizer, requests, 16)
    same = generate_recipes.fidelity(model, model, tokenizer, requests, reference)
    assert same["kld_max"] < 1e-6 and same["same_top"] == 1 and same["identical"] == 1
    faithful = generate_recipes.fidelity(
        model, generate_recipes.build(model, "int8-dynamic-per-channel"), tokenizer, requests,
        reference)
    damaged = generate_recipes.fidelity(
        model, generate_recipes.build(model, generate_recipes.DAMAGED), tokenizer, requests,
        reference)
    assert faithful["kld_mean"] * 5 < damaged["kld_mean"], (faithful, damaged)
    assert faithful["same_top"] > damaged["same_top"]
    assert damaged["perplexity"] > damaged["perplexity_fp32"]


def test_the_bench_writes_a_row_per_model_and_refuses_what_is_no_torch_recipe(
        small_lm, tmp_path, capsys):
    out = tmp_path / "rows.json"
    assert generate_recipes.main([
        "--model", str(small_lm), "--recipes", "bf16", "--concurrency", "1", "--prompts", "3",
        "--tokens", "4", "--rounds", "1", "--json", str(out)]) == 0
    rows = {row["recipe"]: row for row in json.loads(out.read_text())}
    assert set(rows) == {"fp32", "bf16", generate_recipes.DAMAGED}
    assert rows["fp32"]["identical"] == 1 and rows["fp32"]["speedup_c1"] == 1
    assert all(row["tokens_per_s_c1"] > 0 for row in rows.values())
    assert "KLD mean" in capsys.readouterr().out
    for recipes, says in (("nope", "unknown recipe 'nope'"),
                          ("onnx-int8", "builds an encoder artifact")):
        with pytest.raises(SystemExit) as done:
            generate_recipes.main(["--model", str(small_lm), "--recipes", recipes])
        assert done.value.code == 2 and says in capsys.readouterr().err


def test_encoder_only_recipes_are_refused_naming_what_builds_a_causal_lm(lm):
    from serve.generative.kv import kv_dtype_bytes
    from serve.recipes.causal_lm import build, causal_recipes
    model, _ = lm
    assert {"fp32", "bf16", "int8-dynamic-per-channel"} <= set(causal_recipes())
    assert "onnx-int8" not in causal_recipes() and "fp16-graphs" not in causal_recipes()
    with pytest.raises(ValueError, match="auto is resolved to a recipe before"):
        build(model, "auto")
    with pytest.raises(ValueError, match="ct2-int8 builds an encoder artifact"):
        build(model, "ct2-int8")
    assert kv_dtype_bytes(build(copy.deepcopy(model), "bf16")) == 2
    assert kv_dtype_bytes(build(copy.deepcopy(model), "int8-dynamic")) == 4  # float KV
    assert kv_dtype_bytes(model) == 4 and next(model.parameters()).dtype == torch.float32


def test_the_shadow_cost_bench_writes_a_row_per_length_and_refuses_bad_options(
        small_lm, tmp_path, capsys):
    from ops.bench import shadow_tokens
    out = tmp_path / "rows.json"
    assert shadow_tokens.main(["--model", str(small_lm), "--tokens", "4,8", "--batch", "2",
                               "--rounds", "1", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [row["tokens"] for row in rows] == [4, 8]
    assert all(row["scoring_ms"] > 0 and row["share_of_alone"] ==
               row["scoring_ms"] / row["generation_alone_ms"] for row in rows)
    assert "% of alone" in capsys.readouterr().out
    for options, says in ((["--tokens", "0"], "must be >= 1"),
                          (["--tokens", "600"], "past the model's context"),
                          (["--tokens", "x"], "whole numbers")):
        with pytest.raises(SystemExit):
            shadow_tokens.main(["--model", str(small_lm), "--rounds", "1", *options])
        assert says in capsys.readouterr().err
