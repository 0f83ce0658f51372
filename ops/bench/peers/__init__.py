"""The peer servers `python -m ops.bench --peer litserve,infinity` measures the gateway against:
the same model folder behind servers a team would otherwise pick, each started here as a
subprocess on loopback, loaded by the same load library, cell by cell beside plain Serve and
the gateway's arms (task `embed`).

- `litserve`: LitServe, fp32 torch, its documented batching (litserve_peer, litserve_app.py);
- `infinity` stands for `infinity-torch` (its torch engine, fp32) and `infinity-onnx` (its ONNX
  engine on the model folder laid out as the hub ships it, serving its int8 file)
  (infinity_peer, infinity_app.py, onnx_folder, build_hub_onnx.py).

Modules: `registry` (what a peer is; the name → peer mapping), `install` (what is missing and
how to install it), `process` (one peer as a bounded subprocess), `lineup` (a run's peers,
started and stopped), `ratio` (gateway ÷ the fastest peer per cell).
"""

from ops.bench.peers.lineup import check, started
from ops.bench.peers.ratio import compare, geomeans, table
from ops.bench.peers.registry import PEERS, expand

__all__ = ["PEERS", "check", "compare", "expand", "geomeans", "started", "table"]
