"""`rollout verify`: the offline regression gate between the baseline and the optimized variant.

Loads both configured arms in this process (serve.recipes.variants.Variant), each from its own model
folder and recipe (`CANARY_BASELINE_MODEL_PATH` + `CANARY_BASELINE_RECIPE`, and the optimized
pair), so `v2 / int8` is judged against `v1 / bf16`. First, from the folders' files alone, both
arms' label lists must be equal (serve.recipes.source.check_labels); if not, verify refuses before
loading anything. Then it runs the regression set through both, and measures, side by side in
one run:

- top-1 agreement with its Wilson interval, flips with both margins, agreement by baseline-margin
  bucket, embedding cosine, accuracy on labelled inputs (rollout.agreement);
- throughput of both variants at each of `verify_batch_sizes`, on the same inputs (an evenly
  spaced sample of the set), tokenization included, in two orders:
  - *served*: length-sorted and cut into batches as the server batches them
    (serve.common.batching.served_batches), each forwarded as a replica forwards a merged batch
    (`Variant.served`: packed under the token budget, split where padding would cost more than
    another forward), so rows are padded to the bucket of similar inputs. The `speedup` the gate
    judges is this ratio at `verify_speed_batch`;
  - *set order*: batches as the set lists the inputs, whose width one long input sets (the
    figure verify reported before, `speedup_set_order`, kept for comparison).
  Variants and orders are interleaved round by round and the best of the rounds kept, so that
  machine noise hits all alike;
- memory of each: the size of its weights as serialized, and the peak resident-set growth while
  it runs the largest batch (peak allocated bytes on CUDA).

The agreement pass batches inputs by length (little padding, as a token-budget batcher would).

**Judged out of sample.** On the configured regression set (the one the recipes calibrate on,
recognised by its digest, whatever path `--set` names) the gate judges the *held-out* split
only (serve.common.regression: inputs neither a recipe's tuning nor `auto`'s choice saw); the
calibration split's figures are reported beside them, labelled, and judged by nothing. Another
set is judged whole (split `external`). Either way each distinct text counts once: later
copies are folded, and the report says how many. Every judged input is also filed under its slices
(rollout.slices: script, length bucket in the baseline's tokens, baseline label), each slice
reported with agreement, confident flips and Wilson bound, worst first; the gate judges the
worst slice with at least `verify_min_slice_size` inputs.

**Retrieval compatibility** (an embedding model, no classifier head): the judged inputs'
baseline vectors form an index, every 5th judged input is a query (itself excluded), and the
report gives recall@10 of the optimized arm's queries against it, recall@10 of the baseline's
queries against an index half re-embedded by the optimized arm, and the share of unchanged
nearest neighbours, overall and per slice (rollout.retrieval, serve.common.neighbours); with the
set's own relevance labels (`relevant` / `query_of`), recall against them beside.

The verdict (rollout.verdict, thresholds from the settings `verify_*`) is stored against the
two versions, with the thresholds, the split and the set digest it was judged with. torch and
transformers are imported here, and this module is only imported by the `verify` command.
"""

from __future__ import annotations

import io
import os
import threading
import time
from dataclasses import dataclass, field

import torch

from rollout.agreement import Pair, Summary, margins, summarize
from rollout.retrieval import Retrieval
from rollout.settings import Settings
from rollout.slices import SliceRow, pair_slice_counts, slice_table, slices_of
from serve.common.batching import served_batches
from serve.common.neighbours import retrieval_of
from serve.common.regression import RegressionSet, load_set
from serve.recipes.source import check_labels, labels_of
from serve.recipes.variants import Variant, VariantSettings

CHUNK = 256  # inputs per progress step of the agreement pass


@dataclass
class Report:
    baseline: Variant
    optimized: Variant
    regression: RegressionSet
    summary: Summary  # the judged inputs: the held-out split, or an external set whole
    split: str  # "held-out" or "external" (rollout.verdict)
    calibration: Summary | None  # held-out mode: the calibration split, shown, not judged
    slices: list[SliceRow] = field(default_factory=list)  # the judged inputs', worst first
    folded: int = 0  # later copies of a judged text left out (each distinct text counts once)
    judged: list[Pair] = field(default_factory=list)  # the judged pairs, in the set's order
    judged_slices: list[tuple[str, ...]] = field(default_factory=list)  # each one's slices
    retrieval: Retrieval | None = None  # an embedding model's neighbours (rollout.retrieval)
    throughput: list[dict] = field(default_factory=list)
    memory: dict = field(default_factory=dict)
    speedup: float | None = None  # served (length-sorted) batches at verify_speed_batch
    speedup_set_order: float | None = None  # set-order batches, for comparison


class Bar:
    """A tqdm bar on the operator's stderr, or nothing."""

    def __init__(self, stream, enabled: bool):
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=0, file=stream, unit="step", dynamic_ncols=True, leave=False,
                            mininterval=0.5)

    def stage(self, name: str, total: int) -> None:
        if self.bar is not None:
            self.bar.reset(total=total)
            self.bar.set_description(name)

    def note(self, step) -> None:
        """A long build's progress (a plan's search step, or a line from `auto` or a runtime
        recipe's build): shown as the bar's description."""
        if self.bar is not None and isinstance(step, str):
            self.bar.set_description(step[:70])
        elif self.bar is not None:
            self.bar.update(0)

    def step(self, n: int = 1) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run(settings: Settings, *, set_path: str | None = None, limit: int | None = None,
        progress_stream=None, speed: bool = True) -> Report:
    """Both arms on the set at `set_path` (default: `settings.regression_set`). The arms are
    built with `settings` as the gateway builds them: a calibrated recipe (and `auto`) keeps
    calibrating on `settings.regression_set`, whatever set they are judged on."""
    torch.set_num_threads(settings.threads_per_model(replicas=1))
    check_labels(labels_of(settings, "baseline"), labels_of(settings, "optimized"))
    bar = Bar(progress_stream, progress_stream is not None)
    try:
        bar.stage("loading baseline", 1)
        groups = VariantSettings(settings, settings, settings, settings)
        baseline = Variant(groups, "baseline")
        bar.step()
        regression = load_set(set_path or settings.regression_set, baseline.labels).limited(limit)
        bar.stage(f"loading {settings.optimized_recipe}", 1)
        optimized = Variant(groups, "optimized", progress=lambda step, _: bar.note(step))
        bar.step()
        pairs, vectors = _pairs(baseline, optimized, regression, bar)
        report = _judged(settings, baseline, optimized, regression, pairs)
        if not baseline.has_head:  # an embedding model: its neighbours (rollout.retrieval)
            report.retrieval = _retrieval(settings, regression, report, vectors)
        if speed:
            _speed(report, settings, bar)
        return report
    finally:
        bar.close()


def _pairs(baseline: Variant, optimized: Variant, regression: RegressionSet,
           bar: Bar) -> tuple[list[Pair], tuple[torch.Tensor, torch.Tensor]]:
    """Every input of the set answered by both arms, paired (rollout.agreement), and both
    arms' rows (embeddings, for an encoder) in the set's order."""
    texts = regression.texts
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    rows = {"baseline": [None] * len(texts), "optimized": [None] * len(texts)}
    chunks = [order[i:i + CHUNK] for i in range(0, len(order), CHUNK)]
    for arm, variant in (("baseline", baseline), ("optimized", optimized)):
        bar.stage(f"agreement: {arm}", len(chunks))
        for chunk in chunks:
            for i, row in zip(chunk, variant.rows([texts[i] for i in chunk]), strict=True):
                rows[arm][i] = row
            bar.step()
    base_rows, opt_rows = torch.stack(rows["baseline"]), torch.stack(rows["optimized"])
    base_scores = baseline.scores(base_rows).tolist()
    opt_scores = optimized.scores(opt_rows).tolist()
    cosines = None if baseline.has_head else (base_rows * opt_rows).sum(-1).tolist()
    index = {label: i for i, label in enumerate(baseline.labels)}
    pairs = []
    for i, example in enumerate(regression.examples):
        b_top, b_margin = margins(base_scores[i])
        o_top, o_margin = margins(opt_scores[i])
        pairs.append(Pair(b_top, o_top, b_margin, o_margin,
                          cosine=cosines[i] if cosines else None,
                          truth=index.get(example.label) if example.label else None, index=i))
    return pairs, (base_rows, opt_rows)


def split_of(settings: Settings, regression: RegressionSet) -> str:
    """`held-out` when `regression` is the configured set (by digest: the recipes calibrated
    and `auto` chose on it), else `external`."""
    configured = load_set(settings.regression_set).digest
    return "held-out" if regression.digest.split(":")[0] == configured else "external"


def _judged(settings: Settings, baseline: Variant, optimized: Variant,
            regression: RegressionSet, pairs: list[Pair]) -> Report:
    """The report's agreement part: the judged split's summary and slices, and the calibration
    split's summary beside them (held-out mode)."""
    split, margin = split_of(settings, regression), settings.verify_min_margin
    judged = [pairs[i] for i in regression.distinct()]
    calibration = None
    if split == "held-out":
        judged = [pairs[i] for i in regression.held_out()]
        calibration = summarize([pairs[i] for i in regression.calibration()], min_margin=margin)
    folded = (regression.folded("held-out") if split == "held-out"
              else len(regression) - len(judged))
    tokens = [len(ids) for ids in baseline.encode([regression.texts[p.index]
                                                   for p in judged]).ids]
    counts = pair_slice_counts(judged, tokens, regression.texts, baseline.labels, margin)
    keys = [slices_of(regression.texts[p.index], n, baseline.labels[p.baseline])
            for p, n in zip(judged, tokens, strict=True)]
    return Report(baseline, optimized, regression, summarize(judged, min_margin=margin), split,
                  calibration, slice_table(counts, settings.verify_min_slice_size),
                  folded=folded, judged=judged, judged_slices=keys)


def _retrieval(settings: Settings, regression: RegressionSet, report: Report,
               vectors: tuple[torch.Tensor, torch.Tensor]) -> Retrieval | None:
    """Retrieval compatibility over the judged inputs (rollout.retrieval): both arms' vectors,
    each query's slices, and the set's relevance labels among the judged inputs."""
    judged = [row.index for row in report.judged]
    position = {index: k for k, index in enumerate(judged)}
    relevance = {position[q]: [position[d] for d in docs if d in position]
                 for q, docs in regression.relevance().items() if q in position}
    base, optimized = (rows[judged] for rows in vectors)
    return retrieval_of(base, optimized, report.judged_slices,
                        min_size=settings.verify_min_slice_size,
                        tolerance=settings.verify_retrieval_tolerance, relevance=relevance)


def _speed(report: Report, settings: Settings, bar: Bar, rounds: int = 3) -> None:
    texts = report.regression.texts
    step = max(1, len(texts) // settings.verify_speed_inputs)
    sample = texts[::step][: settings.verify_speed_inputs]
    # served batches as the baseline's tokenizer cuts them (the same for both arms unless
    # the optimized arm's folder has another tokenizer: then an approximation for it)
    lengths = [len(ids) for ids in report.baseline.encode(sample).ids]
    variants = {"baseline": report.baseline, "optimized": report.optimized}
    sizes = settings.verify_batch_sizes
    bar.stage("throughput", len(sizes) * rounds * 2 * len(variants))
    for size in sizes:
        orders = {  # row-key suffix -> batches; served batches carry the plain keys
            "": [[sample[i] for i in batch] for batch in served_batches(lengths, size)],
            "_set_order": [sample[i:i + size] for i in range(0, len(sample), size)],
        }
        best = _best_times(variants, orders, rounds, bar)
        row = {"batch": size, "inputs": len(sample)}
        for suffix in orders:
            for arm in variants:
                row[arm + suffix] = len(sample) / best[arm + suffix]
            row["speedup" + suffix] = row["optimized" + suffix] / row["baseline" + suffix]
        report.throughput.append(row)
        if size == settings.verify_speed_batch:
            report.speedup, report.speedup_set_order = row["speedup"], row["speedup_set_order"]
    largest = [sample[: max(sizes)]]
    for arm, variant in variants.items():
        report.memory[arm] = {
            "weights_mib": weights_bytes(variant.model) / 2**20,
            "peak_mib": _peak_bytes(variant, largest) / 2**20,
            "batch": max(sizes),
        }


def _best_times(variants: dict[str, Variant], orders: dict[str, list[list[str]]], rounds: int,
                bar: Bar) -> dict[str, float]:
    """Best-of-`rounds` seconds of one pass over each order's batches, per arm (keyed
    arm + order suffix); arms and orders interleaved within each round."""
    for variant in variants.values():  # warm-up: first shapes, lazy init, compilation
        for suffix, batches in orders.items():
            _pass(variant, batches[:1], served=not suffix)
    best: dict[str, float] = {}
    for _ in range(rounds):
        for suffix, batches in orders.items():
            for arm, variant in variants.items():
                key = arm + suffix
                seconds = _pass(variant, batches, served=not suffix)
                best[key] = min(best.get(key, float("inf")), seconds)
                bar.step()
    return best


def _pass(variant: Variant, batches: list[list[str]], served: bool = True) -> float:
    """Seconds to answer `batches`: tokenize, forward, postprocess. `served`: each batch is
    forwarded as a replica forwards a merged batch (packed under the token budget, split where
    padding costs more than a forward: `Variant.served`); else as one padded forward."""
    start = time.perf_counter()
    for texts in batches:
        rows = (variant.served(texts) if served
                else variant.embed_batch([variant.encode(texts)])[0])
        variant.postprocess("classify", rows)
    return time.perf_counter() - start


def weights_bytes(model: torch.nn.Module) -> int:
    """The model's serialized size: its state dict, or a runtime's artifact file (ONNX)."""
    if hasattr(model, "size_bytes"):
        return model.size_bytes
    buffer = io.BytesIO()
    state = getattr(model, "_orig_mod", model).state_dict()
    torch.save(state, buffer)
    return buffer.tell()


def _peak_bytes(variant: Variant, batches: list[list[str]]) -> int:
    """Peak memory growth while `variant` runs `batches`: CUDA allocator peak, or sampled RSS."""
    if variant.device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        _pass(variant, batches, served=False)  # one padded forward: the worst case
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    before = _rss()
    peak = [before]
    done = threading.Event()

    def sample():
        while not done.wait(0.002):
            peak[0] = max(peak[0], _rss())

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        _pass(variant, batches, served=False)  # one padded forward: the worst case
    finally:
        done.set()
        thread.join()
    return max(0, max(peak[0], _rss()) - before)


def _rss() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
