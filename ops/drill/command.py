"""Incident drills against a running gateway: each scenario reproduces one way a production
gateway is hurt, prints its figures and judges each goal PASS / FAIL.

    python -m ops.drill slow-bodies              # 150 slow uploads beside a normal client
    python -m ops.drill overload                 # open loop at 2x, 5x, 10x measured capacity
    python -m ops.drill burst --kill-during      # 200 clients x 32 long texts at canary 50 %
    python -m ops.drill kill                     # `rollout kill` wall time on a quiet gateway
    python -m ops.drill request-id               # malformed X-Request-ID values
    python -m ops.drill all --json               # each of them with its defaults, then a table

The gateway is the one `ops/run.sh` starts (http://127.0.0.1:8000; loopback only). Every
scenario is bounded in count and time (`SCENARIO --help` lists its options and defaults).
`burst` and `kill` change the rollout state through the `rollout` CLI (actor `drill`, so it is
audited) and restore the share and kill switch they found. Run it on the gateway's machine:
`burst` reads the model replicas' memory from /proc.

The load runs at the Serve workers' niceness (`--nice auto`, the default: that of the
`ray::ServeReplica:*` processes, 15 under Ray), so that it does not preempt the server it
measures; the first figure of each report says what was used and why. The `rollout` commands a
scenario times keep the niceness the drill was started with, as an operator's shell would.

Exit codes: 0 every judged goal passed, 1 a goal failed, 2 the drill could not run (bad option,
no gateway, the CLI refused a change), 130 interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

import httpx

from ops.cli.types import niceness
from ops.drill import burst, headers, kill_latency, overload, slow
from ops.drill.client import DrillError, Target
from ops.drill.goals import Report, format_report, summary_table
from ops.drill.niceness import Niceness, apply_niceness, operator_thread, start_operator_thread

PROG = "python -m ops.drill"
DEFAULT_URL = "http://127.0.0.1:8000"
SCENARIOS = {m.NAME: m for m in (slow, overload, burst, kill_latency, headers)}
_FMT = argparse.RawDescriptionHelpFormatter


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("global options")
    # SUPPRESS: given before or after the scenario, an option is never reset by a default
    group.add_argument("--url", default=argparse.SUPPRESS,
                       help=f"the gateway, loopback only (default {DEFAULT_URL})")
    group.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                       help="print the report as one JSON object")
    group.add_argument("--cli", metavar="CMD", default=argparse.SUPPRESS,
                       help="the rollout CLI to run, e.g. 'rollout --app NAME' (default: the "
                       "`rollout` beside this Python)")
    group.add_argument("--nice", metavar="N", type=niceness, default=argparse.SUPPRESS,
                       help="niceness of the load generator: a number, `auto` (default: the "
                       "Serve replica processes' niceness, so the load does not preempt the "
                       "server it measures) or `none` (leave it as it is)")
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=_FMT,
                                     parents=[common])
    commands = parser.add_subparsers(dest="scenario", metavar="SCENARIO", required=True)
    for name, module in SCENARIOS.items():
        module.add_arguments(commands.add_parser(name, help=module.HELP, parents=[common],
                                                 description=module.__doc__, formatter_class=_FMT))
    commands.add_parser("all", parents=[common], formatter_class=_FMT,
                        help="every scenario in turn with its defaults, then a summary table",
                        description="Runs " + ", ".join(SCENARIOS) + " in this order, each with "
                        "its defaults (about 6 minutes), prints each report and a summary table.")
    return parser


def _globals(args: argparse.Namespace) -> argparse.Namespace:
    args.url = getattr(args, "url", DEFAULT_URL)
    args.json = getattr(args, "json", False)
    args.cli = getattr(args, "cli", None)
    args.nice = getattr(args, "nice", "auto")
    return args


def _preflight(target: Target) -> None:
    """A DrillError unless a gateway answers /healthz at the target."""
    try:
        httpx.get(f"{target.url}/healthz", timeout=5, trust_env=False).raise_for_status()
    except httpx.HTTPError as exc:
        raise DrillError(f"no gateway at {target.url} ({type(exc).__name__}: {exc}); "
                         "start one with ops/run.sh or pass --url") from None


async def _scenario(name: str, target: Target, args: argparse.Namespace) -> Report:
    operator = operator_thread()
    if operator is not None:  # a scenario's to_thread work runs at the operator's niceness
        asyncio.get_running_loop().set_default_executor(operator)
    return await SCENARIOS[name].run(target, args)


def run_one(name: str, target: Target, args: argparse.Namespace,
            nice: Niceness | None = None) -> Report:
    """One scenario; a DrillError becomes the report's error. The niceness the load ran at,
    when given, is the report's first figure."""
    try:
        report = asyncio.run(_scenario(name, target, args))
    except DrillError as exc:
        report = Report(name, error=str(exc))
    if nice is not None:
        report.figures = {"client niceness": nice.figure(), **report.figures}
        timed = name == "kill" or (name == "burst" and getattr(args, "kill_during", False))
        if timed and nice.used != nice.was and operator_thread() is not None:
            report.notes.append(f"the `rollout` commands timed here ran at niceness {nice.was}, "
                                "as from the operator's shell")
    return report


def _run_all(parser: argparse.ArgumentParser, target: Target, args,
             nice: Niceness) -> list[Report]:
    reports = []
    for name in SCENARIOS:
        scenario_args = parser.parse_args([name])
        scenario_args.url, scenario_args.json, scenario_args.cli = args.url, args.json, args.cli
        scenario_args.nice = args.nice
        reports.append(run_one(name, target, scenario_args, nice))
        if not args.json:
            print(format_report(reports[-1]), end="\n\n", flush=True)
    return reports


def _exit_code(reports: list[Report]) -> int:
    if any(r.error for r in reports):
        return 2
    return 1 if any(r.passed is False for r in reports) else 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = _globals(parser.parse_args(argv))
    try:
        target = Target.parse(args.url)
        _preflight(target)
    except DrillError as exc:
        print(f"drill: {exc}", file=sys.stderr)
        return 2
    if args.nice != "none":
        start_operator_thread()  # before the niceness changes: it keeps the one found
    nice = apply_niceness(args.nice)
    try:
        if args.scenario == "all":
            reports = _run_all(parser, target, args, nice)
            output = ({"scenarios": [r.to_dict() for r in reports],
                       "exit_code": _exit_code(reports)} if args.json
                      else summary_table(reports))
        else:
            reports = [run_one(args.scenario, target, args, nice)]
            output = reports[0].to_dict() if args.json else format_report(reports[0])
    except KeyboardInterrupt:
        print("drill: interrupted", file=sys.stderr)
        return 130
    print(json.dumps(output) if args.json else output)
    return _exit_code(reports)

