"""The gateway's side of generative arms without Ray or a model: when the arms generate and
what is refused at start (serve.recipes.causal_lm, serve.config), the settings a generative
gateway runs with, what a failed or cut answer means for the client
(serve.gateway.generation), the per-arm token metrics (serve.telemetry.token_metrics), and
`ops.bench --task generate`'s table and refusals. The path itself, end to end with the real
small LM: tests/integration/test_generate_gateway.py."""

from __future__ import annotations

import json

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from ray.exceptions import RayTaskError
from ray.serve.exceptions import BackPressureError

from ops.bench import generate_loop
from ops.bench.__main__ import main as bench_main
from ops.bench.generate_gateway import ratios
from rollout import Arm, Settings
from serve.common.errors import InputTooLarge, ModelFailed, ModelTimeout, Overloaded
from serve.gateway.generation import Generation, settings_for
from serve.gateway.protocols.door import BadRequest
from serve.generative.wire import NeverFits, PromptTooLong
from serve.recipes.causal_lm import serves_causal_lm
from serve.telemetry.token_metrics import TokenMetrics
from tests.tiny_model import make_tiny_encoder


@pytest.fixture
def causal(tmp_path):
    """A folder that reads as a causal LM (its config names one); nothing is loaded."""
    folder = tmp_path / "lm"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    return folder


def test_the_arms_generate_when_the_baseline_folder_holds_a_causal_lm(causal, tmp_path):
    encoder = make_tiny_encoder(tmp_path / "enc")
    assert not serves_causal_lm(Settings(model_path=str(encoder)))
    assert serves_causal_lm(Settings(model_path=str(causal), optimized_recipe="bf16"))
    mixed = Settings(model_path=str(causal), optimized_model_path=str(encoder),
                     optimized_recipe="bf16")
    with pytest.raises(ValueError, match="CANARY_OPTIMIZED_MODEL_PATH: .* holds no causal"):
        serves_causal_lm(mixed)


@pytest.mark.parametrize("recipe, why", [
    ("onnx-int8", "onnx-int8 builds an encoder artifact"),
    ("accuracy-aware", "accuracy-aware builds an encoder artifact or plan")])
def test_a_recipe_that_builds_no_causal_lm_is_refused_before_deploying(causal, recipe, why):
    with pytest.raises(ValueError, match=why):
        serves_causal_lm(Settings(model_path=str(causal), optimized_recipe=recipe))


def test_a_causal_lm_is_served_remote_only(causal):
    from serve.config import build

    with pytest.raises(ValueError, match="remote topology"):
        build(Settings(model_path=str(causal), optimized_recipe="bf16", topology="colocated"))
    with pytest.raises(ValueError, match="without live arm settings"):
        build(Settings(model_path=str(causal), optimized_recipe="bf16", topology="remote"),
              {"optimized": {"fault_error": True}})


def test_a_generative_gateway_reads_its_own_deadline_and_tokenizes_itself():
    settings = Settings(request_timeout_s=10, stream_timeout_s=90, gateway_tokenize_threads=2)
    assert settings_for(settings, {"embed", "classify"}) is settings
    generative = settings_for(settings, {"generate"})
    assert generative.request_timeout_s == 90 and generative.gateway_tokenize_threads == 0


@pytest.fixture
def path():
    """The generative path with nothing behind it: what its failures mean."""
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("test")
    generation = Generation({}, None, Settings(), Settings(), None, None, meter)
    generation.reader = reader
    return generation


def remote(cause: Exception) -> RayTaskError:
    """The error a replica's exception arrives as."""
    return RayTaskError("generate", "Traceback: ...", cause)


def counts(reader, name: str) -> dict:
    found = {}
    for resource in reader.get_metrics_data().resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    for point in metric.data.data_points:
                        key = tuple(sorted(point.attributes.items()))
                        found[key] = getattr(point, "value", None) or point.count
    return found


def test_what_a_failed_call_means_for_the_client(path):
    never = path._failure(Arm.OPTIMIZED, remote(NeverFits("holds 256 tokens")))
    assert isinstance(never, InputTooLarge) and never.status == 413
    assert "optimized model: holds 256 tokens" in never.message
    long = path._failure(Arm.BASELINE, remote(PromptTooLong("600 tokens")))
    assert isinstance(long, BadRequest) and long.status == 400 and long.param == "prompt"
    full = path._failure(Arm.BASELINE, BackPressureError(num_queued_requests=5,
                                                         max_queued_requests=5))
    assert isinstance(full, Overloaded) and full.retry_after
    assert isinstance(path._failure(Arm.BASELINE, TimeoutError()), ModelTimeout)
    broken = path._failure(Arm.BASELINE, remote(RuntimeError("CUDA error")))
    assert isinstance(broken, ModelFailed) and "RuntimeError" in broken.message
    assert counts(path.reader, "canary.generate.refused") == {
        (("arm", "optimized"), ("reason", "never_fits")): 1,
        (("arm", "baseline"), ("reason", "queue_full")): 1}


def test_what_an_answer_that_did_not_end_normally_means(path):
    event = {"finish": "timeout", "completion_tokens": 0, "error": None}
    waited = path._ended(Arm.BASELINE, event)
    assert isinstance(waited, Overloaded) and "KV cache" in waited.message
    cut = path._ended(Arm.BASELINE, {**event, "completion_tokens": 7})
    assert isinstance(cut, ModelTimeout) and "7 tokens" in cut.message
    failed = path._ended(Arm.OPTIMIZED, {**event, "finish": "error", "error": "OOM"})
    assert isinstance(failed, ModelFailed) and "OOM" in failed.message


def test_token_metrics_per_arm():
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("test")
    infos = {"baseline": {"kv_in_use_bytes": 4096, "kv_peak_bytes": 8192,
                          "kv_budget_bytes": 1 << 20, "sequences_running": 2,
                          "sequences_waiting": 1}}
    metrics = TokenMetrics(meter, lambda: infos)
    metrics.answered("optimized", 12.5, [1.0, 1.004, 1.010], prompt_tokens=9,
                     completion_tokens=3)
    assert counts(reader, "canary.generate.first_token") == {(("arm", "optimized"),): 1}
    assert counts(reader, "canary.generate.inter_token") == {(("arm", "optimized"),): 2}
    assert counts(reader, "canary.generate.tokens") == {
        (("arm", "optimized"), ("kind", "prompt")): 9,
        (("arm", "optimized"), ("kind", "completion")): 3}
    assert counts(reader, "canary.generate.kv_bytes")[
        (("arm", "baseline"), ("kind", "in_use"))] == 4096
    assert counts(reader, "canary.generate.sequences") == {
        (("arm", "baseline"), ("state", "running")): 2,
        (("arm", "baseline"), ("state", "waiting")): 1}


def test_the_generate_table_gives_the_loops_ratios():
    rows = [{"way": way, "concurrency": 8, "tokens": 1, "tokens_per_s": tps,
             "ttft_p50_ms": 1.0, "ttft_p99_ms": 2.0, "itl_p50_ms": 3.0, "itl_p99_ms": itl,
             "note": ""}
            for way, tps, itl in (("one at a time", 250.0, 6.0), ("static batch", 800.0, 12.0),
                                  ("decode loop", 1200.0, 15.0))]
    table = generate_loop.table(rows)
    assert "| 8 | decode loop | 1,200.0 | 1.0 / 2.0 | 3.0 / 15.0 |" in table
    gateway = {**rows[2], "way": "gateway baseline", "tokens_per_s": 480.0}
    assert ratios([*rows, gateway]) == [
        "- c=8: the gateway's baseline arm 0.40x the decode loop in process (tokens/s)"]
    assert ratios(rows) == []  # no gateway row: no ratio
    assert ("- c=8: decode loop 4.80x one at a time, 1.50x the static batch (tokens/s); p99 "
            "inter-token latency 1.25x the static batch's") in table


def test_bench_task_generate_refuses_what_it_cannot_measure(tmp_path, capsys, causal):
    encoder = make_tiny_encoder(tmp_path / "enc")
    for argv, why in ((["--model-path", str(encoder)], "holds no causal LM"),
                      (["--url", "http://127.0.0.1:8000"], "starts its own local app"),
                      (["--model-path", str(causal), "--no-inprocess", "--no-gateway"],
                       "leaves nothing to measure"),
                      (["--model-path", str(causal), "--arms", "canary"], "--arms: choose")):
        with pytest.raises(SystemExit) as exited:
            bench_main(["--task", "generate", *argv])
        assert exited.value.code == 2 and why in capsys.readouterr().err


def test_auto_is_the_default_recipe_of_a_causal_lms_optimized_arm(causal):
    settings = Settings(model_path=str(causal))
    assert settings.optimized_recipe == "auto" and serves_causal_lm(settings)


def test_generative_answers_reach_the_windows_and_rollout_status():
    from ops.cli.telemetry import generation_rows
    from rollout.telemetry.window_fields import Attempt, Generated, RequestRecord, record_fields
    from rollout.telemetry.window_stats import aggregate

    def record(arm: str, generated: Generated | None) -> dict:
        return record_fields(RequestRecord(arm, 200, 500.0, 1, 10, (
            Attempt(arm, "ok", generated=generated),)))[arm]

    answers = [record("optimized", Generated(20.0, 400.0, 81)) for _ in range(10)]
    stats = aggregate("optimized", answers, 10.0)
    generation = stats.generation
    assert generation["answers"] == 10 and generation["tokens"] == 810
    assert generation["tokens_per_s"] == 81.0 and generation["inter_token_ms"] == 5.0
    assert abs(generation["first_token_p50_ms"] - 20.0) < 1.0
    encoder = aggregate("baseline", [record("baseline", None)], 10.0)
    assert encoder.generation is None and "generation" in encoder.as_dict()
    header, row = generation_rows({"baseline": encoder, "optimized": stats})
    assert header.split()[:2] == ["ARM", "ANSWERS"]
    assert row.split()[:3] == ["optimized", "10", "81.0"]
    assert generation_rows({"baseline": encoder}) == []
