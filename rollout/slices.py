"""Slices: the groups an input belongs to, so that fidelity is judged where the damage is and
not only on the whole (quantization damage concentrates by script, language and length).

Pure Python: `rollout verify` (offline) and the gateway's shadow comparison (online) file each
judged input under the same keys and read the same table.

An input's slice keys (`slices_of`), `<kind>:<value>`:

- `script:<s>`: the dominant Unicode script among its letters (`script_of`): one of SCRIPTS,
  `other` for letters of another script, `none` for a text without letters (emoji only, digits,
  empty). Han ideographs in a text that also has kana count as kana: Japanese writes with both,
  so a Japanese input is `script:kana` however many kanji it holds. Ties go to the script seen
  first. Only the first SCAN_CHARS characters are read (the gateway does this on its event
  loop), which is plenty to tell a script.
- `length:<bucket>`: the input's tokens in buckets cut at LENGTH_EDGES (`length_bucket`):
  `1-16`, `17-64`, `65-128`, `129+` (0 tokens counts as `1-16`).
- `label:<l>`: the baseline's top-1 label (classify only; none without a label).
- `header:<h>`: the value of the request header named by CANARY_SLICE_HEADER (online only),
  capped by `HeaderValues`: at most MAX_HEADER_VALUES distinct values, each at most
  MAX_HEADER_CHARS printable characters; later new values are `header:other`.

`slice_table` turns counts per slice, (n, agreed, confident_flips), into rows, worst first: the
judged rows (n >= min_size) by agreement ascending, then the rest, each group by name.
"""

from __future__ import annotations

import unicodedata
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from rollout.agreement import Pair, wilson_interval

SCRIPTS = ("latin", "cyrillic", "greek", "arabic", "hebrew", "han", "kana", "hangul",
           "devanagari", "thai")
SCAN_CHARS = 1024  # characters of a text read to find its script
LENGTH_EDGES = (16, 64, 128)  # token counts; a bucket holds (previous edge, edge]
MAX_HEADER_VALUES = 32  # distinct header values kept (per HeaderValues); later ones: "other"
MAX_HEADER_CHARS = 64  # a header value is cut to this many characters
OTHER_HEADER = "other"
DEFAULT_MIN_PAIRS = 50  # pairs a slice needs to be judged where no plan says (status, dashboard)

# words of a character's Unicode name that name its script (the first match counts)
_NAME_WORDS = {
    "LATIN": "latin", "CYRILLIC": "cyrillic", "GREEK": "greek", "ARABIC": "arabic",
    "HEBREW": "hebrew", "CJK": "han", "IDEOGRAPHIC": "han", "HIRAGANA": "kana",
    "KATAKANA": "kana", "KATAKANA-HIRAGANA": "kana", "HANGUL": "hangul",
    "DEVANAGARI": "devanagari", "THAI": "thai",
}


@lru_cache(maxsize=4096)
def _char_script(char: str) -> str | None:
    """A character's script (SCRIPTS or `other`); None when it is not a letter."""
    if not unicodedata.category(char).startswith("L"):
        return None
    for word in unicodedata.name(char, "").split():
        script = _NAME_WORDS.get(word)
        if script is not None:
            return script
    return "other"


def script_of(text: str) -> str:
    """The dominant script among the text's letters (see the module docstring): one of
    SCRIPTS, `other` or `none`."""
    counts = Counter(s for s in map(_char_script, text[:SCAN_CHARS]) if s is not None)
    if not counts:
        return "none"
    if counts["kana"] and counts["han"]:  # Japanese: kanji with kana
        counts["kana"] += counts.pop("han")
    return counts.most_common(1)[0][0]


def _length_labels() -> tuple[str, ...]:
    lows = (1, *(edge + 1 for edge in LENGTH_EDGES))
    return (*(f"{low}-{edge}" for low, edge in zip(lows, LENGTH_EDGES, strict=False)),
            f"{lows[-1]}+")


LENGTH_BUCKETS = _length_labels()  # "1-16", "17-64", "65-128", "129+"


def length_bucket(tokens: int) -> str:
    """The length bucket of an input of `tokens` tokens."""
    for label, edge in zip(LENGTH_BUCKETS, LENGTH_EDGES, strict=False):
        if tokens <= edge:
            return label
    return LENGTH_BUCKETS[-1]


def slices_of(text: str, tokens: int, label: str | None,
              header: str | None = None) -> tuple[str, ...]:
    """The input's slice keys: script, length, then the label and the header when given (the
    header value as `HeaderValues.admit` returned it)."""
    keys = [f"script:{script_of(text)}", f"length:{length_bucket(tokens)}"]
    if label is not None:
        keys.append(f"label:{label}")
    if header is not None:
        keys.append(f"header:{header}")
    return tuple(keys)


def tokens_per_input(total: int, texts: Iterable[str]) -> list[int]:
    """A request's `total` tokens shared among its texts in proportion to their characters:
    exact for a request of one text, an approximation for several (the model replica reports
    one count per request)."""
    sizes = [len(text) for text in texts]
    chars = sum(sizes)
    if not chars:
        return [total // max(len(sizes), 1)] * len(sizes)
    return [round(total * size / chars) for size in sizes]


class HeaderValues:
    """The header values a slice may carry, bounded: a value is reduced to its printable
    characters, stripped and cut to `max_chars`; the first `max_values` distinct values are
    kept as they are, any later new one is OTHER_HEADER. An absent or empty value is None (no
    header slice). One per gateway replica: with R replicas, at most R x `max_values` values
    reach the counters (they usually see the same first ones)."""

    def __init__(self, max_values: int = MAX_HEADER_VALUES, max_chars: int = MAX_HEADER_CHARS):
        self.max_values, self.max_chars = max_values, max_chars
        self.seen: set[str] = set()

    def admit(self, raw: str | None) -> str | None:
        """The slice value of one request's header value."""
        if raw is None:
            return None
        value = "".join(ch for ch in raw[:4 * self.max_chars] if ch.isprintable())
        value = value.strip()[:self.max_chars]
        if not value:
            return None
        if value in self.seen:
            return value
        if len(self.seen) >= self.max_values:
            return OTHER_HEADER
        self.seen.add(value)
        return value


class SliceCounts:
    """Counts per slice, (n, agreed, confident_flips), added to pair by pair."""

    def __init__(self) -> None:
        self.counts: dict[str, tuple[int, int, int]] = {}

    def add(self, slices: Iterable[str], agreed: bool, confident_flip: bool = False) -> None:
        for key in slices:
            n, ok, flips = self.counts.get(key, (0, 0, 0))
            self.counts[key] = (n + 1, ok + bool(agreed), flips + bool(confident_flip))


def pair_slice_counts(pairs: Iterable[Pair], tokens: Iterable[int], texts: Sequence[str],
                      labels: Sequence[str], min_margin: float) -> dict[str, tuple[int, int, int]]:
    """Slice -> (inputs, agreed, confident flips) over offline `pairs` (`tokens[k]`: pair k's
    input's length in the baseline's tokens; `texts` by `Pair.index`): what `rollout verify`
    and `auto` judge alike."""
    counts = SliceCounts()
    for pair, length in zip(pairs, tokens, strict=True):
        agreed = pair.baseline == pair.optimized
        counts.add(slices_of(texts[pair.index], length, labels[pair.baseline]), agreed,
                   not agreed and pair.baseline_margin >= min_margin)
    return counts.counts


@dataclass(frozen=True)
class SliceRow:
    """One slice's figures: agreement and its 95 % Wilson lower bound (None when n is 0);
    `judged`: the slice has at least the minimum size."""

    slice: str
    n: int
    agreed: int
    confident_flips: int
    agreement: float | None
    lower_bound: float | None
    judged: bool

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def slice_row(key: str, n: int, agreed: int, confident_flips: int, min_size: int) -> SliceRow:
    agreed = min(agreed, n)
    lower = wilson_interval(agreed, n)[0] if n else None
    return SliceRow(key, n, agreed, confident_flips, agreed / n if n else None, lower,
                    n >= min_size)


def slice_table(counts: Mapping[str, tuple[int, int, int]], min_size: int) -> list[SliceRow]:
    """Rows for every slice, worst first: judged rows by agreement ascending, then the others
    (also by agreement), ties by slice name."""
    rows = [slice_row(key, *cell, min_size) for key, cell in counts.items()]
    return sorted(rows, key=lambda r: (not r.judged, 2.0 if r.agreement is None else r.agreement,
                                       r.slice))


def worst_rows(rows: list[SliceRow], limit: int = 10) -> tuple[list[SliceRow], int]:
    """The first `limit` rows of a table (worst first) and how many were left out."""
    return rows[:limit], max(len(rows) - limit, 0)
