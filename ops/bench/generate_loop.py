"""The decode loop against Hugging Face `generate()`, in this process, on one causal LM folder.

    python -m ops.bench.generate_loop --model DIR
    python -m ops.bench.generate_loop --model DIR --concurrency 1,8,32 --max-tokens 64

For each concurrency `c`, the same requests (the regression set's texts cut to 8-40 prompt
tokens, each answered with a length of its own, a quarter to all of `--max-tokens` greedy
tokens, EOS ignored: answers end at different steps, as real ones do) three ways, as `c`
closed-loop clients see them (a client sends its next request when its answer is complete):

- `one at a time`: `generate()` per request, in order of arrival;
- `static batch`: `generate()` on `c` left-padded requests at once, run to the longest of them
  (only each request's own tokens count), the next `c` when all are done;
- `decode loop` (serve.generative.decode): requests join the running batch between steps and
  leave when done.

Each reports output tokens per second over the cell, time to first token (from the request's
arrival, waiting included) and inter-token latency (between a sequence's successive tokens),
p50 and p99. transformers' own continuous batching (`generate_batch`) is added where the
installed version has it and it runs on this machine's device, as a throughput row
(`--no-generate-batch` leaves it out: on a CPU it takes seconds per cell).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ops.load.tally import pct


@dataclass
class Cell:
    way: str
    concurrency: int
    tokens: int = 0
    seconds: float = 0.0
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    note: str = ""

    def row(self) -> dict:
        ms = lambda values, q: None if not values else round(1000 * pct(values, q), 2)  # noqa: E731
        return {"way": self.way, "concurrency": self.concurrency, "tokens": self.tokens,
                "tokens_per_s": round(self.tokens / self.seconds, 1) if self.seconds else None,
                "ttft_p50_ms": ms(self.ttft, 50), "ttft_p99_ms": ms(self.ttft, 99),
                "itl_p50_ms": ms(self.itl, 50), "itl_p99_ms": ms(self.itl, 99),
                "note": self.note}


def prompts(tokenizer, count: int) -> list[list[int]]:
    """`count` prompts from the regression set's texts, 8-40 tokens each (BOS included)."""
    from serve.common.regression import DEFAULT_SET
    texts = [json.loads(line)["text"] for line in DEFAULT_SET.read_text().splitlines()]
    found = []
    for i, text in enumerate(texts[::7]):
        ids = tokenizer(text)["input_ids"]
        if len(ids) >= 8:
            found.append(ids[:8 + (i * 13) % 33])
        if len(found) == count:
            return found
    raise SystemExit(f"the regression set gave {len(found)} prompts of 8 tokens or more")


class _Clock:
    """A logits processor that only notes when each step's token is chosen."""

    def __init__(self):
        self.times: list[float] = []

    def __call__(self, input_ids, scores):
        self.times.append(time.perf_counter())
        return scores


def lengths(count: int, max_tokens: int) -> list[int]:
    """Each request's answer length: a quarter, half, three quarters or all of `max_tokens`."""
    return [max(1, max_tokens * (1 + (i * 7) % 4) // 4) for i in range(count)]


def _generate(model, batch: list[list[int]], max_tokens: int, pad: int) -> list[float]:
    """`generate()` on `batch` left-padded; the time each step's tokens were chosen."""
    import torch
    from transformers import LogitsProcessorList
    width = max(len(ids) for ids in batch)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
    clock = _Clock()
    with torch.inference_mode():
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_tokens,
                       min_new_tokens=max_tokens, do_sample=False, pad_token_id=pad,
                       logits_processor=LogitsProcessorList([clock]))
    return clock.times


def hf_batches(model, requests, wanted: list[int], concurrency: int, size: int, pad: int,
               way: str) -> Cell:
    """`generate()` on `size` requests at a time (1: one at a time), `concurrency` clients."""
    cell = Cell(way, concurrency)
    started = time.perf_counter()
    arrivals = [started] * min(concurrency, len(requests))
    for first in range(0, len(requests), size):
        batch = requests[first:first + size]
        times = _generate(model, batch, max(wanted[first:first + size]), pad)
        for k in range(first, first + len(batch)):
            own = times[:wanted[k]]
            cell.ttft.append(own[0] - max(arrivals[k], started))
            cell.itl += [b - a for a, b in zip(own, own[1:], strict=False)]
            cell.tokens += len(own)
            arrivals.append(times[-1])  # that client's next request arrives now
    cell.seconds = time.perf_counter() - started
    return cell


def decode_loop(model, tokenizer, requests, wanted: list[int], concurrency: int) -> Cell:
    from serve.generative.decode import Sampling, Sequence
    from serve.generative.fidelity import unbounded_loop
    loop = unbounded_loop(model, tokenizer, max(concurrency, 1))
    cell = Cell("decode loop", concurrency)
    pending, live = list(zip(requests, wanted, strict=True)), {}

    def send() -> None:
        times: list[float] = [time.perf_counter()]
        prompt, length = pending.pop(0)
        sampling = Sampling(max_tokens=length, temperature=0, ignore_eos=True)
        sequence = Sequence(prompt, sampling, lambda event: times.append(time.perf_counter()))
        live[id(loop.submit(sequence))] = (sequence, times)

    started = time.perf_counter()
    while pending and len(live) < concurrency:
        send()
    while live:
        loop.step()
        for key, (sequence, times) in list(live.items()):
            if sequence.finish:
                del live[key]
                cell.ttft.append(times[1] - times[0])
                cell.itl += [b - a for a, b in zip(times[1:-1], times[2:-1], strict=False)]
                cell.tokens += len(sequence.generated)
                if pending:
                    send()
    cell.seconds = time.perf_counter() - started
    return cell


def transformers_continuous(model, requests, wanted: list[int], concurrency: int) -> Cell:
    """transformers' `generate_batch` on every request at once: a throughput row."""
    cell = Cell("transformers generate_batch", concurrency)
    if not hasattr(model, "generate_batch"):
        cell.note = "not in this transformers"
        return cell
    from transformers import GenerationConfig
    longest = max(wanted)
    config = GenerationConfig(max_new_tokens=longest, do_sample=False, eos_token_id=-1,
                              pad_token_id=model.config.pad_token_id or 0,
                              max_batch_tokens=concurrency * 64, num_blocks=max(
                                  16, concurrency * (40 + longest) // 32 + 8), block_size=32)
    started = time.perf_counter()
    try:
        outputs = model.generate_batch(inputs=requests, generation_config=config,
                                       progress_bar=False)
    except Exception as exc:  # its paged attention may not run on this device
        cell.note = f"did not run here: {type(exc).__name__}: {str(exc)[:120]}"
        return cell
    cell.seconds = time.perf_counter() - started
    cell.tokens = sum(len(out.generated_tokens) for out in outputs.values())
    cell.note = "every request to the longest length"
    return cell


def measure(folder: Path, concurrencies: list[int], max_tokens: int, say,
            continuous: bool = True) -> list[dict]:
    """Every way per concurrency; transformers' generate_batch too where `continuous`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from serve.common.quiet import quiet
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    with quiet():
        model = AutoModelForCausalLM.from_pretrained(folder).eval()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    rows = []
    for c in concurrencies:
        requests = prompts(tokenizer, max(16, 2 * c))
        wanted = lengths(len(requests), max_tokens)
        cells = [hf_batches(model, requests, wanted, c, 1, pad, "one at a time"),
                 hf_batches(model, requests, wanted, c, c, pad, "static batch"),
                 decode_loop(model, tokenizer, requests, wanted, c)]
        if c > 1 and continuous:
            cells.append(transformers_continuous(model, requests, wanted, c))
        for cell in cells:
            rows.append(cell.row())
            say(_line(rows[-1]))
    return rows


def table(rows: list[dict]) -> str:
    """The rows as markdown, then per concurrency the decode loop's tokens/s over one at a time
    and over the static batch, and its p99 inter-token latency over the static batch's."""
    def value(row, key):
        return "-" if row[key] is None else f"{row[key]:,}"
    lines = ["| c | way | output tokens/s | TTFT p50 / p99 ms | ITL p50 / p99 ms |",
             "| --- | --- | --- | --- | --- |"]
    lines += [f"| {r['concurrency']} | {r['way']} | {value(r, 'tokens_per_s')} | "
              f"{value(r, 'ttft_p50_ms')} / {value(r, 'ttft_p99_ms')} | "
              f"{value(r, 'itl_p50_ms')} / {value(r, 'itl_p99_ms')} |" for r in rows]
    lines.append("")
    for c in sorted({r["concurrency"] for r in rows}):
        way = {r["way"]: r for r in rows if r["concurrency"] == c}
        loop, single, static = (way.get(w) for w in ("decode loop", "one at a time",
                                                     "static batch"))
        if not (loop and single and static) or not all(
                r["tokens_per_s"] for r in (loop, single, static)):
            continue
        itl = (f"{loop['itl_p99_ms'] / static['itl_p99_ms']:.2f}x"
               if loop["itl_p99_ms"] and static["itl_p99_ms"] else "-")
        lines.append(f"- c={c}: decode loop {loop['tokens_per_s'] / single['tokens_per_s']:.2f}x "
                     f"one at a time, {loop['tokens_per_s'] / static['tokens_per_s']:.2f}x the "
                     f"static batch (tokens/s); p99 inter-token latency {itl} the static batch's")
    return "\n".join(lines) + "\n"


def _line(row: dict) -> str:
    def value(key):
        return "-" if row[key] is None else f"{row[key]:,}"
    return (f"c={row['concurrency']:<3} {row['way']:<28} {value('tokens_per_s'):>9} tokens/s  "
            f"TTFT p50 {value('ttft_p50_ms')} p99 {value('ttft_p99_ms')} ms  "
            f"ITL p50 {value('itl_p50_ms')} p99 {value('itl_p99_ms')} ms  {row['note']}")


def parser_for(prog: str, description: str,
               concurrency: str | None) -> argparse.ArgumentParser:
    """The options the in-process generative benches take: --model, --json and, unless
    `concurrency` is None, --concurrency (its default)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--model", type=Path, required=True,
                        help="a Hugging Face causal-LM folder (e.g. ops.generate.small_lm's)")
    if concurrency is not None:
        parser.add_argument("--concurrency", default=concurrency,
                            help=f"closed-loop clients per cell, comma-separated (default "
                            f"{concurrency})")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    return parser


def check_model(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The parser's exit 2 where --model holds no config.json."""
    if not (args.model / "config.json").is_file():
        parser.error(f"--model {args.model}: no config.json there")


def checked(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[int]:
    """The concurrencies, once --model and --concurrency are sound (else the parser's exit 2)."""
    try:
        concurrencies = [int(c) for c in args.concurrency.split(",")]
    except ValueError:
        parser.error("--concurrency: comma-separated whole numbers")
    if min(concurrencies) < 1:
        parser.error("--concurrency values must be >= 1")
    check_model(parser, args)
    return concurrencies


def main(argv: list[str] | None = None) -> int:
    parser = parser_for(
        "python -m ops.bench.generate_loop", "Output tokens/s, time to first token and "
        "inter-token latency of the decode loop beside transformers' generate() one request "
        "at a time and as a static batch, in this process, on a causal-LM folder.", "1,8,32")
    parser.add_argument("--max-tokens", type=int, default=64,
                        help="tokens generated per request (default 64)")
    parser.add_argument("--no-generate-batch", action="store_true",
                        help="leave out transformers' generate_batch (seconds per cell on a CPU)")
    args = parser.parse_args(argv)
    concurrencies = checked(parser, args)
    if args.max_tokens < 2:
        parser.error("--max-tokens must be >= 2")
    rows = measure(args.model, concurrencies, args.max_tokens, print,
                   continuous=not args.no_generate_batch)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
