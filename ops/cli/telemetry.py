"""Plain-text views of telemetry for the `rollout` CLI: the per-arm table, online agreement and
trace waterfalls."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ops.cli.format import one_line, table, when
from ops.cli.slices import status_slice_lines
from rollout import ArmStats, ShadowStats, TraceSummary
from rollout.efficiency import Speedup
from rollout.slices import DEFAULT_MIN_PAIRS
from rollout.telemetry.traces import roots

ARM_HEADERS = ("ARM", "REQ/S", "SUCCESS", "ERRORS", "TIMEOUTS", "RETRIES", "P50 MS", "P99 MS",
               "QUEUE", "BATCH", "COMPUTE MS", "CPU S/1K", "COST/1K")
# span attributes worth a glance in a waterfall, with their short names
_SHOWN = (
    ("http.response.status_code", "status"), ("canary.arm", "arm"),
    ("canary.routed_arm", "routed"), ("canary.fallback", "fallback"),
    ("canary.reason", "reason"), ("canary.bucket", "bucket"), ("canary.share_bp", "share_bp"),
    ("canary.kill", "kill"), ("canary.state_revision", "rev"), ("canary.attempt", "attempt"),
    ("canary.outcome", "outcome"), ("canary.queue.length", "queued"),
    ("canary.batch.requests", "batch"), ("canary.batch.items", "items"),
    ("canary.batch.id", "batch_id"), ("canary.shadow.of", "shadow_of"),
    ("canary.shadow.outcome", "shadow"), ("canary.shadow.agreed", "agreed"),
    ("canary.shadow.margin", "margin"), ("canary.shadow.cosine", "cosine"),
    ("error.type", "error"),
)
BAR = 24


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def arm_rows(stats: Mapping[str, ArmStats]) -> list[str]:
    rows = [
        (s.arm, _num(s.request_rate, 2), _pct(s.success_rate), _pct(s.error_rate),
         _pct(s.timeout_rate), _pct(s.retry_rate), _num(s.p50_ms), _num(s.p99_ms),
         _num(s.queue_mean), _num(s.batch_mean), _num(s.compute_ms, 2),
         _cpu_per_1k(s), _cost_per_1k(s))
        for s in stats.values()
    ]
    return table(ARM_HEADERS, rows)


GENERATION_HEADERS = ("ARM", "ANSWERS", "TOKENS/S", "FIRST TOKEN P50 MS", "P99 MS",
                      "BETWEEN TOKENS MS")


def generation_rows(stats: Mapping[str, ArmStats]) -> list[str]:
    """A generative arm's answers over the window (none when no arm generated): output tokens
    per second, time to the first token (from the request's arrival), the mean between two
    tokens."""
    rows = [(s.arm, str(g["answers"]), _num(g["tokens_per_s"]), _num(g["first_token_p50_ms"]),
             _num(g["first_token_p99_ms"]), _num(g["inter_token_ms"], 2))
            for s in stats.values() if (g := s.generation)]
    return table(GENERATION_HEADERS, rows) if rows else []


def _cpu_per_1k(stats: ArmStats) -> str:
    """Measured forward seconds per 1,000 inputs (`gpu` after it on a CUDA replica)."""
    per_1k, device = stats.cpu_per_1k, stats.cpu.device
    if per_1k is None:
        return "-"
    return f"{per_1k:.4g}" + ("" if device == "cpu" else f" {device}")


def _cost_per_1k(stats: ArmStats) -> str:
    """The priced cost of 1,000 calls; without a price (CANARY_DEVICE_HOUR_PRICE: a cost of
    0), the CPU seconds per 1,000 inputs, so the column never reads 0."""
    if stats.cost_per_1k:
        return f"{stats.cost_per_1k:.6f}"
    per_1k = _cpu_per_1k(stats)
    return "-" if per_1k == "-" else f"{per_1k} cpu-s"


def efficiency_line(result: Speedup) -> str:
    """The realized speedup over the window, one line."""
    return ("realized speedup (baseline / optimized CPU s per input): " + result.text())


def shadow_lines(stats: ShadowStats) -> list[str]:
    """Online agreement over the window: one summary line, then agreement by baseline margin."""
    window = f"{stats.seconds:g}s"
    load = f"shed {stats.shed}, errors {stats.errors}"
    if not (stats.pairs or stats.cosine_n or stats.shed or stats.errors
            or stats.token_responses):
        return [f"online agreement (shadow): no shadowed requests in the last {window} "
                "(CANARY_SHADOW_SHARE)"]
    lines = [f"online agreement (shadow, last {window}):"]
    if stats.pairs:
        lines.append(f"  top-1     {_pct2(stats.agreement)} (95% lower bound "
                     f"{_pct2(stats.lower_bound)}, n={stats.pairs:,} pairs, "
                     f"{stats.pairs - stats.agreed:,} flipped)")
    if stats.cosine_n:
        lines.append(f"  cosine    mean {stats.cosine_mean:.6f}, p1 >= {stats.cosine_p1:.6f}, "
                     f"min >= {stats.cosine_min:.6f} (n={stats.cosine_n:,})")
    if stats.recall_queries:
        lines.append(f"  recall@10 {_pct2(stats.recall_at_10)} of the baseline's top-10 "
                     f"neighbours in the reservoir (n={stats.recall_queries:,} embed pairs)")
    if stats.token_responses:
        lines.append(f"  generated answers scored {stats.token_responses:,} "
                     f"({stats.token_tokens:,} tokens): KL divergence {stats.token_kld:.5f} "
                     f"nats per token, top-1 token agreement {_pct2(stats.token_agreement)}")
    lines.append(f"  shadow    {stats.calls:,} calls compared, {load}")
    if stats.pairs:
        rows = [(label, f"{pairs:,}", f"{pairs - agreed:,}", _pct2(agreed / pairs))
                for label, (agreed, pairs) in stats.by_margin.items() if pairs]
        lines += ["  " + line for line in table(("MARGIN", "PAIRS", "FLIPS", "AGREEMENT"), rows)]
    lines += status_slice_lines(stats.slice_rows(DEFAULT_MIN_PAIRS), DEFAULT_MIN_PAIRS)
    return lines


def _pct2(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.2f}%"


def trace_rows(summaries: Sequence[TraceSummary]) -> list[str]:
    rows = [
        (when(t.start), t.trace_id, t.request_id or "-", t.arm or "-",
         "-" if t.status is None else str(t.status), f"{t.duration_ms:.1f}",
         str(t.spans), "fallback" if t.fallback else "")
        for t in summaries
    ]
    return table(("TIME", "TRACE", "REQUEST", "ARM", "STATUS", "MS", "SPANS", ""), rows)


def _attrs(span: Mapping) -> str:
    attrs = span.get("attrs", {})
    shown = [f"{short}={attrs[key]}" for key, short in _SHOWN if key in attrs]
    if span.get("status") == "error" and "error.type" not in attrs:
        shown.append("error")
    return one_line(" ".join(shown))


def waterfall(spans: Sequence[Mapping]) -> list[str]:
    """One trace as an indented tree: offset and duration in ms, a bar on a common time axis."""
    if not spans:
        return []
    start = min(s["start"] for s in spans)
    total = max(max(s["end"] for s in spans) - start, 1e-9)
    children: dict[str | None, list[Mapping]] = {}
    ids = {s["span_id"] for s in spans}
    for span in spans:
        parent = span.get("parent_id") if span.get("parent_id") in ids else None
        children.setdefault(parent, []).append(span)
    lines: list[tuple[str, str, str, str, str, str]] = []

    def walk(span: Mapping, lead: str, tail: str) -> None:
        offset, duration = span["start"] - start, span["end"] - span["start"]
        left = min(BAR - 1, int(offset / total * BAR))
        width = max(1, round(duration / total * BAR))
        bar = " " * left + "#" * min(width, BAR - left)
        lines.append((lead + one_line(span["name"]), one_line(span.get("service", "")),
                      f"{offset * 1000:.2f}", f"{duration * 1000:.2f}", f"|{bar:<{BAR}}|",
                      _attrs(span)))
        kids = sorted(children.get(span["span_id"], []), key=lambda s: s["start"])
        for i, kid in enumerate(kids):
            last = i == len(kids) - 1
            walk(kid, tail + ("`- " if last else "|- "), tail + ("   " if last else "|  "))

    for root in roots(spans):
        walk(root, "", "")
    # not table(): its cells are stripped, and the tree's indentation must survive
    rows = [("SPAN", "SERVICE", "START MS", "MS", "", "ATTRIBUTES"), *lines]
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    padded = (["  ".join(c.ljust(w) for c, w in zip(row[:5], widths, strict=True)), row[5]]
              for row in rows)
    return ["  ".join(cells).rstrip() for cells in padded]
