"""Eager CPU recipes run as a frozen TorchScript trace, kept only where it answers as the eager
model does (serve.recipes.frozen), on tiny local models."""

import random

import pytest
import torch

from rollout import Settings
from serve.recipes.frozen import Frozen, freeze
from serve.recipes.variants import Variant
from tests.tiny_model import make_tiny_encoder
from tests.variant_settings import groups


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory):
    return make_tiny_encoder(tmp_path_factory.mktemp("enc"))


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory):
    return make_tiny_encoder(tmp_path_factory.mktemp("cls"), classifier_labels=("neg", "pos"))


def _batches(seed: int = 0) -> list[list[list[int]]]:
    """Merged batches as a replica forwards them: 1 to 9 rows of 1 to 40 tokens."""
    rng = random.Random(seed)
    return [[[rng.randint(1000, 5000) for _ in range(rng.randint(1, 40))]
             for _ in range(rng.randint(1, 9))] for _ in range(12)]


@pytest.mark.parametrize("recipe", ["fp32", "bf16", "int8-dynamic", "int8-dynamic-per-channel"])
def test_a_cpu_recipe_runs_frozen_and_answers_as_its_eager_model(encoder_dir, recipe):
    arm = "baseline" if recipe == "fp32" else "optimized"
    frozen = Variant(groups(Settings(model_path=str(encoder_dir), optimized_recipe=recipe)), arm)
    eager = Variant(groups(Settings(model_path=str(encoder_dir), optimized_recipe=recipe,
                                    torchscript=False)), arm)
    assert isinstance(frozen.model, Frozen) and frozen.runs_as.startswith("frozen TorchScript")
    assert not isinstance(eager.model, Frozen) and eager.runs_as == "eager"
    assert frozen.recipe == eager.recipe == recipe
    # the same answer is the same version: the trace is not part of what is served
    assert frozen.version == eager.version
    for rows in _batches():
        assert torch.allclose(frozen.forward_rows(rows), eager.forward_rows(rows), atol=1e-5)


def test_a_classifier_runs_frozen_and_keeps_its_logits(classifier_dir):
    settings = Settings(model_path=str(classifier_dir))
    frozen = Variant(groups(settings), "baseline")
    eager = Variant(groups(Settings(model_path=str(classifier_dir), torchscript=False)),
                    "baseline")
    assert isinstance(frozen.model, Frozen)
    texts = ["good", "a much longer and rather bad review of a thing"]
    assert frozen.postprocess("classify", frozen.rows(texts)) == \
        eager.postprocess("classify", eager.rows(texts))


def test_the_frozen_model_is_asked_as_the_eager_one_is(encoder_dir):
    variant = Variant(groups(Settings(model_path=str(encoder_dir))), "baseline")
    eager = variant.model.source
    assert list(variant.model.modules()) == list(eager.modules())
    assert variant.model.config is eager.config
    with pytest.raises(AttributeError):
        variant.model.no_such_attribute  # noqa: B018


def test_the_runtime_and_compiled_recipes_are_not_traced(encoder_dir):
    compiled = Variant(groups(Settings(model_path=str(encoder_dir), optimized_recipe="compiled")),
                       "optimized")
    assert compiled.runs_as == "eager" and not isinstance(compiled.model, Frozen)


class _BranchOnWidth(torch.nn.Module):
    """Answers differently past 8 tokens: a Python branch the trace fixes at its example."""

    def forward(self, input_ids, attention_mask):
        hidden = torch.nn.functional.one_hot(input_ids % 7, 7).float()
        if input_ids.shape[1] > 8:
            hidden = hidden * 2
        return {"last_hidden_state": hidden}


class _NotTraceable(torch.nn.Module):
    def forward(self, input_ids, attention_mask):
        return {"last_hidden_state": input_ids.float().unsqueeze(-1), "note": "a string"}


class _Plain(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(20000, 4)

    def forward(self, input_ids, attention_mask):
        return {"last_hidden_state": self.embed(input_ids) * attention_mask.unsqueeze(-1)}


def test_a_trace_that_answers_otherwise_keeps_the_eager_model():
    model = _BranchOnWidth().eval()
    kept, why = freeze(model, "last_hidden_state")
    assert kept is model
    assert why.startswith("eager (the trace differs from the eager model by")


def test_a_model_the_tracer_refuses_keeps_the_eager_model():
    model = _NotTraceable().eval()
    kept, why = freeze(model, "last_hidden_state")
    assert kept is model
    assert why.startswith("eager (TorchScript trace failed:")


def test_a_traceable_model_is_frozen_with_what_it_differs_by():
    model = _Plain().eval()
    frozen, why = freeze(model, "last_hidden_state")
    assert isinstance(frozen, Frozen)
    assert why == "frozen TorchScript trace (largest difference from eager 0)"
    ids = torch.tensor([[1001, 1002, 1003]])
    out = frozen(input_ids=ids, attention_mask=torch.ones_like(ids))
    assert torch.equal(out.last_hidden_state, model(ids, torch.ones_like(ids))["last_hidden_state"])
