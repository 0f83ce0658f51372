"""What a `rollout` command handler changes the rollout through: the context of every command
(ops.cli.commands) and of `kill` / `unkill` (ops.cli.kill) derive from it.

Every change goes one way, `ctx.change(...)`: ask when it is a big move (`Ask`: a prompt on a
terminal, `--yes`, else a usage error), make the compare-and-set change, print the one line
that says what changed, at which revision, by whom and why.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import IO, TYPE_CHECKING, NamedTuple

from ops.cli.args import default_actor
from ops.cli.errors import Aborted, UsageError
from ops.cli.format import change_line
from rollout.change import jumped
from rollout.share import big_move

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
    """The part of a handler's context that changes the rollout: its streams, and whether
    stdin is a terminal to ask on."""

    args: object
    rollout: object  # rollout.control.Rollout, or `kill`'s rollout.killswitch.QuickSwitch
    out: IO[str]
    err: IO[str]
    stdin: IO[str]
    interactive: bool

    @property
    def actor(self) -> str:
        return getattr(self.args, "actor", None) or default_actor()

    def say(self, line: str) -> None:
        self.out.write(line + "\n")

    def confirm(self, before: RolloutState, planned: RolloutState, question: str,
                what: str) -> None:
        """Ask before a big move; refuse without a terminal unless --yes."""
        if self.args.yes or not big_move(before, planned):
            return
        if not self.interactive:
            raise UsageError(f"{what} needs confirmation: pass --yes to confirm "
                             "(stdin is not a terminal)")
        self.err.write(f"{question} [y/N] ")
        self.err.flush()
        answer = self.stdin.readline()
        if not (answer.endswith("\n") and is_terminal(self.stdin)):  # a terminal echoed it
            self.err.write("\n")
        if answer.strip().lower() not in ("y", "yes"):
            raise Aborted()

    def done(self, what: str, after: RolloutState) -> None:
        self.say(change_line(what, after))

    def change(self, make: Callable[[], Change], report: Callable[[RolloutState, RolloutState],
               str], ask: Ask | None = None) -> RolloutState:
        """Confirm (when `ask` is a big move), change, report: the state after the change."""
        if ask is not None:
            self.confirm(*ask)
        before, after = make()
        warning = jumped(before, after)
        if warning:
            self.err.write(f"rollout: warning: {warning}\n")
        self.done(report(before, after), after)
        return after


def is_terminal(stream) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError):
        return False
