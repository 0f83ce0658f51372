"""Regression sets: JSONL files of inputs both variants must agree on.

Format, one JSON object per line (blank lines are skipped):

    {"text": "The striker scored twice", "label": "sports"}
    {"text": "SELECT 1;"}

- `text` (required): a non-empty string, the input as a client would send it.
- `label` (optional): the true label, one of the model's labels; when present, `rollout verify`
  also reports the accuracy of both variants.
- `relevant` (optional): a list of the indices (0-based, among the set's inputs) of the inputs
  relevant to this one as a search query; `query_of` (optional): one such index, or a list, for
  a text written as a query for that input. Either makes the input a *query* with relevance
  labels: for an embedding model `rollout verify` then reports recall@10 against them
  (rollout.retrieval, `ground_truth`) beside its neighbour figures;
- any other key (the shipped set has `kind`) is kept as metadata and otherwise ignored.

The default set ships as `serve/common/data/regression.jsonl` (made by `python -m
ops.generate.regression_set`). Its inputs fall in three splits by index, so that nothing is judged
on the inputs it was tuned or chosen on:

- *calibration* (every 4th input: 0, 4, 8, ...): what a calibrated recipe tunes on (SmoothQuant
  alpha, the layers kept in fp32, any search: serve.recipes.ov_int8, serve.recipes.onnx,
  serve.recipes.accuracy_aware);
- *validation* (3 of every 8: index % 8 in 1, 2, 3): what `auto` chooses a recipe on
  (serve.recipes.auto.choose), inputs no recipe tuned on;
- *held-out* (the other 3 of every 8: index % 8 in 5, 6, 7): what `rollout verify` gates on,
  inputs neither tuning nor `auto` saw.

Validation and held-out are cut the same size because `auto` judges its candidates with
verify's rule, Wilson lower bound included: on a sample as large as verify's, a recipe verify
would pass has the same power to pass there (on 319 inputs a bound of 0.98 needs 318 agreeing;
on 930, 920).

A text that occurs more than once belongs to the split of its first occurrence wherever it
occurs, so that no input is judged on a copy of itself that was tuned on. The judged splits
(validation, held-out) count each distinct text once: its later copies are *folded* (`folded`
says how many), so that one sentence repeated four times is not four flips. The calibration
split keeps its copies: a recipe tunes on what it is given, weighted as given.

A set other than the configured one (`rollout verify --set`) was seen by neither: verify then
judges all of it (split `external`), each distinct text once (`distinct`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_SET = Path(__file__).resolve().parent / "data" / "regression.jsonl"
CALIBRATION_EVERY = 4  # index % 4 == 0: calibration
VALIDATION_EVERY, VALIDATION_AT = 8, (1, 2, 3)  # index % 8 in (1, 2, 3): validation
JUDGED = ("validation", "held-out")  # the splits that count each distinct text once


def split_at(index: int) -> str:
    """The split of the input first seen at `index` (module docstring)."""
    if index % CALIBRATION_EVERY == 0:
        return "calibration"
    return "validation" if index % VALIDATION_EVERY in VALIDATION_AT else "held-out"


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
        """The inputs neither calibration nor `auto`'s validation saw, each text once."""
        return self._split("held-out")

    def relevance(self) -> dict[int, tuple[int, ...]]:
        """Query index -> the indices relevant to it (`relevant` and `query_of` together)."""
        found = {}
        for i, example in enumerate(self.examples):
            docs = relevant_of(example.meta)
            if docs:
                found[i] = docs
        return found

    def distinct(self) -> list[int]:
        """Every text's first occurrence: an external set judged whole, each text once."""
        first: dict[str, int] = {}
        return [i for i, example in enumerate(self.examples)
                if first.setdefault(example.text, i) == i]

    def folded(self, name: str) -> int:
        """How many later copies of a text the judged split `name` leaves out."""
        return len(self._split(name, fold=False)) - len(self._split(name))

    def _split(self, name: str, *, fold: bool | None = None) -> list[int]:
        """The indices of split `name`; `fold` (default: for the judged splits) keeps only
        each text's first occurrence."""
        fold = name in JUDGED if fold is None else fold
        first: dict[str, int] = {}
        return [i for i, example in enumerate(self.examples)
                if split_at(at := first.setdefault(example.text, i)) == name
                and not (fold and at != i)]

    def limited(self, limit: int | None) -> RegressionSet:
        """The first `limit` inputs (all when None); the digest names the slice."""
        if limit is None or limit >= len(self.examples):
            return self
        return RegressionSet(self.path, self.examples[:limit], f"{self.digest}:{limit}")


def relevant_of(meta: dict) -> tuple[int, ...]:
    """The indices an input's `relevant` and `query_of` name (checked by `load_set`)."""
    query_of = meta.get("query_of", [])
    docs = [*meta.get("relevant", []), *(query_of if isinstance(query_of, list) else [query_of])]
    return tuple(dict.fromkeys(docs))


RELEVANCE = {"relevant": "a list of input indices",
             "query_of": "an input index or a list of input indices"}


def _check_relevance(row: dict, where: str) -> None:
    """`relevant` and `query_of` hold indices (whole numbers >= 0) as RELEVANCE says."""
    for name, expected in RELEVANCE.items():
        if name not in row:
            continue
        value = row[name]
        values = value if isinstance(value, list) else [value] if name == "query_of" else None
        if values is None or not all(type(v) is int and v >= 0 for v in values):
            raise RegressionSetError(f"{where}: `{name}` must be {expected} (whole numbers "
                                     ">= 0)")


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
        _check_relevance(row, f"{path}:{number}")
        examples.append(Example(text, label, row))
    if not examples:
        raise RegressionSetError(f"regression set {path} has no inputs")
    for number, example in enumerate(examples):
        if any(i >= len(examples) for i in relevant_of(example.meta)):
            raise RegressionSetError(f"{path}: input {number} names a relevant input beyond "
                                     f"the set's {len(examples)} inputs")
    return RegressionSet(str(path), tuple(examples), hashlib.sha256(raw).hexdigest()[:16])
