"""Rollout events: what a notification says, derived from the audit stream (pure, no HTTP).

The audit stream (`rollout:<app>:audit`) is the one record of every change; an `Event` is the
notification of one entry (`event_from_audit`). The table below is the whole mapping; an action
not in it (a `ramp-evaluate` hold or heartbeat, a future action) is not an event.

| audit action                     | kind                 | severity                          |
|----------------------------------|----------------------|-----------------------------------|
| `canary <old> -> <new>`          | `share`              | info; none when the ramp set it   |
| `kill` / `unkill`                | `kill` / `unkill`    | critical / warning                |
| `revert to revision N`           | `revert`             | warning                           |
| `ramp-start`, `--force`          | `ramp-start`         | info; warning when forced         |
| `ramp-advance` / `ramp-promote`  | same                 | info                              |
| `ramp-stalled`                   | `ramp-stalled`       | warning                           |
| `ramp-wait-approval`             | same                 | warning (its heartbeats: none)    |
| `ramp-rollback`                  | `ramp-rollback`      | critical                          |
| `ramp-abort`                     | `ramp-abort`         | warning                           |
| `ramp-deadline`                  | `ramp-deadline`      | critical (`abort`), warning (`pause`) |
| `ramp-pause/resume/approve`      | same                 | info                              |
| `route-add` / `route-remove`     | same                 | info                              |
| `verify-verdict`                 | `verify-verdict`     | info when passed, warning when not |

A share the ramp controller set is told by its `ramp-*` event (advance, rollback, promote).
Two kinds are not audit entries: a gateway whose copy of the state went stale (`store-stale`,
critical) and heard again (`store-recovered`, info), posted by the gateway itself since the
store is what is down (`store_event`).

An event's `id` is stable: `<app>:<audit entry id>` (a gateway's: `<app>:<gateway>:<ts>`), so a
redelivery is recognised and dropped by the sender. Its body (`Event.body`) is JSON with `id`,
`kind`, `severity`, `ts`, `app`, `text`, `actor`, `reason`, `detail`; `text` is one line a Slack
incoming webhook shows as is. `sign` is the `X-Canary-Signature` of a body.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field

from rollout.share import format_bp
from rollout.state import AuditEntry

SEVERITIES = ("info", "warning", "critical")
KINDS = (
    "share", "kill", "unkill", "revert", "ramp-start", "ramp-advance", "ramp-stalled",
    "ramp-wait-approval", "ramp-promote", "ramp-rollback", "ramp-abort", "ramp-deadline",
    "ramp-pause", "ramp-resume", "ramp-approve", "route-add", "route-remove", "verify-verdict",
    "store-stale", "store-recovered",
)
SIGNATURE_HEADER = "X-Canary-Signature"
EVENT_ID_HEADER = "X-Canary-Event-Id"
RAMP_ACTOR = "ramp-controller"  # rollout.ramp.machine.CONTROLLER, without importing the ramp

_EMOJI = {"info": ":information_source:", "warning": ":warning:",
          "critical": ":rotating_light:"}
_SHARE = re.compile(r"canary (\S+) -> (\S+)$")
_REVERT = re.compile(r"revert to revision (\d+)$")


@dataclass(frozen=True)
class Event:
    """One notification. `detail` is plain JSON (what the audit entry recorded)."""

    id: str
    kind: str
    severity: str
    ts: float
    app: str
    text: str
    actor: str = ""
    reason: str = ""
    detail: dict = field(default_factory=dict)

    def body(self) -> bytes:
        """The JSON posted to a webhook (the bytes that are signed)."""
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True).encode()


def sign(body: bytes, secret: str) -> str:
    """`sha256=<hex HMAC-SHA256 of the raw body>`: the `X-Canary-Signature` header's value."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def _severity_at_least(severity: str, minimum: str) -> bool:
    return SEVERITIES.index(severity) >= SEVERITIES.index(minimum)


@dataclass(frozen=True)
class EventFilter:
    """Which events are sent: `kinds` (empty: all) at `min_severity` or above."""

    kinds: frozenset[str] = frozenset()
    min_severity: str = "info"

    @classmethod
    def of(cls, kinds: Iterable[str] = (), min_severity: str = "info") -> EventFilter:
        kinds = frozenset(kinds)
        unknown = sorted(kinds - set(KINDS))
        if unknown:
            raise ValueError(f"unknown event kind(s) {', '.join(unknown)}; "
                             f"known: {', '.join(KINDS)}")
        if min_severity not in SEVERITIES:
            raise ValueError(f"min_severity must be one of {', '.join(SEVERITIES)}")
        return cls(kinds, min_severity)

    def accepts(self, event: Event) -> bool:
        return (not self.kinds or event.kind in self.kinds) and \
            _severity_at_least(event.severity, self.min_severity)


def _kind_severity(entry: AuditEntry) -> tuple[str, str, str] | None:
    """(kind, severity, what happened) of an audit entry; None when it is not an event."""
    action, detail = entry.action, entry.detail or {}
    share = _SHARE.match(action)
    if share:
        if entry.actor == RAMP_ACTOR:
            return None  # the ramp's own event (advance, rollback, promote) says it
        return "share", "info", f"canary share {share[1]} -> {share[2]}"
    revert = _REVERT.match(action)
    if revert:
        return "revert", "warning", f"reverted to revision {revert[1]}"
    if action in ("ramp-start", "ramp-start --force"):
        forced = action.endswith("--force")
        return ("ramp-start", "warning" if forced else "info",
                "ramp started" + (" (forced: no passing verify verdict needed)" if forced else ""))
    if action == "ramp-wait-approval":
        held = detail.get("held") or {}
        if held.get("evaluations", 1) > 1:
            return None  # a heartbeat of the same wait: notified when it began
        return "ramp-wait-approval", "warning", "ramp waiting for approval (`rollout ramp approve`)"
    if action == "ramp-deadline":
        how = detail.get("on_deadline", "abort")
        return ("ramp-deadline", "critical" if how == "abort" else "warning",
                f"ramp progress deadline passed ({how})")
    if action == "verify-verdict":
        passed = bool(detail.get("passed"))
        return ("verify-verdict", "info" if passed else "warning",
                f"verify verdict: {'passed' if passed else 'FAILED'}")
    simple = _SIMPLE.get(action)
    if simple is None:
        return None
    return action, *simple


_SIMPLE = {
    "kill": ("critical", "KILL SWITCH ON: all traffic to baseline"),
    "unkill": ("warning", "kill switch off: the canary share applies again"),
    "ramp-advance": ("info", "ramp advanced"),
    "ramp-stalled": ("warning", "ramp stalled past its step's soak time"),
    "ramp-promote": ("info", "ramp promoted: the optimized arm takes all traffic"),
    "ramp-rollback": ("critical", "ramp rolled back"),
    "ramp-abort": ("warning", "ramp aborted"),
    "ramp-pause": ("info", "ramp paused"),
    "ramp-resume": ("info", "ramp resumed"),
    "ramp-approve": ("info", "ramp step approved"),
    "route-add": ("info", "header route added"),
    "route-remove": ("info", "header route removed"),
}


def _where(entry: AuditEntry) -> str:
    """Where a ramp event leaves the ramp: ` (step 2, share 5%)`."""
    step = (entry.detail or {}).get("step")
    at = f"step {step + 1}, " if isinstance(step, int) and step >= 0 else ""
    return f" ({at}share {format_bp(entry.after.canary_bp)})"


def text_of(app: str, severity: str, what: str, reason: str, actor: str) -> str:
    """The one line a chat shows: `:emoji: [app] what: reason (by actor)`."""
    line = f"{_EMOJI[severity]} [{app}] {what}"
    if reason:
        line += f": {reason}"
    return line + (f" (by {actor})" if actor else "")


def event_from_audit(entry: AuditEntry, app: str) -> Event | None:
    """The notification of one audit entry of application `app`; None when it is not one."""
    mapped = _kind_severity(entry)
    if mapped is None:
        return None
    kind, severity, what = mapped
    if kind.startswith("ramp-") and kind not in ("ramp-start", "ramp-approve"):
        what += _where(entry)
    detail = dict(entry.detail or {})
    detail.update(revision=entry.revision, canary_bp=entry.after.canary_bp,
                  canary_bp_before=entry.before.canary_bp if entry.before else 0,
                  kill=entry.after.kill, action=entry.action)
    return Event(
        id=f"{app}:{entry.id}", kind=kind, severity=severity, ts=entry.ts, app=app,
        text=text_of(app, severity, what, entry.reason, entry.actor),
        actor=entry.actor, reason=entry.reason, detail=detail,
    )


def store_event(app: str, gateway: str, *, stale: bool, since: float, now: float,
                error: str | None = None) -> Event:
    """A gateway's `store-stale` (its copy of the state is older than the staleness limit:
    it routes all to baseline) or `store-recovered` event. `since`: when it went stale, which
    with the gateway names the outage (the id of both events)."""
    base = f"{app}:{gateway}:{since:.3f}"
    if stale:
        what = f"gateway {gateway}: rollout store unreachable, routing all traffic to baseline"
        return Event(id=base, kind="store-stale", severity="critical", ts=now, app=app,
                     text=text_of(app, "critical", what, error or "", ""), actor=gateway,
                     reason=error or "", detail={"gateway": gateway, "stale_since": since})
    what = f"gateway {gateway}: rollout store reachable again after {now - since:.0f} s"
    return Event(id=base + ":recovered", kind="store-recovered", severity="info", ts=now,
                 app=app, text=text_of(app, "info", what, "", ""), actor=gateway,
                 detail={"gateway": gateway, "stale_since": since})


def redact_webhook(url: str) -> str:
    """A webhook URL fit for logs and status: its path and query hold tokens (Slack's do),
    so only the scheme and host are kept."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "***"
    host = rest.split("/", 1)[0].rpartition("@")[2]
    return f"{scheme}://{host}/***"


RECENT_S = 86_400  # a give-up or a drop within this long is still warned about


def webhook_health(counters: Mapping[str, str], now: float) -> dict | None:
    """What `rollout status` shows of the webhooks counters (serve.control_plane.webhooks, the Redis
    hash `rollout:<app>:webhooks`): the counts, and `warnings` when the latest attempt failed or an
    event was given up or dropped in the last day. None when nothing was ever sent."""
    if not counters:
        return None
    count = {name: int(float(counters.get(name, 0) or 0))
             for name in ("delivered", "failed_attempts", "given_up", "dropped", "duplicates")}
    ts = {name: float(counters.get(name) or 0) for name in
          ("last_error_ts", "last_delivered_ts", "last_given_up_ts", "last_dropped_ts")}
    warnings = []
    if ts["last_error_ts"] > ts["last_delivered_ts"]:
        when = _ago(now, ts["last_error_ts"])
        warnings.append(f"webhook deliveries are failing: last error {when}: "
                        f"{counters.get('last_error', '?')}")
    if count["given_up"] and now - ts["last_given_up_ts"] < RECENT_S:
        warnings.append(f"{count['given_up']} webhook event(s) given up, the last "
                        f"{_ago(now, ts['last_given_up_ts'])} (receiver down past "
                        "CANARY_WEBHOOK_RETRY_FOR_S, or it refused them)")
    if count["dropped"] and now - ts["last_dropped_ts"] < RECENT_S:
        warnings.append(f"{count['dropped']} webhook event(s) dropped from a full queue, the last "
                        f"{_ago(now, ts['last_dropped_ts'])} (CANARY_WEBHOOK_QUEUE)")
    return {**count, **{k: v or None for k, v in ts.items()},
            "last_error": counters.get("last_error") or None, "warnings": warnings}


def _ago(now: float, ts: float) -> str:
    return f"{max(0.0, now - ts):.0f}s ago"
