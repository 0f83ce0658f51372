"""The Redis state store.

The keys (`rollout:<app>:state`, `history`, `audit`, `changes`, `deployed`, `verdicts`) and the
scripts that write them are laid out in rollout.redis_layout. The write is one Lua script, so
checking the revision, writing the state, recording history, appending the audit entry and
notifying gateways happen atomically or not at all.

It connects through rollout.redis_conn (one Redis, or the primary Redis Sentinel names), and a
state change or a note waits for the replicas the settings require (`WAIT`): NotAcknowledged
when too few have it in time.
"""

from __future__ import annotations

import json

import redis
from pydantic import ValidationError

from rollout.errors import (
    PermissionDenied,
    RevisionConflict,
    RevisionNotFound,
    StateUnreadable,
    StoreRefused,
    StoreUnavailable,
)
from rollout.redis_conn import (
    Acknowledgement,
    durable_script,
    open_client,
    redact_url,
    wrote_first,
)
from rollout.redis_layout import CAS, NOTE, Keys
from rollout.state import AuditEntry, DeploymentReport, RolloutState
from rollout.store import StateStore, Subscription, check_successor
from rollout.verdict import Verdict

# the redis-py errors that mean "the store cannot be reached" (the telemetry store's too)
UNAVAILABLE = (redis.ConnectionError, redis.TimeoutError, redis.AuthenticationError)


def unavailable(exc: Exception, url: str) -> StoreUnavailable:
    """One of UNAVAILABLE as the domain's StoreUnavailable, the URL's password redacted."""
    safe = redact_url(url)
    error = StoreUnavailable(f"cannot reach Redis at {safe}: {type(exc).__name__}: {exc}")
    # a refused password stays refused: the kill does not retry it across a failover
    error.transient = not isinstance(exc, redis.AuthenticationError)
    return error


def call_redis(url: str, fn, *args, **kwargs):
    """One Redis call: connection trouble becomes StoreUnavailable, a refused permission
    PermissionDenied and any other error reply StoreRefused (READONLY, OOM, MISCONF, BUSY, a
    script error), with the URL's password masked in each message."""
    try:
        return fn(*args, **kwargs)
    except UNAVAILABLE as exc:
        raise unavailable(exc, url) from None
    except redis.exceptions.NoPermissionError as exc:
        raise PermissionDenied(
            f"Redis at {redact_url(url)} refused: {str(exc).splitlines()[0]}"
        ) from None
    except redis.RedisError as exc:  # ResponseError and its kinds, DataError, ...
        raise StoreRefused.from_reply(_reply_text(exc), redact_url(url)) from None


def _reply_text(exc: Exception) -> str:
    """The error reply as Redis worded it: redis-py strips the first word of the kinds it has
    a type for (READONLY, OOM, NOSCRIPT, ERR...) and keeps it as `status_code`."""
    text = str(exc) or type(exc).__name__
    word = getattr(exc, "status_code", None)
    if isinstance(word, str) and word and not text.startswith(word):
        return f"{word} {text}"
    return text


def memory_limits(client, url: str) -> tuple[int, str]:
    """Redis' `maxmemory` (0: none) and `maxmemory-policy`, from `INFO memory` (a user refused
    INFO raises PermissionDenied)."""
    info = call_redis(url, client.info, "memory")
    return int(info.get("maxmemory", 0)), str(info.get("maxmemory_policy", "noeviction"))


def eviction_warning(policy: str) -> str | None:
    """What to tell an operator whose Redis may evict the rollout state, or None: every
    `allkeys-*` policy may drop the state, the audit log or the kill switch under memory
    pressure (the `volatile-*` ones drop only keys with an expiry, which the state has not)."""
    if not policy.startswith("allkeys-"):
        return None
    return (f"Redis' maxmemory-policy is {policy}: under memory pressure it may evict the "
            "rollout state and the kill switch with it; use noeviction or a volatile-* policy "
            "(docs/production.md#redis-memory-and-error-replies)")


def read_state(raw: str | None):
    """A stored state's JSON as a RolloutState (the default when there is none); a document
    this version cannot read is StateUnreadable."""
    if not raw:
        return RolloutState()
    try:
        return RolloutState.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the document"
        raise StateUnreadable(
            f"the stored rollout state cannot be read by this version: {where}: {first['msg']}"
        ) from None


class _RedisSubscription(Subscription):
    def __init__(self, store: RedisStateStore):
        self._store = store
        self._pubsub = store._client.pubsub()
        try:
            self._pubsub.subscribe(store.channel)
            # Read the server's confirmation before returning: from then on no change can be
            # missed, and the first wait() cannot mistake the confirmation for "no change".
            confirmation = self._pubsub.get_message(timeout=store.timeout_s)
        except UNAVAILABLE as exc:
            self._pubsub.close()
            raise unavailable(exc, store.url) from None
        if not confirmation or confirmation["type"] != "subscribe":
            self._pubsub.close()
            raise StoreUnavailable(
                f"Redis at {redact_url(store.url)} did not confirm the subscription"
            )
        self._pubsub.ignore_subscribe_messages = True

    def wait(self, timeout: float) -> bool:
        try:
            fired = self._pubsub.get_message(timeout=timeout) is not None
            # Drain a burst of notifications: one refresh covers them all.
            while self._pubsub.get_message(timeout=0) is not None:
                pass
            return fired
        except UNAVAILABLE as exc:
            raise unavailable(exc, self._store.url) from None

    def close(self) -> None:
        try:
            self._pubsub.close()
        except UNAVAILABLE:
            pass


class RedisStateStore(StateStore):
    def __init__(self, url: str, app: str, *, timeout_s: float = 2.0,
                 ack: Acknowledgement | None = None):
        self.url = url
        self.app = app
        self.timeout_s = timeout_s
        self.ack = ack or Acknowledgement()  # state changes and notes wait for replicas
        keys = Keys(app)
        self.state_key = keys.state
        self.history_key = keys.history
        self.audit_key = keys.audit
        self.channel = keys.changes
        self.deployed_key = keys.deployed
        self.verdicts_key = keys.verdicts
        self._client = open_client(url, timeout_s=timeout_s, health_check_interval=30)
        self._cas = self._client.register_script(CAS)
        self._note = self._client.register_script(NOTE)

    def _call(self, fn, *args, **kwargs):
        return call_redis(self.url, fn, *args, **kwargs)

    def ping(self) -> None:
        self._call(self._client.ping)

    def memory_limits(self) -> tuple[int, str]:
        """This Redis' maxmemory and policy (`memory_limits`)."""
        return memory_limits(self._client, self.url)

    def get(self) -> RolloutState:
        return read_state(self._call(self._client.hget, self.state_key, "json"))

    def compare_and_set(self, before, after, *, actor, action, reason):
        check_successor(before, after)
        before_json = before.model_dump_json() if before.revision else ""
        ok, current = durable_script(
            self._client, self._call, self.ack, self._cas,
            keys=[self.state_key, self.history_key, self.audit_key],
            args=[
                before.revision, after.revision, after.model_dump_json(), repr(after.updated_at),
                actor, action, reason, before_json, self.channel,
            ],
            what=f"revision {after.revision} ({action})", wrote=wrote_first,
        )
        if not ok:
            raise RevisionConflict(before.revision, int(current))
        return after

    def note(self, *, ts, actor, action, reason, detail=None):
        durable_script(
            self._client, self._call, self.ack, self._note,
            keys=[self.state_key, self.audit_key],
            args=[repr(ts), actor, action, reason, RolloutState().model_dump_json(),
                  json.dumps(detail) if detail is not None else ""],
            what=f"the audit entry {action!r}",
        )

    def audit(self, last=None):
        if last:
            rows = self._call(self._client.xrevrange, self.audit_key, count=last)[::-1]
        else:
            rows = self._call(self._client.xrange, self.audit_key)
        return [_entry(entry_id, fields) for entry_id, fields in rows]

    def audit_after(self, entry_id, count):
        rows = self._call(self._client.xrange, self.audit_key, min=f"({entry_id}", count=count)
        return [_entry(entry_id, fields) for entry_id, fields in rows]

    def state_at(self, revision):
        raw = self._call(self._client.hget, self.history_key, str(revision))
        if not raw:
            raise RevisionNotFound(f"no state recorded at revision {revision}")
        return RolloutState.model_validate_json(raw)

    def subscribe(self) -> Subscription:
        return _RedisSubscription(self)

    def report_deployment(self, report):
        self._call(self._client.hset, self.deployed_key, report.gateway, report.model_dump_json())

    def deployments(self):
        raw = self._call(self._client.hgetall, self.deployed_key)
        reports = [DeploymentReport.model_validate_json(v) for v in raw.values()]
        return sorted(reports, key=lambda r: r.ts)

    def put_verdict(self, verdict):
        field = _verdict_field(verdict.baseline_version, verdict.optimized_version)
        self._call(self._client.hset, self.verdicts_key, field, verdict.model_dump_json())

    def get_verdict(self, baseline_version, optimized_version):
        raw = self._call(self._client.hget, self.verdicts_key,
                         _verdict_field(baseline_version, optimized_version))
        return Verdict.model_validate_json(raw) if raw else None

    def close(self) -> None:
        self._client.close()


def _verdict_field(baseline_version: str, optimized_version: str) -> str:
    return json.dumps([baseline_version, optimized_version])


def _entry(entry_id: str, fields: dict[str, str]) -> AuditEntry:
    before = fields.get("before") or None
    detail = fields.get("detail") or None
    return AuditEntry(
        id=entry_id,
        ts=float(fields["ts"]),
        actor=fields["actor"],
        action=fields["action"],
        reason=fields["reason"],
        revision=int(fields["revision"]),
        before=RolloutState.model_validate(json.loads(before)) if before else None,
        after=RolloutState.model_validate_json(fields["after"]),
        detail=json.loads(detail) if detail else None,
    )
