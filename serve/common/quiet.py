"""Third-party log lines that tell an operator nothing, dropped where the project's code
triggers them: a filter on the one logger that says each, for the one message, while the
project's call runs (`quiet`). Everything else those libraries log still reaches the console.

- torch (`torch.utils._pytree`): "... is an Enum subclass and is now natively supported by
  torch.compile ... Calling register_constant() on Enum subclasses is deprecated", twice per
  process, when transformers' model code first loads and imports torchao (which registers its
  enums the old way).
- torchao (`torchao`, `torchao.kernel.intmm`), imported by transformers there too: "Failed to
  load .../torchao/_C_....so" for each kernel library built for GPUs, and "Detected no
  triton": a CPU build has neither, and nothing here uses them.
- transformers (`transformers.configuration_utils`): "`torch_dtype` is deprecated! Use `dtype`
  instead!", when CTranslate2's converter reads a model's config (serve.recipes.ct2_int8).
- transformers (`transformers.modeling_utils`): "`loss_type=None` was set in the config but it
  is unrecognized", when TorchScript traces a model and reads every attribute, its training
  loss among them (never used in serving).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

NOISE = [
    ("torch.utils._pytree", "register_constant() on Enum subclasses is deprecated"),
    ("torchao", "Failed to load"),
    ("torchao.kernel.intmm", "Detected no triton"),
    ("transformers.configuration_utils", "`torch_dtype` is deprecated"),
    ("transformers.modeling_utils", "was set in the config but it is unrecognized"),
]


class _Drop(logging.Filter):
    def __init__(self, fragment: str):
        super().__init__()
        self.fragment = fragment

    def filter(self, record: logging.LogRecord) -> bool:
        return self.fragment not in record.getMessage()


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """While the block runs, `NOISE` is not logged."""
    filters = [(logging.getLogger(name), _Drop(fragment)) for name, fragment in NOISE]
    for logger, drop in filters:
        logger.addFilter(drop)
    try:
        yield
    finally:
        for logger, drop in filters:
            logger.removeFilter(drop)


def silence(name: str, fragment: str) -> None:
    """From now on, logger `name` does not log messages containing `fragment`."""
    logging.getLogger(name).addFilter(_Drop(fragment))
