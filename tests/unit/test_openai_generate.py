"""OpenAI's completions and chat completions (serve.gateway.protocols.openai_generate): requests
parsed into a prompt and its sampling, what cannot be honoured refused naming the field, and
every answer, whole or streamed, read back by the `openai` SDK's own types."""

from __future__ import annotations

import json

import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from serve.gateway.protocols.door import BadRequest
from serve.gateway.protocols.openai_generate import (
    DONE,
    Answer,
    GenerateCall,
    parse,
    stream_error,
)
from serve.generative.decode import Event, Sampling


def body(**fields) -> bytes:
    return json.dumps(fields).encode()


def test_a_completion_request_becomes_a_prompt_and_its_sampling():
    call = parse(body(model="small", prompt="The team", max_tokens=20, temperature=0,
                      top_p=0.5, seed=3, stop="\n", user="u1"), chat=False)
    assert call == GenerateCall(
        chat=False, model="small", prompt="The team", messages=None,
        sampling=Sampling(max_tokens=20, temperature=0, top_p=0.5, seed=3, stop=("\n",)),
        stream=False, include_usage=False, routing_key="u1")
    assert parse(body(model="m", prompt=["one"]), chat=False).prompt == "one"
    assert parse(body(model="m", prompt=[1, 2, 3]), chat=False).prompt == [1, 2, 3]
    defaults = parse(body(model="m", prompt="x"), chat=False, default_max_tokens=16).sampling
    assert defaults == Sampling(max_tokens=16, temperature=1.0, top_p=1.0)


def test_a_chat_request_keeps_its_messages_and_prefers_max_completion_tokens():
    messages = [{"role": "user", "content": "hi"}]
    call = parse(body(model="m", messages=messages, max_tokens=5, max_completion_tokens=9,
                      stream=True, stream_options={"include_usage": True}), chat=True)
    assert call.chat and call.messages == messages and call.prompt is None
    assert call.sampling.max_tokens == 9 and call.stream and call.include_usage


@pytest.mark.parametrize("fields, param", [
    ({"n": 2}, "n"), ({"best_of": 3}, "best_of"), ({"echo": True}, "echo"),
    ({"logprobs": 2}, "logprobs"), ({"logit_bias": {"5": 10}}, "logit_bias"),
    ({"presence_penalty": 0.5}, "presence_penalty"), ({"suffix": "end"}, "suffix"),
    ({"frequency_penalty": 1}, "frequency_penalty"), ({"stop": ["a"] * 5}, "stop"),
    ({"stop": [""]}, "stop"), ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"temperature": 3}, "temperature"), ({"top_p": 0}, "top_p"), ({"max_tokens": 0},
                                                                    "max_tokens"),
    ({"prompt": ["a", "b"]}, "prompt"), ({"prompt": 5}, "prompt"), ({"frobnicate": 1},
                                                                     "frobnicate"),
])
def test_what_cannot_be_honoured_is_a_400_naming_the_field(fields, param):
    with pytest.raises(BadRequest) as refused:
        parse(body(**{"model": "m", "prompt": "x", **fields}), chat=False)
    assert refused.value.status == 400 and refused.value.param == param, str(refused.value)


def test_a_chat_with_tools_or_no_messages_is_refused():
    with pytest.raises(BadRequest, match="tools"):
        parse(body(model="m", messages=[], tools=[{"type": "function"}]), chat=True)
    with pytest.raises(BadRequest, match="messages"):
        parse(body(model="m"), chat=True)
    with pytest.raises(BadRequest, match="not valid JSON"):
        parse(b"{", chat=True)


LAST = Event(finish="length", prompt_tokens=7, completion_tokens=3)


def events(raw: bytes) -> list[dict | str]:
    """The SSE events' data, `[DONE]` as the string."""
    assert raw.endswith(b"\n\n")
    out = []
    for block in raw.decode().split("\n\n")[:-1]:
        assert block.startswith("data: "), block
        data = block[len("data: "):]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_whole_answers_are_what_the_sdk_reads():
    completion = parse(body(model="small", prompt="x"), chat=False)
    read = Completion.model_validate_json(Answer(completion, "r1", 100).body("abc", LAST))
    assert read.id == "cmpl-r1" and read.choices[0].text == "abc"
    assert read.choices[0].finish_reason == "length" and read.usage.total_tokens == 10
    chat = parse(body(model="small", messages=[{"role": "user", "content": "x"}]), chat=True)
    read = ChatCompletion.model_validate_json(Answer(chat, "r2", 100).body("hey", LAST))
    assert read.choices[0].message.content == "hey" and read.choices[0].message.role == \
        "assistant"
    assert read.usage.prompt_tokens == 7 and read.usage.completion_tokens == 3


def test_a_chat_stream_is_chunks_the_sdk_reads_ending_in_done():
    call = parse(body(model="small", messages=[{"role": "user", "content": "x"}], stream=True,
                      stream_options={"include_usage": True}), chat=True)
    answer = Answer(call, "r3", 100)
    raw = answer.first() + answer.chunk("Hel") + answer.chunk("") + answer.chunk("lo") + \
        answer.last(Event(finish="stop", prompt_tokens=4, completion_tokens=2))
    data = events(raw)
    assert data[-1] == "[DONE]" and raw.endswith(DONE)
    chunks = [ChatCompletionChunk.model_validate(d) for d in data[:-1]]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == 6


def test_a_completion_stream_without_usage_has_no_usage_chunk():
    answer = Answer(parse(body(model="small", prompt="x", stream=True), chat=False), "r4", 1)
    assert answer.first() == b""
    data = events(answer.chunk("ab") + answer.last(LAST))
    # as OpenAI streams them: finish_reason null until the last chunk (the SDK builds stream
    # chunks without validating; its type admits only a whole answer's reasons)
    assert data[0]["choices"] == [{"index": 0, "text": "ab", "finish_reason": None,
                                   "logprobs": None}] and data[0]["object"] == "text_completion"
    last = Completion.model_validate(data[1])
    assert last.choices[0].text == "" and last.choices[0].finish_reason == "length"
    assert last.usage is None and data[2] == "[DONE]"


def test_a_stream_that_fails_ends_with_an_error_event():
    [data] = events(stream_error("the model failed", "server_error"))
    assert data["error"]["message"] == "the model failed" and data["error"]["type"] == \
        "server_error"
