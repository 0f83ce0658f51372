"""`rollout ramp ...` against in-memory stores and a fake clock: no Redis, no Ray."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from ops import cli
from rollout import FakeClock, StoreUnavailable
from rollout.ramp import MemoryRampStore
from tests.ramp_harness import Harness, stats

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "ops" / "plans" / "example-ramp.yaml")

SHORT = """
gates: {min_samples: 10, error_rate_delta: 0.01, p99_ms: 500}
steps:
  - {percent: 10, min_duration_s: 10, min_samples: 20}
  - {percent: 50, approval: true}
  - {percent: 100}
"""


class RampCli:
    def __init__(self, verdict: bool = True):
        self.h = Harness()
        if verdict:
            self.h.verdict()

    def __call__(self, *argv: str, actor: str | None = "alice", ramps=None):
        out, err = io.StringIO(), io.StringIO()
        args = (["--actor", actor] if actor else []) + list(argv)
        code = cli.main(args, store=self.h.states, clock=self.h.clock, stdout=out, stderr=err,
                        ramps=ramps or self.h.ramps)
        return code, out.getvalue(), err.getvalue()


@pytest.fixture
def run():
    return RampCli()


@pytest.fixture
def plan(tmp_path):
    path = tmp_path / "plan.yaml"
    path.write_text(SHORT)
    return str(path)


@pytest.fixture(autouse=True)
def not_a_terminal(monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(""))


def test_start_then_status_shows_step_time_and_every_gate(run, plan):
    code, out, err = run("ramp", "start", plan, "--reason", "ramp v2")
    assert code == 0 and err == "", err
    assert "ramp started: 10% -> 50% -> 100%, for optimized bf16-bbbb" in out
    h = run.h
    h.healthy(requests=12)
    h.tick()
    h.tick(seconds=3.0)
    code, out, _ = run("ramp", "status")
    assert code == 0
    assert "ramp             running" in out
    assert "step             1 of 3: 10%, for 3s (needs 10s and 20 samples)" in out
    assert "next             50% needs `rollout ramp approve`" in out
    assert "controller       c1" in out
    assert "hold: in step 3s of 10s; 12/20 canary samples" in out
    assert "gates over the last 4s (12 canary samples):" in out
    gate_lines = [line.split() for line in out.splitlines() if line.startswith("  ")]
    assert ["error_rate", "0", "0.01", "pass"] in gate_lines
    assert ["p99_ms", "40", "500", "pass"] in gate_lines


def test_status_lists_the_confident_flip_gate_with_its_counts(run, tmp_path):
    path = tmp_path / "plan.yaml"
    path.write_text("gates: {confident_flip_rate: 0.0, min_agreement_pairs: 100}\n"
                    "steps: [{percent: 10, min_duration_s: 60}, {percent: 100}]")
    run("ramp", "start", str(path), "--reason", "r")
    h = run.h
    h.healthy()
    h.metrics.confident_pairs = 40
    h.tick()
    h.tick()
    _, out, _ = run("ramp", "status")
    gate_lines = [line.split() for line in out.splitlines() if line.startswith("  ")]
    [line] = [line for line in gate_lines if line[0] == "confident_flip_rate"]
    assert line[:-1] == ["confident_flip_rate", "0", "0", "wait", "(40/100", "confident",
                         "shadow", "pairs", "at", "baseline", "margin", ">=", "0.05", "in",
                         "the", "step's"]
    h.metrics.confident_pairs = 300
    h.tick()
    _, out, _ = run("ramp", "status")
    gate_lines = [line.split() for line in out.splitlines() if line.startswith("  ")]
    [line] = [line for line in gate_lines if line[0] == "confident_flip_rate"]
    assert line[:-1] == ["confident_flip_rate", "0", "0", "pass", "(0", "of", "300", "flipped",
                         "at", "baseline", "margin", ">=", "0.05", "in", "the", "step's"]
    assert line[-1].endswith("s)")


def test_status_json(run, plan):
    run("ramp", "start", plan, "--reason", "ramp v2")
    run.h.tick()
    code, out, _ = run("ramp", "status", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["ramp"]["status"] == "running" and doc["ramp"]["step"] == 0
    assert doc["controller"] == "c1" and doc["last_evaluation"]["decision"] == "advance"
    assert doc["time_in_step_s"] == 0


def test_status_without_a_ramp(run):
    code, out, _ = run("ramp", "status")
    assert code == 0 and "none: no ramp has been started" in out
    code, out, _ = run("ramp", "status", "--json")
    assert code == 0 and json.loads(out) == {"ramp": None, "time_in_step_s": None,
                                             "controller": None, "last_evaluation": None,
                                             "held_since": None, "stalled": False}


def test_pause_resume_approve_abort_are_audited_with_actor_and_reason(run, plan):
    run("ramp", "start", plan, "--reason", "ramp v2")
    run.h.tick()
    for action in ("pause", "resume", "approve"):
        code, out, err = run("ramp", action, "--reason", f"{action} it", actor="bob")
        assert code == 0, err
    assert run.h.ramp.approved == (1,)
    code, out, _ = run("ramp", "abort", "--reason", "enough", actor="bob")
    assert code == 0 and "ramp aborted (step 1 of 3, share 0%) by bob: enough" in out
    entries = [(e.actor, e.action, e.reason) for e in run.h.states.audit() if e.actor == "bob"]
    assert entries == [("bob", "ramp-pause", "pause it"), ("bob", "ramp-resume", "resume it"),
                       ("bob", "ramp-approve", "approve it"), ("bob", "ramp-abort", "enough"),
                       ("bob", "canary 10% -> 0%", "ramp aborted: enough")]


def test_force_is_audited():
    run = RampCli(verdict=False)
    code, out, _ = run("ramp", "start", EXAMPLE, "--force", "--reason", "verdict later")
    assert code == 0 and "ramp started (forced): 1% -> 5% -> 25% -> 50% -> 100%" in out
    entry = run.h.states.audit()[-1]
    assert (entry.action, entry.reason, entry.detail["forced"]) == (
        "ramp-start --force", "verdict later", True)


def test_start_warns_while_the_kill_switch_is_on(run, plan):
    run.h.rollout.kill(actor="bob", reason="incident")
    code, _, err = run("ramp", "start", plan, "--reason", "r")
    assert code == 0 and "the kill switch is on: the ramp holds" in err


@pytest.mark.parametrize("argv, code, message", [
    (["ramp", "start", "PLAN", "--reason", "r"], 2, "steps.1.percent: shares must rise"),
    (["ramp", "start", "/nonexistent.yaml", "--reason", "r"], 2, "cannot read the ramp plan"),
    (["ramp", "start", "PLAN"], 2, "--reason"),
    (["ramp", "pause", "--reason", "  "], 2, "the reason must not be empty"),
    (["ramp", "resume", "--reason", "r"], 1, "no ramp has been started"),
    (["ramp"], 2, "ACTION"),
    (["ramp", "promote", "--reason", "r"], 2, "invalid choice"),
])
def test_bad_input_is_one_line_and_changes_nothing(run, tmp_path, argv, code, message):
    bad = tmp_path / "bad.yaml"
    bad.write_text("gates: {p99_ms: 5}\nsteps: [{percent: 50}, {percent: 10}, {percent: 100}]")
    argv = [str(bad) if a == "PLAN" else a for a in argv]
    result, _, err = run(*argv)
    assert result == code and message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert run.h.ramp is None and run.h.states.audit() == []


def test_a_second_start_is_refused(run, plan):
    run("ramp", "start", plan, "--reason", "one")
    code, _, err = run("ramp", "start", plan, "--reason", "two")
    assert code == 1 and "a ramp is already running" in err


def test_an_unreachable_ramp_store_is_exit_1(run, plan):
    class Down(MemoryRampStore):
        def get(self):
            raise StoreUnavailable("cannot reach Redis at redis://***@h:6379/0")

    code, _, err = run("ramp", "pause", "--reason", "r",
                       ramps=Down(run.h.states, FakeClock()))
    assert code == 1 and "cannot reach Redis" in err and "REDIS_URL" in err


@pytest.mark.parametrize("action", ["", "start", "status", "pause", "resume", "approve", "abort"])
def test_help_for_every_ramp_action(run, action):
    code, out, err = run("ramp", *([action] if action else []), "--help", actor=None)
    assert code == 0 and err == ""
    assert out.startswith(f"usage: rollout ramp {action}".rstrip())
    assert ("examples:" in out) == bool(action)  # each action shows examples


def test_gates_in_status_after_a_rollback(run, plan):
    run("ramp", "start", plan, "--reason", "r")
    h = run.h
    h.tick()
    h.metrics.canary = stats("optimized", 50, error_rate=0.5)
    assert h.tick().kind == "rollback"
    code, out, _ = run("ramp", "status")
    assert code == 0 and "ramp             aborted: rollback: error_rate 0.5 <= 0.01: fail" in out
