"""A passing verify verdict as `rollout verify` records it, for tests that need a ramp to climb:
judged on the shipped set's held-out split with the default thresholds, speed judged (the
gateway's controller checks that record: rollout.verdict.verdict_problems)."""

from __future__ import annotations

from rollout import Settings
from rollout.verdict import Verdict, thresholds_from
from serve.common.regression import load_set


def passing_verdict(baseline: str, optimized: str, **fields) -> Verdict:
    record = dict(
        baseline_version=baseline, optimized_version=optimized, passed=True, n=100,
        agreement=1.0, agreement_lower_bound=0.96, speedup=2.0, by="test",
        thresholds=thresholds_from(Settings()), split="held-out",
        set_digest=load_set().digest, speed_judged=True)
    return Verdict(**{**record, **fields})
