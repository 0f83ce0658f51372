"""How the state store lays its data out in Redis: the key names and the scripts that write them.

Keys, under one namespace per application (`rollout:<app>:`):

- `state`    hash: `revision` and `json` (the current RolloutState's JSON)
- `history`  hash: revision -> the state's JSON (the rollback path)
- `audit`    stream: actor, action, reason, revision, before, after, ts; notes (entries that
             change nothing, e.g. ramp evaluations) add `detail` (JSON). Never trimmed.
- `changes`  pub/sub channel: the new revision, published on every change
- `deployed` hash: gateway id -> what it serves (JSON); the only key a gateway writes
- `verdicts` hash: JSON [baseline_version, optimized_version] -> the latest verify verdict's JSON
- `flips`    stream: inputs the shadowed arms disagreed on (rollout.flips; bounded, expires)
- `webhooks` hash: notification delivery counters (serve.control_plane.webhooks): delivered,
  failed_attempts,
             dropped, given_up, duplicates, last_error (URL redacted), last_error_ts,
             last_delivered_ts, last_given_up_ts, last_dropped_ts
- `notify:cursor`     string: the last audit entry id the notifier has finished with
- `notify:sent:<sha>` string (expires): one (event id, URL) claimed for delivery (deduplication)
- `telemetry:targets` hash: gateway replica id -> its metrics endpoint (JSON: address, labels,
             expiry), for Prometheus service discovery (serve.telemetry.metrics_targets); the other
             `telemetry:` keys are rollout.telemetry.windows' and rollout.telemetry.traces'

Plain Python, no Redis client: rollout.redis_store runs these scripts through redis-py, and the
CLI's kill switch (rollout.killswitch) through a bare connection, so both write alike.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    """The Redis keys and channel of one application."""

    app: str

    @property
    def prefix(self) -> str:
        return f"rollout:{self.app}:"

    @property
    def state(self) -> str:
        return self.prefix + "state"

    @property
    def history(self) -> str:
        return self.prefix + "history"

    @property
    def audit(self) -> str:
        return self.prefix + "audit"

    @property
    def changes(self) -> str:
        return self.prefix + "changes"

    @property
    def deployed(self) -> str:
        return self.prefix + "deployed"

    @property
    def verdicts(self) -> str:
        return self.prefix + "verdicts"

    @property
    def flips(self) -> str:
        return self.prefix + "flips"

    @property
    def webhooks(self) -> str:
        return self.prefix + "webhooks"

    @property
    def notify_cursor(self) -> str:
        return self.prefix + "notify:cursor"

    def notify_sent(self, digest: str) -> str:
        return self.prefix + "notify:sent:" + digest

    @property
    def metrics_targets(self) -> str:
        return self.prefix + "telemetry:targets"


# The control plane's scripts run with `allow-oom` (Redis >= 7.0): a Redis whose memory is full
# under `noeviction` refuses every other write, and still takes a kill, a share change or an
# audit note (each a few hundred bytes). The gateway's own data never runs so.
ALLOW_OOM = "#!lua flags=allow-oom\n"

# The one write of the state. KEYS: state, history, audit. ARGV: before revision, after
# revision, after JSON, ts, actor, action, reason, before JSON ('' for none), channel.
# Returns {1, after revision}, or {0, current revision} when the state moved meanwhile.
CAS = ALLOW_OOM + """
local current = tonumber(redis.call('HGET', KEYS[1], 'revision') or '0')
if current ~= tonumber(ARGV[1]) then
  return {0, current}
end
redis.call('HSET', KEYS[1], 'revision', ARGV[2], 'json', ARGV[3])
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
redis.call('XADD', KEYS[3], '*', 'ts', ARGV[4], 'actor', ARGV[5], 'action', ARGV[6],
           'reason', ARGV[7], 'revision', ARGV[2], 'before', ARGV[8], 'after', ARGV[3])
redis.call('PUBLISH', ARGV[9], ARGV[2])
return {1, tonumber(ARGV[2])}
"""

# An audit entry that changes nothing: the current state as both before and after.
# KEYS: state, audit. ARGV: ts, actor, action, reason, default state JSON, detail JSON.
NOTE = ALLOW_OOM + """
local state = redis.call('HGET', KEYS[1], 'json')
local revision = redis.call('HGET', KEYS[1], 'revision') or '0'
local before = state or ''
redis.call('XADD', KEYS[2], '*', 'ts', ARGV[1], 'actor', ARGV[2], 'action', ARGV[3],
           'reason', ARGV[4], 'revision', revision, 'before', before, 'after', state or ARGV[5],
           'detail', ARGV[6])
"""
