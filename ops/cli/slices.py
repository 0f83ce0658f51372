"""The slice tables of `rollout status` (online agreement per slice, rollout.slices) and
`rollout ramp status` (the `worst_slice_agreement` gate's slices), worst first and short: the
worst SHOWN rows and how many more there are."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ops.cli.format import table
from rollout.slices import SliceRow, worst_rows

SHOWN = 10  # rows of a slice table; the rest are counted


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.2f}%"


def _more(left: int) -> list[str]:
    return [f"  ... and {left} more slice(s) (--json has them all)"] if left else []


def status_slice_lines(rows: list[SliceRow], min_pairs: int) -> list[str]:
    """Online agreement per slice: pairs, flips, confident flips, agreement and its 95 %
    Wilson lower bound; a slice under `min_pairs` pairs is marked `small`."""
    if not rows:
        return []
    shown, left = worst_rows(rows, SHOWN)
    cells = [(r.slice, f"{r.n:,}", f"{r.n - r.agreed:,}", f"{r.confident_flips:,}",
              _pct(r.agreement), _pct(r.lower_bound), "" if r.judged else "small")
             for r in shown]
    header = ("SLICE", "PAIRS", "FLIPS", "CONF.FLIPS", "AGREEMENT", "95% LOWER", "")
    return ([f"  by slice, worst first (small: under {min_pairs} pairs):"]
            + ["  " + line for line in table(header, cells)] + _more(left))


def gate_slice_lines(rows: Sequence[Mapping]) -> list[str]:
    """The `worst_slice_agreement` gate's slices: pairs, agreement and the ends of each judged
    slice's anytime-valid sequence (at the split alpha)."""
    if not rows:
        return []
    shown, left = list(rows[:SHOWN]), max(len(rows) - SHOWN, 0)

    def end(value) -> str:
        return "-" if value is None else f"{value:.4f}"

    cells = [(r["slice"], f"{r['pairs']:,}", _pct(r["agreement"]), end(r["lower"]),
              end(r["upper"]), "" if r["judged"] else "not judged") for r in shown]
    header = ("SLICE", "PAIRS", "AGREEMENT", "CS LOWER", "CS UPPER", "")
    return (["slices (worst_slice_agreement, worst first):"]
            + ["  " + line for line in table(header, cells)] + _more(left))
