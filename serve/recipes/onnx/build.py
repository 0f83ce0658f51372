"""An ONNX recipe for a `serve.recipes.variants.Variant`: export, calibrate, cache, load.

The variant supplies the source folder, its fp32 torch model (the reference the calibration
search compares against), its tokenizer and scoring (so the search judges exactly what the
server answers) and the settings. The decision returned is what the variant's version hashes:
recipe, runtime and its version, weight type, and the nodes kept in fp32.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from serve.recipes.artifact import artifact_root, load_or_build
from serve.recipes.cpu_flags import read_cpu_flags
from serve.recipes.onnx.calibrate import (
    Score,
    node_layers,
    quantizable,
    quantize,
    search,
    weight_type_for,
)
from serve.recipes.onnx.export import OPSET, export
from serve.recipes.onnx.session import OrtModel

log = logging.getLogger(__name__)
MODEL = "model.onnx"
SENSITIVITY_SAMPLE = 160  # calibration inputs each node's sensitivity is measured on


def _versions() -> dict:
    import onnx
    import onnxruntime
    import transformers

    return {"onnxruntime": onnxruntime.__version__, "onnx": onnx.__version__,
            "torch": torch.__version__, "transformers": transformers.__version__, "opset": OPSET}


def key_parts(variant, recipe: str, weights: str, calibration_digest: str | None) -> dict:
    """Everything that decides the artifact's bytes (and so its answers)."""
    parts = {"recipe": recipe, "weights": weights, "head": variant.has_head, **_versions()}
    if recipe == "onnx-int8":
        settings = variant.settings
        parts.update(
            weight_type=weight_type_for(read_cpu_flags()), set=calibration_digest,
            target=settings.recipe.int8_target_agreement,
            min_margin=settings.verify.verify_min_margin,
            labels=list(variant.labels), template=settings.model.label_template,
            max_tokens=variant.max_tokens,
        )
    return parts


def build(variant, recipe: str, source: Path, weights: str, progress=None
          ) -> tuple[OrtModel, dict]:
    """The ORT model of `recipe` for `variant` (whose `model` is still the fp32 torch model) and
    the decision its version hashes."""
    from serve.common.regression import load_set

    settings = variant.settings
    say = progress or (lambda line: log.info("onnx: %s", line))
    output = "logits" if variant.has_head else "last_hidden_state"
    threads = torch.get_num_threads()  # what the process gave torch: the replica's share
    calibration = None
    if recipe == "onnx-int8":
        regression = load_set(settings.verify.regression_set)  # texts only: labels play no part
        calibration = ([regression.examples[i].text for i in regression.calibration()],
                       regression.digest)
    parts = key_parts(variant, recipe, weights, calibration[1] if calibration else None)
    root = artifact_root(settings.recipe.onnx_dir)

    def make(work: Path) -> tuple[dict, dict]:
        say(f"exporting {source.name} to ONNX")
        fp32 = work / "fp32.onnx"
        export(source, fp32, has_head=variant.has_head)
        if recipe == "onnx-fp32":
            fp32.replace(work / MODEL)
            return {"kept": "all"}, {}
        texts, _ = calibration
        say("measuring each node's int8 sensitivity")
        found = search(fp32, work, weight_type=parts["weight_type"],
                       target=settings.recipe.int8_target_agreement,
                       known=_torch_sensitivity(variant, fp32, texts),
                       **_judges(variant, texts, output, threads), progress=say)
        quantize(fp32, work / MODEL, weight_type=found["weight_type"], keep=found["kept"])
        decision = {k: found[k] for k in ("weight_type", "per_channel", "kept")}
        return decision, found

    artifact = load_or_build(parts, root, make, (MODEL,))
    model = OrtModel(artifact.path, output=output, threads=threads, size_bytes=artifact.size_bytes,
                     manifest=artifact.manifest)
    decision = {"recipe": recipe, "runtime": f"onnxruntime {parts['onnxruntime']}",
                "graph_optimization": "all", **artifact.decision}
    say(f"{recipe} ready ({artifact.path.parent.name}, {artifact.size_bytes / 2**20:.1f} MiB)")
    return model, decision


def _torch_sensitivity(variant, graph: Path, texts: list[str]) -> dict[str, float]:
    """Each mappable node's int8 error, from one fp32 torch pass over the sensitivity sample
    (serve.recipes.onnx.calibrate, step 1)."""
    from serve.recipes.accuracy_aware import sensitivity
    from serve.recipes.eager import linear_names

    mapping = node_layers(quantizable(graph), linear_names(variant.model))
    if not mapping:
        return {}
    sample = texts[::max(1, len(texts) // SENSITIVITY_SAMPLE)]
    layers = sensitivity(variant.model, lambda model, batch: variant.rows(batch, model=model),
                         sample)
    return {node: sum(layers[name] for name in names) for node, names in mapping.items()}


def judge(variant, texts: list[str]):
    """`score(model) -> Score`: a candidate model's top-1 agreement with the fp32 torch model on
    `texts`, and its confident flips (fp32's margin at least `verify_min_margin`)."""
    from rollout.agreement import margins

    base = [margins(row) for row in variant.scores(variant.rows(texts)).tolist()]
    min_margin = variant.settings.verify.verify_min_margin

    def score(model) -> Score:
        rows = variant.rows(texts, model=model)
        found = [margins(row)[0] for row in variant.scores(rows).tolist()]
        flips = [b for b, top in zip(base, found, strict=True) if b[0] != top]
        confident = sum(margin >= min_margin for _, margin in flips)
        return Score(1 - len(flips) / len(texts), confident)

    return score


def _judges(variant, texts: list[str], output: str, threads: int) -> dict:
    """The search's two measures, against the fp32 torch model's rows of the same texts."""
    step = max(1, len(texts) // SENSITIVITY_SAMPLE)
    sample = texts[::step]
    sample_reference = variant.rows(sample)
    agreement = judge(variant, texts)

    def model_at(path: Path) -> OrtModel:
        return OrtModel(path, output=output, threads=threads, size_bytes=0)

    def error(path: Path) -> float:
        diff = variant.rows(sample, model=model_at(path)) - sample_reference
        return float(diff.pow(2).sum() / sample_reference.pow(2).sum().clamp(min=1e-12))

    return {"error": error, "score": lambda path: agreement(model_at(path))}


def build_recipe(variant, recipe: str, progress=None):
    """The registry's entry (serve.recipes): `build` of `recipe` on the variant's model
    folder."""
    return build(variant, recipe, variant.source, variant.weights, progress)
