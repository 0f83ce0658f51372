"""`rollout route add|list|remove`: header routes that beat the hashed share
(rollout.header_routes).

A route is part of the rollout state, so adding or removing one is an audited compare-and-set
(`route-add` / `route-remove`) that every gateway applies within milliseconds, like a share
change. The kill switch still beats every route.
"""

from __future__ import annotations

import argparse
import json

from ops.cli.format import one_line, table, when
from ops.cli.types import header_route

_ACTIONS = {
    "add": ("send requests with a header value to an arm (audited)",
            "Add a header route: a request whose header NAME carries one of the VALUEs (exact\n"
            "match; names are case-insensitive) goes to ARM, whatever its hashed bucket. Routes\n"
            "are tried in id order (r1, r2, ...), after the kill switch, the stale-state\n"
            "fail-safe and the operator override, before the hashed share. Requests no route\n"
            "matches keep their arm. At most 32 routes of at most 32 values each.",
            "examples:\n"
            "  rollout route add --header X-User-Group=internal --arm optimized "
            "--reason \"QA on v2\"\n"
            "  rollout route add --header x-tenant=acme,globex --arm baseline "
            "--reason \"contract: pinned to v1\""),
    "list": ("list the header routes",
             "List the header routes in the order they are tried: id, header, values, arm,\n"
             "who added it, when and why.",
             "examples:\n  rollout route list\n  rollout route list --json | jq '.[].id'"),
    "remove": ("remove a header route (audited)",
               "Remove the route ID (see `rollout route list`): its requests are routed by the\n"
               "hashed share again.",
               "examples:\n  rollout route remove r1 --reason \"QA done\""),
}


def add_parser(commands, common, text) -> None:
    """The `route` command and its actions; `text` checks a one-line reason."""
    fmt = argparse.RawDescriptionHelpFormatter
    route = commands.add_parser(
        "route", help="header routes: pin requests with a header value to an arm",
        description="Header routes send requests whose header carries a given value to a named\n"
                    "arm, ahead of the hashed share (QA, internal users, pinned tenants). The\n"
                    "kill switch beats every route.",
        epilog="examples:\n  rollout route add --header X-User-Group=internal --arm optimized "
               "--reason \"QA\"\n  rollout route list\n  rollout route remove r1 --reason "
               "\"QA done\"",
        parents=[common], formatter_class=fmt)
    actions = route.add_subparsers(dest="route_action", metavar="ACTION", required=True)
    for name, (short, description, epilog) in _ACTIONS.items():
        sub = actions.add_parser(name, help=short, description=description, epilog=epilog,
                                 parents=[common], formatter_class=fmt)
        if name == "add":
            sub.add_argument("--header", required=True, metavar="NAME=VALUE[,VALUE...]",
                             type=header_route, help="the request header and its value(s), exact")
            sub.add_argument("--arm", required=True, choices=("baseline", "optimized"),
                             help="where matching requests go")
        if name == "remove":
            sub.add_argument("route_id", metavar="ID", type=text,
                             help="the route's id, e.g. r1 (see `rollout route list`)")
        if name == "list":
            sub.add_argument("--json", action="store_true", help="print JSON")
        else:
            sub.add_argument("--reason", required=True, type=text,
                             help="why, for the audit log (required)")


def run(ctx) -> int:
    action = ctx.args.route_action
    if action == "list":
        return _list(ctx)
    args = ctx.args
    if action == "add":
        header, values = args.header
        after = ctx.change(
            lambda: ctx.rollout.add_route(header, values, args.arm, actor=ctx.actor,
                                          reason=args.reason),
            lambda _, after: f"route {after.routes[-1].describe()} added")
    else:
        after = ctx.change(
            lambda: ctx.rollout.remove_route(args.route_id, actor=ctx.actor, reason=args.reason),
            lambda before, _: f"route {_route(before, args.route_id).describe()} removed")
    if after.kill:
        ctx.warn("the kill switch is on: every request goes to baseline until `rollout unkill`")
    return 0


def _route(state, route_id: str):
    return next(r for r in state.routes if r.id == route_id)


def _list(ctx) -> int:
    routes = ctx.rollout.state().routes
    if ctx.args.json:
        ctx.say(json.dumps([route.model_dump(mode="json") for route in routes]))
    elif not routes:
        ctx.say("no header routes: every request is routed by the hashed share")
    else:
        rows = [(r.id, r.header, ",".join(r.values), r.arm, when(r.created_at), r.created_by,
                 r.reason) for r in routes]
        for line in table(("ID", "HEADER", "VALUES", "ARM", "ADDED", "BY", "REASON"), rows):
            ctx.say(line)
    return 0


def status_lines(routes) -> list[tuple[str, str]]:
    """`rollout status` rows: one per route (none without routes)."""
    return [(f"route {route.id}", one_line(f"{route.header} = {'|'.join(route.values)} -> "
                                           f"{route.arm} ({route.reason})"))
            for route in routes]
