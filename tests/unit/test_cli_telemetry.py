"""`rollout status` traffic and `rollout traces` against in-memory twins: no Redis, no Ray."""

from __future__ import annotations

import io
import json

import pytest

from ops import cli
from rollout import Attempt, FakeClock, MemoryStateStore, MemoryTelemetry, RequestRecord
from rollout.agreement import wilson_interval
from rollout.shadow import PairOutcome, ShadowItem, merge_shadow, shadow_fields
from rollout.telemetry.windows import merge_fields

NOW = 1_700_000_000.0
T0 = NOW - 5
TRACE = "0af7651916cd43dd8448eb211c80319c"


def span(name, span_id, parent, start_ms, end_ms, service="canary-gateway", **attrs):
    return {"trace_id": TRACE, "span_id": span_id, "parent_id": parent, "name": name,
            "service": service, "start": T0 + start_ms / 1000, "end": T0 + end_ms / 1000,
            "status": "ok", "error": None, "attrs": attrs}


SPANS = [
    span("POST /v1/predict", "a" * 16, None, 0, 20, **{
        "canary.request_id": "req-42", "canary.arm": "baseline", "canary.fallback": True,
        "http.response.status_code": 200}),
    span("route", "b" * 16, "a" * 16, 0.1, 0.2, **{"canary.arm": "optimized"}),
    span("model.call", "c" * 16, "a" * 16, 0.3, 5, **{"canary.outcome": "error"}),
    span("model.call", "d" * 16, "a" * 16, 5.1, 19, **{"canary.outcome": "ok"}),
    span("model.predict", "e" * 16, "d" * 16, 6, 18, service="canary-model"),
    span("batch", "f" * 16, "e" * 16, 8, 16, service="canary-model",
         **{"canary.batch.requests": 3}),
    span("forward", "1" * 16, "f" * 16, 8.5, 16, service="canary-model"),
]


def run(*argv, telemetry=None):
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), store=MemoryStateStore(), clock=FakeClock(NOW),
                    stdout=out, stderr=err, telemetry=telemetry)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def telemetry():
    memory = MemoryTelemetry()
    ok = Attempt("baseline", "ok", {"forward": 4.0}, 2, 1, 0.004, 0.002)
    records = [(NOW - 1, RequestRecord("baseline", 200, 10.0, 1, 3, (ok,))) for _ in range(9)]
    records.append((NOW - 1, RequestRecord("baseline", 504, 5000.0, 1, 3,
                                           (Attempt("baseline", "timeout"),))))
    memory.increment(merge_fields(records, "default"))
    memory.add_spans(SPANS)
    return memory


def test_status_shows_per_arm_traffic(telemetry):
    code, out, _ = run("status", telemetry=telemetry)
    assert code == 0
    lines = out.splitlines()
    assert "traffic over the last 60s:" in lines
    at = next(i for i, line in enumerate(lines) if line.startswith("ARM"))
    header, table = lines[at], lines[at + 1:]
    assert header.split() == ["ARM", "REQ/S", "SUCCESS", "ERRORS", "TIMEOUTS", "RETRIES", "P50",
                              "MS", "P99", "MS", "QUEUE", "BATCH", "COMPUTE", "MS", "CPU",
                              "S/1K", "COST/1K"]
    baseline = next(line for line in table if line.startswith("baseline")).split()
    assert baseline[1:6] == ["0.17", "90.0%", "0.0%", "10.0%", "0.0%"]
    assert float(baseline[6]) == pytest.approx(10.0, rel=0.05)
    assert float(baseline[7]) == pytest.approx(5000.0, rel=0.05)
    assert baseline[8:13] == ["1.0", "2.0", "4.00", "-", "2.000000"]  # no CPU measured
    optimized = next(line for line in table if line.startswith("optimized")).split()
    assert optimized[1] == "0.00" and set(optimized[2:]) == {"-"}


def test_status_json_carries_the_windows(telemetry):
    code, out, _ = run("status", "--json", "--window", "30", telemetry=telemetry)
    doc = json.loads(out)
    traffic = doc["traffic"]
    assert traffic["window_s"] == 30 and traffic["error"] is None
    assert traffic["arms"]["baseline"]["requests"] == 10
    assert traffic["arms"]["baseline"]["statuses"] == {"200": 9, "504": 1}
    assert traffic["arms"]["optimized"]["requests"] == 0


def test_status_without_any_telemetry_still_works():
    code, out, _ = run("status", telemetry=MemoryTelemetry())
    assert code == 0
    assert "canary share     0%" in out
    assert "traffic: no requests recorded in the last 60s" in out


def test_status_when_the_telemetry_store_is_down_still_shows_the_state():
    from rollout import StoreUnavailable

    class Down(MemoryTelemetry):
        def hashes(self, keys):
            raise StoreUnavailable("cannot reach Redis at redis://h:6379/0")

    code, out, err = run("status", telemetry=Down())
    assert code == 0 and err == ""
    assert "canary share     0%" in out
    assert "traffic: unavailable (cannot reach Redis" in out


def test_traces_lists_recent_traces(telemetry):
    code, out, _ = run("traces", "--last", "5", telemetry=telemetry)
    assert code == 0
    header, row = out.splitlines()
    assert header.split() == ["TIME", "TRACE", "REQUEST", "ARM", "STATUS", "MS", "SPANS"]
    assert row.split() == ["2023-11-14T22:13:15Z", TRACE, "req-42", "baseline", "200", "20.0",
                           "7", "fallback"]


def test_traces_json_lists_summaries(telemetry):
    code, out, _ = run("traces", "--json", telemetry=telemetry)
    [summary] = json.loads(out)
    assert summary["trace_id"] == TRACE and summary["request_id"] == "req-42"
    assert summary["fallback"] is True and summary["spans"] == 7


def test_a_request_renders_as_a_waterfall_tree(telemetry):
    code, out, _ = run("traces", "--request-id", "req-42", telemetry=telemetry)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == f"trace {TRACE}: 7 spans, 20.00 ms"
    width = lines[1].index("SERVICE")
    names = [line[:width].rstrip() for line in lines[2:]]
    assert names == ["POST /v1/predict", "|- route", "|- model.call", "`- model.call",
                     "   `- model.predict", "      `- batch", "         `- forward"]
    forward = lines[-1]
    assert "8.50" in forward and "7.50" in forward  # start 8.5 ms, 7.5 ms long
    assert "batch=3" in next(line for line in lines if "- batch" in line)
    assert "outcome=error" in lines[4]


def test_an_unknown_request_is_a_one_line_error_that_says_whether_it_was_sampled(
        telemetry, monkeypatch):
    monkeypatch.setenv("CANARY_TRACE_SAMPLE_RATIO", "1")
    code, out, err = run("traces", "--request-id", "nope", telemetry=telemetry)
    assert code == 1 and out == "" and len(err.splitlines()) == 1
    assert err.startswith("rollout: error: no trace recorded for request nope: it was sampled "
                          "(CANARY_TRACE_SAMPLE_RATIO=1), so its trace expired")
    monkeypatch.setenv("CANARY_TRACE_SAMPLE_RATIO", "0")
    monkeypatch.setenv("CANARY_TRACE_SLOW_MS", "250")
    code, out, err = run("traces", "--request-id", "nope", telemetry=telemetry)
    assert code == 1 and out == "" and len(err.splitlines()) == 1
    assert err.startswith("rollout: error: request nope was not sampled "
                          "(CANARY_TRACE_SAMPLE_RATIO=0 records")
    assert "slower than CANARY_TRACE_SLOW_MS=250" in err and '"sampled": false' in err


def test_trace_by_id_as_json(telemetry):
    code, out, _ = run("traces", "--trace-id", TRACE, "--json", telemetry=telemetry)
    doc = json.loads(out)
    assert doc["trace_id"] == TRACE and len(doc["spans"]) == 7


def test_the_cli_and_the_rollout_package_import_no_ray_torch_or_http():
    import subprocess
    import sys

    code = (
        "import sys, io; from ops import cli; from rollout import MemoryStateStore, "
        "MemoryTelemetry; import rollout.telemetry.redis_store, rollout.telemetry.sink, "
        "rollout.telemetry.windows; "
        "cli.main(['status'], store=MemoryStateStore(), telemetry=MemoryTelemetry(), "
        "stdout=io.StringIO()); "
        "heavy = {'ray', 'torch', 'transformers', 'fastapi', 'starlette', 'httpx', 'aiohttp'}; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def shadowed(memory: MemoryTelemetry) -> MemoryTelemetry:
    """Online agreement in the window: 40 classify pairs (2 flips at the boundary), 10 embed
    pairs, 3 shed, 1 failed shadow call."""
    items = [ShadowItem(NOW - 2, shadow_fields(
        [PairOutcome(i >= 2, 0.003 if i < 4 else 0.3) for i in range(40)]
        + [PairOutcome(cosine=0.99995)] * 10, calls=25)),
        ShadowItem(NOW - 1, shadow_fields(shed=3)), ShadowItem(NOW - 1, shadow_fields(errors=1))]
    memory.increment(merge_shadow(items, "default"))
    return memory


def test_status_shows_online_agreement_with_its_bound_and_n(telemetry):
    code, out, _ = run("status", telemetry=shadowed(telemetry))
    assert code == 0
    low = wilson_interval(38, 40)[0]
    assert "online agreement (shadow, last 60s):" in out
    assert f"top-1     95.00% (95% lower bound {low * 100:.2f}%, n=40 pairs, 2 flipped)" in out
    assert "cosine    mean 0.999950, p1 >= 0.999900, min >= 0.999900 (n=10)" in out
    assert "shadow    25 calls compared, shed 3, errors 1" in out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()
            if line.startswith("  0-") or line.startswith("  >=")}
    assert rows == {"0-0.005": ["4", "2", "50.00%"], ">=0.1": ["36", "0", "100.00%"]}


def test_status_json_carries_the_online_agreement(telemetry):
    code, out, _ = run("status", "--json", telemetry=shadowed(telemetry))
    shadow = json.loads(out)["traffic"]["shadow"]
    assert (shadow["pairs"], shadow["agreed"], shadow["shed"], shadow["errors"]) == (40, 38, 3, 1)
    assert shadow["lower_bound"] == pytest.approx(wilson_interval(38, 40)[0])
    assert shadow["by_margin"]["0-0.005"] == [2, 4] and shadow["cosine_n"] == 10


def test_status_says_when_nothing_was_shadowed(telemetry):
    code, out, _ = run("status", telemetry=telemetry)
    assert "online agreement (shadow): no shadowed requests in the last 60s" in out
    doc = json.loads(run("status", "--json", telemetry=telemetry)[1])
    assert doc["traffic"]["shadow"]["pairs"] == 0
    assert doc["traffic"]["shadow"]["agreement"] is None


def test_a_shadow_span_after_the_response_does_not_lengthen_the_request():
    memory = MemoryTelemetry()
    memory.add_spans([*SPANS, span("shadow", "2" * 16, "a" * 16, 21, 900, **{
        "canary.arm": "optimized", "canary.shadow.of": "baseline",
        "canary.shadow.outcome": "ok", "canary.shadow.agreed": True})])
    code, out, _ = run("traces", "--json", telemetry=memory)
    [summary] = json.loads(out)
    assert summary["duration_ms"] == pytest.approx(20.0) and summary["spans"] == 8
    code, out, _ = run("traces", "--request-id", "req-42", telemetry=memory)
    shadow = next(line for line in out.splitlines() if "- shadow" in line)
    assert "shadow_of=baseline" in shadow and "agreed=True" in shadow
