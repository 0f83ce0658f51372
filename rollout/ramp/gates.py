"""A ramp's gates: one table of specs (`GATE_SPECS`), all judged the same way (`judge_gates`).

A gate is on when the plan sets its `Gates` field. Each spec says how the gate's numbers are
read (`read`: value, threshold, note), the comparison a pass needs (`op`, `judge`), and what
happens when it cannot be judged: a shadow gate (`shadow`: it judges the step's shadow pairs,
which only accumulate) then waits, which holds the ramp, and so does `realized_speedup`
(`waits`: a ramp must not climb on a cost it has not seen); any other one is `n/a` and leaves
the judgement to the others. Too few canary samples in the window make every gate wait.

The shadow gates judge every shadow pair since the step started (at most the telemetry's
retention, `metrics.horizon_s`) and need `min_agreement_pairs`: `agreement_lower_bound` all of
them, through an anytime-valid 95 % confidence sequence (rollout.agreement.agreement_cs: passes
when its lower end reaches the threshold, fails when its upper end is below it, else waits), so
that looking every few seconds does not inflate the chance of passing a canary that is truly
below the threshold; `confident_flip_rate` those at a baseline margin >= `gates.min_margin`;
`worst_slice_agreement` each slice's pairs (rollout.slices), see `_read_slices`;
`min_recall_at_10` the embed pairs compared in the shadow's reservoir, see `_read_recall`;
`max_kld` and `min_token_agreement` the generated answers the shadow scored by their tokens,
see `_read_kld` and `_read_token_agreement`.
The other gates judge the last `window_s` seconds. `realized_speedup` judges the baseline's
CPU seconds per input over the optimized arm's (rollout.efficiency) on its 99.9 % interval, as
`agreement_lower_bound` judges its sequence: it passes when the lower end reaches the minimum
ratio, fails when the upper end is below it, else waits; too few measured requests on either
arm (`min_samples`) wait too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from rollout.agreement import CS_ALPHA, agreement_cs
from rollout.efficiency import Z_GATE, speedup
from rollout.ramp.metrics import RampMetrics
from rollout.ramp.plan import Gates, RampPlan
from rollout.shadow import kld_outcomes
from rollout.telemetry.windows import ArmStats


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
    rows: tuple[dict, ...] = ()  # worst_slice_agreement: its slice table, worst first

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
    rows: tuple[dict, ...] = ()  # a table shown with the result (the slices)


def _exceeds(reading: Reading) -> bool:
    """`<=` gates: failing when the value (none yet: 0) is above the threshold."""
    return (reading.value or 0.0) > reading.threshold


def _above_interval(reading: Reading) -> bool | None:
    """`<=` gates on a confidence sequence: its upper end at or below the threshold passes,
    its lower end above it fails; a threshold inside it cannot be judged yet (None)."""
    lower, upper = reading.interval
    return False if upper <= reading.threshold else True if lower > reading.threshold else None


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
    waits: bool = False  # not a shadow gate, but one that cannot be judged waits all the same

    @property
    def unjudged(self) -> Literal["wait", "n/a"]:
        return "wait" if self.shadow or self.waits else "n/a"


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


MAX_JUDGED_SLICES = 64  # worst_slice_agreement: the alpha split, fixed before any look


def _judged_slices(inputs: GateInputs, slices: dict[str, tuple[int, int]]
                   ) -> tuple[list[tuple[str, int, int]], int]:
    """(slice, pairs, agreed) of the slices with at least `min_slice_pairs` pairs, the
    MAX_JUDGED_SLICES largest of them (ties by name), and how many more there were."""
    judged = [(key, pairs, min(agreed, pairs)) for key, (pairs, agreed) in slices.items()
              if pairs >= inputs.gates.min_slice_pairs]
    judged.sort(key=lambda cell: (-cell[1], cell[0]))
    return judged[:MAX_JUDGED_SLICES], max(len(judged) - MAX_JUDGED_SLICES, 0)


def _read_slices(inputs: GateInputs) -> Reading:
    """`worst_slice_agreement`: every slice with `min_slice_pairs` shadow pairs in the step
    is judged by its own anytime-valid confidence sequence (rollout.agreement.agreement_cs) at
    alpha = CS_ALPHA / MAX_JUDGED_SLICES (Bonferroni): fails when any slice's upper end is
    below the threshold, passes when every slice's lower end reaches it, else waits; the value
    is the worst slice's lower end and the note names it (the failing one with the lowest
    upper end, when one fails).

    The split is honest as slices appear because its size is fixed before any look, not taken
    from the slices seen: every slice is judged at CS_ALPHA / 64 from its first look on, and at
    most 64 are judged, so over all looks and slices together a canary at or above the
    threshold in every slice is failed (or one below it in some slice passed) with
    probability <= CS_ALPHA. Which slices are judged depends only on pair counts (which inputs
    arrived), never on whether they agreed. The counts are bounded well below 64 in practice
    (12 scripts, 4 length buckets, the model's labels, at most 33 header values per gateway
    replica); beyond 64 judged slices the largest 64 are judged and the note says so."""
    gates, threshold = inputs.gates, inputs.gates.worst_slice_agreement
    slices = inputs.metrics.slices(inputs.shadow_s)
    judged, skipped = _judged_slices(inputs, slices)
    if not judged:
        return Reading(None, threshold, f"no slice has {gates.min_slice_pairs} shadow pairs "
                       f"in {inputs.span}", ready=False, rows=_slice_rows(slices, {}))
    alpha = CS_ALPHA / MAX_JUDGED_SLICES
    ends = {key: (*agreement_cs(agreed, pairs, threshold, alpha=alpha), agreed, pairs)
            for key, pairs, agreed in judged}
    failing = [key for key, (_, upper, _, _) in ends.items() if upper < threshold]
    worst = (min(failing, key=lambda k: ends[k][1]) if failing
             else min(ends, key=lambda k: (ends[k][0], k)))
    lower, upper, agreed, pairs = ends[worst]
    value = min(end[0] for end in ends.values())
    note = (f"worst slice {worst}: anytime CS [{lower:.4f}, {upper:.4f}] of {agreed}/{pairs} "
            f"agreed; {len(ends)} slices judged at alpha {CS_ALPHA:g}/{MAX_JUDGED_SLICES} "
            f"in {inputs.span}" + (f" ({skipped} smaller slices not judged)" if skipped else ""))
    interval = (value, min(end[1] for end in ends.values()))
    return Reading(value, threshold, note, interval=interval, rows=_slice_rows(slices, ends))


def _slice_rows(slices: dict[str, tuple[int, int]], ends: dict[str, tuple]) -> tuple[dict, ...]:
    """Every slice as a row, worst first: the judged ones by the lower end of their sequence
    (`lower`, `upper`), then the others (too few pairs: no sequence) by agreement."""
    rows = [{"slice": key, "pairs": pairs, "agreed": min(agreed, pairs),
             "agreement": min(agreed, pairs) / pairs if pairs else None,
             "lower": ends[key][0] if key in ends else None,
             "upper": ends[key][1] if key in ends else None, "judged": key in ends}
            for key, (pairs, agreed) in slices.items()]
    return tuple(sorted(rows, key=lambda r: (
        not r["judged"], r["lower"] if r["judged"] else r["agreement"] or 0.0, r["slice"])))


def _read_recall(inputs: GateInputs) -> Reading:
    """`min_recall_at_10`: the mean share of shared top-10 neighbours over the step's embed
    pairs (rollout.shadow; neighbours tied within `verify_retrieval_tolerance` count as
    shared, as verify counts them offline: rollout.retrieval), judged on the anytime-valid
    95 % confidence sequence of rollout.agreement.agreement_cs with each pair's share (0-1)
    as its outcome: the Beta-mixture martingale stays a supermartingale for outcomes anywhere
    in [0, 1] (the likelihood ratio is convex in the outcome, so its mean is at most the
    Bernoulli one, 1), so the sequence keeps its coverage for a bounded mean, as it does for
    agreement."""
    gates, threshold = inputs.gates, inputs.gates.min_recall_at_10
    queries, hits = inputs.metrics.recall(inputs.shadow_s)
    shares = min(hits, 10 * queries) / 10
    if queries < gates.min_agreement_pairs:
        return Reading(shares / queries if queries else None, threshold,
                       f"{queries}/{gates.min_agreement_pairs} embed pairs compared in the "
                       f"reservoir in {inputs.span}", ready=False)
    lower, upper = agreement_cs(shares, queries, threshold)
    return Reading(lower, threshold, f"anytime 95% CS [{lower:.4f}, {upper:.4f}] of recall@10 "
                   f"{shares / queries:.4f} over {queries} embed pairs in {inputs.span}",
                   interval=(lower, upper))


KLD_CAP = 10  # `max_kld`: an answer's mean KLD counts at most this many times the bar


def _few_answers(inputs: GateInputs, responses: int, total: float, threshold: float) -> Reading:
    """A token gate with fewer scored answers than `min_agreement_pairs`: not ready, its value
    the mean of `total` over them so far (None without any)."""
    return Reading(total / responses if responses else None, threshold,
                   f"{responses}/{inputs.gates.min_agreement_pairs} scored answers in "
                   f"{inputs.span}", ready=False)


def _read_kld(inputs: GateInputs) -> Reading:
    """`max_kld`: the mean over the step's scored answers of each one's mean KL divergence,
    clipped at KLD_CAP x the bar and read at its bin's upper edge (rollout.shadow: never
    below the true value), judged on the anytime-valid 95 % confidence sequence of
    rollout.agreement.agreement_cs with each answer's min(KLD, cap) / cap as its outcome (a
    bounded outcome in [0, 1], as `min_recall_at_10` judges its shares), scaled back to nats.
    The clip bounds what one wild answer moves; an answer at the cap counts as ten at the bar."""
    gates, threshold = inputs.gates, inputs.gates.max_kld
    responses, _, bins = inputs.metrics.tokens(inputs.shadow_s)
    cap = KLD_CAP * threshold
    outcomes = min(kld_outcomes(bins, cap), responses)
    if responses < gates.min_agreement_pairs:
        return _few_answers(inputs, responses, outcomes * cap, threshold)
    lower, upper = agreement_cs(outcomes, responses, threshold / cap)
    return Reading(upper * cap, threshold, f"anytime 95% CS [{lower * cap:.5f}, "
                   f"{upper * cap:.5f}] nats of KLD {outcomes * cap / responses:.5f} (clipped at "
                   f"{cap:g}) over {responses} scored answers in {inputs.span}",
                   interval=(lower * cap, upper * cap))


def _read_token_agreement(inputs: GateInputs) -> Reading:
    """`min_token_agreement`: the mean over the step's scored answers of each one's top-1
    token agreement, on the anytime-valid 95 % confidence sequence (each answer's share, in
    [0, 1], as its outcome)."""
    gates, threshold = inputs.gates, inputs.gates.min_token_agreement
    responses, agree, _ = inputs.metrics.tokens(inputs.shadow_s)
    agree = min(agree, responses)
    if responses < gates.min_agreement_pairs:
        return _few_answers(inputs, responses, agree, threshold)
    lower, upper = agreement_cs(agree, responses, threshold)
    return Reading(lower, threshold, f"anytime 95% CS [{lower:.4f}, {upper:.4f}] of top-1 token "
                   f"agreement {agree / responses:.4f} over {responses} scored answers in "
                   f"{inputs.span}", interval=(lower, upper))


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


def _read_realized_speedup(inputs: GateInputs) -> Reading:
    """`realized_speedup`: baseline ÷ optimized CPU seconds per input over the window, on its
    99.9 % interval (rollout.efficiency: the interval is looked at at every evaluation)."""
    gates, threshold = inputs.gates, inputs.gates.realized_speedup
    baseline, canary = inputs.baseline.cpu, inputs.canary.cpu
    result = speedup(baseline, canary, Z_GATE)
    counts = f"{baseline.requests}/{canary.requests} measured baseline/optimized requests"
    if min(baseline.requests, canary.requests) < gates.min_samples or result.lower is None:
        why = result.note or f"{counts}, {gates.min_samples} needed on each"
        return Reading(result.ratio, threshold, why, ready=False)
    return Reading(result.ratio, threshold, f"99.9% CI [{result.lower:.3g}, {result.upper:.3g}]"
                   f" of {counts}", interval=(result.lower, result.upper))


GATE_SPECS: tuple[GateSpec, ...] = (  # in the order they are judged and shown
    GateSpec("agreement_lower_bound", "agreement_lower_bound", _read_agreement, op=">=",
             judge=_outside_interval, shadow=True),
    GateSpec("confident_flip_rate", "confident_flip_rate", _read_confident_flips, shadow=True),
    GateSpec("worst_slice_agreement", "worst_slice_agreement", _read_slices, op=">=",
             judge=_outside_interval, shadow=True),
    GateSpec("min_recall_at_10", "min_recall_at_10", _read_recall, op=">=",
             judge=_outside_interval, shadow=True),
    GateSpec("max_kld", "max_kld", _read_kld, judge=_above_interval, shadow=True),
    GateSpec("min_token_agreement", "min_token_agreement", _read_token_agreement, op=">=",
             judge=_outside_interval, shadow=True),
    GateSpec("error_rate", "error_rate_delta", _read_error_rate),
    GateSpec("timeout_rate", "timeout_rate", _read_timeout_rate),
    GateSpec("p99_ratio", "p99_ratio", _read_p99_ratio),
    GateSpec("p99_ms", "p99_ms", _read_p99_ms),
    GateSpec("fallback_rate", "fallback_rate", _read_fallback_rate),
    GateSpec("realized_speedup", "realized_speedup", _read_realized_speedup, op=">=",
             judge=_outside_interval, waits=True),
)
GATES_BY_NAME = {spec.name: spec for spec in GATE_SPECS}
SHADOW_GATES = tuple(spec.name for spec in GATE_SPECS if spec.shadow)  # wait for shadow pairs


def _judge_gate(spec: GateSpec, reading: Reading, few: str | None) -> GateResult:
    """One gate's result: `wait` on too few canary samples (`few`), else pass or fail, or the
    spec's `unjudged` status when its reading cannot say."""
    if few is not None:
        return GateResult(spec.name, reading.value, reading.threshold, "wait", few, reading.rows)
    bad = spec.judge(reading) if reading.ready else None
    status = spec.unjudged if bad is None else "fail" if bad else "pass"
    return GateResult(spec.name, reading.value, reading.threshold, status, reading.note,
                      reading.rows)


def judge_gates(ramp: _Planned, metrics: RampMetrics, window_s: int,
                step_s: int | None = None) -> tuple[int, list[GateResult]]:
    """Every gate of the plan (`GATE_SPECS`) over the last `window_s` seconds, and the
    canary's sample count; the shadow gates judge the step's whole `step_s` seconds (capped
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
