"""A ramp's HTTP checks: what a plan asks (`Check`), how an answer is judged (`judge`), and the
narrow interface that fetches one (`Checker`; the HTTP implementation is
serve.control_plane.checks).

    checks:                                # judged at every step (a step may list its own)
      - name: error-budget                 # default: the URL's host and path
        url: http://prometheus:9090/api/v1/query?query=canary_error_ratio
        timeout_s: 5                       # at most 60
        expect: 200                        # the HTTP status expected
        field: data.result.0.value.1       # optional: a number in the JSON answer ...
        max: 0.01                          # ... judged against max and/or min

A check is a gate (rollout.ramp.machine): it `pass`es when the answer has the expected status
and its field (if any) is within the thresholds; it `fail`s when the answer has another status
or the field breaks a threshold (a failing gate: counted, then rolled back); it `wait`s when no
usable answer came (unreachable, timed out, not JSON, no such field, not a number). A check in
`wait` never passes: it holds the step, and the plan's progress deadline ends a ramp held too
long. This module does no I/O but `run_checks`, which calls the injected checker concurrently.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from typing import Literal, Protocol
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

GRACE_S = 1.0  # beyond its timeout, how long `run_checks` waits for a checker's answer


class FieldError(ValueError):
    """A validation error about a named sub-field (the plan's error names `<where>.<field>`)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


class Check(BaseModel):
    """One HTTP check of a ramp plan."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str = Field(max_length=2048, description="http(s) URL fetched with GET")
    name: str | None = Field(None, min_length=1, max_length=100,
                             description="shown with the gates; default: host and path")
    timeout_s: float = Field(5.0, gt=0, le=60, description="seconds for the whole answer")
    expect: int = Field(200, ge=100, le=599, description="the HTTP status expected")
    field: str | None = Field(None, min_length=1, max_length=200,
                              description="dotted path of a number in the JSON answer")
    max: float | None = Field(None, allow_inf_nan=False, description="the field is <= max")
    min: float | None = Field(None, allow_inf_nan=False, description="the field is >= min")

    @field_validator("url")
    @classmethod
    def _http(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"an http:// or https:// URL with a host, not {value!r}")
        return value

    @field_validator("field")
    @classmethod
    def _path(cls, value: str) -> str:
        if any(not part for part in value.split(".")):
            raise ValueError(f"a dotted path such as data.error_rate, not {value!r}")
        return value

    @field_validator("max", "min")
    @classmethod
    def _needs_field(cls, value: float | None, info: ValidationInfo) -> float | None:
        if value is not None and info.data.get("field") is None and "field" in info.data:
            raise ValueError(f"a threshold needs `field` (the JSON value that {info.field_name}"
                             " judges)")
        return value

    @model_validator(mode="after")
    def _threshold(self):
        if self.field is not None and self.max is None and self.min is None:
            raise FieldError("field", f"{self.field} needs `max` and/or `min`")
        if self.max is not None and self.min is not None and self.min > self.max:
            raise FieldError("min", f"{self.min:g} is above max {self.max:g}")
        return self

    @property
    def label(self) -> str:
        """Its name, or the URL's host and path."""
        if self.name:
            return self.name
        parts = urlsplit(self.url)
        return f"{parts.netloc}{parts.path}".rstrip("/") or parts.netloc

    def threshold_text(self) -> str:
        if self.field is None:
            return f"status {self.expect}"
        bounds = [f">= {self.min:g}"] if self.min is not None else []
        bounds += [f"<= {self.max:g}"] if self.max is not None else []
        return ", ".join(bounds)


CheckStatus = Literal["pass", "fail", "wait"]


@dataclass(frozen=True)
class CheckResult:
    """One check's result, shown with the gates (audit, `rollout ramp status`, dashboard)."""

    name: str
    status: CheckStatus
    value: float | None = None  # the field's value, or the HTTP status without a field
    threshold: str = ""
    note: str = ""

    def text(self) -> str:
        value = "-" if self.value is None else f"{self.value:.4g}"
        return f"check {self.name} {value} ({self.threshold}): {self.status}" + (
            f" ({self.note})" if self.note else "")

    def as_dict(self) -> dict:
        return asdict(self)


class Checker(Protocol):
    def check(self, check: Check) -> CheckResult:
        """Fetch the check's URL within its timeout and judge the answer (`judge`); a check
        that cannot be fetched is `unanswered` (wait), never an exception."""


def unanswered(check: Check, why: str) -> CheckResult:
    """The result of a check that got no usable answer: wait."""
    return CheckResult(check.label, "wait", None, check.threshold_text(), why)


def judge(check: Check, status: int, body: bytes) -> CheckResult:
    """An HTTP answer against the check: status first, then the field's thresholds."""
    if status != check.expect:
        return CheckResult(check.label, "fail", float(status), check.threshold_text(),
                           f"HTTP {status}, expected {check.expect}")
    if check.field is None:
        return CheckResult(check.label, "pass", float(status), check.threshold_text())
    try:
        data = json.loads(body)
    except ValueError:  # not UTF-8, or not JSON
        return unanswered(check, f"the answer is not JSON: {body[:40]!r}")
    try:
        value = _lookup(data, check.field)
    except ValueError as exc:
        return unanswered(check, str(exc))
    bad = [f"above max {check.max:g}"] if check.max is not None and value > check.max else []
    bad += [f"below min {check.min:g}"] if check.min is not None and value < check.min else []
    return CheckResult(check.label, "fail" if bad else "pass", value, check.threshold_text(),
                       "; ".join(bad))


def _lookup(data: object, path: str) -> float:
    """The number at a dotted path (list items by index); ValueError says what is missing."""
    for part in path.split("."):
        if isinstance(data, dict) and part in data:
            data = data[part]
        elif isinstance(data, list) and part.isdigit() and int(part) < len(data):
            data = data[int(part)]
        else:
            raise ValueError(f"no field {path} in the answer (at {part!r})")
    if isinstance(data, str):  # Prometheus answers numbers as strings
        try:
            data = float(data)
        except ValueError:
            pass
    if isinstance(data, bool) or not isinstance(data, int | float) or not math.isfinite(data):
        raise ValueError(f"{path} is not a number: {str(data)[:40]!r}")
    return float(data)


def run_checks(checker: Checker | None, checks: Sequence[Check]) -> tuple[CheckResult, ...]:
    """Every check at once, each bounded by its timeout (plus `GRACE_S`): a checker that does
    not answer in time, raises, or is missing gives `wait`, never `pass`."""
    if not checks:
        return ()
    if checker is None:
        return tuple(unanswered(c, "no checker configured") for c in checks)
    pool = ThreadPoolExecutor(max_workers=len(checks), thread_name_prefix="ramp-check")
    try:
        started = time.monotonic()
        futures = [pool.submit(checker.check, c) for c in checks]
        results = []
        for check, future in zip(checks, futures, strict=True):
            left = started + check.timeout_s + GRACE_S - time.monotonic()
            wait([future], timeout=max(0.0, left))
            if not future.done():
                results.append(unanswered(check, f"no answer within {check.timeout_s:g}s"))
            elif future.exception() is not None:
                results.append(unanswered(check, f"checker error: {future.exception()}"))
            else:
                results.append(future.result())
        return tuple(results)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
