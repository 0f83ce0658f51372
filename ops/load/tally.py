"""What a run of Shots came to: counts per status (the histogram), goodput, and latency
percentiles of the 200s; and what the gateway's `Server-Timing` header says of one answer."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from ops.load.sender import Shot
from rollout.agreement import percentile

ANSWERED = ("200", "503", "504")  # what an overloaded gateway may answer


def pct(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile of `values`, None for no values."""
    return percentile(values, q) if values else None


def bucket(status: int | None) -> str:
    """200 / 503 / 504 as themselves, any other code as `other`, no answer as `lost`."""
    if status is None:
        return "lost"
    return str(status) if str(status) in ANSWERED else "other"


def statuses(shots: Iterable[Shot]) -> dict[str, int]:
    """Every status seen and how often, `lost` for no answer, in order."""
    return dict(sorted(Counter(str(s.status or "lost") for s in shots).items()))


def summarize(shots: list[Shot], elapsed_s: float) -> dict:
    """Counts per status bucket, every status seen, 200s and texts per second, p50/p99 of 200s."""
    ok = [s for s in shots if s.status == 200]
    latencies = [s.latency_s * 1000 for s in ok]
    counts = Counter(bucket(s.status) for s in shots)
    return {
        "sent": len(shots),
        "counts": {k: counts.get(k, 0) for k in (*ANSWERED, "other", "lost")},
        "statuses": statuses(shots),
        "ok_per_s": len(ok) / elapsed_s if elapsed_s > 0 else None,
        "texts_per_s": sum(s.texts for s in ok) / elapsed_s if elapsed_s > 0 else None,
        "p50_ms": pct(latencies, 50),
        "p99_ms": pct(latencies, 99),
    }


def parse_server_timing(header: str) -> tuple[dict[str, float], int | None]:
    """`preprocess;dur=1.2, ..., batch;desc="requests=3 items=7"` -> ({stage: ms}, requests)."""
    stages: dict[str, float] = {}
    batch = None
    for part in header.split(","):
        name, _, rest = part.strip().partition(";")
        if rest.startswith("dur="):
            try:
                stages[name] = float(rest[4:])
            except ValueError:
                continue
        elif name == "batch" and "requests=" in rest:
            value = rest.split("requests=", 1)[1].split()[0].strip('"')
            batch = int(value) if value.isdigit() else None
    return stages, batch
