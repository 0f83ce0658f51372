"""Which MatMuls of the fused graph run in int8: a calibration search, like
serve.recipes.accuracy_aware's.

Algorithm (deterministic for given weights, calibration split and settings):

1. **Sensitivity.** Each quantizable node (the fused attention's QKV projection, the attention
   output, the FFN's two MatMuls) gets an error on a sample of the calibration split: where the
   node maps to torch Linear layers (`node_layers`), one fp32 torch pass measures each layer's
   int8 output error against its fp32 output (serve.recipes.accuracy_aware.sensitivity; a fused
   attention sums its query, key and value); a node that maps to none is measured in ONNX Runtime,
   as the relative squared error of the model's output rows with only that node in int8. The torch
   pass takes seconds where a graph per node takes minutes; its ranking only orders the
   search, which measures every candidate graph in ONNX Runtime itself.
2. **Search.** Nodes are ranked from most to least sensitive. Keeping the `k` most sensitive in
   fp32 and the rest in int8, agreement on the whole calibration split is (nearly) monotone in
   `k`; a binary search finds the smallest `k` whose graph reaches `target` top-1 agreement with
   no confident flip (a flip where fp32's margin is at least `min_margin`). Fewest fp32 nodes =
   the most int8 = the most speed the target allows.

Weights are int8 per output channel, activations uint8 per tensor, computed per call. The weight
type follows the CPU: signed (U8S8) where it has VNNI (AVX512-VNNI, AVX-VNNI or AMX), whose
instructions take it at full speed; unsigned (U8U8) elsewhere, because AVX2's U8S8 path can
saturate its 16-bit sums (ONNX Runtime's quantization guide). The weight type is part of the
artifact's key and of the variant's version.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)
OP_TYPES = ("MatMul", "Attention")  # embeddings and LayerNorms stay fp32
VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})


@dataclass(frozen=True)
class Score:
    agreement: float
    confident_flips: int

    def reaches(self, target: float) -> bool:
        return self.agreement >= target and self.confident_flips == 0


def weight_type_for(flags: Iterable[str]) -> str:
    """`s8` (U8S8) with VNNI, `u8` (U8U8) without, given the CPU's flags
    (serve.recipes.cpu_flags.read_cpu_flags): see the module docstring."""
    return "s8" if VNNI_FLAGS.intersection(flags) else "u8"


def quantizable(path: Path) -> list[str]:
    """Names of the nodes dynamic quantization would make int8: MatMuls with a constant weight
    and fused Attention nodes, in graph order."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    constants = {init.name for init in graph.initializer}
    names = []
    for node in graph.node:
        if node.op_type == "Attention" or (
            node.op_type == "MatMul" and len(node.input) > 1 and node.input[1] in constants
        ):
            names.append(node.name)
    return names


def quantize(source: Path, dest: Path, *, weight_type: str, keep: list[str] = (),
             only: list[str] | None = None) -> None:
    """Dynamic int8 of `source` into `dest`: every quantizable node (or `only` those) but `keep`."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with _quiet_root():
        quantize_dynamic(
            str(source), str(dest), per_channel=True,
            weight_type=QuantType.QInt8 if weight_type == "s8" else QuantType.QUInt8,
            op_types_to_quantize=list(OP_TYPES), nodes_to_quantize=list(only or []),
            nodes_to_exclude=list(keep), extra_options={"DefaultTensorType": 1},  # 1: float
        )


@contextlib.contextmanager
def _quiet_root():
    """ORT's quantizer warns "consider pre-processing" on the root logger at every call; the
    root level is restored afterwards (the process's logging is not ours to change)."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def node_layers(nodes: list[str], layers: list[str]) -> dict[str, list[str]]:
    """The torch Linear layers (names as `model.named_modules` gives them) each ONNX node
    computes: a MatMul exported from `encoder.layer.0.output.dense` is named
    `/model/encoder/layer.0/output/dense/MatMul`; the k-th fused Attention node holds layer
    k's query, key and value. Nodes that map to nothing are left out."""
    found = {}
    known = set(layers)
    for node in nodes:
        name = node.removesuffix("/MatMul").strip("/").replace("/", ".").removeprefix("model.")
        if name in known:
            found[node] = [name]
    attention = [node for node in nodes if not node.startswith("/")]
    groups = sorted({name.rsplit(".attention.self.", 1)[0] for name in layers
                     if ".attention.self." in name},
                    key=lambda prefix: [int(p) if p.isdigit() else p for p in prefix.split(".")])
    if len(groups) == len(attention):
        for node, prefix in zip(attention, groups, strict=True):
            found[node] = [f"{prefix}.attention.self.{p}" for p in ("query", "key", "value")
                           if f"{prefix}.attention.self.{p}" in known]
    return found


def search(source: Path, work: Path, *, weight_type: str, target: float,
           error: Callable[[Path], float], score: Callable[[Path], Score],
           known: dict[str, float] | None = None,
           progress: Callable[[str], None] | None = None) -> dict:
    """Steps 1 and 2 of the module docstring on the fp32 graph `source`; the decision, with the
    measurements that led to it. `known` holds the nodes' errors measured in torch; `error(path)`
    runs a graph on the sensitivity sample (for the other nodes), `score` on the whole
    calibration split. Candidate graphs are written into `work`."""
    say = progress or (lambda _line: None)
    nodes = quantizable(source)
    errors = {node: known[node] for node in nodes if known and node in known}
    in_torch = sorted(errors)
    for i, node in enumerate(node for node in nodes if node not in errors):
        probe = work / "probe.onnx"
        quantize(source, probe, weight_type=weight_type, only=[node])
        errors[node] = error(probe)
        say(f"sensitivity in ONNX Runtime {i + 1}: {node} {errors[node]:.2e}")
    ranked = sorted(nodes, key=lambda name: (-errors[name], name))
    tried: dict[int, Score] = {}

    def try_keep(k: int) -> Score:
        if k not in tried:
            candidate = work / f"keep{k}.onnx"
            quantize(source, candidate, weight_type=weight_type, keep=ranked[:k])
            tried[k] = score(candidate)
            say(f"keep {k} fp32: agreement {tried[k].agreement:.4f}, "
                f"{tried[k].confident_flips} confident flips")
        return tried[k]

    # invariant: keeping `high` nodes reaches the target (keeping all of them is fp32)
    low, high = 0, len(ranked)
    while low < high:
        middle = (low + high) // 2
        if try_keep(middle).reaches(target):
            high = middle
        else:
            low = middle + 1
    final = try_keep(high) if high < len(ranked) else Score(1.0, 0)
    return {
        "weight_type": weight_type, "per_channel": True, "kept": ranked[:high],
        "int8": sorted(ranked[high:]), "target": target,
        "calibration": {"agreement": final.agreement, "confident_flips": final.confident_flips},
        "tried": {str(k): [round(s.agreement, 6), s.confident_flips]
                  for k, s in sorted(tried.items())},
        "sensitivity": {name: float(f"{errors[name]:.4g}") for name in ranked},
        "sensitivity_in_torch": in_torch,
    }
