"""The decode loop streamed to asyncio (serve.generative.streaming) with the real small LM, and
prompts as token ids (serve.generative.prompts): concurrent streams each get their own greedy
answer, a consumer that stops reading frees its sequence, and bad prompts are refused with the
reason."""

from __future__ import annotations

import asyncio
import time

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from serve.generative.decode import DecodeLoop, NeverFits, Sampling
from serve.generative.kv import KvBudget, KvCost
from serve.generative.prompts import BadPrompt, chat_ids, completion_ids, plain_chat
from serve.generative.streaming import Runner
from tests.causal_lm import assert_greedy


@pytest.fixture(scope="module")
def lm(small_lm):
    return (AutoModelForCausalLM.from_pretrained(small_lm).eval(),
            AutoTokenizer.from_pretrained(small_lm))


@pytest.fixture
def runner(lm):
    model, tokenizer = lm
    cost = KvCost.of(model.config, 4)
    made = Runner(DecodeLoop(model, tokenizer, KvBudget(400 * cost.per_token, cost)))
    yield made
    made.close()


def test_concurrent_streams_each_get_the_answer_they_get_alone(lm, runner):
    _, tokenizer = lm
    prompts = [completion_ids(tokenizer, text) for text in
               ("The hospital reviewed the", "Local news: the", "shares fell")]
    greedy = Sampling(max_tokens=20, temperature=0)

    async def both():
        alone = [await runner.complete(p, greedy) for p in prompts]
        together = await asyncio.gather(*(runner.complete(p, greedy) for p in prompts))
        return alone, together

    alone, together = asyncio.run(both())
    model, _ = lm
    for prompt, (_, tokens, _), (_, batched, _) in zip(prompts, alone, together, strict=True):
        assert_greedy(model, prompt, tokens)
        assert_greedy(model, prompt, batched)  # in a batch, up to float noise on near-ties
    for text, tokens, last in together:
        assert last.finish in ("length", "stop") and last.completion_tokens == len(tokens)
        assert text == tokenizer.decode(tokens, skip_special_tokens=True)


def test_a_consumer_that_stops_reading_frees_its_sequence(lm, runner):
    _, tokenizer = lm
    prompt = completion_ids(tokenizer, "The treaty announced the referendum on")

    async def read_three():
        stream = runner.stream(prompt, Sampling(max_tokens=200, temperature=0,
                                                ignore_eos=True))
        seen = [event async for event, _ in zip_count(stream, 3)]
        await stream.aclose()  # as the ASGI server does when the client goes away
        return seen

    seen = asyncio.run(read_three())
    assert len(seen) == 3 and all(e.finish is None for e in seen)
    deadline = time.monotonic() + 10
    while runner.loop.sequences_running or runner.loop.budget.in_use_bytes:
        assert time.monotonic() < deadline, "the sequence kept its cache"
        time.sleep(0.01)


async def zip_count(stream, count: int):
    """The first `count` events of `stream`."""
    n = 0
    async for event in stream:
        yield event, n
        n += 1
        if n == count:
            return


def test_a_deadline_ends_the_stream_with_timeout(lm, runner):
    _, tokenizer = lm
    prompt = completion_ids(tokenizer, "The hospital reviewed the")
    text, tokens, last = asyncio.run(runner.complete(
        prompt, Sampling(max_tokens=300, temperature=0, ignore_eos=True),
        deadline=time.monotonic() + 0.05))
    assert last.finish == "timeout" and len(tokens) < 300


def test_what_never_fits_is_refused_before_any_event(lm, runner):
    _, tokenizer = lm
    prompt = completion_ids(tokenizer, "The hospital reviewed the")
    with pytest.raises(NeverFits, match="budget holds 400"):
        asyncio.run(runner.complete(prompt, Sampling(max_tokens=450)))
    assert not runner.loop.sequences_waiting


def test_prompts_as_token_ids(lm):
    _, tokenizer = lm
    assert completion_ids(tokenizer, "the cup")[0] == tokenizer.bos_token_id
    assert completion_ids(tokenizer, [5, 6, 7]) == [5, 6, 7]
    for bad, says in (("", "prompt is empty"), ([], "empty list"),
                      ([3, len(tokenizer)], "outside the vocabulary")):
        with pytest.raises(BadPrompt, match=says):
            completion_ids(tokenizer, bad)
    messages = [{"role": "system", "content": "Be terse."},
                {"role": "user", "content": [{"type": "text", "text": "Who won"},
                                             {"type": "text", "text": " the cup?"}]}]
    assert not tokenizer.chat_template  # the small LM has none: the plain template
    assert plain_chat([{"role": "user", "content": "hi"}]) == "user: hi\nassistant:"
    assert tokenizer.decode(chat_ids(tokenizer, messages), skip_special_tokens=True) == \
        "system: Be terse.\nuser: Who won the cup?\nassistant:"
    for bad, says in (([], "messages is empty"),
                      ([{"role": "wizard", "content": "x"}], r"messages\[0\].role"),
                      ([{"role": "user", "content": 3}], r"messages\[0\].content"),
                      ([{"role": "user", "content": [{"type": "image_url"}]}], "text parts")):
        with pytest.raises(BadPrompt, match=says):
            chat_ids(tokenizer, bad)


def test_a_tokenizers_own_chat_template_is_used(lm):
    _, tokenizer = lm
    templated = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    templated.chat_template = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}"
                               "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
    ids = chat_ids(templated, [{"role": "user", "content": "hello"}])
    assert templated.decode(ids) == "<user>hello<assistant>"
