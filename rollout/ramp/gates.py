"""A ramp's gates: one table of specs (`GATE_SPECS`), all judged the same way (`judge_gates`).

A gate is on when the plan sets its `Gates` field. Each spec says how the gate's numbers are
read (`read`: value, threshold, note), the comparison a pass needs (`op`, `judge`), and what
happens when it cannot be judged: a shadow gate (`shadow`: it judges the step's shadow pairs,
which only accumulate) then waits, which holds the ramp; any other one is `n/a` and leaves the
judgement to the others. Too few canary samples in the window make every gate wait.

The shadow gates judge every shadow pair since the step started (at most the telemetry's
retention, `metrics.horizon_s`) and need `min_agreement_pairs`: `agreement_lower_bound` all of
them, through an anytime-valid 95 % confidence sequence (rollout.agreement.agreement_cs: passes
when its lower end reaches the threshold, fails when its upper end is below it, else waits), so
that looking every few seconds does not inflate the chance of passing a canary that is truly
below the threshold; `confident_flip_rate` those at a baseline margin >= `gates.min_margin`.
The other gates judge the last `window_s` seconds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from rollout.agreement import agreement_cs
from rollout.ramp.metrics import RampMetrics
from rollout.ramp.plan import Gates, RampPlan
from rollout.windows import ArmStats


class _Planned(Protocol):
    """What the gates read of a ramp: its plan (rollout.ramp.machine.Ramp)."""

    @property
    def plan(self) -> RampPlan: ...


@dataclass(frozen=True)
class GateResult:
    """One gate's judgement at one evaluation, with the numbers behind it (audited)."""

    name: str
    value: float | None
    threshold: float | None
    status: Literal["pass", "fail", "wait", "n/a"]
    note: str = ""

    def text(self) -> str:
        value = "-" if self.value is None else f"{self.value:.4g}"
        threshold = "-" if self.threshold is None else f"{self.threshold:.4g}"
        spec = GATES_BY_NAME.get(self.name)
        op = spec.op if spec is not None else "<="
        return f"{self.name} {value} {op} {threshold}: {self.status}" + (
            f" ({self.note})" if self.note else "")


@dataclass(frozen=True)
class GateInputs:
    """What every gate of one evaluation reads: the canary's and the baseline's windows over
    the last `window_s` seconds, and the span the shadow gates judge (`shadow_s`, `span`)."""

    gates: Gates
    metrics: RampMetrics
    canary: ArmStats
    baseline: ArmStats
    shadow_s: int
    span: str


@dataclass(frozen=True)
class Reading:
    """One gate's numbers: the `value` shown, the `threshold` it is judged against and a
    `note`. `ready` False: too little to judge (too few shadow pairs, no baseline to compare
    with; `note` says why); `interval`: a confidence sequence judged instead of `value`."""

    value: float | None
    threshold: float | None
    note: str = ""
    ready: bool = True
    interval: tuple[float, float] | None = None


def _exceeds(reading: Reading) -> bool:
    """`<=` gates: failing when the value (none yet: 0) is above the threshold."""
    return (reading.value or 0.0) > reading.threshold


def _outside_interval(reading: Reading) -> bool | None:
    """`>=` gates on a confidence sequence: its lower end at or above the threshold passes, its
    upper end below it fails; a threshold inside it cannot be judged yet (None)."""
    lower, upper = reading.interval
    return False if lower >= reading.threshold else True if upper < reading.threshold else None


@dataclass(frozen=True)
class GateSpec:
    """One gate: its `name` in results; `setting`, the `Gates` field that turns it on (None:
    off) and sets its threshold; `read`, how its numbers are read; `op`, the comparison a pass
    needs (shown in `GateResult.text`); `judge`, whether a ready reading fails (None: cannot
    say). `shadow`: it judges the step's shadow pairs, so a gate that cannot be judged waits
    (holds the climb); any other one is `n/a` (judged by the others alone)."""

    name: str
    setting: str
    read: Callable[[GateInputs], Reading]
    op: Literal[">=", "<="] = "<="
    judge: Callable[[Reading], bool | None] = _exceeds
    shadow: bool = False

    @property
    def unjudged(self) -> Literal["wait", "n/a"]:
        return "wait" if self.shadow else "n/a"


def _read_agreement(inputs: GateInputs) -> Reading:
    """`agreement_lower_bound`: the anytime-valid 95 % confidence sequence
    (rollout.agreement.agreement_cs) over the step's shadow pairs."""
    gates, span = inputs.gates, inputs.span
    threshold = gates.agreement_lower_bound
    pairs, agreed = inputs.metrics.agreement(inputs.shadow_s)
    lower, upper = agreement_cs(agreed, pairs, threshold)
    if pairs < gates.min_agreement_pairs:
        return Reading(lower if pairs else None, threshold,
                       f"{pairs}/{gates.min_agreement_pairs} shadow pairs in {span}", ready=False)
    return Reading(lower, threshold, f"anytime 95% CS [{lower:.4f}, {upper:.4f}] of "
                   f"{agreed}/{pairs} agreed in {span}", interval=(lower, upper))


def _read_confident_flips(inputs: GateInputs) -> Reading:
    """`confident_flip_rate`: the share of the step's shadow pairs at a baseline margin >=
    `min_margin` whose labels differ."""
    gates = inputs.gates
    pairs, flips = inputs.metrics.confident(inputs.shadow_s, gates.min_margin)
    where = f"at baseline margin >= {gates.min_margin:g} in {inputs.span}"
    if pairs < gates.min_agreement_pairs:
        return Reading(flips / pairs if pairs else None, gates.confident_flip_rate,
                       f"{pairs}/{gates.min_agreement_pairs} confident shadow pairs {where}",
                       ready=False)
    return Reading(flips / pairs, gates.confident_flip_rate, f"{flips} of {pairs} flipped {where}")


def _read_error_rate(inputs: GateInputs) -> Reading:
    """`error_rate`: the canary's, against the baseline's plus `error_rate_delta`."""
    threshold = (inputs.baseline.error_rate or 0.0) + inputs.gates.error_rate_delta
    return Reading(inputs.canary.error_rate or 0.0, threshold)


def _read_timeout_rate(inputs: GateInputs) -> Reading:
    return Reading(inputs.canary.timeout_rate or 0.0, inputs.gates.timeout_rate)


def _read_p99_ratio(inputs: GateInputs) -> Reading:
    """`p99_ratio`: the canary's p99 against the baseline's times the ratio; without enough
    baseline samples there is nothing to compare with."""
    canary, baseline, gates = inputs.canary, inputs.baseline, inputs.gates
    if baseline.p99_ms is None or baseline.requests < gates.min_samples:
        return Reading(canary.p99_ms, None, f"{baseline.requests} baseline samples to compare "
                       "with", ready=False)
    return Reading(canary.p99_ms, baseline.p99_ms * gates.p99_ratio)


def _read_p99_ms(inputs: GateInputs) -> Reading:
    return Reading(inputs.canary.p99_ms, inputs.gates.p99_ms)


def _read_fallback_rate(inputs: GateInputs) -> Reading:
    """`fallback_rate`: the canary's answers that fell back to the baseline, per request."""
    canary = inputs.canary
    return Reading(canary.fallbacks / canary.requests if canary.requests else 0.0,
                   inputs.gates.fallback_rate)


GATE_SPECS: tuple[GateSpec, ...] = (  # in the order they are judged and shown
    GateSpec("agreement_lower_bound", "agreement_lower_bound", _read_agreement, op=">=",
             judge=_outside_interval, shadow=True),
    GateSpec("confident_flip_rate", "confident_flip_rate", _read_confident_flips, shadow=True),
    GateSpec("error_rate", "error_rate_delta", _read_error_rate),
    GateSpec("timeout_rate", "timeout_rate", _read_timeout_rate),
    GateSpec("p99_ratio", "p99_ratio", _read_p99_ratio),
    GateSpec("p99_ms", "p99_ms", _read_p99_ms),
    GateSpec("fallback_rate", "fallback_rate", _read_fallback_rate),
)
GATES_BY_NAME = {spec.name: spec for spec in GATE_SPECS}
SHADOW_GATES = tuple(spec.name for spec in GATE_SPECS if spec.shadow)  # wait for shadow pairs


def _judge_gate(spec: GateSpec, reading: Reading, few: str | None) -> GateResult:
    """One gate's result: `wait` on too few canary samples (`few`), else pass or fail, or the
    spec's `unjudged` status when its reading cannot say."""
    if few is not None:
        return GateResult(spec.name, reading.value, reading.threshold, "wait", few)
    bad = spec.judge(reading) if reading.ready else None
    status = spec.unjudged if bad is None else "fail" if bad else "pass"
    return GateResult(spec.name, reading.value, reading.threshold, status, reading.note)


def judge_gates(ramp: _Planned, metrics: RampMetrics, window_s: int,
                step_s: int | None = None) -> tuple[int, list[GateResult]]:
    """Every gate of the plan (`GATE_SPECS`) over the last `window_s` seconds, and the
    canary's sample count; the two shadow gates judge the step's whole `step_s` seconds (capped
    at what the metrics keep, `metrics.horizon_s`), a sample that only grows, as an
    anytime-valid bound needs."""
    gates = ramp.plan.gates
    canary, baseline = metrics.arm("optimized", window_s), metrics.arm("baseline", window_s)
    samples = canary.requests
    few = None if samples >= gates.min_samples else f"{samples}/{gates.min_samples} samples"
    shadow_s = min(step_s or window_s, metrics.horizon_s)
    span = (f"the last {shadow_s}s: telemetry retention" if step_s and step_s > shadow_s
            else f"the step's {shadow_s}s")
    inputs = GateInputs(gates, metrics, canary, baseline, shadow_s, span)
    return samples, [_judge_gate(spec, spec.read(inputs), few) for spec in GATE_SPECS
                     if getattr(gates, spec.setting) is not None]
