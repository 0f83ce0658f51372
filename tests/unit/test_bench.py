"""The benchmark command: its in-process part and report writers on the tiny encoder, its
Server-Timing parser, and its answers to bad input (no Ray, no Redis)."""

import json
import threading
from collections import Counter

import pytest

from ops.bench import __main__ as bench
from ops.bench import cpu, endtoend, report
from tests.servers import free_port
from tests.tiny_model import make_tiny_encoder


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory):
    return make_tiny_encoder(tmp_path_factory.mktemp("enc"))


@pytest.fixture(scope="module")
def inprocess(encoder_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    code = bench.main(["--no-gateway", "--model-path", str(encoder_dir), "--inputs", "12",
                       "--batch-sizes", "1,4", "--rounds", "1", "--out", str(out), "--quiet"])
    assert code == 0
    return out


def test_inprocess_json_has_every_arm_and_batch(inprocess):
    result = json.loads((inprocess / "bench.json").read_text())
    rows = result["inprocess"]
    assert {(r["arm"], r["batch"]) for r in rows} == {
        (arm, size) for arm in ("baseline", "optimized") for size in (1, 4)}
    for r in rows:
        assert r["inputs"] == 12 and r["throughput"] > 0 and r["p50_ms"] > 0
        assert set(r["stages_ms"]) == {"preprocess", "model", "postprocess"}
        assert all(v >= 0 for v in r["stages_ms"].values())
    assert result["meta"]["recipes"]["baseline"] == "fp32"
    assert result["memory"]["bench_process_mib"] > 0
    speed = result["summary"]["speedup"]["inprocess"]
    by = {(r["arm"], r["batch"]): r["throughput"] for r in rows}
    assert speed["4"] == pytest.approx(by[("optimized", 4)] / by[("baseline", 4)])
    forward = {(r["arm"], r["batch"]): r["stages_ms"]["model"] for r in rows}
    assert result["summary"]["speedup"]["forward"]["4"] == pytest.approx(
        forward[("baseline", 4)] / forward[("optimized", 4)])
    assert "gateway" not in result and result["summary"]["arms"]["baseline"]["efficiency"] is None
    assert "| baseline | fp32 | 1 |" in (inprocess / "bench.md").read_text()
    assert not (inprocess / "bench.png").exists()  # no gateway part, no chart


def _level(concurrency: int, latency: float, model_ms: float, batch: int, n: int) -> dict:
    samples = [(latency + i, {"preprocess": 0.5, "queue": 1.0 + i, "model": model_ms,
                              "postprocess": 0.2, "gateway": 3.0, "total": latency + i - 2},
                batch, "baseline") for i in range(n)]
    return endtoend.summarize(samples, Counter(), concurrency=concurrency, window=2.0,
                              per_request=1)


def test_report_derives_efficiency_latency_bottleneck_and_chart(inprocess, tmp_path):
    result = json.loads((inprocess / "bench.json").read_text())
    result["gateway"] = {arm: [_level(1, 20.0, 4.0, 1, 10), _level(8, 60.0, 40.0, 4, 20)]
                         for arm in ("baseline", "optimized")}
    result["gateway"]["optimized"][1]["inputs_per_s"] *= 2  # twice the baseline at c=8
    summary = report.derive(result)
    best = max((r for r in result["inprocess"] if r["arm"] == "baseline"),
               key=lambda r: r["throughput"])
    one = next(r for r in result["inprocess"] if r["arm"] == "baseline" and r["batch"] == 1)
    base = summary["arms"]["baseline"]
    assert base["saturation"]["concurrency"] == 8
    assert base["efficiency"] == pytest.approx(10.0 / best["throughput"])  # 20 ok over 2 s
    assert base["added_latency_ms"] == pytest.approx(result["gateway"]["baseline"][0]["p50_ms"]
                                                     - one["p50_ms"])
    # per request at c=8: model 40 ms / batch 4 = 10 ms beats gateway 3 and http ~2
    assert base["bottleneck"]["stage"] == "model"
    assert base["bottleneck"]["per_request_ms"]["model"] == pytest.approx(10.0)
    assert summary["speedup"]["saturation"] == pytest.approx(2.0)
    assert summary["speedup"]["at_p99_bound"]["ratio"] == pytest.approx(2.0)
    result["meta"]["ray_env"] = {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
                                 "RAY_SERVE_ENABLE_HA_PROXY": "1"}
    level = result["gateway"]["optimized"][1]
    roles = {"client": 1.94, "gateway": 2.05, "haproxy": 0.25, "model:optimized": 9.8}
    level["cpu"] = {"roles": roles, **cpu.summary(roles)}
    result["summary"] = summary
    table = report.markdown(result)
    assert "| baseline | 8 |" in table and "model (10.00 ms of each request)" in table
    assert ("Ray environment `RAY_SERVE_ENABLE_HA_PROXY=1`, `RAY_SERVE_THROUGHPUT_OPTIMIZED=1`"
            in table)
    assert "gateway topology remote" in table
    assert ("| optimized | 8 | gateway 2.05, haproxy 0.25, model:optimized 9.80 | 12.10 | 2.30 "
            "| – | 1.94 |") in table
    report.chart(result, tmp_path / "bench.png")
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_server_timing_parser():
    stages, batch = endtoend.parse_server_timing(
        'preprocess;dur=0.250, queue;dur=1.500, model;dur=3.000, total;dur=9.1, '
        'batch;desc="requests=3 items=7"')
    assert stages == {"preprocess": 0.25, "queue": 1.5, "model": 3.0, "total": 9.1}
    assert batch == 3
    assert endtoend.parse_server_timing("") == ({}, None)
    assert endtoend.parse_server_timing("model;dur=abc, batch;desc=x") == ({}, None)


@pytest.mark.parametrize("argv, message", [
    (["--url", "ftp://127.0.0.1:1", "--yes"], "bad --url"),
    (["--url", "http://10.1.2.3:8000", "--yes"], "loopback only"),
    (["--set", "no_such_setting=1"], "bad setting"),
    (["--set", "max_batch_size=0"], "bad setting"),
    (["--texts", "/no/such/set.jsonl", "--no-gateway"], "cannot read regression set"),
    (["--model-path", "/no/such/model", "--no-gateway"], "no model"),
])
def test_bad_input_is_a_clear_error(argv, message, capsys):
    assert bench.main([*argv, "--quiet", "--no-chart"]) == 2
    assert message in capsys.readouterr().err


def test_unreachable_gateway_is_a_clear_error(capsys):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    assert bench.main(["--url", url, "--yes", "--no-inprocess", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"cannot reach the gateway at {url}" in err


@pytest.mark.parametrize("argv", [
    ["--url", "http://127.0.0.1:8000"],  # changes a gateway's state: needs --yes
    ["--concurrency", "0"], ["--batch-sizes", "1,x"], ["--seconds", "0"], ["--arms", "canary"],
])
def test_bad_options_exit_2(argv):
    with pytest.raises(SystemExit) as exc:
        bench.main(argv)
    assert exc.value.code == 2


def test_render_rewrites_the_reports_from_json(inprocess, tmp_path, capsys):
    assert bench.main(["--render", str(inprocess / "bench.json"), "--out", str(tmp_path),
                       "--quiet"]) == 0
    assert (tmp_path / "bench.md").read_text() == (inprocess / "bench.md").read_text()
    (tmp_path / "broken.json").write_text("{not json")
    assert bench.main(["--render", str(tmp_path / "broken.json"), "--quiet"]) == 2
    assert "cannot render" in capsys.readouterr().err


def _loopback(reply: bytes):
    """A loopback HTTP/1.1 server in a thread of its own answering every request with `reply`;
    its URL, and a function that stops it."""
    import socketserver

    class Handler(socketserver.StreamRequestHandler):
        def handle(self):
            while head := self.rfile.readline():
                length = 0
                while head not in (b"\r\n", b""):
                    if head.lower().startswith(b"content-length:"):
                        length = int(head.split(b":")[1])
                    head = self.rfile.readline()
                self.rfile.read(length)
                self.wfile.write(reply)

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}", server.shutdown


def test_a_level_reads_server_timing_and_the_arm_from_each_answer():
    url, stop = _loopback(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Canary-Arm: baseline\r\n"
                          b"Server-Timing: queue;dur=1.5, total;dur=2.0, "
                          b'batch;desc="requests=2 items=2"\r\n\r\n{}')
    try:
        level = endtoend.load(url, ["a", "b"], 2, seconds=0.3, warmup=0.1, per_request=2)
    finally:
        stop()
    assert level["ok"] == level["sent"] > 0 and level["failed"] == {}
    assert level["arms"] == {"baseline": level["ok"]} and level["stages_ms"]["queue"] == 1.5
    assert level["batch_requests"] == {"2": level["ok"]} and level["inputs_per_request"] == 2


def test_a_shed_level_waits_its_retry_after_and_counts_the_refusals():
    url, stop = _loopback(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 2\r\n"
                          b"Retry-After: 5\r\n\r\n{}")
    try:
        level = endtoend.load(url, ["a"], 3, seconds=0.5, warmup=0.0)
    finally:
        stop()
    # each worker was refused once and waited the Retry-After to the end of the run
    assert level["sent"] == 3 and level["failed"] == {"503": 3} and level["ok"] == 0


def test_front_doors_bodies_and_the_cost_table():
    from ops.bench import front_doors

    named = front_doors.doors(["native", "openai", "oip"], "m")
    assert list(named) == ["native", "openai", "openai-base64", "oip", "oip-binary"]
    assert named["openai-base64"].body(["a"]) == {"input": ["a"], "model": "m",
                                                  "encoding_format": "base64"}
    assert named["oip-binary"].path == "/v2/models/m/infer"
    assert named["oip-binary"].body(["a", "b"])["inputs"][0]["shape"] == [2]
    assert named["oip-binary"].body(["a"])["parameters"] == {"binary_data_output": True}
    levels = iter([{"inputs_per_s": x, "p50_ms": 1.0, "p99_ms": 2.0, "failed": {}, "sent": 5}
                   for x in (100.0, 96.0, 98.0, 10.0, 104.0, 90.0)])  # in turn, rotating
    rows = front_doors.measure([(8, 8)], {k: named[k] for k in ("native", "openai")},
                               lambda c, size, door: next(levels), lambda line: None)
    assert [(r["door"], r["texts_per_s"], r["rounds"]) for r in rows] == [
        ("native", 100.0, [100.0, 10.0, 104.0]), ("openai", 96.0, [96.0, 98.0, 90.0])]
    table = front_doors.table(rows)  # medians: one disturbed round does not move them
    assert "| openai | 8 | 8 | 96 (96, 98, 90) | 0.960 |" in table


def test_each_doors_own_cpu_is_measured_on_the_real_doors():
    from ops.bench import front_doors

    named = front_doors.doors(["native", "openai", "oip"], "m")
    codec = front_doors.codec_us(named, 2, width=8, repeat=3)
    assert set(codec) == set(named)
    assert all(c["parse_us"] > 0 and c["answer_us"] > 0 for c in codec.values())
    # the raw encodings are smaller than JSON floats
    assert codec["openai-base64"]["answer_bytes"] < codec["openai"]["answer_bytes"]
    assert codec["oip-binary"]["answer_bytes"] < codec["oip"]["answer_bytes"]
    assert "| oip-binary |" in front_doors.codec_table(codec)


def test_a_level_through_another_door_posts_its_route_and_body():
    import socketserver

    seen: list[bytes] = []

    class Recorder(socketserver.StreamRequestHandler):
        def handle(self):
            while line := self.rfile.readline():
                seen.append(line)
                if line.lower().startswith(b"content-length:"):
                    while (rest := self.rfile.readline()) not in (b"\r\n", b""):
                        seen.append(rest)  # X-Routing-Key, the end of the head
                    seen.append(self.rfile.read(int(line.split(b":")[1])))
                    self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Recorder)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    door = endtoend.Door("/v1/embeddings", lambda texts: {"input": texts, "model": "m"})
    try:
        level = endtoend.load(f"http://127.0.0.1:{server.server_address[1]}", ["a"], 1,
                              seconds=0.2, warmup=0.0, door=door)
    finally:
        server.shutdown()
    assert level["ok"] == level["sent"] > 0
    assert seen[0].startswith(b"POST /v1/embeddings ") and b'{"input": ["a"], "model": "m"}' in seen


@pytest.mark.parametrize("argv", [["--protocol", "grpc"], ["--protocol", ","],
                                  ["--protocol", "openai", "--no-gateway"]])
def test_bad_protocol_options_exit_2(argv):
    with pytest.raises(SystemExit) as exc:
        bench.main(argv)
    assert exc.value.code == 2
