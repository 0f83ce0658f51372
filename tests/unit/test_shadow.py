"""Online agreement (rollout.shadow): pairing two arms' answers, the counters one shadowed
request adds, and what `Windows.shadow` reads back over a window (fake clock, in-memory hashes)."""

from __future__ import annotations

import math

import pytest

from rollout import FakeClock, ShadowStats, Windows
from rollout.agreement import MARGIN_EDGES, bucket_label, wilson_interval
from rollout.shadow import (
    COSINE_GAPS,
    PairOutcome,
    ShadowItem,
    ShadowMismatch,
    aggregate_shadow,
    compare,
    cosine,
    cosine_bin,
    merge_shadow,
    shadow_fields,
    shadow_key,
)
from rollout.telemetry.windows import MemoryHashes

APP = "shadow-unit"
START = 1_700_000_000.0
LABELS = ("sports", "politics", "health")


def classified(label: str, *scores: float) -> dict:
    return {"label": label, "scores": dict(zip(LABELS, scores, strict=True))}


def test_classify_pairs_agree_on_the_top1_label_and_carry_the_baselines_margin():
    baseline = [classified("sports", 0.9, 0.05, 0.05), classified("politics", 0.40, 0.42, 0.18)]
    optimized = [classified("sports", 0.8, 0.1, 0.1), classified("sports", 0.43, 0.41, 0.16)]
    first, second = compare("classify", baseline, optimized)
    assert first.agreed is True and first.margin == pytest.approx(0.85)
    assert second.agreed is False and second.margin == pytest.approx(0.02)
    assert first.cosine is None and second.cosine is None


def test_embed_pairs_carry_their_cosine():
    baseline = [{"embedding": [1.0, 0.0, 0.0]}, {"embedding": [0.6, 0.8]}]
    optimized = [{"embedding": [2.0, 0.0, 0.0]}, {"embedding": [0.8, 0.6]}]
    first, second = compare("embed", baseline, optimized)
    assert first.cosine == pytest.approx(1.0) and second.cosine == pytest.approx(0.96)
    assert first.agreed is None
    assert cosine([1.0, 0.0], [-1.0, 0.0]) == pytest.approx(-1.0)
    assert cosine([0.0, 0.0], [0.0, 0.0]) == 1.0 and cosine([0.0, 0.0], [1.0, 0.0]) == 0.0


@pytest.mark.parametrize("task, baseline, optimized", [
    ("classify", [classified("sports", 0.9, 0.05, 0.05)], []),
    ("classify", [classified("sports", 0.9, 0.1, 0.0)],
     [{"label": "sports", "scores": {"a": 0.9, "b": 0.1, "c": 0.0}}]),
    ("classify", [{"label": "sports"}], [classified("sports", 0.9, 0.05, 0.05)]),
    ("embed", [{"embedding": [1.0, 0.0]}], [{"embedding": [1.0, 0.0, 0.0]}]),
    ("embed", [{"embedding": [1.0]}], [classified("sports", 0.9, 0.05, 0.05)]),
])
def test_answers_that_cannot_be_paired_are_a_mismatch(task, baseline, optimized):
    with pytest.raises(ShadowMismatch):
        compare(task, baseline, optimized)


def test_fields_count_pairs_per_margin_bucket_and_bin_cosines():
    pairs = [PairOutcome(True, 0.5), PairOutcome(False, 0.003), PairOutcome(True, 0.004),
             PairOutcome(cosine=0.99999)]
    fields = shadow_fields(pairs, calls=1)
    assert fields["calls"] == 1 and fields["pairs"] == 3 and fields["agreed"] == 2
    top = len(MARGIN_EDGES) - 1
    assert fields[f"m{top}:pairs"] == 1 and fields[f"m{top}:agreed"] == 1
    assert fields["m0:pairs"] == 2 and fields["m0:agreed"] == 1
    assert fields["cos_n"] == 1 and fields["cos_sum"] == pytest.approx(0.99999)
    assert fields[f"cos:{cosine_bin(0.99999)}"] == 1
    assert shadow_fields(shed=1) == {"shed": 1} and shadow_fields(errors=1) == {"errors": 1}


def test_cosine_bins_hold_their_gap_range():
    assert cosine_bin(1.0) == 0 and cosine_bin(1.0000001) == 0
    for j, gap in enumerate(COSINE_GAPS):
        assert cosine_bin(1.0 - gap * 0.999) == j
        if j + 1 < len(COSINE_GAPS):
            assert cosine_bin(1.0 - gap * 1.001) == j + 1
    assert cosine_bin(-1.0) == len(COSINE_GAPS) - 1


def windows_with(items: list[ShadowItem]) -> tuple[Windows, FakeClock]:
    hashes = MemoryHashes()
    hashes.increment(merge_shadow(items, APP))
    clock = FakeClock(START)
    return Windows(hashes, APP, clock=clock), clock


def test_the_window_sums_its_seconds_and_bounds_the_agreement():
    items = [ShadowItem(START - 10 + i, shadow_fields(
        [PairOutcome(i % 10 != 0, 0.2), PairOutcome(True, 0.001)], calls=1)) for i in range(10)]
    items.append(ShadowItem(START - 100, shadow_fields([PairOutcome(False, 0.2)] * 50)))
    items.append(ShadowItem(START - 3, shadow_fields(shed=1)))
    items.append(ShadowItem(START - 2, shadow_fields(errors=1)))
    windows, clock = windows_with(items)
    stats = windows.shadow(60)
    assert isinstance(stats, ShadowStats) and stats.seconds == 60.0
    assert (stats.pairs, stats.agreed, stats.calls, stats.shed, stats.errors) == (20, 19, 10, 1, 1)
    assert stats.agreement == pytest.approx(0.95)
    assert (stats.lower_bound, stats.upper_bound) == pytest.approx(wilson_interval(19, 20))
    assert stats.lower_bound < 0.95 < stats.upper_bound
    top = bucket_label(len(MARGIN_EDGES) - 1)
    assert stats.by_margin[bucket_label(0)] == (10, 10) and stats.by_margin[top] == (9, 10)
    assert sum(pairs for _, pairs in stats.by_margin.values()) == stats.pairs
    assert stats.cosine_n == 0 and stats.cosine_mean is None and stats.cosine_p1 is None
    assert windows.shadow(200).pairs == 70  # the old second is inside a longer window
    clock.advance(3600)
    empty = windows.shadow(60)
    assert empty.pairs == 0 and empty.agreement is None and empty.lower_bound is None


def test_cosine_p1_and_min_are_lower_edges_within_one_bin():
    cosines = [1.0 - 1e-7] * 180 + [1.0 - 5e-5] * 15 + [1.0 - 2e-3] * 4 + [0.5]
    items = [ShadowItem(START, shadow_fields([PairOutcome(cosine=c) for c in cosines]))]
    stats = windows_with(items)[0].shadow(10)
    assert stats.cosine_n == 200
    assert stats.cosine_mean == pytest.approx(sum(cosines) / 200)
    true_p1 = sorted(cosines)[math.ceil(0.01 * 200) - 1]  # nearest rank: 2nd lowest
    assert stats.cosine_p1 <= true_p1 and stats.cosine_p1 == pytest.approx(1 - 3e-3)
    assert stats.cosine_min <= 0.5 and stats.cosine_min == pytest.approx(0.0)


def test_redis_style_string_values_and_as_dict():
    fields = {k: str(v) for k, v in shadow_fields([PairOutcome(True, 0.07)], calls=1).items()}
    stats = aggregate_shadow([fields, {}], 2.0)
    assert stats.pairs == 1 and stats.agreement == 1.0 and stats.lower_bound < 1.0
    doc = stats.as_dict()
    assert doc["by_margin"][bucket_label(4)] == [1, 1] and doc["pairs"] == 1
    assert set(doc) >= {"seconds", "pairs", "agreed", "agreement", "lower_bound", "by_margin",
                        "cosine_mean", "cosine_p1", "shed", "errors"}


def test_keys_are_per_second_under_the_telemetry_namespace():
    merged = merge_shadow([ShadowItem(START + 0.2, {"pairs": 1}),
                           ShadowItem(START + 0.9, {"pairs": 2}),
                           ShadowItem(START + 1.1, {"shed": 1})], APP)
    assert merged == {shadow_key(APP, int(START)): {"pairs": 3},
                      shadow_key(APP, int(START) + 1): {"shed": 1}}
    assert shadow_key(APP, 5) == f"rollout:{APP}:telemetry:shadow:5"


def test_the_ramps_agreement_gate_reads_the_shadow_windows():
    from rollout.ramp.metrics import WindowsMetrics

    items = [ShadowItem(START - 5, shadow_fields([PairOutcome(True, 0.3)] * 59
                                                 + [PairOutcome(False, 0.001)], calls=30))]
    windows, _ = windows_with(items)
    assert WindowsMetrics(windows).agreement(60) == (60, 59)
    assert WindowsMetrics(windows_with([])[0]).agreement(60) == (0, 0)


def test_slice_counters_of_a_shadowed_request():
    han = ("script:han", "length:17-64", "label:sports")
    fields = shadow_fields([
        PairOutcome(True, 0.2, slices=han), PairOutcome(False, 0.2, slices=han),
        PairOutcome(False, 0.001, slices=("script:han", "header:a:b")),
        PairOutcome(cosine=0.9, slices=("script:latin",)),  # embed pairs are not sliced
    ], calls=1)
    assert fields["sl:script:han:pairs"] == 3 and fields["sl:script:han:agreed"] == 1
    assert fields["sl:script:han:cflips"] == 1  # the flip at margin 0.001 is not confident
    assert fields["sl:label:sports:cflips"] == 1 and "sl:header:a:b:cflips" not in fields
    assert fields["sl:header:a:b:pairs"] == 1
    assert not any(name.startswith("sl:script:latin") for name in fields)
    assert all(value > 0 for value in fields.values())  # counters only ever added to


def test_slices_aggregate_over_seconds_and_old_hashes_still_read():
    kana = ("script:kana", "length:1-16")
    items = [ShadowItem(START - 5 + i, shadow_fields(
        [PairOutcome(i % 2 == 0, 0.3, slices=kana),
         PairOutcome(True, 0.3, slices=("script:latin",))])) for i in range(4)]
    windows, _ = windows_with(items)
    stats = windows.shadow(60)
    assert stats.slices == {"script:kana": (4, 2, 2), "length:1-16": (4, 2, 2),
                            "script:latin": (4, 4, 0)}
    rows = stats.slice_rows(min_pairs=4)
    assert [r.slice for r in rows] == ["length:1-16", "script:kana", "script:latin"]
    assert stats.as_dict()["slices"]["script:kana"] == [4, 2, 2]
    old = aggregate_shadow([{"pairs": "3", "agreed": "3", "m0:pairs": "3", "m0:agreed": "3"}], 1)
    assert old.pairs == 3 and old.slices == {} and old.slice_rows() == []
