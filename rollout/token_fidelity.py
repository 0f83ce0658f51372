"""A generative arm judged by its tokens: the figures quantization research reports for language
models, summed per response and judged (rollout.verdict).

Pure Python, no torch: the measurement (teacher-forced, serve.generative.fidelity) gives one
`ResponseFidelity` per prompt; this module sums them and judges them.

**Per response, not per token.** A response's tokens are correlated (a divergence early moves
every later position), so the unit of evidence is the response: its mean KL(baseline ||
optimized) over its positions, clipped at KLD_CLIP nats so that one wild answer bounds what it
moves, and its top-1 agreement (the share of its positions whose most likely token is the
same). The summary is the mean of each over responses, with a percentile bootstrap interval over
the prompts (rollout.retrieval.slice_interval, fixed seed). Beside them, not judged: the
per-token KLD (mean, p99, max), the share of greedy continuations identical to the baseline's
and the mean first position where the others part, and each arm's perplexity of the baseline's
continuation.

**The gate** (`judge`), with thresholds from `verify_max_kld` and `verify_min_token_agreement`:

1. the upper end of the clipped mean KLD's 95 % interval is at most `max_kld`;
2. the lower end of the mean top-1 agreement's 95 % interval is at least `min_token_agreement`;
3. no slice (rollout.slices: script, prompt length) with at least `min_slice_size` responses is
   *shown* to fail either: the lower end of its KLD interval above `max_kld`, or the upper end
   of its agreement interval below `min_token_agreement` (a slice is small: this convicts
   damage rather than proving fidelity, as the encoder slices are judged).

The defaults rest on published 8-bit and 4-bit figures for language models, llama.cpp's
`perplexity --kl-divergence` against the 16-bit model: 8-bit types measure a mean KLD around
0.001 nats with the top token the same about 98-99 % of the time; a type at mean KLD 0.0106
kept the top token 95.3 % (llama.cpp PR 5081's example), IQ4_XS at 0.0425 kept it 89.9 % (PR
12557). `max_kld` 0.01 and `min_token_agreement` 0.95 admit what 8-bit weights do to a model and
refuse what 4-bit rounding does. A small model trained here cannot calibrate them for real
models; its measurements (docs/generative.md) show the gates separate faithful recipes from
damage made by construction.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from rollout.retrieval import slice_interval

KLD_CLIP = 1.0  # nats: a response's mean KLD counts at most this much
MAX_KLD = 0.01  # default gate: the clipped mean KLD's upper bound (module docstring)
MIN_TOKEN_AGREEMENT = 0.95  # default gate: the mean top-1 agreement's lower bound


@dataclass(frozen=True)
class ResponseFidelity:
    """One prompt: the baseline's continuation scored by both arms, teacher-forced.

    `kld`: KL(baseline || optimized) per position (nats); `same_top`: whether the two most
    likely tokens agree per position; `nll_baseline` / `nll_optimized`: the summed negative
    log-likelihood of the continuation under each arm; `first_divergence`: the first position
    where the optimized arm's own greedy continuation parts from the baseline's (None:
    identical; absent when it was not generated: `identical` None)."""

    kld: tuple[float, ...]
    same_top: tuple[bool, ...]
    nll_baseline: float
    nll_optimized: float
    slices: tuple[str, ...] = ()
    identical: bool | None = None
    first_divergence: int | None = None
    index: int = -1  # the prompt's position in the set

    @property
    def tokens(self) -> int:
        return len(self.kld)

    @property
    def mean_kld(self) -> float:
        """The response's mean KLD, clipped at KLD_CLIP."""
        return min(KLD_CLIP, sum(self.kld) / len(self.kld)) if self.kld else 0.0

    @property
    def agreement(self) -> float:
        return sum(self.same_top) / len(self.same_top) if self.same_top else 1.0


@dataclass(frozen=True)
class FidelityRow:
    """A slice's figures; `judged` when it has at least the gate's `min_size` responses."""

    slice: str
    n: int
    kld: float
    kld_interval: tuple[float, float] | None
    agreement: float
    agreement_interval: tuple[float, float] | None
    identical: float | None
    judged: bool

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class TokenFidelity:
    """The summary of every judged response (module docstring)."""

    n: int
    tokens: int
    kld: float  # mean over responses of each one's clipped mean KLD
    kld_interval: tuple[float, float]
    agreement: float  # mean over responses of each one's top-1 agreement
    agreement_interval: tuple[float, float]
    token_kld_mean: float  # over every position, unclipped
    token_kld_p99: float
    token_kld_max: float
    identical: float | None  # share of greedy continuations identical to the baseline's
    first_divergence_mean: float | None  # mean first position where the others part
    perplexity_baseline: float
    perplexity_optimized: float
    slices: list[FidelityRow] = field(default_factory=list)

    @property
    def kld_upper_bound(self) -> float:
        return self.kld_interval[1]

    @property
    def agreement_lower_bound(self) -> float:
        return self.agreement_interval[0]

    def as_dict(self) -> dict:
        found = asdict(self)
        found.update(kld_upper_bound=self.kld_upper_bound,
                     agreement_lower_bound=self.agreement_lower_bound)
        return found


def summarize(responses: Sequence[ResponseFidelity], *, min_size: int) -> TokenFidelity:
    """The figures of `responses` (at least one scored token between them) and their slice
    table: judged rows first, each group worst agreement first, then by name."""
    scored = [r for r in responses if r.tokens]
    if not scored:
        raise ValueError("no response has a continuation token to score")
    tokens = sorted(k for r in scored for k in r.kld)
    parted = [r for r in scored if r.identical is not None]
    divergences = [r.first_divergence for r in parted if r.first_divergence is not None]
    count = len(tokens)
    by_slice: dict[str, list[ResponseFidelity]] = {}
    for response in scored:
        for key in response.slices:
            by_slice.setdefault(key, []).append(response)
    rows = [_row(key, group, min_size) for key, group in by_slice.items()]
    rows.sort(key=lambda row: (not row.judged, row.agreement, row.slice))
    return TokenFidelity(
        n=len(scored), tokens=count,
        kld=_mean([r.mean_kld for r in scored]),
        kld_interval=slice_interval([r.mean_kld for r in scored]),
        agreement=_mean([r.agreement for r in scored]),
        agreement_interval=slice_interval([r.agreement for r in scored]),
        token_kld_mean=sum(tokens) / count,
        token_kld_p99=tokens[min(count - 1, math.ceil(0.99 * count) - 1)],
        token_kld_max=tokens[-1],
        identical=_mean([bool(r.identical) for r in parted]) if parted else None,
        first_divergence_mean=_mean(divergences) if divergences else None,
        perplexity_baseline=math.exp(sum(r.nll_baseline for r in scored) / count),
        perplexity_optimized=math.exp(sum(r.nll_optimized for r in scored) / count),
        slices=rows)


def _row(key: str, group: Sequence[ResponseFidelity], min_size: int) -> FidelityRow:
    judged = len(group) >= min_size
    parted = [bool(r.identical) for r in group if r.identical is not None]
    klds, agreements = [r.mean_kld for r in group], [r.agreement for r in group]
    return FidelityRow(
        key, len(group), _mean(klds), slice_interval(klds) if judged else None,
        _mean(agreements), slice_interval(agreements) if judged else None,
        _mean(parted) if parted else None, judged)


def judge(max_kld: float, min_token_agreement: float, found: TokenFidelity | None) -> list[str]:
    """Every gate (module docstring, 1-3) `found` misses, as short sentences; nothing when
    there is nothing to judge (an encoder's comparison)."""
    if found is None:
        return []
    failures = []
    if found.kld_upper_bound > max_kld:
        failures.append(f"KL divergence {found.kld:.5f} nats (95% upper bound "
                        f"{found.kld_upper_bound:.5f}) > {max_kld:g}")
    if found.agreement_lower_bound < min_token_agreement:
        failures.append(f"top-1 token agreement {found.agreement:.4f} (95% lower bound "
                        f"{found.agreement_lower_bound:.4f}) < {min_token_agreement:g}")
    for row in found.slices:
        if not row.judged:
            continue
        if row.kld_interval[0] > max_kld:
            failures.append(f"slice {row.slice} KL divergence {row.kld:.5f} ({row.n} responses, "
                            f"95% lower bound {row.kld_interval[0]:.5f}) > {max_kld:g}")
        if row.agreement_interval[1] < min_token_agreement:
            failures.append(f"slice {row.slice} top-1 token agreement {row.agreement:.4f} "
                            f"({row.n} responses, 95% upper bound "
                            f"{row.agreement_interval[1]:.4f}) < {min_token_agreement:g}")
    return failures


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)
