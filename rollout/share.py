"""The canary share in basis points (1 bp = 0.01 %), so that every share an operator can set is
exact: 0.01 % is the smallest step and 10,000 bp is all traffic. Also what counts as a big move,
the change that needs an operator's confirmation.

Plain Python on purpose (no pydantic): `rollout kill` (rollout.killswitch) imports it.
"""

from __future__ import annotations

import math
import re

from rollout.errors import InvalidChange

BUCKETS = 10_000  # one bucket per basis point of traffic
BIG_MOVE_BP = BUCKETS // 2  # a move of 50 points or more needs confirmation

_PERCENT = re.compile(r"^\d{1,3}(\.\d{1,2})?$")


def parse_percent(text: str | float) -> int:
    """Turn an operator's percentage ("5", "0.25", "100") into basis points.

    Rejects anything outside 0–100 or finer than 0.01 %, rather than rounding silently.
    """
    raw = str(text).strip()
    if isinstance(text, float) and math.isfinite(text):
        raw = f"{text:.10f}".rstrip("0").rstrip(".")
    if not _PERCENT.match(raw):
        raise InvalidChange(
            f"invalid canary share {str(text)!r}: give a percentage between 0 and 100 "
            "with at most two decimals (0.01 is the smallest step)"
        )
    whole, _, frac = raw.partition(".")
    bp = int(whole) * 100 + int((frac + "00")[:2])
    if bp > BUCKETS:
        raise InvalidChange(f"invalid canary share {raw}%: it cannot exceed 100")
    return bp


def format_bp(bp: int) -> str:
    """Basis points as a percentage string without float noise: 1 -> '0.01%', 500 -> '5%'."""
    whole, frac = divmod(bp, 100)
    return f"{whole}.{frac:02d}".rstrip("0").rstrip(".") + "%"


def big_move(before, after) -> bool:
    """Whether a change needs the operator's confirmation (the CLI's `--yes`, the dashboard's
    confirm step): it moves the stored or the effective share by >= 50 points, or to 100 %.
    `before` and `after` are states (anything with `canary_bp` and `effective_bp`)."""
    moves = ((before.canary_bp, after.canary_bp), (before.effective_bp, after.effective_bp))
    for old, new in moves:
        if old != new and (abs(new - old) >= BIG_MOVE_BP or new == BUCKETS):
            return True
    return False
