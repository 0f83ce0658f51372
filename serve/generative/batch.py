"""The running sequences of one decode loop as one left-padded batch of KV caches.

Every row is right-aligned: a row shorter than the batch is padded on the left, and the
attention mask hides the padding. A sequence joins with the cache of its own prefill (padded to
the batch's width, or the batch padded to its length), leaves by dropping its row, and padding
every remaining row shares is trimmed. Each decode step feeds every row its last token at its own
position and grows every row by one.
"""

from __future__ import annotations

import functools
import inspect

import torch
from transformers import DynamicCache


class PaddedBatch:
    def __init__(self):
        # the caches as the model grows them step by step; rebuilt only as rows join or leave
        self.cache: DynamicCache | None = None
        self.mask = torch.zeros(0, 0, dtype=torch.long)  # rows x width: 1 real, 0 padding

    @property
    def layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer: keys and values, rows x KV heads x width x head size."""
        return [] if self.cache is None else [(layer.keys, layer.values)
                                              for layer in self.cache.layers]

    @layers.setter
    def layers(self, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.cache = DynamicCache(ddp_cache_data=layers) if layers else None

    @property
    def rows(self) -> int:
        return self.mask.shape[0]

    @property
    def width(self) -> int:
        return self.mask.shape[1]

    def join(self, cache: DynamicCache, mask: torch.Tensor) -> None:
        """Appends the rows of a prefill (its cache and its rows x length mask, left-padded
        where its prompts differ in length) as the batch's last rows."""
        layers = [(layer.keys, layer.values) for layer in cache.layers]
        if not self.rows:
            self.layers, self.mask = layers, mask
            return
        width = max(self.width, mask.shape[1])
        self.mask = torch.cat([_left_pad(self.mask, width), _left_pad(mask, width)])
        self.layers = [(torch.cat([_left_pad(k, width), _left_pad(nk, width)]),
                        torch.cat([_left_pad(v, width), _left_pad(nv, width)]))
                       for (k, v), (nk, nv) in zip(self.layers, layers, strict=True)]

    def keep(self, rows: list[int]) -> None:
        """Keeps only `rows` (in that order), then drops the padding columns they all share."""
        index = torch.tensor(rows, dtype=torch.long)
        self.mask = self.mask[index]
        self.layers = [(k[index], v[index]) for k, v in self.layers]
        if not rows:
            self.mask, self.layers = torch.zeros(0, 0, dtype=torch.long), []
            return
        first = int(self.mask.any(0).nonzero()[0])
        if first:
            self.mask = self.mask[:, first:]
            self.layers = [(k[..., first:, :], v[..., first:, :]) for k, v in self.layers]

    def step(self, model, last: list[int], positions: list[int]) -> torch.Tensor:
        """One decode step: each row's `last` token at its `positions`; the next-token logits,
        rows x vocabulary. The caches grow by one column."""
        mask = torch.cat([self.mask, torch.ones(self.rows, 1, dtype=torch.long)], dim=1)
        out = forward(model, self.cache, input_ids=torch.tensor(last).unsqueeze(1),
                      attention_mask=mask, position_ids=torch.tensor(positions).unsqueeze(1))
        self.cache, self.mask = cache_of(out), mask
        return out.logits[:, -1, :]


def prefill(model, prompts: list[list[int]]):
    """One forward over `prompts`, left-padded to the longest: (cache, mask, last logits)."""
    width = max(len(ids) for ids in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    out = forward(model, None, input_ids=ids, attention_mask=mask, position_ids=positions)
    return cache_of(out), mask, out.logits[:, -1, :]


def forward(model, cache: DynamicCache | None, **inputs):
    """The model's forward keeping a cache, under the keyword its transformers version takes
    (`cache` from 5.x, `past_key_values` before)."""
    return model(**inputs, use_cache=True, **{_cache_keyword(type(model)): cache})


def cache_of(out) -> DynamicCache:
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


@functools.cache  # read once per model class, not at every decode step
def _cache_keyword(model_class: type) -> str:
    from transformers import LlamaForCausalLM

    # a wrapper's forward (**kwargs) names neither: transformers' own model's does
    for forward in (model_class.forward, LlamaForCausalLM.forward):
        parameters = inspect.signature(forward).parameters
        for name in ("cache", "past_key_values"):
            if name in parameters:
                return name
    return "past_key_values"


def _left_pad(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """`tensor` with zeros before its sequence dimension (the last for masks, the one before
    the last for keys and values) up to `width`."""
    dim = -1 if tensor.dim() == 2 else -2
    missing = width - tensor.shape[dim]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)
