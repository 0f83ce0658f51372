"""Infinity as a peer: its two engines' command lines, its OpenAI-style body and answer, and
where it is installed.

Infinity runs from a virtualenv of its own (`venv`): every infinity-emb release checked
(0.0.66 to 0.0.78) requires numpy<2, its server extra caps click, typer, rich and uvicorn below
this project's, and its optimum extra pulls transformers<4.58, so it cannot share the
gateway's. Both engines serve at most `BATCH_SIZE` texts per forward (its default), from the
model folder as it is (`torch`, fp32) or laid out as the model's hub repository ships it
(`optimum`, the ONNX int8 file built by ops.bench.peers.onnx_folder). The on-disk vector cache
stays off (its default), so repeated texts are computed every time, as the gateway computes
them.
"""

from __future__ import annotations

from pathlib import Path

from serve.recipes.artifact import cache_root

VERSION = "0.0.78"
TORCH = "torch==2.13.0"  # the gateway's torch, CPU build (never a CUDA one)
REQUIREMENT = f"infinity-emb[server,optimum,torch]=={VERSION}"
BATCH_SIZE = 32
ONNX_FILE = "model_qint8_avx512_vnni.onnx"
MODEL_NAME = "peer"  # --served-model-name, the body's `model`


def venv() -> Path:
    """The default virtualenv of Infinity: `~/.cache/canary-gateway/peers/infinity-<VERSION>`."""
    return cache_root() / "peers" / f"infinity-{VERSION}"


def _common(port: int) -> list[str]:
    return ["--served-model-name", MODEL_NAME, "--device", "cpu",
            "--batch-size", str(BATCH_SIZE), "--no-vector-disk-cache",
            "--host", "127.0.0.1", "--port", str(port)]


def torch_arguments(model_dir: Path, port: int) -> list[str]:
    return ["v2", "--model-id", str(model_dir), "--engine", "torch", "--dtype", "float32",
            *_common(port)]


def onnx_arguments(onnx_dir: Path | None, port: int) -> list[str]:
    if onnx_dir is None:
        raise ValueError("the ONNX engine needs the hub-layout folder (onnx_folder.build)")
    return ["v2", "--model-id", str(onnx_dir), "--engine", "optimum", *_common(port)]


def body(texts: list[str]) -> dict:
    return {"model": MODEL_NAME, "input": texts}


def vectors(answer: dict) -> list[list[float]]:
    return [row["embedding"] for row in sorted(answer["data"], key=lambda row: row["index"])]
