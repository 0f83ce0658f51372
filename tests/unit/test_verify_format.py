"""The `rollout verify` report (ops.verify.report) on a crafted comparison: confident flips are
shown with their inputs apart from near ties, with the accuracy drop, both speed figures and
the thresholds applied (no model, no torch)."""

from __future__ import annotations

from types import SimpleNamespace

from ops.verify.report import document, human
from rollout import Thresholds, Verdict, judge_summary
from rollout.agreement import Pair, summarize
from rollout.slices import slice_table
from serve.common.regression import Example, RegressionSet

LABELS = ("sports", "politics", "health")
LONG = "The minister said the new stadium would be paid for by the health budget " * 3


def crafted_report():
    examples = [Example(f"agreed input {i}", "sports") for i in range(96)]
    examples += [Example(LONG, "politics"), Example("Vote for the goalkeeper", "sports"),
                 Example("Flu season and football"), Example("Match report", "sports")]
    pairs = [Pair(0, 0, 0.3, 0.3, truth=0, index=i) for i in range(96)]
    pairs += [Pair(1, 2, 0.21, 0.04, truth=1, index=96),  # confident: 0.21
              Pair(0, 1, 0.05, 0.01, truth=0, index=97),  # confident: exactly at the edge
              Pair(2, 0, 0.003, 0.002, index=98),  # a near tie
              Pair(0, 0, 0.2, 0.2, truth=0, index=99)]
    regression = RegressionSet("set.jsonl", tuple(examples), "abcd")
    throughput = [{"batch": 8, "inputs": 100, "baseline": 100.0, "optimized": 250.0,
                   "speedup": 2.5, "baseline_set_order": 80.0, "optimized_set_order": 120.0,
                   "speedup_set_order": 1.5}]
    return SimpleNamespace(
        baseline=SimpleNamespace(version="fp32-aaa", labels=LABELS),
        optimized=SimpleNamespace(version="int8-bbb", recipe="int8-dynamic", plan=None),
        regression=regression, summary=summarize(pairs), split="external", calibration=None,
        slices=slice_table({"script:latin": (100, 97, 2), "script:han": (3, 0, 0)}, 30),
        throughput=throughput, memory={}, speedup=2.5, speedup_set_order=1.5, folded=3,
        retrieval=None)


def judged(report, thresholds):
    failures = judge_summary(thresholds, report.summary, report.speedup)
    return Verdict(baseline_version="fp32-aaa", optimized_version="int8-bbb",
                   passed=not failures, failures=tuple(failures), n=report.summary.n,
                   agreement=report.summary.agreement,
                   agreement_lower_bound=report.summary.lower_bound)


def test_the_table_shows_confident_flips_with_their_inputs_apart_from_near_ties():
    report, thresholds = crafted_report(), Thresholds(min_agreement=0, min_lower_bound=0)
    out = "\n".join(human(report, judged(report, thresholds), thresholds, speed_batch=8))

    confident, near = out.split("confident flips (baseline margin >= 0.05): 2\n")[1].split(
        "near-tie flips (baseline margin < 0.05): 1\n")
    rows = confident.strip().splitlines()[1:]
    assert rows[0].split()[:5] == ["96", "politics", "(0.2100)", "health", "(0.0400)"]
    assert rows[0].endswith("...") and LONG[:40] in rows[0]  # the input, clipped
    assert rows[1].split()[:5] == ["97", "sports", "(0.0500)", "politics", "(0.0100)"]
    assert "Vote for the goalkeeper" in rows[1]
    assert "Flu season and football" in near and "Flu season" not in confident
    assert "drop 2.02%" in out  # 99/99 labelled right against 97/99
    assert "2.50x" in out and "1.50x" in out  # served and set-order speedups
    assert ("verdict: FAIL: 2 confident flips (baseline margin >= 0.05) > 0; "
            "accuracy drop 0.0202 > 0.01") in out
    assert "(confident flips <= 0 at baseline margin >= 0.05, accuracy drop <= 0.01" in out


def test_the_json_document_carries_confident_flips_accuracy_drop_and_thresholds():
    report = crafted_report()
    thresholds = Thresholds(max_confident_flips=2, min_agreement=0.9, min_lower_bound=0.9)
    doc = document(report, judged(report, thresholds), thresholds, stored=False)

    assert [f["index"] for f in doc["confident_flips"]] == [96, 97]
    first = doc["confident_flips"][0]
    assert (first["text"], first["baseline"], first["optimized"]) == (LONG, "politics", "health")
    assert (first["baseline_margin"], first["optimized_margin"]) == (0.21, 0.04)
    assert [f["index"] for f in doc["flips"]] == [96, 97, 98]
    assert doc["min_margin"] == 0.05 and abs(doc["accuracy_drop"] - 2 / 99) < 1e-12
    assert doc["thresholds"]["max_confident_flips"] == 2
    assert doc["thresholds"]["max_accuracy_drop"] == 0.01
    assert (doc["speedup"], doc["speedup_set_order"]) == (2.5, 1.5)
    assert doc["failures"] == ["accuracy drop 0.0202 > 0.01"]


def test_the_slice_table_shows_every_slice_worst_judged_first():
    report, thresholds = crafted_report(), Thresholds(min_slice_size=30)
    out = "\n".join(human(report, judged(report, thresholds), thresholds, speed_batch=8))

    table = out.split("by slice, worst first (judged: >= 30 inputs")[1].splitlines()
    assert table[2].split() == ["script:latin", "100", "97.00%", "91.55%", "2", "yes"]
    assert table[3].split()[:2] == ["script:han", "3"] and table[3].split()[-1] == "no"
    assert ("judged     100 distinct inputs (3 later copies folded), all of it: a set other "
            "than the configured one") in out
    doc = document(report, judged(report, thresholds), thresholds, stored=False)
    assert [row["slice"] for row in doc["slices"]] == ["script:latin", "script:han"]
    assert doc["split"] == "external" and doc["calibration"] is None and doc["folded"] == 3
