"""The accuracy-aware recipe on the tiny encoder: it reaches its target on inputs it was not
tuned on, its plan is cached and reused, and the plan is part of the version."""

import json
from pathlib import Path

import pytest
import torch

from rollout import Settings
from rollout.agreement import wilson_interval
from serve.common.regression import DEFAULT_SET, load_set
from serve.recipes.accuracy_aware import describe, plan_digest
from serve.recipes.eager import Int8Linear, linear_names
from serve.recipes.source import variant_version
from serve.recipes.variants import Variant
from tests.tiny_model import make_tiny_encoder
from tests.variant_settings import groups, versions_of

TARGET = 0.97
SLICE = 480  # 120 calibration inputs, 360 held out


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("plan")
    model = make_tiny_encoder(root / "tiny")
    lines = DEFAULT_SET.read_text(encoding="utf-8").splitlines()[:SLICE]
    (root / "set.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    settings = Settings(
        model_path=str(model), regression_set=str(root / "set.jsonl"),
        plan_dir=str(root / "plans"), optimized_recipe="accuracy-aware",
        aware_target_agreement=TARGET, aware_high_precision="fp32", torch_threads=1,
    )
    steps = []
    optimized = Variant(groups(settings), "optimized", progress=lambda k, a: steps.append((k, a)))
    return settings, Variant(groups(settings), "baseline"), optimized, steps


def test_plan_reaches_its_target_on_the_held_out_split(setup):
    settings, baseline, optimized, steps = setup
    plan = optimized.plan
    regression = load_set(settings.regression_set)
    held = [regression.texts[i] for i in regression.held_out()]
    agree = (baseline.scores(baseline.rows(held)).argmax(-1)
             == optimized.scores(optimized.rows(held)).argmax(-1)).sum().item()
    assert plan["calibration"]["agreement"] >= TARGET
    assert plan["calibration"]["n"] == len(regression.calibration())
    # held out: the target holds within sampling error (the Wilson upper bound reaches it)
    assert wilson_interval(agree, len(held))[1] >= TARGET, agree / len(held)
    assert steps, "the plan was searched, not found"


def test_plan_keeps_the_fewest_sensitive_layers(setup):
    _, baseline, optimized, _ = setup
    plan = optimized.plan
    layers = linear_names(baseline.model)
    assert sorted(plan["kept"] + plan["int8"]) == sorted(layers)
    ranked = list(plan["sensitivity"])
    assert plan["kept"] == ranked[: len(plan["kept"])]  # the most sensitive ones
    k = len(plan["kept"])
    if k:  # one layer fewer misses the target (what the binary search proved)
        assert plan["tried"][str(k - 1)] < plan["target"]
    int8 = {n for n, m in optimized.model.named_modules() if isinstance(m, Int8Linear)}
    assert int8 == set(plan["int8"])
    assert "Linear layers" in describe(plan)


def test_plan_is_cached_and_part_of_the_version(setup):
    settings, _, optimized, _ = setup
    steps = []
    again = Variant(groups(settings), "optimized", progress=lambda k, a: steps.append(k))
    assert steps == []  # read from the cache, not searched again
    assert again.plan["int8"] == optimized.plan["int8"]
    assert again.version == optimized.version
    assert versions_of(settings)["optimized"] == optimized.version
    assert optimized.version.startswith("accuracy-aware-")
    other = dict(optimized.plan, int8=optimized.plan["int8"][1:])
    assert plan_digest(other) != plan_digest(optimized.plan)
    weights = optimized.version  # any digest: only the comparison matters
    assert variant_version(weights, "accuracy-aware", other) != variant_version(
        weights, "accuracy-aware", optimized.plan)
    files = list(Path(settings.plan_dir).glob("*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["int8"] == optimized.plan["int8"]


def test_int8_linear_runs_inside_a_bf16_model():
    layer = torch.nn.Linear(16, 8)
    wrapped = Int8Linear(torch.nn.Linear(16, 8).requires_grad_(False))
    wrapped.inner = Int8Linear(layer).inner
    x = torch.randn(3, 16)
    out = wrapped(x.bfloat16())
    assert out.dtype == torch.bfloat16
    assert torch.nn.functional.cosine_similarity(out.float(), layer(x), dim=-1).min() > 0.99
