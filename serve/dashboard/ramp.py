"""The dashboard's ramp panel: the ramp as `rollout ramp status --json` shows it, and the
operators' ramp actions through the CLI's audited path (rollout.ramp.RampControl).

    GET  /v1/ramp              {"active", "ramp", "time_in_step_s", "controller", "last_evaluation"}
    POST /v1/ramp/<action>     pause, resume, approve, abort: {"reason", "actor"}

`last_evaluation` carries every gate (`gates`) and every HTTP check of the step (`checks`:
name, status pass|fail|wait, value, threshold, note); the panel shows both tables.

Reads use the gateway's own connection (its Redis user may read the ramp keys); actions, after
the operator token was checked, the control connection, as `dashboard:<name>@<client>` like the
other actions. A ramp that does not allow an action (resume while running, approve with nothing
to approve, no ramp at all) is a 409; like the CLI's, ramp actions ask no confirmation (abort
only ever lowers the share, and approve is itself the confirmation).
"""

from __future__ import annotations

from rollout import PermissionDenied, RampNotAllowed, StoreUnavailable
from rollout.ramp import RampControl
from serve.dashboard.actions import Change, actor_of, parse, rollout_errors
from serve.dashboard.errors import ControlUnavailable, InvalidInput, NotFound, RampNotPossible

ACTIONS = ("pause", "resume", "approve", "abort")


def ramp_status(control: RampControl) -> dict:
    """`rollout ramp status --json`, plus whether a ramp is active."""
    try:
        view = control.view()
    except (StoreUnavailable, PermissionDenied) as exc:
        raise ControlUnavailable(f"cannot read the ramp: {exc}") from None
    ramp = view.ramp
    return {
        "active": bool(ramp is not None and ramp.active),
        "ramp": ramp.model_dump(mode="json") if ramp else None,
        "time_in_step_s": view.time_in_step_s, "controller": view.holder,
        "last_evaluation": view.last,
    }


def ramp_action(control: RampControl, action: str, body: bytes, client: str | None) -> dict:
    """Apply one ramp action; answers like the other actions, with the ramp as `ramp`."""
    if action not in ACTIONS:
        raise NotFound(f"no ramp action {action!r} ({', '.join(ACTIONS)})")
    change = parse(body, Change)
    if change.confirm or change.expected_revision is not None:
        raise InvalidInput("ramp actions take only a reason and an actor")
    actor = actor_of(change, client)
    with rollout_errors(conflict="the controller kept writing; try again"):
        try:
            ramp = getattr(control, action)(actor=actor, reason=change.reason)
        except RampNotAllowed as exc:
            raise RampNotPossible(str(exc)) from None
    return {"changed": True, "ramp": ramp.model_dump(mode="json"),
            "message": f"ramp {ramp.status} (step {ramp.step + 1} of {len(ramp.plan.steps)})"}
