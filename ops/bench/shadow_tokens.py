"""What the shadow's scoring of a generated answer costs, beside generating that answer.

    python -m ops.bench.shadow_tokens --model DIR
    python -m ops.bench.shadow_tokens --model DIR --recipe bf16 --tokens 16,64,256

The shadow scores an answer of N tokens teacher-forced (serve.gateway.shadow, the replicas'
`logprobs` and `token_fidelity`): one forward of the optimized model over prompt plus answer
(its log-probabilities), one of the baseline's, and the comparison (KL divergence and top-1
agreement at every position). Generating the answer took the decode loop a prefill and N decode
steps. For each answer length this measures, in this process, on the same prompts (best of
`--rounds`):

- generation, alone: the decode loop giving one sequence N tokens (EOS ignored), what an idle
  replica spends on the answer;
- generation, in a batch of `--batch`: the loop giving `--batch` sequences N tokens together,
  divided by `--batch`: an answer's share of a busy replica's work, the cheapest it gets;
- scoring: both forwards and the comparison, for one answer.

The ratio scoring / generation is the shadow's cost per scored answer; multiplied by
`CANARY_SHADOW_SHARE`, its cost per answer served.
"""

from __future__ import annotations

import copy
import functools
import json
import sys
import time
from pathlib import Path

from ops.bench.generate_loop import check_model, parser_for, prompts


def _best(rounds: int, work) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - started)
    return best


def _score(baseline, optimized, prompt: list[int], answer: list[int]) -> None:
    """The shadow's work for one answer: the optimized arm's log-probabilities, compared by the
    baseline with its own (serve.replica.generate_server)."""
    import torch

    from serve.generative.fidelity import compare, continuation_logits
    with torch.inference_mode():
        other = continuation_logits(optimized, prompt, answer).log_softmax(-1)
        compare(continuation_logits(baseline, prompt, answer), other, answer)


def _row(baseline, optimized, tokenizer, requests: list[list[int]], tokens: int, rounds: int
         ) -> dict:
    from serve.generative.fidelity import decode_seconds
    batch = len(requests)
    # any N tokens cost the same two forwards: the prompt's own, repeated
    answer = [requests[0][i % len(requests[0])] for i in range(tokens)]
    alone = _best(rounds, functools.partial(decode_seconds, baseline, tokenizer, requests[:1],
                                            tokens, 1))
    batched = _best(rounds, functools.partial(decode_seconds, baseline, tokenizer, requests,
                                              tokens, batch)) / batch
    scoring = _best(rounds, functools.partial(_score, baseline, optimized, requests[0], answer))
    return {"tokens": tokens, "generation_alone_ms": alone * 1000,
            "generation_batched_ms": batched * 1000, "batch": batch,
            "scoring_ms": scoring * 1000, "share_of_alone": scoring / alone,
            "share_of_batched": scoring / batched}


def measure(folder: Path, recipe: str, lengths: list[int], batch: int, rounds: int,
            say) -> list[dict]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from serve.common.quiet import quiet
    from serve.recipes.causal_lm import build
    tokenizer = AutoTokenizer.from_pretrained(folder)
    with quiet():
        baseline = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        optimized = build(copy.deepcopy(baseline), recipe)
    requests = prompts(tokenizer, batch)
    context = getattr(baseline.config, "max_position_embeddings", None) or 2048
    rows = []
    for tokens in lengths:
        if max(map(len, requests)) + tokens > context:
            raise ValueError(f"--tokens {tokens}: past the model's context of {context}")
        row = _row(baseline, optimized, tokenizer, requests, tokens, rounds)
        say(f"{tokens:>4} tokens  generation alone {row['generation_alone_ms']:8.1f} ms  in a "
            f"batch of {batch} {row['generation_batched_ms']:7.1f} ms per answer  scoring "
            f"{row['scoring_ms']:6.1f} ms  = {100 * row['share_of_alone']:.1f} % of alone, "
            f"{100 * row['share_of_batched']:.1f} % of batched")
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = parser_for(
        "python -m ops.bench.shadow_tokens", "The shadow's teacher-forced scoring of a "
        "generated answer beside generating it (alone, and as a share of a batch), in this "
        "process.", None)
    parser.add_argument("--recipe", default="int8-dynamic-per-channel",
                        help="the optimized arm's recipe (default int8-dynamic-per-channel)")
    parser.add_argument("--tokens", default="16,32,64,128",
                        help="answer lengths, comma-separated (default 16,32,64,128)")
    parser.add_argument("--batch", type=int, default=8, help="sequences in the batch (8)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, best of (3)")
    args = parser.parse_args(argv)
    try:
        lengths = [int(t) for t in args.tokens.split(",") if t]
    except ValueError:
        parser.error("--tokens: whole numbers, comma-separated")
    if not lengths or min(lengths) < 1 or min(args.batch, args.rounds) < 1:
        parser.error("--tokens, --batch and --rounds must be >= 1")
    check_model(parser, args)
    try:
        rows = measure(args.model, args.recipe, lengths, args.batch, args.rounds, print)
    except ValueError as exc:
        parser.error(str(exc))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
