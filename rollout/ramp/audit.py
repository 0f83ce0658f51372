"""Which ramp evaluations reach the audit stream: every change at once, a held step summarised.

An evaluation that changes the ramp record (advance, rollback, promote, abort, a failing
evaluation counted, an interrupted advance adopted) is written by the ramp store's `put`,
always and at once. One that changes nothing (a hold, a wait for an approval) would otherwise
add an entry every `CANARY_RAMP_INTERVAL_S` for as long as the step is held (about 17,000 a day
at 5 s), so it is summarised (`summarise`):

1. Its *outcome* (`outcome`) is the ramp (when it started), the decision, the ramp's status and
   step, every gate's status and the reason's words. The reason's numbers (sample counts,
   seconds in step, gate values) are left out: they move on every evaluation without changing
   what it concluded.
2. An outcome that differs from the previous evaluation's is written at once, at most
   `CHANGES_PER_PERIOD` times per heartbeat period, so a gate that flaps between `wait` and
   `pass` cannot write on every evaluation again; changes beyond that are summarised.
3. Otherwise an entry (a heartbeat) is written once nothing has been written for `heartbeat_s`
   (`CANARY_RAMP_AUDIT_HEARTBEAT_S`); its reason says since when the outcome has held and how
   many evaluations the entry stands for.
4. Otherwise the evaluation is only kept as the last one (`RampStore.record(audit=False)`),
   so `rollout ramp status` and the dashboard stay fresh on every interval.

Bound: a held ramp writes at most `1 + period / heartbeat_s` entries per period plus its
outcome changes, and at most `CHANGES_PER_PERIOD` of those per heartbeat period: with the
defaults (5 s, 300 s) an hour of a held step adds 13 entries, an hour of a flapping one at most
133, instead of 720. Operator actions and share changes are never summarised, and the audit
stream is never trimmed.

The summary (`Held`) travels in the last evaluation's detail (`held`), so a controller that
takes over the lease goes on with it, and `rollout ramp status` reads since when the step has
been held from it.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, replace

from rollout.ramp.machine import Decision

CHANGES_PER_PERIOD = 10  # outcome changes written at once per heartbeat period
HELD_KINDS = ("hold", "wait-approval")  # decisions that leave the share where it is

_NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def outcome(decision: Decision) -> str:
    """What an evaluation concluded, without the numbers that move on every evaluation."""
    ramp = decision.ramp
    gates = ",".join(f"{g.name}:{g.status}" for g in (*decision.gates, *decision.checks))
    words = _NUMBER.sub("#", decision.reason)
    return f"{ramp.started_at!r}|{decision.kind}|{ramp.status}|{ramp.step}|{gates}|{words}"


@dataclass(frozen=True)
class Held:
    """The running summary of evaluations, kept with the last one."""

    outcome: str
    since: float  # the first evaluation with this outcome
    evaluations: int  # evaluations with this outcome, the last one included
    audited_at: float  # when the last audit entry of the ramp was written
    unaudited: int  # evaluations since then that were not written
    period_start: float  # the heartbeat period whose outcome changes are counted
    changes: int  # outcome changes written in that period
    stalled: bool = False  # this step's `ramp-stalled` note was written (once per stall)

    @classmethod
    def start(cls, outcome: str, now: float) -> Held:
        """The summary right after an evaluation that was written."""
        return cls(outcome, now, 1, now, 0, now, 0)

    @classmethod
    def from_last(cls, last: dict | None) -> Held | None:
        """The summary kept with the last evaluation; None when there is none (or an older
        controller wrote it): the next evaluation is then written."""
        try:
            return cls(**(last or {})["held"])
        except (KeyError, TypeError):
            return None

    def as_dict(self) -> dict:
        return asdict(self)


def summarise(previous: Held | None, outcome: str, now: float,
              heartbeat_s: float) -> tuple[Held, str | None]:
    """The summary after an evaluation that changed nothing, and why it is written to the
    audit stream: "change", "heartbeat", or None (kept as the last evaluation only)."""
    if previous is None:
        return Held.start(outcome, now), "change"
    held = previous
    if now - held.period_start >= heartbeat_s:
        held = replace(held, period_start=now, changes=0)
    if outcome != held.outcome:
        held = replace(held, outcome=outcome, since=now, evaluations=1)
        if held.changes < CHANGES_PER_PERIOD:
            return _written(held, now, changes=held.changes + 1), "change"
    else:
        held = replace(held, evaluations=held.evaluations + 1)
    if now - held.audited_at >= heartbeat_s:
        return _written(held, now), "heartbeat"
    return replace(held, unaudited=held.unaudited + 1), None


def _written(held: Held, now: float, **changes) -> Held:
    return replace(held, audited_at=now, unaudited=0, **changes)


def stalled(decision: Decision) -> bool:
    """A held evaluation past its step's soak time (or before the first step): what holds the
    ramp is not the soak but something that needs a person (a verdict, an approval, the kill
    switch, the versions, traffic). A paused ramp is held on purpose, not stalled. The same
    rule as rollout.ramp.control.RampView.stalled."""
    ramp = decision.ramp
    if decision.kind not in HELD_KINDS or ramp.status == "paused":
        return False
    if ramp.step < 0:
        return True
    return (decision.time_in_step_s or 0.0) >= ramp.plan.steps[ramp.step].min_duration_s


def heartbeat_reason(reason: str, previous: Held, held: Held) -> str:
    """The reason of a heartbeat entry: the evaluation's, and what the entry summarises."""
    return (f"{reason} [unchanged for {held.audited_at - held.since:.0f}s; this entry stands for "
            f"{previous.unaudited + 1} evaluations]")
