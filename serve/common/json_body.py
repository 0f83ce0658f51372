"""JSON bodies at the cost of their bytes: every front door's answer is encoded by orjson.

An embedding answer is mostly floats, and the standard `json` module formats each through
Python's `float.__repr__`: about 2 ms of the event loop for an 8-text answer of 384-wide
vectors (docs/benchmarks.md). orjson writes the same shortest round-trip digits in native code,
an order of magnitude faster. Two differences from `json.dumps` that callers rely on:
exponents are written without a sign or leading zero (`1e-7`, not `1e-07`; both are JSON),
and a NaN or infinity would become `null`, so the models refuse non-finite outputs before
they reach here (serve.recipes.variants `rounded`).
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response


def dumps(content: Any) -> bytes:
    """`content` as compact UTF-8 JSON (numpy arrays written as lists)."""
    return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)


class JSONBody(Response):
    """Starlette's `JSONResponse`, encoded by orjson."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return dumps(content)
