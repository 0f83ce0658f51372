"""The quick start as a user runs it: `serve run serve.config:app` on the default model, with a
real Redis server, driven over HTTP and by the `rollout` CLI."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from serve import ray_env
from serve.recipes.auto.choose import candidates, detect_hardware
from tests.servers import RedisServer

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
URL = "http://127.0.0.1:8000"
# `auto` measures its candidates on the first start on a machine (serve.recipes.auto.choose):
# minutes once
FIRST_START_S = 600
STOP_S = 20  # Ctrl-C to exit, at most (it takes ~10 s on 2 cores)


def _rss_mib(session_leader: int) -> float:
    """Resident memory of every process in the gateway's session (Ray included), in MiB."""
    total = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if os.getsid(int(proc.name)) != session_leader:
                continue
            for line in (proc / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except (OSError, ProcessLookupError):
            continue
    return total / 1024


def _hears_ctrl_c() -> None:
    """In the child before exec: SIGINT as in a terminal. A test run started in the background
    (`ops/test.sh &`, a CI runner) inherits SIGINT ignored, and `serve run` would then never
    hear the Ctrl-C the teardown sends."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with httpx.Client() as probe:
        try:
            probe.get(URL + "/healthz", timeout=0.5)
            pytest.fail("something already listens on 127.0.0.1:8000; stop it first")
        except httpx.TransportError:
            pass
    redis = RedisServer().start()
    cache = tmp_path_factory.mktemp("cache")  # a new user's: `auto` measures, artifacts are built
    env = dict(os.environ, REDIS_URL=redis.url, PATH=f"{BIN}:{os.environ['PATH']}",
               PYTHONFAULTHANDLER="1",
               CANARY_AUTO_CHOICE_DIR=str(cache / "auto"), CANARY_ONNX_DIR=str(cache / "onnx"))
    ray_env.apply(env, throwaway=True)  # what ops/run.sh exports before `serve run`
    log = (tmp_path_factory.mktemp("serve") / "serve.log").open("w")
    started = time.monotonic()
    proc = subprocess.Popen(
        [str(BIN / "serve"), "run", "serve.config:app"], cwd=ROOT, env=env,
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        preexec_fn=_hears_ctrl_c,
    )
    client = httpx.Client(base_url=URL, timeout=30)
    try:
        deadline = started + FIRST_START_S
        while True:
            assert proc.poll() is None, f"serve run exited early, see {log.name}"
            try:
                response = client.post("/v1/predict", json={"inputs": ["hello"]})
                if response.status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"no 200 within {FIRST_START_S} s, see {log.name}"
            time.sleep(0.25)
        first_200 = time.monotonic() - started
        print(f"\n[e2e] serve run to first 200: {first_200:.1f} s; "
              f"memory of the running app: {_rss_mib(proc.pid):.0f} MiB RSS")
        yield client, env
    finally:
        client.close()
        stopping = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C sends
        try:
            proc.wait(STOP_S)
            print(f"\n[e2e] Ctrl-C to exit: {time.monotonic() - stopping:.1f} s")
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGABRT)  # PYTHONFAULTHANDLER: where it hangs, in the log
            time.sleep(1)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
            print(f"\n[e2e] serve run still running {STOP_S} s after Ctrl-C, killed; "
                  f"its stacks are in {log.name}")
        finally:
            ray_env.reap_orphaned_haproxies()
        log.close()
        redis.cleanup()


def _rollout(env, *args) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [str(BIN / "rollout"), *args], env=env, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    return result


def _arm_within(client, arm: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while client.post("/v1/predict", json={"inputs": ["probe"]}).json()["arm"] != arm:
        assert time.monotonic() < deadline, f"traffic never moved to {arm}"


def test_quick_start_serves_the_default_model(served):
    client, env = served
    inputs = ["The new GPU doubles inference speed", "The match was a draw"]
    response = client.post("/v1/predict", json={"inputs": inputs})
    assert response.status_code == 200
    body = response.json()
    assert body["arm"] == "baseline" and body["model_version"].startswith("fp32-")
    assert [out["label"] for out in body["outputs"]] == ["technology", "sports"]
    embed = client.post("/v1/predict", json={"inputs": ["x"], "task": "embed"}).json()
    assert len(embed["outputs"][0]["embedding"]) == 384
    deadline = time.monotonic() + 30  # the gateway reports what it serves (heartbeat)
    while not (status := json.loads(_rollout(env, "status", "--json").stdout))["gateways"]:
        assert time.monotonic() < deadline, "the gateway never reported its versions"
        time.sleep(0.5)
    [report] = status["gateways"]
    assert report["baseline_version"] == body["model_version"]
    recipe = report["optimized_recipe"]  # what `auto` measured best here, or its fallback
    assert recipe in candidates(detect_hardware("cpu")) or recipe == "onnx-fp32"
    assert report["optimized_version"].startswith(recipe + "-")
    assert report["auto"].startswith(f"auto → {recipe} (")
    shown = _rollout(env, "status").stdout
    assert report["auto"] in shown  # `rollout status` says how the recipe was chosen


def test_cli_moves_traffic_and_kill_switch_pulls_it_back(served):
    client, env = served
    _rollout(env, "canary", "100", "--yes", "--reason", "e2e: everything to the canary")
    bound = json.loads(_rollout(env, "status", "--json").stdout)
    [report] = bound["gateways"]
    recipe = report["optimized_recipe"]
    assert bound["optimized_version"].startswith(recipe + "-")  # the share is bound to it
    _arm_within(client, "optimized", 5)
    optimized = client.post("/v1/predict", json={"inputs": ["x"]}).json()
    assert optimized["model_version"] == report["optimized_version"]

    _rollout(env, "kill", "--reason", "e2e: pull it back")
    _arm_within(client, "baseline", 2)
    arms = {client.post("/v1/predict", json={"inputs": ["y"]}).json()["arm"] for _ in range(30)}
    assert arms == {"baseline"}

    _rollout(env, "unkill", "--yes", "--reason", "e2e: resume")
    _arm_within(client, "optimized", 5)
    audit = json.loads(_rollout(env, "audit", "--json").stdout)
    assert [entry["action"] for entry in audit][-3:] == ["canary 0% -> 100%", "kill", "unkill"]


def _tour_commands() -> list[str]:
    """The README's "Try it" block, one shell command per entry (continued lines joined)."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("<!-- tour:start -->", 1)[1].split("<!-- tour:end -->", 1)[0]
    lines = block.strip().splitlines()
    assert lines[0] == "```bash" and lines[-1] == "```", "the tour is one ```bash block"
    commands, pending = [], ""
    for line in lines[1:-1]:
        pending += line
        if pending.endswith("\\"):
            pending = pending[:-1]
        else:
            commands.append(pending)
            pending = ""
    return commands


def test_the_readme_tour_runs_as_written(served):
    """Every command of the README's five-minute tour answers 0, in order, on a fresh rollout."""
    client, env = served
    if not (ROOT / ".venv/bin/activate").exists() or shutil.which("curl") is None:
        pytest.skip("the tour needs ops/run.sh's .venv and curl")
    # a fresh start: the share at 0 %, and the gateway has reported what it serves
    _rollout(env, "canary", "0", "--yes", "--reason", "e2e: the tour starts fresh")
    deadline = time.monotonic() + 30
    while not json.loads(_rollout(env, "status", "--json").stdout)["gateways"]:
        assert time.monotonic() < deadline, "the gateway never reported its versions"
        time.sleep(0.5)
    shell_state = []  # `source`, `export` and `cd` lines carry over to later commands
    outputs = {}
    for command in _tour_commands():
        if command.split(maxsplit=1)[0] in ("source", "export", "cd"):
            shell_state.append(command)
        script = "\n".join(["set -eo pipefail", *shell_state, command])
        result = subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True,
                                text=True, timeout=60)
        assert result.returncode == 0, (f"README tour: `{command}` exited {result.returncode}:\n"
                                        f"{result.stdout}{result.stderr}")
        outputs[command.split("#")[0].strip()] = result.stdout
    [answer] = [out for command, out in outputs.items() if command.startswith("curl ")]
    assert json.loads(answer)["arm"] == "baseline"
    status = json.loads(_rollout(env, "status", "--json").stdout)
    assert status["canary_bp"] == 0 and not status["kill"]
    ramp = json.loads(_rollout(env, "ramp", "status", "--json").stdout)
    assert ramp["ramp"]["status"] == "aborted"
    audit = json.loads(_rollout(env, "audit", "--json").stdout)
    tour = [entry["action"] for entry in audit][-30:]  # with the controller's ramp evaluations
    expected = iter(["canary 0% -> 5%", "kill", "unkill", "canary 5% -> 0%", "ramp-start",
                     "ramp-abort"])
    step = next(expected)
    for action in tour:
        if action == step:
            step = next(expected, None)
    assert step is None, f"the tour's changes are not all in the audit, in order: {tour}"


RAMP_PLAN = """\
window_s: 5
gates:
  min_samples: 5
  error_rate_delta: 0.05
steps:
  - {percent: 5, min_duration_s: 2, min_samples: 5}
  - {percent: 25, min_duration_s: 2, min_samples: 5}
  - {percent: 100, min_duration_s: 2, min_samples: 5}
"""
RAMP_S = 180  # 5 -> 25 -> 100 %, each step a few seconds of traffic and an evaluation


def test_what_auto_serves_passes_verify_and_a_ramp_climbs_on_it(served, tmp_path):
    """`auto` judged its choice with verify's rule and a margin on the validation split; verify
    of the served pair on the held-out split passes with the default thresholds and stores its
    verdict, and a ramp (no --force) climbs to 100 % on it under steady traffic."""
    client, env = served
    verify = subprocess.run([str(BIN / "rollout"), "verify", "--quiet"], env=env,
                            capture_output=True, text=True, timeout=600)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "verdict: PASS" in verify.stdout and "verdict stored" in verify.stdout
    _rollout(env, "canary", "0", "--yes", "--reason", "e2e: a ramp starts below its first step")
    plan = tmp_path / "ramp.yaml"
    plan.write_text(RAMP_PLAN)
    _rollout(env, "ramp", "start", str(plan), "--reason", "e2e: climb on the verdict")
    deadline, sent = time.monotonic() + RAMP_S, 0
    while (ramp := json.loads(_rollout(env, "ramp", "status", "--json").stdout)["ramp"])[
            "status"] == "running":
        assert time.monotonic() < deadline, f"the ramp did not reach 100 % in {RAMP_S} s: {ramp}"
        for _ in range(20):  # steady traffic over many routing keys
            answer = client.post("/v1/predict", json={"inputs": ["steady traffic"]},
                                 headers={"X-Routing-Key": f"user-{sent}"})
            assert answer.status_code == 200
            sent += 1
    assert ramp["status"] == "promoted", ramp
    assert json.loads(_rollout(env, "status", "--json").stdout)["canary_bp"] == 10_000
