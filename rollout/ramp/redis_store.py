"""The ramp store in Redis.

Keys, under the application's namespace (`rollout:<app>:`):

- `ramp`        hash: `revision` and `json` (the ramp record)
- `ramp:lease`  string: the controller holding the lease (SET NX PX; renewed and released by
                compare-and-set scripts, so only the holder can extend or free it)
- `ramp:last`   string: the last evaluation's JSON (for `rollout ramp status`), written on
                every evaluation, audited or not

Ramp writes and audited evaluations also append to the `audit` stream, in the same script, with
the current rollout state as before and after (the state itself is never written here). The
stream is never trimmed: ramp entries are bounded where they are made (rollout.ramp.audit).

Connected through rollout.redis_conn; ramp writes and audited records wait for the replicas the
settings require (`WAIT`), as the state store's changes do. The lease and the last evaluation
alone do not (a failover at worst hands the lease over early or shows an older evaluation).
"""

from __future__ import annotations

import json

from rollout.errors import LeaseLost, RevisionConflict
from rollout.ramp.machine import Ramp
from rollout.ramp.store import RampStore, check_next
from rollout.redis_conn import Acknowledgement, durable_script, open_client, wrote_first
from rollout.redis_layout import NOTE
from rollout.redis_store import call_redis
from rollout.state import RolloutState

# KEYS: ramp, lease, state, audit, last. ARGV: before revision, after revision, after JSON, owner,
# then the NOTE arguments (ts, actor, action, reason, default state, detail), then the last
# evaluation's JSON (empty: this write is not an evaluation).
_PUT = """
local current = tonumber(redis.call('HGET', KEYS[1], 'revision') or '0')
if current ~= tonumber(ARGV[1]) then
  return {0, current}
end
if ARGV[4] ~= '' and redis.call('GET', KEYS[2]) ~= ARGV[4] then
  return {-1, current}
end
redis.call('HSET', KEYS[1], 'revision', ARGV[2], 'json', ARGV[3])
local state = redis.call('HGET', KEYS[3], 'json')
local revision = redis.call('HGET', KEYS[3], 'revision') or '0'
redis.call('XADD', KEYS[4], '*', 'ts', ARGV[5], 'actor', ARGV[6], 'action', ARGV[7],
           'reason', ARGV[8], 'revision', revision, 'before', state or '',
           'after', state or ARGV[9], 'detail', ARGV[10])
if ARGV[11] ~= '' then
  redis.call('SET', KEYS[5], ARGV[11])
end
return {1, tonumber(ARGV[2])}
"""

# KEYS: state, audit, last. ARGV: the NOTE arguments, then the last evaluation's JSON.
_RECORD = NOTE + """
redis.call('SET', KEYS[3], ARGV[7])
"""

_ACQUIRE = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 1
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class RedisRampStore(RampStore):
    def __init__(self, url: str, app: str, *, timeout_s: float = 2.0,
                 ack: Acknowledgement | None = None):
        self.url, self.app = url, app
        self.ack = ack or Acknowledgement()  # ramp writes and audited records wait for replicas
        prefix = f"rollout:{app}:"
        self.ramp_key, self.lease_key = prefix + "ramp", prefix + "ramp:lease"
        self.last_key, self.state_key, self.audit_key = (
            prefix + "ramp:last", prefix + "state", prefix + "audit")
        self._client = open_client(url, timeout_s=timeout_s, health_check_interval=30)
        self._put = self._client.register_script(_PUT)
        self._record = self._client.register_script(_RECORD)
        self._acquire = self._client.register_script(_ACQUIRE)
        self._release = self._client.register_script(_RELEASE)

    def _call(self, fn, *args, **kwargs):
        return call_redis(self.url, fn, *args, **kwargs)

    def get(self):
        raw = self._call(self._client.hget, self.ramp_key, "json")
        return Ramp.model_validate_json(raw) if raw else None

    def put(self, before, after, *, actor, action, reason, detail=None, owner=None,
            evaluation=False):
        expected = check_next(before, after)
        last = _last(detail or {}, after.updated_at, action, reason) if evaluation else ""
        ok, current = durable_script(
            self._client, self._call, self.ack, self._put,
            keys=[self.ramp_key, self.lease_key, self.state_key, self.audit_key, self.last_key],
            args=[expected, after.revision, after.model_dump_json(), owner or "",
                  repr(after.updated_at), actor, action, reason, _default_state(),
                  _json(detail), last],
            what=f"ramp revision {after.revision} ({action})", wrote=wrote_first,
        )
        if ok == -1:
            raise LeaseLost(f"the ramp lease is not held by {owner}")
        if not ok:
            raise RevisionConflict(expected, int(current))
        return after

    def record(self, *, ts, actor, action, reason, detail, audit=True):
        last = _last(detail, ts, action, reason)
        if not audit:
            self._call(self._client.set, self.last_key, last)
            return
        durable_script(
            self._client, self._call, self.ack, self._record,
            keys=[self.state_key, self.audit_key, self.last_key],
            args=[repr(ts), actor, action, reason, _default_state(), _json(detail), last],
            what=f"the ramp's audit entry {action!r}",
        )

    def last_evaluation(self):
        raw = self._call(self._client.get, self.last_key)
        return json.loads(raw) if raw else None

    def acquire(self, owner, ttl_s):
        ttl_ms = max(1, int(ttl_s * 1000))
        return bool(self._call(self._acquire, keys=[self.lease_key], args=[owner, ttl_ms]))

    def release(self, owner):
        self._call(self._release, keys=[self.lease_key], args=[owner])

    def holder(self):
        return self._call(self._client.get, self.lease_key)

    def close(self):
        self._client.close()


def _default_state() -> str:
    return RolloutState().model_dump_json()


def _json(detail: dict | None) -> str:
    return json.dumps(detail) if detail is not None else ""


def _last(detail: dict, ts: float, action: str, reason: str) -> str:
    return json.dumps(dict(detail, ts=ts, action=action, reason=reason))
