"""`rollout ramp ...`: start a progressive ramp from a plan, watch it, pause, resume, approve,
abort. The actions are rollout.ramp.RampControl's (the same audited path the dashboard uses);
the ramp itself runs in the application (the `ramp-controller` deployment), not here.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from ops.cli.format import age, one_line, table, when
from rollout.share import format_bp

if TYPE_CHECKING:  # rollout.ramp is imported when a ramp command runs, not to parse one
    from rollout.ramp import RampControl, RampView

_ACTIONS = {
    "start": ("start a ramp from a plan file (audited)",
              "Start a progressive ramp: the ramp-controller in the application widens the\n"
              "canary step by step while every gate of PLAN passes, and rolls it back to 0%\n"
              "when one fails. It never raises the share while the kill switch is on, while\n"
              "paused, or without a passing `rollout verify` verdict for the versions served,\n"
              "unless --force (recorded in the audit log).",
              "examples:\n  rollout ramp start ops/plans/example-ramp.yaml --reason \"ramp v2\"\n"
              "  rollout ramp start plan.yaml --force --reason \"verdict pending, low risk\""),
    "status": ("show the ramp: step, time in step, every gate and check against its threshold",
               "Show the current ramp: its status, step and share, time in step, the step's\n"
               "soak requirements, its progress deadline, and the controller's last evaluation\n"
               "with every gate's value against its threshold and every HTTP check's result.",
               "examples:\n  rollout ramp status\n  rollout ramp status --json | jq .ramp.status"),
    "pause": ("stop the climb; gates still roll back (audited)",
              "Hold the share where it is. The controller keeps judging the gates and still\n"
              "rolls a failing canary back.", "examples:\n  rollout ramp pause --reason \"lunch\""),
    "resume": ("resume a paused ramp (audited)", "Let a paused ramp climb again.",
               "examples:\n  rollout ramp resume --reason \"back\""),
    "approve": ("approve the next step that asks for it (audited)",
                "Approve the next step whose plan entry says `approval: true`.",
                "examples:\n  rollout ramp approve --reason \"dashboards look fine\""),
    "abort": ("end the ramp and roll the share back to 0% (audited)",
              "Mark the ramp aborted and set the canary share to 0%.",
              "examples:\n  rollout ramp abort --reason \"customer complaint\""),
}


def add_parser(commands, common, text) -> None:
    """The `ramp` command and its actions; `text` checks a one-line reason."""
    fmt = argparse.RawDescriptionHelpFormatter
    ramp = commands.add_parser(
        "ramp", help="progressive ramp with metric gates and automatic rollback",
        description="Run the canary up a plan of steps, gated on live metrics, with automatic\n"
                    "rollback. The ramp runs in the application; these commands steer it.",
        parents=[common], formatter_class=fmt)
    actions = ramp.add_subparsers(dest="ramp_action", metavar="ACTION", required=True)
    for name, (short, description, epilog) in _ACTIONS.items():
        sub = actions.add_parser(name, help=short.replace("%", "%%"), description=description,
                                 epilog=epilog,
                                 parents=[common], formatter_class=fmt)
        if name == "start":
            sub.add_argument("plan", metavar="PLAN.yaml", help="the ramp plan (YAML)")
            sub.add_argument("--force", action="store_true",
                             help="climb without a passing verify verdict (audited)")
        if name == "status":
            sub.add_argument("--json", action="store_true", help="print JSON")
        else:
            sub.add_argument("--reason", required=True, type=text,
                             help="why, for the audit log (required)")


def run(ctx, control: RampControl) -> int:
    action = ctx.args.ramp_action
    if action == "status":
        return _status(ctx, control.view())
    if action == "start":
        from rollout.ramp import read_plan

        plan = read_plan(ctx.args.plan)
        if ctx.rollout.state().kill:
            ctx.warn("the kill switch is on: the ramp holds until `rollout unkill`")
        ramp = control.start(plan, actor=ctx.actor, reason=ctx.args.reason,
                             force=ctx.args.force)
        shares = " -> ".join(format_bp(bp) for bp in plan.shares_bp)
        ctx.say(f"ramp started{' (forced)' if ramp.forced else ''}: {shares}, for optimized "
                f"{one_line(ramp.optimized_version)}; the ramp-controller takes it from here "
                "(`rollout ramp status`)")
        return 0
    ramp = getattr(control, action)(actor=ctx.actor, reason=ctx.args.reason)
    extra = f", share {format_bp(ctx.rollout.state().canary_bp)}" if action == "abort" else ""
    ctx.say(f"ramp {ramp.status} (step {ramp.step + 1} of {len(ramp.plan.steps)}{extra}) by "
            f"{one_line(ctx.actor)}: {one_line(ctx.args.reason)}")
    return 0


def _status(ctx, view: RampView) -> int:
    ramp = view.ramp
    if ctx.args.json:
        ctx.say(json.dumps({
            "ramp": ramp.model_dump(mode="json") if ramp else None,
            "time_in_step_s": view.time_in_step_s, "controller": view.holder,
            "last_evaluation": view.last, "held_since": view.held_since,
            "stalled": view.stalled}))
        return 0
    if ramp is None:  # a state like any other, as `--json` says: not an error
        ctx.say("ramp             none: no ramp has been started (`rollout ramp start PLAN.yaml`)")
        return 0
    rows = _status_rows(view)
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        ctx.say(f"{label:<{width}}  {value}")
    last = view.last
    if last and last.get("gates"):
        for line in _gate_lines(last):
            ctx.say(line)
    if last and last.get("checks"):
        ctx.say("checks:")
        cells = [(c["name"], _num(c["value"]), c["threshold"], c["status"] +
                  (f" ({one_line(c['note'])})" if c.get("note") else "")) for c in last["checks"]]
        for line in table(("CHECK", "VALUE", "EXPECTED", "STATUS"), cells):
            ctx.say("  " + line)
    return 0


def _status_rows(view: RampView) -> list[tuple[str, str]]:
    """The labelled lines of `rollout ramp status`: the ramp, its plan, step and controller."""
    ramp, now = view.ramp, view.now
    plan = ramp.plan
    shares = " -> ".join(format_bp(bp) for bp in plan.shares_bp)
    rows = [
        ("ramp", ramp.status + (" (forced: no verdict needed)" if ramp.forced else "")
         + (f": {one_line(ramp.reason)}" if ramp.status == "aborted" or (
             ramp.status == "paused" and ramp.reason.startswith("deadline:")) else "")),
        ("plan", f"{shares}; window {plan.window_s}s, {plan.failures_tolerated} failing "
                 "evaluation(s) tolerated" + _deadline_text(plan)),
        ("started", f"{when(ramp.started_at)} by {one_line(ramp.started_by)}"),
        ("versions", f"optimized {one_line(ramp.optimized_version)}, baseline "
                     f"{one_line(ramp.baseline_version)}"),
    ]
    if ramp.step < 0:
        rows.append(("step", f"not started (share {format_bp(ramp.start_bp)})"))
    else:
        step = plan.steps[ramp.step]
        rows.append(("step", f"{ramp.step + 1} of {len(plan.steps)}: "
                             f"{format_bp(ramp.expected_bp)}, for {age(view.time_in_step_s or 0)}"
                             f" (needs {step.min_duration_s:g}s and {step.min_samples} samples)"))
    waiting = ramp.waiting_approval()
    if ramp.active and waiting is not None:
        rows.append(("next", f"{format_bp(plan.shares_bp[waiting])} needs `rollout ramp "
                             "approve`"))
    rows.append(("failures", f"{ramp.failures} in a row, {plan.failures_tolerated} tolerated"))
    rows.append(("controller", one_line(view.holder) if view.holder else
                 "none holds the lease (is the application running?)"))
    last = view.last
    if last:
        rows.append(("last evaluation", f"{when(last['ts'])} ({age(now - last['ts'])} ago): "
                                        f"{one_line(last['reason'])}"))
    if view.held_since is not None:
        rows.append(_held_row(view))
    return rows


def _gate_lines(last: dict) -> list[str]:
    """The last evaluation's gates as a table, and the slice table of a slice gate."""
    from ops.cli.slices import gate_slice_lines
    from rollout.ramp.machine import SHADOW_GATES

    shadow = any(g["name"] in SHADOW_GATES for g in last["gates"])
    lines = [f"gates over the last {last.get('window_s')}s ({last.get('samples')} canary "
             "samples" + ("; the shadow gates over the whole step" if shadow else "") + "):"]
    cells = [(g["name"], _num(g["value"]), _num(g["threshold"]), g["status"] +
              (f" ({g['note']})" if g.get("note") else "")) for g in last["gates"]]
    lines += ["  " + line for line in table(("GATE", "VALUE", "THRESHOLD", "STATUS"), cells)]
    return lines + gate_slice_lines(next((g["rows"] for g in last["gates"] if g.get("rows")), ()))


def _deadline_text(plan) -> str:
    if plan.progress_deadline_s is None:
        return "; no progress deadline"
    return (f"; a step held {age(plan.progress_deadline_s)} past its soak is "
            f"{'aborted' if plan.on_deadline == 'abort' else 'paused'}")


def _held_row(view: RampView) -> tuple[str, str]:
    """Since when the step has been held, by how many evaluations, and why; `stalled` when
    the soak no longer explains it."""
    since, last = view.held_since, view.last
    count = (last.get("held") or {}).get("evaluations")
    evaluations = f", {count} evaluations" if count else ""
    label = "STALLED" if view.stalled else "held"
    return label, (f"since {when(since)} ({age(view.now - since)}{evaluations}): "
                   f"{one_line(last['reason'])}")


def _num(value) -> str:
    return "-" if value is None else f"{value:.4g}"
