"""The model folder laid out as the model's hub repository ships it for Infinity's ONNX engine:
its files and `onnx/model_qint8_avx512_vnni.onnx`, built once from the packaged weights
(build_hub_onnx.py, in Infinity's virtualenv: nothing is downloaded) and cached outside the
repository, under `~/.cache/canary-gateway/peers/onnx/<key>`.

The key hashes every file of the model folder, the builder script and the Python that runs
it, so new weights or a new builder build again. A build happens in a private folder renamed
into place once `built.json` is written; a folder without it is never served. Infinity may add
files beside it when it serves (its own graph optimisation, when that succeeds).
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

from ops.bench.endtoend import BenchError
from ops.bench.peers.infinity_peer import ONNX_FILE
from serve.recipes.artifact import artifact_key, cache_root, file_digest

BUILDER = Path(__file__).resolve().parent / "build_hub_onnx.py"
BUILD_TIMEOUT_S = 900.0


def key(model_dir: Path, python: Path) -> str:
    """The cache key of `model_dir`'s folder built by `python` (module docstring)."""
    files = {str(path.relative_to(model_dir)): file_digest(path)
             for path in sorted(model_dir.rglob("*")) if path.is_file()}
    return artifact_key({"model": files, "builder": file_digest(BUILDER),
                         "python": str(python)})


def ready(folder: Path) -> bool:
    return (folder / "built.json").is_file() and (folder / "onnx" / ONNX_FILE).is_file()


def build(model_dir: Path, python: Path, say: Callable[[str], None],
          root: Path | None = None, timeout: float = BUILD_TIMEOUT_S) -> Path:
    """The cached folder of `model_dir`, built first when missing (its progress through
    `say`); a BenchError naming the log's last lines when the build fails or takes longer than
    `timeout` seconds."""
    root = root or cache_root() / "peers" / "onnx"
    folder = root / key(model_dir, python)
    if ready(folder):
        return folder
    say(f"building the ONNX int8 folder once into {folder} (Infinity's Optimum; ~1 min)")
    root.mkdir(parents=True, exist_ok=True)
    work = root / f".{folder.name}.build"
    shutil.rmtree(work, ignore_errors=True)
    lines = _run([str(python), "-P", str(BUILDER), str(model_dir), str(work)], say, timeout)
    if not ready(work):
        shutil.rmtree(work, ignore_errors=True)
        raise BenchError("building the ONNX int8 folder failed; its last lines:\n  "
                         + "\n  ".join(lines[-15:]))
    shutil.rmtree(folder, ignore_errors=True)
    work.rename(folder)
    return folder


def _run(argv: list[str], say: Callable[[str], None], timeout: float) -> list[str]:
    """Runs `argv`, passing its progress lines to `say`; every line it printed. Killed after
    `timeout` seconds."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True)
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line.rstrip())
            if line.startswith("onnx int8:"):
                say(line.rstrip())
        proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    if proc.returncode:
        lines.append(f"(exit status {proc.returncode}"
                     + (f"; killed after {timeout:.0f} s)" if proc.returncode < 0 else ")"))
    return lines
