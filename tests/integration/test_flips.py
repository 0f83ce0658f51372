"""Flip capture against a real Redis and the real Serve app: the stream's bounds (length, age,
expiry), the gateway's ACL user writing it, `rollout flips --json/--export` as an operator, and
a real disagreement between the two arms captured end to end and replayable by verify's loader."""

from __future__ import annotations

import io
import json
import time

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from ops import cli
from rollout.flips import FlipItem, FlipRecord
from rollout.redis_layout import Keys
from rollout.telemetry.redis_store import RedisTelemetry
from serve.common.regression import load_set

APP = "flips-itest"
KEY = Keys(APP).flips


def flip(ts: float, text: str) -> FlipRecord:
    return FlipRecord(ts=ts, request_id=f"req-{text}", task="classify", text=text,
                      baseline_label="sports", baseline_margin=0.25, optimized_label="health",
                      optimized_margin=0.02, baseline_version="b1", optimized_version="o1")


def rollout(*argv, url: str, app: str = APP):
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(["--redis-url", url, "--app", app, *argv], stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_the_stream_is_bounded_by_maxlen(redis_url):
    writer = RedisTelemetry(redis_url, APP)
    now = time.time()
    try:
        for batch in range(10):
            writer.write([FlipItem(flip(now, f"t{batch * 50 + i}"), 10, 3600) for i in range(50)])
        raw = redis.Redis.from_url(redis_url)
        length = raw.xlen(KEY)
        raw.close()
        # MAXLEN ~ 10: Redis trims whole nodes (100 entries by default), never past one more
        assert 10 <= length <= 10 + 100, length
        newest = writer.flips(5)
        assert [r.text for r in newest] == [f"t{i}" for i in range(495, 500)]
        assert newest[-1].request_id == "req-t499" and newest[-1].baseline_margin == 0.25
        # oldest first, stream ids attached ("<ms>-<seq>": compared as numbers, not text)
        ids = [tuple(map(int, r.id.split("-"))) for r in newest]
        assert ids == sorted(ids)
    finally:
        writer.close()


def test_entries_older_than_the_ttl_are_trimmed_and_the_key_expires(redis_url):
    """A real short TTL (1 s; the settings allow 60 s and more): what is older than the TTL
    before the newest flip is trimmed at the next write, and with nothing new the key goes."""
    writer = RedisTelemetry(redis_url, APP)
    raw = redis.Redis.from_url(redis_url)
    try:
        writer.write([FlipItem(flip(time.time(), f"old{i}"), 1000, 120) for i in range(3)])
        assert raw.xlen(KEY) == 3 and 0 < raw.ttl(KEY) <= 120
        writer.write([FlipItem(flip(time.time(), "recent"), 1000, 1)])
        assert raw.xlen(KEY) == 4 and 0 < raw.pttl(KEY) <= 1000  # all within 1 s
        time.sleep(1.2)
        writer.write([FlipItem(flip(time.time(), "new"), 1000, 1)])
        assert [r.text for r in writer.flips(10)] == ["new"]
        time.sleep(1.2)  # nothing new comes: the whole stream expires
        assert raw.exists(KEY) == 0 and writer.flips(10) == []
    finally:
        raw.close()
        writer.close()


def test_cli_lists_exports_and_says_when_capture_is_off(redis_url, tmp_path, monkeypatch):
    monkeypatch.delenv("CANARY_FLIP_CAPTURE", raising=False)
    code, out, _ = rollout("flips", url=redis_url)
    assert code == 0
    assert out.strip() == ("no flips captured: flip capture is off in this shell's settings (no "
                           "gateway reported in the last 60 s to say what it runs): set "
                           "CANARY_FLIP_CAPTURE=true for the gateways")
    writer = RedisTelemetry(redis_url, APP)
    now = time.time()
    try:
        writer.write([FlipItem(flip(now + i, f"input {i % 3}"), 100, 3600) for i in range(6)])
    finally:
        writer.close()
    code, out, _ = rollout("flips", "--json", "--last", "4", url=redis_url)
    rows = json.loads(out)
    assert code == 0 and [r["text"] for r in rows] == ["input 2", "input 0", "input 1", "input 2"]
    assert rows[0]["baseline_label"] == "sports" and rows[0]["optimized_margin"] == 0.02
    code, out, _ = rollout("flips", url=redis_url)
    assert code == 0 and out.splitlines()[0].startswith("TIME") and len(out.splitlines()) == 7
    path = tmp_path / "flips.jsonl"
    code, out, _ = rollout("flips", "--export", str(path), url=redis_url)
    assert code == 0 and "wrote 3 inputs (6 flips)" in out
    loaded = load_set(path)
    assert sorted(loaded.texts) == ["input 0", "input 1", "input 2"]
    assert {e.meta["seen"] for e in loaded.examples} == {2}
    assert all(e.label is None for e in loaded.examples)
    # another application's stream is its own
    code, out, _ = rollout("flips", "--json", url=redis_url, app="elsewhere")
    assert code == 0 and json.loads(out) == []


def test_the_gateway_user_writes_flips_and_only_the_flips_stream(secured):
    writer = RedisTelemetry(secured.url_for("gateway"), APP)
    try:
        writer.write([FlipItem(flip(time.time(), "from the gateway"), 100, 3600)])
    finally:
        writer.close()
    code, out, err = rollout("flips", "--json", url=secured.url_for("operator"))
    assert code == 0, err
    assert [r["text"] for r in json.loads(out)] == ["from the gateway"]
    raw = redis.Redis.from_url(secured.url_for("gateway"))
    try:
        for attempt in (lambda: raw.xadd(f"rollout:{APP}:audit", {"forged": "entry"}),
                        lambda: raw.xtrim(f"rollout:{APP}:audit", maxlen=0),
                        lambda: raw.xadd(f"rollout:{APP}:elsewhere", {"a": "b"})):
            with pytest.raises(redis.exceptions.NoPermissionError):
                attempt()
    finally:
        raw.close()


# --- end to end on the real Serve app --------------------------------------------------------

def _flips_counter(gw) -> dict[str, float]:
    response = gw.client.get("/metrics")
    assert response.status_code == 200
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name == "canary_shadow_flips_total":
                outcome = sample.labels["outcome"]
                counts[outcome] = counts.get(outcome, 0.0) + sample.value
    return counts


def test_a_real_disagreement_is_captured_and_exported_for_verify(gw, tmp_path):
    """The optimized arm's scores move one label on (a live `fault_rotate_labels`): every
    shadowed classify input flips. Capture keeps the short ones, skips the long one."""
    gw.redeploy({"optimized": {"fault_rotate_labels": True}}, shadow_share=1.0,
                flip_capture=True, flip_capture_max_chars=40)
    app, operator = gw.settings.app_name, gw.redis.url
    texts = ["the match went to extra time", "parliament passed the budget"]
    long_text = "a flipped input that is far longer than forty characters"
    response = gw.predict(texts, **{"X-Request-ID": "flip-e2e-1"})
    assert response.status_code == 200 and response.json()["arm"] == "baseline"
    # the client got the baseline's answer; the disagreement was found off the response path
    labels = [o["label"] for o in response.json()["outputs"]]
    assert gw.predict([long_text], **{"X-Request-ID": "flip-e2e-2"}).status_code == 200
    deadline = time.monotonic() + 20
    while True:
        code, out, err = rollout("flips", "--json", "--last", "50", url=operator, app=app)
        assert code == 0, err
        mine = [r for r in json.loads(out) if r["request_id"].startswith("flip-e2e-")]
        counts = _flips_counter(gw)
        if len(mine) >= 2 and counts.get("too_long"):
            break
        if time.monotonic() > deadline:
            raise AssertionError(f"flips never captured: {mine} {counts}")
        time.sleep(0.1)
    assert sorted(r["text"] for r in mine) == sorted(texts)
    assert {r["request_id"] for r in mine} == {"flip-e2e-1"}
    by_text = {r["text"]: r for r in mine}
    for text, label in zip(texts, labels, strict=True):
        record = by_text[text]
        assert record["baseline_label"] == label != record["optimized_label"]
        assert record["baseline_margin"] >= 0 and record["optimized_margin"] >= 0
        assert record["task"] == "classify" and record["ts"] > 0
    served = gw.served_state()["serving"]
    assert {(r["baseline_version"], r["optimized_version"]) for r in mine} == {
        (served["baseline"], served["optimized"])}
    assert counts == {"captured": 2, "too_long": 1}
    path = tmp_path / "flips.jsonl"
    code, out, err = rollout("flips", "--export", str(path), url=operator, app=app)
    assert code == 0, err
    exported = load_set(path)
    assert set(texts) <= set(exported.texts) and long_text not in exported.texts
