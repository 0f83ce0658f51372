"""Fault injection for drills and tests: what a model replica's `user_config` asks to break,
parsed once (`Faults.parse`) and consulted only where a fault is injected. Every fault is off
unless set; a production config sets none.

- `fault_delay_ms`: every batch waits that long first; `fault_error`: every batch fails;
- `fault_oom_tokens`: a forward over more padded tokens than that runs out of memory, as a
  too-large batch would on a real device;
- `fault_cpu_ms`: every forward spins that many ms of CPU first (a slower optimized arm);
- `fault_rotate_labels`: every classify answer's scores move one label on (every top-1 changes);
  `fault_rotate_script` (a script of rollout.slices, e.g. `han`): the same for the inputs of
  that script only;
- `fault_perturb_embeddings` (a scale): Gaussian noise on every embedding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rollout.slices import script_of
from serve.recipes.source import Encoded

KNOBS = ("fault_delay_ms", "fault_error", "fault_oom_tokens", "fault_cpu_ms",
         "fault_rotate_labels", "fault_rotate_script", "fault_perturb_embeddings")


@dataclass(frozen=True)
class Faults:
    """The faults one replica injects (see the module docstring); `Faults()` injects none."""

    delay_s: float = 0.0
    error: bool = False
    oom_tokens: int = 0
    cpu_s: float = 0.0
    rotate_labels: bool = False
    rotate_script: str = ""
    perturb: float = 0.0

    @classmethod
    def parse(cls, user_config: dict) -> Faults:
        """The faults `user_config` sets (ValueError for a value of the wrong kind)."""
        unknown = sorted(key for key in user_config
                         if key.startswith("fault_") and key not in KNOBS)
        if unknown:
            raise ValueError(f"unknown fault injection setting(s) {unknown}: one of {list(KNOBS)}")
        get = user_config.get
        try:
            return cls(delay_s=float(get("fault_delay_ms", 0)) / 1000,
                       error=bool(get("fault_error", False)),
                       oom_tokens=int(get("fault_oom_tokens", 0)),
                       cpu_s=float(get("fault_cpu_ms", 0)) / 1000,
                       rotate_labels=bool(get("fault_rotate_labels", False)),
                       rotate_script=str(get("fault_rotate_script", "")),
                       perturb=float(get("fault_perturb_embeddings", 0)))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"fault injection: {exc}") from None

    def out_of_memory(self, rows: list) -> bool:
        """Whether a forward of `rows` (token id lists) runs out of memory under `oom_tokens`."""
        return bool(self.oom_tokens) and len(rows) * max(map(len, rows)) > self.oom_tokens

    def postprocess(self, task: str, outputs: list[dict], encoded: Encoded | None,
                    tokenizer) -> list[dict]:
        """The answers as the label and embedding faults change them."""
        if self.rotate_labels and task == "classify":
            outputs = rotate_labels(outputs)
        if self.rotate_script and task == "classify" and encoded:
            outputs = rotate_script(outputs, encoded, tokenizer, self.rotate_script)
        if self.perturb and task == "embed":
            outputs = perturb_embeddings(outputs, self.perturb)
        return outputs


def rotate_labels(outputs: list[dict]) -> list[dict]:
    """Each label's score moves to the next label, so every top-1 label changes: an arm that
    disagrees with its twin."""
    rotated = []
    for output in outputs:
        names, values = list(output["scores"]), list(output["scores"].values())
        scores = dict(zip(names, values[-1:] + values[:-1], strict=True))
        rotated.append({**output, "label": max(scores, key=scores.get), "scores": scores})
    return rotated


def rotate_script(outputs: list[dict], encoded: Encoded, tokenizer, script: str) -> list[dict]:
    """`rotate_labels` for the inputs whose dominant script (rollout.slices.script_of, read from
    their decoded token ids) is `script` only: an arm that breaks one script and agrees
    elsewhere."""
    texts = [tokenizer.decode(ids, skip_special_tokens=True) for ids in encoded.ids]
    return [rotate_labels([output])[0] if script_of(text) == script else output
            for output, text in zip(outputs, texts, strict=True)]


def perturb_embeddings(outputs: list[dict], scale: float) -> list[dict]:
    """Each embedding moved by Gaussian noise of `scale` times its norm, spread over its
    dimensions, and renormalised: an arm whose vectors find other neighbours while their cosine
    with the baseline stays high."""
    moved = []
    for output in outputs:
        vector = torch.tensor(output["embedding"])
        noise = torch.randn(vector.shape) * scale * vector.norm() / vector.numel() ** 0.5
        shifted = torch.nn.functional.normalize(vector + noise, dim=0)
        moved.append({**output, "embedding": shifted.tolist()})
    return moved
