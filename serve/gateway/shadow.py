"""Shadow comparison at the gateway: for a share of answered requests, also ask the other arm,
off the response path, and record how the two answers agree (rollout.shadow).

One answered request (not a fallback, not an idempotent replay) goes through:

1. **sampling**: shadowed with probability `shadow_share` (an injectable RNG, so independent of
   the routing key: every user, canary or not, can be sampled);
2. **safety** (skipped, not counted): never while the kill switch is on, the cached state is
   stale, or the share is bound to another optimized version than this gateway serves. A killed
   canary gets no traffic at all, shadow included;
3. **shedding** (counted as `shed`): when this gateway replica serves more than
   `shadow_shed_in_flight` requests, when the answering replica reported more than
   `shadow_shed_queue` requests queued ahead of this one, or when `shadow_max_concurrency`
   shadow calls are already in flight (a try-acquire: a shadow call never waits for a slot);
4. **the shadow call**: a background task calls the other arm with its own deadline
   (`shadow_timeout_s`), compares the outputs and records them: per-second counters in Redis
   through the telemetry sink, OpenTelemetry metrics, and a `shadow` span in the request's trace;
5. **slices**: each classify pair is filed under its input's slices (rollout.slices): the
   dominant script of its text, its length bucket, the baseline's label and, with
   `CANARY_SLICE_HEADER`, the request's value of that header (bounded per replica by
   `HeaderValues`). The length is the baseline answer's token count for the request shared
   among its texts by characters (`tokens_per_input`): exact for one text, approximate for
   several. A slicing bug costs the slices of that comparison, never the comparison;
6. **neighbours** (embed, `CANARY_SHADOW_RESERVOIR_SIZE` > 0): each pair's two vectors are
   searched in the replica's reservoir of recent baseline vectors (serve.gateway.reservoir), off the
   event loop, and the pair counts how many of the optimized arm's top-10 count as the
   baseline's, neighbours tied within `verify_retrieval_tolerance` included (online recall@10,
   rollout.shadow; the rule verify applies offline, rollout.retrieval); the baseline vectors
   then join the reservoir. A failure here costs the neighbours of that comparison, never the
   comparison;
7. **generated answers** (`offer_tokens`, task generate): sampled, checked and shed as above;
   the shadow call is `score(timeout)`, the generative path's (serve.gateway.generation): the
   optimized replica's log-probabilities of the answered tokens, teacher-forced, compared with
   the baseline's own by the baseline replica, whichever arm answered (KL(baseline ||
   optimized) and top-1 token agreement per position, rollout.token_fidelity). The response is
   filed under its prompt's slices (script, length bucket in tokens, the header); with flip
   capture on, a prompt whose arms part within the answer's first tokens is captured
   (rollout.flips `FlipCapture.parted`);
8. **flip capture** (`CANARY_FLIP_CAPTURE`, off by default): the inputs whose top-1 labels
   differ go, after the capture policy and redaction hook of rollout.flips, to the flip stream
   through the same sink. A failing hook or Redis costs a counter, never the comparison.

Invariants: the response path only samples, checks and creates a task (no await, no I/O), so a
slow or failing shadowed arm cannot delay or fail a client's response; shadow calls are not
model calls of the request (they stay out of the per-arm windows and `canary.model.calls`);
at most `shadow_max_concurrency` of them per replica; `close()` cancels the outstanding ones.

    canary.shadow.calls   counter    arm (shadowed), outcome (ok, error, timeout, overloaded,
                                     mismatch, shed)
    canary.shadow.pairs   counter    arm, margin (baseline-margin bucket), agreed (true, false)
    canary.shadow.cosine  histogram  arm: cosine of embed pairs
    canary.shadow.recall_at_10  histogram  arm: an embed pair's shared share of top-10
                                     neighbours in the reservoir (its mean: sum / count)
    canary.shadow.kld     histogram  arm: a generate response's mean KL(baseline || optimized)
                                     per token, nats (clipped at 1)
    canary.shadow.token_agreement  histogram  arm: a generate response's share of positions
                                     whose most likely tokens agree
    canary.shadow.flips   counter    outcome (captured, too_long, redacted, redact_error):
                                     flipped inputs met by flip capture
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence

from opentelemetry.metrics import Meter
from opentelemetry.trace import Status, StatusCode

from rollout.agreement import bucket_label, bucket_of
from rollout.clock import Clock, SystemClock
from rollout.flips import FlipCapture, load_redactor
from rollout.policy import Arm, Reason
from rollout.retrieval import K
from rollout.settings import ShadowSettings
from rollout.shadow import (
    KLD_EDGES,
    PairOutcome,
    ShadowItem,
    ShadowMismatch,
    compare,
    shadow_fields,
    token_fields,
)
from rollout.slices import HeaderValues, slices_of, tokens_per_input
from rollout.token_fidelity import ResponseFidelity
from serve.common.answer import ModelAnswer
from serve.gateway.reservoir import Reservoir
from serve.telemetry.observe import call_outcome
from serve.telemetry.otel import Telemetry

log = logging.getLogger("canary.shadow")

# arm, texts, task, timeout (s), trace carrier -> the arm's answer (Gateway._remote)
ShadowCall = Callable[[Arm, list[str], str, float, dict | None], Awaitable[ModelAnswer]]
COSINE_BOUNDS = (0.0, 0.5, 0.9, 0.95, 0.99, 0.995, 0.999, 0.9995, 0.9999, 0.99999, 0.999999)
RECALL_BOUNDS = (0.05, 0.25, 0.45, 0.65, 0.75, 0.85, 0.95)  # between the tenths a pair takes
AGREEMENT_BOUNDS = (0.5, 0.7, 0.8, 0.85, 0.9, 0.93, 0.95, 0.97, 0.98, 0.99, 0.999)
# timeout (s) -> the teacher-forced comparison (serve.gateway.generation.Generation.score)
TokenScore = Callable[[float], Awaitable[dict]]


class ShadowMetrics:
    def __init__(self, meter: Meter):
        self.calls = meter.create_counter(
            "canary.shadow.calls", "{call}", "shadow calls by shadowed arm and outcome")
        self.pairs = meter.create_counter(
            "canary.shadow.pairs", "{pair}",
            "classify pairs by baseline-margin bucket and agreement")
        self.cosine = meter.create_histogram(
            "canary.shadow.cosine", "1", "cosine between the two arms' embeddings",
            explicit_bucket_boundaries_advisory=COSINE_BOUNDS)
        self.flips = meter.create_counter(
            "canary.shadow.flips", "{input}", "flipped inputs by flip-capture outcome")
        self.recall = meter.create_histogram(
            "canary.shadow.recall_at_10", "1", "share of the baseline vector's top-10 "
            "neighbours in the reservoir the optimized vector's top-10 also holds",
            explicit_bucket_boundaries_advisory=RECALL_BOUNDS)
        self.kld = meter.create_histogram(
            "canary.shadow.kld", "nat", "a generate response's mean KL divergence (baseline "
            "|| optimized) per token, clipped at 1", explicit_bucket_boundaries_advisory=KLD_EDGES)
        self.token_agreement = meter.create_histogram(
            "canary.shadow.token_agreement", "1", "a generate response's share of positions "
            "whose most likely tokens agree", explicit_bucket_boundaries_advisory=AGREEMENT_BOUNDS)

    def record(self, arm: str, outcome: str, pairs: Sequence[PairOutcome]) -> None:
        self.calls.add(1, {"arm": arm, "outcome": outcome})
        for pair in pairs:
            if pair.agreed is not None:
                margin = bucket_label(bucket_of(pair.margin or 0.0))
                self.pairs.add(1, {"arm": arm, "margin": margin,
                                   "agreed": "true" if pair.agreed else "false"})
            if pair.cosine is not None:
                self.cosine.record(pair.cosine, {"arm": arm})
            if pair.neighbours is not None:
                self.recall.record(pair.neighbours / K, {"arm": arm})


def _outcome(exc: BaseException) -> str:
    """A failed shadow call's outcome: a model call's (serve.telemetry.observe), or `mismatch` when
    the two answers could not be compared."""
    return "mismatch" if isinstance(exc, ShadowMismatch) else call_outcome(exc)


def _cancelled(span) -> None:
    """A shadow call cancelled (shutdown): its span ends saying so, nothing is counted."""
    span.set_attribute("canary.shadow.outcome", "cancelled")
    span.end()


def _sliced(pairs: list[PairOutcome], texts: list[str], baseline: ModelAnswer,
            header: str | None) -> list[PairOutcome]:
    """The classify pairs with their inputs' slice keys (see the module docstring); the pairs
    as they are when slicing fails."""
    try:
        tokens = tokens_per_input(baseline.tokens, texts)
        return [dataclasses.replace(pair, slices=slices_of(
            text, count, output.get("label"), header)) if pair.agreed is not None else pair
            for pair, text, count, output in zip(pairs, texts, tokens, baseline.outputs,
                                                  strict=True)]
    except Exception:
        log.exception("slicing a shadow comparison failed (it is counted without slices)")
        return pairs


async def with_neighbours(reservoir: Reservoir | None, pairs: list[PairOutcome],
                          baseline: ModelAnswer, optimized: ModelAnswer) -> list[PairOutcome]:
    """The embed pairs with their shared top-10 neighbours in `reservoir` (see the module
    docstring, 6), computed in a worker thread; the pairs as they are when it fails."""
    if reservoir is None or not reservoir.size:
        return pairs
    try:
        shared = await asyncio.to_thread(
            reservoir.neighbours, [out["embedding"] for out in baseline.outputs],
            [out["embedding"] for out in optimized.outputs])
        return [dataclasses.replace(pair, neighbours=found)
                for pair, found in zip(pairs, shared, strict=True)]
    except Exception:
        log.exception("comparing shadow neighbours failed (the pair is counted without them)")
        return pairs


def flip_capture(settings: ShadowSettings) -> FlipCapture:
    """Flip capture as the shadow settings (`flip_*`) ask; resolves the redaction hook
    (rollout.flips.FlipSettingError)."""
    hook = settings.flip_redact
    return FlipCapture(enabled=settings.flip_capture, max_chars=settings.flip_capture_max_chars,
                       redact=load_redactor(hook) if settings.flip_capture and hook else None,
                       max_len=settings.flip_capture_max, ttl_s=settings.flip_capture_ttl_s)


class Shadow:
    """The shadow comparisons of one gateway replica (see the module docstring).

    `call` is the gateway's model call; `rng` and `clock` are injectable for tests;
    `recall_tolerance`: the reservoir's ties (`verify_retrieval_tolerance`, rollout.retrieval). A
    CANARY_FLIP_REDACT that cannot be imported fails here, at start (FlipSettingError)."""

    def __init__(self, settings: ShadowSettings, call: ShadowCall, telemetry: Telemetry, *,
                 rng: random.Random | None = None, clock: Clock | None = None,
                 recall_tolerance: float = 0.0):
        self.settings, self.call, self.telemetry = settings, call, telemetry
        self.rng = rng or random.Random()
        self.clock = clock or SystemClock()
        self.enabled = settings.shadow_share > 0 and telemetry.enabled
        self.metrics = ShadowMetrics(telemetry.meter)
        self.flips = flip_capture(settings)
        self.header_values = HeaderValues()  # the CANARY_SLICE_HEADER values, bounded
        # recent baseline vectors
        self.reservoir = Reservoir(settings.shadow_reservoir_size, recall_tolerance)
        self.tasks: set[asyncio.Task] = set()  # shadow calls running

    @property
    def active(self) -> int:
        return len(self.tasks)

    def offer(self, *, answered: Arm, result: ModelAnswer, texts: list[str], task: str,
              in_flight: int, override: Reason | None, parent=None,
              request_id: str = "", header: str | None = None) -> str:
        """Maybe shadow one answered request; what happened: `off`, `unsampled`, `unsafe`,
        `shed` or `started`. `header`: the request's CANARY_SLICE_HEADER value. Never awaits;
        must be called on the gateway's event loop."""
        target = self._admit(answered, in_flight, result.queue, override)
        if not isinstance(target, Arm):
            return target
        header = self.header_values.admit(header)
        self._start(self._run(target, answered, result, list(texts), task, parent, request_id,
                              header))
        return "started"

    def offer_tokens(self, *, answered: Arm, score: TokenScore, prompt: str,
                     prompt_tokens: int, in_flight: int, override: Reason | None,
                     parent=None, header: str | None = None, request_id: str = "",
                     versions: tuple[str, str] = ("", "")) -> str:
        """Maybe score one generated answer (module docstring, 7), as `offer` does;
        `versions`: the baseline's and the optimized arm's, for a captured prompt."""
        target = self._admit(answered, in_flight, 0, override)
        if not isinstance(target, Arm):
            return target
        try:
            slices = slices_of(prompt, prompt_tokens, None, self.header_values.admit(header))
        except Exception:
            log.exception("slicing a generated answer failed (it is scored without slices)")
            slices = ()
        self._start(self._run_tokens(target, answered, score, slices, parent,
                                     (prompt, request_id, *versions)))
        return "started"

    def _admit(self, answered: Arm, in_flight: int, queue: int,
               override: Reason | None) -> Arm | str:
        """The arm to shadow, or why not: `off`, `unsampled`, `unsafe`, `shed` (counted)."""
        settings = self.settings
        if not self.enabled:
            return "off"
        if self.rng.random() >= settings.shadow_share:
            return "unsampled"
        if override is not None:
            return "unsafe"
        target = Arm.OPTIMIZED if answered is Arm.BASELINE else Arm.BASELINE
        if (in_flight > settings.shadow_shed_in_flight or queue > settings.shadow_shed_queue
                or self.active >= settings.shadow_max_concurrency):
            self._record(target, "shed", shadow_fields(shed=1))
            return "shed"
        return target

    def _start(self, work) -> None:
        job = asyncio.get_running_loop().create_task(work)
        self.tasks.add(job)
        job.add_done_callback(self._done)

    def _done(self, job: asyncio.Task) -> None:
        self.tasks.discard(job)

    async def _run(self, target: Arm, answered: Arm, result: ModelAnswer, texts: list[str],
                   task: str, parent, request_id: str = "", header: str | None = None) -> None:
        span = self.telemetry.tracer.start_span("shadow", context=parent, attributes={
            "canary.arm": target.value, "canary.shadow.of": answered.value,
            "canary.items": len(texts)})
        try:
            other = await self.call(target, texts, task, self.settings.shadow_timeout_s, None)
            baseline, optimized = (result, other) if answered is Arm.BASELINE else (other, result)
            pairs = compare(task, baseline.outputs, optimized.outputs)
            if task == "embed":
                pairs = await with_neighbours(self.reservoir, pairs, baseline, optimized)
        except asyncio.CancelledError:
            _cancelled(span)
            raise
        except Exception as exc:  # the shadowed arm failed: counted, never the client's problem
            self._failed(span, target, exc, "shadow call to")
            return
        pairs = _sliced(pairs, texts, baseline, header)
        agreed = [p.agreed for p in pairs if p.agreed is not None]
        margins = [p.margin for p in pairs if p.margin is not None]
        cosines = [p.cosine for p in pairs if p.cosine is not None]
        span.set_attribute("canary.shadow.outcome", "ok")
        span.set_attribute("canary.shadow.pairs", len(pairs))
        if agreed:
            span.set_attribute("canary.shadow.agreed", all(agreed))
            span.set_attribute("canary.shadow.agreed_pairs", sum(agreed))
            span.set_attribute("canary.shadow.margin", round(min(margins), 6))
        if cosines:
            span.set_attribute("canary.shadow.cosine", round(min(cosines), 6))
        span.end()
        self._record(target, "ok", shadow_fields(pairs, calls=1), pairs)
        if agreed and not all(agreed):
            self._capture(task, texts, baseline, optimized, pairs, request_id)

    async def _run_tokens(self, target: Arm, answered: Arm, score: TokenScore,
                          slices: tuple[str, ...], parent,
                          asked: tuple[str, str, str, str] = ("", "", "", "")) -> None:
        """One scored answer; `asked`: its prompt, request id and the two versions (for
        flip capture)."""
        span = self.telemetry.tracer.start_span("shadow", context=parent, attributes={
            "canary.arm": target.value, "canary.shadow.of": answered.value})
        try:
            scored = await score(self.settings.shadow_timeout_s)
            response = ResponseFidelity(
                tuple(scored["kld"]), tuple(scored["same_top"]),
                sum(scored["reference_nll"]), sum(scored["other_nll"]), slices)
        except asyncio.CancelledError:
            _cancelled(span)
            raise
        except Exception as exc:  # the shadowed arm failed: counted, never the client's problem
            self._failed(span, target, exc, "scoring a generated answer on")
            return
        span.set_attribute("canary.shadow.outcome", "ok")
        span.set_attribute("canary.shadow.tokens", response.tokens)
        span.set_attribute("canary.shadow.kld", round(response.mean_kld, 6))
        span.set_attribute("canary.shadow.token_agreement", round(response.agreement, 6))
        span.end()
        self._record(target, "ok", token_fields(response) if response.tokens
                     else shadow_fields(calls=1))
        try:
            if response.tokens:
                self.metrics.kld.record(response.mean_kld, {"arm": target.value})
                self.metrics.token_agreement.record(response.agreement, {"arm": target.value})
        except Exception:
            log.exception("recording a shadow comparison failed")
        self._capture_parted(response, asked)

    def _failed(self, span, target: Arm, exc: Exception, what: str) -> None:
        """A shadow call to `target` that raised: logged, its span ended with the outcome,
        counted as an error."""
        outcome = _outcome(exc)
        log.warning("%s the %s model: %s: %s", what, target.value, outcome, exc)
        span.set_attribute("canary.shadow.outcome", outcome)
        span.set_status(Status(StatusCode.ERROR, f"{outcome}: {exc}"[:200]))
        span.end()
        self._record(target, outcome, shadow_fields(errors=1))

    def _capture_parted(self, response: ResponseFidelity, asked: tuple[str, str, str, str]
                        ) -> None:
        """A prompt whose arms part early to the flip stream (rollout.flips); never raises."""
        capture = self.flips
        if not capture.enabled or self.telemetry.sink is None:
            return
        prompt, request_id, baseline_version, optimized_version = asked
        try:
            before = dict(capture.counts)
            record = capture.parted(
                text=prompt, same_top=response.same_top, kld=response.mean_kld,
                ts=self.clock.time(), request_id=request_id,
                baseline_version=baseline_version, optimized_version=optimized_version)
            self._count_flips(before)
            if record is not None:
                self.telemetry.sink.offer(capture.item(record))
        except Exception:
            log.exception("capturing a parted prompt failed (the comparison is recorded)")

    def _capture(self, task: str, texts: list[str], baseline: ModelAnswer, optimized: ModelAnswer,
                 pairs: Sequence[PairOutcome], request_id: str) -> None:
        """Flipped inputs to the flip stream through the sink (rollout.flips); never raises."""
        capture = self.flips
        if not capture.enabled:
            return
        try:
            before = dict(capture.counts)
            records = capture.records(
                task=task, texts=texts, baseline=baseline.outputs,
                optimized=optimized.outputs, agreed=[p.agreed for p in pairs],
                ts=self.clock.time(), request_id=request_id,
                baseline_version=baseline.model_version,
                optimized_version=optimized.model_version)
            self._count_flips(before)
            sink = self.telemetry.sink
            for record in records if sink is not None else ():
                sink.offer(capture.item(record))
        except Exception:
            log.exception("capturing flipped inputs failed (the comparison is recorded)")

    def _count_flips(self, before: Mapping[str, int]) -> None:
        """The flip-capture outcomes met since `before` (the capture's counts then)."""
        for outcome, count in self.flips.counts.items():
            if count > before[outcome]:
                self.metrics.flips.add(count - before[outcome], {"outcome": outcome})

    def _record(self, target: Arm, outcome: str, fields: Mapping[str, float],
                pairs: Sequence[PairOutcome] = ()) -> None:
        """Metrics now, Redis through the sink; a telemetry failure is logged, never raised."""
        try:
            self.metrics.record(target.value, outcome, pairs)
            sink = self.telemetry.sink
            if sink is not None:
                sink.offer(ShadowItem(self.clock.time(), dict(fields)))
        except Exception:
            log.exception("recording a shadow comparison failed")

    def close(self) -> None:
        """Cancel the outstanding shadow calls (shutdown); safe from any thread."""
        for job in list(self.tasks):
            loop = job.get_loop()
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            try:
                if running is loop:
                    job.cancel()
                else:
                    loop.call_soon_threadsafe(job.cancel)
            except RuntimeError:  # the loop is already closed: nothing runs there any more
                pass
