"""`rollout verify` and the regression set: the offline gate between the two arms."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode

from rollout.agreement import CONFIDENT_MARGIN
from rollout.settings.base import CONFIG
from rollout.token_fidelity import KLD_CLIP, MAX_KLD, MIN_TOKEN_AGREEMENT


class VerifySettings(BaseSettings):
    """`rollout verify` and the regression set

    The offline comparison of the two arms that a ramp needs before it advances (rollout
    layer: the verdict; the measurement runs the serving layer's models).
    """

    model_config = CONFIG

    regression_set: str | None = Field(
        None, description="JSONL regression set used by `rollout verify` and to calibrate the "
        "recipes (`accuracy-aware`, `onnx-int8`, `auto`); none: the shipped "
        "`serve/common/data/regression.jsonl`"
    )
    verify_min_margin: float = Field(
        CONFIDENT_MARGIN, ge=0, le=1,
        description="a flip is *confident* when the baseline's margin (top-1 minus top-2 score) "
        "is at least this; below it, a near tie",
    )
    verify_max_confident_flips: int = Field(
        0, ge=0, le=1_000_000, description="`rollout verify` fails with more confident flips "
        "than this"
    )
    verify_max_accuracy_drop: float = Field(
        0.01, ge=0, le=1,
        description="verify fails when the optimized arm's accuracy on labelled inputs is lower "
        "than the baseline's by more than this",
    )
    verify_min_agreement: float = Field(
        0.98, ge=0, le=1, description="verify fails below this top-1 agreement"
    )
    verify_min_lower_bound: float = Field(
        0.98, ge=0, le=1,
        description="verify fails below this 95 % Wilson lower bound of the agreement",
    )
    verify_min_speedup: float = Field(
        1.0, ge=0, le=1000,
        description="verify fails below this throughput ratio at `CANARY_VERIFY_SPEED_BATCH`, "
        "on length-sorted (served) batches",
    )
    verify_min_cosine_p1: float = Field(
        0.95, ge=-1, le=1,
        description="verify fails below this 1st percentile of embedding cosine (encoders; a "
        "classifier has no embedding to compare)",
    )
    verify_min_slice_agreement: float = Field(
        0.95, ge=0, le=1,
        description="verify fails when a judged slice (script, length bucket, baseline label) "
        "agrees below this beyond doubt: the upper end of its 95 % Wilson interval is below it",
    )
    verify_min_slice_size: int = Field(
        30, ge=1, le=1_000_000,
        description="inputs a slice needs before verify judges it (smaller slices are shown, "
        "not judged)",
    )
    verify_min_recall_at_10: float = Field(
        0.95, ge=0, le=1,
        description="embedding models: verify (and `auto`) fail below this recall@10 of the "
        "optimized arm's neighbours against the baseline's, overall, on a half re-embedded "
        "index and per judged slice (about what an approximate-nearest-neighbour index gives "
        "up against exact search)",
    )
    verify_retrieval_tolerance: float = Field(
        0.005, ge=0, le=1,
        description="embedding models: a neighbour the optimized arm finds counts as one of the "
        "baseline's top 10 when its baseline similarity is within this of the baseline's 10th "
        "(top-1 likewise): the order of neighbours tied within a low-precision arm's rounding "
        "is not damage. Read by verify, `auto` and the shadow's online recall@10; 0: strict "
        "([the measurements](recipes.md#retrieval-ties))",
    )
    verify_auto_margin: float = Field(
        0.005, ge=0, le=0.5,
        description="`auto` judges a candidate on the validation split with every bar of the "
        "agreement, cosine and recall gates raised by this much, so that what it serves passes "
        "verify on the held-out split ([the measurements](recipes.md#retrieval-ties))",
    )
    verify_max_kld: float = Field(
        MAX_KLD, ge=0, le=KLD_CLIP,
        description="causal LMs: verify fails when the 95 % upper bound of the mean KL "
        "divergence (baseline || optimized, nats, each response's mean clipped at 1) exceeds "
        "this, overall, or a judged slice's lower bound does (8-bit weights measure about "
        "0.001, 4-bit rounding 0.01-0.1: [the grounds](generative.md#judged-by-its-tokens))",
    )
    verify_min_token_agreement: float = Field(
        MIN_TOKEN_AGREEMENT, ge=0, le=1,
        description="causal LMs: verify fails when the 95 % lower bound of the mean share of "
        "a response's positions whose most likely token both arms agree on is below this, "
        "overall, or a judged slice's upper bound is",
    )
    verify_prompts: int = Field(
        200, ge=1, le=100_000,
        description="causal LMs: prompts verify scores (evenly spaced over the judged split); "
        "each costs the baseline's greedy continuation, a teacher-forced forward per arm and "
        "the optimized arm's own continuation",
    )
    verify_continuation_tokens: int = Field(
        32, ge=1, le=4096,
        description="causal LMs: tokens of the baseline's greedy continuation scored per "
        "prompt (EOS ends it sooner)",
    )
    verify_prompt_share: float = Field(
        0.5, gt=0, le=1,
        description="causal LMs: the share of each text's tokens verify gives as the prompt "
        "(the baseline's continuation replaces the rest): a complete sentence's likeliest "
        "continuation is its end; 1: each text whole (a set of prompts)",
    )
    verify_batch_sizes: Annotated[tuple[int, ...], NoDecode] = Field(
        (1, 8, 32), description="batch sizes whose throughput verify measures (comma-separated, "
        "each 1-4096)"
    )
    verify_speed_batch: int = Field(
        32, ge=1, le=4096, description="the batch size of the reported `speedup` (one of "
        "`CANARY_VERIFY_BATCH_SIZES`)"
    )
    verify_speed_inputs: int = Field(
        256, ge=1, le=100_000, description="inputs (evenly spaced over the set) timed per pass"
    )

    @field_validator("verify_batch_sizes", mode="before")
    @classmethod
    def _split_sizes(cls, value):
        if isinstance(value, str):
            value = [part for part in value.replace(" ", "").split(",") if part]
        sizes = tuple(sorted({int(v) for v in value}))
        if not sizes or sizes[0] < 1 or sizes[-1] > 4096:
            raise ValueError("batch sizes must be whole numbers within 1..4096")
        return sizes

    @model_validator(mode="after")
    def _speed_batch_measured(self):
        if self.verify_speed_batch not in self.verify_batch_sizes:
            raise ValueError("verify_speed_batch must be one of verify_batch_sizes")
        return self
