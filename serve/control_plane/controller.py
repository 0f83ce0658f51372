"""The ramp controller as a Ray Serve deployment: it lives in the application, so a ramp goes
on after the operator's CLI has exited.

One replica runs `rollout.ramp.RampController` in a thread, every `ramp_interval_s`. It opens
its stores with `settings.control_settings()` (`CANARY_CONTROL_REDIS_URL`: the `controller`
Redis user, which may change the rollout state; the gateway's user may not). Exactly one
controller per application is active whatever the replica count: a Redis lease decides, and a
replica that dies loses it after `ramp_lease_ttl_s`. Serve's health check restarts a replica
whose loop has stopped. The plans' HTTP checks are fetched by
serve.control_plane.checks.HttpChecker. With `CANARY_WEBHOOK_URLS` set, the replica holding the
lease also tails the audit stream into webhooks (serve.control_plane.notify), in a thread of its
own.
"""

from __future__ import annotations

import os
import socket
import threading
import uuid

from ray import serve

from rollout import Settings, Windows, open_store, open_telemetry
from rollout.ramp import CONTROLLER, RampController, WindowsMetrics, open_ramp_store
from rollout.verdict import VerdictRules, thresholds_from
from serve.common.regression import load_set
from serve.control_plane.checks import HttpChecker
from serve.control_plane.notify import start_notifications


@serve.deployment(name="ramp-controller", num_replicas=1, max_ongoing_requests=8)
class RampControllerDeployment:
    def __init__(self, settings: Settings):
        """The replica's composition root: `settings` holds every group (rollout.settings),
        and each component is handed the groups its signature names."""
        control = settings.control_settings()
        self.states = open_store(control)
        self.ramps = open_ramp_store(control)
        self.telemetry = open_telemetry(control, settings)
        windows = Windows(self.telemetry, settings.app_name)
        metrics = WindowsMetrics(windows, settings.telemetry_window_ttl_s)  # the shadow horizon
        owner = f"{CONTROLLER}@{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.controller = RampController(
            self.states, self.ramps, metrics, owner=owner,
            interval_s=settings.ramp_interval_s, lease_ttl_s=settings.ramp_lease_ttl_s,
            audit_heartbeat_s=settings.ramp_audit_heartbeat_s, checker=HttpChecker(),
            verdict_rules=VerdictRules(thresholds=thresholds_from(settings),
                                       set_digest=load_set(settings.regression_set).digest),
        )
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.controller.run, args=(self.stop,),
                                       name="ramp-controller", daemon=True)
        self.thread.start()
        self.notifications = start_notifications(  # serve.control_plane.notify: audit -> webhooks
            control, settings, self.states, leader=lambda: self.ramps.holder() == owner,
            stop=self.stop)

    def check_health(self) -> None:
        if not self.thread.is_alive():
            raise RuntimeError("the ramp controller loop has stopped")
        if self.notifications is not None and not self.notifications.thread.is_alive():
            raise RuntimeError("the notifications loop has stopped")

    def info(self) -> dict:
        """Who this replica is, who holds the lease, and how many evaluations it ran."""
        return {"owner": self.controller.owner, "holder": self.ramps.holder(),
                "ticks": self.controller.ticks}

    def __del__(self):
        stop = getattr(self, "stop", None)
        if stop is None:
            return
        stop.set()
        self.thread.join(timeout=5)  # the loop releases the lease on its way out
        if getattr(self, "notifications", None) is not None:
            self.notifications.close()
        for store in (self.states, self.ramps, self.telemetry):
            store.close()
