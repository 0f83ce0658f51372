"""The verify gate (rollout.verdict): thresholds from the settings, every threshold applied to a
paired comparison with crafted pairs, and stored verdicts that predate new fields."""

from __future__ import annotations

import json
import os

import pytest

from rollout import MemoryStateStore, Settings, Thresholds, Verdict, judge_summary, thresholds_from
from rollout.agreement import Pair, summarize
from rollout.slices import slice_table
from rollout.verdict import auto_thresholds, judge_slices, looser, verdict_problems, worst_slice


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for name in list(os.environ):
        if name.upper().startswith("CANARY_"):
            monkeypatch.delenv(name)


def agreeing(n: int, *, margin: float = 0.3, cosine: float | None = None,
             truth: int | None = None, start: int = 0) -> list[Pair]:
    return [Pair(0, 0, margin, margin, cosine=cosine, truth=truth, index=start + i)
            for i in range(n)]


# --- thresholds ----------------------------------------------------------------------------------


def test_default_thresholds_judge_damage_not_noise():
    t = Thresholds()
    assert (t.min_margin, t.max_confident_flips, t.max_accuracy_drop) == (0.05, 0, 0.01)
    assert (t.min_agreement, t.min_lower_bound, t.min_cosine_p1) == (0.98, 0.98, 0.95)
    assert t.retrieval_tolerance == 0.0  # a verdict stored before ties were counted: strict
    # the settings' defaults are the same gate, with the measured tolerance for ties
    assert thresholds_from(Settings()) == t.model_copy(update={"retrieval_tolerance": 0.005})


def test_thresholds_come_from_the_settings_and_their_environment(monkeypatch):
    for name, value in {"MIN_MARGIN": "0.1", "MAX_CONFIDENT_FLIPS": "2",
                        "MAX_ACCURACY_DROP": "0.005", "MIN_AGREEMENT": "0.97",
                        "MIN_LOWER_BOUND": "0.96", "MIN_SPEEDUP": "1.8",
                        "MIN_COSINE_P1": "0.9"}.items():
        monkeypatch.setenv(f"CANARY_VERIFY_{name}", value)
    monkeypatch.setenv("CANARY_VERIFY_RETRIEVAL_TOLERANCE", "0.002")
    assert thresholds_from(Settings()) == Thresholds(
        min_margin=0.1, max_confident_flips=2, max_accuracy_drop=0.005, min_agreement=0.97,
        min_lower_bound=0.96, min_speedup=1.8, min_cosine_p1=0.9, retrieval_tolerance=0.002)


def test_auto_judges_with_every_bar_raised_by_its_margin(monkeypatch):
    monkeypatch.setenv("CANARY_VERIFY_AUTO_MARGIN", "0.01")
    raised = auto_thresholds(Settings())
    base = thresholds_from(Settings())
    assert (raised.min_agreement, raised.min_lower_bound, raised.min_cosine_p1) == \
        pytest.approx((0.99, 0.99, 0.96))
    assert (raised.min_slice_agreement, raised.min_recall_at_10) == pytest.approx((0.96, 0.96))
    assert (raised.max_confident_flips, raised.retrieval_tolerance) == \
        (base.max_confident_flips, base.retrieval_tolerance)
    assert Thresholds(min_agreement=0.995).with_margin(0.01).min_agreement == 1.0  # at most 1
    assert looser(base, raised) and not looser(raised, base)


def test_a_wider_tolerance_for_ties_is_looser():
    assert looser(Thresholds(retrieval_tolerance=0.01), Thresholds(retrieval_tolerance=0.005)) \
        == ["retrieval_tolerance 0.01 > 0.005"]
    assert looser(Thresholds(), Thresholds(retrieval_tolerance=0.005)) == []  # strict: stricter


@pytest.mark.parametrize(("name", "value"), [
    ("CANARY_VERIFY_MAX_CONFIDENT_FLIPS", "-1"), ("CANARY_VERIFY_MIN_MARGIN", "1.5"),
    ("CANARY_VERIFY_MAX_ACCURACY_DROP", "-0.1"),
])
def test_out_of_range_gate_settings_are_refused(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=name.removeprefix("CANARY_").lower()):
        Settings()


# --- judge_summary -------------------------------------------------------------------------------


def test_a_faithful_arm_with_only_near_tie_flips_passes():
    pairs = agreeing(2_580, cosine=0.999) + [
        Pair(0, 1, 0.01, 0.003, cosine=0.97, index=3_000 + i) for i in range(20)]  # 99.2 %
    summary = summarize(pairs)
    assert summary.confident == [] and len(summary.flips) == 20
    assert judge_summary(Thresholds(), summary, speedup=2.0) == []


def test_every_missed_threshold_is_a_sentence_in_the_gate_order():
    pairs = agreeing(90, cosine=0.99, truth=0)
    pairs += [Pair(0, 1, m, 0.02, cosine=0.8, truth=0, index=100 + i)
              for i, m in enumerate((0.05, 0.2, 0.4))]  # confident: the truth was 0
    pairs += [Pair(0, 1, 0.001, 0.001, cosine=0.99, index=200 + i) for i in range(7)]
    summary = summarize(pairs)
    failures = judge_summary(Thresholds(min_speedup=1.5), summary, speedup=1.2)
    assert failures == [
        "3 confident flips (baseline margin >= 0.05) > 0",
        "accuracy drop 0.0323 > 0.01",  # 93/93 right against 90/93
        "agreement 0.9000 < 0.98",
        f"agreement lower bound {summary.lower_bound:.4f} < 0.98",
        f"cosine p1 {summary.cosine.p1:.4f} < 0.95",
        "speedup 1.20x < 1.5x",
    ]


def test_a_tolerated_count_of_confident_flips_passes_and_one_more_fails():
    pairs = agreeing(3_000) + [Pair(2, 3, 0.5, 0.1, index=5_000 + i) for i in range(2)]
    summary = summarize(pairs)
    assert judge_summary(Thresholds(max_confident_flips=2), summary, None) == []
    assert judge_summary(Thresholds(max_confident_flips=1), summary, None) == [
        "2 confident flips (baseline margin >= 0.05) > 1"]


def test_unmeasured_figures_are_not_judged():
    """No labels (no accuracy), a classifier (no cosine), --no-speed (no speedup)."""
    summary = summarize(agreeing(500))
    assert summary.accuracy_drop is None and summary.cosine is None
    assert judge_summary(Thresholds(min_speedup=1000, max_accuracy_drop=0), summary, None) == []


def test_an_improved_accuracy_is_no_drop():
    pairs = agreeing(2_000, truth=0) + [Pair(1, 0, 0.001, 0.001, truth=0, index=9_000)]
    summary = summarize(pairs)
    assert summary.accuracy_drop == pytest.approx(-1 / 2_001)
    assert judge_summary(Thresholds(max_accuracy_drop=0), summary, None) == []


def test_a_summary_drawn_at_another_margin_is_refused_naming_the_fix():
    summary = summarize(agreeing(10), min_margin=0.1)
    with pytest.raises(ValueError, match=r"summarize\(pairs, min_margin=thresholds.min_margin\)"):
        judge_summary(Thresholds(), summary, None)


# --- stored verdicts -----------------------------------------------------------------------------


def test_a_verdict_stored_before_the_confident_flip_gate_still_loads():
    old = {"baseline_version": "fp32-a", "optimized_version": "int8-b", "passed": True,
           "failures": [], "n": 2600, "agreement": 0.996, "agreement_lower_bound": 0.993,
           "speedup": 1.9, "cosine_p1": 0.99, "recipe": "int8-dynamic", "set_digest": "abc:2600",
           "at": 1.0, "by": "ci"}
    verdict = Verdict.model_validate_json(json.dumps(old))
    assert verdict.passed and verdict.confident_flips is None and verdict.accuracy_drop is None


def test_a_new_verdict_round_trips_its_confident_flips_and_accuracy_drop():
    verdict = Verdict(baseline_version="fp32-a", optimized_version="int8-b", passed=False,
                      failures=("1 confident flips (baseline margin >= 0.05) > 0",), n=2600,
                      agreement=0.99, agreement_lower_bound=0.985, confident_flips=1,
                      accuracy_drop=0.004)
    assert Verdict.model_validate_json(verdict.model_dump_json()) == verdict
    store = MemoryStateStore()
    store.put_verdict(verdict)
    assert store.get_verdict("fp32-a", "int8-b").confident_flips == 1


def test_a_verdict_records_what_it_was_judged_with_and_round_trips_through_the_store():
    verdict = Verdict(baseline_version="fp32-a", optimized_version="int8-b", passed=True,
                      n=1617, agreement=0.995, agreement_lower_bound=0.99,
                      thresholds=Thresholds(min_slice_agreement=0.9), split="held-out",
                      set_digest="abc", speed_judged=False, worst_slice="script:han",
                      worst_slice_agreement=0.97)
    store = MemoryStateStore()
    store.put_verdict(verdict)
    assert store.get_verdict("fp32-a", "int8-b") == verdict
    old = Verdict(baseline_version="fp32-a", optimized_version="int8-b", passed=True, n=1,
                  agreement=1.0, agreement_lower_bound=0.5)
    assert (old.thresholds, old.split, old.speed_judged) == (None, "", None)  # stored before


def test_looser_names_every_threshold_loosened_in_either_direction():
    required = Thresholds()
    assert looser(required, required) == []
    assert looser(Thresholds(min_agreement=0.99, max_confident_flips=0), required) == []
    found = looser(Thresholds(min_agreement=0.9, max_accuracy_drop=0.05, min_margin=0.1,
                              min_slice_size=100, min_speedup=0.5), required)
    assert found == ["min_agreement 0.9 < 0.98", "min_speedup 0.5 < 1",
                     "min_margin 0.1 > 0.05", "max_accuracy_drop 0.05 > 0.01",
                     "min_slice_size 100 > 30"]


def test_the_worst_judged_slice_is_judged_and_a_small_one_is_not():
    rows = slice_table({"script:latin": (1500, 1500, 0), "script:han": (30, 24, 0),
                        "script:none": (50, 47, 0), "script:kana": (4, 0, 0)}, 30)
    assert worst_slice(rows).slice == "script:han"  # kana is worse, but too small to judge
    assert judge_slices(Thresholds(min_slice_agreement=0.9), rows) == []  # 24/30: upper 0.90
    assert judge_slices(Thresholds(min_slice_agreement=0.95), rows) == [
        "slice script:han agreement 0.8000 (24/30, 95% upper bound 0.9049) < 0.95"]
    three_near_ties = slice_table({"script:none": (50, 47, 0)}, 30)  # 94 %: noise, not damage
    assert judge_slices(Thresholds(min_slice_agreement=0.95), three_near_ties) == []
    assert judge_slices(Thresholds(min_slice_agreement=1.0), []) == []  # nothing to judge


def test_without_rules_only_the_speed_judgement_is_checked():
    bare = Verdict(baseline_version="b", optimized_version="o", passed=True, n=1,
                   agreement=1.0, agreement_lower_bound=0.5, speed_judged=False)
    assert verdict_problems(bare, None) == [
        "speed was not judged (verify --no-speed; the plan does not set "
        "accept_verdict_without_speed)"]
    assert verdict_problems(bare, None, speed_optional=True) == []
