"""The Infinity peer: `infinity_emb v2 ARGS...`, run as its console script runs it, with one fix
for a model folder on disk.

    python -P infinity_app.py v2 --model-id DIR --engine optimum ...

Infinity 0.0.78's ONNX engine picks its file with `get_onnx_files`, which, for a folder on disk,
returns the file's absolute path, and hands that to Optimum's `from_pretrained(file_name=...)`;
Optimum 2 looks the name up among the folder's ONNX files by base name and fails ("Could not
find any ONNX files with target file name ..."), so the engine cannot load any folder on disk.
The fix passes the base name of the file Infinity chose, as it does for a hub repository;
which file is chosen, how it is loaded and how requests are served are Infinity's own. The torch
engine never calls it.

A script on its own, run with the Python of Infinity's virtualenv (ops.bench.peers, `-P`).
"""

import sys
from pathlib import Path

from infinity_emb.cli import cli
from infinity_emb.transformer.embedder import optimum as onnx_engine

_chosen = onnx_engine.get_onnx_files


def get_onnx_files(**kwargs) -> Path:
    """The file Infinity chose, by base name (module docstring)."""
    chosen = _chosen(**kwargs)
    print(f"infinity_app: Infinity chose {chosen}", file=sys.stderr, flush=True)
    return Path(chosen.name)


if __name__ == "__main__":
    onnx_engine.get_onnx_files = get_onnx_files
    sys.argv[0] = "infinity_emb"
    sys.exit(cli())
