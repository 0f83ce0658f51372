"""The verdict of `rollout verify`: did an optimized version earn its place next to a baseline?

A verdict is keyed by the pair (baseline_version, optimized_version): versions hash the weights,
the recipe and the per-layer plan, so a verdict can never be mistaken for another model's. The
store keeps the latest verdict per pair; a ramp can refuse to widen the canary without a passing
one.

The gate measures damage, not noise. `judge_summary` applies every threshold to the paired
comparison (rollout.agreement.Summary) and lists each one missed, in this order:

1. confident flips: inputs the baseline answered with a margin >= `min_margin` and the
   optimized arm answered otherwise; at most `max_confident_flips` (default 0). Flips below
   that margin are near ties, judged only through the overall agreement;
2. accuracy drop on labelled inputs: at most `max_accuracy_drop` (not judged without labels);
3. top-1 agreement >= `min_agreement` and its Wilson lower bound >= `min_lower_bound`;
4. embedding cosine p1 >= `min_cosine_p1`, where cosine is measured (encoders; a classifier
   has no embedding: None, not judged);
5. speedup >= `min_speedup`, where speed is measured (None with `--no-speed`: not judged).

`thresholds_from(settings)` is the one place thresholds are built from the settings
(`verify_*`), for every caller that judges a comparison.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from rollout.agreement import CONFIDENT_MARGIN, Summary

if TYPE_CHECKING:
    from rollout.settings import Settings


class Thresholds(BaseModel):
    model_config = ConfigDict(frozen=True)

    min_margin: float = Field(CONFIDENT_MARGIN, ge=0, le=1)
    max_confident_flips: int = Field(0, ge=0)
    max_accuracy_drop: float = Field(0.01, ge=0, le=1)
    min_agreement: float = Field(0.98, ge=0, le=1)
    min_lower_bound: float = Field(0.98, ge=0, le=1)
    min_speedup: float = Field(1.0, ge=0)
    min_cosine_p1: float = Field(0.95, ge=-1, le=1)


def thresholds_from(settings: Settings) -> Thresholds:
    """The gate's thresholds from the settings `verify_*`."""
    return Thresholds(
        min_margin=settings.verify_min_margin,
        max_confident_flips=settings.verify_max_confident_flips,
        max_accuracy_drop=settings.verify_max_accuracy_drop,
        min_agreement=settings.verify_min_agreement,
        min_lower_bound=settings.verify_min_lower_bound,
        min_speedup=settings.verify_min_speedup,
        min_cosine_p1=settings.verify_min_cosine_p1,
    )


class Verdict(BaseModel):
    """What the store keeps of one verify run. Fields added later have defaults, so verdicts
    stored before them still load."""

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
    confident_flips: int | None = Field(None, ge=0)  # None: stored before it was measured
    accuracy_drop: float | None = Field(None, ge=-1, le=1)  # None: no labelled inputs
    recipe: str = ""
    set_digest: str = ""
    at: float = 0.0
    by: str = ""


def judge(thresholds: Thresholds, *, agreement: float, lower_bound: float,
          speedup: float | None, cosine_p1: float | None, confident_flips: int | None = None,
          accuracy_drop: float | None = None) -> list[str]:
    """Every threshold the measurements miss, as short sentences; empty when all pass.
    A measurement given as None was not taken and is not judged."""
    t = thresholds
    failures = []
    if confident_flips is not None and confident_flips > t.max_confident_flips:
        failures.append(f"{confident_flips} confident flips (baseline margin >= "
                        f"{t.min_margin:g}) > {t.max_confident_flips}")
    if accuracy_drop is not None and accuracy_drop > t.max_accuracy_drop:
        failures.append(f"accuracy drop {accuracy_drop:.4f} > {t.max_accuracy_drop:g}")
    if agreement < t.min_agreement:
        failures.append(f"agreement {agreement:.4f} < {t.min_agreement}")
    if lower_bound < t.min_lower_bound:
        failures.append(f"agreement lower bound {lower_bound:.4f} < {t.min_lower_bound}")
    if cosine_p1 is not None and cosine_p1 < t.min_cosine_p1:
        failures.append(f"cosine p1 {cosine_p1:.4f} < {t.min_cosine_p1}")
    if speedup is not None and speedup < t.min_speedup:
        failures.append(f"speedup {speedup:.2f}x < {t.min_speedup}x")
    return failures


def judge_summary(thresholds: Thresholds, summary: Summary, speedup: float | None
                  ) -> list[str]:
    """`judge` applied to a paired comparison: every threshold `summary` (and `speedup`, None
    when not measured) misses. The summary must draw confident flips at the thresholds'
    `min_margin`."""
    if summary.min_margin != thresholds.min_margin:
        raise ValueError(
            f"the summary counts confident flips from margin {summary.min_margin:g}, the "
            f"thresholds from {thresholds.min_margin:g}: build it with "
            "summarize(pairs, min_margin=thresholds.min_margin)")
    return judge(
        thresholds, agreement=summary.agreement, lower_bound=summary.lower_bound,
        speedup=speedup, cosine_p1=summary.cosine.p1 if summary.cosine else None,
        confident_flips=len(summary.confident), accuracy_drop=summary.accuracy_drop,
    )
