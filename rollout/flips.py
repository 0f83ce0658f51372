"""Flip capture: the inputs on which the two arms disagreed, kept so they can be replayed.

With `CANARY_FLIP_CAPTURE` on (off by default), every classify pair of a shadowed request
(serve.gateway.shadow) whose top-1 labels differ becomes a `FlipRecord`: the input text, both
labels, both margins (top-1 minus top-2 score of each arm), both versions, the task, the request id
and the time. `FlipCapture.records` decides, per flipped input, in this order:

1. capture off: nothing is kept (nothing is counted either);
2. the input is longer than `max_chars`: not kept, counted `too_long`;
3. a redaction hook (`CANARY_FLIP_REDACT`, `(text) -> str | None`) sees the text and returns
   the text to keep, or None to drop it (counted `redacted`); a hook that raises drops the
   input (counted `redact_error`) and never breaks the shadow comparison;
4. otherwise it is kept: `captured`.

A generated answer the shadow scored by its tokens (task `generate`, `FlipCapture.parted`) is
captured the same way when the two arms' most likely tokens part within its first EARLY_TOKENS
positions: the record's text is the prompt (as the client sent it; a chat's messages' text
joined), `parted_at` the first position where they part and `kld` the answer's mean KL
divergence; it has no labels or margins. Exported, such a row has `kind: "parted"`, and
`rollout verify --set FILE` gives its text whole as the prompt (ops.verify.token_runner).

Storage (rollout.telemetry.redis_store, written through the telemetry sink, off the response path):
the stream `rollout:<app>:flips` (Keys.flips), one entry per flip, bounded three ways: XADD
with `MAXLEN ~ max` (Redis trims whole nodes, so the stream holds about `max` entries, never
more than `max` plus one node of 100), XTRIM `MINID` at the oldest entry still within `ttl_s`
of the newest flip's time (entry ids are Redis's clock, flip times the gateway's: they agree
to far less than a TTL), and EXPIRE `ttl_s` so the key disappears when nothing new comes.
`MemoryFlips` is the in-memory twin with the same bounds (exact).

Export (`to_regression_row`): the regression-set format of serve.common.regression, one JSON object
per line with `text` and, as metadata, the two labels (`baseline`, `optimized`), margins and
versions. No `label`: nobody knows which arm was right, so `rollout verify --set FILE`
replays the inputs for agreement, not accuracy.
"""

from __future__ import annotations

import importlib
import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

from rollout.agreement import margins

log = logging.getLogger("canary.flips")

Redactor = Callable[[str], "str | None"]
HOOK_PATTERN = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
OUTCOMES = ("captured", "too_long", "redacted", "redact_error")
EARLY_TOKENS = 8  # a generated answer whose arms part within this many tokens is captured


class FlipSettingError(ValueError):
    """CANARY_FLIP_REDACT does not name a callable that can be imported."""


def load_redactor(path: str) -> Redactor:
    """The function named by `module:function`; FlipSettingError names the setting and why."""
    if not HOOK_PATTERN.fullmatch(path):
        raise FlipSettingError(
            f"CANARY_FLIP_REDACT must be 'module:function', got {path!r}")
    module_name, _, name = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or the module failed while importing
        raise FlipSettingError(f"CANARY_FLIP_REDACT: cannot import module {module_name!r} "
                               f"({type(exc).__name__}: {exc})") from None
    hook = getattr(module, name, None)
    if not callable(hook):
        raise FlipSettingError(
            f"CANARY_FLIP_REDACT: module {module_name!r} has no function {name!r}")
    return hook


@dataclass(frozen=True)
class FlipRecord:
    """One input the two arms labelled differently. `id` is the stream entry's (set on read)."""

    ts: float
    request_id: str
    task: str
    text: str
    baseline_label: str
    baseline_margin: float
    optimized_label: str
    optimized_margin: float
    baseline_version: str = ""
    optimized_version: str = ""
    parted_at: int = -1  # generate: the first position whose most likely tokens differ
    kld: float = 0.0  # generate: the answer's mean KL divergence (baseline || optimized)
    id: str = field(default="", compare=False)

    def fields(self) -> dict[str, str]:
        """The stream entry's fields (strings, as Redis keeps them)."""
        out = asdict(self)
        del out["id"]
        return {name: _text(value) for name, value in out.items()}

    @classmethod
    def from_fields(cls, entry_id: str, fields: Mapping[str, str]) -> FlipRecord:
        """Read back a stream entry; a missing or unreadable number reads as 0."""
        return cls(
            ts=_number(fields.get("ts")), request_id=fields.get("request_id", ""),
            task=fields.get("task", ""), text=fields.get("text", ""),
            baseline_label=fields.get("baseline_label", ""),
            baseline_margin=_number(fields.get("baseline_margin")),
            optimized_label=fields.get("optimized_label", ""),
            optimized_margin=_number(fields.get("optimized_margin")),
            baseline_version=fields.get("baseline_version", ""),
            optimized_version=fields.get("optimized_version", ""),
            parted_at=int(_number(fields.get("parted_at", "-1"))),
            kld=_number(fields.get("kld")), id=entry_id,
        )

    def as_dict(self) -> dict:
        return asdict(self)


def _text(value: object) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def _number(value: str | None) -> float:
    try:
        return float(value) if value is not None else 0.0
    except ValueError:
        return 0.0


@dataclass(frozen=True)
class FlipItem:
    """A flip for the telemetry sink, with the bounds its writer applies."""

    record: FlipRecord
    max_len: int
    ttl_s: int


def to_regression_row(record: FlipRecord) -> dict:
    """The record as a regression-set line (serve.common.regression): `text` plus metadata, no
    label."""
    if record.task == "generate":
        return {"text": record.text, "kind": "parted", "parted_at": record.parted_at,
                "kld": round(record.kld, 6), "baseline_version": record.baseline_version,
                "optimized_version": record.optimized_version, "task": record.task,
                "request_id": record.request_id, "ts": record.ts}
    return {
        "text": record.text, "baseline": record.baseline_label,
        "optimized": record.optimized_label,
        "baseline_margin": round(record.baseline_margin, 6),
        "optimized_margin": round(record.optimized_margin, 6),
        "baseline_version": record.baseline_version,
        "optimized_version": record.optimized_version, "task": record.task,
        "request_id": record.request_id, "ts": record.ts, "kind": "flip",
    }


def _label_and_margin(output: Mapping) -> tuple[str, float]:
    scores = [float(s) for s in output["scores"].values()]
    return output["label"], margins(scores)[1]


class FlipCapture:
    """The capture policy of one gateway replica (see the module docstring).

    `counts` holds how many flipped inputs met each outcome (OUTCOMES) since start."""

    def __init__(self, *, enabled: bool = False, max_chars: int = 2_000,
                 redact: Redactor | None = None, max_len: int = 10_000,
                 ttl_s: int = 7 * 86_400):
        self.enabled, self.max_chars, self.redact = enabled, max_chars, redact
        self.max_len, self.ttl_s = max_len, ttl_s
        self.counts = dict.fromkeys(OUTCOMES, 0)

    def records(self, *, task: str, texts: Sequence[str], baseline: Sequence[Mapping],
                optimized: Sequence[Mapping], agreed: Iterable[bool | None], ts: float,
                request_id: str = "", baseline_version: str = "",
                optimized_version: str = "") -> list[FlipRecord]:
        """The records to keep of one compared request: `baseline` and `optimized` are the
        arms' outputs and `agreed` the pairs' outcomes (rollout.shadow.compare), in input order."""
        if not self.enabled or task != "classify":
            return []
        kept = []
        for text, base, opt, same in zip(texts, baseline, optimized, agreed, strict=False):
            if same is not False:
                continue
            text = self._keep(text)
            if text is None:
                continue
            (base_label, base_margin), (opt_label, opt_margin) = (
                _label_and_margin(base), _label_and_margin(opt))
            kept.append(FlipRecord(
                ts=ts, request_id=request_id, task=task, text=text,
                baseline_label=base_label, baseline_margin=base_margin,
                optimized_label=opt_label, optimized_margin=opt_margin,
                baseline_version=baseline_version, optimized_version=optimized_version))
        return kept

    def parted(self, *, text: str, same_top: Sequence[bool], kld: float, ts: float,
               request_id: str = "", baseline_version: str = "",
               optimized_version: str = "") -> FlipRecord | None:
        """The record to keep of one scored generated answer (module docstring), if any."""
        if not self.enabled:
            return None
        first = next((i for i, same in enumerate(same_top) if not same), None)
        if first is None or first >= EARLY_TOKENS:
            return None
        kept = self._keep(text)
        if kept is None:
            return None
        return FlipRecord(ts=ts, request_id=request_id, task="generate", text=kept,
                          baseline_label="", baseline_margin=0.0, optimized_label="",
                          optimized_margin=0.0, baseline_version=baseline_version,
                          optimized_version=optimized_version, parted_at=first, kld=kld)

    def _keep(self, text: str) -> str | None:
        """The text to keep (after the hook), or None, counting the outcome."""
        if len(text) > self.max_chars:
            return self._count("too_long")
        if self.redact is not None:
            try:
                text = self.redact(text)
            except Exception as exc:  # the hook's bug drops the input, never the comparison
                log.warning("CANARY_FLIP_REDACT hook raised %s: input dropped",
                            type(exc).__name__)
                return self._count("redact_error")
            if text is None:
                return self._count("redacted")
            if not isinstance(text, str) or not text.strip():
                log.warning("CANARY_FLIP_REDACT hook returned %s, not text: input dropped",
                            type(text).__name__)
                return self._count("redact_error")
        self.counts["captured"] += 1
        return text

    def _count(self, outcome: str) -> None:
        self.counts[outcome] += 1
        return None

    def item(self, record: FlipRecord) -> FlipItem:
        return FlipItem(record, self.max_len, self.ttl_s)


class MemoryFlips:
    """In-memory twin of the flip stream (rollout.telemetry.redis_store): the same writes and reads,
    the bounds applied exactly."""

    def __init__(self) -> None:
        self.entries: list[FlipRecord] = []
        self._seq = 0

    def write(self, items: Sequence[object]) -> None:
        for item in items:
            if not isinstance(item, FlipItem):
                continue
            self._seq += 1
            record = item.record
            self.entries.append(FlipRecord(**{**asdict(record), "id": f"{self._seq}-0"}))
            cutoff = record.ts - item.ttl_s
            self.entries = [e for e in self.entries if e.ts >= cutoff][-item.max_len:]

    def flips(self, last: int) -> list[FlipRecord]:
        """The newest `last` flips, oldest first."""
        return self.entries[-last:] if last > 0 else []
