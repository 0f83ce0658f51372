"""The peers of one run: checked before anything starts, the ONNX folder built when one needs
it, each started in turn (ops.bench.peers.process) and all stopped when the run ends."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

from ops.bench.endtoend import BenchError
from ops.bench.peers import onnx_folder
from ops.bench.peers.install import missing
from ops.bench.peers.process import Running, server, sigterm_exits
from ops.bench.peers.registry import PEERS, Launch
from serve.ray_env import free_port


def check(names: list[str], infinity_venv: Path) -> None:
    """A BenchError saying how to install them unless every peer in `names` can start."""
    if message := missing(names, infinity_venv):
        raise BenchError(message)


@contextlib.contextmanager
def started(names: list[str], model_dir: Path, infinity_venv: Path, logs: Path,
            say: Callable[[str], None]) -> Iterator[dict[str, Running]]:
    """Every peer in `names` serving `model_dir`, by name, their logs in `logs`; all stopped
    and waited for on leaving, whatever happened."""
    python = infinity_venv / "bin" / "python"
    onnx_dir = None
    if any(PEERS[name].needs_onnx for name in names):
        onnx_dir = onnx_folder.build(model_dir, python, say)
    with sigterm_exits(), contextlib.ExitStack() as stack:
        running = {}
        for name in names:
            peer = PEERS[name]
            say(f"starting peer {name}: {peer.server}")
            launch = Launch(model_dir, free_port(), python, onnx_dir)
            running[name] = stack.enter_context(server(peer, launch, logs / f"{name}.log"))
            say(f"peer {name} ready at {running[name].url}")
        yield running
