"""Command-line parsing for `rollout`: the commands, their help text, and the settings.

Everything the operator types is checked here, before any store is opened: a bad share, an
empty reason or a bad setting is a usage error (exit 2) that never reaches Redis.
"""

from __future__ import annotations

import argparse
import getpass
import os
import socket
from typing import TYPE_CHECKING

from ops.cli import flips, ramp, route
from ops.cli.errors import PROG, UsageError
from ops.cli.types import canary_percent, positive_int, text

if TYPE_CHECKING:
    from rollout.settings import Settings

__all__ = ["PROG", "build_parser", "default_actor", "invalid_setting", "settings_from"]


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage dump; main() maps it to exit 2
        raise UsageError(f"{message} (see '{self.prog} --help')")


_MAIN_EPILOG = """\
examples:
  rollout status
  rollout canary 5 --reason "first 5%"
  rollout kill --reason "p99 regression"
  rollout audit --last 20
  rollout ramp start ops/plans/example-ramp.yaml --reason "ramp v2"
  rollout route add --header X-User-Group=internal --arm optimized --reason "QA"
  rollout flips --last 20 --export flips.jsonl
  rollout --app search --redis-url redis://redis.internal:6379/0 status --json

Changes need --reason. Moving the share by 50 points or more, or to 100%, asks for confirmation
(pass --yes when not at a terminal). Exit codes: 0 done, 1 store unavailable, conflict or
aborted, 2 invalid usage or input, 130 interrupted.

environment: REDIS_URL, CANARY_APP_NAME, ROLLOUT_ACTOR (see also `--redis-url`, `--app`, `--actor`)
"""

_COMMANDS = {
    "status": (
        "show the canary share, kill switch and versions",
        "Show what every gateway routes by: the canary share, the kill switch, the share that\n"
        "actually reaches the optimized model, the model versions and the last change; then,\n"
        "per arm over the last --window seconds (from the gateways' telemetry in Redis):\n"
        "request rate, success / error / timeout / retry rates, p50 / p99 latency, queue\n"
        "length, mean batch size, compute time per answered call and cost per 1,000 calls;\n"
        "and the online agreement of shadowed requests (CANARY_SHADOW_SHARE): top-1\n"
        "agreement with its 95% lower bound and pair count, by baseline margin, embedding\n"
        "cosine, and shadow work shed or failed.",
        "examples:\n  rollout status\n  rollout status --window 300\n"
        "  rollout status --json | jq .effective_percent\n"
        "  rollout status --json | jq .traffic.shadow.lower_bound",
    ),
    "canary": (
        "move the canary share (audited)",
        "Set the share of traffic sent to the optimized model. Raising it only adds routing\n"
        "keys to the canary. A move of 50 points or more, or to 100%, asks for confirmation.\n"
        "While the kill switch is on the new share is stored but traffic stays on baseline.",
        "examples:\n  rollout canary 5 --reason \"first 5%\"\n"
        "  rollout canary 0.25 --reason \"smoke test\"\n"
        "  rollout canary 100 --reason \"promote v2\" --yes",
    ),
    "kill": (
        "send all traffic to baseline now (audited)",
        "Turn the kill switch on: every gateway routes everything to baseline within\n"
        "milliseconds. The canary share is kept, for `rollout unkill`. Never asks.",
        "examples:\n  rollout kill --reason \"p99 regression\"",
    ),
    "unkill": (
        "turn the kill switch off (audited)",
        "Turn the kill switch off: the stored canary share reaches the optimized model again.\n"
        "Asks for confirmation when that share is 50% or more.",
        "examples:\n  rollout unkill --reason \"fixed in v2.1\"",
    ),
    "audit": (
        "list recorded changes",
        "List the audit log, oldest first: who changed what, when, why, and the revision.",
        "examples:\n  rollout audit --last 20\n  rollout audit --json",
    ),
    "verify": (
        "prove the optimized model on the regression set (agreement, flips, speed, memory)",
        "Load the baseline and the optimized variant in this process, run the regression set\n"
        "through both and report top-1 agreement with its 95% Wilson interval, the flipped\n"
        "inputs with both margins (confident flips, at a baseline margin >= 0.05, apart),\n"
        "agreement by baseline margin and by slice (script, length, baseline label; worst\n"
        "first), embedding cosine, accuracy on labelled inputs, throughput at several batch\n"
        "sizes on length-sorted (served) and set-order batches, and memory. On the configured\n"
        "set only its held-out split is judged (inputs no recipe tuned on and `auto` did not\n"
        "choose on); the calibration split's figures are shown beside them. The verdict, with\n"
        "the thresholds, split and set it was judged with, is stored in Redis against the two\n"
        "versions. Exits 1 when a threshold (CANARY_VERIFY_*) is not met. Loading the models\n"
        "takes seconds; a calibrated recipe builds once (about a minute) and is cached.\n"
        "A causal LM (the baseline folder holds one) is judged by its tokens instead: the\n"
        "baseline's greedy continuation of CANARY_VERIFY_PROMPTS prompts scored by both arms\n"
        "(KL divergence and top-1 token agreement per answer with 95% bounds, by slice;\n"
        "identical continuations, perplexity, decode tokens/s; docs/generative.md).",
        "examples:\n  rollout verify\n  rollout verify --recipe bf16 --limit 500 --no-store\n"
        "  rollout verify --recipe accuracy-aware --json | jq .agreement_lower_bound\n"
        "  rollout verify --set my-inputs.jsonl   # one JSON object per line: text, label?",
    ),
    "revert": (
        "restore the share, kill switch and routes of an earlier revision (audited)",
        "Restore the canary share, kill switch and header routes recorded at REVISION (see\n"
        "`rollout audit`), as a new audited revision. Model versions are kept. Asks for\n"
        "confirmation like `rollout canary` when the share moves by 50 points or more, or to\n"
        "100%.",
        "examples:\n  rollout revert 7 --reason \"back to the last good share\"",
    ),
    "traces": (
        "list recent traces, or show one as a waterfall",
        "List the newest traces the gateways kept in Redis, or show one trace (by request id\n"
        "or trace id) as a waterfall: every span of the gateway and the model replica, its\n"
        "start and duration in ms, and its key attributes.",
        "examples:\n  rollout traces --last 20\n  rollout traces --request-id req-42\n"
        "  rollout traces --trace-id 0af7651916cd43dd8448eb211c80319c --json",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    common = _common_options()
    parser = _Parser(prog=PROG, parents=[common], formatter_class=fmt, epilog=_MAIN_EPILOG,
                     description="Look at and change the canary rollout of the model gateway.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    sub = {}
    for name, (short, description, epilog) in _COMMANDS.items():
        sub[name] = commands.add_parser(name, help=short, description=description, epilog=epilog,
                                        parents=[common], formatter_class=fmt)
    _add_change_options(sub)
    _add_verify_options(sub["verify"])
    _add_read_options(sub)
    ramp.add_parser(commands, common, text("reason"))
    route.add_parser(commands, common, text("reason"))
    flips.add_parser(commands, common, positive_int)
    return parser


def _common_options() -> argparse.ArgumentParser:
    """The options every command takes (before or after its name)."""
    common = _Parser(add_help=False)
    group = common.add_argument_group("global options")
    group.add_argument("--app", metavar="NAME", default=argparse.SUPPRESS,
                       help="application whose rollout to use "
                            "(default: CANARY_APP_NAME, else 'default')")
    group.add_argument("--redis-url", metavar="URL", default=argparse.SUPPRESS,
                       help="Redis holding the rollout state (default: REDIS_URL)")
    group.add_argument("--actor", metavar="NAME", type=text("actor"), default=argparse.SUPPRESS,
                       help="who makes the change, for the audit log "
                            "(default: ROLLOUT_ACTOR, else user@host)")
    return common


def _add_change_options(sub: dict) -> None:
    """The audited changes: canary, kill, unkill, revert."""
    sub["canary"].add_argument("percent", metavar="PCT", type=canary_percent,
                               help="new share in percent, 0-100, at most two decimals")
    sub["revert"].add_argument("revision", metavar="REVISION", type=positive_int,
                               help="the revision whose share and kill switch to restore")
    for name in ("canary", "kill", "unkill", "revert"):
        sub[name].add_argument("--reason", required=True, type=text("reason"),
                               help="why, for the audit log (required)")
    for name in ("canary", "unkill", "revert"):
        sub[name].add_argument("-y", "--yes", action="store_true",
                               help="do not ask for confirmation of a big move")
    for name in ("status", "audit", "traces", "verify"):
        sub[name].add_argument("--json", action="store_true", help="print JSON")


def _add_verify_options(verify: argparse.ArgumentParser) -> None:
    verify.add_argument("--set", dest="set_path", metavar="PATH",
                        help="JSONL set to judge on (default: CANARY_REGRESSION_SET, else the "
                             "shipped set); calibration (ov-int8, onnx-int8, accuracy-aware, "
                             "auto) keeps CANARY_REGRESSION_SET's split, so the variant judged "
                             "is the one the gateway serves; another set is judged whole")
    verify.add_argument("--recipe", metavar="NAME",
                        help="optimization recipe of the optimized variant (default: "
                             "CANARY_OPTIMIZED_RECIPE); see docs/recipes.md for the list")
    verify.add_argument("--limit", metavar="N", type=positive_int, help="only the first N inputs")
    verify.add_argument("--no-speed", action="store_true",
                        help="skip the throughput and memory measurement (and the speedup "
                             "gate); a ramp climbs on such a verdict only when its plan sets "
                             "accept_verdict_without_speed")
    verify.add_argument("--no-store", action="store_true", help="do not store the verdict")
    verify.add_argument("-q", "--quiet", action="store_true", help="no progress bar")


def _add_read_options(sub: dict) -> None:
    """audit, status, traces."""
    sub["audit"].add_argument("--last", metavar="N", type=positive_int,
                              help="only the newest N entries")
    sub["status"].add_argument("--window", metavar="SECONDS", type=positive_int, default=60,
                               help="per-arm traffic over the last SECONDS (default 60)")
    sub["traces"].add_argument("--last", metavar="N", type=positive_int, default=20,
                               help="list the newest N traces (default 20)")
    which = sub["traces"].add_mutually_exclusive_group()
    which.add_argument("--request-id", metavar="ID", type=text("request id"),
                       help="show the trace of this request as a waterfall")
    which.add_argument("--trace-id", metavar="ID", type=text("trace id"),
                       help="show this trace as a waterfall")


def default_actor() -> str:
    actor = os.environ.get("ROLLOUT_ACTOR", "").strip()
    if actor:
        return actor
    try:
        user = getpass.getuser()
    except (OSError, KeyError, ImportError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def settings_from(args) -> Settings:
    from pydantic import ValidationError  # imported here: `kill` parses without pydantic

    from rollout.settings import Settings

    overrides = {}
    if getattr(args, "app", None) is not None:
        overrides["app_name"] = args.app
    if getattr(args, "redis_url", None) is not None:
        overrides["redis_url"] = args.redis_url
    if getattr(args, "recipe", None) is not None:
        overrides["optimized_recipe"] = args.recipe
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise UsageError("; ".join(_setting_problem(e) for e in exc.errors())) from None


def _setting_problem(error: dict) -> str:
    msg = error["msg"].removeprefix("Value error, ")
    if not error["loc"]:
        return f"invalid settings: {msg}"
    return invalid_setting(str(error["loc"][0]).lower(), msg)


def invalid_setting(field: str, message: str) -> str:
    """Which setting is bad and why, named by its variable (and flag), never its value (a Redis
    URL may carry a password): every settings error of `rollout`, `kill`'s included."""
    name = {"redis_url": "REDIS_URL (--redis-url)", "app_name": "CANARY_APP_NAME (--app)"}.get(
        field, f"CANARY_{field.upper()}"
    )
    return f"invalid setting {name}: {message}"
