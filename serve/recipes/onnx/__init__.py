"""ONNX Runtime recipes: the model exported once, fused, optionally int8, served by ORT on CPU.

- `onnx-fp32`: the fp32 model exported to ONNX with its attention, LayerNorm and GELU fused
  (ORT's BERT optimizer); answers as fp32 does, without eager torch's per-call overhead.
- `onnx-int8`: the same graph with its MatMuls int8 (dynamic, per-channel weights), except the
  few a calibration search keeps in fp32 (serve.recipes.onnx.calibrate).

The artifact is built once per key (weights, recipe, runtime versions, calibration settings,
weight type) and cached on disk (serve.recipes.artifact); replicas load it, check its digest and
warm it over the server's padding widths (`serve.recipes.variants.Variant.warm`). Tokenizer,
padding, pooling and label embeddings stay with `serve.recipes.variants.Variant`, shared with the
torch path.
"""

from serve.recipes.onnx.session import OrtModel

__all__ = ["OrtModel"]
