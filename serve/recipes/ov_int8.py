"""The `ov-int8` recipe: the model quantized by NNCF and run by OpenVINO's int8 CPU kernels.

OpenVINO is Intel's inference runtime; NNCF its quantizer. The model is exported to ONNX
(serve.recipes.onnx.export, unfused: OpenVINO fuses it itself) and read by OpenVINO, and NNCF
quantizes every MatMul with a constant weight to int8 (weights per channel, activations per
tensor with ranges from calibration), after SmoothQuant, which moves activation outliers into
the weights by a per-channel scale whose strength is `alpha`. Which alpha, and which layers
stay fp32, is searched on the set's calibration split, like `onnx-int8`:

1. **Alpha.** `ALPHAS` are tried in order with every layer int8; the first whose model reaches
   `int8_target_agreement` top-1 agreement with fp32 and no confident flip (baseline margin
   at least `verify_min_margin`) is kept.
2. **Layers.** When none reaches it, the alpha that agreed most is kept and the torch Linear
   layers are ranked by int8 sensitivity (serve.recipes.accuracy_aware.sensitivity); a binary search
   finds the fewest most-sensitive layers to keep in fp32 that reach the target (keeping all is
   fp32).

Calibration statistics come from `CALIBRATION_ROWS` inputs of the split, padded as the server
pads them. The result is cached on disk under a key of the weights, the library versions and
these settings (serve.recipes.artifact), checked by digest on every load, and rebuilt when corrupt
or stale. It runs at fp32 precision outside the int8 layers (`PRECISION_HINT`: OpenVINO would
otherwise pick bf16 on CPUs with AMX), on the process's torch thread count (the replica's
share), one stream, unpinned. Tokenizer, pooling and label embeddings stay with
`serve.recipes.variants.Variant`. OpenVINO's and NNCF's usage telemetry is declined for the build
(it would write under ~/intel and try the network).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from serve.recipes.artifact import artifact_root, load_or_build

log = logging.getLogger(__name__)
RECIPE = "ov-int8"
FILES = ("model.xml", "model.bin")
ALPHAS = (0.8, 0.7, 0.9, 0.6, 0.95)  # SmoothQuant strengths, in the order tried
CALIBRATION_ROWS = 320  # calibration inputs NNCF collects activation ranges on
CALIBRATION_BATCH = 8
PRECISION_HINT = "f32"


class OvModel:
    """`model(input_ids=..., attention_mask=...)` -> an object with `last_hidden_state` or
    `logits` (float32 torch tensors), as the torch model it replaces."""

    def __init__(self, source, *, output: str, threads: int, size_bytes: int,
                 manifest: dict | None = None):
        self.source, self.manifest = source, manifest or {}  # an ov.Model or its .xml path
        self.output, self.size_bytes = output, size_bytes
        self._lock = threading.Lock()  # an infer request runs one call at a time
        self.resize(threads)

    def resize(self, threads: int) -> None:
        """Recompiled on `threads` threads (a compiled model's count is fixed)."""
        core = runtime().Core()
        model = core.read_model(str(self.source)) if isinstance(self.source, Path) else self.source
        compiled = core.compile_model(model, "CPU", {
            "INFERENCE_NUM_THREADS": max(1, threads), "NUM_STREAMS": 1,
            "PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": PRECISION_HINT,
            "ENABLE_CPU_PINNING": False,  # replicas share the machine's cores
        })
        with self._lock:
            self.request = compiled.create_infer_request()
            self.threads = threads

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> SimpleNamespace:
        feed = {"input_ids": input_ids.numpy().astype(np.int64, copy=False),
                "attention_mask": attention_mask.numpy().astype(np.int64, copy=False)}
        with self._lock:
            out = self.request.infer(feed)[0].copy()  # the request reuses its output buffer
        return SimpleNamespace(**{self.output: torch.from_numpy(out)})


def runtime():
    """The `openvino` module, imported with its usage telemetry declined."""
    with _telemetry_declined():
        import openvino
    return openvino


@contextlib.contextmanager
def _telemetry_declined():
    """`import openvino` (its converter) and `import nncf` ask openvino-telemetry for consent;
    both decline in CI (`CI=true`, `NNCF_CI`), which is what they are told here, for the import
    only (the process's environment is restored)."""
    saved = {name: os.environ.get(name) for name in ("CI", "NNCF_CI")}
    os.environ.update(CI="true", NNCF_CI="1")
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _versions() -> dict:
    import onnx
    import transformers

    with _telemetry_declined():
        import nncf
    from serve.recipes.onnx.export import OPSET

    return {"openvino": runtime().get_version(), "nncf": nncf.__version__, "onnx": onnx.__version__,
            "torch": torch.__version__, "transformers": transformers.__version__, "opset": OPSET}


def key_parts(variant, weights: str, calibration_digest: str) -> dict:
    """Everything that decides the artifact's bytes (and so its answers)."""
    settings = variant.settings
    return {"recipe": RECIPE, "weights": weights, "head": variant.has_head, **_versions(),
            "set": calibration_digest, "target": settings.recipe.int8_target_agreement,
            "min_margin": settings.verify.verify_min_margin, "labels": list(variant.labels),
            "template": settings.model.label_template, "max_tokens": variant.max_tokens,
            "alphas": list(ALPHAS), "rows": CALIBRATION_ROWS, "precision": PRECISION_HINT}


def layer_of(node: str) -> str | None:
    """The torch Linear a MatMul of the exported graph computes (`/encoder/layer.0/output/dense/
    MatMul` -> `encoder.layer.0.output.dense`), or None for a node that is not one."""
    if not node.endswith("/MatMul") or not node.startswith("/"):
        return None
    return node.removesuffix("/MatMul").strip("/").replace("/", ".").removeprefix("model.")


def build(variant, source: Path, weights: str, progress=None) -> tuple[OvModel, dict]:
    """The int8 OpenVINO model for `variant` (whose `model` is still the fp32 torch model) and
    the decision its version hashes."""
    from serve.common.regression import load_set

    say = progress or (lambda line: log.info("openvino: %s", line))
    output = "logits" if variant.has_head else "last_hidden_state"
    threads = torch.get_num_threads()
    # texts only: labels play no part
    regression = load_set(variant.settings.verify.regression_set)
    texts = [regression.examples[i].text for i in regression.calibration()]
    parts = key_parts(variant, weights, regression.digest)

    def make(work: Path) -> tuple[dict, dict]:
        found = _search(variant, source, work, texts, output, threads, say)
        runtime().save_model(found.pop("model"), str(work / FILES[0]), compress_to_fp16=False)
        decision = {k: found[k] for k in ("smooth_quant_alpha", "kept")}
        return decision, found

    artifact = load_or_build(parts, artifact_root(variant.settings.recipe.onnx_dir), make,
                             FILES)
    model = OvModel(artifact.path, output=output, threads=threads,
                    size_bytes=artifact.size_bytes, manifest=artifact.manifest)
    decision = {"recipe": RECIPE, "runtime": f"openvino {parts['openvino']}",
                "nncf": parts["nncf"], "precision_hint": PRECISION_HINT, **artifact.decision}
    say(f"{RECIPE} ready ({artifact.path.parent.name}, {artifact.size_bytes / 2**20:.1f} MiB)")
    return model, decision


def _search(variant, source: Path, work: Path, texts: list[str], output: str, threads: int,
            say) -> dict:
    """Steps 1 and 2 of the module docstring; the decision, the measurements that led to it,
    and the chosen model (key `model`)."""
    from serve.recipes.onnx.build import judge
    from serve.recipes.onnx.export import export

    say(f"exporting {source.name} to ONNX for OpenVINO")
    export(source, work / "fp32.onnx", has_head=variant.has_head, fuse=False)
    graph = runtime().Core().read_model(str(work / "fp32.onnx"))
    layers = {node.get_friendly_name(): layer_of(node.get_friendly_name())
              for node in graph.get_ordered_ops() if node.get_type_name() == "MatMul"}
    step = max(1, len(texts) // CALIBRATION_ROWS)
    data = [_feed(variant, texts[i:i + CALIBRATION_BATCH * step:step])
            for i in range(0, len(texts), CALIBRATION_BATCH * step)]
    score = judge(variant, texts)
    target = variant.settings.recipe.int8_target_agreement
    tried: list[dict] = []  # in the order tried

    def attempt(alpha: float, keep: list[str]):
        model = _quantize(graph, data, alpha, [n for n, layer in layers.items() if layer in keep])
        result = score(OvModel(model, output=output, threads=threads, size_bytes=0))
        tried.append({"alpha": alpha, "kept": len(keep), "agreement": round(result.agreement, 6),
                      "confident_flips": result.confident_flips})
        say(f"alpha {alpha}, {len(keep)} layers fp32: agreement {result.agreement:.4f}, "
            f"{result.confident_flips} confident flips")
        return model, result

    best = None
    for alpha in ALPHAS:
        model, result = attempt(alpha, [])
        if result.reaches(target):
            return _found(model, alpha, [], result, tried)
        if best is None or (result.confident_flips, -result.agreement) < (
                best[1].confident_flips, -best[1].agreement):
            best = (alpha, result)
    alpha = best[0]
    ranked = _ranked(variant, texts, {layer for layer in layers.values() if layer})
    low, high, chosen = 0, len(ranked), None  # keeping all `high` layers is fp32: it reaches
    while low < high:
        middle = (low + high) // 2
        model, result = attempt(alpha, ranked[:middle])
        if result.reaches(target):
            high, chosen = middle, (model, result)
        else:
            low = middle + 1
    if chosen is None:  # only fp32 everywhere reaches the target
        model, result = attempt(alpha, ranked)
        chosen = (model, result)
    return _found(chosen[0], alpha, ranked[:high], chosen[1], tried)


def _found(model, alpha: float, kept: list[str], result, tried: list[dict]) -> dict:
    return {"model": model, "smooth_quant_alpha": alpha, "kept": sorted(kept),
            "calibration": {"agreement": result.agreement,
                            "confident_flips": result.confident_flips},
            "tried": tried}


def _feed(variant, texts: list[str]) -> dict:
    ids, mask = variant._collate(variant.encode(texts).ids)
    return {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}


def _quantize(graph, data: list[dict], alpha: float, keep: list[str]):
    with _telemetry_declined():
        import nncf
    from nncf.quantization.advanced_parameters import (
        AdvancedQuantizationParameters,
        AdvancedSmoothQuantParameters,
    )

    advanced = AdvancedQuantizationParameters(
        smooth_quant_alphas=AdvancedSmoothQuantParameters(matmul=alpha))
    with _quiet_nncf():
        return nncf.quantize(graph, nncf.Dataset(data), model_type=nncf.ModelType.TRANSFORMER,
                             subset_size=len(data), ignored_scope=nncf.IgnoredScope(names=keep),
                             advanced_parameters=advanced)


@contextlib.contextmanager
def _quiet_nncf():
    """NNCF logs each step at INFO and draws progress bars on standard output, where they would
    corrupt a command's output (`rollout verify --json`): its log is quieted and its output
    goes to standard error; the build reports its own progress."""
    logger = logging.getLogger("nncf")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        logger.setLevel(level)


def _ranked(variant, texts: list[str], layers: set[str]) -> list[str]:
    """The graph's torch Linear layers, most int8-sensitive first
    (serve.recipes.accuracy_aware.sensitivity on a sample of the calibration split)."""
    from serve.recipes.accuracy_aware import sensitivity
    from serve.recipes.onnx.build import SENSITIVITY_SAMPLE

    sample = texts[::max(1, len(texts) // SENSITIVITY_SAMPLE)]
    errors = sensitivity(variant.model, lambda model, batch: variant.rows(batch, model=model),
                         sample)
    return sorted((name for name in errors if name in layers), key=lambda n: (-errors[n], n))


def build_recipe(variant, recipe: str, progress=None) -> tuple[OvModel, dict]:
    """The registry's entry (serve.recipes): `build` on the variant's model folder."""
    return build(variant, variant.source, variant.weights, progress)
