"""The kill switch over a bare Redis connection: what `rollout kill` / `unkill` run.

`QuickSwitch` is `rollout.control.Rollout`'s kill switch on a `rollout.resp_client` connection:
`kill` and `unkill` are the same code (rollout.change.KillSwitch: same checks, same retries, same
errors), and a write is exactly what `RedisStateStore.compare_and_set` writes: the same script
(rollout.redis_layout.CAS) checks the revision, stores the state and its history, appends the
audit entry and notifies the gateways in one atomic step. The difference is the start-up: no
pydantic and no redis-py to import (ops.cli.kill has the measurement).

States are `SwitchState`s, plain dataclasses with `RolloutState`'s fields, read from and written
as the JSON `RolloutState.model_dump_json()` writes (tests/unit/test_cli_kill.py holds the two to
each other). A stored state that is not exactly such a document (written by hand, or by another
tool) is read by `RolloutState` itself, imported for it: what pydantic accepts is written back in
its canonical form, as `Rollout.kill` would; what it refuses raises StateUnreadable, and the
switch writes nothing. Fields a newer version wrote are kept on every write (`extra`).

`RedisPyConnection` answers as a resp_client connection does, through redis-py: the transport for
a Redis URL with an option resp_client does not implement (rollout.resp_client says which).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, fields, replace

from rollout.change import KillSwitch, highest_seen, stamp
from rollout.clock import Clock, SystemClock
from rollout.errors import RevisionConflict
from rollout.redis_conn import Acknowledgement
from rollout.redis_layout import CAS, Keys
from rollout.share import BUCKETS

_TYPES = {"int": int, "bool": bool, "str": str, "float": float, "tuple": list}


class Unrecognised(ValueError):
    """The stored state is not a document SwitchState reads exactly: RolloutState reads it."""


@dataclass(frozen=True)
class SwitchState:
    """`RolloutState`'s fields, in its order (that order is the stored JSON's), and `extra`:
    the fields a newer version wrote that this one does not know, kept as they are and written
    back after the others (as `RolloutState`, which allows extra fields, dumps them)."""

    canary_bp: int = 0
    kill: bool = False
    baseline_version: str = ""
    optimized_version: str = ""
    revision: int = 0
    updated_at: float = 0.0
    updated_by: str = ""
    reason: str = ""
    routes: tuple = ()  # header routes (rollout.header_routes) as stored: kept as they are, unread
    extra: tuple = ()  # (name, value) of every field this version does not know, in order

    @property
    def effective_bp(self) -> int:
        """The share actually routed to the canary: the kill switch beats the share."""
        return 0 if self.kill else self.canary_bp

    @classmethod
    def from_json(cls, raw: str) -> SwitchState:
        """Read a stored state; Unrecognised unless it has these fields (and maybe others
        unknown here), well typed."""
        doc = json.loads(raw)
        known = _known_fields()
        names = {f.name for f in known}
        if isinstance(doc, dict):
            doc.setdefault("routes", [])  # a state stored before routes existed
        if not isinstance(doc, dict) or not names <= set(doc):
            raise Unrecognised("the stored state lacks some fields")
        if doc["routes"] == {}:  # Lua's cjson writes an empty list as {} (redis-cli kill)
            doc["routes"] = []
        for f in known:
            value, kind = doc[f.name], _TYPES[f.type]
            if kind is float and type(value) is int:  # e.g. written by redis-cli's cjson
                doc[f.name] = value = float(value)
            if type(value) is not kind:  # exact: a bool is no int here
                raise Unrecognised(f"the stored {f.name} is not a {f.type}")
        if not all(isinstance(route, dict) for route in doc["routes"]):
            raise Unrecognised("the stored routes are not objects")
        state = cls(**{f.name: doc[f.name] for f in known if f.name != "routes"},
                    routes=tuple(doc["routes"]),
                    extra=tuple((k, v) for k, v in doc.items() if k not in names))
        if not (0 <= state.canary_bp <= BUCKETS and state.revision >= 0):
            raise Unrecognised("the stored state is out of bounds")
        return state

    @classmethod
    def read(cls, raw: str) -> SwitchState:
        """A stored state: as written here, else as RolloutState reads it (pydantic, imported
        now); StateUnreadable when it refuses the document."""
        try:
            return cls.from_json(raw)
        except ValueError:  # Unrecognised, or not JSON
            from rollout.redis_store import read_state

            return cls.from_json(read_state(raw).model_dump_json())

    def model_copy(self, *, update: dict) -> SwitchState:
        """A copy with `update` applied: the call RolloutState answers to, so that the CLI's
        handlers (ops.cli.kill) take either kind of state."""
        return replace(self, **update)

    def to_json(self) -> str:
        """The JSON `RolloutState.model_dump_json()` writes for the same state."""
        doc = {f.name: getattr(self, f.name) for f in _known_fields()}
        doc.update(self.extra)
        return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)


def _known_fields():
    """SwitchState's fields that are RolloutState's (all but `extra`)."""
    return [f for f in fields(SwitchState) if f.name != "extra"]


class QuickSwitch(KillSwitch):
    """The kill switch of one application, on an open connection (anything with resp_client's
    `call` and `script`).

    A write waits for `ack` (as the Redis store's do: `WAIT` on this connection); short of it,
    it asks again until `ack_until` (a monotonic deadline: the kill's retry budget), then raises
    NotAcknowledged, the write in effect on the primary."""

    def __init__(self, conn, app: str, clock: Clock | None = None, *,
                 ack: Acknowledgement | None = None, ack_until: float | None = None):
        self.conn, self.keys = conn, Keys(app)
        self.clock = clock or SystemClock()
        self.ack, self.ack_until = ack or Acknowledgement(), ack_until

    def state(self) -> SwitchState:
        raw = self.conn.call("HGET", self.keys.state, "json")
        return SwitchState.read(raw) if raw else SwitchState()

    def _write(self, before: SwitchState, *, actor: str, action: str, reason: str,
               **changes) -> SwitchState:
        seen = highest_seen(self.conn.call("HVALS", self.keys.deployed) or [])
        stamped = stamp(before, actor=actor, reason=reason, now=self.clock.time(), seen=seen)
        after = replace(before, **changes, **stamped)
        keys = self.keys
        ok, current = self.conn.script(
            CAS, [keys.state, keys.history, keys.audit],
            [before.revision, after.revision, after.to_json(), repr(after.updated_at),
             after.updated_by, action, after.reason, before.to_json() if before.revision else "",
             keys.changes])
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


class RedisPyConnection:
    """A redis-py client (rollout.redis_conn.open_client, imported now) with resp_client's
    `call`, `script` and `close`; its errors as the Redis store reports them (StoreUnavailable,
    PermissionDenied). For one Redis only: a sentinel URL's options are all resp_client's."""

    def __init__(self, url: str, timeout_s: float):
        from rollout.redis_conn import open_client

        self.url, self.client = url, open_client(url, timeout_s=timeout_s)

    def __enter__(self) -> RedisPyConnection:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.client.close()

    def call(self, *args):
        return self._mapped(self.client.execute_command, *args)

    def script(self, source: str, keys: list[str], args: list):
        return self._mapped(self.client.register_script(source), keys=keys, args=args)

    def _mapped(self, fn, *args, **kwargs):
        from rollout.redis_store import call_redis

        return call_redis(self.url, fn, *args, **kwargs)
