"""The project's small causal LM (ops.generate.small_lm): a Hugging Face Llama folder whose
next-token distributions are peaked, a byte-level tokenizer that encodes any text, built once and
copied from the cache after, and a builder that never overwrites a folder it did not make."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

from ops.generate import small_lm as builder


@pytest.fixture(scope="module")
def loaded(small_lm):
    return AutoTokenizer.from_pretrained(small_lm), AutoModelForCausalLM.from_pretrained(small_lm)


def test_it_is_a_llama_with_linear_projections_and_grouped_kv_heads(small_lm, loaded):
    _, model = loaded
    assert isinstance(model, LlamaForCausalLM)
    config = model.config
    assert config.num_key_value_heads < config.num_attention_heads
    layer = model.model.layers[0]
    for projection in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj,
                       layer.self_attn.o_proj, layer.mlp.gate_proj, layer.mlp.up_proj,
                       layer.mlp.down_proj):
        assert type(projection) is torch.nn.Linear
    report = json.loads((small_lm / builder.MARKER).read_text())
    assert report["parameters"] == sum(p.numel() for p in model.parameters())
    print(f"\nsmall LM: train loss {report['train_loss']}, held-out {report['held_out_loss']}, "
          f"{report['seconds']} s")


def test_its_next_tokens_are_peaked_on_texts_it_never_saw(small_lm, loaded):
    tokenizer, model = loaded
    held = builder.texts()[::builder.HELD_OUT_EVERY][:60]
    report = json.loads((small_lm / builder.MARKER).read_text())
    assert report["held_out_loss"] < 2.0, report  # a perplexity under e^2
    top, count = 0.0, 0
    with torch.inference_mode():
        for text in held:
            ids = torch.tensor([tokenizer(text)["input_ids"][:128]])
            probabilities = model(input_ids=ids).logits[0, :-1].softmax(-1)
            top += probabilities.max(-1).values.sum().item()
            count += ids.shape[1] - 1
    assert top / count > 0.5, top / count  # the most likely token holds most of the mass


def test_the_tokenizer_puts_bos_first_and_decodes_any_script_back(loaded):
    tokenizer, _ = loaded
    for text in ("the team won the cup", "中国队的比赛 🚀 naïve café", "def f(x):\n\treturn x"):
        ids = tokenizer(text)["input_ids"]
        assert ids[0] == tokenizer.bos_token_id
        assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert tokenizer.eos_token_id not in (None, tokenizer.bos_token_id, tokenizer.pad_token_id)


def test_greedy_continuation_of_a_seen_prefix_is_a_sentence_it_learned(loaded):
    tokenizer, model = loaded
    ids = tokenizer("The hospital reviewed the", return_tensors="pt")["input_ids"]
    out = model.generate(ids, max_new_tokens=12, do_sample=False)
    again = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert torch.equal(out, again)
    words = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True).split()
    assert len(words) >= 3 and all(word.isprintable() for word in words)


def test_a_second_build_copies_the_cached_one(small_lm, tmp_path):
    said = []
    report = builder.build(tmp_path / "copy", say=said.append)
    assert any("cached build" in line for line in said), said
    assert report == json.loads((small_lm / builder.MARKER).read_text())
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (tmp_path / "copy" / name).read_bytes() == (small_lm / name).read_bytes()


def test_a_folder_holding_this_build_is_kept_as_it_is(small_lm):
    said = []
    before = (small_lm / "model.safetensors").stat().st_mtime_ns
    builder.build(small_lm, say=said.append)
    assert any("already holds" in line for line in said), said
    assert (small_lm / "model.safetensors").stat().st_mtime_ns == before


def test_a_folder_holding_other_files_is_refused_and_left_alone(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit, match="not empty and holds no small LM build"):
        builder.build(tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_the_command_has_help_and_refuses_a_step_count_under_one(capsys):
    with pytest.raises(SystemExit) as done:
        builder.main(["--help"])
    assert done.value.code == 0 and "Hugging Face folder" in capsys.readouterr().out
    with pytest.raises(SystemExit) as done:
        builder.main(["somewhere", "--steps", "0"])
    assert done.value.code == 2 and "--steps must be at least 1" in capsys.readouterr().err
