"""The `rollout verify` report: the human table and the JSON document (no torch here)."""

from __future__ import annotations

from ops._cli_format import one_line, table
from rollout.agreement import Summary

SHOW_FLIPS = 20


def _pct(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{100 * value:.{digits}f}%"


def document(report, verdict, thresholds, stored: bool) -> dict:
    """The `--json` object: every figure of the table, plus all flips."""
    s: Summary = report.summary
    labels = report.baseline.labels
    plan = report.optimized.plan
    texts = report.regression.texts
    return {
        "baseline_version": report.baseline.version,
        "optimized_version": report.optimized.version,
        "recipe": report.optimized.recipe,
        "plan": None if plan is None else {k: plan[k] for k in ("high_precision", "weights",
                                                                 "int8", "kept", "target")},
        "set": {"path": report.regression.path, "digest": report.regression.digest, "n": s.n},
        "n": s.n,
        "agreement": s.agreement,
        "agreement_lower_bound": s.lower_bound,
        "agreement_upper_bound": s.upper_bound,
        "held_out_agreement": None if report.held_out is None else {
            "n": report.held_out.n, "agreement": report.held_out.agreement,
            "lower_bound": report.held_out.lower_bound},
        "cosine": None if s.cosine is None else vars(s.cosine),
        "accuracy": s.accuracy,
        "buckets": [{"margin": b.label, "n": b.n, "agree": b.agree, "agreement": b.agreement}
                    for b in s.buckets],
        "flips": [{"index": p.index, "text": texts[p.index],
                   "baseline": labels[p.baseline], "baseline_margin": p.baseline_margin,
                   "optimized": labels[p.optimized], "optimized_margin": p.optimized_margin,
                   "cosine": p.cosine} for p in s.flips],
        "throughput": report.throughput,
        "speedup": report.speedup,
        "memory": report.memory,
        "thresholds": thresholds.model_dump(),
        "passed": verdict.passed,
        "failures": list(verdict.failures),
        "stored": stored,
    }


def human(report, verdict, thresholds, speed_batch: int) -> list[str]:
    s: Summary = report.summary
    labels = report.baseline.labels
    texts = report.regression.texts
    labelled = sum(e.label is not None for e in report.regression.examples)
    lines = [
        f"baseline   {report.baseline.version}",
        f"optimized  {report.optimized.version}",
        f"set        {report.regression.path} ({s.n} inputs, {labelled} labelled, "
        f"sha256 {report.regression.digest})",
    ]
    if report.optimized.plan is not None:
        from serve.plan import describe

        lines.append(f"plan       {describe(report.optimized.plan)}")
    lines += ["", f"top-1 agreement  {_pct(s.agreement)} ({s.agree}/{s.n}), 95% Wilson interval "
                  f"{_pct(s.lower_bound)} - {_pct(s.upper_bound)}"]
    if report.held_out is not None:
        h = report.held_out
        lines.append(f"held-out         {_pct(h.agreement)} ({h.agree}/{h.n}, inputs the plan "
                     f"was not tuned on), lower bound {_pct(h.lower_bound)}")
    if s.cosine is not None:
        c = s.cosine
        lines.append(f"cosine           mean {c.mean:.5f}  p1 {c.p1:.5f}  min {c.min:.5f}")
    if s.accuracy:
        a = s.accuracy
        lines.append(f"accuracy         baseline {_pct(a['baseline'], 1)}  optimized "
                     f"{_pct(a['optimized'], 1)}  ({a['n']} labelled)")
    lines += ["", "by baseline margin:"]
    lines += table(("MARGIN", "N", "AGREE", "AGREEMENT"),
                   [(b.label, str(b.n), str(b.agree), _pct(b.agreement)) for b in s.buckets])
    if s.flips:
        shown = s.flips[:SHOW_FLIPS]
        lines += ["", f"flips: {len(s.flips)}"
                      + (f" (the {len(shown)} with the largest baseline margin)"
                         if len(shown) < len(s.flips) else "")]
        lines += table(("#", "BASELINE (MARGIN)", "OPTIMIZED (MARGIN)", "TEXT"), [
            (str(p.index), f"{labels[p.baseline]} ({p.baseline_margin:.4f})",
             f"{labels[p.optimized]} ({p.optimized_margin:.4f})", _clip(texts[p.index]))
            for p in shown])
    if report.throughput:
        order = "length-sorted" if report.sorted_speed else "in set order"
        lines += ["", f"throughput, seq/s ({report.throughput[0]['inputs']} inputs {order}, "
                      "tokenizer included, best of 3 interleaved rounds):"]
        lines += table(("BATCH", "BASELINE", "OPTIMIZED", "SPEEDUP"), [
            (str(r["batch"]), f"{r['baseline']:.1f}", f"{r['optimized']:.1f}",
             f"{r['speedup']:.2f}x") for r in report.throughput])
    if report.memory:
        b, o = report.memory["baseline"], report.memory["optimized"]
        lines += ["", "memory, MiB:"]
        lines += table(("", "BASELINE", "OPTIMIZED"), [
            ("weights", f"{b['weights_mib']:.1f}", f"{o['weights_mib']:.1f}"),
            (f"peak growth, batch {b['batch']}", f"{b['peak_mib']:.1f}", f"{o['peak_mib']:.1f}"),
        ])
    rule = (f"agreement >= {thresholds.min_agreement}, lower bound >= "
            f"{thresholds.min_lower_bound}, speedup >= {thresholds.min_speedup}x at batch "
            f"{speed_batch}")
    if thresholds.min_cosine_p1 > -1:
        rule += f", cosine p1 >= {thresholds.min_cosine_p1}"
    outcome = "PASS" if verdict.passed else "FAIL: " + "; ".join(verdict.failures)
    return lines + ["", f"verdict: {outcome}", f"  ({rule})"]


def _clip(text: str, width: int = 60) -> str:
    text = one_line(text)
    return text if len(text) <= width else text[: width - 3] + "..."
