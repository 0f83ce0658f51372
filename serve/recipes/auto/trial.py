"""How `auto` measures one candidate recipe against the fp32 baseline (serve.recipes.auto.choose).

`measure` builds the candidate from a copy of the baseline's fp32 model (`Variant.build`) and,
on the validation texts it is given (serve.common.regression: inputs no recipe tuned on):

1. **Speed.** First a *screen*: one round at batch SCREEN_BATCH on SCREEN_INPUTS texts. A
   candidate screened more than SCREEN_MARGIN below the bar (the speed it must beat: fp32, or
   `min_speedup` if higher, or an earlier candidate that passed, since one no faster than that
   cannot win: serve.recipes.auto.choose, step 3) is refused on it: a 25 % gap is beyond the noise
   of one round on a shared machine (measured: about 5 %), and a candidate far too slow costs
   seconds instead of a minute (emulated bf16 at 0.3x took 50 s to measure in full). Then both
   models are timed on an evenly spaced sample of the texts cut into served batches
   (serve.common.batching.served_batches: length-sorted, as the server batches) of each size in
   SPEED_BATCHES, tokenization and scoring included as verify's passes are; sizes and arms are
   interleaved round by round and the best of ROUNDS kept, so machine noise hits both alike.
   The candidate's speedup is its lowest over the sizes: it must be faster at each. A
   candidate no faster than the bar is refused too; in both cases its agreement is not
   measured, and its evidence says why.
2. **Agreement.** Both models' rows of every text (`Variant.rows`, length-batched), scored
   and paired through rollout.agreement exactly as `rollout verify` pairs them (top-1 and
   margin of each arm, embedding cosine for encoders, the true label where the set has one).
3. **Gate** (`validation_failures`): verify's rule itself (rollout.verdict.judge_comparison:
   confident flips, accuracy drop, point agreement *and its Wilson lower bound*, cosine p1, the
   slice table, and for an encoder recall@10 of its neighbours: rollout.retrieval), so that a
   recipe `auto` serves is one `rollout verify` passes; the validation split is cut as large as
   verify's held-out split (serve.common.regression) so that the bound has the same power there,
   and the thresholds `measure` is given are verify's with every bar raised by a margin that
   covers the spread between the two splits (rollout.verdict.auto_thresholds). The figure
   closest to its bar is kept (`closest`): where verify still disagrees, it names it. One
   addition: the speedup must beat fp32 (> 1.0) whatever `min_speedup` says (a candidate no
   faster than the baseline it replaces is pointless). A candidate refused by the bound alone
   (its point estimates pass) is marked `bound_only`: the console line and `describe` (the
   startup log, `rollout status`) say so.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch
from pydantic import BaseModel, ConfigDict, Field

from rollout.agreement import Pair, Summary, margins, summarize
from rollout.retrieval import Retrieval
from rollout.slices import SliceRow, pair_slice_counts, slice_table, slices_of
from rollout.verdict import Thresholds, bound_only, headroom, judge_comparison
from serve.common.batching import served_batches
from serve.common.neighbours import retrieval_of

SPEED_BATCHES = (8, 32)  # batch sizes the server forms under light and heavy load
SPEED_INPUTS = 256  # inputs timed per pass, as `verify_speed_inputs`
ROUNDS = 3
SCREEN_BATCH, SCREEN_INPUTS = 32, 64  # the quick screen: one round of one batch size
SCREEN_MARGIN = 1.25  # screened this far below the bar, the full timing cannot reach it
ERROR_CHARS = 300


class Evidence(BaseModel):
    """What measuring one candidate found; `error` when it could not be built or run."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    recipe: str
    passed: bool
    failures: tuple[str, ...] = ()
    error: str | None = None
    n: int = Field(0, ge=0)
    agreement: float | None = None
    lower_bound: float | None = None  # the agreement's 95 % Wilson lower bound, judged
    bound_only: bool = False  # refused by the lower bound alone: its point estimates pass
    confident_flips: int | None = None
    accuracy_drop: float | None = None  # None: no labelled validation input
    cosine_p1: float | None = None  # None: a classifier head has no embedding
    recall_at_10: float | None = None  # None: a classifier (rollout.retrieval)
    kld: float | None = None  # a causal LM's mean KL divergence per response (nats); None: an
    # encoder's (rollout.token_fidelity; `agreement`, `lower_bound`: its top-1 token agreement)
    kld_upper_bound: float | None = None  # its 95 % upper bound, judged
    closest: str | None = None  # the judged figure closest to its bar, e.g. 'recall@10 0.9912
    # (bar 0.955)'
    speedup: float | None = None  # the lowest of `speedups`
    speedups: dict[int, float] = Field(default_factory=dict)  # batch size -> fp32 s / cand. s
    seconds: float = 0.0  # building and measuring it
    decision: dict | None = None  # what the candidate's version hashes (Built.decision)

    @classmethod
    def failed(cls, recipe: str, exc: BaseException, seconds: float = 0.0) -> Evidence:
        """A candidate that raised while being built or measured: failed, with its error on one
        line (an exception's message may span many)."""
        error = " ".join(f"{type(exc).__name__}: {exc}".split())[:ERROR_CHARS]
        return cls(recipe=recipe, passed=False, failures=(error,), error=error, seconds=seconds)


def measure(baseline, recipe: str, texts: list[str], thresholds: Thresholds, *,
            truth: Sequence[int | None] | None = None, progress=None,
            timer: Callable[[], float] = time.perf_counter,
            beaten_by: tuple[str, float] | None = None) -> Evidence:
    """Build `recipe` from `baseline` (an fp32 `serve.recipes.variants.Variant`) and measure it on
    `texts` (module docstring); `truth` holds each text's true label index, or None.
    `beaten_by`: (recipe, speedup) of a candidate earlier in preference order that passed;
    a candidate no faster than it cannot win (serve.recipes.auto.choose, step 3), so its agreement
    is not measured and it is recorded as failed, saying so."""
    start = timer()
    built = baseline.build(recipe, progress=progress)
    bar = max(1.0, thresholds.min_speedup, beaten_by[1] if beaten_by else 0.0)
    screened = _speedups(baseline, built.model, texts, timer, sizes=(SCREEN_BATCH,), rounds=1,
                         inputs=SCREEN_INPUTS)
    speedups = screened
    if screened[SCREEN_BATCH] * SCREEN_MARGIN >= bar:
        speedups = _speedups(baseline, built.model, texts, timer)
    speedup = min(speedups.values())
    if speedup <= bar or speedups is screened:
        return Evidence(recipe=recipe, passed=False,
                        failures=(too_slow(
                            speedup, bar, beaten_by,
                            f"{SCREEN_INPUTS} inputs" if speedups is screened else None),),
                        speedup=speedup, speedups=speedups, seconds=timer() - start,
                        decision=built.decision)
    summary, slices, retrieval = _compare(baseline, built.model, texts, truth, thresholds)
    failures = validation_failures(thresholds, summary, speedup, slices, retrieval)
    return Evidence(
        recipe=recipe, passed=not failures, failures=tuple(failures), n=summary.n,
        agreement=summary.agreement, lower_bound=summary.lower_bound,
        bound_only=bound_only(thresholds, summary, speedup, slices, retrieval),
        recall_at_10=retrieval.recall_at_10 if retrieval else None,
        closest=_closest(thresholds, summary, slices, retrieval),
        confident_flips=len(summary.confident), accuracy_drop=summary.accuracy_drop,
        cosine_p1=summary.cosine.p1 if summary.cosine else None, speedup=speedup,
        speedups=speedups, seconds=timer() - start, decision=built.decision,
    )


def _closest(thresholds: Thresholds, summary: Summary, slices: Sequence[SliceRow],
             retrieval: Retrieval | None) -> str:
    what, value, bar = headroom(thresholds, summary, slices, retrieval)
    return f"{what} {value:.4f} (bar {bar:g})"


def too_slow(speedup: float, bar: float, beaten_by: tuple[str, float] | None,
             screened_on: str | None) -> str:
    """Why a candidate too slow to win or to pass is refused without measuring its agreement;
    `screened_on`: what the screen timed, when its speedup is the screen's."""
    what = f"screened at {speedup:.2f}x on {screened_on}" if screened_on else \
        f"{speedup:.2f}x"
    if beaten_by is not None and bar == beaten_by[1]:
        return (f"cannot win: {what}, no faster than {beaten_by[0]} ({beaten_by[1]:.2f}x), "
                "which passed and is preferred")
    return f"speedup {what}: no faster than fp32" if bar == 1.0 else \
        f"speedup {what} < {bar}x"


def validation_failures(thresholds: Thresholds, summary: Summary, speedup: float,
                        slices: Sequence[SliceRow] = (), retrieval: Retrieval | None = None
                        ) -> list[str]:
    """Every threshold the candidate misses on the validation split (module docstring, 3)."""
    failures = judge_comparison(thresholds, summary, speedup, slices, retrieval)
    if thresholds.min_speedup <= speedup <= 1.0:
        failures.append(f"speedup {speedup:.2f}x: no faster than fp32")
    return failures


def _compare(baseline, model, texts: list[str], truth: Sequence[int | None] | None,
             thresholds: Thresholds) -> tuple[Summary, list[SliceRow], Retrieval | None]:
    """Step 2: the paired comparison of fp32 (the baseline's own model) and `model`, its slice
    table and, for an encoder, its neighbours, as verify measures them (rollout.slices,
    serve.common.neighbours)."""
    base_rows, cand_rows = baseline.rows(texts), baseline.rows(texts, model=model)
    base_scores = baseline.scores(base_rows).tolist()
    cand_scores = baseline.scores(cand_rows).tolist()
    cosines = None if baseline.has_head else (base_rows * cand_rows).sum(-1).tolist()
    pairs = []
    for i in range(len(texts)):
        b_top, b_margin = margins(base_scores[i])
        c_top, c_margin = margins(cand_scores[i])
        pairs.append(Pair(b_top, c_top, b_margin, c_margin,
                          cosine=cosines[i] if cosines else None,
                          truth=truth[i] if truth else None, index=i))
    tokens = [len(ids) for ids in baseline.encode(texts).ids]
    counts = pair_slice_counts(pairs, tokens, texts, baseline.labels, thresholds.min_margin)
    retrieval = None if baseline.has_head else retrieval_of(
        base_rows, cand_rows, [slices_of(texts[p.index], n, baseline.labels[p.baseline])
                               for p, n in zip(pairs, tokens, strict=True)],
        min_size=thresholds.min_slice_size, tolerance=thresholds.retrieval_tolerance)
    return (summarize(pairs, min_margin=thresholds.min_margin),
            slice_table(counts, thresholds.min_slice_size), retrieval)


def _speedups(baseline, model, texts: list[str], timer: Callable[[], float], *,
              sizes: tuple[int, ...] = SPEED_BATCHES, rounds: int = ROUNDS,
              inputs: int = SPEED_INPUTS) -> dict[int, float]:
    """Step 1: fp32 seconds / candidate seconds per batch size, best of `rounds` each, on
    `inputs` evenly spaced texts."""
    step = max(1, len(texts) // inputs)
    sample = texts[::step][:inputs]
    lengths = [len(ids) for ids in baseline.encode(sample).ids]
    batches = {size: [[sample[i] for i in batch] for batch in served_batches(lengths, size)]
               for size in sizes}
    arms = {"fp32": None, "candidate": model}
    for size in sizes:  # warm-up: first shapes, lazy initialisation
        for arm_model in arms.values():
            _pass(baseline, batches[size][:1], arm_model, timer)
    best: dict[tuple[str, int], float] = {}
    for _ in range(rounds):
        for size in sizes:
            for arm, arm_model in arms.items():
                seconds = _pass(baseline, batches[size], arm_model, timer)
                best[arm, size] = min(best.get((arm, size), float("inf")), seconds)
    return {size: best["fp32", size] / max(best["candidate", size], 1e-9) for size in sizes}


@torch.inference_mode()
def _pass(variant, batches: list[list[str]], model, timer: Callable[[], float]) -> float:
    """Seconds to answer `batches` with `model` (None: the variant's own): tokenize, forward,
    score, as a served request is (ops/verify/runner.py times its passes the same way)."""
    start = timer()
    for texts in batches:
        variant.scores(variant.served(texts, model=model))
    return timer() - start
