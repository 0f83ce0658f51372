"""`burst`: the long-input burst, with the canary at a fixed share.

1. The canary share is set to `--canary` (default 50 %) through the audited CLI; the share found
   before is restored at the end, whatever happens.
2. Unloaded p99 and capacity (in texts/s) of the same long requests: `--texts` texts of about
   `--words` words each (deterministic pseudo-English), closed loops of `--ramp` clients.
3. The burst: `--clients` closed-loop clients for `--duration` seconds. The model replicas' RSS
   before it, at its end and every `--rss-every` s after until back within 10 % (at most
   `--rss-for` s); recovery of a small request as in `overload`.
4. `--kill-during`: `rollout kill` (then `rollout unkill`) `--kills` times spread over the burst,
   each kill's wall time; the kill switch is left as it was found.

Goals: goodput >= 90 % of capacity, p99 of the 200s <= 3x unloaded, every request
answered 200/503/504, recovery within 5 s, replica RSS within 10 % of its pre-burst value within
60 s, and (with `--kill-during`) the median kill <= 2 s.
"""

from __future__ import annotations

import asyncio
import threading
import time

from ops.cli.types import bounded_int, percent, positive_float, seconds
from ops.drill.client import DrillError, Target
from ops.drill.goals import Goal, Report, median
from ops.drill.memory import replica_rss, watch_rss
from ops.drill.niceness import as_operator
from ops.drill.operator_side import Cli, canary_at, kill_restored
from ops.drill.overload import (
    add_measure_arguments,
    client_figures,
    load_and_recover,
    load_goals,
    measure,
    phase_figures,
)
from ops.drill.texts import batch_bodies, make_texts
from ops.load import LoopLag, Sender, Shot, closed_loop

NAME = "burst"
HELP = "200 clients of 32 long texts at canary 50 %%: goodput, recovery, replica memory, kill time"
KILL_GOAL_S = 2.0
RSS_TOLERANCE_PCT = 10.0


def add_arguments(parser) -> None:
    parser.add_argument("--clients", type=bounded_int(1, 1000), default=200,
                        help="concurrent closed-loop clients (default 200)")
    parser.add_argument("--texts", type=bounded_int(1, 64), default=32,
                        help="texts per request (default 32)")
    parser.add_argument("--words", type=bounded_int(1, 1000), default=200,
                        help="words per text (default 200)")
    parser.add_argument("--duration", type=seconds(), default=30.0,
                        help="seconds of burst (default 30)")
    parser.add_argument("--canary", type=percent, default=50.0,
                        help="canary share in percent during the drill (default 50)")
    parser.add_argument("--capacity", type=positive_float,
                        help="skip the capacity ramp: use this many texts/s")
    parser.add_argument("--retry-after", type=float, default=1.0, metavar="S",
                        help="during the burst, a client answered 503 waits this long before "
                        "its next request, as an HTTP client honouring the gateway's "
                        "Retry-After (1 s) does; 0: it resends at once (a retry storm)")
    parser.add_argument("--kill-during", action="store_true",
                        help="time `rollout kill` during the burst")
    parser.add_argument("--kills", type=bounded_int(1, 20), default=5,
                        help="kills timed with --kill-during (default 5)")
    parser.add_argument("--rss-every", type=seconds(), default=5.0,
                        help="seconds between RSS samples after the burst (default 5)")
    parser.add_argument("--rss-for", type=seconds(), default=60.0,
                        help="seconds to watch RSS after the burst at most (default 60)")
    parser.add_argument("--serve-app", metavar="NAME",
                        help="count only this Serve application's replicas (default: any)")
    add_measure_arguments(parser, ramp="1,2,4", step=6.0)


async def run(target: Target, args) -> Report:
    report = Report(NAME)
    cli = Cli.parse(args.cli)
    bodies = batch_bodies(make_texts(256, args.words), args.texts, 64)
    sender = Sender(target.url, timeout_s=args.timeout, connections=args.clients + 8)
    probe = Sender(target.url, timeout_s=5.0, connections=2)
    try:
        with canary_at(cli, target.url, args.canary) as share_before:
            report.figures["canary % before / during"] = [share_before, args.canary]
            fire = lambda n: sender(bodies[n % len(bodies)], f"drill-burst-{n}", args.texts)  # noqa: E731
            unloaded, steps, capacity = await measure(fire, args, args.capacity, "texts_per_s")
            _measured(report, unloaded, steps, capacity)
            report.figures["client, unloaded and capacity runs"] = sender.take_stats().text()
            await _burst(report, target, cli, sender, fire, probe, capacity, unloaded["p99_ms"],
                         args)
    finally:
        await sender.aclose()
        await probe.aclose()
    return report


def _measured(report: Report, unloaded: dict, steps: list[dict], capacity: float) -> None:
    report.figures["unloaded p99 ms"] = unloaded["p99_ms"]
    for step in steps:
        report.figures[f"capacity step, {step['concurrency']} clients"] = (
            f"{step['texts_per_s']:.1f} texts/s, p99 {step['p99_ms'] or 0:.1f} ms")
    report.figures["capacity texts/s"] = capacity
    if unloaded.get("sent", 10) < 10:
        report.notes.append(f"the unloaded p99 is of {unloaded['sent']} requests: "
                            "raise --unloaded-duration for a steadier figure")


async def _burst(report, target, cli, sender, fire, probe, capacity, unloaded_p99,
                 args) -> None:
    rss_before = replica_rss(args.serve_app)
    shots: list[Shot] = []
    sender.take_stats()
    with kill_restored(cli, target.url):
        # started from the operator's thread: the kills run at the niceness an operator's do
        kills = (as_operator(_KillTimer, cli, args.kills, args.duration) if args.kill_during
                 else None)
        try:
            loop = closed_loop(fire, shots, concurrency=args.clients, duration_s=args.duration,
                               backoff=_backing_off(args.retry_after))
            async with LoopLag() as lag:
                figures, recovery, offered, rss = await _run_burst(loop, shots, probe,
                                                                   rss_before, args)
        finally:  # no kill may land after the switch is restored
            if kills:
                kills.finish()
    report.figures["burst"] = phase_figures(figures, recovery, "texts_per_s", "texts/s")
    report.figures["burst statuses"] = figures["statuses"]
    report.figures["burst: wait after a 503 s"] = args.retry_after
    client_figures(report, "burst: ", sender, lag)
    report.goals += load_goals("", figures, capacity, unloaded_p99, recovery, per="texts_per_s")
    _memory(report, rss_before, rss)
    if kills:
        _kills(report, kills, offered.started + args.duration)


def _backing_off(retry_after_s: float):
    """The client's wait after a 503 before its next request (not timed): `--retry-after`."""
    return lambda shot: retry_after_s if shot.status == 503 else 0.0


async def _run_burst(loop, shots, probe, rss_before, args):
    """The burst and its drain, with the RSS watch and the recovery probe from its end."""
    watch: dict = {}

    async def load():
        offered = await loop
        watch["end"] = replica_rss(args.serve_app)
        task = asyncio.create_task(watch_rss(rss_before, every_s=args.rss_every,
                                             up_to_s=args.rss_for, tolerance_pct=RSS_TOLERANCE_PCT,
                                             sample=lambda: replica_rss(args.serve_app)))
        watch["task"] = task
        return offered

    figures, recovery, offered = await load_and_recover(load(), shots, probe, args.give_up)
    watch["after"] = await watch["task"]
    return figures, recovery, offered, watch


def _memory(report: Report, before: dict, rss: dict) -> None:
    """RSS before, at the end and after the burst; judged on the last sample of the watch (the
    first within 10 %, else the one at `--rss-for`)."""
    after = rss["after"]
    report.goals.append(Goal("replica RSS growth over pre-burst after watch", after["growth_pct"],
                             "<=", RSS_TOLERANCE_PCT, "%"))
    if not before:
        report.figures["replica RSS MiB before"] = "no model replica found"
        report.notes.append("no model replica process found on this machine: RSS not judged "
                            "(run the drill on the gateway's machine, as its user)")
        return
    report.figures["replica RSS MiB before"] = before
    report.figures["replica RSS MiB at burst end"] = rss["end"]
    for sample in after["samples"]:
        report.figures[f"replica RSS MiB +{sample['t_s']:g} s"] = sample["mib"]
    report.figures["RSS back within 10 % after s"] = after["back_after_s"]


class _KillTimer(threading.Thread):
    """`rollout kill` then `rollout unkill`, `kills` times spread over the middle of the burst,
    in a thread of its own so the load's event loop does not delay the timing."""

    def __init__(self, cli: Cli, kills: int, duration_s: float):
        super().__init__(daemon=True, name="drill-kills")
        self.cli, self.kills, self.duration_s = cli, kills, duration_s
        self.started_at = time.monotonic()
        self.took: list[tuple[float, float]] = []  # (finished at, seconds)
        self.error: str | None = None
        self._halt = threading.Event()
        self.start()

    def finish(self) -> None:
        """Start no further kill; wait for the one under way (and its unkill)."""
        self._halt.set()
        self.join()

    def run(self) -> None:
        spacing = self.duration_s * 0.6 / self.kills
        try:
            for i in range(self.kills):
                due = self.started_at + self.duration_s * 0.2 + i * spacing
                if self._halt.wait(max(0.0, due - time.monotonic())):
                    return
                took = self.cli.kill()
                self.took.append((time.monotonic(), took))
                self.cli.unkill()
        except DrillError as exc:
            self.error = str(exc)


def _kills(report: Report, kills: _KillTimer, burst_end: float) -> None:
    seconds = [t for _, t in kills.took]
    report.figures["rollout kill during burst s"] = seconds
    late = sum(finished > burst_end for finished, _ in kills.took)
    if late:
        report.notes.append(f"{late} of the kills ended after the burst had stopped sending")
    if kills.error:
        report.notes.append(f"kill timing stopped: {kills.error}")
    report.goals.append(Goal("rollout kill during burst, median", median(seconds), "<=",
                             KILL_GOAL_S, "s", if_missing=False))
