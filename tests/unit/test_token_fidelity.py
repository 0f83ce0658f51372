"""A generative arm's token fidelity summed per response and judged (rollout.token_fidelity), and
its place in a verdict (rollout.verdict): clipped means, bootstrap bounds, slices shown beyond
doubt, thresholds recorded and compared."""

from __future__ import annotations

import math

import pytest

from rollout.token_fidelity import KLD_CLIP, ResponseFidelity, judge, summarize
from rollout.verdict import Thresholds, Verdict, judge_generation, looser


def response(kld: float, agree: float, *, tokens: int = 10, slices=("script:latin",),
             parted: int | None = None, index: int = 0) -> ResponseFidelity:
    same = round(agree * tokens)
    return ResponseFidelity((kld,) * tokens, (True,) * same + (False,) * (tokens - same),
                            nll_baseline=0.5 * tokens, nll_optimized=0.6 * tokens,
                            slices=slices, identical=parted is None, first_divergence=parted,
                            index=index)


def test_a_response_is_one_unit_of_evidence_and_its_kld_is_clipped():
    wild = response(5.0, 0.0, tokens=40, parted=0)
    calm = [response(0.001, 1.0, tokens=4, index=i) for i in range(3)]
    found = summarize([wild, *calm], min_size=100)
    assert wild.mean_kld == KLD_CLIP
    assert found.kld == pytest.approx((KLD_CLIP + 3 * 0.001) / 4)  # per response, clipped
    assert found.agreement == pytest.approx(3 / 4)  # each response counts once, not by length
    assert found.token_kld_mean == pytest.approx((5.0 * 40 + 0.001 * 12) / 52)  # unclipped
    assert found.token_kld_max == 5.0 and found.tokens == 52 and found.n == 4
    assert found.identical == pytest.approx(3 / 4) and found.first_divergence_mean == 0
    assert found.perplexity_baseline == pytest.approx(math.exp(0.5))
    assert found.perplexity_optimized == pytest.approx(math.exp(0.6))
    low, high = found.kld_interval
    assert low <= found.kld <= high and found.kld_upper_bound == high


def test_responses_without_a_token_are_left_out_and_none_at_all_is_refused():
    empty = ResponseFidelity((), (), 0.0, 0.0)
    assert summarize([empty, response(0.0, 1.0)], min_size=1).n == 1
    with pytest.raises(ValueError, match="no response"):
        summarize([empty], min_size=1)


def test_faithful_responses_pass_and_damage_fails_both_gates():
    faithful = summarize([response(0.002 + 0.0001 * (i % 5), 0.97 + 0.01 * (i % 3), index=i)
                          for i in range(100)], min_size=30)
    assert judge(0.01, 0.95, faithful) == []
    damaged = summarize([response(0.04, 0.8, index=i) for i in range(100)], min_size=30)
    failures = judge(0.01, 0.95, damaged)
    assert any(f.startswith("KL divergence 0.04000") for f in failures)
    assert any(f.startswith("top-1 token agreement 0.8000") for f in failures)
    assert judge(0.01, 0.95, None) == []


def test_a_damaged_slice_fails_where_the_whole_passes_and_a_small_one_is_not_judged():
    latin = [response(0.001, 1.0, index=i) for i in range(1000)]
    kana = [response(0.05, 0.80, slices=("script:kana",), index=1000 + i) for i in range(30)]
    few = [response(0.05, 0.5, slices=("script:thai",), index=2000 + i) for i in range(3)]
    found = summarize(latin + kana + few, min_size=30)
    assert found.kld_upper_bound < 0.01 and found.agreement_lower_bound > 0.95
    rows = {row.slice: row for row in found.slices}
    assert rows["script:kana"].judged and not rows["script:thai"].judged
    assert found.slices[0].slice == "script:kana"  # judged rows first, worst agreement first
    failures = judge(0.01, 0.95, found)
    assert len(failures) == 2 and all("slice script:kana" in f for f in failures)


def test_the_verdict_records_the_token_gates_and_a_ramp_refuses_looser_ones():
    required = Thresholds()
    assert required.max_kld == 0.01 and required.min_token_agreement == 0.95
    assert looser(Thresholds(max_kld=0.05, min_token_agreement=0.9), required) == [
        "min_token_agreement 0.9 < 0.95", "max_kld 0.05 > 0.01"]
    old = Verdict.model_validate({"baseline_version": "a", "optimized_version": "b",
                                  "passed": True, "n": 3, "agreement": 1,
                                  "agreement_lower_bound": 1})
    assert old.task == "" and old.kld is None  # stored before causal LMs: still loads


def test_a_causal_lm_is_judged_by_its_tokens_and_its_speed():
    found = summarize([response(0.001, 1.0, index=i) for i in range(50)], min_size=30)
    assert judge_generation(Thresholds(), found, 1.3) == []
    assert judge_generation(Thresholds(), found, None) == []  # --no-speed: not judged
    assert judge_generation(Thresholds(), found, 0.9) == ["speedup 0.90x < 1.0x"]
