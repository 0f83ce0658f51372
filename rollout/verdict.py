"""The verdict of `rollout verify`: did an optimized version earn its place next to a baseline?

A verdict is keyed by the pair (baseline_version, optimized_version): versions hash the weights,
the recipe and the per-layer plan, so a verdict can never be mistaken for another model's. The
store keeps the latest verdict per pair; a ramp can refuse to widen the canary without a passing
one.

The gate measures damage, not noise. `judge_summary` applies every threshold to the paired
comparison (rollout.agreement.Summary) and lists each one missed, in this order:

1. confident flips: inputs the baseline answered with a margin >= `min_margin` and the
   optimized arm answered otherwise; at most `max_confident_flips` (default 0). Flips below
   that margin are near ties, judged only through the overall agreement;
2. accuracy drop on labelled inputs: at most `max_accuracy_drop` (not judged without labels);
3. top-1 agreement >= `min_agreement` and its Wilson lower bound >= `min_lower_bound`;
4. embedding cosine p1 >= `min_cosine_p1`, where cosine is measured (encoders; a classifier
   has no embedding: None, not judged);
5. speedup >= `min_speedup`, where speed is measured (None with `--no-speed`: not judged);
6. no slice (rollout.slices) with at least `min_slice_size` inputs is *shown* to agree below
   `min_slice_agreement`: the upper end of its 95 % Wilson interval must reach it
   (`judge_slices`). A slice is small, so this convicts damage rather than proving fidelity
   (a lower bound of 0.95 needs about 75 agreeing inputs out of 75): all 30 Japanese inputs
   flipped (upper end 11 %) fail it, 3 near-tie flips among 50 emoji-only inputs (94 %, upper
   end 98 %) do not, while the overall figure of 1,600 inputs would hide either;
7. embedding models: recall@10 of the optimized arm's neighbours against the baseline's,
   neighbours tied within `retrieval_tolerance` counting as kept, overall and on a half
   re-embedded index >= `min_recall_at_10`, and no judged slice shown below it (the upper end
   of its bootstrap interval) (rollout.retrieval; None for a classifier: not judged);
8. a causal LM is judged by its tokens instead of 1-7 (`judge_generation`): the KL divergence
   and top-1 token agreement per response, overall and per judged slice, by bootstrap bounds
   (rollout.token_fidelity: `max_kld`, `min_token_agreement`), and its decode speedup.

`thresholds_from(settings)` is the one place thresholds are built from the settings
(`verify_*`), for every caller that judges a comparison, and `judge_comparison` the one rule
(1-7 together) that both `rollout verify` and `auto` (serve.recipes.auto.choose) apply: a recipe
`auto` serves has passed, on its validation split, the very test verify applies on the held-out
one, with every bar raised by `verify_auto_margin` (`auto_thresholds`), which covers the spread
measured between the two splits. `headroom` names the judged figure closest to its bar.
`bound_only` tells a comparison refused by the Wilson lower bound alone (its point estimates
pass, the sample is too small or too close to the bar to show it).

A verdict records what it was judged with: the thresholds, the judged set's digest and split
(`held-out`: the configured set's inputs that neither a recipe's tuning nor `auto` saw;
`external`: another set, all of it; serve.common.regression), and whether speed was judged. Before a
ramp climbs on a passing verdict, `verdict_problems` checks that record against what the
gateway is configured with (`VerdictRules`): thresholds no looser, judged out of sample on the
configured set (or an external one), speed judged unless the plan accepts a verdict without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from rollout.agreement import CONFIDENT_MARGIN, Summary, wilson_interval
from rollout.retrieval import Retrieval
from rollout.retrieval import judge as judge_retrieval
from rollout.slices import SliceRow
from rollout.token_fidelity import KLD_CLIP, MAX_KLD, MIN_TOKEN_AGREEMENT, TokenFidelity
from rollout.token_fidelity import judge as judge_tokens

if TYPE_CHECKING:
    from rollout.settings import VerifySettings


class Thresholds(BaseModel):
    model_config = ConfigDict(frozen=True)

    min_margin: float = Field(CONFIDENT_MARGIN, ge=0, le=1)
    max_confident_flips: int = Field(0, ge=0)
    max_accuracy_drop: float = Field(0.01, ge=0, le=1)
    min_agreement: float = Field(0.98, ge=0, le=1)
    min_lower_bound: float = Field(0.98, ge=0, le=1)
    min_speedup: float = Field(1.0, ge=0)
    min_cosine_p1: float = Field(0.95, ge=-1, le=1)
    min_slice_agreement: float = Field(0.95, ge=0, le=1)  # the worst judged slice's agreement
    min_slice_size: int = Field(30, ge=1)  # inputs a slice needs to be judged
    min_recall_at_10: float = Field(0.95, ge=0, le=1)  # embeddings (rollout.retrieval)
    # its ties (rollout.retrieval); 0: strict, as verdicts stored before it was recorded
    retrieval_tolerance: float = Field(0.0, ge=0, le=1)
    # causal LMs (rollout.token_fidelity); defaults: what verdicts stored before them judged by
    max_kld: float = Field(MAX_KLD, ge=0, le=KLD_CLIP)
    min_token_agreement: float = Field(MIN_TOKEN_AGREEMENT, ge=0, le=1)

    def with_margin(self, margin: float) -> Thresholds:
        """These thresholds with every bar of agreement, cosine and recall raised by `margin`
        (at most 1): `auto`'s judgement on the validation split (serve.recipes.auto.choose).
        The KL divergence bar, in nats, is lowered by the same share of its budget as the
        top-1 token agreement's (`margin` of 1 - `min_token_agreement`)."""
        raised = ("min_agreement", "min_lower_bound", "min_cosine_p1", "min_slice_agreement",
                  "min_recall_at_10", "min_token_agreement")
        update = {name: min(1.0, getattr(self, name) + margin) for name in raised}
        budget = 1.0 - self.min_token_agreement
        update["max_kld"] = self.max_kld * max(0.0, 1.0 - margin / budget) if budget else 0.0
        return self.model_copy(update=update)


def thresholds_from(settings: VerifySettings) -> Thresholds:
    """The gate's thresholds from the settings `verify_*`."""
    return Thresholds(
        min_margin=settings.verify_min_margin,
        max_confident_flips=settings.verify_max_confident_flips,
        max_accuracy_drop=settings.verify_max_accuracy_drop,
        min_agreement=settings.verify_min_agreement,
        min_lower_bound=settings.verify_min_lower_bound,
        min_speedup=settings.verify_min_speedup,
        min_cosine_p1=settings.verify_min_cosine_p1,
        min_slice_agreement=settings.verify_min_slice_agreement,
        min_slice_size=settings.verify_min_slice_size,
        min_recall_at_10=settings.verify_min_recall_at_10,
        retrieval_tolerance=settings.verify_retrieval_tolerance,
        max_kld=settings.verify_max_kld,
        min_token_agreement=settings.verify_min_token_agreement,
    )


def auto_thresholds(settings: VerifySettings) -> Thresholds:
    """`auto`'s thresholds: verify's, each bar raised by `verify_auto_margin`."""
    return thresholds_from(settings).with_margin(settings.verify_auto_margin)


class Verdict(BaseModel):
    """What the store keeps of one verify run. Fields added later have defaults, so verdicts
    stored before them still load; fields a newer version stores are read and kept."""

    model_config = ConfigDict(frozen=True, extra="allow")

    baseline_version: str = Field(min_length=1)
    optimized_version: str = Field(min_length=1)
    passed: bool
    failures: tuple[str, ...] = ()
    n: int = Field(ge=0)
    agreement: float = Field(ge=0, le=1)
    agreement_lower_bound: float = Field(ge=0, le=1)
    speedup: float | None = None
    cosine_p1: float | None = None
    confident_flips: int | None = Field(None, ge=0)  # None: stored before it was measured
    accuracy_drop: float | None = Field(None, ge=-1, le=1)  # None: no labelled inputs
    recipe: str = ""
    set_digest: str = ""
    at: float = 0.0
    by: str = ""
    thresholds: Thresholds | None = None  # None: stored before verdicts recorded them
    split: str = ""  # "held-out" or "external" (module docstring); "": stored before
    speed_judged: bool | None = None  # False: `rollout verify --no-speed`; None: stored before
    worst_slice: str | None = None  # the judged slice with the lowest agreement, if any
    worst_slice_agreement: float | None = Field(None, ge=0, le=1)
    recall_at_10: float | None = Field(None, ge=0, le=1)  # None: a classifier, or stored before
    recall_at_10_mixed: float | None = Field(None, ge=0, le=1)
    top1_unchanged: float | None = Field(None, ge=0, le=1)
    # recall@10 with no tolerance (the figures above count ties: thresholds.retrieval_tolerance)
    strict_recall_at_10: float | None = Field(None, ge=0, le=1)
    # a causal LM's (rollout.token_fidelity): `agreement` is then the mean top-1 token
    # agreement per response and `n` the responses judged; "" for an encoder's verdict
    task: str = ""
    kld: float | None = Field(None, ge=0)  # mean clipped KL(baseline || optimized) per response
    kld_upper_bound: float | None = Field(None, ge=0)
    identical: float | None = Field(None, ge=0, le=1)  # greedy continuations left unchanged


OUT_OF_SAMPLE = ("held-out", "external")
_STRICTER_IS_HIGHER = ("min_agreement", "min_lower_bound", "min_speedup", "min_cosine_p1",
                       "min_slice_agreement", "min_recall_at_10", "min_token_agreement")
_STRICTER_IS_LOWER = ("min_margin", "max_confident_flips", "max_accuracy_drop", "min_slice_size",
                      "retrieval_tolerance", "max_kld")


class VerdictRules(BaseModel):
    """What a ramp requires of a verdict's record (`verdict_problems`): the gateway's own
    thresholds and the digest of the regression set it calibrates on."""

    model_config = ConfigDict(frozen=True)

    thresholds: Thresholds
    set_digest: str


def looser(recorded: Thresholds, required: Thresholds) -> list[str]:
    """The thresholds `recorded` holds looser than `required`, e.g. 'min_agreement 0.95 <
    0.98'."""
    found = []
    for name in _STRICTER_IS_HIGHER:
        if getattr(recorded, name) < getattr(required, name):
            found.append(f"{name} {getattr(recorded, name):g} < {getattr(required, name):g}")
    for name in _STRICTER_IS_LOWER:
        if getattr(recorded, name) > getattr(required, name):
            found.append(f"{name} {getattr(recorded, name):g} > {getattr(required, name):g}")
    return found


def verdict_problems(verdict: Verdict, rules: VerdictRules | None, *,
                     speed_optional: bool = False) -> list[str]:
    """Why a passing verdict's record does not earn a climb, as short sentences; empty when it
    does. Without `rules` only the speed judgement is checked."""
    problems = []
    if verdict.speed_judged is False and not speed_optional:
        problems.append("speed was not judged (verify --no-speed; the plan does not set "
                        "accept_verdict_without_speed)")
    if rules is None:
        return problems
    if verdict.thresholds is None:
        problems.append("the verdict records no thresholds (stored by an older verify)")
    else:
        problems.extend(f"judged with a looser {item}"
                        for item in looser(verdict.thresholds, rules.thresholds))
    if verdict.split not in OUT_OF_SAMPLE:
        problems.append("not judged out of sample (no held-out split recorded)")
    elif verdict.split == "held-out" and verdict.set_digest.split(":")[0] != rules.set_digest:
        problems.append(f"judged on set {verdict.set_digest}, not on the configured set "
                        f"{rules.set_digest}")
    return problems


def judge(thresholds: Thresholds, *, agreement: float, lower_bound: float,
          speedup: float | None, cosine_p1: float | None, confident_flips: int | None = None,
          accuracy_drop: float | None = None) -> list[str]:
    """Every threshold the measurements miss, as short sentences; empty when all pass.
    A measurement given as None was not taken and is not judged."""
    t = thresholds
    failures = []
    if confident_flips is not None and confident_flips > t.max_confident_flips:
        failures.append(f"{confident_flips} confident flips (baseline margin >= "
                        f"{t.min_margin:g}) > {t.max_confident_flips}")
    if accuracy_drop is not None and accuracy_drop > t.max_accuracy_drop:
        failures.append(f"accuracy drop {accuracy_drop:.4f} > {t.max_accuracy_drop:g}")
    if agreement < t.min_agreement:
        failures.append(f"agreement {agreement:.4f} < {t.min_agreement}")
    if lower_bound < t.min_lower_bound:
        failures.append(f"agreement lower bound {lower_bound:.4f} < {t.min_lower_bound}")
    if cosine_p1 is not None and cosine_p1 < t.min_cosine_p1:
        failures.append(f"cosine p1 {cosine_p1:.4f} < {t.min_cosine_p1}")
    return failures + _judge_speedup(t, speedup)


def _judge_speedup(thresholds: Thresholds, speedup: float | None) -> list[str]:
    """The speedup's failure, if measured (not None) and below `min_speedup`."""
    if speedup is not None and speedup < thresholds.min_speedup:
        return [f"speedup {speedup:.2f}x < {thresholds.min_speedup}x"]
    return []


def worst_slice(rows: Sequence[SliceRow]) -> SliceRow | None:
    """The judged slice with the lowest agreement (rows as rollout.slices.slice_table)."""
    judged = [row for row in rows if row.judged and row.agreement is not None]
    return min(judged, key=lambda row: (row.agreement, row.slice)) if judged else None


def judge_slices(thresholds: Thresholds, rows: Sequence[SliceRow]) -> list[str]:
    """Rule 6: the judged slice whose Wilson upper end is lowest, against
    `min_slice_agreement`."""
    judged = [(wilson_interval(row.agreed, row.n)[1], row.slice, row) for row in rows
              if row.judged and row.n]
    if not judged:
        return []
    upper, _, worst = min(judged)
    if upper >= thresholds.min_slice_agreement:
        return []
    return [f"slice {worst.slice} agreement {worst.agreement:.4f} ({worst.agreed}/{worst.n}, "
            f"95% upper bound {upper:.4f}) < {thresholds.min_slice_agreement}"]


def judge_comparison(thresholds: Thresholds, summary: Summary, speedup: float | None,
                     slices: Sequence[SliceRow] = (), retrieval: Retrieval | None = None
                     ) -> list[str]:
    """The whole rule (module docstring, 1-7): every threshold a paired comparison, its speedup
    (None: not measured), its slice table and its retrieval figures (None: a classifier)
    miss."""
    return (judge_summary(thresholds, summary, speedup) + judge_slices(thresholds, slices)
            + judge_retrieval(thresholds.min_recall_at_10, retrieval))


def judge_generation(thresholds: Thresholds, found: TokenFidelity, speedup: float | None
                     ) -> list[str]:
    """Rule 8, a causal LM's whole rule: its token fidelity (rollout.token_fidelity: KL
    divergence and top-1 token agreement, overall and per judged slice) and its speedup (None:
    not measured)."""
    return (judge_tokens(thresholds.max_kld, thresholds.min_token_agreement, found)
            + _judge_speedup(thresholds, speedup))


def bound_only(thresholds: Thresholds, summary: Summary, speedup: float | None,
               slices: Sequence[SliceRow] = (), retrieval: Retrieval | None = None) -> bool:
    """Whether the comparison fails the rule only through the agreement's lower bound."""
    if not judge_comparison(thresholds, summary, speedup, slices, retrieval):
        return False
    loose = thresholds.model_copy(update={"min_lower_bound": 0.0})
    return not judge_comparison(loose, summary, speedup, slices, retrieval)


def judge_summary(thresholds: Thresholds, summary: Summary, speedup: float | None
                  ) -> list[str]:
    """`judge` applied to a paired comparison: every threshold `summary` (and `speedup`, None
    when not measured) misses. The summary must draw confident flips at the thresholds'
    `min_margin`."""
    if summary.min_margin != thresholds.min_margin:
        raise ValueError(
            f"the summary counts confident flips from margin {summary.min_margin:g}, the "
            f"thresholds from {thresholds.min_margin:g}: build it with "
            "summarize(pairs, min_margin=thresholds.min_margin)")
    return judge(
        thresholds, agreement=summary.agreement, lower_bound=summary.lower_bound,
        speedup=speedup, cosine_p1=summary.cosine.p1 if summary.cosine else None,
        confident_flips=len(summary.confident), accuracy_drop=summary.accuracy_drop,
    )


def headroom(thresholds: Thresholds, summary: Summary, slices: Sequence[SliceRow] = (),
             retrieval: Retrieval | None = None) -> tuple[str, float, float]:
    """The judged figure closest to its bar (or furthest below it), as (what, value, bar):
    where `auto` and verify could disagree on another split."""
    figures = [("agreement", summary.agreement, thresholds.min_agreement),
               ("agreement lower bound", summary.lower_bound, thresholds.min_lower_bound)]
    if summary.cosine is not None:
        figures.append(("cosine p1", summary.cosine.p1, thresholds.min_cosine_p1))
    figures += [(f"slice {row.slice} agreement upper bound",
                 wilson_interval(row.agreed, row.n)[1], thresholds.min_slice_agreement)
                for row in slices if row.judged and row.n]
    if retrieval is not None:
        figures += [("recall@10", retrieval.recall_at_10, thresholds.min_recall_at_10),
                    ("recall@10 mixed", retrieval.recall_at_10_mixed,
                     thresholds.min_recall_at_10)]
        figures += [(f"slice {row.slice} recall@10 upper bound", row.interval[1],
                     thresholds.min_recall_at_10)
                    for row in retrieval.slices if row.judged and row.interval is not None]
    return min(figures, key=lambda f: (f[1] - f[2], f[0]))
