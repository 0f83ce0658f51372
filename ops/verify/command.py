"""The `verify` command's edge: run the measurement (ops.verify.runner; for a causal LM,
ops.verify.token_runner), judge, store the verdict, print, pick the exit code.

Exit codes: 0 every threshold met (and the verdict stored), 1 a threshold missed or the store
unavailable (the report is printed first), 2 a bad regression set, model folder or setting, or
two arms that cannot be compared (their labels differ; nothing is stored).
"""

from __future__ import annotations

import json

from ops.cli.args import UsageError, default_actor
from ops.verify import token_report
from ops.verify.report import document, human
from rollout import Settings, StoreUnavailable, Verdict, thresholds_from
from rollout.verdict import Thresholds, judge_comparison, judge_generation, worst_slice
from serve.common.regression import RegressionSetError


def verify(ctx, settings: Settings) -> int:
    args = ctx.args
    from ops.verify import runner, token_runner  # torch and transformers: imported only now
    from serve.recipes.source import ModelSourceError

    tokens = token_runner.applies(settings)  # a causal LM: judged by its tokens
    try:
        report = (token_runner if tokens else runner).run(
            settings, set_path=args.set_path, limit=args.limit,
            progress_stream=None if args.quiet else ctx.err, speed=not args.no_speed,
        )
    except (RegressionSetError, FileNotFoundError, ModelSourceError) as exc:
        raise UsageError(str(exc)) from None
    judged = _token_verdict if tokens else _verdict
    verdict = judged(ctx, report, thresholds_from(settings), speed_judged=not args.no_speed)
    stored, store_error = False, None
    if not args.no_store:
        try:
            ctx.rollout.store.put_verdict(verdict)
            stored = True
            audit_verdict(ctx.rollout.store, verdict)
        except StoreUnavailable as exc:
            store_error = exc
    if args.json:
        writer = token_report.document if tokens else document
        ctx.say(json.dumps(writer(report, verdict, verdict.thresholds, stored)))
    else:
        lines = (token_report.human(report, verdict, verdict.thresholds) if tokens
                 else human(report, verdict, verdict.thresholds, settings.verify_speed_batch))
        for line in lines:
            ctx.say(line)
        if stored:
            ctx.say("verdict stored for this version pair")
    if store_error is not None:
        raise StoreUnavailable(f"the verdict was not stored: {store_error}")
    return 0 if verdict.passed else 1


def _verdict(ctx, report, thresholds: Thresholds, *, speed_judged: bool) -> Verdict:
    """The verdict of `report`, recording what it was judged with (rollout.verdict)."""
    s = report.summary
    failures = judge_comparison(thresholds, s, report.speedup, report.slices, report.retrieval)
    found = report.retrieval
    worst = worst_slice(report.slices)
    return Verdict(
        baseline_version=report.baseline.version, optimized_version=report.optimized.version,
        passed=not failures, failures=tuple(failures), n=s.n, agreement=s.agreement,
        agreement_lower_bound=s.lower_bound, speedup=report.speedup,
        cosine_p1=s.cosine.p1 if s.cosine else None, confident_flips=len(s.confident),
        accuracy_drop=s.accuracy_drop, recipe=report.optimized.recipe,
        set_digest=report.regression.digest, thresholds=thresholds, split=report.split,
        speed_judged=speed_judged, worst_slice=worst.slice if worst else None,
        worst_slice_agreement=worst.agreement if worst else None,
        recall_at_10=found.recall_at_10 if found else None,
        recall_at_10_mixed=found.recall_at_10_mixed if found else None,
        top1_unchanged=found.top1_unchanged if found else None,
        strict_recall_at_10=found.strict_recall_at_10 if found else None,
        at=ctx.clock.time(), by=getattr(ctx.args, "actor", None) or default_actor(),
    )


def _token_verdict(ctx, report, thresholds: Thresholds, *, speed_judged: bool) -> Verdict:
    """The verdict of a causal LM's report (ops.verify.token_runner): judged by its tokens."""
    found = report.fidelity
    return Verdict(
        baseline_version=report.baseline.version, optimized_version=report.optimized.version,
        passed=not (failures := judge_generation(thresholds, found, report.speedup)),
        failures=tuple(failures), n=found.n, agreement=found.agreement,
        agreement_lower_bound=found.agreement_lower_bound, speedup=report.speedup,
        recipe=report.optimized.recipe, set_digest=report.regression.digest,
        thresholds=thresholds, split=report.split, speed_judged=speed_judged,
        worst_slice=found.slices[0].slice if found.slices and found.slices[0].judged else None,
        worst_slice_agreement=(found.slices[0].agreement if found.slices
                               and found.slices[0].judged else None),
        task="generate", kld=found.kld, kld_upper_bound=found.kld_upper_bound,
        identical=found.identical, at=ctx.clock.time(),
        by=getattr(ctx.args, "actor", None) or default_actor(),
    )


def audit_verdict(store, verdict: Verdict) -> None:
    """A `verify-verdict` note in the audit stream (the notification of a stored verdict)."""
    outcome = "passed" if verdict.passed else "failed: " + "; ".join(verdict.failures)
    store.note(
        ts=verdict.at, actor=verdict.by or "rollout-verify", action="verify-verdict",
        reason=f"verify {outcome} ({_figures(verdict)})",
        detail={"passed": verdict.passed, "baseline_version": verdict.baseline_version,
                "optimized_version": verdict.optimized_version, "recipe": verdict.recipe,
                "failures": list(verdict.failures)},
    )


def _figures(verdict: Verdict) -> str:
    if verdict.task == "generate":
        return (f"KL divergence {verdict.kld:.5f}, top-1 token agreement "
                f"{verdict.agreement:.4f} over {verdict.n} responses")
    return f"agreement {verdict.agreement:.4f} over {verdict.n} inputs"
