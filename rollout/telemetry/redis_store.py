"""The embedded telemetry store in Redis: the sink's writer, and the readers' source.

Writes (from the sink's thread, one pipeline per batch): per-arm window increments
(rollout.telemetry.windows), shadow agreement increments (rollout.shadow) and span records
(rollout.telemetry.traces), and captured flips (rollout.flips). Every key it writes expires, the
trace index is trimmed to the newest `max_traces` and each trace to `MAX_SPANS` spans, the flip
stream by length and age, so the telemetry in Redis stays bounded whatever the traffic.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import redis

from rollout.errors import StoreUnavailable
from rollout.flips import FlipItem, FlipRecord
from rollout.redis_conn import open_client
from rollout.redis_layout import Keys
from rollout.redis_store import UNAVAILABLE, unavailable
from rollout.shadow import ShadowItem, merge_shadow
from rollout.telemetry.traces import SpanRecord, index_key, request_key, trace_key
from rollout.telemetry.windows import RequestRecord, merge_fields

MAX_SPANS = 256  # per trace


@dataclass(frozen=True)
class WindowItem:
    """A finished request for the windows, stamped with its wall-clock time."""

    ts: float
    record: RequestRecord


class RedisTelemetry:
    def __init__(
        self,
        url: str,
        app: str,
        *,
        timeout_s: float = 2.0,
        max_traces: int = 2_000,
        trace_ttl_s: int = 3_600,
        window_ttl_s: int = 3_600,
    ):
        self.url, self.app = url, app
        self.max_traces, self.trace_ttl_s, self.window_ttl_s = max_traces, trace_ttl_s, window_ttl_s
        self._client = open_client(url, timeout_s=timeout_s)  # telemetry: no WAIT

    # --- writer ---------------------------------------------------------------------------

    def write(self, items: Sequence[object]) -> None:
        """Write a batch of WindowItem, ShadowItem and span items (span records, or objects with
        a `span_record()` method that returns one). Raises StoreUnavailable when Redis fails."""
        windows, shadows, spans, flips = [], [], [], []
        for item in items:
            if isinstance(item, WindowItem):
                windows.append((item.ts, item.record))
            elif isinstance(item, ShadowItem):
                shadows.append(item)
            elif isinstance(item, FlipItem):
                flips.append(item)
            else:
                spans.append(item if isinstance(item, Mapping) else item.span_record())
        pipe = self._client.pipeline(transaction=False)
        counters = merge_fields(windows, self.app)
        counters.update(merge_shadow(shadows, self.app))
        for key, fields in counters.items():
            for name, amount in fields.items():
                pipe.hincrbyfloat(key, name, amount)
            pipe.expire(key, self.window_ttl_s)
        if spans:
            self._write_spans(pipe, spans)
        if flips:
            self._write_flips(pipe, flips)
        self._call(pipe.execute)

    def _write_flips(self, pipe, flips: list[FlipItem]) -> None:
        """XADD each (MAXLEN ~ its max), then trim what is older than the TTL before the
        newest flip's time (stream ids are Redis's clock in ms), and renew the key's TTL."""
        key = Keys(self.app).flips
        for item in flips:
            pipe.xadd(key, item.record.fields(), maxlen=item.max_len, approximate=True)
        newest = max(flips, key=lambda item: item.record.ts)
        cutoff_ms = max(0, int((newest.record.ts - newest.ttl_s) * 1000))
        pipe.xtrim(key, minid=cutoff_ms, approximate=False)
        pipe.expire(key, newest.ttl_s)

    def _write_spans(self, pipe, spans: list[SpanRecord]) -> None:
        by_trace: dict[str, list[SpanRecord]] = {}
        for span in spans:
            by_trace.setdefault(span["trace_id"], []).append(span)
        index = index_key(self.app)
        for trace_id, records in by_trace.items():
            key = trace_key(self.app, trace_id)
            pipe.rpush(key, *(json.dumps(r, separators=(",", ":")) for r in records))
            pipe.ltrim(key, 0, MAX_SPANS - 1)
            pipe.expire(key, self.trace_ttl_s)
            pipe.zadd(index, {trace_id: min(r["start"] for r in records)}, lt=True)
            for record in records:
                request_id = record.get("attrs", {}).get("canary.request_id")
                if request_id:
                    pipe.set(request_key(self.app, request_id), trace_id, ex=self.trace_ttl_s)
        pipe.zremrangebyrank(index, 0, -(self.max_traces + 1))

    # --- sources for windows.Windows and traces.Traces (rollout.telemetry) -------------------

    def hashes(self, keys: list[str]) -> list[Mapping[str, str]]:
        pipe = self._client.pipeline(transaction=False)
        for key in keys:
            pipe.hgetall(key)
        return self._call(pipe.execute)

    def recent_ids(self, last: int) -> list[str]:
        return self._call(self._client.zrevrange, index_key(self.app), 0, last - 1)

    def spans(self, trace_ids: list[str]) -> list[list[SpanRecord]]:
        pipe = self._client.pipeline(transaction=False)
        for trace_id in trace_ids:
            pipe.lrange(trace_key(self.app, trace_id), 0, -1)
        rows = self._call(pipe.execute)
        return [[json.loads(raw) for raw in row] for row in rows]

    def flips(self, last: int) -> list[FlipRecord]:
        """The newest `last` captured flips (rollout.flips), oldest first."""
        rows = self._call(self._client.xrevrange, Keys(self.app).flips, count=last)
        return [FlipRecord.from_fields(entry_id, fields) for entry_id, fields in reversed(rows)]

    def trace_of_request(self, request_id: str) -> str | None:
        return self._call(self._client.get, request_key(self.app, request_id))

    def _call(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UNAVAILABLE as exc:
            raise unavailable(exc, self.url) from None
        except redis.RedisError as exc:
            raise StoreUnavailable(f"Redis telemetry error: {type(exc).__name__}: {exc}") from None

    def close(self) -> None:
        self._client.close()
