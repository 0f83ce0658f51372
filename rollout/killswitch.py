"""The kill switch over a bare Redis connection: `rollout kill` / `unkill` without the full stack.

`QuickSwitch.kill` and `.unkill` are `rollout.control.Rollout.kill` and `.unkill` (same checks,
same retries, same errors) on a `rollout.resp_client` connection, and write exactly what
`RedisStateStore.compare_and_set` writes: the same script (rollout.redis_layout.CAS) checks the
revision, stores the state and its history, appends the audit entry and notifies the gateways
in one atomic step. The difference is the start-up: no pydantic and no redis-py, so a whole
`rollout kill` takes about 0.08 s instead of 0.37 s, for the moment an operator needs the
canary gone.

States are `SwitchState`s, plain dataclasses with `RolloutState`'s fields, read from and written
as the JSON `RolloutState.model_dump_json()` writes (tests/unit/test_killswitch.py holds the two
to each other). A stored state that is not exactly such a document raises `Unrecognised`, and
the caller takes the full path, which validates it.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, fields, replace

from rollout.clock import Clock, SystemClock
from rollout.errors import InvalidChange, RevisionConflict
from rollout.redis_conn import Acknowledgement
from rollout.redis_layout import CAS, Keys
from rollout.resp_client import Connection
from rollout.share import BUCKETS

KILL_ATTEMPTS = 20  # as Rollout.kill: the kill switch retries through concurrent writes
_TYPES = {"int": int, "bool": bool, "str": str, "float": float, "tuple": list}


class Unrecognised(ValueError):
    """The stored state is not a document this module reads exactly: use the full path."""


@dataclass(frozen=True)
class SwitchState:
    """`RolloutState`'s fields, in its order (that order is the stored JSON's)."""

    canary_bp: int = 0
    kill: bool = False
    baseline_version: str = ""
    optimized_version: str = ""
    revision: int = 0
    updated_at: float = 0.0
    updated_by: str = ""
    reason: str = ""
    routes: tuple = ()  # header routes (rollout.header_routes) as stored: kept as they are, unread

    @property
    def effective_bp(self) -> int:
        """The share actually routed to the canary: the kill switch beats the share."""
        return 0 if self.kill else self.canary_bp

    @classmethod
    def from_json(cls, raw: str) -> SwitchState:
        """Read a stored state; Unrecognised unless it has exactly these fields, well typed."""
        doc = json.loads(raw)
        names = [f.name for f in fields(cls)]
        if isinstance(doc, dict):
            doc.setdefault("routes", [])  # a state stored before routes existed
        if not isinstance(doc, dict) or sorted(doc) != sorted(names):
            raise Unrecognised("the stored state has other fields")
        if doc["routes"] == {}:  # Lua's cjson writes an empty list as {} (redis-cli kill)
            doc["routes"] = []
        for f in fields(cls):
            value, kind = doc[f.name], _TYPES[f.type]
            if kind is float and type(value) is int:  # e.g. written by redis-cli's cjson
                doc[f.name] = value = float(value)
            if type(value) is not kind:  # exact: a bool is no int here
                raise Unrecognised(f"the stored {f.name} is not a {f.type}")
        if not all(isinstance(route, dict) for route in doc["routes"]):
            raise Unrecognised("the stored routes are not objects")
        state = cls(**dict(doc, routes=tuple(doc["routes"])))
        if not (0 <= state.canary_bp <= BUCKETS and state.revision >= 0):
            raise Unrecognised("the stored state is out of bounds")
        return state

    def model_copy(self, *, update: dict) -> SwitchState:
        """A copy with `update` applied: the call RolloutState answers to, so that the CLI's
        handlers (ops.cli.kill) take either kind of state."""
        return replace(self, **update)

    def to_json(self) -> str:
        """The JSON `RolloutState.model_dump_json()` writes for the same state."""
        return json.dumps(asdict(self), separators=(",", ":"), ensure_ascii=False)


class QuickSwitch:
    """The kill switch of one application, on an open connection.

    A write waits for `ack` (as the Redis store's do: `WAIT` on this connection); short of it,
    it asks again until `ack_until` (a monotonic deadline: the kill's retry budget), then raises
    NotAcknowledged, the write in effect on the primary."""

    def __init__(self, conn: Connection, app: str, clock: Clock | None = None, *,
                 ack: Acknowledgement | None = None, ack_until: float | None = None):
        self.conn, self.keys = conn, Keys(app)
        self.clock = clock or SystemClock()
        self.ack, self.ack_until = ack or Acknowledgement(), ack_until

    def state(self) -> SwitchState:
        raw = self.conn.call("HGET", self.keys.state, "json")
        return SwitchState.from_json(raw) if raw else SwitchState()

    def kill(self, *, actor: str, reason: str) -> tuple[SwitchState, SwitchState]:
        return self._retrying(actor=actor, reason=reason, action="kill", kill=True)

    def unkill(self, *, actor: str, reason: str,
               expected_revision: int | None = None) -> tuple[SwitchState, SwitchState]:
        """As Rollout.unkill: with `expected_revision` it writes only on top of that revision."""
        if expected_revision is None:
            return self._retrying(actor=actor, reason=reason, action="unkill", kill=False)
        before = self.state()
        if before.revision != expected_revision:
            raise RevisionConflict(expected_revision, before.revision)
        return before, self._write(before, actor=actor, reason=reason, action="unkill",
                                   kill=False)

    def _retrying(self, **write) -> tuple[SwitchState, SwitchState]:
        for _ in range(KILL_ATTEMPTS):
            before = self.state()
            try:
                return before, self._write(before, **write)
            except RevisionConflict:
                continue
        raise RevisionConflict(before.revision, self.state().revision)

    def _write(self, before: SwitchState, *, actor: str, action: str, reason: str,
               kill: bool) -> SwitchState:
        actor, reason = actor.strip(), reason.strip()
        if not actor:
            raise InvalidChange("every change must name an actor")
        if not reason:
            raise InvalidChange("every change must give a reason")
        after = replace(before, kill=kill, revision=before.revision + 1,
                        updated_at=self.clock.time(), updated_by=actor, reason=reason)
        keys = self.keys
        ok, current = self.conn.script(
            CAS, [keys.state, keys.history, keys.audit],
            [before.revision, after.revision, after.to_json(), repr(after.updated_at), actor,
             action, reason, before.to_json() if before.revision else "", keys.changes])
        if not ok:
            raise RevisionConflict(before.revision, int(current))
        if self.ack.replicas:
            self._acknowledge(f"revision {after.revision} ({action})")
        return after

    def _acknowledge(self, what: str) -> None:
        while True:
            count = self.conn.call("WAIT", self.ack.replicas, self.ack.timeout_ms)
            if count >= self.ack.replicas or self.ack_until is None or (
                    time.monotonic() >= self.ack_until):
                self.ack.check(count, what)
                return
