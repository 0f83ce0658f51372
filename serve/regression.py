"""Regression sets: JSONL files of inputs both variants must agree on.

Format, one JSON object per line (blank lines are skipped):

    {"text": "The striker scored twice", "label": "sports"}
    {"text": "SELECT 1;"}

- `text` (required): a non-empty string, the input as a client would send it.
- `label` (optional): the true label, one of the model's labels; when present, `rollout verify`
  also reports the accuracy of both variants.
- any other key (the shipped set has `kind`) is kept as metadata and otherwise ignored.

The default set ships as `serve/data/regression.jsonl` (made by `python -m
ops.generate.regression_set`). Its inputs fall in three splits by index, so that nothing is judged
on the inputs it was tuned or chosen on:

- *calibration* (every 4th input: 0, 4, 8, ...): what a calibrated recipe tunes on (SmoothQuant
  alpha, the layers kept in fp32, any search: serve.ovint8, serve.onnxrt, serve.layer_plan);
- *validation* (every 8th from 1: 1, 9, 17, ...): what `auto` chooses a recipe on
  (serve.autopick), inputs no recipe tuned on;
- *held-out* (the rest, 5 of every 8): what `rollout verify` gates on, inputs neither tuning nor
  `auto` saw.

A text that occurs more than once belongs to the split of its first occurrence wherever it
occurs, so that no input is judged on a copy of itself that was tuned on.

A set other than the configured one (`rollout verify --set`) was seen by neither: verify then
judges all of it (split `external`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_SET = Path(__file__).resolve().parent / "data" / "regression.jsonl"
CALIBRATION_EVERY = 4  # index % 4 == 0: calibration
VALIDATION_EVERY, VALIDATION_AT = 8, 1  # index % 8 == 1: validation


def split_at(index: int) -> str:
    """The split of the input first seen at `index` (module docstring)."""
    if index % CALIBRATION_EVERY == 0:
        return "calibration"
    return "validation" if index % VALIDATION_EVERY == VALIDATION_AT else "held-out"


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
        return self._split("calibration")

    def validation(self) -> list[int]:
        return self._split("validation")

    def held_out(self) -> list[int]:
        """The inputs neither calibration nor `auto`'s validation saw."""
        return self._split("held-out")

    def _split(self, name: str) -> list[int]:
        first: dict[str, int] = {}
        return [i for i, example in enumerate(self.examples)
                if split_at(first.setdefault(example.text, i)) == name]

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
