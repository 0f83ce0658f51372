"""Two arms with different weights on the real app (real Serve, real Redis with ACL users, real
HTTP): each arm answers with its own version, and the promotion order (operator guide, "Roll out
new weights") keeps a known-good baseline behind the kill switch at every step; a candidate
deployed while the share is still bound to the promoted version gets no traffic.

Runs on the shared app (tests/integration/conftest.py `gw`), redeployed with per-arm folders,
and puts it back afterwards."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from rollout.redis_layout import Keys
from tests.tiny_model import make_tiny_encoder
from tests.variant_settings import versions_of


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("arms")
    return {"v2": make_tiny_encoder(tmp / "v2", seed=1),
            "v3": make_tiny_encoder(tmp / "v3", seed=2)}


def fresh_reports(gw, pair: tuple[str, str], timeout: float = 30.0) -> None:
    """Forget the reports of replaced gateway replicas (they count as live for 60 s, and the
    share cannot be set while two pairs are live), then wait until the new replica reports
    `pair` (bounded)."""
    client = gw.redis.client()
    try:
        client.delete(Keys(gw.settings.app_name).deployed)
    finally:
        client.close()
    control = gw.rollout()
    deadline = time.monotonic() + timeout
    try:
        while control.live_versions() != {pair}:
            if time.monotonic() > deadline:
                raise AssertionError(f"gateways report {control.live_versions()}, not {pair}")
            time.sleep(0.1)
    finally:
        control.store.close()


@pytest.fixture
def arms(gw, folders):
    yield gw, folders
    gw.set_state(canary_bp=0)  # 0 % may be set while several versions are live
    gw.redeploy({})  # the shared app's models again (the tiny encoder on both arms)
    shared = versions_of(gw.settings)
    fresh_reports(gw, (shared["baseline"], shared["optimized"]))


def answer(gw) -> tuple[str, str]:
    response = gw.predict(["which model answers"], **{"X-Routing-Key": uuid.uuid4().hex})
    assert response.status_code == 200, response.text
    body = response.json()
    return body["arm"], body["model_version"]


class Traffic:
    """One request at a time in a thread while a redeploy runs; answers kept as
    (status or the exception, arm, model version)."""

    def __init__(self, gw):
        self.gw, self.answers, self.stop = gw, [], threading.Event()

    def __enter__(self):
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _run(self):
        deadline = time.monotonic() + 180
        while not self.stop.is_set() and time.monotonic() < deadline:
            try:
                response = self.gw.predict(["during the redeploy"],
                                           **{"X-Routing-Key": uuid.uuid4().hex})
                body = response.json() if response.status_code == 200 else {}
                self.answers.append((response.status_code, body.get("arm"),
                                     body.get("model_version")))
            except Exception as exc:
                self.answers.append((type(exc).__name__, None, None))
            time.sleep(0.02)

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=60)


def test_new_weights_are_promoted_to_baseline_with_a_known_good_fallback_throughout(arms):
    gw, folders = arms
    canary = {"optimized_model_path": str(folders["v2"])}  # v2 / bf16 against v1 / fp32
    gw.redeploy({}, **canary)
    v = versions_of(gw.settings.model_copy(update=canary))
    assert v["baseline"].startswith("fp32-") and v["optimized"].startswith("bf16-")
    assert gw.served_state()["serving"] == v
    fresh_reports(gw, (v["baseline"], v["optimized"]))
    gw.set_state(canary_bp=10_000)  # as `promote` leaves it: bound to v2 / bf16
    assert answer(gw) == ("optimized", v["optimized"])
    gw.set_state(canary_bp=10_000, kill=True)
    assert answer(gw) == ("baseline", v["baseline"])
    gw.set_state(canary_bp=10_000)

    # 1. baseline = the promoted model, optimized unchanged, with traffic throughout
    promoted = {**canary, "baseline_model_path": str(folders["v2"]), "baseline_recipe": "bf16"}
    with Traffic(gw) as traffic:
        gw.redeploy({}, **promoted)
    p = versions_of(gw.settings.model_copy(update=promoted))
    assert p == {"baseline": v["optimized"], "optimized": v["optimized"]}
    known_good = {("optimized", v["optimized"]), ("baseline", v["baseline"]),
                  ("baseline", p["baseline"])}
    answered = [(arm, version) for status, arm, version in traffic.answers if status == 200]
    assert answered and set(answered) <= known_good
    failed = [status for status, _, _ in traffic.answers if status != 200]
    print(f"\nstep 1 redeploy: {len(answered)} answered, {len(failed)} not: {failed[:5]}")
    fresh_reports(gw, (p["baseline"], p["optimized"]))
    assert answer(gw) == ("optimized", p["optimized"])  # the share stayed bound and served
    gw.set_state(canary_bp=10_000, kill=True)
    assert answer(gw) == ("baseline", p["baseline"])  # the kill switch falls back to v2 now
    state = gw.set_state(canary_bp=10_000)

    # 3. the next candidate (step 2, the reset to 0 %, skipped on purpose): the share was bound
    # to v2, so the newly deployed v3 gets nothing, and the baseline (v2) answers
    candidate = {**promoted, "optimized_model_path": str(folders["v3"])}
    gw.redeploy({}, **candidate)
    c = versions_of(gw.settings.model_copy(update=candidate))
    assert c["baseline"] == p["baseline"] and c["optimized"] not in (p["optimized"],
                                                                       v["baseline"])
    served = gw.wait_for_revision(state.revision)  # the new replica's state, not stale
    assert served["state"]["canary_bp"] == 10_000 and served["effective_percent"] == 0
    assert {answer(gw) for _ in range(5)} == {("baseline", p["baseline"])}
