"""The quick start as a user runs it: `serve run serve.config:app` on the default model, with a
real Redis server, driven over HTTP and by the `rollout` CLI."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from serve import local_start, ray_env
from serve.recipes.auto.choose import candidates, detect_hardware
from tests.e2e import gateway
from tests.e2e.gateway import BIN, ROOT, URL
from tests.servers import RedisServer


@dataclass
class Served:
    client: httpx.Client
    env: dict[str, str]
    proc: subprocess.Popen
    console: Path  # what `serve run` printed


@pytest.fixture(scope="module")
def served(tmp_path_factory, auto_cache):
    gateway.nothing_on_port_8000()
    redis = RedisServer().start()
    env = gateway.environment(redis.url, auto_cache)
    console = tmp_path_factory.mktemp("serve") / "serve.log"
    log = console.open("w")
    started = time.monotonic()
    proc = gateway.start(env, log)
    client = httpx.Client(base_url=URL, timeout=30)
    try:
        gateway.first_200(proc, client, log.name)
        print(f"\n[e2e] serve run to first 200: {time.monotonic() - started:.1f} s; "
              f"memory of the running app: {gateway.rss_mib(proc.pid):.0f} MiB RSS")
        yield Served(client, env, proc, console)
    finally:
        client.close()
        try:
            gateway.ctrl_c(proc, log.name)
        finally:
            ray_env.reap_orphaned_haproxies()
        log.close()
        redis.cleanup()


# a line a new user reads as an error: a Python warning, a deprecation, the noise of
# serve.common.quiet
NOISY = re.compile(r"\w*Warning: |deprecat|loss_type|Failed to load|Detected no triton",
                   re.IGNORECASE)


def test_the_first_starts_console_has_no_third_party_warnings(served):
    """The module's start is the first on the machine (`auto` measured every candidate)."""
    lines = served.console.read_text(errors="replace").splitlines()
    assert any("optimized model: auto" in line for line in lines)  # the project's own lines
    noisy = [line for line in lines if NOISY.search(line)]
    assert not noisy, "\n".join(noisy)


def _allowlist() -> list[tuple[str, str]]:
    """(process, port) rows of docs/cluster.md's list of what a default run binds beyond the
    loopback, each with its reason there."""
    doc = (ROOT / "docs" / "cluster.md").read_text()
    table = doc.split("<!-- beyond-loopback:start -->", 1)[1].split(
        "<!-- beyond-loopback:end -->", 1)[0]
    rows = [line for line in table.strip().splitlines()[2:] if line.startswith("|")]
    found = []
    for row in rows:
        process, port, reason = (cell.strip() for cell in row.strip("|").split("|"))
        assert reason, f"an entry without its reason: {row}"
        found.append((process.strip("`"), port))
    return found


def test_nothing_listens_beyond_the_loopback_but_the_documented_allowlist(served):
    allowed = _allowlist()
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ephemeral = range(low, high + 1)
    own = {8000: "HAProxy (HTTP)", 8001: "gRPC"}  # and the direct ingress, 30000 up: not ephemeral
    deadline = time.monotonic() + 15  # HAProxy reloads as backends change: a new process
    listening = gateway.listeners(served.proc.pid)
    while not own.keys() <= {port for *_, port in listening}:
        assert time.monotonic() < deadline, f"the gateway's doors are not all up: {listening}"
        time.sleep(0.5)
        listening = gateway.listeners(served.proc.pid)
    beyond = [(pid, command, host, port) for pid, command, host, port in listening
              if not local_start.is_loopback(host)]
    for pid, command, host, port in beyond:
        assert port not in own, f"{own[port]} on {host}:{port}, beyond the loopback"
        assert any(command.startswith(process) and (kind == "ephemeral" and port in ephemeral
                                                    or kind == str(port))
                   for process, kind in allowed), (
            f"{command} (pid {pid}) listens on {host}:{port}, not in docs/cluster.md's list")
    per_process = Counter(pid for pid, *_ in beyond)
    assert all(count == 1 for count in per_process.values()), beyond
    targets = served.client.get("/v1/metrics/targets").json()
    hosts = {target.split(":")[0] for group in targets for target in group["targets"]}
    assert hosts and all(map(local_start.is_loopback, hosts)), targets  # the metrics ports


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
    client, env = served.client, served.env
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
    client, env = served.client, served.env
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
    env = served.env
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
    client, env = served.client, served.env
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
