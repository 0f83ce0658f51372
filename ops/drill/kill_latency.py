"""`kill`: how long an operator waits for `rollout kill` on a quiet gateway.

`rollout kill --reason drill` is run `--times` times as a separate process, each timed from spawn
to exit and followed by `rollout unkill`; the kill switch is left as it was found (read from
`GET /v1/rollout`). Goal: median <= 0.25 s (an operator pulling a canary back waits for the
command, not for Redis).
"""

from __future__ import annotations

import asyncio

from ops.cli.types import bounded_int
from ops.drill.client import Target
from ops.drill.goals import Goal, Report, median
from ops.drill.operator_side import Cli, kill_restored, time_kills

NAME = "kill"
HELP = "time `rollout kill` on a quiet gateway (median of 5, unkill after each)"
GOAL_S = 0.25


def add_arguments(parser) -> None:
    parser.add_argument("--times", type=bounded_int(1, 20), default=5,
                        help="kills to time (default 5)")


def _timed(cli: Cli, url: str, times: int) -> tuple[bool, list[float]]:
    with kill_restored(cli, url) as was_on:
        return was_on, time_kills(cli, times)


async def run(target: Target, args) -> Report:
    cli = Cli.parse(args.cli)
    was_on, took = await asyncio.to_thread(_timed, cli, target.url, args.times)
    report = Report(NAME)
    report.figures.update({
        "command": " ".join(cli.command) + " kill --reason drill",
        "kill switch before": "on" if was_on else "off",
        "wall time s": took,
        "min / max s": [min(took), max(took)],
    })
    report.goals.append(Goal("rollout kill, median", median(took), "<=", GOAL_S, "s",
                             if_missing=False))
    return report
