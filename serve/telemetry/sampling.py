"""Which traces are recorded: a share of requests by their id, and every one worth a look.

- **Head.** A new trace is recorded for `trace_sample_ratio` of the requests, chosen by request id
  (rollout.telemetry.traces `request_sampled`: the same id always gets the same answer, so
  `rollout traces --request-id` can say a request was not sampled); an incoming `traceparent`'s
  decision is followed, as the W3C and OpenTelemetry's `ParentBased` sampler do, so a client
  that samples its own trace always gets the gateway's and the model's spans in it. The model
  replica follows the gateway's decision through the `traceparent` it is sent.
- **Tail.** An unsampled request that ends in an error or refusal, a fallback, or an answer
  slower than `trace_slow_ms` (rollout.telemetry.traces `keep_reason`) is recorded once it is
  answered, from the timestamps its observation kept (serve.telemetry.observe): the gateway's
  spans with their own times, marked `canary.kept` with the reason, in the trace whose id its log
  line names. The model replica recorded nothing for it (it was told the trace was unsampled),
  so such a trace holds the gateway's side only.

`KeptOrSampled` lets such after-the-fact spans through whatever the ratio says;
`PrimedIds` gives the after-the-fact root span the trace id the request already had.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from opentelemetry.context import Context
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import (
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.trace import Link, SpanKind
from opentelemetry.trace.span import TraceState
from opentelemetry.util.types import Attributes

from rollout.telemetry.traces import request_sampled

KEPT = "canary.kept"  # a span recorded after the fact, and why (error, fallback, slow)
REQUEST_ID = "canary.request_id"


class ByRequestId(Sampler):
    """A new trace's decision: by the request id among its attributes (`request_sampled`),
    else by trace id (`TraceIdRatioBased`), at `ratio`."""

    def __init__(self, ratio: float):
        self.ratio = ratio
        self._by_trace_id = TraceIdRatioBased(ratio)

    def should_sample(self, parent_context: Context | None, trace_id: int, name: str,
                      kind: SpanKind | None = None, attributes: Attributes = None,
                      links: Sequence[Link] | None = None,
                      trace_state: TraceState | None = None) -> SamplingResult:
        request_id = (attributes or {}).get(REQUEST_ID)
        if not isinstance(request_id, str):
            return self._by_trace_id.should_sample(parent_context, trace_id, name, kind,
                                                   attributes, links, trace_state)
        decision = (Decision.RECORD_AND_SAMPLE if request_sampled(request_id, self.ratio)
                    else Decision.DROP)
        return SamplingResult(decision, attributes if decision.is_sampled() else None,
                              trace_state)

    def get_description(self) -> str:
        return f"ByRequestId{{{self.ratio}}}"


class KeptOrSampled(Sampler):
    """Records a span marked `canary.kept` (recorded after the fact), else decides as
    `ParentBased(ByRequestId(ratio))`."""

    def __init__(self, ratio: float):
        self._sampled = ParentBased(ByRequestId(ratio))

    def should_sample(self, parent_context: Context | None, trace_id: int, name: str,
                      kind: SpanKind | None = None, attributes: Attributes = None,
                      links: Sequence[Link] | None = None,
                      trace_state: TraceState | None = None) -> SamplingResult:
        if attributes and KEPT in attributes:
            return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes, trace_state)
        return self._sampled.should_sample(parent_context, trace_id, name, kind, attributes,
                                           links, trace_state)

    def get_description(self) -> str:
        return f"KeptOrSampled{{{self._sampled.get_description()}}}"


class PrimedIds(RandomIdGenerator):
    """Random ids, except a trace id primed on this thread (`prime`), used once: the root span
    recorded after the fact keeps the trace id its request was logged with."""

    def __init__(self) -> None:
        self._primed = threading.local()

    def prime(self, trace_id: int) -> None:
        self._primed.trace_id = trace_id

    def generate_trace_id(self) -> int:
        primed = getattr(self._primed, "trace_id", None)
        if primed:
            self._primed.trace_id = None
            return primed
        return super().generate_trace_id()
