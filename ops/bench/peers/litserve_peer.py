"""LitServe as a peer: its command line, body and answer (the server is litserve_app.py).

It runs in this project's virtualenv, from the `peers` extra (`pip install -e '.[peers]'`),
with the packaged model folder as it is.
"""

from __future__ import annotations

import sys
from pathlib import Path

VERSION = "0.2.19"  # the `peers` extra's pin
MAX_BATCH_SIZE = 16  # LitServe's documented batching: 16 requests or 5 ms
BATCH_TIMEOUT_MS = 5


def python() -> Path:
    """This project's Python: LitServe is installed beside the gateway."""
    return Path(sys.executable)


def arguments(model_dir: Path, port: int) -> list[str]:
    return ["--model", str(model_dir), "--port", str(port),
            "--max-batch-size", str(MAX_BATCH_SIZE),
            "--batch-timeout", str(BATCH_TIMEOUT_MS / 1000)]


def body(texts: list[str]) -> dict:
    """The gateway's own request body."""
    return {"inputs": texts, "task": "embed"}


def vectors(answer: dict) -> list[list[float]]:
    return [row["embedding"] for row in answer["outputs"]]
