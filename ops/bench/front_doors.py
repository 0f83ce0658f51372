"""`python -m ops.bench --protocol native,openai,oip`: what each front door
(serve.gateway.protocols) costs, measured in one run against the same app, arm (baseline), texts and
load generator.

Each protocol is measured in its variants: `native` (`POST /v1/predict`, task embed, JSON
floats), `openai` (`encoding_format: float`) and `openai-base64`, `oip` (JSON outputs) and
`oip-binary` (the binary tensor data extension for the outputs, `binary_data_output`). Cell
by cell (request size, concurrency) the doors run one after the other, `ROUNDS` times in turn,
each round starting at the next door, so that drift on a shared machine touches every door
alike; a door's texts/s is the median of its rounds (one disturbed round does not move it),
and its ratio is to the native door's in the same cell.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import httpx

from ops.bench.endtoend import BenchError, Door

PROTOCOLS = ("native", "openai", "oip")
ROUNDS = 3


def doors(protocols: list[str], model: str) -> dict[str, Door]:
    """The variants of each protocol asked for, by name (module docstring)."""
    infer = f"/v2/models/{model}/infer"

    def oip(binary: bool) -> Callable[[list[str]], dict]:
        return lambda texts: {
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(texts)],
                        "data": texts}], "outputs": [{"name": "embedding"}],
            "parameters": {"binary_data_output": binary}}

    every = {
        "native": {"native": Door("/v1/predict", lambda t: {"inputs": t, "task": "embed"})},
        "openai": {name: Door("/v1/embeddings", lambda t, f=fmt: {
            "input": t, "model": model, "encoding_format": f})
            for name, fmt in (("openai", "float"), ("openai-base64", "base64"))},
        "oip": {"oip": Door(infer, oip(False)), "oip-binary": Door(infer, oip(True))},
    }
    return {name: door for protocol in protocols for name, door in every[protocol].items()}


def served_model(url: str) -> str:
    """The served model's name, from `GET /v1/models`."""
    try:
        return httpx.get(f"{url}/v1/models", timeout=5).json()["data"][0]["id"]
    except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
        raise BenchError(f"{url}/v1/models did not name the served model: {exc}") from None


def measure(cells: list[tuple[int, int]], named: dict[str, Door],
            cell: Callable[[int, int, Door], dict], say) -> list[dict]:
    """Per (texts per request, concurrency) and door: its levels over `ROUNDS` rounds."""
    rows = []
    for size, concurrency in cells:
        levels: dict[str, list[dict]] = {name: [] for name in named}
        names = list(named)
        for k in range(ROUNDS):  # each round starts at another door: no door always first
            for name in names[k % len(names):] + names[:k % len(names)]:
                level = cell(concurrency, size, named[name])
                levels[name].append(level)
                say(f"door {name} c={concurrency}, {size} text(s) per request: "
                    f"{level['inputs_per_s']:.1f} texts/s, p99 {level['p99_ms']} ms, "
                    f"failed {level['failed']}")
        rows += [_row(name, size, concurrency, runs) for name, runs in levels.items()]
    return rows


def _row(name: str, size: int, concurrency: int, runs: list[dict]) -> dict:
    return {"door": name, "inputs_per_request": size, "concurrency": concurrency,
            "texts_per_s": round(statistics.median(r["inputs_per_s"] for r in runs), 1),
            "rounds": [round(r["inputs_per_s"], 1) for r in runs],
            "p50_ms": statistics.median(r["p50_ms"] or 0 for r in runs),
            "p99_ms": statistics.median(r["p99_ms"] or 0 for r in runs),
            "failed": sum(sum(r["failed"].values()) for r in runs),
            "sent": sum(r["sent"] for r in runs)}


def table(rows: list[dict]) -> str:
    """The cost table: each door's texts/s and its ratio to the native door's, per cell."""
    native = {(r["inputs_per_request"], r["concurrency"]): r["texts_per_s"]
              for r in rows if r["door"] == "native"}
    lines = ["| door | texts / request | concurrency | texts/s (rounds) | ÷ native | p50 ms | "
             "p99 ms | failed / sent |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        base = native.get((r["inputs_per_request"], r["concurrency"]))
        ratio = f"{r['texts_per_s'] / base:.3f}" if base else "–"
        rounds = ", ".join(f"{x:g}" for x in r["rounds"])
        lines.append(f"| {r['door']} | {r['inputs_per_request']} | {r['concurrency']} | "
                     f"{r['texts_per_s']:g} ({rounds}) | {ratio} | {r['p50_ms']:.1f} | "
                     f"{r['p99_ms']:.1f} | {r['failed']} / {r['sent']} |")
    return "\n".join(lines) + "\n"


def codec_us(named: dict[str, Door], size: int, width: int = 384, repeat: int = 300
             ) -> dict[str, dict[str, float]]:
    """Per door, the CPU microseconds (process time, so the machine's other load does not
    count) its parse of a request of `size` texts and its encoding of the answer (unit vectors
    of `width` floats, into the bytes sent) take in this process: the door's own share of a
    request, apart from everything the doors have in common."""
    import json
    import time

    import numpy as np
    from starlette.requests import Request

    from rollout.settings import AdmissionSettings
    from serve.gateway.protocols.door import FrontDoor, Served
    from serve.gateway.protocols.oip import OipDoor
    from serve.gateway.protocols.openai_api import OpenAIDoor

    served = Served(name="m", width=width, labels=("a", "b"), tasks=frozenset({"embed"}),
                    default_task="embed", max_tokens=256, version="fp32-x")
    limits = AdmissionSettings(_env_file=None, max_items=max(size, 1))
    kinds = {"native": FrontDoor, "openai": OpenAIDoor, "oip": OipDoor}
    by_door = {name: kinds[name.split("-")[0]](served, limits) for name in named}
    vectors = np.random.default_rng(0).standard_normal((size, width)).astype(np.float32)
    answer = {"outputs": [{"embedding": (v / np.linalg.norm(v)).tolist()} for v in vectors],
              "model_version": "fp32-x", "arm": "baseline"}
    texts = [f"a text of some words, number {i}" for i in range(size)]
    out = {}
    for name, door in named.items():
        impl = by_door[name]
        body = json.dumps(door.body(texts)).encode()
        request = Request({"type": "http", "headers": [], "path_params": {"name": "m"}})
        start = time.process_time()
        for _ in range(repeat):
            parsed = impl.parse(body, request)
        parse = time.process_time() - start
        start = time.process_time()
        for _ in range(repeat):
            impl.answer(answer, 10, parsed)
        out[name] = {"parse_us": round(parse / repeat * 1e6, 1),
                     "answer_us": round((time.process_time() - start) / repeat * 1e6, 1),
                     "answer_bytes": len(impl.answer(answer, 10, parsed).body)}
    return out


def codec_table(codec: dict[str, dict[str, float]]) -> str:
    """`codec_us` as a table: each door's own CPU per request and the answer's size."""
    lines = ["| door | parse µs | answer µs | answer bytes |", "| --- | --- | --- | --- |"]
    lines += [f"| {name} | {c['parse_us']:g} | {c['answer_us']:g} | {c['answer_bytes']} |"
              for name, c in codec.items()]
    return "\n".join(lines) + "\n"
