"""What this machine's CPU can do, read from /proc/cpuinfo, never assumed: the flags that decide
recipes (CPU_FLAGS), and whether bf16 matmuls are native."""

from __future__ import annotations

from pathlib import Path

CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8")
NATIVE_BF16 = ("avx512_bf16", "amx_bf16")  # either computes bf16 dot products in hardware
CPUINFO = Path("/proc/cpuinfo")


def cpu_flags(cpuinfo: str) -> tuple[str, ...]:
    """The CPU_FLAGS that every `flags` line of /proc/cpuinfo text lists."""
    sets = [set(line.partition(":")[2].split()) for line in cpuinfo.splitlines()
            if line.split(":")[0].strip() == "flags"]
    common = set.intersection(*sets) if sets else set()
    return tuple(flag for flag in CPU_FLAGS if flag in common)


def read_cpu_flags(cpuinfo: Path = CPUINFO) -> tuple[str, ...]:
    """The CPU_FLAGS this machine's `cpuinfo` lists for every processor (none where unreadable:
    a feature is never assumed)."""
    try:
        return cpu_flags(cpuinfo.read_text())
    except OSError:
        return ()


def bf16_native(cpuinfo: Path = CPUINFO) -> bool:
    """Whether this CPU computes bf16 matmuls natively: every processor lists AVX512-BF16 or
    AMX-BF16, and PyTorch's oneDNN uses bf16. oneDNN's own answer is not enough: it says yes
    wherever it can emulate bf16 (AVX512-BW without AVX512-BF16), where a bf16 model runs
    slower than fp32."""
    if not set(NATIVE_BF16) & set(read_cpu_flags(cpuinfo)):
        return False
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False
