"""Simulated ramps for the agreement gate: how often does it pass a canary that is truly below
its threshold, when it is looked at every few seconds for a whole step?

    python -m ops.bench.gate_sim                       # 1,000 ramps per true agreement, seed 14
    python -m ops.bench.gate_sim --ramps 400 --seed 1

One simulated ramp is one step of `--duration-s` seconds: shadow pairs arrive at a steady rate
drawn per ramp from `--rate` pairs/s, each agreeing with probability `true agreement`
(independently), and the gate is evaluated every `--interval-s` seconds. A ramp *false-passes*
when the gate says `pass` at any evaluation although the true agreement is below (or at) the
threshold. Three gates, all needing `--min-pairs` pairs before they judge:

- `old: Wilson, last W s`: the old gate, a Wilson 95 % lower bound over the last `--window-s`
  seconds (the example plan's window_s), recomputed at every look;
- `Wilson, whole step`: the same bound over every pair since the step started (the repeated
  looks alone, without the sliding window);
- `new: CS, whole step`: the gate of rollout.ramp.machine.judge_gates, the anytime-valid
  confidence sequence of rollout.agreement.agreement_cs over every pair since the step started.

It also reports how many pairs the new gate needed to pass a canary comfortably above the
threshold. Pure Python with a seeded random.Random: the same arguments print the same figures.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ops.cli.types import fraction, fractions, positive_int, rate_range
from rollout.agreement import wilson_interval
from rollout.ramp import Ramp, parse_plan
from rollout.ramp.machine import judge_gates
from rollout.telemetry.windows import ArmStats

Look = tuple[int, int]  # (pairs, agreed) since the step started, at one evaluation
Gate = Callable[[Sequence[Look], int], bool]  # (the looks so far, this look's index) -> passes


@dataclass(frozen=True)
class Scenario:
    threshold: float = 0.98
    duration_s: int = 1_800
    interval_s: int = 5
    rate: tuple[float, float] = (2.0, 20.0)
    min_pairs: int = 100
    window_s: int = 120

    @property
    def looks(self) -> int:
        return self.duration_s // self.interval_s


def simulate_looks(rng: random.Random, agreement: float, scenario: Scenario) -> list[Look]:
    """One ramp's (pairs, agreed) since the step started, at every evaluation. Disagreements
    are drawn as geometric gaps along the pair stream (as many draws as disagreements)."""
    rate = rng.uniform(*scenario.rate)
    total = int(rate * scenario.duration_s)
    flips: list[int] = []  # positions (1-based) of the disagreeing pairs
    q = 1.0 - agreement
    if q >= 1:
        flips = list(range(1, total + 1))
    elif q > 0:
        log_keep, position = math.log1p(-q), 0
        while True:  # a gap is 1 + the agreeing pairs before the next disagreement
            position += 1 + int(math.log(1.0 - rng.random()) / log_keep)
            if position > total:
                break
            flips.append(position)
    looks, seen = [], 0
    for k in range(1, scenario.looks + 1):
        pairs = int(rate * k * scenario.interval_s)
        while seen < len(flips) and flips[seen] <= pairs:
            seen += 1
        looks.append((pairs, pairs - seen))
    return looks


class _Counts:
    """The RampMetrics of one look: enough canary requests, the given shadow counts."""

    horizon_s = 10 ** 9
    ARM = ArmStats(arm="optimized", seconds=60.0, requests=10 ** 6, calls=10 ** 6,
                   request_rate=1.0, success_rate=1.0, error_rate=0.0, timeout_rate=0.0,
                   retry_rate=0.0, fallbacks=0, p50_ms=None, p99_ms=None, mean_ms=None,
                   queue_mean=None, batch_mean=None, stage_ms={}, compute_ms=None,
                   cost_per_1k=None, statuses={})

    def __init__(self, pairs: int, agreed: int):
        self.pairs, self.agreed = pairs, agreed

    def arm(self, arm: str, last_s: int) -> ArmStats:
        return self.ARM

    def agreement(self, last_s: int) -> tuple[int, int]:
        return self.pairs, self.agreed

    def confident(self, last_s: int, min_margin: float = 0.05) -> tuple[int, int]:
        return 0, 0

    def slices(self, last_s: int) -> dict[str, tuple[int, int]]:
        return {}


def new_gate(scenario: Scenario, status: str = "pass") -> Gate:
    """The ramp's `agreement_lower_bound` gate itself (rollout.ramp.machine.judge_gates):
    whether it says `status` (`pass`, or `fail`: a rollback) at a look."""
    plan = parse_plan({"gates": {"min_samples": 1, "min_agreement_pairs": scenario.min_pairs,
                                 "agreement_lower_bound": scenario.threshold},
                       "steps": [{"percent": 100}]})
    ramp = Ramp(plan=plan, step=0)

    def says(looks: Sequence[Look], k: int) -> bool:
        pairs, agreed = looks[k]
        above = agreed > scenario.threshold * pairs
        if pairs < scenario.min_pairs or above != (status == "pass"):
            return False  # the CS always holds the observed agreement: it cannot say `status`
        step_s = (k + 1) * scenario.interval_s
        _, [gate] = judge_gates(ramp, _Counts(pairs, agreed), min(60, step_s), step_s)
        return gate.status == status

    return says


def wilson_gate(scenario: Scenario, *, sliding: bool) -> Gate:
    """The old gate: Wilson 95 % lower bound >= threshold, over the last `window_s` seconds
    (`sliding`) or over the whole step."""
    back = scenario.window_s // scenario.interval_s

    def passes(looks: Sequence[Look], k: int) -> bool:
        pairs, agreed = looks[k]
        if sliding and k >= back:
            pairs, agreed = pairs - looks[k - back][0], agreed - looks[k - back][1]
        if pairs < scenario.min_pairs or agreed <= scenario.threshold * pairs:
            return False  # Wilson's lower end is below the observed agreement
        return wilson_interval(agreed, pairs)[0] >= scenario.threshold

    return passes


def first_pass(looks: Sequence[Look], gate: Gate) -> int | None:
    """The index of the first evaluation at which the gate passes; None if it never does."""
    for k in range(len(looks)):
        if gate(looks, k):
            return k
    return None


def pass_rate(gate: Gate, agreement: float, scenario: Scenario, ramps: int, seed: int) -> float:
    """Share of simulated ramps in which the gate passes at some evaluation."""
    rng = random.Random(seed)
    passed = sum(first_pass(simulate_looks(rng, agreement, scenario), gate) is not None
                 for _ in range(ramps))
    return passed / ramps


def pairs_to_pass(agreement: float, scenario: Scenario, ramps: int,
                  seed: int) -> tuple[list[int], int]:
    """The pairs the new gate had seen when it first passed, per ramp that passed, and how
    many ramps never passed within the step."""
    rng, gate, needed, never = random.Random(seed), new_gate(scenario), [], 0
    for _ in range(ramps):
        looks = simulate_looks(rng, agreement, scenario)
        k = first_pass(looks, gate)
        if k is None:
            never += 1
        else:
            needed.append(looks[k][0])
    return needed, never


GATES = (("old: Wilson, last {w}s", dict(sliding=True)),
         ("Wilson, whole step", dict(sliding=False)), ("new: CS, whole step", None))


def report(scenario: Scenario, agreements: Sequence[float], good: float, ramps: int,
           seed: int) -> str:
    """The table of false-pass rates and the pairs needed to pass at `good`."""
    names = [name.format(w=scenario.window_s) for name, _ in GATES]
    gates = [new_gate(scenario) if kw is None else wilson_gate(scenario, **kw) for _, kw in GATES]
    lines = [f"threshold {scenario.threshold:g}, {ramps} ramps per row (seed {seed}), a "
             f"{scenario.duration_s}s step looked at every {scenario.interval_s}s "
             f"({scenario.looks} looks), {scenario.rate[0]:g}-{scenario.rate[1]:g} shadow "
             f"pairs/s, min_agreement_pairs {scenario.min_pairs}", "",
             "share of ramps passed at some look (a false pass: true agreement <= threshold):",
             "| true agreement | " + " | ".join(names) + " |",
             "| --- | " + " | ".join("---" for _ in names) + " |"]
    for i, agreement in enumerate(agreements):
        rates = [pass_rate(gate, agreement, scenario, ramps, seed + i) for gate in gates]
        lines.append(f"| {agreement:g} | " + " | ".join(f"{r:.1%}" for r in rates) + " |")
    needed, never = pairs_to_pass(good, scenario, ramps, seed + len(agreements))
    quartiles = statistics.quantiles(needed, n=4) if len(needed) > 1 else [math.nan] * 3
    lines += ["", f"new gate at a true agreement of {good:g}: passed in {len(needed)} of "
                  f"{ramps} ramps within the step; pairs seen at the first pass: median "
                  f"{statistics.median(needed) if needed else math.nan:.0f} (quartiles "
                  f"{quartiles[0]:.0f} / {quartiles[2]:.0f})" + (f", {never} never passed"
                                                                 if never else "")]
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ops.bench.gate_sim",
        description="Simulate ramps and print the false-pass rate of the old (Wilson at every "
                    "look) and the new (anytime-valid confidence sequence) agreement gate.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--seed", type=int, default=14, help="seed of the random generator")
    parser.add_argument("--ramps", type=positive_int, default=1_000,
                        help="simulated ramps per true agreement")
    parser.add_argument("--threshold", type=fraction, default=0.98,
                        help="the gate's agreement_lower_bound")
    parser.add_argument("--agreements", type=fractions, default="0.97,0.975,0.979,0.98",
                        help="comma-separated true agreements to simulate")
    parser.add_argument("--good", type=fraction, default=0.995,
                        help="a true agreement above the threshold: pairs the new gate needs")
    parser.add_argument("--duration-s", type=positive_int, default=1_800,
                        help="length of the simulated step")
    parser.add_argument("--interval-s", type=positive_int, default=5,
                        help="seconds between evaluations (CANARY_RAMP_INTERVAL_S)")
    parser.add_argument("--rate", type=rate_range, default="2-20",
                        help="shadow pairs per second, LOW-HIGH (drawn per ramp)")
    parser.add_argument("--min-pairs", type=positive_int, default=100,
                        help="min_agreement_pairs of the plan")
    parser.add_argument("--window-s", type=positive_int, default=120,
                        help="the old gate's window_s")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.window_s < args.interval_s:
        _parser().error("--window-s must be at least --interval-s")
    scenario = Scenario(threshold=args.threshold, duration_s=args.duration_s,
                        interval_s=args.interval_s, rate=args.rate, min_pairs=args.min_pairs,
                        window_s=args.window_s)
    started = time.perf_counter()
    print(report(scenario, args.agreements, args.good, args.ramps, args.seed))
    print(f"\n({time.perf_counter() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
