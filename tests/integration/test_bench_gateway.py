"""The benchmark's end-to-end part against the shared real gateway: arms forced through the
audited path and restored, every answer's Server-Timing parsed, the reports written."""

import json

from ops.bench import __main__ as bench
from tests.serve_app import APP


def test_bench_drives_both_arms_and_restores_the_state(gw, tmp_path):
    before = gw.rollout().state()
    texts = tmp_path / "texts.jsonl"  # within the fixture's input limits (200 characters)
    texts.write_text("".join(json.dumps({"text": f"short input number {i}"}) + "\n"
                             for i in range(16)))
    code = bench.main([
        "--url", gw.url, "--yes", "--redis-url", gw.redis.url, "--set", f"app_name={APP}",
        "--no-inprocess", "--concurrency", "1,4", "--seconds", "1", "--warmup", "0.2",
        "--texts", str(texts), "--out", str(tmp_path), "--quiet",
    ])
    assert code == 0
    result = json.loads((tmp_path / "bench.json").read_text())
    for arm in ("baseline", "optimized"):
        levels = result["gateway"][arm]
        assert [lv["concurrency"] for lv in levels] == [1, 4]
        for lv in levels:
            assert lv["ok"] > 0 and lv["failed"] == {}
            assert lv["arms"] == {arm: lv["ok"]}  # every answer came from the forced arm
            assert {"preprocess", "queue", "model", "postprocess", "gateway", "total"} <= set(
                lv["stages_ms"])
            assert lv["p50_ms"] <= lv["p99_ms"] and lv["mean_batch"] >= 1
        assert result["summary"]["arms"][arm]["bottleneck"]["stage"] is not None
    assert (tmp_path / "bench.png").read_bytes()[:4] == b"\x89PNG"
    after = gw.rollout().state()
    assert (after.canary_bp, after.kill) == (before.canary_bp, before.kill)
    store = gw.rollout().store
    assert "bench" in {entry.actor for entry in store.audit(last=6)}  # audited changes
    store.close()


def test_an_unreachable_redis_is_a_clear_error_and_changes_nothing(gw, tmp_path, capsys):
    from tests.servers import free_port

    before = gw.rollout().state()
    code = bench.main([
        "--url", gw.url, "--yes", "--redis-url", f"redis://127.0.0.1:{free_port()}/0",
        "--set", f"app_name={APP}", "--set", "redis_timeout_s=0.5", "--no-inprocess",
        "--out", str(tmp_path), "--quiet",
    ])
    assert code == 2
    assert "cannot read the rollout state" in capsys.readouterr().err
    assert gw.rollout().state().revision == before.revision
