"""A variant: one arm's model loaded under its recipe, ready to tokenize, forward a merged
batch and postprocess.

The baseline runs its `baseline_recipe` (fp32 by default; never `auto`), the optimized arm its
`optimized_recipe`: any recipe of the registry (serve.recipes), or the one `auto` measured
fastest among those that pass the gate on this host against fp32 of the *same* weights
(serve.recipes.auto.choose). Where the model comes from, its labels, tokenizer and version:
serve.recipes.source. An encoder's label descriptions are embedded once by its own fp32 model,
before the recipe is applied.

Tasks: `embed` (mean-pooled, L2-normalised vectors) and `classify` (an encoder classifies
zero-shot by cosine similarity to the embedded label descriptions; a sequence-classification
model uses its own head and labels).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification

from rollout.settings import BatchingSettings, ModelSettings, RecipeSettings, VerifySettings
from serve.common.batching import PAD_WIDTHS, exact_width, padded_width, run_budgeted
from serve.common.quiet import quiet
from serve.recipes import recipe as recipe_named
from serve.recipes import recipe_for, resolve_device
from serve.recipes.frozen import freeze
from serve.recipes.source import (
    Encoded,
    arm_labels,
    aware_plan_key,
    encode_ids,
    has_head,
    load_tokenizer,
    model_dir,
    plan_dir,
    variant_version,
    weights_digest,
)

# A merged batch is split into another forward rather than pad more than this many tokens
# (serve.common.batching.pack): a CPU forward costs little more than its tokens, a CUDA one is
# dominated by launches, so it pays to pad much more there.
SPLIT_TOKENS = {"cpu": 256, "cuda": 8192}
TASKS = ("classify", "embed")


@dataclass(frozen=True)
class VariantSettings:
    """The settings groups a variant reads: its model's (folder, labels, device, tokens),
    building its recipe's (caches, calibration targets), verify's (the regression set a recipe
    calibrates on, the margin of a confident flip, the gate `auto` applies) and batching's (a
    served batch's token budget). The recipe it builds reads them as `variant.settings.<group>`.
    A composition root passes the whole Settings as each:
    `VariantSettings(settings, settings, settings, settings)`."""

    model: ModelSettings
    recipe: RecipeSettings
    verify: VerifySettings
    batching: BatchingSettings


@dataclass(frozen=True)
class Built:
    """A recipe applied: the model to run, how it runs, and what the variant's version must hash
    besides the weights and the recipe (an accuracy-aware plan, or an ONNX artifact's decision).
    A frozen trace is not hashed: it is kept only where it answers as the eager model does."""

    model: torch.nn.Module
    plan: dict | None = None
    decision: dict | None = None
    runs_as: str = "eager"  # or a frozen TorchScript trace of it (serve.recipes.frozen), in words


class Variant:
    """A loaded model under one recipe: tokenize, forward a merged batch, postprocess."""

    def __init__(self, settings: VariantSettings, arm: str, *, recipe: str | None = None,
                 progress=None):
        self.settings = settings
        self.arm = arm
        model_settings = settings.model
        path = model_dir(model_settings, arm)
        self.device = resolve_device(model_settings)
        self.recipe = recipe or recipe_for(arm, model_settings, self.device)
        self.split_tokens = SPLIT_TOKENS[self.device]
        self.pad_width = padded_width  # until the recipe is known (serve.common.batching)
        weights = weights_digest(path)
        self.tokenizer, self.max_tokens, self.tokenizer_digest = load_tokenizer(
            model_settings, path)
        config = AutoConfig.from_pretrained(path, local_files_only=True)
        self.has_head = has_head(config)
        self.labels = arm_labels(model_settings, path, config)
        loader = AutoModelForSequenceClassification if self.has_head else AutoModel
        with quiet():  # transformers' model code loads here first (serve.common.quiet)
            model = loader.from_pretrained(path, local_files_only=True,
                                           dtype=torch.float32).eval()
        self.model = model.to(self.device)  # fp32 until the recipe is applied below
        if self.has_head:
            self.label_matrix = None
        else:
            texts = [model_settings.label_template.format(label) for label in self.labels]
            self.label_matrix = self.embed_batch([self.encode(texts)])[0]
        self.source, self.weights = path, weights
        self.choice = None  # serve.recipes.auto.choose.Choice when the recipe was `auto`
        if self.recipe == "auto":
            self.choice = self._auto(progress)
            self.recipe = self.choice.recipe
        built = self.build(self.recipe, progress)
        self.model, self.plan, self.runs_as = built.model, built.plan, built.runs_as
        if recipe_named(self.recipe).exact_shapes(self.device):
            self.pad_width = exact_width
        self.decision = built.decision
        self.version = variant_version(weights, self.recipe, self.plan, built.decision)

    def _auto(self, progress):
        """The recipe `auto` stands for on this host: cached, or measured now (minutes)."""
        import logging

        from serve.recipes.auto.choose import choose, describe

        groups = self.settings
        choice = choose(groups.model, groups.recipe, groups.verify, self, weights=self.weights,
                        device=self.device, progress=progress)
        logging.getLogger("canary.autopick").info("%s", describe(choice))
        return choice

    def build(self, recipe: str, progress=None) -> Built:
        """The model of `recipe`, made from a copy of this variant's fp32 model (which stays as
        it is, so candidates can be built and compared one after another)."""
        spec = recipe_named(recipe)
        spec.check_device(self.device)
        if spec.runtime:
            say = None if progress is None else (lambda line: progress(line, None))
            model, decision = spec.build(self, recipe, say)
            self.warm(model)
            return Built(model, decision=decision)
        plan = self._plan(self.weights, self.source, progress) if spec.needs_plan else None
        source = self.model if recipe == "fp32" else copy.deepcopy(self.model)
        model = spec.build(source, self.device, plan) if spec.needs_plan else \
            spec.build(source, self.device)
        if spec.exact_shapes(self.device) and self.settings.recipe.torchscript:
            model, runs_as = freeze(model, "logits" if self.has_head else "last_hidden_state")
            return Built(model, plan=plan, runs_as=runs_as)
        return Built(model, plan=plan)

    def warm(self, model, batch_sizes: tuple[int, ...] = (1, 8)) -> int:
        """One forward per (batch size, padding width the server uses): a runtime (ONNX Runtime,
        CTranslate2) prepares its kernels per shape on first use, which would otherwise land on
        the first requests. Returns the forwards made."""
        widths = [width for width in PAD_WIDTHS if width <= self.max_tokens]
        for rows in batch_sizes:
            for width in widths:
                self.forward_rows([[100] * width] * rows, model)
        return len(widths) * len(batch_sizes)

    def _plan(self, weights: str, path: Path, progress) -> dict:
        """The cached plan for these weights and settings, computed and stored when missing."""
        from serve.common.regression import load_set
        from serve.recipes.accuracy_aware import (
            find_plan,
            resolve_high_precision,
            search_plan,
            store_plan,
        )

        groups = self.settings
        key = aware_plan_key(groups.model, groups.recipe, groups.verify, weights, path,
                             self.labels)
        plan = find_plan(key, plan_dir(groups.recipe))
        if plan is None:
            regression = load_set(groups.verify.regression_set, self.labels)
            texts = [regression.examples[i].text for i in regression.calibration()]
            plan = search_plan(
                self.model, lambda model, batch: self.rows(batch, model=model), texts,
                self.scores, target=groups.recipe.aware_target_agreement,
                high_precision=resolve_high_precision(groups.recipe.aware_high_precision),
                progress=progress,
            )
            plan.update(key=key, set_digest=regression.digest)
            store_plan(plan, plan_dir(groups.recipe))
        return plan

    def encode(self, texts: list[str]) -> Encoded:
        return Encoded(encode_ids(self.tokenizer, texts, self.max_tokens))

    def _collate(self, rows: list[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows padded to the width this variant's recipe wants (`pad_width`: bucketed, or the
        longest row's; serve.common.batching), built in one tensor each for ids and mask (no
        per-row tensors), then moved to the device once."""
        lengths = [len(row) for row in rows]
        width = min(self.pad_width(max(lengths)), self.max_tokens)
        pad = self.tokenizer.pad_token_id or 0
        ids = torch.tensor([[*row, *([pad] * (width - len(row)))] for row in rows],
                           dtype=torch.long)
        mask = (torch.arange(width) < torch.tensor(lengths).unsqueeze(1)).long()
        if self.device == "cpu":
            return ids, mask
        return ids.to(self.device, non_blocking=True), mask.to(self.device, non_blocking=True)

    @torch.inference_mode()
    def forward_rows(self, rows: list[Sequence[int]], model: torch.nn.Module | None = None
                     ) -> torch.Tensor:
        """One forward of token-id rows; a float32 CPU tensor with one row per input.

        Encoders give L2-normalised mean-pooled embeddings; classifiers give logits.
        """
        ids, mask = self._collate(rows)
        out = (model or self.model)(input_ids=ids, attention_mask=mask)
        if self.has_head:
            return out.logits.float().cpu()
        hidden = out.last_hidden_state.float()
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, dim=-1).cpu()

    def embed_batch(self, batch: list[Encoded], model: torch.nn.Module | None = None
                    ) -> list[torch.Tensor]:
        """Forward a merged batch at once; one tensor per request (rows = its inputs)."""
        rows = [row for item in batch for row in item.ids]
        return list(self.forward_rows(rows, model).split([len(item.ids) for item in batch]))

    def served(self, texts: list[str], model: torch.nn.Module | None = None) -> torch.Tensor:
        """Rows of `texts` forwarded as a model replica forwards one merged batch of them:
        packed under `max_batch_tokens`, and split where padding would cost more than another
        forward (serve.common.batching.run_budgeted, with this variant's `split_tokens`)."""
        [rows] = run_budgeted([self.encode(texts).ids],
                              lambda batch: self.forward_rows(batch, model),
                              self.settings.batching.max_batch_tokens, self.split_tokens,
                              width_of=self.pad_width)
        if isinstance(rows, Exception):
            raise rows
        return rows

    def rows(self, texts: list[str], batch_size: int = 32, model: torch.nn.Module | None = None
             ) -> torch.Tensor:
        """Rows (embeddings or logits) of many texts, in their order; batched by length so that
        little is padded (a batch's result does not depend on its neighbours, see tests)."""
        encoded = self.encode(texts).ids
        order = sorted(range(len(texts)), key=lambda i: len(encoded[i]))
        out: list[torch.Tensor] = [torch.empty(0)] * len(texts)
        for start in range(0, len(order), batch_size):
            chunk = order[start:start + batch_size]
            rows = self.embed_batch([Encoded([encoded[i] for i in chunk])], model=model)[0]
            for i, row in zip(chunk, rows, strict=True):
                out[i] = row
        return torch.stack(out)

    def scores(self, rows: torch.Tensor) -> torch.Tensor:
        """Label scores of rows: cosine similarity to the labels, or the head's probabilities."""
        if self.has_head:
            return rows.softmax(-1)
        return rows @ self.label_matrix.T  # both sides are unit vectors

    def postprocess(self, task: str, rows: torch.Tensor) -> list[dict]:
        if task == "embed":
            if self.has_head:
                raise ValueError("this model is a classifier: it has no `embed` task")
            return [{"embedding": row} for row in rounded(rows)]
        scores = self.scores(rows)
        top = scores.argmax(-1).tolist()
        return [
            {"label": self.labels[best], "scores": dict(zip(self.labels, row, strict=True))}
            for best, row in zip(top, rounded(scores), strict=True)
        ]


def rounded(rows: torch.Tensor) -> list[list[float]]:
    """Rows as lists of floats rounded to 6 decimals, all at once (numpy: the nearest double to
    each 6-decimal value, which the answers' JSON writes in at most 6 decimals). A NaN or an
    infinity is the model's failure, not an answer: it raises here, so the request fails (and
    a canary's falls back) rather than answering `null` (serve.common.json_body)."""
    values = rows.detach().to("cpu", torch.float64).numpy()
    if not np.isfinite(values).all():
        raise ValueError("the model produced a non-finite value (NaN or infinity)")
    return np.round(values, 6).tolist()
