"""Plain-text formatting for the `rollout` CLI: times, ages, tables, change descriptions.

Text that came from the store (actors, reasons) is shown with control characters escaped, so
a stored value cannot break a table line or send escape sequences to the operator's terminal.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from rollout.share import format_bp

if TYPE_CHECKING:
    from rollout.state import RolloutState


def one_line(text: object) -> str:
    """`text` on one printable line: line breaks become ' | ', other controls are escaped."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    joined = " | ".join(lines)
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in joined)


def change_line(what: str, after: RolloutState) -> str:
    """What a change command prints: 'kill switch off -> on, ... (revision 4) by alice: why'."""
    return (f"{what} (revision {after.revision}) by {one_line(after.updated_by)}: "
            f"{one_line(after.reason)}")


def when(ts: float) -> str:
    """An epoch timestamp as ISO 8601 UTC to the second: 2023-11-14T22:13:20Z."""
    stamp = datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")
    return stamp.replace("+00:00", "Z")


def age(seconds: float) -> str:
    """A duration in its two largest units: 45s, 3m 20s, 2h 5m, 3d 4h."""
    left = max(0, int(seconds))
    parts = []
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)):
        if left >= size or (unit == "s" and not parts):
            parts.append(f"{left // size}{unit}")
            left %= size
    return " ".join(parts[:2])


def on_off(kill: bool) -> str:
    return "on" if kill else "off"


def describe_change(before: RolloutState, after: RolloutState) -> str:
    """'canary 60% -> 5%, kill switch on -> off, routes r1 -> none'; empty when none moved."""
    parts = []
    if before.canary_bp != after.canary_bp:
        parts.append(f"canary {format_bp(before.canary_bp)} -> {format_bp(after.canary_bp)}")
    if before.kill != after.kill:
        parts.append(f"kill switch {on_off(before.kill)} -> {on_off(after.kill)}")
    if before.routes != after.routes:
        ids = [",".join(r.id for r in s.routes) or "none" for s in (before, after)]
        parts.append(f"routes {ids[0]} -> {ids[1]}")
    return ", ".join(parts)


def unaudited(state: RolloutState) -> str:
    """Why a state without its audit entry is flagged, and how to record it."""
    if state.kill:
        return (f"revision {state.revision} (kill switch on) was written outside `rollout` and "
                "has no audit entry (the redis-cli emergency kill?): record why with "
                "`rollout kill --reason TEXT`")
    return (f"revision {state.revision} was written outside `rollout` and has no audit entry: "
            "check the share and set it with `rollout canary`")


def status_rows(state: RolloutState, now: float, audited: bool = True) -> list[tuple[str, str]]:
    """The human `rollout status` table as (label, value) rows."""
    effective = format_bp(state.effective_bp) + " of traffic to optimized"
    rows = [
        ("canary share", format_bp(state.canary_bp)),
        ("kill switch", "ON: all traffic to baseline" if state.kill else "off"),
        *([] if audited else [("UNAUDITED", unaudited(state))]),
        ("effective share", effective + (" (kill switch on)" if state.kill else "")),
        ("baseline", one_line(state.baseline_version) or "(share not bound to a version)"),
        ("optimized", one_line(state.optimized_version) or "(share not bound to a version)"),
        ("revision", str(state.revision)),
    ]
    if not state.revision:
        return rows + [("last change", "never")]
    return rows + [
        ("last change", f"{when(state.updated_at)} ({age(now - state.updated_at)} ago)"),
        ("changed by", one_line(state.updated_by)),
        ("reason", one_line(state.reason)),
    ]


TOPOLOGIES = {
    "colocated": "colocated: both models run in this gateway's replicas",
    "remote": "remote: a Serve deployment per arm, called from the gateway",
}


def gateway_rows(state: RolloutState, reports, now: float, ttl_s: float) -> list[tuple[str, str]]:
    """One row per gateway that reported what it serves, flagging silent or mismatched ones."""
    if not reports:
        return [("gateways", "none has reported (is the gateway running?)")]
    rows = []
    for report in reports:
        notes = []
        if now - report.ts > ttl_s:
            notes.append("silent")
        if state.optimized_version and report.optimized_version != state.optimized_version:
            notes.append("serves another optimized version: routes 0% until a new share is set")
        if report.state_revision > state.revision:
            notes.append(f"routed by revision {report.state_revision}, above the store's "
                         f"{state.revision}: the store lost writes; all baseline until the next "
                         "change")
        elif report.stale:
            notes.append("stale state: routing all to baseline"
                         + (f" ({report.state_error})" if report.state_error else ""))
        text = (f"optimized {one_line(report.optimized_version)}, baseline "
                f"{one_line(report.baseline_version)} (seen {age(now - report.ts)} ago)")
        label = f"gateway {one_line(report.gateway)}"
        rows.append((label, text + (": " + "; ".join(notes) if notes else "")))
        if report.auto or report.optimized_recipe:
            rows.append(("  recipe", one_line(report.auto or report.optimized_recipe)))
        if report.topology:
            rows.append(("  topology", TOPOLOGIES.get(report.topology, one_line(report.topology))))
        rows.extend(("  event", one_line(event)) for event in report.events)
        if report.store_errors:
            counts = ", ".join(f"{kind} {n}" for kind, n in sorted(report.store_errors.items()))
            rows.append(("  store errors", counts))
    return rows


def webhook_lines(health: dict, now: float) -> list[str]:
    """The notifications' counters (rollout.events.webhook_health), then a WARNING line for
    each problem: deliveries failing now, events given up or dropped in the last day."""
    line = (f"webhooks: {health['delivered']} delivered, {health['failed_attempts']} failed "
            f"attempts, {health['given_up']} given up, {health['dropped']} dropped")
    if health["last_delivered_ts"]:
        line += f" (last delivered {age(now - health['last_delivered_ts'])} ago)"
    return [line] + [f"WARNING: {one_line(text)}" for text in health["warnings"]]


def table(headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    """Left-aligned columns separated by two spaces; the last column is not padded."""
    cells = [list(headers)] + [[one_line(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers) - 1)]
    padded = ([cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)] + [row[-1]]
              for row in cells)
    return ["  ".join(row).rstrip() for row in padded]
