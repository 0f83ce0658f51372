"""A ramp judged by the tokens of a causal LM's answers, end to end: a generative application
beside the session's (the small LM as baseline, its own `ramp-controller`), real Redis, real
HTTP traffic, the shadow scoring every answer. With the plan's gates `max_kld` and
`min_token_agreement`, the int8 recipe climbs to 100 %; a copy of the model whose weights were
rounded to 4 bits per tensor is rolled back at its first step, and no request is lost."""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ops.bench.generate_recipes import damaged_4bit
from rollout.ramp import CONTROLLER, parse_plan
from tests.verdicts import passing_verdict

GATES = {"min_samples": 3, "min_agreement_pairs": 30, "max_kld": 0.02,
         "min_token_agreement": 0.8, "error_rate_delta": 0.05}
PROMPTS = ["The hospital reviewed the", "Local news: the", "Why the mental health",
           "The treaty announced the", "Experts say the compiler", "Merger and revenue:"]


@dataclass
class Traffic:
    """A bounded client loop: one completion at a time, a new `user` (routing key) each,
    every answer kept as (status, answering arm)."""

    app: object
    model: str
    limit_s: float = 150.0
    answers: list = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self):
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _run(self):
        deadline, i = time.monotonic() + self.limit_s, 0
        while not self.stop.is_set() and time.monotonic() < deadline:
            i += 1
            try:
                response = self.app.client.post("/v1/completions", json={
                    "model": self.model, "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 16,
                    "temperature": 0, "user": uuid.uuid4().hex})
                self.answers.append((response.status_code, response.headers.get("x-canary-arm")))
            except Exception as exc:  # a lost request: kept, and the test fails on it
                self.answers.append((None, repr(exc)))

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=60)


@pytest.fixture(scope="module")
def damaged(small_lm, tmp_path_factory):
    folder = tmp_path_factory.mktemp("damaged-lm")
    model = AutoModelForCausalLM.from_pretrained(small_lm, dtype=torch.float32)
    damaged_4bit(model).save_pretrained(folder)
    AutoTokenizer.from_pretrained(small_lm).save_pretrained(folder)
    return folder


def ramp_of(gateway, small_lm, name: str, **update):
    """A generative app beside the session's, a passing verdict for its versions, and its
    ramp control (closed and the app stopped by `close`); `name` its own (the versions a
    gateway reports outlive it in Redis)."""
    from tests.serve_app import start_beside

    app = start_beside(gateway, name, model_path=str(small_lm), shadow_share=1.0,
                       shadow_timeout_s=10.0, stream_timeout_s=30.0, max_batch_size=8,
                       **update)
    control = app.ramp_control()
    live = wait_for(control.rollout.live_versions, 30, "the gateway's versions")
    baseline, optimized = next(iter(live))
    control.states.put_verdict(passing_verdict(baseline, optimized, task="generate"))
    return app, control


def close(app, control) -> None:
    from tests.serve_app import stop_beside

    ramp = control.ramps.get()
    if ramp is not None and ramp.active:
        control.abort(actor="test", reason="test cleanup")
    control.states.close()
    control.ramps.close()
    stop_beside(app)


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def run_ramp(app, control, steps: list[dict], timeout: float, **gates):
    plan = parse_plan({"window_s": 5, "gates": {**GATES, **gates}, "steps": steps})
    name = app.client.get("/v1/models").json()["data"][0]["id"]
    with Traffic(app, name) as traffic:
        control.start(plan, actor="test", reason="ramp judged by tokens")
        ramp = wait_for(lambda: (r := control.ramps.get()).status != "running" and r, timeout,
                        "the ramp to end")
    entries = [e for e in control.states.audit() if e.actor == CONTROLLER]
    return ramp, entries, traffic.answers


def test_a_faithful_recipe_climbs_on_its_tokens(gateway, small_lm):
    app, control = ramp_of(gateway, small_lm, "lmramp1",
                           optimized_recipe="int8-dynamic-per-channel")
    try:
        ramp, entries, answers = run_ramp(app, control, [
            {"percent": 20, "min_duration_s": 1, "min_samples": 3},
            {"percent": 100, "min_duration_s": 1, "min_samples": 3}], 120)
    finally:
        close(app, control)
    assert ramp.status == "promoted", ramp.reason
    last = {g["name"]: g for g in entries[-1].detail["gates"]}
    assert last["max_kld"]["status"] == last["min_token_agreement"]["status"] == "pass"
    assert last["max_kld"]["value"] <= 0.02
    assert answers and {status for status, _ in answers} == {200}
    assert "optimized" in {arm for _, arm in answers}
    print(f"\nint8 promoted 20 -> 100 % on its tokens: {len(answers)} answers, "
          f"max_kld {last['max_kld']['note']}; min_token_agreement "
          f"{last['min_token_agreement']['note']}")


def test_a_damaged_model_is_rolled_back_on_its_tokens(gateway, small_lm, damaged):
    app, control = ramp_of(gateway, small_lm, "lmramp2", optimized_model_path=str(damaged),
                           optimized_recipe="fp32")
    try:
        ramp, entries, answers = run_ramp(app, control, [
            {"percent": 20, "min_duration_s": 600, "min_samples": 3}, {"percent": 100}], 120,
            max_kld=0.01)
        state = control.states.get()
    finally:
        close(app, control)
    assert ramp.status == "aborted" and ramp.reason.startswith("rollback: ")
    assert "max_kld" in ramp.reason, ramp.reason
    assert state.canary_bp == 0 and state.updated_by == CONTROLLER
    assert answers and {status for status, _ in answers} == {200}  # none lost, none failed
    failing = next(e for e in entries if any(g["status"] == "fail"
                                             for g in (e.detail or {}).get("gates", [])))
    gates = {g["name"]: g for g in failing.detail["gates"]}
    print(f"\ndamaged copy rolled back: {len(answers)} answers; max_kld "
          f"{gates['max_kld']['note']}")
