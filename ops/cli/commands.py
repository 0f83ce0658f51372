"""The `rollout` commands other than `kill` and `unkill` (ops.cli.kill): settings, stores, and
one handler per command (see ops.cli for the commands and the exit codes).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from dataclasses import dataclass
from typing import IO

from ops.cli import flips, ramp, route
from ops.cli.args import PROG, settings_from
from ops.cli.context import Ask, ChangeContext, is_terminal
from ops.cli.errors import NothingRecorded, UsageError, fail
from ops.cli.format import (
    describe_change,
    gateway_rows,
    one_line,
    status_rows,
    table,
    webhook_lines,
    when,
)
from ops.cli.telemetry import (
    arm_rows,
    efficiency_line,
    generation_rows,
    shadow_lines,
    trace_rows,
    waterfall,
)
from rollout import (
    Clock,
    Rollout,
    Settings,
    StateStore,
    SystemClock,
    Traces,
    format_bp,
    open_store,
    open_telemetry,
)
from rollout.control import DEPLOYMENT_TTL_S
from rollout.status import read_status
from rollout.telemetry.traces import request_sampled

# --- commands ---------------------------------------------------------------------------------


@dataclass
class _Context(ChangeContext):
    args: argparse.Namespace
    rollout: Rollout
    clock: Clock
    out: IO[str]
    err: IO[str]
    stdin: IO[str]
    interactive: bool
    where: str = ""
    telemetry: object | None = None  # source of Windows and Traces; None: not shown
    app: str = "default"
    settings: Settings | None = None
    ramps: object | None = None  # the ramp store (rollout.ramp.RampStore), for `ramp`

    def warn(self, line: str) -> None:
        self.err.write(f"{PROG}: warning: {line}\n")

    def read_settings(self) -> Settings:
        """The settings the stores were opened with; with stores injected (tests), read from
        the flags and the environment."""
        return self.settings or settings_from(self.args)


def _status(ctx: _Context) -> int:
    status = read_status(ctx.rollout.store, ctx.telemetry, app=ctx.app, window_s=ctx.args.window,
                         clock=ctx.clock)
    if ctx.args.json:
        ctx.say(json.dumps(status.as_json()))
        return 0
    state, traffic, problem = status.state, status.traffic, status.traffic_error
    shadow, now = status.shadow, status.now
    rows = ([("store", ctx.where)] if ctx.where else []) + status_rows(state, now,
                                                                      status.audited)
    rows += route.status_lines(state.routes)
    rows += gateway_rows(state, status.gateways, now, DEPLOYMENT_TTL_S)
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        ctx.say(f"{label:<{width}}  {value}")
    if ctx.telemetry is None:
        return 0
    ctx.say("")
    if problem:
        ctx.say(f"traffic: unavailable ({one_line(problem)})")
    elif not any(s.requests or s.calls for s in traffic.values()):
        ctx.say(f"traffic: no requests recorded in the last {ctx.args.window}s")
    else:
        ctx.say(f"traffic over the last {ctx.args.window}s:")
        for line in arm_rows(traffic):
            ctx.say(line)
        if generation := generation_rows(traffic):
            ctx.say("generation (answers of a causal LM):")
            for line in generation:
                ctx.say(line)
        ctx.say(efficiency_line(status.efficiency))
    if shadow is not None:
        ctx.say("")
        for line in shadow_lines(shadow):
            ctx.say(line)
    if status.webhooks is not None:
        ctx.say("")
        for line in webhook_lines(status.webhooks, now):
            ctx.say(line)
    return 0


def _no_trace(ctx: _Context, trace_id: str | None) -> str:
    """Why nothing is recorded for the request or trace asked for: a request id tells whether
    it was sampled (serve.telemetry.sampling), a trace id does not."""
    args = ctx.args
    if not args.request_id:
        return f"no trace recorded for trace {trace_id} (expired, not sampled, or telemetry off)"
    settings = ctx.read_settings()
    ratio, slow_ms = settings.trace_sample_ratio, settings.trace_slow_ms
    if request_sampled(args.request_id, ratio):
        return (f"no trace recorded for request {args.request_id}: it was sampled "
                f"(CANARY_TRACE_SAMPLE_RATIO={ratio:g}), so its trace expired, it never reached "
                "a gateway, or telemetry is off")
    return (f"request {args.request_id} was not sampled (CANARY_TRACE_SAMPLE_RATIO={ratio:g} "
            "records that share of requests, by id), nor an error, refusal, fallback or "
            f"answer slower than CANARY_TRACE_SLOW_MS={slow_ms:g}, which are always recorded; "
            "its request log line says \"sampled\": false")


def _traces(ctx: _Context) -> int:
    if ctx.telemetry is None:
        raise UsageError("no telemetry store to read traces from")
    traces = Traces(ctx.telemetry)
    args = ctx.args
    if args.request_id or args.trace_id:
        if args.request_id:
            found = traces.by_request(args.request_id)
            trace_id, spans = found if found else (None, [])
        else:
            trace_id, spans = args.trace_id, traces.get(args.trace_id)
        if not spans:
            raise NothingRecorded(_no_trace(ctx, trace_id))
        if args.json:
            ctx.say(json.dumps({"trace_id": trace_id, "spans": spans}))
            return 0
        duration = (max(s["end"] for s in spans) - min(s["start"] for s in spans)) * 1000
        ctx.say(f"trace {trace_id}: {len(spans)} spans, {duration:.2f} ms")
        for line in waterfall(spans):
            ctx.say(line)
        return 0
    summaries = traces.recent(args.last)
    if args.json:
        ctx.say(json.dumps([t.as_dict() for t in summaries]))
    elif not summaries:
        ctx.say("no traces recorded")
    else:
        for line in trace_rows(summaries):
            ctx.say(line)
    return 0


def _canary(ctx: _Context) -> int:
    bp = ctx.args.percent
    before = ctx.rollout.state()
    old, new = format_bp(before.canary_bp), format_bp(bp)
    if bp == before.canary_bp:
        ctx.say(f"canary already at {new} (revision {before.revision}): nothing changed")
        return 0
    if before.kill:
        ctx.warn("the kill switch is on: traffic stays on baseline until `rollout unkill`")
    ctx.change(
        lambda: ctx.rollout.set_canary(bp, actor=ctx.actor, reason=ctx.args.reason,
                                       expected_revision=before.revision),
        lambda _, after: f"canary {old} -> {new}",
        Ask(before, before.model_copy(update={"canary_bp": bp}),
            f"Move canary from {old} to {new} (revision {before.revision})?",
            f"moving the canary from {old} to {new}"))
    return 0


def _revert(ctx: _Context) -> int:
    revision = ctx.args.revision
    target = ctx.rollout.store.state_at(revision)
    before = ctx.rollout.state()
    planned = before.model_copy(update={"canary_bp": target.canary_bp, "kill": target.kill,
                                        "routes": target.routes})
    change = describe_change(before, planned)
    if not change:
        ctx.say(f"nothing to revert: revision {before.revision} already has the share, kill "
                f"switch and routes of revision {revision}")
        return 0
    ctx.change(
        lambda: ctx.rollout.revert(revision, actor=ctx.actor, reason=ctx.args.reason,
                                   expected_revision=before.revision),
        lambda _, after: f"revert to revision {revision}: {describe_change(before, after)}",
        Ask(before, planned,
            f"Revert to revision {revision} ({change}; now at revision {before.revision})?",
            f"reverting to revision {revision} ({change})"))
    return 0


def _audit(ctx: _Context) -> int:
    entries = ctx.rollout.store.audit(last=ctx.args.last)
    if ctx.args.json:
        ctx.say(json.dumps([entry.model_dump(mode="json") for entry in entries]))
    elif not entries:
        ctx.say("no changes recorded")
    else:
        rows = [(e.id, when(e.ts), e.actor, e.action, str(e.revision), e.reason) for e in entries]
        for line in table(("ID", "TIME", "ACTOR", "ACTION", "REVISION", "REASON"), rows):
            ctx.say(line)
    return 0


def _verify(ctx: _Context) -> int:
    from ops.verify import verify

    return verify(ctx, ctx.read_settings())


def _ramp(ctx: _Context) -> int:
    from rollout.ramp import RampControl

    return ramp.run(ctx, RampControl(ctx.rollout.store, ctx.ramps, ctx.clock))


_HANDLERS = {
    "ramp": _ramp, "status": _status, "canary": _canary, "audit": _audit, "revert": _revert,
    "traces": _traces, "verify": _verify, "route": route.run, "flips": flips.run,
}


# --- entry point ------------------------------------------------------------------------------


def run(args: argparse.Namespace, *, store: StateStore | None = None,
        clock: Clock | None = None, stdin: IO[str] | None = None,
        stdout: IO[str] | None = None, stderr: IO[str] | None = None, telemetry=None,
        ramps=None) -> int:
    """Run one command (`args` from ops.cli's parser) and return its exit code."""
    out, err = stdout or sys.stdout, stderr or sys.stderr
    interactive = stdin is not None or is_terminal(sys.stdin)
    opened = opened_telemetry = opened_ramps = None
    try:
        where, app, settings = "", "default", None
        if store is None:
            settings = settings_from(args)
            store = opened = open_store(settings)
            where, app = _where(settings), settings.app_name
            if telemetry is None and args.command in ("status", "traces", "flips"):
                telemetry = opened_telemetry = open_telemetry(settings, settings)
            if ramps is None and args.command == "ramp":
                from rollout.ramp import open_ramp_store

                ramps = opened_ramps = open_ramp_store(settings)
        else:
            app = getattr(store, "app", app)
        clock = clock or SystemClock()
        ctx = _Context(args, Rollout(store, clock), clock, out, err, stdin or sys.stdin,
                       interactive, where, telemetry, app, settings, ramps)
        return _HANDLERS[args.command](ctx)
    except (KeyboardInterrupt, Exception) as exc:  # one line and an exit code (ops.cli.errors)
        return fail(exc, err, own_stdout=stdout is None)
    finally:
        for resource in (opened, opened_telemetry, opened_ramps):
            if resource is not None:
                with contextlib.suppress(Exception):
                    resource.close()


def _where(settings: Settings) -> str:
    from rollout.redis_store import redact_url

    return f"{redact_url(settings.redis_url)} (app {settings.app_name})"
