"""`overload`: short requests offered open-loop at multiples of the measured capacity, each
with a deadline (`X-Request-Timeout-Ms`, `--request-timeout-ms`).

1. Unloaded p99: one short request at a time for `--unloaded-duration` (or `--unloaded-p99-ms`).
2. Capacity: closed loops of `--ramp` clients, `--step-duration` each; capacity is the best
   200s/s any step sustained (or `--capacity`).
3. For each of `--factors`: `--duration` seconds open loop at factor x capacity, then, from the
   moment sending stops, the time until a small request is answered 200 in under 200 ms
   (polled every 100 ms) while the backlog drains.

Goals, per factor: goodput >= 90 % of capacity up to 2x and >= 60 % beyond, p99 of the 200s
within the requests' deadline, every request answered 200, 503 or 504 (none lost), 504s <= 1 %
of those sent, recovered within 5 s. The p99 against the unloaded p99 is a figure, not a goal:
a batching server keeps it low only by refusing work it could do. With
`--request-timeout-ms 0` no deadline is sent and the p99 is reported as a figure.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from ops.cli.types import bounded_int, client_counts, factors, positive_float, seconds
from ops.drill.client import DrillError, Target
from ops.drill.goals import Goal, Report, ratio, share
from ops.drill.texts import short_body, small_probe
from ops.load import (
    LoopLag,
    Offered,
    Sender,
    Shot,
    drain,
    measure_closed,
    open_loop,
    recovery_time,
    summarize,
)

NAME = "overload"
HELP = "open-loop load at 2x, 5x, 10x measured capacity: goodput, p99, nothing lost, recovery"
RECOVERED_MS = 200
RECOVERY_GOAL_S = 5.0
TIMEOUTS_GOAL_PCT = 1.0  # 504s, of the requests sent
TIMEOUT_HEADER = "X-Request-Timeout-Ms"
LAG_NOTE_MS = 100.0  # a client loop later than this is noted beside the latencies
MAX_RATE = 5_000.0  # requests offered per second at most, whatever capacity x factor says


def add_measure_arguments(parser, *, ramp: str, step: float) -> None:
    """Options of the unloaded and capacity measurements (shared with `burst`)."""
    parser.add_argument("--unloaded-duration", type=seconds(), default=10.0,
                        help="seconds of one request at a time for the unloaded p99 (default 10)")
    parser.add_argument("--ramp", type=client_counts, default=client_counts(ramp),
                        help=f"client counts of the capacity steps (default {ramp})")
    parser.add_argument("--step-duration", type=seconds(), default=step,
                        help=f"seconds per capacity step (default {step:g})")
    parser.add_argument("--unloaded-p99-ms", type=positive_float,
                        help="skip the unloaded measurement: use this p99")
    parser.add_argument("--give-up", type=seconds(), default=60.0,
                        help="seconds to wait for recovery before calling it never (default 60)")
    parser.add_argument("--timeout", type=seconds(), default=30.0,
                        help="client timeout per request; unanswered by then is lost (default 30)")


def add_arguments(parser) -> None:
    parser.add_argument("--factors", type=factors, default=[2.0, 5.0],
                        help="offered load as multiples of capacity (default 2,5)")
    parser.add_argument("--request-timeout-ms", type=bounded_int(0, 600_000), default=1000,
                        help=f"the deadline each request sends in {TIMEOUT_HEADER} (default "
                        "1000; 0: none, the server's own)")
    parser.add_argument("--duration", type=seconds(), default=20.0,
                        help="seconds of load per factor (default 20)")
    parser.add_argument("--capacity", type=positive_float,
                        help="skip the capacity ramp: use this many 200s/s")
    parser.add_argument("--max-in-flight", type=bounded_int(1, 5000), default=1000,
                        help="outstanding requests at most; sends past it are skipped and "
                        "counted (default 1000)")
    add_measure_arguments(parser, ramp="1,2,4,8,16", step=4.0)


def pick_capacity(steps: list[dict]) -> dict | None:
    """The step with the most 200s per second (the fewest clients on a tie): capacity is the
    best goodput the gateway sustained, not the load that was offered."""
    measured = [s for s in steps if s.get("ok_per_s")]
    return max(measured, key=lambda s: (s["ok_per_s"], -s["concurrency"]), default=None)


async def measure(fire: Callable[[int], Awaitable[Shot]], args, capacity: float | None,
                  per: str) -> tuple[dict, list[dict], float]:
    """The unloaded figures, the capacity steps and the capacity (`per`: ok_per_s or
    texts_per_s), each skipped when given."""
    await fire(-1)  # warm-up: a connection and the first request's one-off costs, not timed
    unloaded = ({"p99_ms": args.unloaded_p99_ms, "given": True} if args.unloaded_p99_ms else
                await measure_closed(fire, concurrency=1, duration_s=args.unloaded_duration))
    steps = []
    if capacity is None:
        for clients in args.ramp:
            steps.append(await measure_closed(fire, concurrency=clients,
                                              duration_s=args.step_duration))
        best = pick_capacity(steps)
        if best is None:
            raise DrillError(f"no step of the capacity ramp got a 200: {steps[-1]['statuses']}")
        capacity = best[per]
    return unloaded, steps, capacity


async def load_and_recover(loop: Awaitable[Offered], shots: list[Shot], probe: Sender,
                           give_up_s: float) -> tuple[dict, float | None, Offered]:
    """Run a load, then time recovery from the moment it stops sending while it drains."""
    offered = await loop
    recovery = asyncio.create_task(recovery_time(small_probe(probe), limit_s=RECOVERED_MS / 1000,
                                                 give_up_s=give_up_s))
    elapsed = await drain(offered)
    return summarize(shots, elapsed), await recovery, offered


def load_goals(prefix: str, figures: dict, capacity: float, unloaded_p99: float | None,
               recovery_s: float | None, per: str = "ok_per_s") -> list[Goal]:
    """The goals of a closed-loop load phase (`burst`), each named after `prefix`."""
    return [
        Goal(f"{prefix}goodput / capacity", share(figures[per] or 0, capacity), ">=", 90, "%"),
        Goal(f"{prefix}p99 of 200s / unloaded p99", ratio(figures["p99_ms"], unloaded_p99),
             "<=", 3, "x", if_missing=False),
        *answer_goals(prefix, figures, recovery_s),
    ]


def deadline_goals(prefix: str, figures: dict, capacity: float, factor: float,
                   timeout_ms: int, recovery_s: float | None) -> list[Goal]:
    """The goals of an open-loop phase at `factor` x capacity whose requests carry a deadline
    of `timeout_ms` (0: none, so no bound on the p99)."""
    goodput = 90 if factor <= 2 else 60
    goals = [Goal(f"{prefix}goodput / capacity", share(figures["ok_per_s"] or 0, capacity),
                  ">=", goodput, "%")]
    if timeout_ms:
        goals.append(Goal(f"{prefix}p99 of 200s", figures["p99_ms"], "<=", timeout_ms, "ms",
                          if_missing=False))
    timeouts = int(figures["statuses"].get("504", 0))
    goals.append(Goal(f"{prefix}504s / sent", share(timeouts, figures["sent"] or 1), "<=",
                      TIMEOUTS_GOAL_PCT, "%"))
    return goals + answer_goals(prefix, figures, recovery_s)


def answer_goals(prefix: str, figures: dict, recovery_s: float | None) -> list[Goal]:
    """Every request answered, with 200, 503 or 504, and recovery after the load."""
    counts = figures["counts"]
    return [
        Goal(f"{prefix}lost (no answer)", counts["lost"], "<=", 0),
        Goal(f"{prefix}answered other than 200/503/504", counts["other"], "<=", 0),
        Goal(f"{prefix}recovery to < {RECOVERED_MS} ms", recovery_s, "<=", RECOVERY_GOAL_S, "s",
             if_missing=False),
    ]


def client_figures(report: Report, prefix: str, sender: Sender, lag: LoopLag) -> None:
    """What the client did besides the timed requests during a phase: its waits for a free
    connection (outside the latencies) and how late its event loop ran (inside them)."""
    report.figures[f"{prefix}client"] = sender.take_stats().text()
    report.figures[f"{prefix}client loop lag"] = lag.text()
    if (lag.max_ms or 0) > LAG_NOTE_MS:
        report.notes.append(f"{prefix}the client's event loop ran up to {lag.max_ms:.0f} ms late: "
                            "a latency may hold up to that much of the client's own delay")


def phase_figures(figures: dict, recovery_s: float | None, per: str, unit: str) -> str:
    counts = ", ".join(f"{k}={v}" for k, v in figures["counts"].items())
    p99 = "-" if figures["p99_ms"] is None else f"{figures['p99_ms']:.1f} ms"
    rec = "never" if recovery_s is None else f"{recovery_s:.2f} s"
    return (f"{figures['sent']} sent; {counts}; goodput {figures[per] or 0:.1f} {unit}; "
            f"p99 of 200s {p99}; recovery {rec}")


async def run(target: Target, args) -> Report:
    report = Report(NAME)
    deadline = {TIMEOUT_HEADER: str(args.request_timeout_ms)} if args.request_timeout_ms else {}
    sender = Sender(target.url, timeout_s=args.timeout, connections=args.max_in_flight,
                    headers=deadline)
    probe = Sender(target.url, timeout_s=5.0, connections=2)
    try:
        fire = lambda n: sender(short_body(n), f"drill-load-{n}")  # noqa: E731
        unloaded, steps, capacity = await measure(fire, args, args.capacity, "ok_per_s")
        report.figures["unloaded p99 ms"] = unloaded["p99_ms"]
        for step in steps:
            report.figures[f"capacity step, {step['concurrency']} clients"] = (
                f"{step['ok_per_s']:.1f} 200s/s, p99 {step['p99_ms'] or 0:.1f} ms")
        report.figures["capacity 200s/s"] = capacity
        report.figures["request deadline ms"] = args.request_timeout_ms or "the server's"
        report.figures["client, unloaded and capacity runs"] = sender.take_stats().text()
        for factor in args.factors:
            await _factor(report, sender, fire, probe, factor, capacity, unloaded["p99_ms"],
                          args)
            await asyncio.sleep(1.0)
    finally:
        await sender.aclose()
        await probe.aclose()
    return report


async def _factor(report, sender, fire, probe, factor, capacity, unloaded_p99, args) -> None:
    """One open-loop phase at `factor` x capacity, its figures and goals."""
    rate, name = factor * capacity, f"{factor:g}x"
    if rate > MAX_RATE:
        raise DrillError(f"{name} {capacity:.1f}/s is over {MAX_RATE:g} requests/s: "
                         "lower --factors or --capacity")
    shots: list[Shot] = []
    loop = open_loop(fire, shots, rate=rate, duration_s=args.duration,
                     max_in_flight=args.max_in_flight)
    sender.take_stats()
    async with LoopLag() as lag:
        figures, recovery, offered = await load_and_recover(loop, shots, probe, args.give_up)
    sent_rate = offered.sent / offered.sent_for_s
    report.figures[f"{name}: offered"] = (f"{rate:.1f}/s: {offered.sent} sent in "
                                          f"{offered.sent_for_s:.1f} s ({sent_rate:.1f}/s)")
    report.figures[name] = phase_figures(figures, recovery, "ok_per_s", "200s/s")
    report.figures[f"{name}: statuses"] = figures["statuses"]
    client_figures(report, f"{name}: ", sender, lag)
    if sent_rate < 0.9 * rate:
        report.notes.append(f"{name}: the client offered only {sent_rate:.1f}/s of {rate:.1f}/s "
                            "(it shares the machine's CPUs)")
    if offered.capped:
        report.notes.append(f"{name}: {offered.capped} sends skipped at --max-in-flight "
                            f"{args.max_in_flight} (not counted as lost)")
    report.figures[f"{name}: p99 of 200s / unloaded p99"] = ratio(figures["p99_ms"],
                                                                   unloaded_p99)
    report.goals += deadline_goals(f"{name}: ", figures, capacity, factor,
                                   args.request_timeout_ms, recovery)
