"""Realized efficiency on live traffic: what each arm's forwards cost per input, and the
realized speedup (baseline cost ÷ optimized cost) with a confidence interval.

Where the numbers come from: each model replica measures the CPU seconds of every forward of a
merged batch (`time.process_time()`, which counts torch's intra-op threads; GPU seconds from
CUDA events on a CUDA replica) and gives each request of the batch its share by rows
(serve.replica.cputime). The gateway adds, per arm and per second (rollout.telemetry.window_fields),
counters that are only ever added to (`CPU_FIELDS`), for request i of n with share s_i of r_i inputs
riding in a batch of k_i requests:

    cpu_s = Σ s_i   cpu_rows = Σ r_i   cpu_n = n   cpu_ss = Σ s_i²   cpu_rs = Σ r_i·s_i
    cpu_rr = Σ r_i²   cpu_batch = Σ k_i   cpu_gpu = requests whose s_i is GPU seconds

**Cost per input** is the ratio estimator m = Σ s_i / Σ r_i (shown per 1,000 inputs). Its
variance, treating requests as independent draws of (s_i, r_i) (the textbook ratio estimator of
cluster sampling), is Var(m) ≈ Σ (s_i − m·r_i)² / (n (n − 1) r̄²), where the sum expands into
the counters above. Requests are *not* independent: those that shared a batch share its cost
per input. The variance is therefore multiplied by the design effect of perfectly correlated
batch-mates, the request-weighted mean batch size Σ k_i / n (`cpu_batch / cpu_n`, ≥ 1): an
upper bound on what the sharing costs, so the interval errs wide.

**Realized speedup** ρ = m_baseline / m_optimized (> 1: the optimized arm is cheaper per input).
Its interval is the delta method on the log ratio: log ρ ± z · sqrt(Var(m_b)/m_b² + Var(m_o)/m_o²),
exponentiated (so it stays positive and is symmetric in the two arms). It assumes: the arms'
samples are independent of each other; each mean is near normal (the central limit theorem on
n requests: `MIN_REQUESTS` at least, and the ramp's `min_samples`); the two arms saw the same
kind of traffic over the same seconds (routing is by a random bucket, so they do, up to the
share of traffic on each); and the machine load is what it is for both (an arm that is cheap
only on an idle machine shows as cheap while the machine is idle).

**Looked at repeatedly.** `rollout status` shows the 95 % interval (`Z_SHOWN`) as an estimate.
The ramp's `realized_speedup` gate looks at it every few seconds, and a fixed 95 % interval
looked at again and again leaves the truth sooner or later by chance: it would pass a
too-slow canary, or roll back a good one, far more often than 5 % of the time. The gate judges
a 99.9 % interval (`Z_GATE`, z = 3.29) instead: by Bonferroni, at most 5 % over 50 independent
looks. Successive looks at a sliding window share most of their requests, so a step of an hour
with a one-minute window holds about 60 nearly independent ones; together with the design
effect above this is conservative (the gate rather waits than decides), which costs a slower
verdict, not a wrong one. It is not anytime-valid in the strict sense the agreement gate's
confidence sequence is (rollout.agreement.agreement_cs).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass

CPU_FIELDS = ("cpu_s", "cpu_rows", "cpu_n", "cpu_ss", "cpu_rs", "cpu_rr", "cpu_batch", "cpu_gpu")
Z_SHOWN = 1.959964  # two-sided 95 %: what `rollout status` and the dashboard show
Z_GATE = 3.290527  # two-sided 99.9 %: what the ramp gate judges (see the docstring)
MIN_REQUESTS = 2  # measured requests an arm needs for a variance at all


def request_fields(cpu_s: float, rows: int, batch_requests: int, gpu: bool = False
                   ) -> dict[str, float]:
    """The counters one answered request with a measured share adds (`CPU_FIELDS`)."""
    return {"cpu_s": cpu_s, "cpu_rows": rows, "cpu_n": 1, "cpu_ss": cpu_s * cpu_s,
            "cpu_rs": rows * cpu_s, "cpu_rr": rows * rows, "cpu_batch": max(batch_requests, 1),
            "cpu_gpu": 1 if gpu else 0}


@dataclass(frozen=True)
class CpuSums:
    """One arm's summed counters over some seconds (zeros where a hash has none: hashes
    written before these counters existed read as no measurement)."""

    seconds: float = 0.0  # cpu_s
    rows: float = 0.0  # cpu_rows
    requests: int = 0  # cpu_n
    ss: float = 0.0  # cpu_ss
    rs: float = 0.0  # cpu_rs
    rr: float = 0.0  # cpu_rr
    batch: float = 0.0  # cpu_batch
    gpu: int = 0  # cpu_gpu

    @classmethod
    def from_totals(cls, totals: Mapping[str, float]) -> CpuSums:
        s, rows, n, ss, rs, rr, batch, gpu = (float(totals.get(name, 0.0)) for name in CPU_FIELDS)
        return cls(s, rows, int(n), ss, rs, rr, batch, int(gpu))

    @property
    def device(self) -> str | None:
        """Whose seconds these are: "cpu", "gpu", "mixed" (some replicas of each), None (none)."""
        if not self.requests:
            return None
        return "cpu" if not self.gpu else "gpu" if self.gpu >= self.requests else "mixed"

    @property
    def per_input(self) -> float | None:
        """Seconds per input (the ratio estimator m); None without inputs."""
        return self.seconds / self.rows if self.rows > 0 else None

    @property
    def per_1k(self) -> float | None:
        """Seconds per 1,000 inputs."""
        m = self.per_input
        return None if m is None else m * 1000

    @property
    def design_effect(self) -> float:
        """Σ k_i / n, at least 1: how much batch-mates sharing a cost widen the variance."""
        return max(1.0, self.batch / self.requests) if self.requests else 1.0

    def rel_variance(self) -> float | None:
        """Var(m) / m² (the variance of log m, by the delta method), design effect included;
        None with fewer than MIN_REQUESTS requests or no cost."""
        m, n = self.per_input, self.requests
        if m is None or m <= 0 or n < MIN_REQUESTS:
            return None
        residual = max(0.0, self.ss - 2 * m * self.rs + m * m * self.rr)  # Σ (s_i − m r_i)²
        r_bar = self.rows / n
        return residual / (n * (n - 1) * r_bar * r_bar) * self.design_effect / (m * m)

    def as_dict(self) -> dict:
        return asdict(self) | {"per_1k": self.per_1k, "device": self.device}


@dataclass(frozen=True)
class Speedup:
    """The realized speedup baseline ÷ optimized cost per input and its interval at `z`;
    `ratio` None (and `note` why) when it cannot be computed."""

    ratio: float | None
    lower: float | None
    upper: float | None
    z: float
    baseline_n: int
    optimized_n: int
    note: str = ""

    @property
    def confidence(self) -> float:
        """The two-sided confidence the interval was computed at (0.95 for Z_SHOWN)."""
        return math.erf(self.z / math.sqrt(2))

    def as_dict(self) -> dict:
        return asdict(self) | {"confidence": round(self.confidence, 4)}

    def text(self) -> str:
        """e.g. `1.82x (95% CI 1.61-2.05; 412 baseline, 96 optimized requests)`."""
        counts = f"{self.baseline_n} baseline, {self.optimized_n} optimized requests"
        if self.ratio is None or self.lower is None:
            ratio = "-" if self.ratio is None else f"{self.ratio:.3g}x"
            return f"{ratio} ({self.note}; {counts})"
        level = f"{self.confidence * 100:.4g}%"
        return f"{self.ratio:.3g}x ({level} CI {self.lower:.3g}-{self.upper:.3g}; {counts})"


def speedup(baseline: CpuSums, optimized: CpuSums, z: float = Z_SHOWN) -> Speedup:
    """Baseline cost ÷ optimized cost per input, with the delta-method interval on its log
    (see the module docstring)."""
    counts = (z, baseline.requests, optimized.requests)
    problem = _incomparable(baseline, optimized)
    if problem:
        return Speedup(None, None, None, *counts, note=problem)
    ratio = baseline.per_input / optimized.per_input
    variances = (baseline.rel_variance(), optimized.rel_variance())
    if None in variances:
        return Speedup(ratio, None, None, *counts, note=f"fewer than {MIN_REQUESTS} requests")
    half = z * math.sqrt(sum(variances))
    return Speedup(ratio, ratio * math.exp(-half), ratio * math.exp(half), *counts)


def _incomparable(baseline: CpuSums, optimized: CpuSums) -> str:
    """Why the two arms' costs cannot be divided ("" when they can)."""
    for arm, sums in (("baseline", baseline), ("optimized", optimized)):
        if not sums.requests or not sums.per_input:
            return f"no measured {arm} forwards"
    if baseline.device != optimized.device:
        return f"{baseline.device} seconds on baseline, {optimized.device} on optimized"
    return ""
