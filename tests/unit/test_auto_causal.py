"""`auto` for a causal LM (serve.recipes.auto.causal): its candidates, pick, fallback and cache
with a stubbed measurement; its margin on the token gates; `auto` accepted by the causal LM
checks and resolved before building (the measurement with the real small LM:
tests/integration/test_verify_generate.py)."""

from __future__ import annotations

import pytest

from rollout import FakeClock, Settings
from rollout.token_fidelity import TokenFidelity
from rollout.verdict import Thresholds, auto_thresholds
from serve.recipes.auto import causal
from serve.recipes.auto.causal import FALLBACK, candidates, choose, closest
from serve.recipes.auto.choose import Evidence, Hardware, choice_key, describe
from serve.recipes.causal_lm import build, check
from tests.unit.test_autopick import clean_environment  # noqa: F401 (autouse: no CANARY_*)

AVX2 = Hardware("cpu", bf16=False, flags=("avx2",))
NATIVE = Hardware("cpu", bf16=True, flags=("avx2", "avx512f", "avx512_bf16"))
WEIGHTS = "c" * 64


@pytest.fixture(autouse=True)
def no_reference(monkeypatch):
    """No real reference is computed: there is no model here."""
    monkeypatch.setattr(causal, "reference", lambda *args, **kw: "the reference")


@pytest.fixture
def settings(tmp_path):
    return Settings(auto_choice_dir=str(tmp_path / "auto"))


class Stub:
    """`measure` stubbed: per recipe (passed, speedup) or an exception; records its calls."""

    def __init__(self, results: dict):
        self.results, self.calls = results, []

    def __call__(self, found, recipe, thresholds, *, beaten_by=None):
        assert found == "the reference"
        self.calls.append((recipe, beaten_by))
        outcome = self.results[recipe]
        if isinstance(outcome, Exception):
            raise outcome
        passed, speedup = outcome
        return Evidence(recipe=recipe, passed=passed, speedup=speedup, n=190,
                        agreement=0.99 if passed else 0.9, lower_bound=0.98 if passed else 0.88,
                        kld=0.0004 if passed else 0.04, kld_upper_bound=0.0005 if passed else 0.05,
                        failures=() if passed else ("KL divergence 0.04000 nats (95% upper "
                                                    "bound 0.05000) > 0.009",))


def _choose(settings, hardware, results, **kw):
    stub = Stub(results)
    found = choose(settings, settings, settings, None, None, weights=WEIGHTS, served_batch=16,
                   measure=stub,
                   hardware=hardware, clock=FakeClock(start=1_796_000_000.0), **kw)
    return found, stub


def test_candidates_are_native_bf16_then_the_int8_recipes():
    assert candidates(NATIVE) == ("bf16", "int8-dynamic-per-channel", "int8-dynamic")
    assert candidates(NATIVE, hide_native_bf16=True) == ("int8-dynamic-per-channel",
                                                         "int8-dynamic")
    assert candidates(AVX2) == ("int8-dynamic-per-channel", "int8-dynamic")
    assert FALLBACK == "fp32"
    for name in (*candidates(NATIVE), FALLBACK):
        assert check(name) is not None  # each builds a causal LM


def test_the_fastest_passing_candidate_is_served_and_later_ones_hear_what_they_must_beat(
        settings):
    found, stub = _choose(settings, NATIVE, {"bf16": (True, 1.6),
                                             "int8-dynamic-per-channel": (False, 1.9),
                                             "int8-dynamic": (True, 2.0)})
    assert found.recipe == "int8-dynamic" and not found.fallback
    assert stub.calls == [("bf16", None), ("int8-dynamic-per-channel", ("bf16", 1.6)),
                          ("int8-dynamic", ("bf16", 1.6))]
    line = describe(found)
    assert line.startswith("auto → int8-dynamic (measured ") and "2.00x" in line
    assert "KL divergence 0.00040 nats, 99.0 % top-1 token agreement" in line


def test_within_the_tie_the_earlier_candidate_is_preferred(settings):
    found, _ = _choose(settings, NATIVE, {"bf16": (True, 1.6),
                                          "int8-dynamic-per-channel": (True, 1.65),
                                          "int8-dynamic": (False, 1.0)})
    assert found.recipe == "bf16" and "preferred" in found.reason


def test_no_candidate_passing_serves_fp32_with_the_reasons(settings):
    found, _ = _choose(settings, AVX2, {"int8-dynamic-per-channel": (False, 1.4),
                                        "int8-dynamic": RuntimeError("no kernel\nfor this")})
    assert found.recipe == "fp32" and found.fallback
    assert "int8-dynamic-per-channel: KL divergence 0.04000" in found.reason
    assert "int8-dynamic: RuntimeError: no kernel for this" in found.reason
    assert describe(found).startswith("auto → fp32 (fallback, measured ")


def test_the_choice_is_cached_and_not_measured_again(settings):
    first, _ = _choose(settings, AVX2, {"int8-dynamic-per-channel": (True, 1.4),
                                        "int8-dynamic": (True, 1.3)})
    again, stub = _choose(settings, AVX2, {})  # a measurement would raise KeyError
    assert again == first and stub.calls == []
    other, stub = _choose(settings.model_copy(update={"verify_continuation_tokens": 16}), AVX2,
                          {"int8-dynamic-per-channel": (True, 1.4), "int8-dynamic": (True, 1.3)})
    assert other.key != first.key and len(stub.calls) == 2  # another measurement, measured


def test_the_key_is_not_an_encoders_for_the_same_weights(settings):
    encoder, _ = choice_key(settings, settings, settings, weights=WEIGHTS, hardware=AVX2,
                            labels=())
    lm, context = choice_key(settings, settings, settings, weights=WEIGHTS, hardware=AVX2,
                             labels=(), extra={"task": "generate"})
    assert encoder != lm and context["task"] == "generate"


def test_the_margin_tightens_both_token_gates_by_the_same_share_of_their_budget():
    raised = auto_thresholds(Settings())
    assert raised.min_token_agreement == pytest.approx(0.955)
    assert raised.max_kld == pytest.approx(0.009)  # 0.005 of a 0.05 budget: a tenth
    assert Thresholds(min_token_agreement=1.0).with_margin(0.005).max_kld == 0.0


def _fidelity(kld_upper: float, agreement_lower: float) -> TokenFidelity:
    return TokenFidelity(n=100, tokens=3200, kld=kld_upper / 2, kld_interval=(0.0, kld_upper),
                         agreement=0.99, agreement_interval=(agreement_lower, 1.0),
                         token_kld_mean=0.001, token_kld_p99=0.01, token_kld_max=0.1,
                         identical=None, first_divergence_mean=None, perplexity_baseline=1.5,
                         perplexity_optimized=1.5)


def test_closest_names_the_bound_with_the_least_of_its_budget_left():
    bars = Thresholds(max_kld=0.01, min_token_agreement=0.95)
    assert closest(bars, _fidelity(0.008, 0.99)).startswith("KL divergence upper bound 0.00800")
    assert closest(bars, _fidelity(0.001, 0.955)) == ("top-1 token agreement lower bound "
                                                      "0.9550 (bar 0.95)")


def test_auto_is_accepted_for_a_causal_lm_and_resolved_before_building():
    assert check("auto") is None
    with pytest.raises(ValueError, match="auto is resolved to a recipe before"):
        build(object(), "auto")
    with pytest.raises(ValueError, match="onnx-int8 builds an encoder artifact"):
        check("onnx-int8")
