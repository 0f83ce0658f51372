"""An ONNX Runtime session that a `Variant` calls like a transformers model.

Threads fit the replica's CPU share: `threads` intra-op threads (the same count the torch path
takes), one inter-op thread, sequential execution, and no spinning: an idle ORT pool otherwise
spins its threads for a while after each run, taking CPU from the other arm's replica and the
gateway on the same cores.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch


class OrtModel:
    """`model(input_ids=..., attention_mask=...)` -> an object with `last_hidden_state` or
    `logits` (float32 torch tensors), as the torch model it replaces."""

    def __init__(self, path: Path, *, output: str, threads: int, size_bytes: int,
                 manifest: dict | None = None):
        self.path, self.manifest = path, manifest or {}
        self.output = output
        self.size_bytes = size_bytes  # of the artifact: what verify reports as its weights
        self.resize(threads)

    def resize(self, threads: int) -> None:
        """A new session on `threads` intra-op threads (its count is fixed per session)."""
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = max(1, threads)
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.log_severity_level = 3  # errors only
        self.session = ort.InferenceSession(str(self.path), options,
                                            providers=["CPUExecutionProvider"])
        self.threads = threads

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> SimpleNamespace:
        feed = {"input_ids": input_ids.numpy().astype(np.int64, copy=False),
                "attention_mask": attention_mask.numpy().astype(np.int64, copy=False)}
        (out,) = self.session.run([self.output], feed)
        return SimpleNamespace(**{self.output: torch.from_numpy(out)})
