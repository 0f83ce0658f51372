"""`rollout flips`: the inputs the shadowed arms disagreed on (rollout.flips), as a table, as
JSON, or exported as a regression set that `rollout verify --set FILE` replays.
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ops.cli.errors import NothingRecorded, UsageError
from ops.cli.format import one_line, table, when
from rollout.flips import FlipRecord, to_regression_row

if TYPE_CHECKING:  # the CLI's parser is built without pydantic (`rollout kill`)
    from rollout.state import DeploymentReport

REPORTS_TTL_S = 60.0  # rollout.control.DEPLOYMENT_TTL_S: a heartbeat older than this is not heard

HELP = "show the inputs the two arms disagreed on (flip capture), or export them for verify"
DESCRIPTION = (
    "Show the newest flips the gateways captured: shadowed classify inputs whose top-1 labels\n"
    "differ between the arms, with both labels and margins (top-1 minus top-2 score). Capture\n"
    "is off by default (the inputs are user data): set CANARY_FLIP_CAPTURE=true for the\n"
    "gateway, with CANARY_SHADOW_SHARE > 0. --export writes them as a regression set (one JSON\n"
    "object per line: text, and the labels, margins and versions as metadata; no label, since\n"
    "nobody knows which arm was right; repeated inputs once), for `rollout verify --set`."
)
EPILOG = (
    "examples:\n  rollout flips --last 20\n  rollout flips --json | jq '.[].text'\n"
    "  rollout flips --last 500 --export flips.jsonl\n"
    "  rollout verify --set flips.jsonl   # replay them against the next candidate"
)
OFF = "flip capture is off in every gateway: set CANARY_FLIP_CAPTURE=true for them"
NO_SHADOW = "the gateways capture flips but shadow no traffic: set CANARY_SHADOW_SHARE > 0"
UNREPORTED = ("flip capture is off in this shell's settings (no gateway reported in the last "
              f"{REPORTS_TTL_S:.0f} s to say what it runs): set CANARY_FLIP_CAPTURE=true for "
              "the gateways")
TEXT_MIN = 20  # the text column keeps at least this many characters on a narrow terminal


def add_parser(commands, common, positive) -> None:
    """The `flips` command; `positive` parses a whole number >= 1."""
    sub = commands.add_parser("flips", help=HELP, description=DESCRIPTION, epilog=EPILOG,
                              parents=[common],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    sub.add_argument("--last", metavar="N", type=positive, default=20,
                     help="the newest N flips (default 20)")
    sub.add_argument("--json", action="store_true", help="print JSON")
    sub.add_argument("--export", metavar="FILE",
                     help="write the flips to FILE as a regression set (JSONL), for "
                          "`rollout verify --set FILE`")


def run(ctx) -> int:
    if ctx.telemetry is None:
        raise UsageError("no telemetry store to read flips from")
    args = ctx.args
    records = ctx.telemetry.flips(args.last)
    capture_off = capture_problem(ctx.rollout.store.deployments(), ctx.clock.time(),
                                  ctx.read_settings().flip_capture)
    capture_on = capture_off is None
    if args.export:
        if not records:
            raise NothingRecorded(f"no flips to export: {_nothing(capture_off)}")
        count = export(records, args.export)
        ctx.say(f"wrote {count} inputs ({len(records)} flips) to {args.export}; replay them "
                f"with: rollout verify --set {args.export}")
        return 0
    if args.json:
        ctx.say(json.dumps([record.as_dict() for record in records]))
        if not records and not capture_on:
            ctx.warn(capture_off)
        return 0
    if not records:
        ctx.say(f"no flips captured: {_nothing(capture_off)}")
        return 0
    for line in flip_rows(records, shutil.get_terminal_size((120, 24)).columns):
        ctx.say(line)
    return 0


def capture_problem(reports: Sequence[DeploymentReport], now: float,
                    shell_setting: bool) -> str | None:
    """Why no flips are captured, as the gateways report it (their heartbeats of the last
    DEPLOYMENT_TTL_S), or None when some gateway captures and shadows. Only when no live gateway
    says (none running, or all from before capture was reported) is this shell's own
    CANARY_FLIP_CAPTURE the guess, said as such."""
    live = [r for r in reports if now - r.ts <= REPORTS_TTL_S and r.flip_capture is not None]
    if not live:
        return None if shell_setting else UNREPORTED
    capturing = [r for r in live if r.flip_capture]
    if not capturing:
        return OFF
    if not any((r.shadow_share or 0) > 0 for r in capturing):
        return NO_SHADOW
    return None


def _nothing(capture_off: str | None) -> str:
    if capture_off is not None:
        return capture_off
    return ("the arms agreed on every shadowed classify input kept (or CANARY_SHADOW_SHARE is "
            "0, or the flips expired: CANARY_FLIP_CAPTURE_TTL_S)")


def flip_rows(records: Sequence[FlipRecord], columns: int) -> list[str]:
    """The table, oldest first, the text cut to what the terminal has left; a generated
    answer's captured prompt shows where the arms part and its mean KLD."""
    rows = [(when(r.ts), "generate", f"KLD {r.kld:.4f}", f"parts at token {r.parted_at}", "-",
             one_line(r.text)) if r.task == "generate" else
            (when(r.ts), one_line(r.baseline_label), f"{r.baseline_margin:.4f}",
             one_line(r.optimized_label), f"{r.optimized_margin:.4f}", one_line(r.text))
            for r in records]
    headers = ("TIME", "BASELINE", "MARGIN", "OPTIMIZED", "MARGIN", "TEXT")
    used = sum(max(len(row[i]) for row in [headers, *rows]) + 2 for i in range(5))
    room = max(TEXT_MIN, columns - used)
    return table(headers, [(*row[:5], _cut(row[5], room)) for row in rows])


def _cut(text: str, room: int) -> str:
    return text if len(text) <= room else text[:room - 3] + "..."


def regression_rows(records: Sequence[FlipRecord]) -> list[dict]:
    """One row per distinct text (the newest flip's metadata, `seen`: how often it flipped),
    in the order of their newest flip."""
    newest: dict[str, tuple[FlipRecord, int]] = {}
    for record in records:
        if not record.text.strip():  # the regression-set loader needs text
            continue
        seen = newest.pop(record.text, (record, 0))[1]
        newest[record.text] = (record, seen + 1)
    return [{**to_regression_row(record), "seen": seen} for record, seen in newest.values()]


def export(records: Sequence[FlipRecord], path: str) -> int:
    """Write the regression set; the number of inputs written. UsageError when it cannot."""
    rows = regression_rows(records)
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None
    return len(rows)
