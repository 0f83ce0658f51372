"""The `fp16-graphs` recipe's model: fp16 on CUDA, small batches replayed as CUDA graphs.

A forward of this 6-layer encoder launches on the order of a hundred kernels; at batch 1 an H200
spends ≈3 ms launching them and almost nothing computing (`../shared/MEASURED.md`). Forwards of
up to `max_rows` rows therefore run under `torch.compile(mode="reduce-overhead")`, which
records each input shape once as a CUDA graph and afterwards replays it with one launch. To keep
the number of recorded shapes small, the row count is padded up to a power of two (1, 2, 4, 8,
16) and the width is already bucketed by the caller (serve.common.batching.padded_width); padding
rows attend to their first token only and are cut off the outputs, so they never touch real rows
(rows of a batch are independent). Larger batches are compute-bound and run eager.

Outputs of a replay live in the graph's static buffers until the next replay: the caller must
copy what it keeps before the next forward (`Variant.forward_rows` does: it pools and moves the
result to the CPU at once, and one replica forwards one batch at a time).
"""

from __future__ import annotations

import torch


class SmallBatchGraphs(torch.nn.Module):
    def __init__(self, model: torch.nn.Module, *, max_rows: int = 16, compile: bool = True):
        super().__init__()
        self.eager = model
        self.max_rows = max_rows
        # not a submodule: the compiled wrapper shares the eager weights
        compiled = torch.compile(model, mode="reduce-overhead") if compile else model
        object.__setattr__(self, "_small", compiled)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        rows = input_ids.shape[0]
        if rows > self.max_rows:
            return self.eager(input_ids=input_ids, attention_mask=attention_mask)
        padded = 1 << (rows - 1).bit_length()
        if padded != rows:
            extra = padded - rows
            input_ids = torch.cat([input_ids, input_ids.new_zeros(extra, input_ids.shape[1])])
            mask = attention_mask.new_zeros(extra, attention_mask.shape[1])
            mask[:, 0] = 1  # a padding row attends to one token: no empty softmax
            attention_mask = torch.cat([attention_mask, mask])
        out = self._small(input_ids=input_ids, attention_mask=attention_mask)
        if padded == rows:
            return out
        return type(out)(**{key: value[:rows] if torch.is_tensor(value) else value
                            for key, value in out.items()})


def build(model: torch.nn.Module, device: str) -> SmallBatchGraphs:
    """The `fp16-graphs` recipe's model: the fp32 model in fp16 on `device`, wrapped."""
    return SmallBatchGraphs(model.to(device=device, dtype=torch.float16))
