"""The ONNX Runtime recipes on the tiny encoder: export, calibrate, cache, load, warm."""

import json

import pytest
import torch

from rollout import Settings
from serve.common.batching import PAD_WIDTHS
from serve.recipes.artifact import MANIFEST, artifact_key, check, load_or_build
from serve.recipes.cpu_flags import read_cpu_flags
from serve.recipes.onnx import OrtModel
from serve.recipes.onnx.build import MODEL
from serve.recipes.onnx.calibrate import Score, node_layers, quantizable, weight_type_for
from serve.recipes.source import variant_version, weights_digest
from serve.recipes.variants import Variant
from tests.tiny_model import make_tiny_encoder
from tests.variant_settings import groups

TEXTS = ["a short one", "a somewhat longer input sentence for the encoder", "third", "x " * 40]


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory):
    return make_tiny_encoder(tmp_path_factory.mktemp("enc"))


@pytest.fixture(scope="module")
def onnx_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("onnx")


def _settings(encoder_dir, onnx_dir, recipe, **extra):
    return Settings(model_path=str(encoder_dir), labels=("cats", "dogs", "cars"),
                    optimized_recipe=recipe, onnx_dir=str(onnx_dir), torch_threads=1, **extra)


@pytest.fixture(scope="module")
def baseline(encoder_dir, onnx_dir):
    return Variant(groups(_settings(encoder_dir, onnx_dir, "onnx-fp32")), "baseline")


@pytest.fixture(scope="module")
def int8(encoder_dir, onnx_dir):
    return Variant(groups(_settings(encoder_dir, onnx_dir, "onnx-int8")), "optimized")


def _artifact_folder(variant):
    return variant.model.path.parent


def test_fp32_graph_answers_as_torch_does(baseline, encoder_dir, onnx_dir):
    opt = Variant(groups(_settings(encoder_dir, onnx_dir, "onnx-fp32")), "optimized")
    assert isinstance(opt.model, OrtModel) and opt.model.threads == torch.get_num_threads()
    assert torch.allclose(baseline.rows(TEXTS), opt.rows(TEXTS), atol=1e-4)
    assert opt.version.startswith("onnx-fp32-")
    assert opt.decision["runtime"].startswith("onnxruntime ")


def test_int8_is_calibrated_and_its_decision_is_versioned(baseline, int8):
    manifest = int8.model.manifest
    decision = manifest["decision"]
    assert decision["weight_type"] == weight_type_for(read_cpu_flags())
    nodes = quantizable(int8.model.path.parent / MODEL)  # what stayed float in the int8 graph
    assert set(decision["kept"]) <= set(manifest["evidence"]["sensitivity"])
    assert len(manifest["evidence"]["sensitivity"]) == 8  # 2 layers: QKV, out, FFN in, FFN out
    # every node mapped to its torch Linear layers: one torch pass ranked them all
    evidence = manifest["evidence"]
    assert evidence["sensitivity_in_torch"] == sorted(evidence["sensitivity"])
    assert sorted(nodes) == sorted(decision["kept"])
    assert manifest["evidence"]["calibration"]["confident_flips"] == 0
    assert manifest["evidence"]["calibration"]["agreement"] >= 0.99
    rows = int8.rows(TEXTS)
    assert rows.shape == baseline.rows(TEXTS).shape
    assert torch.allclose(rows.norm(dim=-1), torch.ones(len(TEXTS)), atol=1e-4)
    other = dict(int8.decision, weight_type="u8" if decision["weight_type"] == "s8" else "s8")
    assert variant_version(int8.weights, "onnx-int8", decision=other) != int8.version


def test_cached_artifact_is_loaded_not_rebuilt(int8, encoder_dir, onnx_dir, monkeypatch):
    def no_export(*_a, **_k):
        raise AssertionError("the cached artifact should have been used")

    monkeypatch.setattr("serve.recipes.onnx.build.export", no_export)
    again = Variant(groups(_settings(encoder_dir, onnx_dir, "onnx-int8")), "optimized")
    assert again.version == int8.version
    assert _artifact_folder(again) == _artifact_folder(int8)


@pytest.mark.parametrize("damage", ["flip a byte", "drop the model", "other format", "bad json"])
def test_corrupt_or_stale_artifact_is_rebuilt_not_served(damage, encoder_dir, tmp_path):
    settings = _settings(encoder_dir, tmp_path, "onnx-fp32")
    first = Variant(groups(settings), "optimized")
    folder = _artifact_folder(first)
    model, manifest = folder / MODEL, folder / MANIFEST
    if damage == "flip a byte":
        data = bytearray(model.read_bytes())
        data[len(data) // 2] ^= 0xFF
        model.write_bytes(bytes(data))
    elif damage == "drop the model":
        model.unlink()
    elif damage == "other format":
        manifest.write_text(json.dumps(dict(json.loads(manifest.read_text()), format=0)))
    else:
        manifest.write_text("{not json")
    with pytest.raises(ValueError):
        check(folder, folder.name, (MODEL,))
    again = Variant(groups(settings), "optimized")
    check(folder, folder.name, (MODEL,))  # rebuilt in place, and trustworthy again
    assert again.version == first.version
    assert torch.allclose(again.rows(TEXTS), first.rows(TEXTS), atol=1e-5)


def test_load_or_build_writes_atomically_and_keeps_nothing_else(tmp_path):
    calls = []

    def build(work):
        calls.append(work)
        (work / MODEL).write_bytes(b"graph")
        (work / "scratch.onnx").write_bytes(b"tmp")
        return {"kept": []}, {"note": 1}

    parts = {"recipe": "x"}
    first = load_or_build(parts, tmp_path, build, (MODEL,))
    assert first.path.read_bytes() == b"graph" and first.decision == {"kept": []}
    assert sorted(p.name for p in first.path.parent.iterdir()) == [MANIFEST, MODEL]
    assert load_or_build(parts, tmp_path, build, (MODEL,)).manifest == first.manifest
    assert len(calls) == 1
    assert [p.name for p in tmp_path.iterdir()] == [artifact_key(parts)]  # no build folder left


def test_failed_build_leaves_nothing_behind(tmp_path):
    def build(work):
        (work / MODEL).write_bytes(b"half")
        raise RuntimeError("export failed")

    with pytest.raises(RuntimeError, match="export failed"):
        load_or_build({"recipe": "x"}, tmp_path, build, (MODEL,))
    assert list(tmp_path.iterdir()) == []


def test_classifier_head_exports_its_logits(tmp_path):
    source = make_tiny_encoder(tmp_path / "cls", classifier_labels=("neg", "pos"))
    settings = Settings(model_path=str(source), optimized_recipe="onnx-fp32",
                        onnx_dir=str(tmp_path / "onnx"), torch_threads=1)
    base, opt = Variant(groups(settings), "baseline"), Variant(groups(settings), "optimized")
    assert opt.model.output == "logits"
    assert torch.allclose(base.rows(TEXTS), opt.rows(TEXTS), atol=1e-4)


def test_weight_type_follows_vnni(tmp_path):
    assert weight_type_for(frozenset({"avx2", "avx512_vnni"})) == "s8"
    assert weight_type_for(frozenset({"avx2", "avx_vnni"})) == "s8"
    assert weight_type_for(frozenset({"avx2", "fma"})) == "u8"
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 fma\n")
    assert read_cpu_flags(cpuinfo) == ("avx2",)  # the flags that decide recipes, listed by all
    assert weight_type_for(read_cpu_flags(cpuinfo)) == "u8"
    assert read_cpu_flags(tmp_path / "missing") == ()


def test_search_score_reaches_needs_no_confident_flip():
    assert Score(0.995, 0).reaches(0.99)
    assert not Score(0.999, 1).reaches(0.99)
    assert not Score(0.98, 0).reaches(0.99)


def test_onnx_recipes_refuse_cuda(encoder_dir, onnx_dir):
    variant = Variant(groups(_settings(encoder_dir, onnx_dir, "fp32")), "baseline")
    variant.device = "cuda"
    with pytest.raises(ValueError, match="CPU only"):
        variant.build("onnx-int8")
    assert weights_digest(encoder_dir) == variant.weights


# --- ct2-int8 (CTranslate2), which shares the artifact cache --------------------------------------


def test_ct2_int8_converts_caches_and_answers_close_to_fp32(baseline, encoder_dir, tmp_path,
                                                             monkeypatch):
    from serve.recipes.ct2_int8 import FILES, Ct2Model

    settings = _settings(encoder_dir, tmp_path, "ct2-int8")
    opt = Variant(groups(settings), "optimized")
    assert isinstance(opt.model, Ct2Model) and opt.model.threads == torch.get_num_threads()
    assert opt.version.startswith("ct2-int8-") and opt.decision["runtime"].startswith("ctranslate2")
    rows, reference = opt.rows(TEXTS), baseline.rows(TEXTS)
    assert rows.shape == reference.shape
    assert (rows * reference).sum(-1).min() > 0.95  # int8, so close but not equal
    folder = opt.model.path.parent
    check(folder, folder.name, FILES)
    monkeypatch.setattr("ctranslate2.converters.TransformersConverter",
                        lambda *_a: pytest.fail("the cached conversion should have been used"))
    assert Variant(groups(settings), "optimized").version == opt.version


def test_ct2_refuses_a_classifier_head(tmp_path):
    source = make_tiny_encoder(tmp_path / "cls", classifier_labels=("neg", "pos"))
    settings = Settings(model_path=str(source), optimized_recipe="ct2-int8",
                        onnx_dir=str(tmp_path / "onnx"), torch_threads=1)
    with pytest.raises(ValueError, match="sequence classifier"):
        Variant(groups(settings), "optimized")


def test_nodes_map_to_the_torch_layers_they_compute():
    layers = [f"encoder.layer.{i}.{part}" for i in range(2) for part in (
        "attention.self.query", "attention.self.key", "attention.self.value",
        "attention.output.dense", "intermediate.dense", "output.dense")]
    nodes = ["Attention_0", "/model/encoder/layer.0/attention/output/dense/MatMul",
             "/model/encoder/layer.0/output/dense/MatMul", "Attention_1",
             "/model/encoder/layer.1/intermediate/dense/MatMul", "/model/pooler/dense/MatMul"]
    found = node_layers(nodes, layers)
    assert found["Attention_1"] == [f"encoder.layer.1.attention.self.{p}"
                                    for p in ("query", "key", "value")]
    assert found["/model/encoder/layer.0/output/dense/MatMul"] == ["encoder.layer.0.output.dense"]
    assert "/model/pooler/dense/MatMul" not in found  # no such layer: measured in ORT instead
    assert node_layers(["Attention_0"], layers) == {}  # one Attention for two layers: no guess


def test_a_runtime_is_warmed_over_every_padding_width(baseline):
    calls = []

    def model(input_ids, attention_mask):
        calls.append(tuple(input_ids.shape))
        return baseline.model(input_ids=input_ids, attention_mask=attention_mask)

    runs = baseline.warm(model)
    widths = [w for w in PAD_WIDTHS if w <= baseline.max_tokens]
    assert runs == len(calls) == 2 * len(widths)
    assert calls == [(rows, width) for rows in (1, 8) for width in widths]


# --- ov-int8 (OpenVINO + NNCF), which shares the artifact cache -----------------------------------


@pytest.fixture(scope="module")
def ov_int8(encoder_dir, onnx_dir):
    return Variant(groups(_settings(encoder_dir, onnx_dir, "ov-int8")), "optimized")


def test_ov_int8_quantizes_caches_and_answers_close_to_fp32(baseline, ov_int8, encoder_dir,
                                                            onnx_dir, monkeypatch):
    from serve.recipes.ov_int8 import ALPHAS, FILES, PRECISION_HINT, OvModel

    assert isinstance(ov_int8.model, OvModel) and ov_int8.model.threads == torch.get_num_threads()
    decision = ov_int8.decision
    assert ov_int8.version.startswith("ov-int8-") and decision["runtime"].startswith("openvino ")
    assert decision["precision_hint"] == PRECISION_HINT and decision["smooth_quant_alpha"] in ALPHAS
    evidence = ov_int8.model.manifest["evidence"]
    assert evidence["calibration"]["confident_flips"] == 0
    assert evidence["calibration"]["agreement"] >= 0.99
    rows, reference = ov_int8.rows(TEXTS), baseline.rows(TEXTS)
    assert rows.shape == reference.shape
    assert (rows * reference).sum(-1).min() > 0.95  # int8, so close but not equal
    folder = ov_int8.model.source.parent
    check(folder, folder.name, FILES)
    other = dict(ov_int8.decision, precision_hint="bf16")  # a hint changes answers: a version
    assert variant_version(ov_int8.weights, "ov-int8", decision=other) != ov_int8.version
    monkeypatch.setattr("serve.recipes.ov_int8._search",
                        lambda *_a, **_k: pytest.fail("the cached model should have been used"))
    again = Variant(groups(_settings(encoder_dir, onnx_dir, "ov-int8")), "optimized")
    assert again.version == ov_int8.version
    assert torch.allclose(again.rows(TEXTS), rows, atol=1e-5)


def test_ov_int8_keeps_sensitive_layers_when_no_alpha_reaches_the_target(baseline, encoder_dir,
                                                                        tmp_path, monkeypatch):
    from serve.recipes import ov_int8 as ovint8
    from serve.recipes.onnx.calibrate import Score

    settings = _settings(encoder_dir, tmp_path, "ov-int8")
    kept_counts = []
    quantize = ovint8._quantize

    def recording(graph, data, alpha, keep):
        kept_counts.append(len(keep))  # the MatMuls NNCF is told to leave fp32
        return quantize(graph, data, alpha, keep)

    def judge(_variant, _texts):  # reaches the target only with 3 or more layers in fp32
        return lambda _model: Score(0.999 if kept_counts[-1] >= 3 else 0.9, 0)

    monkeypatch.setattr(ovint8, "_quantize", recording)
    monkeypatch.setattr("serve.recipes.onnx.build.judge", judge)
    opt = Variant(groups(settings), "optimized")
    decision = opt.model.manifest["decision"]
    assert len(decision["kept"]) == 3  # the binary search's fewest
    assert decision["smooth_quant_alpha"] == ovint8.ALPHAS[0]  # all tied: the first tried
    tried = opt.model.manifest["evidence"]["tried"]
    assert [(t["alpha"], t["kept"]) for t in tried[:len(ovint8.ALPHAS)]] == [
        (alpha, 0) for alpha in ovint8.ALPHAS]
    assert [t["kept"] for t in tried[len(ovint8.ALPHAS):]] == kept_counts[len(ovint8.ALPHAS):]
    assert kept_counts[:len(ovint8.ALPHAS)] == [0] * len(ovint8.ALPHAS)  # every alpha all int8
    assert all(name.startswith("encoder.layer.") for name in decision["kept"])
    assert opt.model.manifest["evidence"]["calibration"]["agreement"] == 0.999


def test_ov_int8_layer_names_map_to_torch_linears():
    from serve.recipes.ov_int8 import layer_of

    assert layer_of("/model/encoder/layer.0/output/dense/MatMul") == "encoder.layer.0.output.dense"
    assert layer_of("/encoder/layer.1/attention/self/query/MatMul") == (
        "encoder.layer.1.attention.self.query")
    assert layer_of("/model/encoder/layer.0/attention/self/MatMul_1") is None  # scores · V
    assert layer_of("MatMul_12") is None


def test_ov_int8_corrupt_artifact_is_rebuilt_not_served(ov_int8, encoder_dir, tmp_path):
    from serve.recipes.ov_int8 import FILES

    settings = _settings(encoder_dir, tmp_path, "ov-int8")
    first = Variant(groups(settings), "optimized")
    folder = first.model.source.parent
    weights = folder / FILES[1]
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="does not match its digest"):
        check(folder, folder.name, FILES)
    again = Variant(groups(settings), "optimized")
    check(folder, folder.name, FILES)
    assert torch.allclose(again.rows(TEXTS), first.rows(TEXTS), atol=1e-5)


def test_ov_int8_resizes_and_serves_a_classifier_head(tmp_path):
    source = make_tiny_encoder(tmp_path / "cls", classifier_labels=("neg", "pos"))
    settings = Settings(model_path=str(source), optimized_recipe="ov-int8",
                        onnx_dir=str(tmp_path / "onnx"), torch_threads=1)
    base, opt = Variant(groups(settings), "baseline"), Variant(groups(settings), "optimized")
    assert opt.model.output == "logits"
    before = opt.rows(TEXTS)
    assert before.shape == base.rows(TEXTS).shape
    opt.model.resize(2)
    assert opt.model.threads == 2
    assert torch.allclose(opt.rows(TEXTS), before, atol=1e-5)


def test_openvino_is_imported_with_its_telemetry_declined(tmp_path):
    """`import openvino` asks openvino-telemetry for consent, which writes ~/intel and would try
    the network; serve.recipes.ov_int8 declines it for the import and restores the environment."""
    import os
    import subprocess
    import sys

    code = ("import os; from serve.recipes.ov_int8 import runtime; runtime().Core(); "
            "import serve.recipes.ov_int8 as o; o._versions(); "
            "print(os.environ.get('CI'), os.environ.get('NNCF_CI'))")
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "NNCF_CI")}
    env["HOME"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.split() == ["None", "None"]  # the process's environment is restored
    assert not (tmp_path / "intel").exists()


def test_ov_int8_build_writes_nothing_on_standard_output(encoder_dir, tmp_path, capsys):
    """NNCF draws progress bars on stdout; `rollout verify --json` prints its JSON there."""
    Variant(groups(_settings(encoder_dir, tmp_path, "ov-int8")), "optimized")
    out = capsys.readouterr()
    assert out.out == ""
    assert "Statistics collection" in out.err  # NNCF's bars went to stderr instead
