"""The `rollout verify` report: the human table and the JSON document (no torch here)."""

from __future__ import annotations

from ops.cli.format import one_line, table
from rollout.agreement import Pair, Summary
from rollout.retrieval import QUERY_EVERY

SHOW_FLIPS = 20  # confident flips shown in the table (all of them are in --json)
SHOW_NEAR_TIES = 10  # near-tie flips shown
SHOW_SLICES = 15  # slices shown in the table, worst first (all of them are in --json)
SPLITS = {"held-out": "held-out split: inputs neither a recipe's tuning nor `auto` saw",
          "external": "all of it: a set other than the configured one, seen by neither"}


def pct(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{100 * value:.{digits}f}%"


def _flip(report, p: Pair) -> dict:
    labels = report.baseline.labels
    return {"index": p.index, "text": report.regression.texts[p.index],
            "baseline": labels[p.baseline], "baseline_margin": p.baseline_margin,
            "optimized": labels[p.optimized], "optimized_margin": p.optimized_margin,
            "cosine": p.cosine}


def document(report, verdict, thresholds, stored: bool) -> dict:
    """The `--json` object: every figure of the table, plus all flips."""
    s: Summary = report.summary
    plan = report.optimized.plan
    return {
        "baseline_version": report.baseline.version,
        "optimized_version": report.optimized.version,
        "recipe": report.optimized.recipe,
        "auto": auto_of(report.optimized),
        "decision": getattr(report.optimized, "decision", None),
        "plan": None if plan is None else {k: plan[k] for k in ("high_precision", "weights",
                                                                 "int8", "kept", "target")},
        "set": {"path": report.regression.path, "digest": report.regression.digest, "n": s.n},
        "n": s.n,
        "agreement": s.agreement,
        "agreement_lower_bound": s.lower_bound,
        "agreement_upper_bound": s.upper_bound,
        "split": report.split,
        "folded": report.folded,
        "calibration": _brief(report.calibration),
        "slices": [row.as_dict() for row in report.slices],
        "cosine": None if s.cosine is None else vars(s.cosine),
        "retrieval": None if report.retrieval is None else report.retrieval.as_dict(),
        "accuracy": s.accuracy,
        "accuracy_drop": s.accuracy_drop,
        "buckets": [{"margin": b.label, "n": b.n, "agree": b.agree, "agreement": b.agreement}
                    for b in s.buckets],
        "min_margin": s.min_margin,
        "confident_flips": [_flip(report, p) for p in s.confident],
        "flips": [_flip(report, p) for p in s.flips],
        "throughput": report.throughput,
        "speedup": report.speedup,
        "speedup_set_order": report.speedup_set_order,
        "memory": report.memory,
        "thresholds": thresholds.model_dump(),
        "passed": verdict.passed,
        "failures": list(verdict.failures),
        "stored": stored,
    }


def _brief(s: Summary | None) -> dict | None:
    """The calibration split's figures: shown beside the judged ones, judged by nothing."""
    return None if s is None else {"n": s.n, "agreement": s.agreement,
                                   "lower_bound": s.lower_bound,
                                   "confident_flips": len(s.confident), "judged": False}


def auto_of(variant) -> dict | None:
    """How `auto` chose the optimized recipe: its one line and every candidate's evidence."""
    choice = getattr(variant, "choice", None)
    if choice is None:
        return None
    from serve.recipes.auto.choose import describe

    return {"describe": describe(choice), "recipe": choice.recipe, "fallback": choice.fallback,
            "reason": choice.reason,
            "evidence": [e.model_dump(exclude={"decision"}) for e in choice.evidence]}


def human(report, verdict, thresholds, speed_batch: int) -> list[str]:
    s: Summary = report.summary
    labelled = sum(e.label is not None for e in report.regression.examples)
    lines = [
        f"baseline   {report.baseline.version}",
        f"optimized  {report.optimized.version}",
        f"set        {report.regression.path} ({len(report.regression)} inputs, {labelled} "
        f"labelled, sha256 {report.regression.digest})",
        f"judged     {s.n} distinct inputs ({report.folded} later copies folded), "
        f"{SPLITS[report.split]}",
    ]
    if report.optimized.plan is not None:
        from serve.recipes.accuracy_aware import describe

        lines.append(f"plan       {describe(report.optimized.plan)}")
    if (auto := auto_of(report.optimized)) is not None:
        lines.append(f"recipe     {auto['describe']}")
    lines += ["", f"top-1 agreement  {pct(s.agreement)} ({s.agree}/{s.n}), 95% Wilson interval "
                  f"{pct(s.lower_bound)} - {pct(s.upper_bound)}"]
    if (c := report.calibration) is not None:
        lines.append(f"calibration      {pct(c.agreement)} ({c.agree}/{c.n}, the inputs recipes "
                     f"tune on: shown, not judged), {len(c.confident)} confident flips")
    if s.cosine is not None:
        c = s.cosine
        lines.append(f"cosine           mean {c.mean:.5f}  p1 {c.p1:.5f}  min {c.min:.5f}")
    if s.accuracy:
        a = s.accuracy
        lines.append(f"accuracy         baseline {pct(a['baseline'], 1)}  optimized "
                     f"{pct(a['optimized'], 1)}  drop {pct(s.accuracy_drop)}  "
                     f"({a['n']} labelled)")
    lines += ["", "by baseline margin:"]
    lines += table(("MARGIN", "N", "AGREE", "AGREEMENT"),
                   [(b.label, str(b.n), str(b.agree), pct(b.agreement)) for b in s.buckets])
    lines += _slices(report.slices, thresholds)
    lines += _retrieval(report.retrieval, thresholds)
    lines += _flips(report, s)
    lines += _throughput(report)
    if report.memory:
        b, o = report.memory["baseline"], report.memory["optimized"]
        lines += ["", "memory, MiB:"]
        lines += table(("", "BASELINE", "OPTIMIZED"), [
            ("weights", f"{b['weights_mib']:.1f}", f"{o['weights_mib']:.1f}"),
            (f"peak growth, batch {b['batch']}", f"{b['peak_mib']:.1f}", f"{o['peak_mib']:.1f}"),
        ])
    outcome = "PASS" if verdict.passed else "FAIL: " + "; ".join(verdict.failures)
    return lines + ["", f"verdict: {outcome}", *auto_disagrees(report, verdict),
                    *_rule(thresholds, speed_batch)]


def auto_disagrees(report, verdict) -> list[str]:
    """Where `auto` served a recipe that fails here: the figure it judged closest to its bar on
    the validation split."""
    choice = getattr(report.optimized, "choice", None)
    found = choice.evidence_for(choice.recipe) if choice is not None else None
    if verdict.passed or found is None or not found.passed:
        return []
    return [f"  auto passed {choice.recipe} on the validation split, where its figure closest "
            f"to its bar (raised by the margin) was {found.closest}; this split disagrees"]


def _slices(rows, thresholds) -> list[str]:
    """The slice table, worst first; a slice under the minimum size is shown, not judged."""
    if not rows:
        return []
    lines = ["", f"by slice, worst first (judged: >= {thresholds.min_slice_size} inputs; each "
                 f"judged slice's 95% upper bound must reach {thresholds.min_slice_agreement}):"]
    lines += table(("SLICE", "N", "AGREEMENT", "WILSON LOW", "CONF. FLIPS", "JUDGED"), [
        (row.slice, str(row.n), pct(row.agreement), pct(row.lower_bound),
         str(row.confident_flips), "yes" if row.judged else "no")
        for row in rows[:SHOW_SLICES]])
    if len(rows) > SHOW_SLICES:
        lines.append(f"... and {len(rows) - SHOW_SLICES} more slices (--json lists all)")
    return lines


def _retrieval(found, thresholds) -> list[str]:
    """Retrieval compatibility (rollout.retrieval): the three figures with ties and strictly,
    then the slices, worst first."""
    if found is None:
        return []
    lines = ["", f"retrieval, {found.queries} queries (every {QUERY_EVERY}th judged input, "
                 f"itself excluded) against the baseline's index of {found.documents}; a "
                 f"neighbour within {found.tolerance:g} of the baseline's 10th (1st) counts:",
             f"  recall@10 {pct(found.recall_at_10)}  on a half re-embedded index "
             f"{pct(found.recall_at_10_mixed)}  top-1 unchanged {pct(found.top1_unchanged)}"
             f"  (gate: recall@10 >= {thresholds.min_recall_at_10}, overall and mixed; per "
             f"judged slice, its 95% upper bound)",
             f"  strict (no tolerance, shown): recall@10 {pct(found.strict_recall_at_10)}  "
             f"mixed {pct(found.strict_recall_at_10_mixed)}  top-1 unchanged "
             f"{pct(found.strict_top1_unchanged)}",
             f"  {found.tied} of {found.queries} queries have a rival within {found.tolerance:g} "
             f"of their 1st or 10th neighbour (near-duplicates: what makes a slice fragile)"]
    if (truth := found.ground_truth) is not None:
        lines.append(f"  against the set's relevance labels ({truth.queries} queries): "
                     f"baseline {pct(truth.baseline_recall_at_10)}, optimized "
                     f"{pct(truth.optimized_recall_at_10)} (shown, not judged)")
    lines += table(("SLICE", "QUERIES", "RECALL@10", "95% INTERVAL", "STRICT", "MIXED",
                    "TOP-1 SAME", "TIED", "JUDGED"), [
        (row.slice, str(row.n), pct(row.recall_at_10),
         f"{pct(row.interval[0])} - {pct(row.interval[1])}" if row.interval else "",
         pct(row.strict_recall_at_10), pct(row.recall_at_10_mixed),
         pct(row.top1_unchanged), str(row.tied), "yes" if row.judged else "no")
        for row in found.slices[:SHOW_SLICES]])
    return lines


def _flips(report, s: Summary) -> list[str]:
    """The confident flips (the damage the gate counts), then the near-tie ones."""
    lines = ["", f"confident flips (baseline margin >= {s.min_margin:g}): {len(s.confident)}"]
    lines += _flip_table(report, s.confident, SHOW_FLIPS)
    near = [p for p in s.flips if p.baseline_margin < s.min_margin]
    if near:
        lines += ["", f"near-tie flips (baseline margin < {s.min_margin:g}): {len(near)}"]
        lines += _flip_table(report, near, SHOW_NEAR_TIES)
    return lines


def _flip_table(report, flips: list[Pair], show: int) -> list[str]:
    if not flips:
        return []
    labels, texts = report.baseline.labels, report.regression.texts
    lines = table(("#", "BASELINE (MARGIN)", "OPTIMIZED (MARGIN)", "TEXT"), [
        (str(p.index), f"{labels[p.baseline]} ({p.baseline_margin:.4f})",
         f"{labels[p.optimized]} ({p.optimized_margin:.4f})", clip(texts[p.index]))
        for p in flips[:show]])
    if len(flips) > show:
        lines.append(f"... and {len(flips) - show} more with smaller baseline margins (--json "
                     "lists all)")
    return lines


def _throughput(report) -> list[str]:
    if not report.throughput:
        return []
    lines = ["", f"throughput, seq/s ({report.throughput[0]['inputs']} inputs, tokenizer "
                 "included, best of 3 interleaved rounds),",
             "served as length-sorted batches (the gated speedup) and in set order (compare):"]
    return lines + table(
        ("BATCH", "BASELINE", "OPTIMIZED", "SPEEDUP", "SET ORDER: BASELINE", "OPTIMIZED",
         "SPEEDUP"),
        [(str(r["batch"]), f"{r['baseline']:.1f}", f"{r['optimized']:.1f}",
          f"{r['speedup']:.2f}x", f"{r['baseline_set_order']:.1f}",
          f"{r['optimized_set_order']:.1f}", f"{r['speedup_set_order']:.2f}x")
         for r in report.throughput])


def _rule(t, speed_batch: int) -> list[str]:
    """Every threshold the verdict applied, in the order it judges them."""
    return [f"  (confident flips <= {t.max_confident_flips} at baseline margin >= "
            f"{t.min_margin:g}, accuracy drop <= {t.max_accuracy_drop:g}, agreement >= "
            f"{t.min_agreement},",
            f"   lower bound >= {t.min_lower_bound}, cosine p1 >= {t.min_cosine_p1} (encoders), "
            f"speedup >= {t.min_speedup}x at batch {speed_batch}, served batches,",
            f"   every slice of >= {t.min_slice_size} inputs: agreement's upper bound >= "
            f"{t.min_slice_agreement}, embeddings: recall@10 >= {t.min_recall_at_10}",
            f"   with ties within {t.retrieval_tolerance:g}, a slice's by its upper bound)"]


def clip(text: str, width: int = 60) -> str:
    text = one_line(text)
    return text if len(text) <= width else text[: width - 3] + "..."
