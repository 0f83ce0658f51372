"""Giving freed memory back to the operating system after a burst.

A forward of a large merged batch allocates activations of hundreds of MiB. glibc's allocator
keeps what is freed for reuse (its mmap threshold grows after big frees, so big blocks end up on
the heap), so a model replica's resident memory stays at its burst peak long after the burst
(measured: +124 to +278 MiB, not back after 60 s). `malloc_trim(0)` returns the free pages.
The model replica calls it when it goes idle after forwarding at least `TRIM_AFTER_TOKENS`
padded tokens since the last trim, in its forward thread (it takes milliseconds).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging

log = logging.getLogger("canary.memory")

TRIM_AFTER_TOKENS = 65_536


@functools.cache
def _malloc_trim():
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim this way
        return None


def release_free_memory() -> bool:
    """Return the allocator's free pages to the OS; False where the C library cannot."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


class Trimmer:
    """Counts padded tokens forwarded; `due()` once at least `after` have been since the last
    `done()`."""

    def __init__(self, after: int = TRIM_AFTER_TOKENS):
        self.after, self.tokens, self.trims = after, 0, 0

    def forwarded(self, tokens: int) -> None:
        self.tokens += tokens

    def due(self) -> bool:
        return self.tokens >= self.after

    def done(self) -> None:
        self.tokens = 0
        self.trims += 1
