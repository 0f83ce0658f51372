"""The `rollout verify` report for a causal LM (ops.verify.token_runner): the human table and
the JSON document (no torch here)."""

from __future__ import annotations

from ops.cli.format import table
from ops.verify.report import SHOW_SLICES, SPLITS, auto_disagrees, auto_of, clip, pct
from rollout.token_fidelity import KLD_CLIP

SHOW_PARTED = 10  # earliest-parting prompts shown in the table (--json lists every response)


def document(report, verdict, thresholds, stored: bool) -> dict:
    """The `--json` object: every figure of the table, and every response's."""
    found = report.fidelity
    return {
        "task": "generate",
        "baseline_version": report.baseline.version,
        "optimized_version": report.optimized.version,
        "recipe": report.optimized.recipe,
        "auto": auto_of(report.optimized),
        "set": {"path": report.regression.path, "digest": report.regression.digest,
                "n": found.n},
        "split": report.split,
        "n": found.n,
        "prompts_left_out": report.left_out,
        "continuation_tokens": report.tokens,
        **found.as_dict(),
        "responses": [{"index": r.index, **dict(zip(("prompt", "continuation", "optimized"),
                                                   report.said[r.index], strict=True)),
                       "prompt_ids": report.prompt_ids[r.index], "tokens": r.tokens,
                       "kld": r.mean_kld, "agreement": r.agreement, "identical": r.identical,
                       "first_divergence": r.first_divergence, "slices": list(r.slices)}
                      for r in report.responses],
        "throughput": report.throughput,
        "speedup": report.speedup,
        "memory": report.memory,
        "thresholds": thresholds.model_dump(),
        "passed": verdict.passed,
        "failures": list(verdict.failures),
        "stored": stored,
    }


def human(report, verdict, thresholds) -> list[str]:
    found = report.fidelity
    left = (f", {report.left_out} left out (fewer than {report.tokens} tokens of the context "
            "left)" if report.left_out else "")
    lines = [
        f"baseline   {report.baseline.version}",
        f"optimized  {report.optimized.version}",
        *([f"recipe     {auto['describe']}"] if (auto := auto_of(report.optimized)) else []),
        f"set        {report.regression.path} ({len(report.regression)} inputs, sha256 "
        f"{report.regression.digest})",
        f"judged     {found.n} prompts of {report.sampled_from} (evenly spaced{left}), "
        f"{SPLITS[report.split]}",
        f"           each: the baseline's greedy continuation of up to {report.tokens} tokens "
        f"({found.tokens} in all), scored teacher-forced by both arms",
        "",
        *table(("PER RESPONSE", "MEAN", "95% INTERVAL", "GATE"), [
            (f"KL divergence, nats (clipped at {KLD_CLIP:g})", f"{found.kld:.5f}",
             f"{found.kld_interval[0]:.5f} - {found.kld_interval[1]:.5f}",
             f"upper <= {thresholds.max_kld:g}"),
            ("top-1 token agreement", pct(found.agreement),
             f"{pct(found.agreement_interval[0])} - {pct(found.agreement_interval[1])}",
             f"lower >= {thresholds.min_token_agreement:g}")]),
        "",
        f"per token (shown): KLD mean {found.token_kld_mean:.5f}  p99 "
        f"{found.token_kld_p99:.4f}  max {found.token_kld_max:.3f}",
        f"greedy continuations identical to the baseline's: {pct(found.identical, 1)}"
        + ("" if found.first_divergence_mean is None else
           f" (the others part at token {found.first_divergence_mean:.1f} on average)"),
        f"perplexity of the baseline's continuations: baseline "
        f"{found.perplexity_baseline:.3f}, optimized {found.perplexity_optimized:.3f}",
    ]
    lines += _slices(found.slices, thresholds)
    lines += _parted(report)
    lines += _speed(report, thresholds)
    outcome = "PASS" if verdict.passed else "FAIL: " + "; ".join(verdict.failures)
    return lines + ["", f"verdict: {outcome}", *auto_disagrees(report, verdict)]


def _slices(rows, thresholds) -> list[str]:
    if not rows:
        return []
    lines = ["", f"by slice, worst agreement first (judged: >= {thresholds.min_slice_size} "
                 "responses; fails when its KLD's lower bound or its agreement's upper bound "
                 "is past the gate):"]
    lines += table(("SLICE", "N", "KLD", "95% INTERVAL", "AGREEMENT", "95% INTERVAL",
                    "IDENTICAL", "JUDGED"), [
        (row.slice, str(row.n), f"{row.kld:.5f}",
         f"{row.kld_interval[0]:.5f} - {row.kld_interval[1]:.5f}" if row.kld_interval else "",
         pct(row.agreement),
         (f"{pct(row.agreement_interval[0])} - {pct(row.agreement_interval[1])}"
          if row.agreement_interval else ""),
         pct(row.identical, 1), "yes" if row.judged else "no")
        for row in rows[:SHOW_SLICES]])
    if len(rows) > SHOW_SLICES:
        lines.append(f"... and {len(rows) - SHOW_SLICES} more slices (--json lists all)")
    return lines


def _parted(report) -> list[str]:
    """The prompts whose greedy continuations part earliest: what to read first."""
    parted = sorted((r for r in report.responses if r.first_divergence is not None),
                    key=lambda r: (r.first_divergence, -r.mean_kld))
    if not parted:
        return []
    lines = ["", f"continuations that part earliest ({len(parted)} of "
                 f"{len(report.responses)} part):"]
    return lines + table(("#", "PARTS AT", "KLD", "AGREEMENT", "PROMPT", "BASELINE",
                          "OPTIMIZED"), [
        (str(r.index), str(r.first_divergence), f"{r.mean_kld:.4f}", pct(r.agreement),
         *(clip(text, 30) for text in report.said[r.index]))
        for r in parted[:SHOW_PARTED]])


def _speed(report, thresholds) -> list[str]:
    if not report.throughput:
        return ["", "speed: not measured (--no-speed)"]
    t, memory = report.throughput, report.memory
    return ["", f"decode loop, output tokens/s ({t['sequences']} prompts x {t['tokens']} tokens, "
                f"{t['batch']} sequences at a time, best of 3 interleaved rounds):",
            *table(("", "BASELINE", "OPTIMIZED"), [
                ("tokens/s", f"{t['baseline']:,.0f}", f"{t['optimized']:,.0f}"),
                ("weights, MiB", f"{memory['baseline']['weights_mib']:.1f}",
                 f"{memory['optimized']['weights_mib']:.1f}"),
                ("KV cache, bytes per token", f"{memory['baseline']['kv_bytes_per_token']:,}",
                 f"{memory['optimized']['kv_bytes_per_token']:,}")]),
            f"speedup {report.speedup:.2f}x (gate >= {thresholds.min_speedup}x)"]
