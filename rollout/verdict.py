"""The verdict of `rollout verify`: did an optimized version earn its place next to a baseline?

A verdict is keyed by the pair (baseline_version, optimized_version): versions hash the weights,
the recipe and the per-layer plan, so a verdict can never be mistaken for another model's. The
store keeps the latest verdict per pair; a ramp can refuse to widen the canary without a passing
one. `judge` applies the thresholds (settings `verify_min_*`) and lists every one that failed.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Thresholds(BaseModel):
    model_config = ConfigDict(frozen=True)

    min_agreement: float = Field(0.995, ge=0, le=1)
    min_lower_bound: float = Field(0.99, ge=0, le=1)
    min_speedup: float = Field(1.0, ge=0)
    min_cosine_p1: float = Field(0.0, ge=-1, le=1)


class Verdict(BaseModel):
    """What the store keeps of one verify run."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    baseline_version: str = Field(min_length=1)
    optimized_version: str = Field(min_length=1)
    passed: bool
    failures: tuple[str, ...] = ()
    n: int = Field(ge=0)
    agreement: float = Field(ge=0, le=1)
    agreement_lower_bound: float = Field(ge=0, le=1)
    speedup: float | None = None
    cosine_p1: float | None = None
    recipe: str = ""
    set_digest: str = ""
    at: float = 0.0
    by: str = ""


def judge(thresholds: Thresholds, *, agreement: float, lower_bound: float,
          speedup: float | None, cosine_p1: float | None) -> list[str]:
    """Every threshold the measurements miss, as short sentences; empty when all pass."""
    failures = []
    if agreement < thresholds.min_agreement:
        failures.append(f"agreement {agreement:.4f} < {thresholds.min_agreement}")
    if lower_bound < thresholds.min_lower_bound:
        failures.append(f"agreement lower bound {lower_bound:.4f} < {thresholds.min_lower_bound}")
    if speedup is not None and speedup < thresholds.min_speedup:
        failures.append(f"speedup {speedup:.2f}x < {thresholds.min_speedup}x")
    if cosine_p1 is not None and cosine_p1 < thresholds.min_cosine_p1:
        failures.append(f"cosine p1 {cosine_p1:.4f} < {thresholds.min_cosine_p1}")
    return failures
