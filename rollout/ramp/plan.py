"""A ramp plan: the steps a canary climbs and the gates it must pass, loaded from YAML.

    window_s: 60             # gates judge the last N seconds of the current step (at most)
    failures_tolerated: 1    # consecutive failing evaluations before rolling back
    gates:
      min_samples: 20              # canary requests in the window before any gate is judged
      agreement_lower_bound: 0.98  # online agreement (anytime 95 % CS lower bound) >= X
      confident_flip_rate: 0.0     # shadow pairs at baseline margin >= min_margin flipped <= C
      min_margin: 0.05             # a bucket edge: 0.005, 0.01, 0.02, 0.05 or 0.1
      min_agreement_pairs: 50      # shadow pairs needed to judge either agreement gate
      worst_slice_agreement: 0.9   # every slice's agreement (anytime CS, alpha split) >= W
      min_slice_pairs: 50          # shadow pairs a slice needs before it is judged
      min_recall_at_10: 0.95       # embed pairs: online recall@10 (anytime CS lower end) >= K
      error_rate_delta: 0.01       # canary error rate <= baseline error rate + Y
      timeout_rate: 0.01           # canary timeout rate <= Z
      p99_ratio: 1.5               # canary p99 <= baseline p99 x R
      p99_ms: 500                  # canary p99 <= this many ms
      fallback_rate: 0.02          # canary requests answered by the baseline fallback <= F
      realized_speedup: 1.2        # baseline ÷ optimized CPU s per input (99.9 % interval) >= S
    checks:                  # HTTP checks judged at every step (rollout.ramp.checks)
      - {url: "http://monitor:8080/canary", field: data.error_rate, max: 0.01}
    progress_deadline_s: 3600  # a step held this long past its soak ends the ramp ...
    on_deadline: abort         # ... by aborting it (share 0) or pausing it (`pause`)
    accept_verdict_without_speed: false  # climb on a verdict stored by `verify --no-speed`
    steps:
      - {percent: 1, min_duration_s: 300, min_samples: 200}
      - {percent: 50, min_duration_s: 600, min_samples: 1000, approval: true,
         checks: [{url: "https://qa.internal/smoke", expect: 204}]}
      - {percent: 100, min_duration_s: 600, min_samples: 1000}

Every gate is optional, but a plan needs at least one. Shares rise strictly and the last step
is 100 % (reaching it and passing its gates is the promotion). Unknown fields are refused, and
every error names the field it is about (`steps.1.percent: ...`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rollout.agreement import CONFIDENT_MARGIN, MARGIN_EDGES
from rollout.errors import InvalidChange
from rollout.ramp.checks import Check, FieldError
from rollout.state import BUCKETS, parse_percent

MAX_CHECKS = 20  # per list (the plan's, each step's)
CONFIDENT_EDGES = tuple(edge for edge in MARGIN_EDGES if edge > 0)  # gates.min_margin values


class PlanError(InvalidChange):
    """The plan file is unreadable or invalid; the message names each offending field."""


class Step(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    percent: float = Field(gt=0, le=100, description="canary share of this step")
    min_duration_s: float = Field(0.0, ge=0, le=7 * 86_400, description="soak time")
    min_samples: int = Field(0, ge=0, le=100_000_000, description="canary requests in window")
    approval: bool = Field(False, description="an operator approves before this step starts")
    checks: tuple[Check, ...] = Field((), max_length=MAX_CHECKS,
                                      description="HTTP checks judged at this step")

    @field_validator("percent")
    @classmethod
    def _exact(cls, value: float) -> float:
        parse_percent(value)  # at most two decimals: every share is a whole basis point
        return value

    @property
    def bp(self) -> int:
        return parse_percent(self.percent)


class Gates(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    min_samples: int = Field(10, ge=1, le=100_000_000)
    agreement_lower_bound: float | None = Field(None, ge=0, le=1)
    confident_flip_rate: float | None = Field(None, ge=0, le=1)
    min_margin: float = Field(CONFIDENT_MARGIN, description="a flip at a baseline margin >= "
                              "this counts in confident_flip_rate (a margin bucket edge)")
    min_agreement_pairs: int = Field(50, ge=1, le=100_000_000)
    worst_slice_agreement: float | None = Field(
        None, ge=0, le=1, description="every judged slice's online agreement (script, length, "
        "label, header: rollout.slices) must reach this (rollout.ramp.gates)")
    min_slice_pairs: int = Field(50, ge=1, le=100_000_000,
                                 description="shadow pairs a slice needs before it is judged")
    min_recall_at_10: float | None = Field(
        None, ge=0, le=1, description="embed pairs: the share of the baseline vector's top-10 "
        "neighbours in the shadow's reservoir the optimized vector also finds, judged on an "
        "anytime 95 % confidence sequence (rollout.ramp.gates); needs min_agreement_pairs")
    max_kld: float | None = Field(
        None, gt=0, le=0.1, description="generate: the mean KL divergence (baseline || "
        "optimized, nats) of the answers the shadow scored, each answer's mean per token "
        "clipped at 10x this, judged on an anytime 95 % confidence sequence "
        "(rollout.ramp.gates); needs min_agreement_pairs scored answers")
    min_token_agreement: float | None = Field(
        None, ge=0, le=1, description="generate: the mean share of an answer's positions whose "
        "most likely tokens both arms agree on, judged on an anytime 95 % confidence sequence "
        "(rollout.ramp.gates); needs min_agreement_pairs scored answers")
    error_rate_delta: float | None = Field(None, ge=0, le=1)
    timeout_rate: float | None = Field(None, ge=0, le=1)
    p99_ratio: float | None = Field(None, ge=1, le=1000)
    p99_ms: float | None = Field(None, gt=0, le=3_600_000)
    fallback_rate: float | None = Field(None, ge=0, le=1)
    realized_speedup: float | None = Field(
        None, gt=0, le=1000, description="the minimum realized speedup on live traffic: "
        "baseline ÷ optimized CPU seconds per input, judged on its interval "
        "(rollout.efficiency, rollout.ramp.gates)")

    @field_validator("min_margin")
    @classmethod
    def _margin_edge(cls, value: float) -> float:
        """The shadow counters keep pairs per margin bucket: only an edge splits them."""
        if value not in CONFIDENT_EDGES:
            raise ValueError(f"{value:g} is not a margin bucket edge: use one of "
                             f"{', '.join(f'{e:g}' for e in CONFIDENT_EDGES)}")
        return value

    @model_validator(mode="after")
    def _some_gate(self):
        names = ("agreement_lower_bound", "confident_flip_rate", "worst_slice_agreement",
                 "min_recall_at_10", "max_kld", "min_token_agreement", "error_rate_delta",
                 "timeout_rate", "p99_ratio", "p99_ms", "fallback_rate", "realized_speedup")
        if all(getattr(self, name) is None for name in names):
            raise ValueError(f"give at least one gate ({', '.join(names)})")
        return self


class RampPlan(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    steps: tuple[Step, ...] = Field(min_length=1, max_length=100)
    gates: Gates
    window_s: int = Field(60, ge=1, le=3_600)
    failures_tolerated: int = Field(0, ge=0, le=1_000)
    checks: tuple[Check, ...] = Field((), max_length=MAX_CHECKS,
                                      description="HTTP checks judged at every step")
    progress_deadline_s: float | None = Field(
        None, gt=0, le=30 * 86_400, description="seconds a step may be held past its soak")
    on_deadline: Literal["abort", "pause"] = "abort"
    accept_verdict_without_speed: bool = Field(
        False, description="climb on a verify verdict stored with --no-speed")

    @model_validator(mode="after")
    def _rising_to_100(self):
        shares = [step.bp for step in self.steps]
        for i in range(1, len(shares)):
            if shares[i] <= shares[i - 1]:
                raise ValueError(f"steps.{i}.percent: shares must rise strictly "
                                 f"({self.steps[i].percent} after {self.steps[i - 1].percent})")
        if shares[-1] != BUCKETS:
            raise ValueError(f"steps.{len(shares) - 1}.percent: the last step must be 100 "
                             "(promotion)")
        return self

    @model_validator(mode="after")
    def _check_names_unique(self):
        """Results are shown by name: two checks judged at one step must not share one."""
        for where, checks in (("checks", self.checks), *(
                (f"steps.{i}.checks", step.checks) for i, step in enumerate(self.steps))):
            names = [c.label for c in self.checks] if where != "checks" else []
            for j, check in enumerate(checks):
                if check.label in names:
                    raise ValueError(f"{where}.{j}.name: {check.label!r} names another check "
                                     "judged at the same step")
                names.append(check.label)
        return self

    def checks_at(self, step: int) -> tuple[Check, ...]:
        """The checks judged at a step: the plan's, then the step's own (none before the
        first step)."""
        return (*self.checks, *self.steps[step].checks) if step >= 0 else ()

    @property
    def shares_bp(self) -> tuple[int, ...]:
        return tuple(step.bp for step in self.steps)


def _field(loc: tuple) -> str:
    return ".".join(str(part) for part in loc) or "plan"


def parse_plan(data: object) -> RampPlan:
    """A plan from already-parsed YAML/JSON data; PlanError names every bad field."""
    if not isinstance(data, dict):
        raise PlanError("a ramp plan is a mapping with `steps` and `gates`")
    try:
        return RampPlan.model_validate(data)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            msg = error["msg"].removeprefix("Value error, ")
            if error["type"] == "extra_forbidden":
                msg = "unknown field"
            loc = error["loc"]
            cause = (error.get("ctx") or {}).get("error")
            if isinstance(cause, FieldError):
                loc = (*loc, cause.field)
            where = _field(loc)
            located = msg.startswith(("steps.", "checks."))
            problems.append(msg if located else f"{where}: {msg}")
        raise PlanError("invalid ramp plan: " + "; ".join(problems)) from None


def load_plan(text: str) -> RampPlan:
    """A plan from YAML text."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PlanError(f"the ramp plan is not valid YAML: {str(exc).splitlines()[0]}") from None
    return parse_plan(data)


def read_plan(path: str | Path) -> RampPlan:
    """A plan from a YAML file."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise PlanError(f"cannot read the ramp plan {path}: {exc}") from None
    return load_plan(text)
