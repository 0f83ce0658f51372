"""The real gateway (the shared Ray Serve app of tests/integration/conftest.py) through a Redis
failover: the app redeployed with a `redis+sentinel://` URL, traffic at a 50 % share, the
primary SIGKILLed, and `rollout kill` issued at once. Every request is answered (the gateway
routes on its cached state while Redis is away: the documented fail-safe), none hangs, and the
kill reaches the gateway once Sentinel has promoted a replica; after that, only baseline
answers. The app is redeployed back onto its own Redis afterwards. ~40 s, most of it the two
redeploys."""

from __future__ import annotations

import subprocess
import threading
import time
from dataclasses import dataclass, field

import httpx
import pytest

from rollout import Rollout
from rollout.redis_conn import Acknowledgement
from rollout.redis_store import RedisStateStore
from tests.integration.test_cli_redis import ROLLOUT
from tests.integration.test_sentinel import SentinelGroup, env_for


@dataclass
class Answered:
    """One request sent during the failover: when it started and what came back."""

    started: float
    status: int | str  # the HTTP status, or the transport error's name
    arm: str | None = None
    seconds: float = 0.0


@dataclass
class Traffic:
    answers: list[Answered] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self, url: str) -> None:
        with httpx.Client(base_url=url, timeout=10.0) as client:
            i = 0
            while not self.stop.is_set():
                i += 1
                started = time.monotonic()
                try:
                    response = client.post("/v1/predict", json={"inputs": ["failover"]},
                                           headers={"X-Routing-Key": f"user-{i % 64}"})
                    arm = response.json().get("arm") if response.status_code == 200 else None
                    self.answers.append(Answered(started, response.status_code, arm,
                                                 time.monotonic() - started))
                except httpx.HTTPError as exc:
                    self.answers.append(Answered(started, type(exc).__name__, None,
                                                 time.monotonic() - started))


@pytest.fixture(scope="module")
def through_failover(gateway):
    group = SentinelGroup().start()
    url = group.url()
    app = gateway.settings.app_name
    traffic = Traffic()
    sender = threading.Thread(target=traffic.run, args=(gateway.url,))
    try:
        gateway.redeploy({}, redis_url=url, control_redis_url=url)
        states = RedisStateStore(url, app, timeout_s=1.0, ack=Acknowledgement(1, 1000))
        _, share = Rollout(states).set_canary(5000, actor="test", reason="half for the failover")
        states.close()
        gateway.wait_for_revision(share.revision, timeout=20)
        sender.start()
        time.sleep(1.0)  # traffic on both arms before the primary goes
        old = group.node(group.primary_port())
        old.kill()
        killed_at = time.monotonic()
        kill = subprocess.run([ROLLOUT, "--app", app, "kill", "--reason", "primary lost"],
                              env=env_for(url), stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=90)
        kill_done = time.monotonic() - killed_at
        seen = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            served = gateway.served_state()
            if served["state"]["kill"] and not served["stale"]:
                seen = time.monotonic()
                break
            time.sleep(0.05)
        time.sleep(1.5)  # traffic after the kill
    finally:
        traffic.stop.set()
        if sender.is_alive():
            sender.join(30)
        gateway.redeploy({})  # back onto the app's own Redis, for the tests that follow
        group.cleanup()
    answers = traffic.answers
    lag = None if seen is None else seen - killed_at
    print(f"\ngateway through a failover: {len(answers)} requests, "
          f"{sum(a.status == 200 for a in answers)} x 200, slowest "
          f"{max(a.seconds for a in answers):.2f} s; `rollout kill` exit {kill.returncode} "
          f"{kill_done:.2f} s after the primary died; the gateway served "
          f"the kill {lag if lag is None else round(lag, 2)} s after it died")
    return kill, killed_at, seen, answers


def test_every_request_is_answered_through_the_failover(through_failover):
    _, killed_at, _, answers = through_failover
    during = [a for a in answers if a.started >= killed_at]
    assert len(during) > 20, "too little traffic during the failover to judge"
    failed = [a for a in answers if a.status != 200]
    assert not failed, failed[:5]
    assert {a.arm for a in answers if a.started < killed_at} == {"baseline", "optimized"}


def test_the_kill_lands_and_reaches_the_gateway_after_the_promotion(through_failover):
    kill, _, seen, answers = through_failover
    assert kill.returncode == 0, kill.stderr
    assert kill.stdout.startswith("kill switch off -> on"), kill.stdout
    assert seen is not None, "the gateway never served the kill"
    after = [a for a in answers if a.started > seen]
    assert after, "no request after the kill reached the gateway"
    assert {a.arm for a in after} == {"baseline"}
