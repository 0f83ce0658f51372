"""Whether the peers asked for are installed, and if not, exactly how to install them.

LitServe comes from this project's `peers` extra, into its own virtualenv. Infinity cannot
share that virtualenv (ops.bench.peers.infinity_peer) and gets one of its own, with the
gateway's torch (the CPU build) installed first so that Infinity's torch requirement is met by
it and never pulls a CUDA build.
"""

from __future__ import annotations

import importlib.util
import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path

from ops.bench.peers import infinity_peer, litserve_peer
from ops.bench.peers.registry import PEERS


def litserve_commands() -> list[str]:
    return ["pip install -e '.[peers]'   # in this project's virtualenv, from its folder"]


def infinity_commands(venv: Path) -> list[str]:
    pip = shlex.quote(str(venv / "bin" / "pip"))
    return [f"python -m venv {shlex.quote(str(venv))}",
            f"{pip} install {infinity_peer.TORCH}   # the CPU build; where it is not on disk, "
            "add --index-url https://download.pytorch.org/whl/cpu",
            f"{pip} install '{infinity_peer.REQUIREMENT}'"]


def infinity_version(python: Path, timeout: float = 60.0) -> str | None:
    """The infinity-emb version installed for `python`, None when there is none."""
    if not python.is_file():
        return None
    try:
        done = subprocess.run(
            [str(python), "-c", "import importlib.metadata as m; print(m.version('infinity-emb'))"],
            capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


def missing(names: list[str], infinity_venv: Path,
            find: Callable[[str], object] = importlib.util.find_spec) -> str | None:
    """None when every peer in `names` can start; else the message that says what is missing
    and the commands that install it."""
    families = {PEERS[name].family for name in names}
    parts = []
    if "litserve" in families and find("litserve") is None:
        parts.append((f"LitServe {litserve_peer.VERSION} is not installed here",
                      litserve_commands()))
    if "infinity" in families:
        found = infinity_version(infinity_venv / "bin" / "python")
        if found != infinity_peer.VERSION:
            what = (f"has infinity-emb {found}" if found
                    else "is missing or has no infinity-emb")
            parts.append((f"Infinity {infinity_peer.VERSION}: the virtualenv {infinity_venv} "
                          f"{what} (Infinity needs numpy<2 and transformers<4.58, so it gets a "
                          "virtualenv of its own; --infinity-venv names another)",
                          infinity_commands(infinity_venv)))
    if not parts:
        return None
    lines = ["--peer: the peer servers are not installed:"]
    for why, commands in parts:
        lines += [f"  {why}; install with", *(f"    {command}" for command in commands)]
    return "\n".join(lines)
