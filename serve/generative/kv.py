"""The KV cache as a budget: what one token of one sequence costs, and what a batch may hold.

A causal LM's decode keeps, per sequence, a key and a value vector per layer, KV head and token:
`layers x KV heads x head size x dtype bytes x 2` bytes per token (`KvCost`). The decode loop
(serve.generative.decode) keeps its running sequences as one left-padded batch: every row is as
wide as the longest, and all grow by a token per step. `KvBudget` admits a sequence only where the
batch with it can reach its end within the capacity even if every row runs to its `max_tokens`,
so a forward never asks for memory the budget did not grant; a sequence that could not fit even
alone is refused for good (`never_fits`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class KvCost:
    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int

    @property
    def per_token(self) -> int:
        """Bytes of keys and values one token of one sequence holds across all layers."""
        return self.layers * self.kv_heads * self.head_dim * self.dtype_bytes * 2

    @classmethod
    def of(cls, config, dtype_bytes: int) -> KvCost:
        """From a transformers causal-LM config (its text config where it has several)."""
        text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") \
            else config
        heads = text.num_attention_heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
        kv_heads = getattr(text, "num_key_value_heads", None) or heads
        return cls(text.num_hidden_layers, kv_heads, head_dim, dtype_bytes)

    @classmethod
    def of_model(cls, model) -> KvCost:
        """A loaded model's: its config, at the dtype of the KV cache it writes."""
        return cls.of(model.config, kv_dtype_bytes(model))


def kv_dtype_bytes(model) -> int:
    """Bytes per element of the KV cache the model writes: its embeddings' dtype (dynamic int8
    recipes keep float activations, so their keys and values stay float too)."""
    return model.get_input_embeddings().weight.element_size()


@dataclass(frozen=True)
class Row:
    """A running sequence as the budget sees it: tokens held now, tokens it may still add."""
    length: int
    remaining: int


class KvBudget:
    """Admission by the padded batch's worst case, and the bytes in use and at peak."""

    def __init__(self, capacity_bytes: int, cost: KvCost):
        if capacity_bytes < cost.per_token:
            raise ValueError(f"a KV budget of {capacity_bytes:,} bytes holds no token "
                             f"({cost.per_token:,} bytes each)")
        self.capacity_bytes, self.cost = capacity_bytes, cost
        self.capacity_tokens = capacity_bytes // cost.per_token
        self._lock = threading.Lock()
        self._in_use = self._peak = 0

    def never_fits(self, tokens: int) -> bool:
        """Whether a sequence of `tokens` (prompt plus `max_tokens`) exceeds the budget alone."""
        return tokens > self.capacity_tokens

    def admits(self, rows: list[Row], width: int, joining: Row) -> bool:
        """Whether `joining` may enter a batch of `rows`, `width` tokens wide: the batch with it,
        every row running to its end, stays within the capacity."""
        rows = [*rows, joining]
        start = max(width, joining.length)
        # the widest the batch gets while `count` rows are left: rows leave shortest first
        ends = sorted(row.remaining for row in rows)
        worst = max((start + end) * (len(ends) - i) for i, end in enumerate(ends))
        return worst <= self.capacity_tokens

    def holds(self, tokens: int) -> None:
        """The batch now holds `tokens` token slots (rows x width, padding included)."""
        with self._lock:
            self._in_use = tokens * self.cost.per_token
            self._peak = max(self._peak, self._in_use)

    @property
    def in_use_bytes(self) -> int:
        return self._in_use

    @property
    def peak_bytes(self) -> int:
        return self._peak
