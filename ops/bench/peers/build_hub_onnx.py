"""Builds a model folder laid out as the model's hub repository ships it for ONNX Runtime on
CPU: the folder's own files, and `onnx/model_qint8_avx512_vnni.onnx`, the dynamically quantized
int8 file, made the way Sentence Transformers made the hub's: the model exported to ONNX by
Optimum, then quantized by Optimum's `ORTQuantizer` with
`AutoQuantizationConfig.avx512_vnni(is_static=False)`
(`sentence_transformers.backend.export_dynamic_quantized_onnx_model`).

    python build_hub_onnx.py MODEL_DIR OUT_DIR

A script on its own, run with the Python of Infinity's virtualenv (it has Optimum, Sentence
Transformers and ONNX Runtime; this project's does not): it imports nothing of the project and
reads nothing from the network. `onnx/` holds that one file only: Infinity serves the last
`.onnx` file it lists when none is named `*quantize*`, and the file system decides that order.
Prints its progress; `built.json` records what built it.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from importlib import metadata
from pathlib import Path

FILE = "model_qint8_avx512_vnni.onnx"


def say(line: str) -> None:
    print(f"onnx int8: {line}", flush=True)


def build(source: Path, out: Path) -> None:
    began = time.monotonic()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    say(f"copying the model folder into {out}")
    shutil.copytree(source, out, ignore=shutil.ignore_patterns("onnx", "openvino", "__pycache__"))
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.backend import export_dynamic_quantized_onnx_model

    say("exporting the model to ONNX (fp32) with Optimum")
    model = SentenceTransformer(str(out), backend="onnx", device="cpu")
    say("quantizing it dynamically to int8 (ORTQuantizer, avx512_vnni)")
    export_dynamic_quantized_onnx_model(model, "avx512_vnni", str(out))
    folder = out / "onnx"
    for other in folder.iterdir():
        if other.name != FILE:
            other.unlink()
    if not (folder / FILE).is_file():
        raise SystemExit(f"onnx int8: {folder / FILE} was not written")
    versions = {name: metadata.version(name) for name in
                ("optimum", "optimum-onnx", "onnxruntime", "sentence-transformers",
                 "transformers", "torch")}
    (out / "built.json").write_text(json.dumps({
        "file": f"onnx/{FILE}", "source": str(source), "versions": versions,
        "quantization": "AutoQuantizationConfig.avx512_vnni(is_static=False)",
        "built_s": round(time.monotonic() - began, 1)}, indent=1) + "\n")
    say(f"done in {time.monotonic() - began:.0f} s: "
        f"{(folder / FILE).stat().st_size / 2**20:.1f} MiB")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    build(Path(sys.argv[1]), Path(sys.argv[2]))
