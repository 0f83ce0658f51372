"""The anchor: the gateway against a plain Ray Serve deployment of the same model
(ops.bench.plain), cell by cell, so anyone can see on their own machine what the gateway costs
or gains.

A *cell* is one request size (texts per request) at one concurrency, measured on the plain
deployment and on each arm through the gateway in the same run, with the same load generator
(ops.bench.endtoend). Per cell and side:

- *texts/s*: texts of the requests answered 200 over the measured window (`inputs_per_s`);
- *refused share*: requests not answered 200 (any other status, or no answer at all) / requests
  sent, both counted by the load generator over the same window, so a side that answers fast by
  refusing much shows it;
- *gateway ÷ plain* (per arm): the arm's texts/s / the plain deployment's; above 1 the gateway
  gains (its batching, the arm's recipe), below 1 it costs. None when either side answered
  nothing.

A side that sent nothing in the measured window (every request it sent during the warm-up took
longer than the window: lengthen `--seconds`) was not measured: its texts/s is None, not 0.

A level without `inputs_per_request` (a result from before the sweep) has the run's one size.
"""

from __future__ import annotations


def refused_share(level: dict) -> float | None:
    """Requests not answered 200 / requests sent, over the measured window; None if none sent."""
    sent = level.get("sent")
    if not sent:
        return None
    return sum(level["failed"].values()) / sent


def cell(level: dict, default_size: int) -> tuple[int, int]:
    """(texts per request, concurrency) of a level."""
    return level.get("inputs_per_request", default_size), level["concurrency"]


def _measured(level: dict) -> bool:
    """Whether the level sent anything in its measured window (an older result: yes)."""
    return level.get("sent") != 0


def _side(level: dict) -> dict:
    return {"inputs_per_s": level["inputs_per_s"] if _measured(level) else None,
            "refused_share": refused_share(level)}


def compare(result: dict) -> list[dict]:
    """One row per plain cell, in the plain levels' order: its request size and concurrency,
    the plain side, and each arm measured in that cell with its ratio (module docstring)."""
    size = result["meta"]["inputs_per_request"]
    gateway = result.get("gateway") or {}
    rows = []
    for plain in result.get("plain") or []:
        key = cell(plain, size)
        arms = {}
        for arm, levels in gateway.items():
            found = next((lv for lv in levels if cell(lv, size) == key), None)
            if found is not None:
                ratio = (found["inputs_per_s"] / plain["inputs_per_s"]
                         if found["ok"] and plain["ok"] else None)
                arms[arm] = {**_side(found), "ratio": ratio}
        rows.append({"inputs_per_request": key[0], "concurrency": key[1],
                     "plain": _side(plain), "arms": arms})
    return rows
