"""Regression sets: JSONL files of inputs both variants must agree on.

Format, one JSON object per line (blank lines are skipped):

    {"text": "The striker scored twice", "label": "sports"}
    {"text": "SELECT 1;"}

- `text` (required): a non-empty string, the input as a client would send it.
- `label` (optional): the true label, one of the model's labels; when present, `rollout verify`
  also reports the accuracy of both variants.
- any other key (the shipped set has `kind`) is kept as metadata and otherwise ignored.

The default set ships as `serve/data/regression.jsonl` (made by `python -m
ops.make_regression_set`). Every 4th input (index 0, 4, 8, ...) forms the *calibration* split
that the accuracy-aware recipe tunes on; the rest is the *held-out* split that proves it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_SET = Path(__file__).resolve().parent / "data" / "regression.jsonl"
CALIBRATION_EVERY = 4


class RegressionSetError(ValueError):
    """A regression set file is missing or malformed (the message names the line)."""


@dataclass(frozen=True)
class Example:
    text: str
    label: str | None = None
    meta: dict = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class RegressionSet:
    path: str
    examples: tuple[Example, ...]
    digest: str  # sha256 of the file's bytes, first 16 hex digits

    def __len__(self) -> int:
        return len(self.examples)

    @property
    def texts(self) -> list[str]:
        return [e.text for e in self.examples]

    def calibration(self) -> list[int]:
        return list(range(0, len(self.examples), CALIBRATION_EVERY))

    def held_out(self) -> list[int]:
        return [i for i in range(len(self.examples)) if i % CALIBRATION_EVERY]

    def limited(self, limit: int | None) -> RegressionSet:
        """The first `limit` inputs (all when None); the digest names the slice."""
        if limit is None or limit >= len(self.examples):
            return self
        return RegressionSet(self.path, self.examples[:limit], f"{self.digest}:{limit}")


def load_set(
    path: str | Path | None = None, labels: tuple[str, ...] | None = None
) -> RegressionSet:
    """Read and check a set; `labels` (the model's) rejects unknown `label` values."""
    path = Path(path) if path else DEFAULT_SET
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise RegressionSetError(f"cannot read regression set {path}: {exc.strerror}") from None
    examples = []
    for number, line in enumerate(raw.decode("utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise RegressionSetError(f"{path}:{number}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise RegressionSetError(f"{path}:{number}: expected a JSON object")
        text, label = row.pop("text", None), row.pop("label", None)
        if not isinstance(text, str) or not text.strip():
            raise RegressionSetError(f"{path}:{number}: `text` must be a non-empty string")
        if label is not None and (not isinstance(label, str) or (labels and label not in labels)):
            raise RegressionSetError(
                f"{path}:{number}: `label` {label!r} is not one of the model's labels"
            )
        examples.append(Example(text, label, row))
    if not examples:
        raise RegressionSetError(f"regression set {path} has no inputs")
    return RegressionSet(str(path), tuple(examples), hashlib.sha256(raw).hexdigest()[:16])
