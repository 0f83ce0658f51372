"""Online shadow agreement: how a shadowed request's two answers compare, what that adds to
the telemetry, and what the last N seconds say.

A *shadowed* request was answered by one arm and, off the response path, also sent to the other
(serve.gateway.shadow). Each of its inputs is a *pair*:

- `classify`: the pair *agrees* when both arms give the same top-1 label; it is filed under the
  *baseline's* margin (top-1 minus top-2 score) in the buckets of rollout.agreement, so flips at
  the decision boundary are told apart from flips in the confident bulk, as `rollout verify` does;
- `generate` (one answer, rollout.token_fidelity): the answered tokens scored teacher-forced by
  both arms; the response's mean KL(baseline || optimized), clipped at KLD_CLIP, and its top-1
  token agreement (`token_fields`);
- `embed`: the pair's cosine similarity between the two embeddings and, where the gateway
  keeps a reservoir of recent baseline vectors (serve.gateway.shadow, `shadow_reservoir_size`), how
  many of the baseline vector's K = 10 nearest vectors in it the optimized vector also finds
  (`neighbours`, 0-10: rollout.retrieval's recall@10, online).

Layout: one hash per wall-clock second, `rollout:<app>:telemetry:shadow:<second>`, whose fields
are counters only ever added to (HINCRBYFLOAT), so gateway replicas merge without coordination:

    pairs, agreed                      classify pairs, and those whose top-1 labels match
    m<i>:pairs, m<i>:agreed            the same per baseline-margin bucket i (MARGIN_EDGES)
    cos_n, cos_sum                     embed pairs and the sum of their cosines
    cos:<j>                            embed pairs per cosine bin j (COSINE_GAPS)
    nb_n, nb_hits                      embed pairs compared in the reservoir, and the sum of
                                       their shared top-10 neighbours (recall@10 =
                                       nb_hits / (10 nb_n))
    calls, shed, errors                shadow calls answered; sampled requests not shadowed
                                       because of load; shadow calls that failed or timed out
    tk_n, tk_kld, tk_agree, tk_tokens  generate responses scored, the sums of their clipped mean
                                       KLDs and of their top-1 token agreements, their tokens
    tk:<j>                             generate responses per mean-KLD bin j (KLD_EDGES): what
                                       the ramp's `max_kld` gate reads at any clip
    st:<slice>:n, st:<slice>:kld, st:<slice>:agree
                                       the same three sums per slice of the prompt (script,
                                       length bucket in tokens, header)
    sl:<slice>:pairs, sl:<slice>:agreed, sl:<slice>:cflips
                                       classify pairs per slice (rollout.slices: `script:han`,
                                       `length:17-64`, `label:sports`, `header:acme`), those
                                       that agree, and the confident flips among them (baseline
                                       margin >= CONFIDENT_MARGIN, labels differ)

A pair belongs to the slices in its `PairOutcome.slices` (set by the gateway, serve.gateway.shadow);
a slice's name may itself hold colons, its counter is the part after the last one. Hashes written
before slices existed have no `sl:` fields and read as no slice counts.

The confident pairs are those filed in the buckets from CONFIDENT_MARGIN (0.05, a bucket edge)
up: `confident_pairs` and `confident_agreed` are their sums, and `confident_flip_rate` the
share of them whose labels differ. `confident_from(min_margin)` sums from any other edge: the
ramp's `confident_flip_rate` gate counts from its plan's `gates.min_margin`.

Cosine bins are on the gap 1 - cosine: bin j holds gaps in (COSINE_GAPS[j-1], COSINE_GAPS[j]]
(bin 0: gap <= 1e-6), half a decade wide. The 1st percentile and the minimum are read from the
histogram as the lower cosine edge of their bin: never above the true value, at most one bin
below it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from rollout.agreement import (
    CONFIDENT_MARGIN,
    MARGIN_EDGES,
    bucket_label,
    bucket_of,
    first_bucket_from,
    margins,
    wilson_interval,
)
from rollout.retrieval import K
from rollout.slices import DEFAULT_MIN_PAIRS, SliceRow, slice_table
from rollout.token_fidelity import KLD_CLIP, ResponseFidelity

# a generate response's mean KLD (nats) per bin: bin j holds (KLD_EDGES[j-1], KLD_EDGES[j]]
KLD_EDGES = (1e-4, 3e-4, 1e-3, 2e-3, 3e-3, 5e-3, 1e-2, 2e-2, 3e-2, 5e-2, 0.1, 0.3, KLD_CLIP)

COSINE_GAPS = (1e-6, 3e-6, 1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 2.0)


def shadow_key(app: str, second: int) -> str:
    return f"rollout:{app}:telemetry:shadow:{second}"


class ShadowMismatch(ValueError):
    """The two arms' answers cannot be paired (different lengths, labels or dimensions)."""


@dataclass(frozen=True)
class PairOutcome:
    """One input answered by both arms."""

    agreed: bool | None = None  # classify: same top-1 label
    margin: float | None = None  # classify: the baseline's top-1 minus top-2 score
    cosine: float | None = None  # embed: cosine between the two embeddings
    slices: tuple[str, ...] = ()  # classify: the input's slice keys (rollout.slices)
    neighbours: int | None = None  # embed: shared top-10 neighbours in the reservoir (0-10)


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """Cosine similarity; 1.0 for two zero vectors, 0.0 when only one is zero."""
    if len(a) != len(b):
        raise ShadowMismatch(f"embeddings of {len(a)} and {len(b)} dimensions")
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    na, nb = math.sqrt(sum(x * x for x in a)), math.sqrt(sum(y * y for y in b))
    if na == 0 or nb == 0:
        return 1.0 if na == nb else 0.0
    return max(-1.0, min(1.0, dot / (na * nb)))


def _classified(output: Mapping) -> tuple[str, list[str], list[float]]:
    try:
        scores = output["scores"]
        return output["label"], list(scores), [float(s) for s in scores.values()]
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise ShadowMismatch(f"not a classify output: {type(exc).__name__}") from None


def compare(
    task: str, baseline: Sequence[Mapping], optimized: Sequence[Mapping]
) -> list[PairOutcome]:
    """Pair each input's two answers (the `outputs` of the two arms, in input order)."""
    if len(baseline) != len(optimized):
        raise ShadowMismatch(f"{len(baseline)} baseline and {len(optimized)} optimized outputs")
    outcomes = []
    for base, opt in zip(baseline, optimized, strict=True):
        if task == "embed":
            try:
                outcomes.append(PairOutcome(cosine=cosine(base["embedding"], opt["embedding"])))
            except (KeyError, TypeError) as exc:
                raise ShadowMismatch(f"not an embed output: {type(exc).__name__}") from None
            continue
        base_label, base_names, base_scores = _classified(base)
        opt_label, opt_names, _ = _classified(opt)
        if base_names != opt_names:
            raise ShadowMismatch("the arms answer with different label sets")
        _, margin = margins(base_scores)
        outcomes.append(PairOutcome(agreed=base_label == opt_label, margin=margin))
    return outcomes


def cosine_bin(value: float) -> int:
    gap = 1.0 - value
    for j, edge in enumerate(COSINE_GAPS):
        if gap <= edge:
            return j
    return len(COSINE_GAPS) - 1


def shadow_fields(outcomes: Iterable[PairOutcome] = (), *, calls: int = 0, shed: int = 0,
                  errors: int = 0) -> dict[str, float]:
    """The counter increments of one shadowed request (or of one shed or failed attempt)."""
    fields: dict[str, float] = {}

    def add(name: str, amount: float = 1) -> None:
        fields[name] = fields.get(name, 0) + amount

    for name, amount in (("calls", calls), ("shed", shed), ("errors", errors)):
        if amount:
            add(name, amount)
    for pair in outcomes:
        if pair.agreed is not None:
            bucket = bucket_of(pair.margin if pair.margin is not None else 0.0)
            add("pairs")
            add(f"m{bucket}:pairs")
            if pair.agreed:
                add("agreed")
                add(f"m{bucket}:agreed")
            _add_slices(add, pair)
        if pair.cosine is not None:
            add("cos_n")
            add("cos_sum", pair.cosine)
            add(f"cos:{cosine_bin(pair.cosine)}")
        if pair.neighbours is not None:
            add("nb_n")
            add("nb_hits", pair.neighbours)
    return fields


def kld_bin(value: float) -> int:
    for j, edge in enumerate(KLD_EDGES):
        if value <= edge:
            return j
    return len(KLD_EDGES) - 1


def kld_outcomes(bins: Mapping[int, int], cap: float) -> float:
    """The sum over generate responses of min(mean KLD, cap) / cap, each response read at its
    KLD bin's upper edge (never below its true value): a bounded outcome in [0, 1] per
    response, for an anytime-valid bound (the ramp's `max_kld`)."""
    return sum(count * min(KLD_EDGES[min(j, len(KLD_EDGES) - 1)], cap) / cap
               for j, count in bins.items())


def token_fields(response: ResponseFidelity, *, calls: int = 1) -> dict[str, float]:
    """The counter increments of one scored generate response (module docstring)."""
    kld, agreement = response.mean_kld, response.agreement
    fields = {"calls": calls, "tk_n": 1, "tk_kld": kld, "tk_agree": agreement,
              "tk_tokens": response.tokens, f"tk:{kld_bin(kld)}": 1}
    for key in response.slices:
        fields.update({f"st:{key}:n": 1, f"st:{key}:kld": kld, f"st:{key}:agree": agreement})
    return fields


def _token_slices(totals: Mapping[str, float]) -> dict[str, tuple[int, float, float]]:
    """Slice -> (responses, summed clipped mean KLD, summed agreement)."""
    return {key: (int(round(n)), kld, agree)
            for key, (n, kld, agree) in _per_slice(totals, "st:", _TOKEN_COUNTERS).items()}


_TOKEN_COUNTERS = {"n": 0, "kld": 1, "agree": 2}


def _add_slices(add: Callable[[str], None], pair: PairOutcome) -> None:
    """A classify pair's per-slice counters (see the module docstring)."""
    flipped = not pair.agreed and (pair.margin or 0.0) >= CONFIDENT_MARGIN
    for key in pair.slices:
        add(f"sl:{key}:pairs")
        if pair.agreed:
            add(f"sl:{key}:agreed")
        if flipped:
            add(f"sl:{key}:cflips")


def slice_counts(totals: Mapping[str, float]) -> dict[str, tuple[int, int, int]]:
    """Slice -> (pairs, agreed, confident flips) from summed shadow fields."""
    cells = _per_slice(totals, "sl:", _SLICE_COUNTERS, whole=True)
    return {key: (int(n), int(min(agreed, n)), int(min(flips, n)))
            for key, (n, agreed, flips) in cells.items()}


def _per_slice(totals: Mapping[str, float], prefix: str, counters: Mapping[str, int], *,
               whole: bool = False) -> dict[str, list[float]]:
    """Slice -> its counters (in `counters`' order) from the summed fields named
    `<prefix><slice>:<counter>`; a slice's name may hold colons, its counter is the part after
    the last one. `whole`: each field rounded to a whole count before it is added."""
    cells: dict[str, list[float]] = {}
    for name, value in totals.items():
        if not name.startswith(prefix):
            continue
        key, _, counter = name[len(prefix):].rpartition(":")
        if key and counter in counters:
            cells.setdefault(key, [0] * len(counters))[counters[counter]] += (
                int(round(value)) if whole else value)
    return cells


_SLICE_COUNTERS = {"pairs": 0, "agreed": 1, "cflips": 2}


@dataclass(frozen=True)
class ShadowItem:
    """What one shadow attempt adds, stamped with its wall-clock time (for the sink)."""

    ts: float
    fields: Mapping[str, float]


def merge_shadow(items: Iterable[ShadowItem], app: str) -> dict[str, dict[str, float]]:
    """Many items as one increment per per-second key and field."""
    merged: dict[str, dict[str, float]] = {}
    for item in items:
        target = merged.setdefault(shadow_key(app, int(item.ts)), {})
        for name, amount in item.fields.items():
            target[name] = target.get(name, 0) + amount
    return merged


@dataclass(frozen=True)
class ShadowStats:
    """Online agreement over the last `seconds` seconds, all gateway replicas together.

    `agreement` and `lower_bound` (95 % Wilson) are over classify pairs, None without any;
    `by_margin` maps each baseline-margin bucket label to (agreed, pairs); `confident_pairs`
    and `confident_agreed` sum the buckets from CONFIDENT_MARGIN up; cosine figures are over
    embed pairs (`cosine_p1` and `cosine_min` are histogram lower edges, see the module);
    `recall_queries` embed pairs were compared in the reservoir, sharing `recall_hits` of their
    top-10 neighbours (`recall_at_10`, None without any);
    `slices` maps each slice to (pairs, agreed, confident flips), `slice_rows` is its table
    worst first (rollout.slices)."""

    seconds: float
    pairs: int
    agreed: int
    agreement: float | None
    lower_bound: float | None
    upper_bound: float | None
    by_margin: dict[str, tuple[int, int]]
    confident_pairs: int
    confident_agreed: int
    cosine_n: int
    cosine_mean: float | None
    cosine_p1: float | None
    cosine_min: float | None
    calls: int
    shed: int
    errors: int
    slices: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    recall_queries: int = 0
    recall_hits: int = 0
    # generate responses (rollout.token_fidelity): how many, the sums of their clipped mean KLD
    # and top-1 token agreement, their tokens, per KLD bin, per slice (n, kld sum, agree sum)
    token_responses: int = 0
    token_kld_sum: float = 0.0
    token_agree_sum: float = 0.0
    token_tokens: int = 0
    token_bins: dict[int, int] = field(default_factory=dict)
    token_slices: dict[str, tuple[int, float, float]] = field(default_factory=dict)

    @property
    def token_kld(self) -> float | None:
        """The mean over generate responses of each one's clipped mean KL divergence."""
        return self.token_kld_sum / self.token_responses if self.token_responses else None

    @property
    def token_agreement(self) -> float | None:
        """The mean over generate responses of each one's top-1 token agreement."""
        return self.token_agree_sum / self.token_responses if self.token_responses else None

    @property
    def recall_at_10(self) -> float | None:
        """The mean share of a baseline vector's top-10 the optimized vector also finds."""
        if not self.recall_queries:
            return None
        return min(self.recall_hits, K * self.recall_queries) / (K * self.recall_queries)

    def slice_rows(self, min_pairs: int = 1) -> list[SliceRow]:
        """The slice table, worst first; a slice with fewer than `min_pairs` pairs is shown
        after the judged ones."""
        return slice_table(self.slices, min_pairs)

    @property
    def confident_flip_rate(self) -> float | None:
        """Share of the confident pairs whose labels differ; None without confident pairs."""
        if not self.confident_pairs:
            return None
        return (self.confident_pairs - self.confident_agreed) / self.confident_pairs

    def confident_from(self, min_margin: float) -> tuple[int, int]:
        """(pairs, agreed) of the pairs at a baseline margin >= `min_margin`, which must be a
        bucket edge (MARGIN_EDGES); `confident_pairs` and `confident_agreed` are this at
        CONFIDENT_MARGIN."""
        cells = list(self.by_margin.values())[first_bucket_from(min_margin):]
        return sum(pairs for _, pairs in cells), sum(agreed for agreed, _ in cells)

    def as_dict(self) -> dict:
        out = dict(self.__dict__)
        out["confident_flip_rate"] = self.confident_flip_rate
        out["recall_at_10"] = self.recall_at_10
        out["by_margin"] = {label: list(cell) for label, cell in self.by_margin.items()}
        out["slices"] = {key: list(cell) for key, cell in self.slices.items()}
        out["slice_table"] = [row.as_dict() for row in self.slice_rows(DEFAULT_MIN_PAIRS)]
        out["token_kld"] = self.token_kld
        out["token_agreement"] = self.token_agreement
        out["token_bins"] = {str(j): n for j, n in sorted(self.token_bins.items())}
        out["token_slices"] = {key: {"responses": n, "kld": kld / n if n else None,
                                     "agreement": agree / n if n else None}
                               for key, (n, kld, agree) in self.token_slices.items()}
        return out


def _cosine_low(histogram: Mapping[int, float], rank: float) -> float | None:
    """Lower cosine edge of the bin holding the `rank`-th lowest cosine."""
    seen = 0.0
    for j in sorted(histogram, reverse=True):  # the worst (largest gap) first
        seen += histogram[j]
        if histogram[j] > 0 and seen >= rank:
            return max(-1.0, 1.0 - COSINE_GAPS[min(j, len(COSINE_GAPS) - 1)])
    return None


def aggregate_shadow(hashes: Iterable[Mapping[str, str | float]], seconds: float,
                     confidence: float = 0.95) -> ShadowStats:
    """Sum per-second shadow hashes into the statistics over `seconds`."""
    totals: dict[str, float] = {}
    for fields in hashes:
        for name, value in fields.items():
            totals[name] = totals.get(name, 0.0) + float(value)

    def count(name: str) -> int:
        return int(round(totals.get(name, 0.0)))

    pairs, agreed = count("pairs"), count("agreed")
    low = high = None
    if pairs:
        low, high = wilson_interval(min(agreed, pairs), pairs, confidence)
    by_margin = {bucket_label(i): (count(f"m{i}:agreed"), count(f"m{i}:pairs"))
                 for i in range(len(MARGIN_EDGES))}
    confident = range(first_bucket_from(CONFIDENT_MARGIN), len(MARGIN_EDGES))
    cos_n = count("cos_n")
    histogram = {int(k[4:]): v for k, v in totals.items() if k.startswith("cos:")}
    return ShadowStats(
        seconds=seconds, pairs=pairs, agreed=agreed,
        agreement=agreed / pairs if pairs else None, lower_bound=low, upper_bound=high,
        by_margin=by_margin,
        confident_pairs=sum(count(f"m{i}:pairs") for i in confident),
        confident_agreed=sum(count(f"m{i}:agreed") for i in confident), cosine_n=cos_n,
        cosine_mean=totals.get("cos_sum", 0.0) / cos_n if cos_n else None,
        cosine_p1=_cosine_low(histogram, max(1, math.ceil(0.01 * cos_n))) if cos_n else None,
        cosine_min=_cosine_low(histogram, 1) if cos_n else None,
        calls=count("calls"), shed=count("shed"), errors=count("errors"),
        slices=slice_counts(totals), recall_queries=count("nb_n"),
        recall_hits=count("nb_hits"), token_responses=count("tk_n"),
        token_kld_sum=totals.get("tk_kld", 0.0), token_agree_sum=totals.get("tk_agree", 0.0),
        token_tokens=count("tk_tokens"),
        token_bins={int(k[3:]): int(round(v)) for k, v in totals.items()
                    if k.startswith("tk:") and k[3:].isdigit()},
        token_slices=_token_slices(totals),
    )
