"""`rollout verify` end to end on the tiny encoder and a slice of the shipped set (no Redis)."""

import io
import json
import subprocess
import sys

import pytest
import torch

from ops import cli
from rollout import FakeClock, MemoryStateStore, StoreUnavailable
from serve.common.regression import load_set
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
    held = load_set().limited(40).held_out()  # judged: neither tuning nor `auto` saw them
    assert doc["n"] == len(held) and doc["split"] == "held-out" and doc["recipe"] == "bf16"
    assert doc["calibration"]["n"] == 10 and doc["calibration"]["judged"] is False
    assert len(held) == 15 and doc["folded"] == load_set().limited(40).folded("held-out")
    assert doc["baseline_version"].startswith("fp32-")
    assert doc["optimized_version"].startswith("bf16-")
    assert 0 <= doc["agreement_lower_bound"] <= doc["agreement"] <= 1
    assert len(doc["flips"]) == round(len(held) * (1 - doc["agreement"]))
    assert {f["index"] for f in doc["flips"]} <= set(held)
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
    assert sum(b["n"] for b in doc["buckets"]) == len(held)
    scripts = [row for row in doc["slices"] if row["slice"].startswith("script:")]
    assert sum(row["n"] for row in scripts) == len(held)  # each input in exactly one script slice
    assert {row["slice"].split(":")[0] for row in doc["slices"]} == {"script", "length", "label"}
    assert doc["cosine"]["min"] <= doc["cosine"]["p1"] <= doc["cosine"]["mean"] <= 1.0001
    labelled = sum(load_set().examples[i].label is not None for i in held)
    assert doc["accuracy"]["n"] == labelled > 0
    assert doc["memory"]["baseline"]["weights_mib"] > doc["memory"]["optimized"]["weights_mib"]
    assert doc["passed"] is True and doc["stored"] is True
    verdict = store.get_verdict(doc["baseline_version"], doc["optimized_version"])
    assert verdict.passed and verdict.agreement == doc["agreement"] and verdict.n == len(held)
    assert verdict.by == "alice" and verdict.at == 1_700_000_000.0 and verdict.recipe == "bf16"
    assert verdict.confident_flips == len(doc["confident_flips"])
    assert verdict.accuracy_drop == doc["accuracy_drop"]
    assert verdict.thresholds.model_dump() == doc["thresholds"]  # what it was judged with
    assert (verdict.split, verdict.speed_judged) == ("held-out", True)
    assert verdict.set_digest == f"{load_set().digest}:40"


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
                                   "--no-store", "--json", "--quiet")
    doc = json.loads(out)
    assert code == 0, err  # fp32 against itself agrees everywhere; speed is not judged
    assert doc["agreement"] == 1.0 and doc["flips"] == [] and doc["speedup"] is None
    assert doc["throughput"] == [] and doc["stored"] is False and doc["confident_flips"] == []
    assert store._verdicts == {}


def test_a_verdict_without_speed_records_it(env):
    env.setenv("CANARY_VERIFY_MIN_LOWER_BOUND", "0.5")
    code, _, err, store = verify("--recipe", "fp32", "--limit", "16", "--no-speed", "--quiet")
    assert code == 0, err
    [verdict] = store._verdicts.values()
    assert verdict.passed and verdict.speed_judged is False and verdict.speedup is None


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
    (("--limit", "0"), "must be at least 1"),
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
    from serve.common.regression import RegressionSetError

    path = tmp_path / "held-out.jsonl"
    path.write_text("".join(json.dumps({"text": f"held-out input {i}"}) + "\n" for i in range(6)))
    seen = {}

    def run(settings, *, set_path=None, **_kw):
        seen.update(regression_set=settings.regression_set, set_path=set_path)
        raise RegressionSetError("stopped by the test")

    env.setattr("ops.verify.runner.run", run)
    code, _, err, _ = verify("--set", str(path), "--recipe", "ov-int8", "--quiet")
    assert code == 2 and "stopped by the test" in err
    assert seen == {"regression_set": None, "set_path": str(path)}
    env.setenv("CANARY_REGRESSION_SET", str(path))  # the configured set is both, as before
    verify("--recipe", "ov-int8", "--quiet")
    assert seen == {"regression_set": str(path), "set_path": None}


def flip_inputs(env, flipped) -> None:
    """A fault-injected optimized arm: fp32, except that every input for which
    `flipped(text)` holds gets the opposite embedding (its top-1 label becomes another)."""
    from serve.recipes.variants import Variant

    rows = Variant.rows

    def faulty(self, texts, *args, **kwargs):
        out = rows(self, texts, *args, **kwargs)
        if self.arm == "optimized":
            flip = torch.tensor([flipped(text) for text in texts])
            out = torch.where(flip[:, None], -out, out)
        return out

    env.setattr(Variant, "rows", faulty)


def flip_one_script(env, script: str) -> None:
    """Every input of `script` flipped (rollout.slices.script_of)."""
    from rollout.slices import script_of

    flip_inputs(env, lambda text: script_of(text) == script)


def verify_latin_and_han(env, tmp_path, han: list[str], **thresholds):
    """verify --json of fp32 without speed on 1,500 Latin inputs and the `han` ones, with
    these CANARY_VERIFY_* thresholds: (exit code, document, stderr, store)."""
    path = tmp_path / "mixed.jsonl"
    rows = [f"The match report number {i} from the stadium" for i in range(1500)] + han
    path.write_text("".join(json.dumps({"text": row}) + "\n" for row in rows))
    for name, value in thresholds.items():
        env.setenv(f"CANARY_VERIFY_{name}", value)
    code, out, err, store = verify("--set", str(path), "--recipe", "fp32", "--no-speed",
                                   "--json", "--quiet")
    return code, json.loads(out), err, store


def test_a_variant_that_breaks_one_script_fails_on_its_slice_alone(env, tmp_path):
    """1,500 Latin inputs agree, all 30 Han inputs flip: 98.04 % overall passes the overall
    thresholds, the worst slice (script:han, 0 %) fails the verdict."""
    flip_one_script(env, "han")
    code, doc, err, store = verify_latin_and_han(
        env, tmp_path, [f"比赛报告第{i}号来自体育场" for i in range(30)],
        MAX_CONFIDENT_FLIPS="1000", MIN_LOWER_BOUND="0.97", MIN_COSINE_P1="-1")

    assert code == 1, err
    assert doc["split"] == "external" and doc["n"] == 1530
    assert doc["agreement"] == pytest.approx(1500 / 1530) and doc["agreement"] >= 0.98
    assert doc["slices"][0]["slice"] == "script:han" and doc["slices"][0]["agreement"] == 0.0
    assert doc["failures"] == [
        "slice script:han agreement 0.0000 (0/30, 95% upper bound 0.1135) < 0.95"]
    [verdict] = store._verdicts.values()
    assert (verdict.worst_slice, verdict.worst_slice_agreement) == ("script:han", 0.0)


def test_a_slice_under_the_minimum_size_is_shown_not_judged(env, tmp_path):
    path = tmp_path / "mixed.jsonl"
    rows = [{"text": f"The match report number {i}"} for i in range(60)]
    rows += [{"text": f"比赛报告第{i}号"} for i in range(5)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    env.setenv("CANARY_VERIFY_MIN_AGREEMENT", "0.9")
    env.setenv("CANARY_VERIFY_MIN_LOWER_BOUND", "0.8")
    env.setenv("CANARY_VERIFY_MAX_CONFIDENT_FLIPS", "1000")
    env.setenv("CANARY_VERIFY_MIN_COSINE_P1", "-1")
    env.setenv("CANARY_VERIFY_MIN_SLICE_AGREEMENT", "0.8")  # a label slice holds the 5 flips
    env.setenv("CANARY_VERIFY_MIN_RECALL_AT_10", "0")  # one of 13 queries is a flipped one
    flip_one_script(env, "han")
    code, out, err, _ = verify("--set", str(path), "--recipe", "fp32", "--no-speed", "--quiet")

    assert code == 0, err
    han = next(line for line in out.splitlines() if line.startswith("script:han"))
    assert han.split()[1:3] == ["5", "0.00%"] and han.split()[-1] == "no"


def test_the_configured_set_is_judged_on_its_held_out_split_only(env):
    """A candidate tuned to the calibration split (here: faithful exactly there, broken
    elsewhere) shows 100 % on the calibration split and is refused on the held-out split."""
    calibration = {load_set().texts[i] for i in load_set().calibration()}
    flip_inputs(env, lambda text: text not in calibration)  # faithful where it was tuned
    code, out, err, _ = verify("--recipe", "fp32", "--limit", "80", "--no-speed", "--json",
                               "--quiet")
    doc = json.loads(out)
    split = load_set().limited(80)
    assert code == 1, err
    assert doc["calibration"]["agreement"] == 1.0
    assert doc["calibration"]["n"] == len(split.calibration()) == 21  # one copy of an input
    assert doc["split"] == "held-out" and doc["n"] == len(split.held_out()) == 29
    assert doc["agreement"] < 0.5


def perturb_one_script(env, script: str, scale: float = 1.0) -> None:
    """A fault-injected optimized arm: fp32, except that the embedding of every input of
    `script` moves by seeded noise of `scale` times its length, renormalized (its neighbours
    become other inputs')."""
    from rollout.slices import script_of
    from serve.recipes.variants import Variant

    rows = Variant.rows

    def perturbed(self, texts, *args, **kwargs):
        out = rows(self, texts, *args, **kwargs)
        if self.arm != "optimized":
            return out
        mine = [k for k, text in enumerate(texts) if script_of(text) == script]
        if mine:
            noise = torch.randn(len(mine), out.shape[1],
                                generator=torch.Generator().manual_seed(len(mine)))
            noise = torch.nn.functional.normalize(noise, dim=-1)
            out = out.clone()
            out[mine] = torch.nn.functional.normalize(out[mine] + scale * noise, dim=-1)
        return out

    env.setattr(Variant, "rows", perturbed)


def test_a_variant_that_damages_one_slices_vectors_fails_on_retrieval(env, tmp_path):
    """1,500 Latin inputs keep their vectors; the 60 Han inputs' vectors move far beyond the
    tolerance for ties. Overall recall@10 stays above 0.95 (the Latin queries are most), the
    script:han slice's falls far below it with an interval that shows it, and the gate fails
    the verdict on that slice, recording the tie-aware and the strict figures."""
    perturb_one_script(env, "han", scale=3.0)  # the tiny encoder's vectors lie close together
    code, doc, err, store = verify_latin_and_han(
        env, tmp_path, [f"比赛报告第{i}号来自体育场的消息" for i in range(60)],
        MAX_CONFIDENT_FLIPS="1000", MIN_LOWER_BOUND="0", MIN_AGREEMENT="0", MIN_COSINE_P1="-1",
        MIN_SLICE_AGREEMENT="0", MIN_SLICE_SIZE="10")
    retrieval = doc["retrieval"]

    assert code == 1, err
    assert retrieval["queries"] == 312 and retrieval["documents"] == 1560
    assert retrieval["tolerance"] == doc["thresholds"]["retrieval_tolerance"] == 0.005
    assert retrieval["recall_at_10"] >= 0.95 and retrieval["recall_at_10_mixed"] >= 0.95
    assert retrieval["strict"]["recall_at_10"] <= retrieval["recall_at_10"]
    han = next(row for row in retrieval["slices"] if row["slice"] == "script:han")
    assert han["n"] == 12 and han["judged"] and han["recall_at_10"] < 0.8
    assert han["interval"][0] <= han["recall_at_10"] <= han["interval"][1] < 0.95
    assert retrieval["slices"][0]["recall_at_10"] == han["recall_at_10"]  # worst first
    latin = next(row for row in retrieval["slices"] if row["slice"] == "script:latin")
    assert latin["recall_at_10"] == latin["top1_unchanged"] == 1.0
    assert (f"slice script:han recall_at_10 {han['recall_at_10']:.4f} (12 queries, 95% upper "
            f"bound {han['interval'][1]:.4f}) < 0.95") in doc["failures"]
    assert all(line.startswith("slice ") and " recall_at_10 " in line  # and the slices that
               for line in doc["failures"])  # hold the same 12 queries (their label), only
    assert doc["thresholds"]["min_recall_at_10"] == 0.95
    [verdict] = store._verdicts.values()
    assert verdict.recall_at_10 == retrieval["recall_at_10"] and not verdict.passed
    assert verdict.strict_recall_at_10 == retrieval["strict"]["recall_at_10"]
    assert verdict.thresholds.min_recall_at_10 == 0.95
    assert verdict.thresholds.retrieval_tolerance == 0.005


def test_a_variant_that_barely_moves_one_slices_vectors_passes_with_ties_counted(env, tmp_path):
    """The same 60 Han inputs moved by a thousandth: near-duplicate neighbours swap places
    (the strict figures may read it as damage), within the tolerance for ties: it passes."""
    perturb_one_script(env, "han", scale=0.001)
    code, doc, err, _ = verify_latin_and_han(
        env, tmp_path, [f"比赛报告第{i}号来自体育场的消息" for i in range(60)],
        MAX_CONFIDENT_FLIPS="1000", MIN_LOWER_BOUND="0", MIN_AGREEMENT="0", MIN_COSINE_P1="-1",
        MIN_SLICE_AGREEMENT="0", MIN_SLICE_SIZE="10")

    assert code == 0, (err, doc["failures"])
    han = next(row for row in doc["retrieval"]["slices"] if row["slice"] == "script:han")
    assert han["recall_at_10"] == 1.0 and han["tied"] > 0


def test_retrieval_figures_and_the_sets_own_relevance_labels(env, tmp_path):
    """fp32 against itself keeps every neighbour; a query labelled with its relevant inputs
    (`relevant`, `query_of`) gets recall against them, reported, not judged."""
    path = tmp_path / "labelled.jsonl"
    rows = [{"text": f"The match report number {i} from the stadium"} for i in range(40)]
    rows += [{"text": "match report number 3", "query_of": 3},
             {"text": "reports seven and eight", "relevant": [7, 8]}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    env.setenv("CANARY_VERIFY_MIN_LOWER_BOUND", "0")  # 42 inputs cannot reach 0.98
    code, out, err, _ = verify("--set", str(path), "--recipe", "fp32", "--no-speed", "--json",
                               "--quiet")
    doc = json.loads(out)

    assert code == 0, err
    assert {k: doc["retrieval"][k] for k in ("recall_at_10", "recall_at_10_mixed",
                                             "top1_unchanged")} == dict.fromkeys(
        ("recall_at_10", "recall_at_10_mixed", "top1_unchanged"), 1.0)
    truth = doc["retrieval"]["ground_truth"]
    assert truth["queries"] == 2 and doc["retrieval"]["documents"] == 42
    assert truth["baseline_recall_at_10"] == truth["optimized_recall_at_10"] > 0


@pytest.mark.parametrize(("row", "message"), [
    ({"text": "x", "query_of": "three"}, "`query_of` must be an input index"),
    ({"text": "x", "relevant": 3}, "`relevant` must be a list of input indices"),
    ({"text": "x", "relevant": [99]}, "names a relevant input beyond the set's 2 inputs"),
])
def test_bad_relevance_labels_are_one_line_and_exit_2(env, tmp_path, row, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"text": "a"}) + "\n" + json.dumps(row) + "\n")
    code, _, err, _ = verify("--set", str(path), "--recipe", "fp32", "--no-speed", "--quiet")

    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
