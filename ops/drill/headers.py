"""`request-id`: is a client's X-Request-ID echoed only when it is well formed?

Requests are sent through http.client, which keeps duplicate response headers (httpx would merge
them), with a well-formed id and with malformed ones: 129 characters, spaces, `%0d%0a`,
`<script>`. Each response must carry exactly one X-Request-ID, the client's own when it was well
formed, and no response header may contain a malformed value (a raw value echoed back could
split the response's headers or carry markup into whatever shows the id).
"""

from __future__ import annotations

import asyncio
import uuid

from ops.drill.client import Target, raw_predict, request_id_problems
from ops.drill.goals import Goal, Report

NAME = "request-id"
HELP = "malformed X-Request-ID values: exactly one id comes back, never the raw value"


def cases() -> list[tuple[str, str, bool]]:
    """(label, X-Request-ID sent, well formed?)"""
    return [
        ("well-formed", f"drill-{uuid.uuid4().hex}", True),
        ("129 characters", "r" * 129, False),
        ("spaces", "drill id with spaces", False),
        ("%0d%0a", "drill%0d%0aX-Injected:%20yes", False),
        ("<script>", "<script>alert(1)</script>", False),
    ]


def add_arguments(parser) -> None:
    """No options of its own."""


def _check(target: Target) -> list[dict]:
    found = []
    for label, sent, well_formed in cases():
        status, headers = raw_predict(target.host, target.port, {"X-Request-ID": sent})
        found.append({"case": label, "status": status,
                      "ids": [v for k, v in headers if k.lower() == "x-request-id"],
                      "problems": request_id_problems(sent, well_formed, headers)})
    return found


async def run(target: Target, args) -> Report:
    report = Report(NAME)
    found = await asyncio.to_thread(_check, target)
    for case in found:
        ids = " | ".join(v if len(v) <= 48 else v[:45] + "..." for v in case["ids"]) or "none"
        report.figures[case["case"]] = f"{case['status']}; X-Request-ID: {ids}"
        report.notes += [f"{case['case']}: {p}" for p in case["problems"]]
    report.goals.append(Goal("responses with a request-id problem",
                             sum(bool(c["problems"]) for c in found), "<=", 0))
    return report
