"""Model variants on tiny local models (torch, no Ray, no Redis)."""

import pytest
import torch

from rollout import Settings
from serve.recipes import recipe_for
from serve.recipes.source import variant_version, weights_digest
from serve.recipes.variants import Variant
from tests.tiny_model import make_tiny_encoder
from tests.variant_settings import groups, versions_of


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory):
    return make_tiny_encoder(tmp_path_factory.mktemp("enc"))


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory):
    return make_tiny_encoder(tmp_path_factory.mktemp("cls"), classifier_labels=("neg", "pos"))


def test_recipes_by_arm_and_device():
    auto = Settings()
    assert recipe_for("baseline", auto, "cpu") == "fp32"
    # `auto` is decided by measurement when the variant loads (serve.recipes.auto.choose)
    assert recipe_for("optimized", auto, "cpu") == "auto"
    assert recipe_for("optimized", auto, "cuda") == "auto"
    assert recipe_for("optimized", Settings(optimized_recipe="bf16"), "cpu") == "bf16"


def test_version_hashes_weights_and_recipe(encoder_dir, tmp_path):
    digest = weights_digest(encoder_dir)
    assert variant_version(digest, "fp32") != variant_version(digest, "int8-dynamic")
    other = make_tiny_encoder(tmp_path / "other")
    (other / "config.json").write_text((other / "config.json").read_text() + "\n")
    assert weights_digest(other) != digest
    found = versions_of(Settings(model_path=str(encoder_dir), optimized_recipe="int8-dynamic"))
    assert found == {
        "baseline": variant_version(digest, "fp32"),
        "optimized": variant_version(digest, "int8-dynamic"),
    }


def test_encoder_variants_embed_and_classify(encoder_dir):
    settings = Settings(model_path=str(encoder_dir), labels=("cats", "dogs", "cars"),
                        optimized_recipe="int8-dynamic")
    base = Variant(groups(settings), "baseline")
    opt = Variant(groups(settings), "optimized")
    assert base.version.startswith("fp32-") and opt.version.startswith("int8-dynamic-")
    assert any(
        isinstance(m, torch.ao.nn.quantized.dynamic.Linear) for m in opt.model.modules()
    )
    texts = ["a short one", "a somewhat longer input sentence for the encoder"]
    rows = base.embed_batch([base.encode(texts), base.encode(["third"])])
    assert [r.shape[0] for r in rows] == [2, 1]
    assert torch.allclose(rows[0].norm(dim=-1), torch.ones(2), atol=1e-5)
    classified = base.postprocess("classify", rows[0])
    assert [set(c["scores"]) for c in classified] == [{"cats", "dogs", "cars"}] * 2
    embedded = base.postprocess("embed", rows[1])
    assert len(embedded[0]["embedding"]) == 32
    # batching does not change a request's result
    alone = base.embed_batch([base.encode(texts)])[0]
    assert torch.allclose(alone, rows[0], atol=1e-5)


def test_classifier_uses_its_own_head(classifier_dir):
    variant = Variant(groups(Settings(model_path=str(classifier_dir))), "baseline")
    assert variant.has_head and variant.labels == ("neg", "pos")
    (out,) = variant.postprocess("classify", variant.embed_batch([variant.encode(["hi"])])[0])
    assert out["label"] in ("neg", "pos")
    assert abs(sum(out["scores"].values()) - 1) < 1e-4
    with pytest.raises(ValueError, match="no `embed` task"):
        variant.postprocess("embed", torch.zeros(1, 2))


def test_truncation_to_max_tokens(encoder_dir):
    variant = Variant(groups(Settings(model_path=str(encoder_dir), max_tokens=16)), "baseline")
    encoded = variant.encode(["word " * 500])
    assert len(encoded.ids[0]) == 16


def test_missing_model_folder_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        Variant(groups(Settings(model_path=str(tmp_path))), "baseline")


def test_both_arms_share_the_fp32_label_embeddings(encoder_dir):
    settings = Settings(model_path=str(encoder_dir), optimized_recipe="int8-dynamic")
    base, opt = Variant(groups(settings), "baseline"), Variant(groups(settings), "optimized")
    assert opt.label_matrix.dtype == torch.float32
    assert torch.equal(base.label_matrix, opt.label_matrix)


@pytest.mark.parametrize("recipe", ["int8-dynamic-per-channel", "bf16", "fp16", "int8-torchao"])
def test_every_cpu_recipe_runs_and_stays_close_to_fp32(encoder_dir, recipe):
    base = Variant(groups(Settings(model_path=str(encoder_dir))), "baseline")
    opt = Variant(groups(Settings(model_path=str(encoder_dir), optimized_recipe=recipe)),
                  "optimized")
    assert opt.recipe == recipe and opt.version.startswith(f"{recipe}-")
    texts = ["a short one", "numbers 1 2 3 and emoji 🚀", "word " * 40]
    cosine = (base.rows(texts) * opt.rows(texts)).sum(-1)
    assert cosine.min() > 0.95, cosine
    assert opt.version != base.version


def test_rows_keep_input_order_whatever_the_batching(encoder_dir):
    variant = Variant(groups(Settings(model_path=str(encoder_dir))), "baseline")
    texts = ["word " * n for n in (30, 1, 12, 5, 60, 2)]
    together = variant.rows(texts, batch_size=4)
    alone = torch.cat([variant.rows([t]) for t in texts])
    assert torch.allclose(together, alone, atol=1e-5)


def test_compiled_recipe_wraps_the_fp32_model_for_inductor(encoder_dir):
    """Structural only: compiling the tiny model takes 30-130 s on the shared 2-core machine
    (the inductor C++ build), too slow for a unit test. `rollout verify --recipe compiled` runs
    it on the regression set (docs/recipes.md, recipes table)."""
    from torch._dynamo.eval_frame import OptimizedModule

    opt = Variant(groups(Settings(model_path=str(encoder_dir), optimized_recipe="compiled")),
                  "optimized")
    assert opt.recipe == "compiled" and opt.version.startswith("compiled-")
    assert isinstance(opt.model, OptimizedModule)
    assert {p.dtype for p in opt.model._orig_mod.parameters()} == {torch.float32}
    base = Variant(groups(Settings(model_path=str(encoder_dir))), "baseline")
    assert opt.version != base.version


def test_small_batch_graphs_pad_rows_and_cut_them_off(encoder_dir):
    """The fp16-graphs wrapper's padding logic, on CPU without compiling (the graphs
    themselves need CUDA: ops/gpu_check.sh)."""
    from serve.recipes.fp16_graphs import SmallBatchGraphs

    # the eager model, as on CUDA, where no recipe is frozen
    variant = Variant(groups(Settings(model_path=str(encoder_dir), torchscript=False)),
                      "baseline")
    rows = [[101, 2023, 102], [101, 2003, 1037, 2742, 102], [101, 102]]
    expected = variant.forward_rows(rows)
    wrapped = SmallBatchGraphs(variant.model, max_rows=4, compile=False)
    assert torch.allclose(variant.forward_rows(rows, model=wrapped), expected, atol=1e-5)
    big = rows * 2  # 6 rows > max_rows: eager
    assert torch.allclose(variant.forward_rows(big, model=wrapped), torch.cat([expected] * 2),
                          atol=1e-5)
    assert set(wrapped.state_dict()) == {f"eager.{k}" for k in variant.model.state_dict()}


def test_fp16_graphs_is_refused_on_cpu(encoder_dir):
    with pytest.raises(ValueError, match="CUDA only"):
        Variant(groups(Settings(model_path=str(encoder_dir), optimized_recipe="fp16-graphs")),
                "optimized")


def test_served_rows_are_packed_as_a_replica_packs_them(encoder_dir, monkeypatch):
    """`Variant.served` (what verify and `auto` time as served traffic) forwards a batch under
    the token budget, as ModelServer does, with the same answers as one padded forward."""
    settings = Settings(model_path=str(encoder_dir), max_tokens=64, max_batch_tokens=64)
    variant = Variant(groups(settings), "baseline")
    texts = ["short", "a bit longer than that one", "word " * 40, "x"]
    widths = []
    forward = variant.forward_rows
    monkeypatch.setattr(variant, "forward_rows",
                        lambda rows, model=None: widths.append(len(rows)) or forward(rows, model))
    served = variant.served(texts)
    assert len(widths) > 1  # 4 rows over a 64-token budget: more than one forward
    whole = variant.embed_batch([variant.encode(texts)])[0]
    assert torch.allclose(served, whole, atol=1e-5)


def test_an_eager_cpu_variant_pads_to_the_longest_row_and_answers_as_bucketed(encoder_dir):
    """Padding is masked out: rows padded to their longest (eager torch on the CPU) give the
    embeddings that rows padded to the bucket give."""
    from serve.common.batching import exact_width, padded_width

    variant = Variant(groups(Settings(model_path=str(encoder_dir))), "baseline")
    assert variant.pad_width is exact_width
    rows = [[101, 7, 8, 9, 102], [101, 7, 102]]
    ids, mask = variant._collate(rows)
    assert ids.shape == (2, 5) and mask.sum().item() == 8
    exact = variant.forward_rows(rows)
    variant.pad_width = padded_width
    assert variant._collate(rows)[0].shape == (2, 8)
    assert torch.allclose(variant.forward_rows(rows), exact, atol=1e-5)
