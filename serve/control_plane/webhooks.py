"""Webhook delivery: rollout events (rollout.events) POSTed to the configured URLs, off every
request path and off the ramp controller's evaluation.

`WebhookSender.send` only appends to a queue and returns. Each URL has its own bounded queue and
one worker thread, so a receiver that is down or hangs delays only its own events:

- Order: a URL's events are delivered one at a time, in the order they were sent; an event
  being retried holds back the ones behind it (a receiver down for a minute then gets every
  event, in order).
- Bounded: a queue holds at most `queue_size` events; sending to a full one drops its oldest
  event (counted as `dropped`). An attempt lasts at most `timeout_s` per socket operation.
- Retries: a connection error, a timeout, a 5xx or a 429 is retried with exponential backoff
  (1 s doubling to 60 s, each delay scaled by a random 0.5-1.0) until `retry_for_s` has passed
  since the first attempt; then the event is given up (`given_up`). Any other answer that is not
  2xx (a 4xx, a redirect: redirects are not followed) is given up at once. Every failed attempt
  counts in `failed_attempts`, with the last error and when.
- Once per (event id, URL): a bounded in-process set of delivered pairs, and a `Ledger` claim
  (serve.control_plane.notify.RedisLedger: `SET NX` with a TTL) taken before the first attempt, so
  two processes that both see an event deliver it once. A given-up event releases its claim.
- Signed: with a secret, `X-Canary-Signature: sha256=<hex HMAC-SHA256 of the body>`; always
  `X-Canary-Event-Id` and `Content-Type: application/json`.

Counters go to the ledger (the Redis hash `rollout:<app>:webhooks`, read by `rollout status`)
and stay in `stats()`. URLs hold tokens: logs and errors name them through
rollout.events.redact_webhook only. The clock, the sleep between attempts, the jitter and the
HTTP call are injectable, so tests run minutes of backoff without waiting.
"""

from __future__ import annotations

import http.client
import logging
import random
import threading
import time
import urllib.error
import urllib.request
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from rollout.clock import Clock, SystemClock
from rollout.events import (
    EVENT_ID_HEADER,
    SIGNATURE_HEADER,
    Event,
    EventFilter,
    redact_webhook,
    sign,
)
from rollout.settings import WebhookSettings

log = logging.getLogger("canary.webhooks")

BASE_BACKOFF_S = 1.0
MAX_BACKOFF_S = 60.0
DELIVERED_MEMORY = 10_000  # (event id, URL) pairs remembered in process


class Ledger(Protocol):
    """Where deliveries are claimed and counted, shared by every process of an application."""

    def claim(self, event_id: str, url: str) -> bool:
        """True when this process may deliver the event to `url` (nobody claimed it yet)."""

    def release(self, event_id: str, url: str) -> None:
        """Give a claim back (the event was given up): a later delivery may try again."""

    def record(self, counts: Mapping[str, int], fields: Mapping[str, str]) -> None:
        """Add `counts` to the counters and set `fields` (last error, timestamps)."""


class MemoryLedger:
    """The in-process ledger: one process's claims, counters and (serve.control_plane.notify) audit
    cursor."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.claims: set[tuple[str, str]] = set()
        self.counters: dict[str, str | int] = {}
        self.cursor: str | None = None

    def get_cursor(self) -> str | None:
        return self.cursor

    def set_cursor(self, entry_id: str) -> None:
        self.cursor = entry_id

    def claim(self, event_id: str, url: str) -> bool:
        with self._lock:
            if (event_id, url) in self.claims:
                return False
            self.claims.add((event_id, url))
            return True

    def release(self, event_id: str, url: str) -> None:
        with self._lock:
            self.claims.discard((event_id, url))

    def record(self, counts: Mapping[str, int], fields: Mapping[str, str]) -> None:
        with self._lock:
            for name, n in counts.items():
                self.counters[name] = int(self.counters.get(name, 0)) + n
            self.counters.update(fields)


Post = Callable[[str, bytes, Mapping[str, str], float], int]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None  # a 3xx comes back as its status: not followed, not retried


_OPENER = urllib.request.build_opener(_NoRedirect())


def post_json(url: str, body: bytes, headers: Mapping[str, str], timeout_s: float) -> int:
    """POST `body`; the HTTP status. Raises OSError (or http.client.HTTPException) when no
    status came back: refused, unreachable, timed out, cut off."""
    request = urllib.request.Request(url, data=body, headers=dict(headers), method="POST")
    try:
        with _OPENER.open(request, timeout=timeout_s) as response:
            response.read(65_536)
            return response.status
    except urllib.error.HTTPError as exc:
        exc.close()
        return exc.code


def _retryable(status: int) -> bool:
    return status == 429 or status >= 500


@dataclass
class _Item:
    event: Event
    body: bytes
    mark: str | None  # what the caller tracks the event by (the audit entry id)


class _Channel:
    """One URL's queue and worker."""

    def __init__(self, url: str, size: int):
        self.url, self.safe_url, self.size = url, redact_webhook(url), size
        self.queue: deque[_Item] = deque()
        self.busy: _Item | None = None
        self.cond = threading.Condition()
        self.dropped = 0  # dropped since the worker last recorded
        self.thread: threading.Thread | None = None

    def put(self, item: _Item) -> bool:
        """Queue `item`; False when the oldest event was dropped to make room."""
        with self.cond:
            full = len(self.queue) >= self.size
            if full:
                self.queue.popleft()
                self.dropped += 1
            self.queue.append(item)
            self.cond.notify_all()
        return not full

    def marks(self) -> set[str]:
        with self.cond:
            items = [*self.queue, *([self.busy] if self.busy else [])]
        return {item.mark for item in items if item.mark is not None}

    def idle(self) -> bool:
        with self.cond:
            return not self.queue and self.busy is None


class WebhookSender:
    def __init__(
        self, urls: Iterable[str], *, secret: str | None = None, timeout_s: float = 5.0,
        retry_for_s: float = 600.0, queue_size: int = 1_000, ledger: Ledger | None = None,
        event_filter: EventFilter | None = None, post: Post = post_json,
        sleep: Callable[[float], object] | None = None, clock: Clock | None = None,
        jitter: Callable[[], float] = random.random, name: str = "webhooks",
    ):
        self.secret, self.timeout_s, self.retry_for_s = secret, timeout_s, retry_for_s
        self.ledger = ledger or MemoryLedger()
        self.filter = event_filter or EventFilter()
        self.post, self.clock, self.jitter = post, clock or SystemClock(), jitter
        self._stop = threading.Event()
        self.sleep = sleep or self._stop.wait
        self._lock = threading.Lock()
        self._delivered: OrderedDict[tuple[str, str], None] = OrderedDict()
        self.counters = {"delivered": 0, "failed_attempts": 0, "dropped": 0, "given_up": 0,
                         "duplicates": 0}
        self.channels = [_Channel(url, queue_size) for url in dict.fromkeys(urls)]
        for i, channel in enumerate(self.channels):
            channel.thread = threading.Thread(target=self._work, args=(channel,),
                                              name=f"{name}-{i}", daemon=True)
            channel.thread.start()

    # --- the caller's side: never blocks --------------------------------------------------

    def send(self, event: Event, mark: str | None = None) -> bool:
        """Queue `event` for every URL if the filter accepts it; False when it does not."""
        if not self.channels or not self.filter.accepts(event):
            return False
        item = _Item(event, event.body(), mark)
        for channel in self.channels:
            if not channel.put(item):
                log.warning("webhook queue of %s full: dropped its oldest event",
                            channel.safe_url)
        return True

    def outstanding(self) -> set[str]:
        """The marks of events queued or in delivery on any URL."""
        return set().union(*(channel.marks() for channel in self.channels))

    def idle(self) -> bool:
        return all(channel.idle() for channel in self.channels)

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait (real time) until nothing is queued or in delivery; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while not self.idle():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def stats(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counters)

    def close(self, timeout_s: float = 2.0) -> None:
        """Stop the workers: an event in delivery is abandoned (its claim released)."""
        self._stop.set()
        for channel in self.channels:
            with channel.cond:
                channel.cond.notify_all()
        for channel in self.channels:
            if channel.thread is not None:
                channel.thread.join(timeout_s)

    # --- the workers ----------------------------------------------------------------------

    def _work(self, channel: _Channel) -> None:
        while True:
            with channel.cond:
                while not channel.queue and not self._stop.is_set():
                    channel.cond.wait()
                if self._stop.is_set():
                    return
                channel.busy = item = channel.queue.popleft()
                dropped, channel.dropped = channel.dropped, 0
            try:
                if dropped:
                    self._count({"dropped": dropped}, last_dropped_ts=f"{self.clock.time():.3f}")
                self._deliver(channel, item)
            except Exception:  # a bug must not stop this URL's deliveries
                log.exception("webhook delivery to %s failed unexpectedly", channel.safe_url)
            finally:
                with channel.cond:
                    channel.busy = None
                    channel.cond.notify_all()

    def _deliver(self, channel: _Channel, item: _Item) -> None:
        """Deliver one event to one URL: claim, attempt, back off, until done or given up."""
        key = (item.event.id, channel.url)
        if not self._claim(key):
            self._count({"duplicates": 1})
            return
        headers = self._headers(item)
        started, attempt = self.clock.monotonic(), 0
        while True:
            attempt += 1
            status, error = self._attempt(channel.url, item.body, headers)
            if error is None:
                self._delivered_now(key)
                return
            self._failed(channel, item, error)
            delay = self._backoff(attempt)
            final = status is not None and not _retryable(status)
            if final or self.clock.monotonic() - started + delay > self.retry_for_s:
                self._give_up(channel, item, key, attempt, error)
                return
            self.sleep(delay)
            if self._stop.is_set():
                self._release(key)
                return

    def _claim(self, key: tuple[str, str]) -> bool:
        """Whether this process delivers `key`: not delivered here, and claimed in the ledger
        (a ledger that cannot be reached does not stop a delivery: at least once)."""
        with self._lock:
            if key in self._delivered:
                return False
        try:
            return self.ledger.claim(*key)
        except Exception as exc:
            log.warning("webhook claim not recorded, delivering anyway: %s", exc)
            return True

    def _release(self, key: tuple[str, str]) -> None:
        try:
            self.ledger.release(*key)
        except Exception as exc:
            log.warning("webhook claim not released: %s", exc)

    def _headers(self, item: _Item) -> dict[str, str]:
        headers = {"Content-Type": "application/json", EVENT_ID_HEADER: item.event.id,
                   "User-Agent": "canary-gateway-webhooks"}
        if self.secret:
            headers[SIGNATURE_HEADER] = sign(item.body, self.secret)
        return headers

    def _attempt(self, url: str, body: bytes, headers: dict) -> tuple[int | None, str | None]:
        """(status, error): error None on a 2xx; status None when no answer came back."""
        try:
            status = self.post(url, body, headers, self.timeout_s)
        except (OSError, http.client.HTTPException) as exc:
            return None, f"{type(exc).__name__}: {_reason(exc)}"
        if 200 <= status < 300:
            return status, None
        return status, f"HTTP {status}"

    def _backoff(self, attempt: int) -> float:
        delay = min(MAX_BACKOFF_S, BASE_BACKOFF_S * 2 ** (attempt - 1))
        return delay * (0.5 + self.jitter() / 2)

    def _delivered_now(self, key: tuple[str, str]) -> None:
        with self._lock:
            self._delivered[key] = None
            while len(self._delivered) > DELIVERED_MEMORY:
                self._delivered.popitem(last=False)
        self._count({"delivered": 1}, last_delivered_ts=f"{self.clock.time():.3f}")

    def _failed(self, channel: _Channel, item: _Item, error: str) -> None:
        log.warning("webhook %s to %s failed: %s", item.event.id, channel.safe_url, error)
        self._count({"failed_attempts": 1}, last_error=f"{channel.safe_url}: {error}",
                    last_error_ts=f"{self.clock.time():.3f}")

    def _give_up(self, channel, item, key, attempts: int, error: str) -> None:
        log.error("webhook %s to %s given up after %d attempt(s): %s", item.event.id,
                  channel.safe_url, attempts, error)
        self._release(key)
        self._count({"given_up": 1}, last_given_up_ts=f"{self.clock.time():.3f}")

    def _count(self, counts: dict[str, int], **fields: str) -> None:
        with self._lock:
            for name, n in counts.items():
                self.counters[name] = self.counters.get(name, 0) + n
        try:
            self.ledger.record(counts, fields)
        except Exception as exc:
            log.warning("webhook counters not recorded: %s", exc)


def _reason(exc: BaseException) -> str:
    """The cause of a failed attempt, in one line (urllib wraps it in URLError.reason)."""
    reason = getattr(exc, "reason", None)
    text = str(reason if reason is not None else exc) or type(exc).__name__
    return text.splitlines()[0][:200]


def sender_from(settings: WebhookSettings, ledger: Ledger | None = None,
                **kwargs) -> WebhookSender | None:
    """The sender the webhook settings ask for; None when no URL is configured."""
    if not settings.webhook_urls:
        return None
    secret = settings.webhook_secret.get_secret_value() if settings.webhook_secret else None
    return WebhookSender(
        settings.webhook_urls, secret=secret, timeout_s=settings.webhook_timeout_s,
        retry_for_s=settings.webhook_retry_for_s, queue_size=settings.webhook_queue,
        ledger=ledger,
        event_filter=EventFilter.of(settings.webhook_kinds, settings.webhook_min_severity),
        **kwargs,
    )
