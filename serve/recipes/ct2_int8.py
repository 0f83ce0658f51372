"""The `ct2-int8` recipe: the model converted to CTranslate2 and run by its int8 CPU encoder.

CTranslate2 is an inference engine for Transformer models: the converter stores the weights
int8 (per output row), and its encoder quantizes activations per row at run time and multiplies
with the CPU's int8 GEMM (oneDNN / MKL; VNNI where the CPU has it). It takes rows of token ids
unpadded and pads them itself, so the bucket padding `Variant` adds is stripped first.

Like the ONNX recipes, the converted model is cached on disk under a key of the weights and the
library's version (serve.recipes.artifact), checked by digest on every load, and the session's
threads are the process's torch thread count (the replica's share). Tokenizer, pooling and label
embeddings stay with `serve.recipes.variants.Variant`. No calibration is needed: weights are
quantized per row and activations per call; `auto` and `rollout verify` judge the result on the set.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from serve.common.quiet import quiet
from serve.recipes.artifact import artifact_root, load_or_build

log = logging.getLogger(__name__)
FILES = ("model.bin", "config.json", "vocabulary.json")
COMPUTE_TYPE = "int8_float32"  # int8 GEMMs, float32 for everything else


class Ct2Model:
    """`model(input_ids=..., attention_mask=...)` -> `last_hidden_state` (float32 torch tensor,
    padded back to the input's width), as the torch encoder it replaces."""

    def __init__(self, folder: Path, *, threads: int, size_bytes: int, manifest: dict):
        self.path, self.manifest = folder / FILES[0], manifest
        self.size_bytes = size_bytes
        self.resize(threads)

    def resize(self, threads: int) -> None:
        """A new encoder on `threads` threads (its count is fixed per encoder)."""
        import ctranslate2

        self.encoder = ctranslate2.Encoder(str(self.path.parent), device="cpu",
                                           compute_type=COMPUTE_TYPE,
                                           intra_threads=max(1, threads), inter_threads=1)
        self.threads = threads

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> SimpleNamespace:
        lengths = attention_mask.sum(1).tolist()
        rows = [row[:n] for row, n in zip(input_ids.tolist(), lengths, strict=True)]
        out = self.encoder.forward_batch(rows)
        hidden = torch.from_numpy(np.array(out.last_hidden_state))  # (rows, longest row, hidden)
        missing = input_ids.shape[1] - hidden.shape[1]
        if missing > 0:
            hidden = torch.nn.functional.pad(hidden, (0, 0, 0, missing))
        return SimpleNamespace(last_hidden_state=hidden)


def _with_defaults(source: Path, work: Path) -> Path:
    """`source` as the converter reads it: a folder of links to its files, with the config's
    `position_embedding_type` written out (transformers 5 no longer writes this BERT default,
    and CTranslate2's BERT loader reads it)."""
    config = json.loads((source / "config.json").read_text())
    if "position_embedding_type" in config:
        return source
    view = work / "source"
    view.mkdir()
    for file in source.iterdir():
        if file.name != "config.json":
            (view / file.name).symlink_to(file.resolve())
    config["position_embedding_type"] = "absolute"
    (view / "config.json").write_text(json.dumps(config))
    return view


def build(variant, source: Path, weights: str, progress=None) -> tuple[Ct2Model, dict]:
    """The converted model for `variant` (an encoder without a head) and the decision its
    version hashes."""
    import ctranslate2
    import transformers

    if variant.has_head:
        raise ValueError("ct2-int8 serves encoders; this model is a sequence classifier")
    say = progress or (lambda line: log.info("ct2: %s", line))
    parts = {"recipe": "ct2-int8", "weights": weights, "ctranslate2": ctranslate2.__version__,
             "transformers": transformers.__version__, "quantization": "int8"}
    root = artifact_root(variant.settings.recipe.onnx_dir)

    def convert(work: Path) -> tuple[dict, dict]:
        say(f"converting {source.name} to CTranslate2 int8")
        converter = ctranslate2.converters.TransformersConverter(str(_with_defaults(source, work)))
        with quiet():  # the converter reads the config's deprecated `torch_dtype`
            converter.convert(str(work / "model"), quantization="int8", force=True)
        for name in FILES:
            (work / "model" / name).replace(work / name)
        return {"quantization": "int8"}, {}

    artifact = load_or_build(parts, root, convert, FILES)
    model = Ct2Model(artifact.path.parent, threads=torch.get_num_threads(),
                     size_bytes=artifact.size_bytes, manifest=artifact.manifest)
    decision = {"recipe": "ct2-int8", "runtime": f"ctranslate2 {ctranslate2.__version__}",
                "compute_type": COMPUTE_TYPE, **artifact.decision}
    say(f"ct2-int8 ready ({artifact.path.parent.name}, {artifact.size_bytes / 2**20:.1f} MiB)")
    return model, decision


def build_recipe(variant, recipe: str, progress=None) -> tuple[Ct2Model, dict]:
    """The registry's entry (serve.recipes): `build` on the variant's model folder."""
    return build(variant, variant.source, variant.weights, progress)
