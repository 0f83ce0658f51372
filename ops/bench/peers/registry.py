"""What a peer server is to the benchmark (`Peer`), and the mapping from `--peer` names to them.

Adding a peer is one module that defines its `Peer` (how to start it on a port, its route and
body, how to read the vectors of an answer) and one line in `PEERS`; a family name in
`FAMILIES` (`infinity`) stands for several engines of one server.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ops.bench.endtoend import Door
from ops.bench.peers import infinity_peer, litserve_peer

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Launch:
    """What a peer's command line is made of: the packaged model folder, the model folder laid
    out as the hub ships it (with its ONNX int8 file; None until built), the loopback port, and
    the Python of Infinity's virtualenv."""

    model_dir: Path
    port: int
    infinity_python: Path
    onnx_dir: Path | None = None


@dataclass(frozen=True)
class Peer:
    """One peer server: `recipe` (`fp32` or `int8`) says which of the gateway's arms it is
    compared with (ops.bench.peers.ratio); `family` names its install (ops.bench.peers.install);
    `argv` starts it on `Launch.port`; `vectors` reads the embeddings of an answer."""

    name: str
    family: str
    server: str
    recipe: str
    route: str
    body: Callable[[list[str]], dict]
    argv: Callable[[Launch], list[str]]
    vectors: Callable[[dict], list[list[float]]]
    health: str = "/health"
    needs_onnx: bool = False

    @property
    def door(self) -> Door:
        return Door(self.route, self.body)


def _script(name: str, python: Path) -> list[str]:
    return [str(python), "-P", str(HERE / name)]  # -P: this folder never shadows a package


LITSERVE = Peer(
    name="litserve", family="litserve", recipe="fp32",
    server=f"LitServe {litserve_peer.VERSION} (torch fp32, max_batch_size "
           f"{litserve_peer.MAX_BATCH_SIZE}, batch_timeout {litserve_peer.BATCH_TIMEOUT_MS} ms)",
    route="/predict", body=litserve_peer.body, vectors=litserve_peer.vectors,
    argv=lambda at: [*_script("litserve_app.py", litserve_peer.python()),
                     *litserve_peer.arguments(at.model_dir, at.port)])
INFINITY_TORCH = Peer(
    name="infinity-torch", family="infinity", recipe="fp32",
    server=f"Infinity {infinity_peer.VERSION} (torch engine, fp32, batch "
           f"{infinity_peer.BATCH_SIZE})",
    route="/embeddings", body=infinity_peer.body, vectors=infinity_peer.vectors,
    argv=lambda at: [*_script("infinity_app.py", at.infinity_python),
                     *infinity_peer.torch_arguments(at.model_dir, at.port)])
INFINITY_ONNX = Peer(
    name="infinity-onnx", family="infinity", recipe="int8", needs_onnx=True,
    server=f"Infinity {infinity_peer.VERSION} (ONNX engine, onnx/{infinity_peer.ONNX_FILE}, "
           f"batch {infinity_peer.BATCH_SIZE})",
    route="/embeddings", body=infinity_peer.body, vectors=infinity_peer.vectors,
    argv=lambda at: [*_script("infinity_app.py", at.infinity_python),
                     *infinity_peer.onnx_arguments(at.onnx_dir, at.port)])

PEERS = {peer.name: peer for peer in (LITSERVE, INFINITY_TORCH, INFINITY_ONNX)}
FAMILIES = {"litserve": ("litserve",), "infinity": ("infinity-torch", "infinity-onnx")}


def expand(text: str) -> list[str]:
    """The peers of a `--peer` list, in `PEERS`' order: each item a peer's name or a family's;
    ValueError naming the choices for anything else or an empty list."""
    asked = [item.strip() for item in text.split(",") if item.strip()]
    unknown = [item for item in asked if item not in PEERS and item not in FAMILIES]
    if not asked or unknown:
        raise ValueError(f"--peer: a comma list of {', '.join([*FAMILIES, *PEERS])}"
                         + (f" (not {', '.join(unknown)})" if unknown else ""))
    names = {name for item in asked for name in FAMILIES.get(item, (item,))}
    return [name for name in PEERS if name in names]
