"""The gateway's calls to the arms' models, each within its request's deadline.

A request's call goes to its arm's model deployment (the remote topology) or to the model
loaded in this replica (the colocated topology: serve.gateway.colocated), alone or in a call
that concurrent requests for the arm share (serve.gateway.coalesce, remote only). A failed or
late canary call is retried once on baseline within what is left of the deadline and within
the retry budget (rollout.budget); a baseline failure is never retried on the canary. What a
failed call means for the client (503, 413, 504, 502) is decided here, in one place.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Any

from ray.exceptions import RayTaskError
from ray.serve.exceptions import BackPressureError

from rollout import Arm
from rollout.budget import RetryBudget
from rollout.settings import BatchingSettings, ServingSettings
from serve.common.answer import CallFailed, ModelAnswer
from serve.common.batching import Expired, RowsDidNotFit
from serve.common.errors import (
    GatewayError,
    InputTooLarge,
    ModelFailed,
    ModelTimeout,
    Overloaded,
)
from serve.gateway.admission import Admission, ShedSummary, Slot
from serve.gateway.coalesce import Coalescer
from serve.gateway.exchange import Exchange
from serve.recipes.source import Encoded

log = logging.getLogger("canary.gateway")


def rows_of(texts: list[str] | Encoded) -> int:
    """How many inputs a call carries, texts or the gateway's token ids."""
    return len(texts.ids) if isinstance(texts, Encoded) else len(texts)


def _timed_out(arm: Arm, remaining: float) -> ModelTimeout:
    return ModelTimeout(f"the {arm.value} model did not answer within {remaining:.2f} s")


def _model_error(arm: Arm, exc: Exception) -> GatewayError:
    """What a failed model call means for the client: the arm's queue is full (503), the
    request's inputs did not fit even alone (413), or the arm failed (a replica error or
    death, or the request's own failure inside a coalesced call): the arm, not the client."""
    if isinstance(exc, BackPressureError):
        return Overloaded(f"the {arm.value} model's queue is full; retry later")
    cause = getattr(exc, "cause", None) if isinstance(exc, RayTaskError) else exc
    if isinstance(cause, RowsDidNotFit):
        return InputTooLarge(str(cause))
    if isinstance(cause, Expired):  # the replica dropped it: its deadline passed in the queue
        return ModelTimeout(f"the {arm.value} model did not reach the request in time")
    kind = cause.kind if isinstance(cause, CallFailed) else type(exc).__name__
    log.warning("%s model call failed: %s", arm.value, kind)
    return ModelFailed(f"the {arm.value} model failed: {kind}")


class Arms:
    """Both arms' models as one gateway replica calls them (see the module docstring).
    `handles`: per arm, a deployment handle or a model in this process (`local`), called alike;
    `admission` counts each call's rows on its arm's queue and refuses what would be late."""

    def __init__(self, handles: dict[Arm, Any], serving: ServingSettings,
                 batching: BatchingSettings, admission: Admission, shed_summary: ShedSummary,
                 *, local: bool):
        self.handles = handles
        self.admission, self.shed_summary = admission, shed_summary
        self.canary_timeout_fraction = serving.canary_timeout_fraction
        self.retry_budget = RetryBudget(ratio=serving.retry_budget_ratio,
                                        min_per_s=serving.retry_budget_min_per_s)
        # never for models in this process, which batch the requests themselves at no cost
        # per call
        self.coalescers = None if not serving.gateway_coalesce_calls or local else {
            arm: Coalescer(functools.partial(self._send, arm),
                           calls=serving.gateway_coalesce_calls,
                           max_items=batching.max_batch_size,
                           hold_s=batching.batch_wait_ms / 1000)
            for arm in handles}

    def admit(self, arm: Arm, rows: int, timeout_s: float, slot: Slot) -> None:
        """Overloaded (503 with Retry-After, counted as shed) when `rows` more for `arm` would
        be answered after `timeout_s` (serve.gateway.admission); else the rows count on the
        arm's queue from now (`slot.reserve`), until the request's call for them ends."""
        refusal = self.admission.judge(arm.value, rows, timeout_s)
        if refusal is not None:
            self.shed_summary.shed()
            raise Overloaded(refusal.message(arm.value), retry_after=refusal.retry_after)
        slot.reserve(arm.value, rows)

    async def call_with_fallback(
        self, ex: Exchange, arm: Arm, texts: list[str], task: str, *, retry_share: bool = True
    ) -> tuple[ModelAnswer, bool]:
        """The answer and whether it came from the baseline retry: a failed canary call is
        retried once on baseline, within the deadline and the retry budget, when the baseline
        can still answer in the time left (else the request is shed, 503 with Retry-After,
        rather than timed out); a baseline failure is never retried on the canary.
        `retry_share`: the canary call leaves the retry its share of the deadline
        (`canary_timeout_fraction`); without it (a canary predicted past its share that the
        baseline would answer no sooner) the call has the whole deadline."""
        first_deadline, rid = ex.deadline, ex.rid
        if arm is Arm.OPTIMIZED and retry_share:  # leave the baseline retry its share
            share = ex.timeout_s * self.canary_timeout_fraction
            first_deadline = min(ex.deadline, time.perf_counter() + share)
        if arm is Arm.OPTIMIZED:
            self.retry_budget.record_call()
        try:
            return await self.call(ex, arm, texts, task, first_deadline), False
        except (ModelFailed, ModelTimeout, Overloaded) as exc:
            if arm is not Arm.OPTIMIZED:
                raise
            if not self.retry_budget.try_retry():
                log.warning("request %s: optimized arm failed (%s), retry budget spent",
                            rid, exc.type)
                raise ModelFailed(f"{exc.message} (no retry: the retry budget is spent)") from None
            log.warning("request %s: optimized arm failed (%s), retrying on baseline",
                        rid, exc.type)
        # the retry would miss the deadline too: shed, not a 504
        self.admit(Arm.BASELINE, rows_of(texts), ex.deadline - time.perf_counter(), ex.slot)
        return await self.call(ex, Arm.BASELINE, texts, task, ex.deadline), True

    async def call(
        self, ex: Exchange, arm: Arm, texts: list[str], task: str, deadline: float
    ) -> ModelAnswer:
        """One call of `arm`, its rows counted on the arm's queue while it runs
        (serve.gateway.admission)."""
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            raise ModelTimeout(f"no time left for the {arm.value} model within the deadline")
        rows = rows_of(texts)
        with ex.obs.call(arm.value) as call, ex.slot.counted(arm.value, rows):
            if self.coalescers is None:
                result = await self.remote(arm, texts, task, remaining, call.carrier)
            else:
                result = await self._coalesced(arm, texts, task, remaining, call.carrier)
            ex.slot.answered(result.timing.model / 1000, result.batch.items)
            call.answered(result)
            return result

    async def remote(
        self, arm: Arm, texts: list[str], task: str, remaining: float, carrier: dict | None
    ) -> ModelAnswer:
        """One model call for one request (also the shadow's way to the other arm)."""
        response = self.handles[arm].predict.remote(texts, task, carrier, remaining)
        try:
            return await asyncio.wait_for(response, timeout=remaining)
        except TimeoutError:
            response.cancel()
            raise _timed_out(arm, remaining) from None
        except asyncio.CancelledError:
            response.cancel()
            raise
        except Exception as exc:
            raise _model_error(arm, exc) from None

    async def _coalesced(
        self, arm: Arm, texts: list[str], task: str, remaining: float, carrier: dict | None
    ) -> ModelAnswer:
        """This request's answer from a model call it may share (serve.gateway.coalesce)."""
        try:
            # the deadline goes along on this clock; `_send` turns it into the time left
            call = (texts, task, carrier, time.perf_counter() + remaining)
            return await self.coalescers[arm].call(call, remaining)
        except TimeoutError:
            raise _timed_out(arm, remaining) from None
        except Exception as exc:
            raise _model_error(arm, exc) from None

    async def _send(self, arm: Arm, calls: list[tuple]) -> list[ModelAnswer | Exception]:
        now = time.perf_counter()  # deadlines cross processes as the seconds left
        calls = [(*call[:3], call[3] - now) for call in calls]
        response = self.handles[arm].predict_many.remote(calls)
        try:
            return await response
        except asyncio.CancelledError:  # every request of the call has gone
            response.cancel()
            raise

    async def ping(self, arm: Arm) -> bool:
        """Whether `arm`'s model answers `info` within 2 s (readiness)."""
        try:
            await asyncio.wait_for(self.handles[arm].info.remote(), timeout=2.0)
            return True
        except Exception:
            return False
