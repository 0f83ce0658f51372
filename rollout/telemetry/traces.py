"""Recent traces as the embedded sink keeps them: span records, trace summaries, the reader.

A span record is a plain dict (stored as JSON):

    trace_id   32 hex digits          span_id, parent_id   16 hex digits (parent_id may be None)
    name, service                     start, end           epoch seconds (float)
    status     "ok" | "error" | "unset"                    error   description or None
    attrs      the span's attributes (str, int, float, bool)

Redis layout under `rollout:<app>:telemetry:` (all bounded):

    trace:<trace_id>   list of the trace's span records; expires after the trace TTL
    traces             sorted set: trace id -> its earliest span start; only the newest N kept
    request:<id>       the trace id of a request id; expires with the trace

A trace's spans arrive from several processes (gateway, model replicas) at different moments,
so a reader may see a trace before all of its spans have landed.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from rollout.telemetry.windows import MemoryHashes, telemetry_prefix

SpanRecord = Mapping  # the dict described above


def trace_key(app: str, trace_id: str) -> str:
    return f"{telemetry_prefix(app)}trace:{trace_id}"


def index_key(app: str) -> str:
    return f"{telemetry_prefix(app)}traces"


def request_key(app: str, request_id: str) -> str:
    return f"{telemetry_prefix(app)}request:{request_id}"


def request_sampled(request_id: str, ratio: float) -> bool:
    """Whether a request's trace is sampled when nothing else decides (no incoming sampled
    `traceparent`, no error, fallback or slow answer): by its request id alone, so that
    `rollout traces --request-id` can tell an unsampled request from an expired trace."""
    if ratio >= 1.0:
        return True
    if ratio <= 0.0:
        return False
    return zlib.crc32(request_id.encode("utf-8", "surrogatepass")) < ratio * 2 ** 32


def keep_reason(status: int, fallback: bool, latency_ms: float, slow_ms: float) -> str | None:
    """Why an unsampled request's trace is recorded after all, decided once it is answered:
    an error or refusal (any status from 400), a fallback, or an answer slower than
    `slow_ms`; None: nothing worth keeping."""
    if status >= 400:
        return "error"
    if fallback:
        return "fallback"
    if latency_ms >= slow_ms:
        return "slow"
    return None


@dataclass(frozen=True)
class TraceSummary:
    trace_id: str
    start: float
    duration_ms: float
    root: str  # the root span's name
    request_id: str | None
    arm: str | None  # the arm that answered
    status: int | None  # the HTTP status answered
    fallback: bool
    spans: int

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def roots(spans: Iterable[SpanRecord]) -> list[SpanRecord]:
    """Spans whose parent is not in the trace (the gateway's, or a caller's child), by start."""
    spans = list(spans)
    ids = {span["span_id"] for span in spans}
    return sorted((s for s in spans if s.get("parent_id") not in ids), key=lambda s: s["start"])


def summarize(trace_id: str, spans: list[SpanRecord]) -> TraceSummary:
    top = roots(spans)[0]
    attrs = top.get("attrs", {})
    start = min(span["start"] for span in spans)
    # a shadow comparison ends after the response (serve.gateway.shadow): not part of its duration
    end = max(span["end"] for span in spans if span["name"] != "shadow" or span is top)
    status = attrs.get("http.response.status_code")
    return TraceSummary(
        trace_id=trace_id,
        start=start,
        duration_ms=(end - start) * 1000,
        root=top["name"],
        request_id=attrs.get("canary.request_id"),
        arm=attrs.get("canary.arm"),
        status=int(status) if status is not None else None,
        fallback=bool(attrs.get("canary.fallback", False)),
        spans=len(spans),
    )


class TraceSource(Protocol):
    def recent_ids(self, last: int) -> list[str]:
        """Trace ids, newest first."""

    def spans(self, trace_ids: list[str]) -> list[list[SpanRecord]]:
        """Each trace's span records, in order; an empty list for a trace that has expired."""

    def trace_of_request(self, request_id: str) -> str | None: ...


class Traces:
    """Reads recent traces: summaries for a listing, and one trace's spans for a waterfall."""

    def __init__(self, source: TraceSource):
        self.source = source

    def recent(self, last: int = 20) -> list[TraceSummary]:
        ids = self.source.recent_ids(last)
        found = zip(ids, self.source.spans(ids), strict=True)
        return [summarize(trace_id, spans) for trace_id, spans in found if spans]

    def get(self, trace_id: str) -> list[SpanRecord]:
        return sorted(self.source.spans([trace_id])[0], key=lambda s: s["start"])

    def by_request(self, request_id: str) -> tuple[str, list[SpanRecord]] | None:
        trace_id = self.source.trace_of_request(request_id)
        if trace_id is None:
            return None
        return trace_id, self.get(trace_id)


class MemoryTraces:
    """An in-memory twin of the Redis trace store (no expiry, no cap), for unit tests."""

    def __init__(self) -> None:
        self.traces: dict[str, list[SpanRecord]] = {}
        self.requests: dict[str, str] = {}

    def add_spans(self, records: Iterable[SpanRecord]) -> None:
        for record in records:
            self.traces.setdefault(record["trace_id"], []).append(record)
            request_id = record.get("attrs", {}).get("canary.request_id")
            if request_id:
                self.requests[request_id] = record["trace_id"]

    def recent_ids(self, last: int) -> list[str]:
        by_start = sorted(self.traces, key=lambda t: min(s["start"] for s in self.traces[t]))
        return by_start[::-1][:last]

    def spans(self, trace_ids: list[str]) -> list[list[SpanRecord]]:
        return [list(self.traces.get(tid, [])) for tid in trace_ids]

    def trace_of_request(self, request_id: str) -> str | None:
        return self.requests.get(request_id)


class MemoryTelemetry(MemoryHashes, MemoryTraces):
    """Both in-memory twins in one object, as RedisTelemetry is both sources in one."""

    def __init__(self) -> None:
        MemoryHashes.__init__(self)
        MemoryTraces.__init__(self)
