"""What a drill scenario reports: its figures, its goals judged PASS / FAIL, and the text and
JSON forms of both.

A goal compares one measured value with a bound (`>=` or `<=`). A goal without a value (the
scenario could not measure it: no 200s, no replica processes found) is not judged unless it
says what a missing value means (`if_missing`): a recovery that never came is a FAIL, not a
blank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from rollout.agreement import percentile


def pct(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile of `values`, None for no values."""
    return percentile(values, q) if values else None


def ratio(value: float | None, base: float | None) -> float | None:
    """value / base, None when either is missing or base is not positive."""
    if value is None or base is None or base <= 0:
        return None
    return value / base


def share(part: int, whole: int) -> float | None:
    """part / whole in percent, None for an empty whole."""
    return 100.0 * part / whole if whole else None


def median(values: list[float]) -> float | None:
    """The median (mean of the middle two for an even count), None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


@dataclass(frozen=True)
class Goal:
    """`name`: `value` `op` `bound` `unit`, e.g. "normal client success: 99.7 >= 99 %"."""

    name: str
    value: float | None
    op: str  # ">=" or "<="
    bound: float
    unit: str = ""
    if_missing: bool | None = None  # the verdict without a value; None: not judged

    def __post_init__(self):
        if self.op not in (">=", "<="):
            raise ValueError(f"goal {self.name!r}: op must be '>=' or '<=', not {self.op!r}")

    @property
    def passed(self) -> bool | None:
        if self.value is None or (isinstance(self.value, float) and math.isnan(self.value)):
            return self.if_missing
        return self.value >= self.bound if self.op == ">=" else self.value <= self.bound

    @property
    def verdict(self) -> str:
        return {True: "PASS", False: "FAIL", None: "n/a"}[self.passed]

    def to_dict(self) -> dict:
        return {"name": self.name, "value": _round(self.value), "goal": f"{self.op} {self.bound:g}",
                "unit": self.unit, "passed": self.passed}


@dataclass
class Report:
    """One scenario's outcome; `error` is set when it could not run to the end."""

    scenario: str
    figures: dict[str, Any] = field(default_factory=dict)
    goals: list[Goal] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def passed(self) -> bool | None:
        """False when a goal failed or the scenario broke off, True when every judged goal passed,
        None when nothing was judged."""
        if self.error or any(g.passed is False for g in self.goals):
            return False
        return True if any(g.passed for g in self.goals) else None

    def to_dict(self) -> dict:
        return {"scenario": self.scenario, "passed": self.passed, "error": self.error,
                "figures": _rounded(self.figures), "goals": [g.to_dict() for g in self.goals],
                "notes": list(self.notes)}


def _round(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 3) if math.isfinite(value) else None
    return value


def _rounded(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rounded(v) for v in value]
    return _round(value)


def show(value: Any) -> str:
    """A figure as one line of text: floats to 3 significant places, dicts as k=v, None as -."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "-"
        if abs(value) < 0.0005:
            return "0"
        return f"{value:.1f}" if abs(value) >= 100 else f"{value:.3g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}={show(v)}" for k, v in value.items()) or "-"
    if isinstance(value, (list, tuple)):
        return " ".join(show(v) for v in value) or "-"
    return str(value)


def format_report(report: Report) -> str:
    """The report as text: figures, then one line per goal with its verdict."""
    lines = [f"== {report.scenario} =="]
    width = max((len(k) for k in report.figures), default=0)
    lines += [f"  {k:<{width}}  {show(v)}" for k, v in report.figures.items()]
    if report.goals:
        lines.append("  goals:")
        gw = max(len(g.name) for g in report.goals)
        for g in report.goals:
            lines.append(f"    {g.verdict:<4}  {g.name:<{gw}}  {show(g.value):>8} {g.unit:<3} "
                         f"(goal {g.op} {g.bound:g}{' ' + g.unit if g.unit else ''})")
    lines += [f"  note: {n}" for n in report.notes]
    if report.error:
        lines.append(f"  ERROR: {report.error}")
    return "\n".join(lines)


def summary_table(reports: list[Report]) -> str:
    """One row per scenario: goals passed, failed, not judged, and the verdict."""
    rows = [("scenario", "pass", "fail", "n/a", "verdict")]
    for r in reports:
        verdicts = [g.passed for g in r.goals]
        overall = "ERROR" if r.error else {True: "PASS", False: "FAIL", None: "n/a"}[r.passed]
        rows.append((r.scenario, str(verdicts.count(True)), str(verdicts.count(False)),
                     str(verdicts.count(None)), overall))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    out = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)
