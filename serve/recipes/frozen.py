"""A CPU torch recipe's model run as a frozen TorchScript trace: the same kernels, one call.

An eager forward is a few hundred Python calls (modules, functional ops), and the thread that
runs it takes Python's interpreter lock back after every op. In a process that also serves HTTP
(the gateway replica of the colocated topology; a model replica's event loop and Ray's core
worker threads) the lock is often held by another thread, and the forward waits for it up to
the interpreter's switch interval (5 ms) each time. On the 2-core development machine
(`docs/benchmarks.md`, "The forward outside the interpreter lock") a 16-text forward took 29 ms
alone and 51 ms beside a thread that ran Python a third of the time; the frozen trace calls
every op from C++ with the lock released, and took 42 ms on one thread whether the other thread
ran or not.

`freeze(model, output)` traces the model on two example shapes, freezes it, and keeps it only
where it answers what the eager model answers on shapes it was not traced on (batch sizes and
widths below); otherwise it keeps the eager model and says why (a model with data-dependent
Python control flow, a tensor subclass the tracer cannot see through, a quantized module freezing
does not support). Traced on the calling thread, which is the process's compute thread
(serve.replica.compute), so it adds no OpenMP team.
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import torch

from serve.common.quiet import quiet

# (rows, width): traced on the first two, checked on all; widths the tracer never saw among them
CHECK_SHAPES = ((2, 8), (1, 5), (1, 13), (5, 31), (3, 70))
# largest difference from the eager model the trace may show, by the model's dtype: the same
# kernels give the same numbers; freezing folds constants, which may round differently
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 2e-2}


class Frozen:
    """A frozen trace, answered as the eager model answers: `out.last_hidden_state` or
    `out.logits`; anything else asked of it is the eager model's."""

    def __init__(self, traced, output: str, source: torch.nn.Module):
        self.traced, self.output = traced, output
        self.source = source  # the eager model it was traced from (parameters, dtype)

    def __call__(self, *, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        out = self.traced(input_ids=input_ids, attention_mask=attention_mask)
        value = out[self.output] if isinstance(out, dict) else out[0]
        return SimpleNamespace(**{self.output: value})

    def __getattr__(self, name: str):
        """What is asked of the model beyond its forward (its modules, parameters, dtype) is
        the eager model's."""
        if name.startswith("__") or name in ("traced", "output", "source"):
            raise AttributeError(name)
        return getattr(self.source, name)


def _dtype(model: torch.nn.Module) -> torch.dtype:
    for parameter in model.parameters():
        if parameter.is_floating_point():
            return parameter.dtype
    return torch.float32


def _example(rows: int, width: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, 20000, (rows, width), generator=generator)
    lengths = torch.randint(1, width + 1, (rows,), generator=generator)
    lengths[0] = width  # one row fills the width, as in every padded batch
    mask = (torch.arange(width) < lengths.unsqueeze(1)).long()
    return ids, mask


def _output(out, name: str) -> torch.Tensor:
    return out[name] if isinstance(out, dict) else getattr(out, name)


def difference(model: torch.nn.Module, frozen: Frozen, shapes=CHECK_SHAPES) -> float:
    """The largest difference of the trace's output from the model's on the unmasked rows'
    positions, over `shapes`."""
    worst = 0.0
    with torch.inference_mode():
        for seed, (rows, width) in enumerate(shapes):
            ids, mask = _example(rows, width, seed)
            eager = _output(model(input_ids=ids, attention_mask=mask), frozen.output).float()
            traced = _output(frozen(input_ids=ids, attention_mask=mask), frozen.output).float()
            if eager.shape != traced.shape:
                return float("inf")
            if eager.dim() == 3:  # hidden states: padded positions are never read
                eager, traced = eager * mask.unsqueeze(-1), traced * mask.unsqueeze(-1)
            worst = max(worst, (eager - traced).abs().max().item())
    return worst


def freeze(model: torch.nn.Module, output: str) -> tuple[Frozen | torch.nn.Module, str]:
    """The model as a frozen trace when it answers as the eager model does, else the model;
    and what was kept, in words (for the replica's start log)."""
    example = [_example(rows, width, seed) for seed, (rows, width) in enumerate(CHECK_SHAPES[:2])]
    try:
        with torch.no_grad(), warnings.catch_warnings(), quiet():
            warnings.simplefilter("ignore")  # the tracer warns of every Python branch it fixes
            traced = torch.jit.trace(
                model, example_kwarg_inputs={"input_ids": example[0][0],
                                             "attention_mask": example[0][1]},
                strict=False, check_trace=False)
            traced = torch.jit.freeze(traced.eval())
        frozen = Frozen(traced, output, model)
        # run once on the second shape: freezing optimises on the first call
        frozen(input_ids=example[1][0], attention_mask=example[1][1])
        worst = difference(model, frozen)
    except Exception as exc:  # noqa: BLE001 - any failure to trace keeps the eager model
        return model, f"eager (TorchScript trace failed: {type(exc).__name__}: {exc})"[:300]
    tolerance = TOLERANCE.get(_dtype(model), 1e-4)
    if not worst <= tolerance:
        return model, (f"eager (the trace differs from the eager model by {worst:.2g} > "
                       f"{tolerance:g})")
    return frozen, f"frozen TorchScript trace (largest difference from eager {worst:.2g})"
