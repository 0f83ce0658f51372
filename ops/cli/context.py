"""What a `rollout` command handler changes the rollout through, on either path: the full path's
context (ops.cli.commands) and the kill fast path's (ops.cli.kill) both derive from it.

Every change goes one way, `ctx.change(...)`: ask when it is a big move (`Ask`; each path
decides how: a prompt, `--yes`, or stepping aside), make the compare-and-set change, print the
one line that says what changed, at which revision, by whom and why.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from ops.cli.args import default_actor
from ops.cli.format import change_line

if TYPE_CHECKING:
    from rollout.state import RolloutState

    Change = tuple[RolloutState, RolloutState]  # the state before and after, as Rollout returns


class Ask(NamedTuple):
    """A confirmation a change may need: asked only when `before` -> `planned` is a big move."""

    before: RolloutState
    planned: RolloutState
    question: str  # asked on a terminal
    what: str  # named in the refusal without a terminal: '<what> needs confirmation'


class ChangeContext:
    """The part of a handler's context that changes the rollout; subclasses say and confirm."""

    args: object
    rollout: object  # rollout.control.Rollout, or the fast path's rollout.killswitch.QuickSwitch

    @property
    def actor(self) -> str:
        return getattr(self.args, "actor", None) or default_actor()

    def say(self, line: str) -> None:
        raise NotImplementedError

    def confirm(self, before: RolloutState, planned: RolloutState, question: str,
                what: str) -> None:
        raise NotImplementedError

    def done(self, what: str, after: RolloutState) -> None:
        self.say(change_line(what, after))

    def change(self, make: Callable[[], Change], report: Callable[[RolloutState, RolloutState],
               str], ask: Ask | None = None) -> RolloutState:
        """Confirm (when `ask` is a big move), change, report: the state after the change."""
        if ask is not None:
            self.confirm(*ask)
        before, after = make()
        self.done(report(before, after), after)
        return after
