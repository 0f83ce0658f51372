"""The running sequences of one decode loop as one left-padded batch of KV caches.

Every row is right-aligned: a row shorter than the batch is padded on the left, and the
attention mask hides the padding. A sequence joins with the cache of its own prefill (padded to
the batch's width, or the batch padded to its length), leaves by dropping its row, and padding
every remaining row shares is trimmed. Each decode step feeds every row its last token at its own
position and grows every row by one.

A step where sequences join can be one packed forward (`step_joining`): every running row's last
token and every joiner's whole prompt laid end to end as one sequence of tokens, each at its own
position, so the linear layers see only real tokens. Attention is split (`packed_attention`, an
attention function registered with transformers for that forward): the running rows' tokens
attend as a decode step does, each to its own row's cache, and the prompts as a prefill does,
each causally within itself. The joiners' prefill then costs the step a few more tokens rather
than a forward of its own (on a small model most of a forward's time is per layer, not per
token), and no row is padded by another's prompt. The new keys and values join the left-padded
batch after it. Only architectures whose attention is plain scaled dot-product over the cache
(`PACKABLE`, no sliding window, no logit soft-capping) take it.
"""

from __future__ import annotations

import functools
import inspect
import threading

import torch
from torch.nn import functional
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
        plan = _Packed(self.layers, self.mask, lengths)
        _register()
        config = model.config
        before = config._attn_implementation
        config._attn_implementation, _ACTIVE.plan = PACKED, plan
        try:  # a 4D mask is passed through as it is; the plan holds the real one
            out = forward(model, plan, input_ids=ids, position_ids=at, logits_to_keep=keep,
                          attention_mask=torch.ones(1, 1, 1, 1, dtype=torch.bool))
        finally:
            config._attn_implementation, _ACTIVE.plan = before, None
        logits = out.logits[0]
        if logits.shape[0] != len(keep):  # a wrapper that computed every token's
            logits = logits[keep]
        self.layers, width = plan.placed, plan.width
        self.mask = torch.cat([_left_pad(plan.running_mask[:, 0, 0].long(), width),
                               _left_pad(plan.valid.long(), width)])
        return logits


PACKED = "canary_packed"  # the attention function's name in transformers' registry
PACKABLE = ("llama", "mistral", "qwen2", "qwen3")  # plain attention over the whole cache
_ACTIVE = threading.local()  # the plan of the packed forward running on this thread


def packable(config) -> bool:
    """Whether a model of `config` can take a packed step (`packed_attention`)."""
    return (getattr(config, "model_type", None) in PACKABLE
            and not getattr(config, "sliding_window", None)
            and not getattr(config, "attn_logit_softcapping", None))


class _Packed:
    """A packed step's plan and the cache its forward reads. Tokens 0..rows-1 are the running
    rows'; the prompts' follow, end to end. `gather` lays each prompt out as a left-padded row
    (`valid` marks its real slots); `placed` collects, per layer, the batch's keys and values
    after the step (the running rows, then the prompts, `width` wide)."""

    def __init__(self, layers, mask: torch.Tensor, lengths: list[int]):
        self.old, rows, width = layers, mask.shape[0], max(lengths)
        self.width = max(mask.shape[1] + 1, width)  # the batch's after the step
        self.prompt_width = width  # a prompt's row within the step
        self.running_mask = torch.cat([mask, torch.ones(rows, 1, dtype=mask.dtype)],
                                      dim=1).bool()[:, None, None, :]
        first = (torch.tensor(lengths).cumsum(0) - torch.tensor(lengths) + rows).tolist()
        slots = torch.arange(width)
        pad = torch.tensor([width - n for n in lengths])[:, None]
        self.valid = slots[None, :] >= pad  # prompts x width
        self.gather = torch.tensor(first)[:, None] + (slots[None, :] - pad).clamp(min=0)
        causal = slots[None, :] <= slots[:, None]
        self.joined_mask = ((causal[None] & self.valid[:, None, :])
                            | torch.eye(width, dtype=torch.bool)[None])[:, None]
        self.real = self.valid.reshape(-1).nonzero()[:, 0]  # flat slots, in token order
        self.placed: list[tuple[torch.Tensor, ...]] = []

    def update(self, keys, values, layer_idx, kwargs=None, **_):
        return keys, values  # packed_attention reads the old cache from the plan


def packed_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                     **_):
    """transformers' attention-function signature: query 1 x heads x tokens x size, key and
    value 1 x KV heads x tokens x size (this step's, rotated); 1 x tokens x heads x size."""
    plan: _Packed = _ACTIVE.plan
    old_keys, old_values = plan.old[module.layer_idx]
    rows, heads = old_keys.shape[0], query.shape[1]
    q, k, v = query[0], key[0], value[0]
    gqa = heads != k.shape[0]
    keys, values = _placed(old_keys, k, plan), _placed(old_values, v, plan)
    seen = old_keys.shape[2] + 1  # a running row's columns, its new one last
    running = functional.scaled_dot_product_attention(
        q[:, :rows].transpose(0, 1).unsqueeze(2), keys[:rows, :, -seen:],
        values[:rows, :, -seen:], attn_mask=plan.running_mask, scale=scaling,
        enable_gqa=gqa)  # rows x heads x 1 x size
    width = plan.prompt_width
    joined = functional.scaled_dot_product_attention(
        q[:, plan.gather].transpose(0, 1), keys[rows:, :, -width:], values[rows:, :, -width:],
        attn_mask=plan.joined_mask, scale=scaling, enable_gqa=gqa)  # prompts x heads x width
    plan.placed.append((keys, values))
    out = torch.cat([running[:, :, 0], joined.transpose(1, 2).reshape(
        -1, heads, joined.shape[-1])[plan.real]])
    return out.unsqueeze(0), None


def _placed(old: torch.Tensor, new: torch.Tensor, plan: _Packed) -> torch.Tensor:
    """The batch's keys (values) after a packed step, written once: each running row's cache
    then its new column, each prompt's as a row of its own, all left-padded to `plan.width`.
    `old`: rows x KV heads x width x size; `new`: KV heads x tokens x size."""
    rows, heads, seen, size = old.shape
    width = plan.prompt_width
    out = old.new_empty(rows + plan.valid.shape[0], heads, plan.width, size)
    out[:rows, :, :plan.width - seen - 1] = 0
    out[:rows, :, plan.width - seen - 1:-1] = old
    out[:rows, :, -1] = new[:, :rows].transpose(0, 1)
    out[rows:, :, :plan.width - width] = 0
    out[rows:, :, plan.width - width:] = new[:, plan.gather].transpose(0, 1) \
        * plan.valid[:, None, :, None]
    return out


@functools.cache
def _register() -> None:
    """`packed_attention` in transformers' registry, at the first packed step: importing the
    registry loads transformers' modeling code (and torchao with it), which a process that
    only imports this module, as `serve run`'s does, should not pay for."""
    from transformers import AttentionInterface

    AttentionInterface.register(PACKED, packed_attention)


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
