"""What `rollout status --json` and the dashboard's `GET /v1/status` show, built in one place.

A status is the stored state, what every gateway reported it serves (with whether the report is
recent and whether it serves the optimized version the share is bound to), and, with a
telemetry source, each arm's window over the last `window_s` seconds (CPU seconds per 1,000
inputs included), the realized speedup of the optimized arm over that window
(`traffic.efficiency`, rollout.efficiency) and the online agreement of shadow comparisons (over
`agreement_s`). Reading telemetry never fails a status:
an unreachable telemetry store is reported as `traffic.error`.

`audited` says whether the stored state is the one the audited write of its revision recorded.
Every audited change stores its state in the history and appends its audit entry in one atomic
step, so a state that differs from its revision's history (or has none) was written some other
way: the emergency `redis-cli` kill (docs/operator-guide.md), or a hand edit. The status flags it
until the next audited change.
"""

from __future__ import annotations

from dataclasses import dataclass

from rollout.clock import Clock, SystemClock
from rollout.control import DEPLOYMENT_TTL_S
from rollout.efficiency import Speedup, speedup
from rollout.errors import RevisionNotFound, StoreUnavailable
from rollout.events import webhook_health
from rollout.redis_layout import Keys
from rollout.shadow import ShadowStats
from rollout.state import DeploymentReport, RolloutState
from rollout.store import StateStore
from rollout.telemetry.windows import ArmStats, HashSource, Windows


@dataclass(frozen=True)
class Status:
    state: RolloutState
    gateways: tuple[DeploymentReport, ...]
    now: float
    window_s: int
    traffic: dict[str, ArmStats] | None = None  # None: no telemetry source, or unreachable
    traffic_error: str | None = None
    shadow: ShadowStats | None = None  # online agreement of shadow comparisons
    telemetry: bool = False  # whether a telemetry source was read
    audited: bool = True  # the state is the one its revision's audit entry recorded
    webhooks: dict | None = None  # rollout.events.webhook_health; None: nothing ever sent

    @property
    def efficiency(self) -> Speedup | None:
        """The realized speedup over the window: baseline ÷ optimized CPU seconds per input,
        with its 95 % interval (rollout.efficiency); None without traffic figures."""
        arms = self.traffic
        if not arms or "baseline" not in arms or "optimized" not in arms:
            return None
        return speedup(arms["baseline"].cpu, arms["optimized"].cpu)

    def silent(self, report: DeploymentReport) -> bool:
        """A gateway whose last report is older than DEPLOYMENT_TTL_S."""
        return self.now - report.ts > DEPLOYMENT_TTL_S

    def mismatched(self, report: DeploymentReport) -> bool:
        """A gateway serving another optimized version than the share is bound to (it routes
        nothing to the canary)."""
        bound = self.state.optimized_version
        return bool(bound) and report.optimized_version != bound

    def as_json(self) -> dict:
        """The `rollout status --json` document."""
        state = self.state
        doc = state.model_dump(mode="json")
        gateways = []
        for report in self.gateways:
            row = report.model_dump(mode="json")
            row.update(age_s=round(self.now - report.ts, 3), silent=self.silent(report),
                       version_mismatch=self.mismatched(report))
            gateways.append(row)
        doc.update(canary_percent=state.canary_percent, effective_percent=state.effective_bp / 100,
                   gateways=gateways, audited=self.audited)
        if self.telemetry:
            doc["webhooks"] = self.webhooks
        if self.telemetry:
            arms = self.traffic
            doc["traffic"] = {
                "window_s": self.window_s, "error": self.traffic_error,
                "arms": {arm: s.as_dict() for arm, s in arms.items()} if arms else None,
                "shadow": self.shadow.as_dict() if self.shadow is not None else None,
                "efficiency": self.efficiency.as_dict() if self.efficiency else None,
            }
        return doc


def read_status(
    store: StateStore, telemetry: HashSource | None = None, *, app: str = "default",
    window_s: int = 60, agreement_s: int | None = None, clock: Clock | None = None,
) -> Status:
    """Read a status: the state store must answer (StoreUnavailable otherwise); telemetry may
    fail without failing the status. Agreement is over `agreement_s` (default: `window_s`)."""
    clock = clock or SystemClock()
    state, reports = store.get(), tuple(store.deployments())
    now, audited = clock.time(), _audited(store, state)
    if telemetry is None:
        return Status(state, reports, now, window_s, audited=audited)
    windows = Windows(telemetry, app, clock=clock)
    traffic = shadow = problem = None
    try:
        traffic = windows.arms(window_s)
        shadow = windows.shadow(agreement_s or window_s)
    except StoreUnavailable as exc:
        problem = str(exc)
    return Status(state, reports, now, window_s, traffic, problem, shadow, telemetry=True,
                  audited=audited, webhooks=_webhooks(telemetry, app, now))


def _webhooks(source: HashSource, app: str, now: float) -> dict | None:
    """The notification counters (serve.control_plane.webhooks); None when unreadable or never
    written."""
    try:
        counters = source.hashes([Keys(app).webhooks])[0]
    except StoreUnavailable:
        return None
    return webhook_health(counters, now)


def _audited(store: StateStore, state: RolloutState) -> bool:
    """Whether `state` is what the audited write of its revision stored (see the docstring)."""
    if not state.revision:
        return True
    try:
        return store.state_at(state.revision) == state
    except RevisionNotFound:
        return False
