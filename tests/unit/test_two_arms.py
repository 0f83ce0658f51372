"""Two independent arms: each from its own model folder and recipe (serve.recipes.variants),
compared by `rollout verify` only when their labels match; the gateway refuses to start otherwise.

Two tiny encoders with different weights stand for `v1` and `v2` (torch, no Ray, no Redis)."""

import asyncio
import io
import json
import os
import shutil

import pytest
import torch

from ops import cli
from rollout import FakeClock, MemoryStateStore, Settings
from serve.common.regression import load_set
from serve.recipes.auto.choose import Hardware, choice_key
from serve.recipes.source import (
    LABELS_FILE,
    LabelsDiffer,
    ModelSourceError,
    labels_of,
    model_dir,
    variant_version,
    weights_digest,
)
from serve.recipes.variants import Variant
from tests.tiny_model import make_tiny_encoder
from tests.variant_settings import auto_groups, groups, versions_of

FAST = {  # a small, quick verify, as tests/unit/test_verify.py runs it
    "CANARY_VERIFY_BATCH_SIZES": "1,4", "CANARY_VERIFY_SPEED_BATCH": "4",
    "CANARY_VERIFY_SPEED_INPUTS": "8", "CANARY_TORCH_THREADS": "1",
}


def make_v2(dest):
    """The tiny encoder with other weights (as if trained further): same shapes, same
    tokenizer, every parameter moved a little."""
    from transformers import BertModel

    make_tiny_encoder(dest)
    model = BertModel.from_pretrained(dest, local_files_only=True)
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.01)
    model.save_pretrained(dest, safe_serialization=True)
    return dest


@pytest.fixture(scope="module")
def v1(tmp_path_factory):
    return make_tiny_encoder(tmp_path_factory.mktemp("v1"))


@pytest.fixture(scope="module")
def v2(tmp_path_factory):
    return make_v2(tmp_path_factory.mktemp("v2"))


def copy_with_labels(source, dest, labels):
    shutil.copytree(source, dest)
    (dest / LABELS_FILE).write_text(json.dumps(labels))
    return dest


def two_arms(v1, v2, **more) -> Settings:
    return Settings(baseline_model_path=str(v1), optimized_model_path=str(v2),
                    optimized_recipe="fp32", **more)


# --- configuration -------------------------------------------------------------------------

def test_each_arm_takes_its_own_folder_else_the_common_one(v1, v2):
    assert model_dir(Settings(model_path=str(v1)), "baseline") == v1
    assert model_dir(Settings(model_path=str(v1)), "optimized") == v1
    split = Settings(model_path=str(v1), optimized_model_path=str(v2))
    assert model_dir(split, "baseline") == v1 and model_dir(split, "optimized") == v2
    assert model_dir(two_arms(v1, v2), "baseline") == v1


@pytest.mark.parametrize("arm", ["baseline", "optimized"])
def test_a_causal_lm_folder_is_refused_naming_the_setting(arm, v1, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    settings = Settings(model_path=str(v1), **{f"{arm}_model_path": str(tmp_path)})
    with pytest.raises(ValueError, match=f"CANARY_{arm.upper()}_MODEL_PATH: .* holds a causal "
                                         "language model where the baseline is an encoder"):
        model_dir(settings, arm)
    assert model_dir(settings, "optimized" if arm == "baseline" else "baseline") == v1
    assert model_dir(settings, arm, generative=True) == tmp_path
    with pytest.raises(ValueError, match="holds no causal language model"):
        model_dir(settings, "optimized" if arm == "baseline" else "baseline", generative=True)


def test_auto_is_refused_for_the_baseline():
    with pytest.raises(ValueError, match="baseline_recipe cannot be auto"):
        Settings(baseline_recipe="auto")
    assert Settings(baseline_recipe="bf16").baseline_recipe == "bf16"


@pytest.mark.parametrize("arm", ["baseline", "optimized"])
def test_a_bad_folder_names_the_arms_setting(arm, v1, tmp_path):
    settings = Settings(model_path=str(v1), **{f"{arm}_model_path": str(tmp_path / "nope")})
    with pytest.raises(FileNotFoundError, match=f"CANARY_{arm.upper()}_MODEL_PATH: model folder"):
        versions_of(settings)
    with pytest.raises(FileNotFoundError, match="CANARY_MODEL_PATH: model folder"):
        model_dir(Settings(model_path=str(tmp_path / "nope")), arm)


# --- versions ------------------------------------------------------------------------------

def test_versions_hash_each_arms_weights_and_recipe(v1, v2):
    d1, d2 = weights_digest(v1), weights_digest(v2)
    assert d1 != d2
    same_recipe = versions_of(two_arms(v1, v2))
    assert same_recipe == {"baseline": variant_version(d1, "fp32"),
                           "optimized": variant_version(d2, "fp32")}
    assert same_recipe["baseline"] != same_recipe["optimized"]  # other weights, same recipe
    same_weights = versions_of(Settings(model_path=str(v1), baseline_recipe="bf16",
                                     optimized_recipe="int8-dynamic"))
    assert same_weights == {"baseline": variant_version(d1, "bf16"),
                            "optimized": variant_version(d1, "int8-dynamic")}
    # the canary docs/operator-guide.md describes: v2 / int8 against v1 / bf16
    canary = versions_of(two_arms(v1, v2, baseline_recipe="bf16").model_copy(
        update={"optimized_recipe": "int8-dynamic"}))
    assert canary == {"baseline": variant_version(d1, "bf16"),
                      "optimized": variant_version(d2, "int8-dynamic")}


def test_variants_load_their_own_weights_and_recipe(v1, v2):
    settings = two_arms(v1, v2, baseline_recipe="bf16", labels=("cats", "dogs"))
    base, opt = Variant(groups(settings), "baseline"), Variant(groups(settings), "optimized")
    assert (base.source, opt.source) == (v1, v2)
    assert base.recipe == "bf16" and opt.recipe == "fp32"
    assert {"baseline": base.version, "optimized": opt.version} == versions_of(settings)
    assert next(base.model.parameters()).dtype == torch.bfloat16
    texts = ["a short one", "another input"]
    assert not torch.allclose(base.rows(texts).float(), opt.rows(texts))  # other weights


def test_auto_is_keyed_by_the_arms_labels():
    settings, hardware = Settings(), Hardware("cpu", False, ("avx2",))
    read = auto_groups(settings)
    plain, _ = choice_key(*read, weights="a" * 64, hardware=hardware)
    same, _ = choice_key(*read, weights="a" * 64, hardware=hardware, labels=settings.labels)
    other, context = choice_key(*read, weights="a" * 64, hardware=hardware,
                                labels=("cats", "dogs"))
    assert plain == same != other and context["settings"]["labels"] == ["cats", "dogs"]


# --- labels --------------------------------------------------------------------------------

def test_a_folder_declares_its_own_labels(v1, tmp_path):
    folder = copy_with_labels(v1, tmp_path / "own", ["cats", "dogs", "cars"])
    settings = Settings(model_path=str(v1), optimized_model_path=str(folder))
    assert labels_of(settings, "baseline") == settings.labels  # CANARY_LABELS
    assert labels_of(settings, "optimized") == ("cats", "dogs", "cars")
    variant = Variant(groups(settings.model_copy(update={"optimized_recipe": "fp32"})), "optimized")
    [out] = variant.postprocess("classify", variant.rows(["hello"]))
    assert list(out["scores"]) == ["cats", "dogs", "cars"]


@pytest.mark.parametrize("content", ['"cats"', '["cats"]', '["a", "a"]', '["a", ""]', "{not json"])
def test_a_bad_labels_file_is_an_error_naming_it(v1, tmp_path, content):
    folder = tmp_path / "bad"
    shutil.copytree(v1, folder)
    (folder / LABELS_FILE).write_text(content)
    with pytest.raises(ModelSourceError, match=LABELS_FILE):
        labels_of(Settings(model_path=str(folder)), "baseline")


def test_the_gateway_refuses_to_start_when_the_labels_differ():
    """At replica start, before it serves anything (its model handles are stand-ins that
    answer `info` as the model replicas would)."""
    from serve.gateway.deployment import Gateway

    wrapper = Gateway.func_or_class
    gateway_class = wrapper.__mro__[1]  # the class serve.gateway.ingress wraps
    assert "predict" in vars(gateway_class)

    class Handle:
        def __init__(self, labels):
            self.info = self
            self.labels = labels

        async def remote(self):
            return {"labels": self.labels, "tasks": ["classify"], "version": "v"}

    gateway = gateway_class.__new__(gateway_class)
    with pytest.raises(LabelsDiffer, match=r"baseline \['a', 'b'\], optimized \['b', 'a'\]"):
        asyncio.run(gateway_class.__init__(gateway, Handle(["a", "b"]), Handle(["b", "a"]),
                                           Settings()))


# --- `rollout verify` on two arms ---------------------------------------------------------------

@pytest.fixture
def env(monkeypatch, tmp_path):
    for name in list(os.environ):
        if name.startswith("CANARY_"):
            monkeypatch.delenv(name)
    for name, value in FAST.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("CANARY_PLAN_DIR", str(tmp_path / "plans"))
    return monkeypatch


def verify(*argv):
    store = MemoryStateStore()
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(["--actor", "alice", "verify", *argv, "--quiet"], store=store,
                    clock=FakeClock(1_700_000_000.0), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue(), store


def test_verify_compares_the_two_configured_arms(env, v1, v2):
    env.setenv("CANARY_BASELINE_MODEL_PATH", str(v1))
    env.setenv("CANARY_OPTIMIZED_MODEL_PATH", str(v2))
    env.setenv("CANARY_OPTIMIZED_RECIPE", "fp32")
    for name in ("MIN_SPEEDUP", "MIN_AGREEMENT", "MIN_LOWER_BOUND", "MIN_COSINE_P1",
                 "MIN_SLICE_AGREEMENT"):
        env.setenv(f"CANARY_VERIFY_{name}", "0")
    env.setenv("CANARY_VERIFY_MAX_CONFIDENT_FLIPS", "1000")
    env.setenv("CANARY_VERIFY_MAX_ACCURACY_DROP", "1")
    code, out, err, store = verify("--limit", "24", "--json")
    judged = len(load_set().limited(24).held_out())  # the held-out split of the first 24

    assert code == 0, err
    doc = json.loads(out)
    expected = versions_of(two_arms(v1, v2))
    assert (doc["baseline_version"], doc["optimized_version"]) == (
        expected["baseline"], expected["optimized"])
    assert doc["baseline_version"] != doc["optimized_version"]  # both fp32, other weights
    assert doc["n"] == judged == 9 and doc["stored"] is True
    assert doc["cosine"]["min"] < 0.99999  # other weights: not fp32 compared with itself
    verdict = store.get_verdict(expected["baseline"], expected["optimized"])
    assert verdict.passed and verdict.n == judged and verdict.recipe == "fp32"


@pytest.mark.parametrize("labels", [["cats", "dogs"], ["sports", "technology", "politics",
                                                        "business", "entertainment", "health"]])
def test_verify_refuses_arms_with_other_labels(env, v1, tmp_path, labels):
    """Other names, or the same names in another order: nothing is loaded, nothing stored."""
    env.setenv("CANARY_MODEL_PATH", str(v1))
    env.setenv("CANARY_OPTIMIZED_MODEL_PATH", str(copy_with_labels(v1, tmp_path / "o", labels)))
    code, out, err, store = verify("--limit", "8")

    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1
    assert "the arms' labels differ" in err
    assert f"optimized {labels}" in err and "baseline ['technology', 'sports'," in err
    assert store._verdicts == {}


@pytest.mark.parametrize(("name", "message"), [
    ("CANARY_BASELINE_MODEL_PATH", "CANARY_BASELINE_MODEL_PATH: model folder"),
    ("CANARY_OPTIMIZED_MODEL_PATH", "CANARY_OPTIMIZED_MODEL_PATH: model folder"),
    ("CANARY_BASELINE_RECIPE", "CANARY_BASELINE_RECIPE"),
])
def test_verify_names_a_bad_arm_setting(env, v1, tmp_path, name, message):
    env.setenv("CANARY_MODEL_PATH", str(v1))
    env.setenv(name, "auto" if name.endswith("RECIPE") else str(tmp_path / "missing"))
    code, out, err, store = verify("--limit", "8")

    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert store._verdicts == {}


def test_verify_names_a_bad_labels_file(env, v1, tmp_path):
    folder = tmp_path / "bad"
    shutil.copytree(v1, folder)
    (folder / LABELS_FILE).write_text("[1, 2]")
    env.setenv("CANARY_MODEL_PATH", str(v1))
    env.setenv("CANARY_OPTIMIZED_MODEL_PATH", str(folder))
    code, _, err, _ = verify("--limit", "8")
    assert code == 2 and f"{folder / LABELS_FILE}:" in err
    assert len(err.strip().splitlines()) == 1
