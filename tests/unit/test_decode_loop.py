"""The decode loop (serve.generative.decode) with the real small LM: sequences join (packed into
the running rows' step, or prefilled apart) and leave a running batch between steps and each
still gets the model's own greedy tokens; the KV budget admits what fits, holds the rest and
refuses what never fits; cancellation, deadlines, seeds, stop strings and a failing forward each
end only their own sequence."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from serve.generative.batch import PaddedBatch, packable, prefill
from serve.generative.decode import (
    DecodeLoop,
    Event,
    NeverFits,
    PromptTooLong,
    Sampling,
    Sequence,
)
from serve.generative.kv import KvBudget, KvCost, Row
from tests.causal_lm import assert_greedy

PROMPTS = ["The hospital reviewed the", "Local news: the", "Why the mental health",
           "shares fell", "The treaty announced the referendum on", "def"]


@pytest.fixture(scope="module")
def lm(small_lm):
    tokenizer = AutoTokenizer.from_pretrained(small_lm)
    model = AutoModelForCausalLM.from_pretrained(small_lm).eval()
    return model, tokenizer


def cost(model) -> KvCost:
    return KvCost.of(model.config, dtype_bytes=4)


def loop_of(lm, capacity_tokens: int = 100_000, **kwargs) -> DecodeLoop:
    model, tokenizer = lm
    return DecodeLoop(model, tokenizer, KvBudget(capacity_tokens * cost(model).per_token,
                                                 cost(model)), **kwargs)


class Heard:
    """A sequence's events, as its `emit` hears them."""

    def __init__(self):
        self.events: list[Event] = []

    def __call__(self, event: Event) -> None:
        self.events.append(event)

    @property
    def text(self) -> str:
        return "".join(e.text for e in self.events)

    @property
    def finish(self) -> Event | None:
        return next((e for e in self.events if e.finish), None)


def submit(loop, tokenizer, prompt: str, **sampling) -> tuple[Sequence, Heard]:
    heard = Heard()
    ids = tokenizer(prompt)["input_ids"]
    sampling.setdefault("temperature", 0)
    return loop.submit(Sequence(ids, Sampling(**sampling), heard)), heard


def until_done(loop, sequences, steps: int = 500) -> None:
    for _ in range(steps):
        if all(s.finish for s in sequences):
            return
        loop.step()
    raise AssertionError("sequences never finished")


class FailingModel(torch.nn.Module):
    """The small LM, failing the forwards `fails` picks as a machine out of memory does (or
    with `error` for any other failure)."""

    def __init__(self, model, fails, error: str = "DefaultCPUAllocator: can't allocate memory"):
        super().__init__()
        self.model, self.fails, self.error = model, fails, error
        self.config, self.generation_config = model.config, model.generation_config

    def forward(self, input_ids, **kwargs):
        if self.fails(input_ids):
            raise RuntimeError(self.error)
        return self.model(input_ids=input_ids, **kwargs)


@pytest.mark.parametrize("packed", [True, False], ids=["packed joins", "prefill apart"])
def test_each_joining_sequence_gets_the_models_own_greedy_tokens(lm, packed):
    model, tokenizer = lm
    counted = CountingModel(model, None)
    loop = DecodeLoop(counted, tokenizer, KvBudget(10**8, cost(model)), packed=packed)
    sequences = []
    for i, prompt in enumerate(PROMPTS):  # a new sequence joins every third step
        sequences.append(submit(loop, tokenizer, prompt, max_tokens=12 + 3 * i))
        for _ in range(3):
            loop.step()
    until_done(loop, [s for s, _ in sequences])
    for sequence, heard in sequences:
        assert_greedy(model, sequence.prompt, sequence.generated)  # as the model alone ranks
        assert heard.finish.finish in ("length", "stop")
        assert heard.finish.completion_tokens == len(sequence.generated)
        assert heard.text == tokenizer.decode(sequence.generated, skip_special_tokens=True)
    assert loop.sequences_running == 0 and loop.batch.rows == 0
    assert loop.budget.in_use_bytes == 0 < loop.budget.peak_bytes
    # five of the six join running sequences: packed, each of those steps is one forward
    assert counted.packed == (5 if packed else 0) and loop.packed == packed
    assert counted.forwards == counted.packed + (1 if packed else 6) + counted.steps


class CountingModel(FailingModel):
    """The small LM, counting its forwards: packed steps (a 4D mask), decode steps (one token a
    row) and the rest (prefills)."""

    forwards = packed = steps = 0

    def forward(self, input_ids, **kwargs):
        self.forwards += 1
        self.packed += kwargs["attention_mask"].dim() == 4
        self.steps += input_ids.shape[1] == 1 and kwargs["attention_mask"].dim() == 2
        return self.model(input_ids=input_ids, **kwargs)


def test_a_packed_step_answers_and_caches_as_a_step_then_a_prefill(lm):
    model, tokenizer = lm
    running = [tokenizer(p)["input_ids"] for p in PROMPTS[:2]]
    joining = [tokenizer(p)["input_ids"] for p in (PROMPTS[4], PROMPTS[5])]  # longer, shorter
    packed, apart = PaddedBatch(), PaddedBatch()
    with torch.inference_mode():
        for batch in (packed, apart):
            cache, mask, logits = prefill(model, running)
            batch.join(cache, mask)
        last, positions = logits.argmax(-1).tolist(), [len(p) for p in running]
        both = packed.step_joining(model, last, positions, joining)
        step = apart.step(model, last, positions)
        cache, mask, first = prefill(model, joining)
        apart.join(cache, mask)
        assert torch.allclose(both, torch.cat([step, first]), atol=1e-4)
        for (keys, values), (other_keys, other_values) in zip(packed.layers, apart.layers,
                                                              strict=True):
            for row in range(4):  # each row's real columns, whatever its padding
                real, other = packed.mask[row].bool(), apart.mask[row].bool()
                assert torch.allclose(keys[row][:, real], other_keys[row][:, other], atol=1e-5)
                assert torch.allclose(values[row][:, real], other_values[row][:, other],
                                      atol=1e-5)
        nexts = both.argmax(-1).tolist()
        places = [len(p) + 1 for p in running] + [len(p) for p in joining]
        assert torch.allclose(packed.step(model, nexts, places), apart.step(model, nexts, places),
                              atol=1e-4)


class EveryLogitModel(CountingModel):
    """The small LM behind a wrapper that drops `logits_to_keep`: logits for every token."""

    def forward(self, input_ids, **kwargs):
        kwargs.pop("logits_to_keep", None)
        return super().forward(input_ids, **kwargs)


def test_a_model_that_keeps_every_tokens_logits_still_packs(lm):
    model, tokenizer = lm
    wrapped = EveryLogitModel(model, None)
    loop = DecodeLoop(wrapped, tokenizer, KvBudget(10**8, cost(model)))
    first, _ = submit(loop, tokenizer, PROMPTS[0], max_tokens=8)
    loop.step()
    second, _ = submit(loop, tokenizer, PROMPTS[4], max_tokens=8)
    until_done(loop, [first, second])
    assert wrapped.packed == 1 and loop.packed
    for sequence in (first, second):
        assert_greedy(model, sequence.prompt, sequence.generated)


@pytest.mark.parametrize(("config", "packs"), [
    ({"model_type": "llama"}, True), ({"model_type": "qwen2", "sliding_window": None}, True),
    ({"model_type": "gpt2"}, False), ({"model_type": "mistral", "sliding_window": 4096}, False),
    ({"model_type": "llama", "attn_logit_softcapping": 50.0}, False)])
def test_only_plain_attention_over_the_whole_cache_is_packed(config, packs):
    assert packable(SimpleNamespace(**config)) is packs


def test_the_packed_attention_is_registered_at_the_first_packed_step_not_at_import():
    # transformers' attention registry loads its modeling code and torchao, whose console
    # lines `serve run`'s driver process (which imports the app) must not print
    code = ("import sys, serve.config, serve.generative.decode; "
            "print(sorted(m for m in ('torchao', 'transformers.modeling_utils') "
            "if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


class NoPackedModel(FailingModel):
    """The small LM refusing a 4D attention mask, as a model whose attention cannot take one."""

    def forward(self, input_ids, **kwargs):
        if kwargs["attention_mask"].dim() == 4:
            raise ValueError("custom 4D attention masks are not supported")
        return self.model(input_ids=input_ids, **kwargs)


def test_a_model_that_refuses_a_packed_step_is_prefilled_apart_from_then_on(lm, caplog):
    model, tokenizer = lm
    loop = DecodeLoop(NoPackedModel(model, None), tokenizer, KvBudget(10**8, cost(model)))
    first, _ = submit(loop, tokenizer, PROMPTS[0], max_tokens=8)
    loop.step()
    second, _ = submit(loop, tokenizer, PROMPTS[1], max_tokens=8)
    until_done(loop, [first, second])
    assert loop.packed is False and "packed prefill refused (ValueError" in caplog.text
    for sequence in (first, second):
        assert sequence.finish in ("length", "stop")
        assert_greedy(model, sequence.prompt, sequence.generated)


class FirstPackedOutOfMemory(FailingModel):
    """The small LM, out of memory in its first packed forward only."""

    tries = 0

    def forward(self, input_ids, **kwargs):
        if kwargs["attention_mask"].dim() == 4:
            self.tries += 1
            if self.tries == 1:
                raise RuntimeError(self.error)
        return self.model(input_ids=input_ids, **kwargs)


def test_a_packed_step_out_of_memory_is_taken_apart_and_packing_goes_on(lm):
    model, tokenizer = lm
    failing = FirstPackedOutOfMemory(model, None)
    loop = DecodeLoop(failing, tokenizer, KvBudget(10**8, cost(model)))
    sequences = [submit(loop, tokenizer, PROMPTS[0], max_tokens=10)[0]]
    for prompt in PROMPTS[1:3]:
        loop.step()
        sequences.append(submit(loop, tokenizer, prompt, max_tokens=10)[0])
    until_done(loop, sequences)
    assert failing.tries == 2 and loop.packed  # the second join was packed again
    for sequence in sequences:
        assert sequence.finish in ("length", "stop")
        assert_greedy(model, sequence.prompt, sequence.generated)


def test_the_budget_holds_what_does_not_fit_now_and_refuses_what_never_fits(lm):
    model, tokenizer = lm
    loop = loop_of(lm, capacity_tokens=60)
    first, _ = submit(loop, tokenizer, PROMPTS[0], max_tokens=30)
    second, heard = submit(loop, tokenizer, PROMPTS[1], max_tokens=30)
    loop.step()
    assert loop.sequences_running == 1 and loop.sequences_waiting == 1
    until_done(loop, [first, second])
    assert heard.finish.finish in ("length", "stop") and 0 < len(second.generated) <= 30
    assert loop.budget.peak_bytes <= loop.budget.capacity_bytes
    with pytest.raises(NeverFits, match="KV cache budget holds 60"):
        submit(loop, tokenizer, PROMPTS[0], max_tokens=60)
    context = model.config.max_position_embeddings
    with pytest.raises(PromptTooLong, match=f"context holds {context}"):
        loop.submit(Sequence([1] * context, Sampling(max_tokens=1), Heard()))


def test_max_tokens_past_the_context_end_the_answer_at_the_context(lm):
    model, tokenizer = lm
    loop = loop_of(lm)
    context = model.config.max_position_embeddings
    sequence = loop.submit(Sequence([tokenizer.bos_token_id] + [5] * (context - 4),
                                    Sampling(max_tokens=50, temperature=0), Heard()))
    assert sequence.sampling.max_tokens == 3


def test_the_padded_batch_worst_case_decides_admission():
    budget = KvBudget(100 * 8, KvCost(1, 1, 1, 4))  # 8 bytes a token: 100 tokens
    assert budget.admits([], 0, Row(10, 90))
    assert not budget.admits([], 0, Row(10, 91))
    # two rows 20 wide growing 10 and 40 more: (20+10)*2 = 60, then (20+40)*1 = 60
    assert budget.admits([Row(20, 10)], 20, Row(5, 40))
    # a third 70 long one: the batch widens to 70 for every row
    assert not budget.admits([Row(20, 10), Row(5, 40)], 20, Row(70, 1))
    assert budget.never_fits(101) and not budget.never_fits(100)
    with pytest.raises(ValueError, match="holds no token"):
        KvBudget(4, KvCost(1, 1, 1, 4))


def test_the_cost_of_a_token_is_layers_kv_heads_head_size_bytes_twice(lm):
    model, _ = lm
    config = model.config
    assert cost(model).per_token == (config.num_hidden_layers * config.num_key_value_heads
                                     * (config.hidden_size // config.num_attention_heads) * 4 * 2)


def test_a_cancelled_sequence_leaves_at_the_next_step_and_frees_its_cache(lm):
    _, tokenizer = lm
    loop = loop_of(lm)
    keep, _ = submit(loop, tokenizer, PROMPTS[0], max_tokens=40)
    gone, heard = submit(loop, tokenizer, PROMPTS[4], max_tokens=40)
    for _ in range(4):
        loop.step()
    held = loop.budget.in_use_bytes
    loop.cancel(gone)
    loop.step()
    assert heard.finish.finish == "cancelled" and loop.sequences_running == 1
    assert loop.budget.in_use_bytes < held
    until_done(loop, [keep])
    assert len(keep.generated) == 40 or keep.finish == "stop"


def test_a_deadline_ends_a_waiting_or_running_sequence(lm):
    _, tokenizer = lm
    now = [0.0]
    loop = loop_of(lm, capacity_tokens=60, clock=lambda: now[0])
    running, ran = submit(loop, tokenizer, PROMPTS[0], max_tokens=40)
    waiting, waited = submit(loop, tokenizer, PROMPTS[1], max_tokens=40)
    running.deadline, waiting.deadline = 10.0, 5.0
    loop.step()
    now[0] = 6.0
    loop.step()
    assert waited.finish.finish == "timeout" and not waiting.generated
    now[0] = 11.0
    loop.step()
    assert ran.finish.finish == "timeout" and loop.sequences_running == 0


def test_a_seed_gives_the_same_draw_alone_or_in_a_batch(lm):
    _, tokenizer = lm
    alone = loop_of(lm)
    solo, _ = submit(alone, tokenizer, PROMPTS[1], max_tokens=20, temperature=1.0, seed=7)
    until_done(alone, [solo])
    crowded = loop_of(lm)
    others = [submit(crowded, tokenizer, p, max_tokens=25, temperature=1.0)[0]
              for p in PROMPTS[2:5]]
    again, _ = submit(crowded, tokenizer, PROMPTS[1], max_tokens=20, temperature=1.0, seed=7)
    until_done(crowded, [again, *others])
    assert again.generated == solo.generated
    narrow = loop_of(lm)  # top_p near 0 keeps only the most likely token: greedy
    sampled, _ = submit(narrow, tokenizer, PROMPTS[0], max_tokens=15, temperature=1.5,
                        top_p=1e-6, seed=1)
    greedy, _ = submit(narrow, tokenizer, PROMPTS[0], max_tokens=15)
    until_done(narrow, [sampled, greedy])
    assert sampled.generated == greedy.generated


def test_a_stop_string_ends_the_text_before_it_and_no_piece_of_it_is_sent(lm):
    _, tokenizer = lm
    loop = loop_of(lm)
    free, _ = submit(loop, tokenizer, PROMPTS[0], max_tokens=30)
    until_done(loop, [free])
    text = tokenizer.decode(free.generated, skip_special_tokens=True)
    words = text.split()
    stop = " " + words[2]  # the third word, with the space before it
    cut, heard = submit(loop, tokenizer, PROMPTS[0], max_tokens=30, stop=(stop, "never"))
    until_done(loop, [cut])
    assert heard.finish.finish == "stop"
    assert heard.text == text[:text.index(stop)]
    sent = ""  # no piece sent ever held the start of the stop string the text later cut
    for event in heard.events:
        sent += event.text
        assert text.startswith(sent) and len(sent) <= text.index(stop)


def test_text_pieces_make_up_any_script_exactly(lm):
    from serve.generative.text import TextStream
    _, tokenizer = lm
    text = "中国队的比赛 🚀 naïve café, done."
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    stream = TextStream(tokenizer)
    pieces = [stream.push(token) for token in ids] + [stream.flush()]
    assert "".join(pieces) == text
    assert all("\ufffd" not in piece for piece in pieces)


def test_a_prefill_out_of_memory_fails_its_sequence_only(lm):
    model, tokenizer = lm
    doomed = tokenizer(PROMPTS[4])["input_ids"]
    failing = FailingModel(model, lambda ids: any(  # a prefill holding it, padded or not
        row.tolist()[-len(doomed):] == doomed for row in ids))
    loop = DecodeLoop(failing, tokenizer, KvBudget(10**8, cost(model)))
    fine, _ = submit(loop, tokenizer, PROMPTS[0], max_tokens=10)
    bad, heard = submit(loop, tokenizer, PROMPTS[4], max_tokens=10)
    until_done(loop, [fine, bad])
    assert heard.finish.finish == "error" and "out of memory in its prefill" in heard.finish.error
    assert fine.finish in ("length", "stop") and fine.generated


def test_a_decode_step_out_of_memory_fails_the_newest_sequence_and_the_rest_go_on(lm):
    model, tokenizer = lm
    failing = FailingModel(model, lambda ids: ids.shape == (3, 1))  # the step with 3 rows
    loop = DecodeLoop(failing, tokenizer, KvBudget(10**8, cost(model)))
    sequences = [submit(loop, tokenizer, p, max_tokens=10) for p in PROMPTS[:3]]
    until_done(loop, [s for s, _ in sequences])
    assert [s.finish != "error" for s, _ in sequences] == [True, True, False]
    assert "out of memory in a decode step" in sequences[2][1].finish.error


def test_the_loop_thread_serves_submits_and_outlives_a_failing_model(lm):
    model, tokenizer = lm
    broken = [True]
    failing = FailingModel(model, lambda ids: broken[0], error="a bug in a kernel")
    loop = DecodeLoop(failing, tokenizer, KvBudget(10**8, cost(model)))
    stopping = threading.Event()
    thread = threading.Thread(target=loop.run, args=(stopping,), daemon=True)
    thread.start()
    try:
        first, heard = submit(loop, tokenizer, PROMPTS[0], max_tokens=8)
        _wait(lambda: first.finish)
        assert heard.finish.finish == "error" and "the model failed" in heard.finish.error
        broken[0] = False
        second, heard = submit(loop, tokenizer, PROMPTS[0], max_tokens=8)
        _wait(lambda: second.finish)
        assert heard.finish.finish in ("length", "stop") and second.generated
    finally:
        stopping.set()
        thread.join(5)
    assert not thread.is_alive()


def _wait(condition, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_work_handed_to_the_loop_runs_on_its_thread_between_steps(lm):
    loop = loop_of(lm)
    stopping = threading.Event()
    thread = threading.Thread(target=loop.run, args=(stopping,), daemon=True)
    thread.start()
    try:
        model, tokenizer = lm
        heard = Heard()
        loop.submit(Sequence(tokenizer(PROMPTS[0])["input_ids"],
                             Sampling(max_tokens=40, temperature=0), heard))
        ran_on = loop.call(lambda: (threading.current_thread().name,
                                    torch.is_inference_mode_enabled())).result(timeout=10)
        assert ran_on == (thread.name, True)  # the loop's thread, no autograd
        with pytest.raises(ZeroDivisionError):  # the caller hears of a failed job
            loop.call(lambda: 1 / 0).result(timeout=10)
        assert loop.call(lambda: "still running").result(timeout=10) == "still running"
        deadline = time.monotonic() + 10
        while heard.finish is None:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert heard.finish.finish in ("stop", "length")  # undisturbed by the failed job
    finally:
        stopping.set()
        thread.join(5)


def test_a_first_token_says_how_long_it_queued_and_its_prefill_took(lm):
    now = [100.0]
    loop = loop_of(lm, clock=lambda: now[0], max_batch=1)
    _, tokenizer = lm
    first, heard_first = submit(loop, tokenizer, PROMPTS[0], max_tokens=3, ignore_eos=True)
    second, heard_second = submit(loop, tokenizer, PROMPTS[1], max_tokens=3, ignore_eos=True)
    now[0] += 0.5
    until_done(loop, [first])  # one at a time: the second waits for the first to finish
    now[0] += 1.0
    until_done(loop, [second])
    opening = [e for e in heard_first.events if e.token is not None]
    assert opening[0].queued_ms == pytest.approx(500) and opening[0].prefill_ms == 0
    assert all(e.queued_ms is None and e.prefill_ms is None for e in opening[1:])
    later = next(e for e in heard_second.events if e.token is not None)
    assert later.queued_ms == pytest.approx(1500)
