"""The shadow's reservoir: the most recent baseline vectors a gateway replica saw, in which a
shadowed embed pair's two top-10 neighbour lists are compared (rollout.retrieval's recall@10,
online; rollout.shadow counts it).

`Reservoir(size, tolerance)` keeps the last `size` baseline vectors (a ring: what a live index
was most recently fed). `neighbours(baseline, optimized)` answers, for each pair of rows, how
many of the optimized vector's K nearest vectors in the reservoir (cosine, exact search) count
as the baseline vector's K nearest, then adds the baseline rows. A found vector counts when
its similarity to the *baseline* vector is within `tolerance` of the baseline's K-th
(rollout.retrieval, ties: the rule verify applies offline, `verify_retrieval_tolerance`), so
neighbours whose order a low-precision arm's rounding swaps are not read as lost. Before the
reservoir holds K vectors a pair is not compared (None). Identical answers always share all
K. A pair's own baseline vector is added after it is compared, so it never finds itself.
numpy, not torch: the gateway loads no model. Thread-safe (the shadow computes off the event
loop).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from rollout.retrieval import K, tie_hits


def _unit(rows: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.where(norms == 0, 1.0, norms)


def _top(index: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """Each query's K nearest rows of `index`, nearest first, ties by position."""
    scores = queries @ index.T
    return np.argsort(-scores, axis=1, kind="stable")[:, :K]


class Reservoir:
    """The last `size` baseline vectors of one gateway replica (module docstring)."""

    def __init__(self, size: int, tolerance: float = 0.0):
        self.size = size
        self.tolerance = tolerance
        self.rows: np.ndarray | None = None  # size x dims once the first vector came
        self.count = 0  # vectors ever added (the next one goes to count % size)
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return min(self.count, self.size)

    def neighbours(self, baseline: Sequence[Sequence[float]],
                   optimized: Sequence[Sequence[float]]) -> list[int | None]:
        """Shared top-K neighbours per pair (None: not compared), then the baseline rows
        join the reservoir. Vectors of another width than the reservoir's start it anew."""
        base = _unit(np.asarray(baseline, dtype=np.float32))
        opt = _unit(np.asarray(optimized, dtype=np.float32))
        if base.shape != opt.shape or base.ndim != 2 or not self.size:
            return [None] * len(baseline)
        with self.lock:
            if self.rows is None or self.rows.shape[1] != base.shape[1]:
                self.rows, self.count = np.zeros((self.size, base.shape[1]), np.float32), 0
            found: list[int | None] = [None] * len(base)
            if len(self) >= K:
                index = self.rows[:len(self)]
                scores = base @ index.T  # the baseline's similarities
                kth = np.partition(scores, -K, axis=1)[:, -K]
                found = [tie_hits(row[got].tolist(), bar, self.tolerance)
                         for row, got, bar in zip(scores, _top(index, opt), kth, strict=True)]
            for row in base:
                self.rows[self.count % self.size] = row
                self.count += 1
        return found
