"""Build the project's small causal language model: a Llama-style decoder trained here, on the
shipped regression set's texts, with a fixed seed.

    python -m ops.generate.small_lm DIR            # build (or reuse) the model in DIR
    python -m ops.generate.small_lm DIR --force    # train again even where a copy is cached

No registry this project reaches ships causal-LM weights, so tests and a first try use this one;
the gateway serves any local Hugging Face causal-LM folder the same way. DIR becomes a normal
Hugging Face folder (`config.json`, `model.safetensors`, `tokenizer.json`, ...) that
`AutoModelForCausalLM.from_pretrained(DIR)` loads, plus `small_lm.json`: what was trained, how
long, and its loss on the texts it saw and on every 20th text, held out.

The model is small (4 layers, hidden size 192, grouped-query attention with 2 KV heads, about
2 M parameters) and its projections are `nn.Linear`, as in the causal LMs teams quantize. Its
tokenizer is a byte-level BPE of 2,048 tokens trained on the same texts: every string encodes,
whatever its script. Trained for a couple of minutes on 2 cores, it continues the templated
sentences it saw with peaked next-token distributions, so the agreement of two arms' tokens
means something.

A build is cached under `~/.cache/canary-gateway/small-lm/<key>`: the key digests this file, the
texts and the versions of torch, transformers and tokenizers, so a second build (a test run, a
new DIR) copies the cached folder in a second. DIR must be empty, absent, or an earlier build.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from serve.common.regression import DEFAULT_SET

MARKER = "small_lm.json"
SEED = 20261206
BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
VOCAB = 2048
BLOCK = 128  # tokens per training row
HELD_OUT_EVERY = 20  # every 20th text is held out: the loss on text the model never saw
# the architecture: small enough to train in minutes on 2 cores, the shape of a real causal LM
ARCHITECTURE = {
    "hidden_size": 192, "intermediate_size": 512, "num_hidden_layers": 4,
    "num_attention_heads": 6, "num_key_value_heads": 2, "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
}


@dataclass(frozen=True)
class Training:
    steps: int = 400
    batch: int = 16
    learning_rate: float = 3e-3
    warmup: int = 30
    weight_decay: float = 0.01


def cache_folder(key: str) -> Path:
    from serve.recipes.artifact import cache_root
    return cache_root() / "small-lm" / key


def texts(path: Path = DEFAULT_SET) -> list[str]:
    """The training texts, in the shipped file's order."""
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line)["text"] for line in handle if line.strip()]


def build_key(corpus: list[str], training: Training) -> str:
    import tokenizers
    import torch
    import transformers
    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update(json.dumps([corpus, training.__dict__, torch.__version__,
                              transformers.__version__, tokenizers.__version__]).encode())
    return digest.hexdigest()[:16]


def train_tokenizer(corpus: list[str]):
    """A byte-level BPE with BOS, EOS and PAD, wrapped as a transformers fast tokenizer that
    puts BOS before every text it encodes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    raw.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=VOCAB, min_frequency=2, special_tokens=[PAD, BOS, EOS], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bos = raw.token_to_id(BOS)
    raw.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, bos)])
    return PreTrainedTokenizerFast(tokenizer_object=raw, bos_token=BOS, eos_token=EOS,
                                   pad_token=PAD, model_max_length=ARCHITECTURE[
                                       "max_position_embeddings"])


def rows(tokenizer, corpus: list[str]):
    """The texts as one stream (BOS text EOS, ...) cut into rows of BLOCK + 1 tokens."""
    import torch
    stream: list[int] = []
    for text in corpus:
        stream += tokenizer(text)["input_ids"] + [tokenizer.eos_token_id]
    usable = (len(stream) - 1) // BLOCK * BLOCK
    ids = torch.tensor(stream[:usable + 1])
    return torch.stack([ids[i:i + BLOCK + 1] for i in range(0, usable, BLOCK)]), len(stream)


def mean_loss(model, data, batch: int = 32) -> float:
    import torch
    model.eval()
    total, count = 0.0, 0
    with torch.inference_mode():
        for start in range(0, len(data), batch):
            chunk = data[start:start + batch]
            out = model(input_ids=chunk[:, :-1], labels=chunk[:, :-1])
            total += out.loss.item() * len(chunk)
            count += len(chunk)
    model.train()
    return total / max(count, 1)


def learning_rate(step: int, training: Training) -> float:
    if step < training.warmup:
        return training.learning_rate * (step + 1) / training.warmup
    done = (step - training.warmup) / max(training.steps - training.warmup, 1)
    return training.learning_rate * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * done)))


def optimize(model, data, training: Training, say) -> None:
    """AdamW over random rows of `data`, warmup then cosine; the loss every 50 steps."""
    import torch
    optimizer = torch.optim.AdamW(model.parameters(), lr=training.learning_rate,
                                  weight_decay=training.weight_decay, betas=(0.9, 0.95))
    order = torch.Generator().manual_seed(SEED)
    losses = []
    for step in range(training.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, training)
        chunk = data[torch.randint(len(data), (training.batch,), generator=order)]
        loss = model(input_ids=chunk[:, :-1], labels=chunk[:, :-1]).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        if (step + 1) % 50 == 0 or step + 1 == training.steps:
            recent = sum(losses[-50:]) / len(losses[-50:])
            say(f"small_lm: step {step + 1}/{training.steps}, loss {recent:.3f}")


def train(folder: Path, corpus: list[str], training: Training, say) -> dict:
    """Trains the tokenizer and the model, saves both in `folder`; returns the report."""
    import torch

    from serve.common.quiet import quiet
    with quiet():  # transformers' model code imports torchao, which speaks of GPU kernels
        from transformers import LlamaConfig, LlamaForCausalLM

    started = time.monotonic()
    random.seed(SEED)
    torch.manual_seed(SEED)
    seen = [t for i, t in enumerate(corpus) if i % HELD_OUT_EVERY]
    held = [t for i, t in enumerate(corpus) if not i % HELD_OUT_EVERY]
    tokenizer = train_tokenizer(seen)
    data, tokens = rows(tokenizer, seen)
    held_data, _ = rows(tokenizer, held)
    config = LlamaConfig(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, **ARCHITECTURE)
    model = LlamaForCausalLM(config)
    parameters = sum(p.numel() for p in model.parameters())
    say(f"small_lm: {parameters / 1e6:.2f} M parameters, {tokens:,} training tokens in "
        f"{len(data)} rows of {BLOCK}; {training.steps} steps of {training.batch} rows")
    optimize(model, data, training, lambda line: say(
        f"{line} ({time.monotonic() - started:.0f} s)"))
    report = {
        "parameters": parameters, "training_tokens": tokens, "steps": training.steps,
        "train_loss": round(mean_loss(model, data), 4),
        "held_out_loss": round(mean_loss(model, held_data), 4),
        "seconds": round(time.monotonic() - started, 1), "seed": SEED,
        "training": training.__dict__, "architecture": ARCHITECTURE,
    }
    model.eval()
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    from transformers.utils import logging as transformers_logging
    transformers_logging.disable_progress_bar()  # "Writing model shards": one file, at once
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return report


def build(target: Path, *, force: bool = False, training: Training = Training(),
          say=lambda line: print(line, file=sys.stderr, flush=True)) -> dict:
    """The small LM in `target` (trained, or copied from the cache); returns its report."""
    corpus = texts()
    key = build_key(corpus, training)
    target = target.expanduser()
    existing = _marker(target)
    if existing is not None and existing.get("key") == key and not force:
        say(f"small_lm: {target} already holds this build ({key})")
        return existing
    if target.exists() and not target.is_dir():
        raise SystemExit(f"small_lm: {target} is a file; name a folder")
    if target.exists() and any(target.iterdir()) and existing is None:
        raise SystemExit(f"small_lm: {target} is not empty and holds no small LM build; "
                         "name an empty or new folder")
    cached = cache_folder(key)
    if force or _marker(cached) is None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=cached.parent))
        work.chmod(0o755)  # mkdtemp's 0700 would follow every copy
        try:
            report = {"key": key, **train(work, corpus, training, say)}
            (work / MARKER).write_text(json.dumps(report, indent=2) + "\n")
            shutil.rmtree(cached, ignore_errors=True)
            os.replace(work, cached)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    else:
        say(f"small_lm: a cached build ({cached})")
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(cached, target)
    return _marker(target)


def _marker(folder: Path) -> dict | None:
    try:
        return json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ops.generate.small_lm",
        description="Train the project's small Llama-style causal LM on the shipped texts (a "
        "couple of minutes on 2 cores; cached) and save it as a Hugging Face folder in DIR.")
    parser.add_argument("dir", metavar="DIR", type=Path, help="the folder to write the model to")
    parser.add_argument("--force", action="store_true",
                        help="train again even where a cached build exists")
    parser.add_argument("--steps", type=int, default=Training.steps,
                        help=f"optimizer steps (default {Training.steps})")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    report = build(args.dir, force=args.force, training=Training(steps=args.steps))
    print(f"small LM in {args.dir}: {report['parameters'] / 1e6:.2f} M parameters, "
          f"train loss {report['train_loss']:.3f} (perplexity "
          f"{math.exp(report['train_loss']):.2f}), held-out loss {report['held_out_loss']:.3f} "
          f"(perplexity {math.exp(report['held_out_loss']):.2f}), trained in "
          f"{report['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
