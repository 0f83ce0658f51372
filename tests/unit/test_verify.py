"""`rollout verify` end to end on the tiny encoder and a slice of the shipped set (no Redis)."""

import io
import json
import subprocess
import sys

import pytest

from ops import cli
from rollout import FakeClock, MemoryStateStore, StoreUnavailable
from serve.regression import load_set
from tests.tiny_model import make_tiny_encoder

FAST = {  # a small, quick verify: few inputs timed, two batch sizes
    "CANARY_VERIFY_BATCH_SIZES": "1,4", "CANARY_VERIFY_SPEED_BATCH": "4",
    "CANARY_VERIFY_SPEED_INPUTS": "8", "CANARY_TORCH_THREADS": "1",
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_encoder(tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def env(monkeypatch, tiny, tmp_path):
    for name in list(__import__("os").environ):
        if name.startswith("CANARY_"):
            monkeypatch.delenv(name)
    for name, value in FAST.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("CANARY_MODEL_PATH", str(tiny))
    monkeypatch.setenv("CANARY_PLAN_DIR", str(tmp_path / "plans"))
    return monkeypatch


def verify(*argv, store=None):
    store = store if store is not None else MemoryStateStore()
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(["--actor", "alice", "verify", *argv], store=store,
                    clock=FakeClock(1_700_000_000.0), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue(), store


def test_json_report_and_stored_verdict(env):
    env.setenv("CANARY_VERIFY_MIN_SPEEDUP", "0")
    env.setenv("CANARY_VERIFY_MIN_AGREEMENT", "0")
    env.setenv("CANARY_VERIFY_MIN_LOWER_BOUND", "0")
    code, out, err, store = verify("--recipe", "bf16", "--limit", "40", "--json")

    assert code == 0, err
    doc = json.loads(out)
    for key in ("agreement", "agreement_lower_bound", "speedup", "baseline_version",
                "optimized_version"):
        assert key in doc
    assert doc["n"] == 40 and doc["recipe"] == "bf16"
    assert doc["baseline_version"].startswith("fp32-")
    assert doc["optimized_version"].startswith("bf16-")
    assert 0 <= doc["agreement_lower_bound"] <= doc["agreement"] <= 1
    assert len(doc["flips"]) == round(40 * (1 - doc["agreement"]))
    assert [r["batch"] for r in doc["throughput"]] == [1, 4]
    assert doc["speedup"] == doc["throughput"][1]["speedup"] > 0  # served (length-sorted)
    assert doc["speedup_set_order"] == doc["throughput"][1]["speedup_set_order"] > 0
    for row in doc["throughput"]:
        assert row["speedup"] == row["optimized"] / row["baseline"]
        assert row["speedup_set_order"] == (row["optimized_set_order"]
                                             / row["baseline_set_order"])
    assert doc["min_margin"] == doc["thresholds"]["min_margin"] == 0.05
    assert doc["confident_flips"] == [f for f in doc["flips"] if f["baseline_margin"] >= 0.05]
    assert doc["accuracy_drop"] == pytest.approx(
        doc["accuracy"]["baseline"] - doc["accuracy"]["optimized"])
    assert sum(b["n"] for b in doc["buckets"]) == 40
    assert doc["cosine"]["min"] <= doc["cosine"]["p1"] <= doc["cosine"]["mean"] <= 1.0001
    labelled = sum(e.label is not None for e in load_set().examples[:40])
    assert doc["accuracy"]["n"] == labelled > 0
    assert doc["memory"]["baseline"]["weights_mib"] > doc["memory"]["optimized"]["weights_mib"]
    assert doc["passed"] is True and doc["stored"] is True
    verdict = store.get_verdict(doc["baseline_version"], doc["optimized_version"])
    assert verdict.passed and verdict.agreement == doc["agreement"] and verdict.n == 40
    assert verdict.by == "alice" and verdict.at == 1_700_000_000.0 and verdict.recipe == "bf16"
    assert verdict.confident_flips == len(doc["confident_flips"])
    assert verdict.accuracy_drop == doc["accuracy_drop"]


def test_missed_thresholds_exit_1_with_the_reasons_in_the_table(env):
    env.setenv("CANARY_VERIFY_MIN_SPEEDUP", "1000")
    code, out, err, store = verify("--recipe", "int8-dynamic", "--limit", "24", "--quiet")

    assert code == 1
    assert "top-1 agreement" in out and "by baseline margin:" in out and "throughput" in out
    assert "verdict: FAIL" in out and "speedup" in out.split("verdict: FAIL")[1]
    assert err == ""  # --quiet: no progress bar
    [verdict] = store._verdicts.values()
    assert verdict.passed is False and any("speedup" in f for f in verdict.failures)


def test_no_speed_and_no_store(env):
    env.setenv("CANARY_VERIFY_MIN_LOWER_BOUND", "0.5")  # 16 inputs prove no more than ~0.8
    code, out, err, store = verify("--recipe", "fp32", "--limit", "16", "--no-speed",
                                   "--no-store", "--json", "--quiet",
                                   "--sorted")  # accepted for old scripts, does nothing
    doc = json.loads(out)
    assert code == 0, err  # fp32 against itself agrees everywhere; speed is not judged
    assert doc["agreement"] == 1.0 and doc["flips"] == [] and doc["speedup"] is None
    assert doc["throughput"] == [] and doc["stored"] is False and doc["confident_flips"] == []
    assert store._verdicts == {}


def test_a_store_outage_still_prints_the_report_then_fails(env):
    class Down(MemoryStateStore):
        def put_verdict(self, verdict):
            raise StoreUnavailable("cannot reach Redis at redis://db:6379/0")

    code, out, err, _ = verify("--recipe", "fp32", "--limit", "8", "--no-speed", "--quiet",
                               store=Down())
    assert code == 1
    assert "top-1 agreement" in out
    assert err.strip().startswith("rollout: error: the verdict was not stored")
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(("argv", "message"), [
    (("--set", "/nonexistent.jsonl"), "cannot read regression set"),
    (("--recipe", "int4"), "CANARY_OPTIMIZED_RECIPE"),
    (("--limit", "0"), "whole number"),
])
def test_bad_input_is_one_line_and_exit_2(env, argv, message):
    code, out, err, _ = verify(*argv, "--quiet")
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1


def test_other_commands_do_not_import_torch():
    code = ("import sys, ops.cli; ops.cli.build_parser(); "
            "sys.exit(1 if 'torch' in sys.modules or 'transformers' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_set_changes_what_is_judged_not_what_is_calibrated(env, tmp_path):
    """`--set` is the set both arms are judged on; a calibrated recipe (ov-int8, onnx-int8,
    accuracy-aware, auto) still calibrates on CANARY_REGRESSION_SET, as the gateway does, so the
    variant judged is the one served (it used to be calibrated on the judged set itself)."""
    from serve.regression import RegressionSetError

    path = tmp_path / "held-out.jsonl"
    path.write_text("".join(json.dumps({"text": f"held-out input {i}"}) + "\n" for i in range(6)))
    seen = {}

    def run(settings, *, set_path=None, **_kw):
        seen.update(regression_set=settings.regression_set, set_path=set_path)
        raise RegressionSetError("stopped by the test")

    env.setattr("ops.verify.run", run)
    code, _, err, _ = verify("--set", str(path), "--recipe", "ov-int8", "--quiet")
    assert code == 2 and "stopped by the test" in err
    assert seen == {"regression_set": None, "set_path": str(path)}
    env.setenv("CANARY_REGRESSION_SET", str(path))  # the configured set is both, as before
    verify("--recipe", "ov-int8", "--quiet")
    assert seen == {"regression_set": str(path), "set_path": None}
