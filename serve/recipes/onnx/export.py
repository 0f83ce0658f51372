"""torch -> ONNX: export a Hugging Face encoder (or sequence classifier) and fuse its graph.

The model is reloaded with eager attention for the export (the legacy TorchScript exporter
traces it cleanly, and a padded dummy batch keeps the attention mask in the graph: a mask of
ones lets transformers drop it). ORT's transformer optimizer then fuses attention, LayerNorm and
GELU for BERT-like models; a model it cannot fuse is kept unfused (slower, same answers).
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import torch

log = logging.getLogger(__name__)
OPSET = 17
# config.model_type values ORT's optimizer fuses as `bert`
FUSABLE = ("bert", "roberta", "xlm-roberta", "distilbert", "electra", "camembert", "mpnet")
INPUTS = ("input_ids", "attention_mask")


class _Outputs(torch.nn.Module):
    """Positional inputs, one named output: what the exporter wants."""

    def __init__(self, model: torch.nn.Module, output: str):
        super().__init__()
        self.model, self.output = model, output

    def forward(self, input_ids, attention_mask):
        return getattr(self.model(input_ids=input_ids, attention_mask=attention_mask), self.output)


def export(source: Path, dest: Path, *, has_head: bool, fuse: bool = True) -> str:
    """Export the model folder `source` to `dest` (fp32, fused by ORT's optimizer where possible
    when `fuse`: its fused operators are ORT's own); the output name."""
    from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification

    loader = AutoModelForSequenceClassification if has_head else AutoModel
    model = loader.from_pretrained(source, local_files_only=True, dtype=torch.float32,
                                   attn_implementation="eager").eval()
    output = "logits" if has_head else "last_hidden_state"
    ids = torch.ones(2, 16, dtype=torch.long)
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 9:] = 0
    raw = dest.with_name(dest.stem + ".raw.onnx")
    axes = {name: {0: "batch", 1: "tokens"} for name in INPUTS}
    axes[output] = {0: "batch"} if has_head else {0: "batch", 1: "tokens"}
    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("ignore")  # tracer and deprecation notices from the exporter
        torch.onnx.export(_Outputs(model, output), (ids, mask), str(raw), input_names=list(INPUTS),
                          output_names=[output], dynamic_axes=axes, opset_version=OPSET,
                          dynamo=False)
    config = AutoConfig.from_pretrained(source, local_files_only=True)
    if not fuse:
        raw.replace(dest)
        return output
    try:
        _fuse(raw, dest, config)
    finally:
        raw.unlink(missing_ok=True)
    return output


def _fuse(raw: Path, dest: Path, config) -> None:
    if config.model_type not in FUSABLE:
        log.info("onnx: %s is not fused by ORT's optimizer; kept unfused", config.model_type)
        raw.replace(dest)
        return
    from onnxruntime.transformers.optimizer import optimize_model

    heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_heads", 0)
    hidden = getattr(config, "hidden_size", None) or getattr(config, "dim", 0)
    # opt_level 0: only the Python fusions; the hardware-specific rewrites happen at load time
    optimized = optimize_model(str(raw), model_type="bert", num_heads=heads, hidden_size=hidden,
                               opt_level=0)
    optimized.save_model_to_file(str(dest))
