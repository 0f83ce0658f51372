"""Where notifications come from: the audit tailer (in the ramp controller deployment) and the
gateway's store-outage events, and the Redis ledger both deliver through.

`AuditTailer` reads the audit stream after a cursor kept in Redis (`rollout:<app>:notify:cursor`),
turns entries into events (rollout.events.event_from_audit) and hands them to a
serve.control_plane.webhooks.WebhookSender. It runs in its own thread, never inside the ramp
controller's tick, and only in the replica that holds the ramp controller's lease (`leader`), so one
process per application notifies. The cursor moves past an entry only once every URL has
finished with it (delivered, given up or dropped): a restarted controller neither resends what
was delivered nor misses what was not. With no cursor yet (a fresh application), it starts at
the stream's end: history is not replayed. Two processes that briefly both tail (a lease
changing hands) deliver each event once: the ledger's claims (`RedisLedger`) decide.

`StoreOutageNotifier` is the gateway's: StateWatcher calls it when the gateway's copy of the
state turns stale (Redis is likely down) and when it is fresh again; it posts `store-stale` /
`store-recovered` through the gateway's own sender.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import deque
from collections.abc import Callable

from rollout.clock import Clock, SystemClock
from rollout.errors import RolloutError
from rollout.events import event_from_audit, store_event
from rollout.redis_conn import open_client
from rollout.redis_layout import Keys
from rollout.redis_store import call_redis
from rollout.settings import StateSettings, WebhookSettings
from rollout.store import StateStore
from rollout.watcher import StateView
from serve.control_plane.webhooks import WebhookSender, sender_from

log = logging.getLogger("canary.notify")

START = "0-0"  # before the first entry of a stream
CLAIM_TTL_S = 7 * 86_400  # how long a delivered (event, URL) pair is remembered in Redis


class RedisLedger:
    """The webhooks ledger in Redis: claims `notify:sent:<sha>` (SET NX, expiring) and the
    counters hash `webhooks`. Failures raise RolloutError; the sender logs them and goes on."""

    def __init__(self, url: str, app: str, *, timeout_s: float = 2.0,
                 claim_ttl_s: float = CLAIM_TTL_S):
        self.url, self.keys, self.claim_ttl_ms = url, Keys(app), int(claim_ttl_s * 1000)
        self._client = open_client(url, timeout_s=timeout_s)

    def _key(self, event_id: str, url: str) -> str:
        digest = hashlib.sha256(f"{event_id}\n{url}".encode()).hexdigest()[:32]
        return self.keys.notify_sent(digest)

    def claim(self, event_id: str, url: str) -> bool:
        return bool(call_redis(self.url, self._client.set, self._key(event_id, url), "1",
                               nx=True, px=self.claim_ttl_ms))

    def release(self, event_id: str, url: str) -> None:
        call_redis(self.url, self._client.delete, self._key(event_id, url))

    def record(self, counts, fields) -> None:
        pipe = self._client.pipeline(transaction=False)
        for name, n in counts.items():
            pipe.hincrby(self.keys.webhooks, name, n)
        if fields:
            pipe.hset(self.keys.webhooks, mapping=dict(fields))
        call_redis(self.url, pipe.execute)

    def counters(self) -> dict[str, str]:
        return call_redis(self.url, self._client.hgetall, self.keys.webhooks)

    def get_cursor(self) -> str | None:
        return call_redis(self.url, self._client.get, self.keys.notify_cursor)

    def set_cursor(self, entry_id: str) -> None:
        call_redis(self.url, self._client.set, self.keys.notify_cursor, entry_id)

    def close(self) -> None:
        self._client.close()


class AuditTailer:
    def __init__(self, states: StateStore, ledger: RedisLedger, sender: WebhookSender,
                 app: str, *, leader: Callable[[], bool] = lambda: True, batch: int = 100):
        self.states, self.ledger, self.sender, self.app = states, ledger, sender, app
        self.leader, self.batch = leader, batch
        self.position: str | None = None  # the last entry read (None: not started)
        self.unsettled: deque[str] = deque()  # entries read, not yet behind the cursor
        self.sent = 0

    def step(self) -> int:
        """Read what was appended since the last step, send its events, move the cursor.
        The number of entries read; 0 when not the leader."""
        if not self.leader():
            self.position = None  # a leader again later starts from the stored cursor
            self.unsettled.clear()
            return 0
        if self.position is None:
            self.position = self._start()
        entries = self.states.audit_after(self.position, self.batch)
        for entry in entries:
            event = event_from_audit(entry, self.app)
            if event is not None and self.sender.send(event, mark=entry.id):
                self.sent += 1
            self.unsettled.append(entry.id)
            self.position = entry.id
        self.settle()
        return len(entries)

    def _start(self) -> str:
        """The stored cursor, or (a fresh application) the stream's end, stored."""
        cursor = self.ledger.get_cursor()
        if cursor is None:
            last = self.states.audit(last=1)
            cursor = last[0].id if last else START
            self.ledger.set_cursor(cursor)
        return cursor

    def settle(self) -> None:
        """Move the stored cursor to the newest entry read that no URL still has to deliver
        (nor any entry before it)."""
        outstanding, settled = self.sender.outstanding(), None
        while self.unsettled and self.unsettled[0] not in outstanding:
            settled = self.unsettled.popleft()
        if settled is not None:
            self.ledger.set_cursor(settled)

    def run(self, stop: threading.Event, poll_s: float = 1.0) -> None:
        """Step every `poll_s` until `stop`; store errors are logged and the loop goes on."""
        while not stop.is_set():
            try:
                while self.step() >= self.batch and not stop.is_set():
                    pass  # a backlog: read on at once
            except RolloutError as exc:
                log.warning("notifications: %s", exc)
                self.position = None  # re-read the stored cursor once the store answers
                self.unsettled.clear()
            except Exception:
                log.exception("notifications: unexpected error")
                self.position = None
                self.unsettled.clear()
            stop.wait(poll_s)


class StoreOutageNotifier:
    """The gateway's `on_stale` hook for rollout.watcher.StateWatcher."""

    def __init__(self, sender: WebhookSender, app: str, gateway: str,
                 clock: Clock | None = None):
        self.sender, self.app, self.gateway = sender, app, gateway
        self.clock = clock or SystemClock()
        self.since: float | None = None  # when the current outage was noticed

    def __call__(self, stale: bool, view: StateView) -> None:
        now = self.clock.time()
        if stale:
            self.since = now
        elif self.since is None:
            return
        event = store_event(self.app, self.gateway, stale=stale, since=self.since, now=now,
                            error=view.error)
        if not stale:
            self.since = None
        self.sender.send(event)


class Notifications:
    """The controller deployment's notifier: a tailer thread and its sender (close both)."""

    def __init__(self, tailer: AuditTailer, ledger: RedisLedger, stop: threading.Event,
                 poll_s: float):
        self.tailer, self.ledger, self.stop = tailer, ledger, stop
        self.thread = threading.Thread(target=tailer.run, args=(stop, poll_s),
                                       name="notifications", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.tailer.sender.close()
        self.ledger.close()


def start_notifications(control: StateSettings, webhooks: WebhookSettings, states: StateStore,
                        *, leader: Callable[[], bool], stop: threading.Event,
                        poll_s: float = 1.0) -> Notifications | None:
    """Tail the audit stream into the webhooks `webhooks` configures; None when none is.
    `control`: the control connection's state settings (the `controller` Redis user)."""
    ledger = RedisLedger(control.redis_url, control.app_name, timeout_s=control.redis_timeout_s)
    sender = sender_from(webhooks, ledger, name="webhooks")
    if sender is None:
        ledger.close()
        return None
    log.info("notifications to %d webhook URL(s)", len(sender.channels))
    tailer = AuditTailer(states, ledger, sender, control.app_name, leader=leader)
    return Notifications(tailer, ledger, stop, poll_s)
