"""Flip capture (rollout.flips, serve.gateway.shadow) and `rollout flips` against in-memory twins:
the capture policy (off by default, max chars, the redaction hook dropping, changing or raising),
the record's fields, the bounds of the stream's twin, and the export format read back by the
regression-set loader. No Redis, no Ray."""

from __future__ import annotations

import asyncio
import io
import json
import random

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from pydantic import ValidationError

from ops import cli
from ops.cli.flips import flip_rows, regression_rows
from rollout import Arm, FakeClock, MemoryStateStore, Settings
from rollout.flips import (
    FlipCapture,
    FlipItem,
    FlipRecord,
    FlipSettingError,
    MemoryFlips,
    load_redactor,
    to_regression_row,
)
from rollout.redis_layout import Keys
from rollout.shadow import ShadowItem, aggregate_shadow
from serve.common.answer import BatchShape, ModelAnswer, StageTiming
from serve.common.regression import load_set
from serve.gateway.shadow import Shadow, flip_capture
from serve.telemetry.otel import Telemetry

NOW = 1_700_000_000.0
LABELS = ("sports", "politics", "health")


# --- redaction hooks, importable as tests.unit.test_flips:<name> ------------------------------

def mask_digits(text: str) -> str:
    return "".join("#" if ch.isdigit() else ch for ch in text)


def drop_secrets(text: str) -> str | None:
    return None if "secret" in text else text


def explode(text: str) -> str:
    raise RuntimeError("hook bug")


NOT_A_FUNCTION = 42


def out(label: str, top: float = 0.7, second: float = 0.2) -> dict:
    """A classify output: `label` on top with `top`, the next label `second`, the rest 0.1."""
    rest = [name for name in LABELS if name != label]
    scores = {label: top, rest[0]: second, rest[1]: 0.1}
    return {"label": label, "scores": {name: scores[name] for name in LABELS}}


def capture(**kwargs) -> FlipCapture:
    return FlipCapture(**{"enabled": True, "max_chars": 50, **kwargs})


def records_of(cap: FlipCapture, texts, base_labels, opt_labels, **kwargs):
    base = [out(label) for label in base_labels]
    opt = [out(label, 0.5, 0.45) for label in opt_labels]
    agreed = [b == o for b, o in zip(base_labels, opt_labels, strict=True)]
    return cap.records(task="classify", texts=texts, baseline=base, optimized=opt,
                       agreed=agreed, ts=NOW, request_id="req-1", baseline_version="b1",
                       optimized_version="o2", **kwargs)


# --- settings ---------------------------------------------------------------------------------

def test_capture_is_off_by_default_and_the_settings_have_bounds():
    settings = Settings()
    assert settings.flip_capture is False and settings.flip_redact is None
    assert flip_capture(settings).enabled is False
    with pytest.raises(ValidationError, match="flip_capture_max"):
        Settings(flip_capture_max=0)
    with pytest.raises(ValidationError, match="CANARY_FLIP_REDACT must be 'module:function'"):
        Settings(flip_redact="not a path")
    assert Settings(flip_redact="  ").flip_redact is None


def test_a_malformed_hook_is_a_cli_usage_error_naming_the_setting(monkeypatch):
    monkeypatch.setenv("CANARY_FLIP_REDACT", "no-colon-here")
    err = io.StringIO()
    assert cli.main(["flips"], stdout=io.StringIO(), stderr=err) == 2
    assert "invalid setting CANARY_FLIP_REDACT" in err.getvalue()
    assert len(err.getvalue().splitlines()) == 1


def test_load_redactor_resolves_or_names_the_setting():
    assert load_redactor("tests.unit.test_flips:mask_digits")("pin 1234") == "pin ####"
    for path, why in (("tests.unit.no_such_module:f", "cannot import module"),
                      ("tests.unit.test_flips:missing", "has no function 'missing'"),
                      ("tests.unit.test_flips:NOT_A_FUNCTION", "has no function"),
                      ("bad path", "must be 'module:function'")):
        with pytest.raises(FlipSettingError, match=why) as info:
            load_redactor(path)
        assert "CANARY_FLIP_REDACT" in str(info.value)


def test_a_hook_that_cannot_be_imported_fails_the_gateway_at_start():
    settings = Settings(flip_capture=True, flip_redact="tests.unit.no_such_module:redact")
    telemetry = Telemetry(settings, settings, "canary-gateway", store=MemoryFlips(), environ={})
    try:
        with pytest.raises(FlipSettingError, match="CANARY_FLIP_REDACT: cannot import"):
            Shadow(settings, None, telemetry)
        # with capture off, the hook is not needed and not imported
        Shadow(settings.model_copy(update={"flip_capture": False}), None, telemetry)
    finally:
        telemetry.shutdown()


# --- the capture policy -------------------------------------------------------------------------

def test_only_flipped_classify_inputs_are_kept_with_both_labels_margins_and_versions():
    cap = capture()
    [record] = records_of(cap, ["goal!", "vote"], ["sports", "politics"],
                          ["sports", "health"])
    assert record == FlipRecord(
        ts=NOW, request_id="req-1", task="classify", text="vote", baseline_label="politics",
        baseline_margin=pytest.approx(0.5), optimized_label="health",
        optimized_margin=pytest.approx(0.05), baseline_version="b1", optimized_version="o2")
    assert cap.counts == {"captured": 1, "too_long": 0, "redacted": 0, "redact_error": 0}
    embed = cap.records(task="embed", texts=["x"], baseline=[{}], optimized=[{}],
                        agreed=[None], ts=NOW)
    assert embed == []


def test_capture_off_keeps_and_counts_nothing():
    cap = FlipCapture()
    assert records_of(cap, ["vote"], ["politics"], ["health"]) == []
    assert sum(cap.counts.values()) == 0


def test_inputs_over_max_chars_are_skipped_and_counted():
    cap = capture(max_chars=10)
    kept = records_of(cap, ["short one", "x" * 11], ["sports", "sports"], ["health", "health"])
    assert [r.text for r in kept] == ["short one"]
    assert cap.counts["too_long"] == 1 and cap.counts["captured"] == 1


def test_the_redaction_hook_changes_or_drops_inputs():
    cap = capture(redact=load_redactor("tests.unit.test_flips:mask_digits"))
    [record] = records_of(cap, ["card 4111 flipped"], ["sports"], ["health"])
    assert record.text == "card #### flipped"
    cap = capture(redact=drop_secrets)
    kept = records_of(cap, ["my secret", "public"], ["sports", "sports"], ["health", "health"])
    assert [r.text for r in kept] == ["public"]
    assert cap.counts["redacted"] == 1 and cap.counts["captured"] == 1


def test_a_hook_that_raises_or_returns_no_text_drops_the_input_and_is_counted(caplog):
    cap = capture(redact=explode)
    assert records_of(cap, ["a", "b"], ["sports", "sports"], ["health", "health"]) == []
    assert cap.counts["redact_error"] == 2
    assert "hook raised RuntimeError" in caplog.text and "'a'" not in caplog.text
    cap = capture(redact=lambda text: 7)
    assert records_of(cap, ["a"], ["sports"], ["health"]) == []
    assert cap.counts["redact_error"] == 1


def test_a_record_round_trips_through_its_stream_fields():
    [record] = records_of(capture(), ["vote\nnow"], ["politics"], ["health"])
    fields = record.fields()
    assert all(isinstance(value, str) for value in fields.values())
    assert FlipRecord.from_fields("5-0", fields) == record
    assert FlipRecord.from_fields("5-0", fields).id == "5-0"
    assert FlipRecord.from_fields("6-0", {"ts": "junk"}).ts == 0.0
    assert Keys("search").flips == "rollout:search:flips"


# --- the stream's twin --------------------------------------------------------------------------

def flip(ts: float, text: str = "t") -> FlipRecord:
    return FlipRecord(ts=ts, request_id="r", task="classify", text=text,
                      baseline_label="sports", baseline_margin=0.3,
                      optimized_label="health", optimized_margin=0.01)


def test_the_memory_twin_is_bounded_by_length_and_age():
    memory = MemoryFlips()
    memory.write([FlipItem(flip(NOW + i, f"t{i}"), 5, 100) for i in range(12)])
    assert [r.text for r in memory.flips(100)] == [f"t{i}" for i in range(7, 12)]
    memory.write([FlipItem(flip(NOW + 500, "late"), 5, 100)])  # the others are > 100 s older
    assert [r.text for r in memory.flips(100)] == ["late"]
    assert memory.flips(0) == []


# --- export -------------------------------------------------------------------------------------

def test_exported_flips_load_as_a_regression_set_without_labels(tmp_path):
    records = [flip(NOW, "same input"), flip(NOW + 1, "other input"),
               flip(NOW + 2, "same input"), flip(NOW + 3, "  ")]
    rows = regression_rows(records)
    assert [(r["text"], r["seen"]) for r in rows] == [("other input", 1), ("same input", 2)]
    path = tmp_path / "flips.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    loaded = load_set(path, LABELS)
    assert loaded.texts == ["other input", "same input"]
    assert all(example.label is None for example in loaded.examples)
    meta = loaded.examples[1].meta
    assert meta["baseline"] == "sports" and meta["optimized"] == "health"
    assert meta["baseline_margin"] == 0.3 and meta["optimized_margin"] == 0.01
    assert meta["ts"] == NOW + 2 and "label" not in to_regression_row(records[0])


# --- the gateway's shadow comparison ------------------------------------------------------------

class Store(MemoryFlips):
    """The telemetry writer's twin: flips kept as the stream would, everything else listed."""

    def __init__(self):
        super().__init__()
        self.items = []

    def write(self, items):
        self.items.extend(items)
        super().write(items)


def model_answer(arm: str, version: str, outputs: list[dict]) -> ModelAnswer:
    return ModelAnswer(arm=arm, model_version=version, outputs=outputs, tokens=0,
                       batch=BatchShape(requests=1, items=len(outputs)), queue=0,
                       timing=StageTiming(preprocess=0.0, queue=0.0, model=0.0, postprocess=0.0))


class Rig:
    def __init__(self, other: str, store: Store | None = None, **overrides):
        self.store, self.reader = store or Store(), InMemoryMetricReader()
        self.settings = Settings(**{"shadow_share": 1.0, "flip_capture": True,
                                    "telemetry_flush_s": 0.01, **overrides})
        self.telemetry = Telemetry(self.settings, self.settings, "canary-gateway", store=self.store,
                                   metric_readers=[self.reader], environ={})

        async def call(arm, texts, task, timeout, carrier):
            return model_answer(arm.value, "opt-v2", [out(other, 0.5, 0.45) for _ in texts])

        self.shadow = Shadow(self.settings, call, self.telemetry, rng=random.Random(1),
                             clock=FakeClock(NOW))

    async def offer(self, *texts: str, label: str = "sports") -> None:
        result = model_answer("baseline", "base-v1", [out(label) for _ in texts])
        assert self.shadow.offer(answered=Arm.BASELINE, result=result, texts=list(texts),
                                 task="classify", in_flight=1, override=None,
                                 request_id="req-7") == "started"
        while self.shadow.tasks:
            await asyncio.sleep(0)
        self.telemetry.flush()

    def flip_counts(self) -> dict[str, float]:
        counts = {}
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == "canary.shadow.flips":
                        for point in metric.data.data_points:
                            counts[point.attributes["outcome"]] = point.value
        return counts

    def shadow_stats(self):
        items = [i for i in self.store.items if isinstance(i, ShadowItem)]
        return aggregate_shadow([i.fields for i in items], 1.0)

    def close(self):
        self.telemetry.shutdown()


def test_a_disagreement_is_captured_with_the_request_id_and_both_versions():
    rig = Rig("health")
    try:
        asyncio.run(rig.offer("the match", "the vote"))
        records = rig.store.flips(10)
        assert [r.text for r in records] == ["the match", "the vote"]
        assert {(r.request_id, r.baseline_version, r.optimized_version, r.ts)
                for r in records} == {("req-7", "base-v1", "opt-v2", NOW)}
        assert records[0].baseline_label == "sports" and records[0].optimized_label == "health"
        assert rig.flip_counts() == {"captured": 2}
        items = [i for i in rig.store.items if isinstance(i, FlipItem)]
        assert {(i.max_len, i.ttl_s) for i in items} == {(10_000, 7 * 86_400)}
    finally:
        rig.close()


def test_agreement_or_capture_off_writes_no_flip():
    rig = Rig("sports")
    try:
        asyncio.run(rig.offer("agreed"))
        assert rig.store.flips(10) == [] and rig.shadow_stats().agreed == 1
    finally:
        rig.close()
    rig = Rig("health", flip_capture=False)
    try:
        asyncio.run(rig.offer("flipped"))
        assert rig.store.flips(10) == [] and rig.shadow_stats().pairs == 1
        assert rig.flip_counts() == {}
    finally:
        rig.close()


def test_a_raising_hook_never_breaks_the_shadow_comparison():
    rig = Rig("health", flip_redact="tests.unit.test_flips:explode")
    try:
        asyncio.run(rig.offer("one", "two"))
        assert rig.store.flips(10) == []
        stats = rig.shadow_stats()
        assert stats.calls == 1 and stats.pairs == 2 and stats.agreed == 0
        assert rig.flip_counts() == {"redact_error": 2}
    finally:
        rig.close()


# --- `rollout flips` ----------------------------------------------------------------------------

def run(*argv, telemetry, reports=()):
    """`rollout` with these gateway heartbeats in its store."""
    stdout, stderr = io.StringIO(), io.StringIO()
    store = MemoryStateStore()
    for report in reports:
        store.report_deployment(report)
    code = cli.main(list(argv), store=store, clock=FakeClock(NOW),
                    stdout=stdout, stderr=stderr, telemetry=telemetry)
    return code, stdout.getvalue(), stderr.getvalue()


def gateway(name: str, capture: bool | None, shadow: float | None = 0.05, age_s: float = 5):
    from rollout.state import DeploymentReport

    return DeploymentReport(gateway=name, baseline_version="b", optimized_version="o",
                            ts=NOW - age_s, flip_capture=capture, shadow_share=shadow)


@pytest.fixture
def flips():
    memory = MemoryFlips()
    memory.write([FlipItem(flip(NOW - 60 + i, f"input number {i} " + "y" * 200), 100, 3600)
                  for i in range(3)])
    return memory


def test_the_table_shows_labels_margins_and_the_text_cut_to_the_terminal(flips):
    code, stdout, _ = run("flips", "--last", "2", telemetry=flips)
    lines = stdout.splitlines()
    assert code == 0 and lines[0].split() == ["TIME", "BASELINE", "MARGIN", "OPTIMIZED",
                                              "MARGIN", "TEXT"]
    assert len(lines) == 3 and "input number 1" in lines[1] and "input number 2" in lines[2]
    assert "sports" in lines[1] and "0.3000" in lines[1] and "health" in lines[1]
    assert "0.0100" in lines[1] and lines[1].endswith("...")
    narrow = flip_rows(flips.flips(3), 80)
    assert max(len(line) for line in narrow) <= 80
    assert all(line.endswith("...") for line in narrow[1:])
    tiny = flip_rows(flips.flips(1), 10)  # the text keeps a readable minimum
    assert len(tiny[1].split("  ")[-1]) == 20


def test_json_and_export(flips, tmp_path):
    code, stdout, _ = run("flips", "--json", "--last", "5", telemetry=flips)
    rows = json.loads(stdout)
    assert code == 0 and len(rows) == 3 and rows[0]["baseline_label"] == "sports"
    assert set(rows[0]) >= {"ts", "text", "baseline_margin", "optimized_margin", "request_id",
                            "baseline_version", "optimized_version", "task", "id"}
    path = tmp_path / "flips.jsonl"
    code, stdout, _ = run("flips", "--export", str(path), telemetry=flips)
    assert code == 0 and "wrote 3 inputs (3 flips)" in stdout
    assert f"rollout verify --set {path}" in stdout
    assert len(load_set(path, LABELS)) == 3


def test_nothing_captured_with_capture_off_says_how_to_turn_it_on(monkeypatch, tmp_path):
    monkeypatch.delenv("CANARY_FLIP_CAPTURE", raising=False)
    code, stdout, _ = run("flips", telemetry=MemoryFlips())
    assert code == 0
    assert stdout.strip() == ("no flips captured: flip capture is off in this shell's settings "
                              "(no gateway reported in the last 60 s to say what it runs): set "
                              "CANARY_FLIP_CAPTURE=true for the gateways")
    code, stdout, stderr = run("flips", "--json", telemetry=MemoryFlips())
    assert code == 0 and json.loads(stdout) == [] and "CANARY_FLIP_CAPTURE=true" in stderr
    path = tmp_path / "none.jsonl"
    code, _, stderr = run("flips", "--export", str(path), telemetry=MemoryFlips())
    assert code == 1 and "no flips to export: flip capture is off" in stderr
    assert not path.exists()
    monkeypatch.setenv("CANARY_FLIP_CAPTURE", "true")
    code, stdout, _ = run("flips", telemetry=MemoryFlips())
    assert code == 0 and "the arms agreed" in stdout and "is off" not in stdout


def test_export_to_an_unwritable_path_and_bad_arguments_are_usage_errors(flips, tmp_path):
    code, _, stderr = run("flips", "--export", str(tmp_path / "no" / "dir.jsonl"),
                          telemetry=flips)
    assert code == 2 and stderr.startswith("rollout: error: cannot write")
    code, _, stderr = run("flips", "--last", "0", telemetry=flips)
    assert code == 2 and "--last" in stderr


def test_rollout_verify_replays_an_exported_file(flips, tmp_path, monkeypatch):
    """The workflow's last step: `rollout verify --set flips.jsonl` on the tiny encoder."""
    from tests.tiny_model import make_tiny_encoder

    for name in list(__import__("os").environ):
        if name.startswith("CANARY_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("CANARY_MODEL_PATH", str(make_tiny_encoder(tmp_path / "tiny")))
    monkeypatch.setenv("CANARY_TORCH_THREADS", "1")
    monkeypatch.setenv("CANARY_VERIFY_MIN_LOWER_BOUND", "0")
    path = tmp_path / "flips.jsonl"
    assert run("flips", "--export", str(path), telemetry=flips)[0] == 0
    stdout, stderr = io.StringIO(), io.StringIO()
    code = cli.main(["verify", "--set", str(path), "--recipe", "fp32", "--no-speed",
                     "--no-store", "--json", "--quiet"], store=MemoryStateStore(),
                    clock=FakeClock(NOW), stdout=stdout, stderr=stderr)
    doc = json.loads(stdout.getvalue())
    assert code == 0, stderr.getvalue()
    assert doc["n"] == 3 and doc["agreement"] == 1.0  # fp32 against itself: no flip left


def test_serve_run_fails_before_any_replica_on_a_hook_that_cannot_be_imported():
    from serve.config import build

    with pytest.raises(FlipSettingError, match="CANARY_FLIP_REDACT: cannot import module"):
        build(Settings(flip_capture=True, flip_redact="tests.unit.no_such_module:redact"))
    build(Settings(flip_capture=True, flip_redact="tests.unit.test_flips:mask_digits"))


class DownStore(Store):
    def write(self, items):
        raise ConnectionError("redis is down")


def test_a_redis_failure_costs_a_counter_not_the_comparison():
    rig = Rig("health", store=DownStore())
    try:
        asyncio.run(rig.offer("the vote"))  # the shadow task finished without raising
        assert rig.telemetry.sink.dropped["error"] >= 2  # the shadow counters and the flip
        assert rig.flip_counts() == {"captured": 1}
    finally:
        rig.close()


def test_whether_capture_is_on_comes_from_what_the_gateways_report(monkeypatch):
    """An empty CANARY_FLIP_CAPTURE in the operator's shell says nothing about the gateways:
    their heartbeats do. A shell that says "on" is not believed over gateways that say "off"."""
    monkeypatch.delenv("CANARY_FLIP_CAPTURE", raising=False)
    capturing = [gateway("g1", True), gateway("g2", False)]
    code, stdout, _ = run("flips", telemetry=MemoryFlips(), reports=capturing)
    assert code == 0 and "the arms agreed" in stdout and "is off" not in stdout
    code, stdout, _ = run("flips", telemetry=MemoryFlips(), reports=[gateway("g1", False)])
    assert "flip capture is off in every gateway" in stdout
    code, stdout, _ = run("flips", telemetry=MemoryFlips(), reports=[gateway("g1", True, 0.0)])
    assert "shadow no traffic: set CANARY_SHADOW_SHARE > 0" in stdout
    monkeypatch.setenv("CANARY_FLIP_CAPTURE", "true")
    code, stdout, _ = run("flips", telemetry=MemoryFlips(), reports=[gateway("g1", False)])
    assert "flip capture is off in every gateway" in stdout
    # a report older than a minute, or from a gateway that did not say, is not heard
    stale = [gateway("g1", False, age_s=120), gateway("g2", None)]
    code, stdout, _ = run("flips", telemetry=MemoryFlips(), reports=stale)
    assert "the arms agreed" in stdout


def test_the_heartbeats_heard_are_those_rollout_status_counts_as_live():
    from ops.cli.flips import REPORTS_TTL_S
    from rollout.control import DEPLOYMENT_TTL_S

    assert REPORTS_TTL_S == DEPLOYMENT_TTL_S


def test_a_generated_answer_whose_arms_part_early_is_captured_as_its_prompt():
    capture = FlipCapture(enabled=True, max_chars=40)
    early = capture.parted(text="Local news: the", same_top=[True, True, False, True],
                           kld=0.03, ts=5.0, request_id="r1", baseline_version="fp32-a",
                           optimized_version="int8-b")
    assert (early.task, early.text, early.parted_at, early.kld) == (
        "generate", "Local news: the", 2, 0.03)
    assert FlipRecord.from_fields("7-0", early.fields()) == early
    assert capture.parted(text="late", same_top=[True] * 8 + [False], kld=0.1, ts=5.0) is None
    assert capture.parted(text="same", same_top=[True] * 4, kld=0.0, ts=5.0) is None
    assert capture.parted(text="x" * 41, same_top=[False], kld=0.1, ts=5.0) is None
    assert capture.counts["captured"] == 1 and capture.counts["too_long"] == 1
    assert FlipCapture(enabled=False).parted(text="t", same_top=[False], kld=1.0,
                                             ts=1.0) is None
    row = to_regression_row(early)
    assert row["kind"] == "parted" and row["text"] == "Local news: the"
    assert row["parted_at"] == 2 and row["task"] == "generate" and "baseline" not in row
    assert FlipRecord.from_fields("8-0", {"ts": "1", "task": "classify"}).parted_at == -1


def test_the_flips_table_shows_where_a_generated_answer_parts():
    record = FlipCapture(enabled=True).parted(text="Local news: the", same_top=[True, False],
                                              kld=0.0312, ts=5.0)
    [_, row] = flip_rows([record], 120)
    assert "generate" in row and "KLD 0.0312" in row and "parts at token 1" in row
    assert row.endswith("Local news: the")
