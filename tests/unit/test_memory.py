"""serve.replica.memory_trim: free memory returned to the OS after a burst."""

import sys

import pytest

from serve.replica import memory_trim


def test_the_trimmer_is_due_after_enough_tokens_and_resets():
    trimmer = memory_trim.Trimmer(after=100)
    trimmer.forwarded(60)
    assert not trimmer.due()
    trimmer.forwarded(40)
    assert trimmer.due()
    trimmer.done()
    assert not trimmer.due() and trimmer.trims == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_releasing_gives_pages_back_on_glibc():
    def rss_kib() -> int:
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")

    if memory_trim._malloc_trim() is None:
        pytest.skip("not glibc")
    blocks = [bytearray(64 * 1024) for _ in range(4096)]  # 256 MiB in heap-sized blocks
    keep = blocks[-1]
    del blocks
    before = rss_kib()
    assert memory_trim.release_free_memory() is True
    after = rss_kib()
    assert after < before - 64 * 1024, (before, after)  # most of the 256 MiB went back
    assert len(keep) == 64 * 1024


def test_without_glibc_release_says_so(monkeypatch):
    monkeypatch.setattr(memory_trim, "_malloc_trim", lambda: None)
    assert memory_trim.release_free_memory() is False
