"""The running sequences of one decode loop as one left-padded batch of KV caches.

Every row is right-aligned: a row shorter than the batch is padded on the left, and the
attention mask hides the padding. A sequence joins with the cache of its own prefill (padded to
the batch's width, or the batch padded to its length), leaves by dropping its row, and padding
every remaining row shares is trimmed. Each decode step feeds every row its last token at its own
position and grows every row by one.

A step where sequences join can be one packed forward (`step_joining`): every running row's last
token and every joiner's whole prompt laid end to end as one sequence of tokens, each at its own
position, attending through a block mask to its own row's cache and its own earlier tokens only.
The joiners' prefill then costs the step a few more tokens rather than a forward of its own (on
a small model most of a forward's time is per layer, not per token), and no row is padded by
another's prompt. The new keys and values are placed into the left-padded batch after it.
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


    def step_joining(self, model, last: list[int], positions: list[int],
                     prompts: list[list[int]]) -> torch.Tensor:
        """A decode step for every row and the prefill of `prompts` in one packed forward (the
        module docstring); the logits of each row's next token, then each prompt's first, as
        (rows + prompts) x vocabulary. The prompts join as the batch's last rows."""
        rows, lengths = self.rows, [len(p) for p in prompts]
        ids = torch.tensor([*last, *(token for p in prompts for token in p)]).unsqueeze(0)
        at = torch.tensor([*positions, *(i for n in lengths for i in range(n))]).unsqueeze(0)
        ends = torch.tensor(lengths).cumsum(0) + rows - 1  # each prompt's last token
        keep = torch.cat([torch.arange(rows), ends])
        packed = _Packed(self.layers)
        dtype = self.layers[0][0].dtype
        out = forward(model, packed, input_ids=ids, position_ids=at,
                      attention_mask=_packed_mask(self.mask, lengths, dtype),
                      logits_to_keep=keep)
        logits = out.logits[0]
        if logits.shape[0] != len(keep):  # a wrapper that computed every token's
            logits = logits[keep]
        width = max(self.width + 1, *lengths)
        self.layers = [(_placed(k, nk, lengths, width), _placed(v, nv, lengths, width))
                       for (k, v), (nk, nv) in zip(self.layers, packed.new, strict=True)]
        joined = [[0] * (width - n) + [1] * n for n in lengths]
        self.mask = torch.cat([_left_pad(torch.cat(
            [self.mask, torch.ones(rows, 1, dtype=torch.long)], dim=1), width),
            torch.tensor(joined, dtype=torch.long)])
        return logits


class _Packed:
    """The cache a packed forward reads: per layer, every row's cached keys (values) end to end,
    then the step's new ones. It keeps the new ones for the batch to place."""

    def __init__(self, layers: list[tuple[torch.Tensor, torch.Tensor]]):
        self.old, self.new = layers, []

    def update(self, keys, values, layer_idx, kwargs=None, **_):
        old_keys, old_values = self.old[layer_idx]
        self.new.append((keys[0], values[0]))  # KV heads x tokens x head size
        return _end_to_end(old_keys, keys), _end_to_end(old_values, values)


def _end_to_end(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """rows x heads x width x size, and 1 x heads x tokens x size: 1 x heads x (rows x width +
    tokens) x size."""
    heads, size = old.shape[1], old.shape[3]
    return torch.cat([old.transpose(0, 1).reshape(heads, -1, size), new[0]], dim=1).unsqueeze(0)


def _packed_mask(mask: torch.Tensor, lengths: list[int], dtype: torch.dtype) -> torch.Tensor:
    """The additive mask of a packed step, 1 x 1 x tokens x (rows x width + tokens): a running
    row's token sees its row's real cache columns and itself; a prompt's token its own prompt
    up to itself."""
    rows, width = mask.shape
    owner = torch.cat([torch.arange(rows), torch.repeat_interleave(
        torch.arange(rows, rows + len(lengths)), torch.tensor(lengths))])
    cached = (owner[:, None] == torch.arange(rows * width)[None, :] // width) \
        & mask.reshape(-1).bool()[None, :]
    token = torch.arange(len(owner))
    new = (owner[:, None] == owner[None, :]) & (token[None, :] <= token[:, None])
    seen = torch.cat([cached, new], dim=1)
    return torch.zeros(seen.shape, dtype=dtype).masked_fill(~seen, torch.finfo(dtype).min)[
        None, None]


def _placed(old: torch.Tensor, new: torch.Tensor, lengths: list[int], width: int) -> torch.Tensor:
    """A packed step's new keys (values), heads x tokens x size, placed: each running row's one
    after its cache, each prompt's as a row of its own; all left-padded to `width`."""
    rows = old.shape[0]
    running = _left_pad(torch.cat([old, new[:, :rows].transpose(0, 1).unsqueeze(2)], dim=2),
                        width)
    padded = torch.cat([new.new_zeros(new.shape[0], 1, new.shape[2]), new[:, rows:]], dim=1)
    index, start = [], 1  # 0 is the zero column
    for n in lengths:
        index.append([0] * (width - n) + list(range(start, start + n)))
        start += n
    joined = padded[:, torch.tensor(index)].transpose(0, 1)  # prompts x heads x width x size
    return torch.cat([running, joined])


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
