"""The `verify` command's edge: run ops.verify, judge, store the verdict, print, pick the exit code.

Exit codes: 0 every threshold met (and the verdict stored), 1 a threshold missed or the store
unavailable (the report is printed first), 2 a bad regression set, model folder or setting.
"""

from __future__ import annotations

import json

from ops._cli_args import UsageError, default_actor
from ops._verify_format import document, human
from rollout import Settings, StoreUnavailable, Thresholds, Verdict, judge
from serve.regression import RegressionSetError


def verify(ctx, settings: Settings) -> int:
    args = ctx.args
    from ops import verify as runner  # torch and transformers: imported only now

    try:
        report = runner.run(
            settings, limit=args.limit, progress_stream=None if args.quiet else ctx.err,
            sorted_speed=args.sorted, speed=not args.no_speed,
        )
    except (RegressionSetError, FileNotFoundError) as exc:
        raise UsageError(str(exc)) from None
    thresholds = Thresholds(
        min_agreement=settings.verify_min_agreement,
        min_lower_bound=settings.verify_min_lower_bound,
        min_speedup=settings.verify_min_speedup,
        min_cosine_p1=settings.verify_min_cosine_p1,
    )
    s = report.summary
    cosine_p1 = s.cosine.p1 if s.cosine else None
    failures = judge(thresholds, agreement=s.agreement, lower_bound=s.lower_bound,
                     speedup=report.speedup, cosine_p1=cosine_p1)
    verdict = Verdict(
        baseline_version=report.baseline.version, optimized_version=report.optimized.version,
        passed=not failures, failures=tuple(failures), n=s.n, agreement=s.agreement,
        agreement_lower_bound=s.lower_bound, speedup=report.speedup, cosine_p1=cosine_p1,
        recipe=report.optimized.recipe, set_digest=report.regression.digest,
        at=ctx.clock.time(), by=getattr(args, "actor", None) or default_actor(),
    )
    stored, store_error = False, None
    if not args.no_store:
        try:
            ctx.rollout.store.put_verdict(verdict)
            stored = True
        except StoreUnavailable as exc:
            store_error = exc
    if args.json:
        ctx.say(json.dumps(document(report, verdict, thresholds, stored)))
    else:
        for line in human(report, verdict, thresholds, settings.verify_speed_batch):
            ctx.say(line)
        if stored:
            ctx.say("verdict stored for this version pair")
    if store_error is not None:
        raise StoreUnavailable(f"the verdict was not stored: {store_error}")
    return 0 if verdict.passed else 1
