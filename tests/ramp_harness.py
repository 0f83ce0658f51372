"""A ramp controller on in-memory stores, a fake clock and scripted metrics, for unit tests."""

from __future__ import annotations

from rollout import DeploymentReport, FakeClock, MemoryStateStore, Rollout, Verdict
from rollout.ramp import (
    CONTROLLER,
    MemoryRampStore,
    RampControl,
    RampController,
    WindowsMetrics,
    parse_plan,
)
from rollout.shadow import PairOutcome, ShadowItem, merge_shadow, shadow_fields
from rollout.telemetry.windows import ArmStats, MemoryHashes, Windows

BASELINE, OPTIMIZED = "fp32-aaaa", "bf16-bbbb"

PLAN = {
    "window_s": 60,
    "failures_tolerated": 1,
    "gates": {"min_samples": 10, "error_rate_delta": 0.01, "timeout_rate": 0.01,
              "p99_ratio": 1.5, "p99_ms": 500, "fallback_rate": 0.02},
    "steps": [
        {"percent": 10, "min_duration_s": 30, "min_samples": 50},
        {"percent": 50, "min_duration_s": 30, "min_samples": 50},
        {"percent": 100, "min_duration_s": 30, "min_samples": 50},
    ],
}


def stats(arm: str, requests: int = 0, *, error_rate: float = 0.0, timeout_rate: float = 0.0,
          fallbacks: int = 0, p99_ms: float | None = 40.0, seconds: float = 60.0) -> ArmStats:
    calls = requests
    return ArmStats(
        arm=arm, seconds=seconds, requests=requests, calls=calls,
        request_rate=requests / seconds, success_rate=1.0 if requests else None,
        error_rate=error_rate if calls else None, timeout_rate=timeout_rate if calls else None,
        retry_rate=fallbacks / requests if requests else None, fallbacks=fallbacks,
        p50_ms=None, p99_ms=p99_ms if requests else None, mean_ms=None, queue_mean=None,
        batch_mean=None, stage_ms={}, compute_ms=None, cost_per_1k=None, statuses={},
    )


class ScriptedMetrics:
    """Answers what the test set; remembers every window it was asked for."""

    horizon_s = 3_600

    def __init__(self):
        self.canary = stats("optimized")
        self.baseline = stats("baseline", 500)
        self.pairs, self.agreed = 0, 0
        self.confident_pairs, self.confident_flips = 0, 0
        self.slice_counts: dict[str, tuple[int, int]] = {}  # slice -> (pairs, agreed)
        self.recall_pairs, self.recall_hits = 0, 0  # embed pairs, shared top-10 neighbours
        self.token_counts: tuple[int, float, dict[int, int]] = (0, 0.0, {})  # scored answers
        self.asked: list[int] = []
        self.shadow_asked: list[tuple[int, float | None]] = []  # (last_s, min_margin)

    def arm(self, arm, last_s):
        self.asked.append(last_s)
        return self.canary if arm == "optimized" else self.baseline

    def agreement(self, last_s):
        self.shadow_asked.append((last_s, None))
        return self.pairs, self.agreed

    def confident(self, last_s, min_margin=0.05):
        self.shadow_asked.append((last_s, min_margin))
        return self.confident_pairs, self.confident_flips

    def slices(self, last_s):
        return dict(self.slice_counts)

    def recall(self, last_s):
        return self.recall_pairs, self.recall_hits

    def tokens(self, last_s):
        return self.token_counts


class Harness:
    def __init__(self, plan: dict | None = None):
        self.clock = FakeClock()
        self.states = MemoryStateStore()
        self.ramps = MemoryRampStore(self.states, self.clock)
        self.metrics = ScriptedMetrics()
        self.rollout = Rollout(self.states, self.clock)
        self.control = RampControl(self.states, self.ramps, self.clock)
        self.controller = self.new_controller("c1")
        self.plan = parse_plan(plan or PLAN)
        self.versions = (BASELINE, OPTIMIZED)
        self.heartbeat()

    def new_controller(self, owner: str) -> RampController:
        return RampController(self.states, self.ramps, self.metrics, clock=self.clock,
                              owner=owner, interval_s=5.0, lease_ttl_s=15.0)

    def heartbeat(self) -> None:
        baseline, optimized = self.versions
        self.states.report_deployment(DeploymentReport(
            gateway="gw-1", baseline_version=baseline, optimized_version=optimized,
            ts=self.clock.time()))

    def verdict(self, passed: bool = True) -> None:
        self.states.put_verdict(Verdict(
            baseline_version=BASELINE, optimized_version=OPTIMIZED, passed=passed,
            failures=() if passed else ("agreement 0.9 < 0.995",), n=2600,
            agreement=0.999 if passed else 0.9, agreement_lower_bound=0.998 if passed else 0.89))

    def start(self, *, force: bool = False, plan=None):
        return self.control.start(plan or self.plan, actor="alice", reason="ramp v2",
                                  force=force)

    def healthy(self, requests: int = 100) -> None:
        self.metrics.canary = stats("optimized", requests)

    def tick(self, seconds: float = 5.0, controller: RampController | None = None):
        self.clock.advance(seconds)
        self.heartbeat()
        return (controller or self.controller).tick()

    def run_until(self, kind: str, limit: int = 100):
        return self.run_until_with(self.controller, kind, limit)

    def run_until_with(self, controller: RampController, kind: str, limit: int = 100):
        for _ in range(limit):
            decision = self.tick(controller=controller)
            if decision is not None and decision.kind == kind:
                return decision
        raise AssertionError(f"no {kind} decision in {limit} ticks")

    @property
    def share(self) -> int:
        return self.states.get().canary_bp

    @property
    def ramp(self):
        return self.ramps.get()

    def controller_changes(self) -> list[str]:
        return [e.action for e in self.states.audit() if e.actor == CONTROLLER
                and e.action.startswith("canary")]


class ShadowFedMetrics(ScriptedMetrics):
    """Scripted arms; the shadow gates read shadow counters filed as the gateways file them."""

    def __init__(self, clock):
        super().__init__()
        self.hashes = MemoryHashes()
        self.shadow = WindowsMetrics(Windows(self.hashes, "app", clock=clock))

    def file(self, ts: float, outcomes: list[PairOutcome]) -> None:
        self.hashes.increment(merge_shadow([ShadowItem(ts, shadow_fields(outcomes))], "app"))

    def agreement(self, last_s):
        return self.shadow.agreement(last_s)

    def confident(self, last_s, min_margin=0.05):
        return self.shadow.confident(last_s, min_margin)

    def slices(self, last_s):
        return self.shadow.slices(last_s)

    def recall(self, last_s):
        return self.shadow.recall(last_s)

    def tokens(self, last_s):
        return self.shadow.tokens(last_s)


def shadow_fed_harness(gates: dict) -> tuple[Harness, ShadowFedMetrics]:
    """A ramp on PLAN's steps with these gates, its shadow gates fed as gateways file them,
    already past its first step and healthy (rolls back on the first failing evaluation)."""
    h = Harness(dict(PLAN, failures_tolerated=0, gates=gates))
    h.metrics = metrics = ShadowFedMetrics(h.clock)
    h.controller = h.new_controller("c1")
    h.verdict()
    h.start()
    assert h.tick().kind == "advance"
    h.healthy()
    return h, metrics
