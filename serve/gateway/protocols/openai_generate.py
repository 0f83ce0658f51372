"""OpenAI's completions and chat completions, as the `openai` SDK calls them: the requests a
generative arm takes and the answers it gives, whole or streamed as server-sent events.

    POST /v1/completions       {"model", "prompt": "text" | [token ids], "max_tokens",
                                "temperature", "top_p", "seed", "stop", "stream",
                                "stream_options": {"include_usage"}, "user"}
    POST /v1/chat/completions  {"model", "messages": [{"role", "content"}], "max_tokens" |
                                "max_completion_tokens", the same sampling fields, "stream", ...}

One prompt (one choice) per request. `temperature` 0 is greedy; `seed` makes a draw repeatable;
`stop` is up to four strings the answer ends before; `user` is the routing key when no
`X-Routing-Key` is sent; `ignore_eos` (vLLM's extension, `extra_body` in the SDK) answers to
`max_tokens` past any end-of-sequence token. Fields this gateway cannot honour are refused (400
naming the field), never ignored: `n` > 1, `best_of` > 1, `echo`, `logprobs`, `suffix`,
`logit_bias`, non-zero `presence_penalty` / `frequency_penalty`, tools. A streamed answer is
`data: {chunk}` events ending in `data: [DONE]`; a stream that fails after its first token ends
with `data: {"error": ...}` (the SDK raises it) and no `[DONE]`.

`CompletionsDoor` and `ChatDoor` are the two doors; the gateway's generative path
(serve.gateway.generation) serves them. A gateway whose model does not generate refuses them
(400 naming `model`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

import orjson
from fastapi import Request
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
)

from serve.gateway.protocols.door import BadRequest, Parsed, first_error
from serve.gateway.protocols.openai_api import OpenAIDoor
from serve.generative.wire import Event, Sampling

DONE = b"data: [DONE]\n\n"
MAX_STOPS = 4


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: StrictBool = False


class _Sampled(BaseModel):
    """What both requests share."""

    model_config = ConfigDict(extra="forbid")

    model: StrictStr
    max_tokens: StrictInt | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    seed: StrictInt | None = None
    stop: StrictStr | list[StrictStr] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    user: StrictStr | None = None
    n: StrictInt = 1
    logprobs: StrictBool | StrictInt | None = None
    logit_bias: dict | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    ignore_eos: StrictBool = False  # vLLM's extension: answer to `max_tokens` past any EOS


class CompletionRequest(_Sampled):
    """The body of `POST /v1/completions`."""

    prompt: StrictStr | list[StrictStr] | list[StrictInt]
    best_of: StrictInt = 1
    echo: StrictBool = False
    suffix: StrictStr | None = None


class ChatCompletionRequest(_Sampled):
    """The body of `POST /v1/chat/completions`."""

    messages: list[dict]
    max_completion_tokens: StrictInt | None = Field(None, ge=1)
    tools: list | None = None


@dataclass(frozen=True)
class GenerateCall:
    """A parsed request: what to prompt with, how to sample, how to answer."""
    chat: bool
    model: str
    prompt: str | list[int] | None  # a completion's
    messages: list[dict] | None  # a chat's
    sampling: Sampling
    stream: bool
    include_usage: bool
    routing_key: str | None


def parse(body: bytes, chat: bool, default_max_tokens: int = 16) -> GenerateCall:
    """The request, or BadRequest naming the field."""
    kind = ChatCompletionRequest if chat else CompletionRequest
    try:
        request = kind.model_validate_json(body)
    except ValidationError as exc:
        raise BadRequest(*first_error(exc)) from None
    _refuse_unsupported(request)
    stops = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
    if len(stops) > MAX_STOPS or not all(stops):
        raise BadRequest(f"stop: at most {MAX_STOPS} non-empty strings", "stop")
    max_tokens = (getattr(request, "max_completion_tokens", None) or request.max_tokens
                  or default_max_tokens)
    sampling = Sampling(max_tokens=max_tokens, temperature=request.temperature,
                        top_p=request.top_p, seed=request.seed, stop=tuple(stops),
                        ignore_eos=request.ignore_eos)
    return GenerateCall(
        chat=chat, model=request.model, prompt=None if chat else _prompt(request.prompt),
        messages=request.messages if chat else None, sampling=sampling, stream=request.stream,
        include_usage=bool(request.stream_options and request.stream_options.include_usage),
        routing_key=request.user)


def _refuse_unsupported(request: _Sampled) -> None:
    checks = [("n", request.n != 1, "only 1 choice per request"),
              ("logprobs", request.logprobs not in (None, False), "is not supported"),
              ("logit_bias", bool(request.logit_bias), "is not supported"),
              ("presence_penalty", request.presence_penalty != 0, "is not supported"),
              ("frequency_penalty", request.frequency_penalty != 0, "is not supported")]
    if isinstance(request, CompletionRequest):
        checks += [("best_of", request.best_of != 1, "only 1"),
                   ("echo", request.echo, "is not supported"),
                   ("suffix", bool(request.suffix), "is not supported")]
    else:
        checks.append(("tools", bool(request.tools), "are not supported"))
    if request.stream_options is not None and not request.stream:
        checks.append(("stream_options", True, "only with stream: true"))
    for field, bad, why in checks:
        if bad:
            raise BadRequest(f"{field}: {why}", field)


def _prompt(prompt: str | list) -> str | list[int]:
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        if len(prompt) != 1:
            raise BadRequest("prompt: one prompt per request", "prompt")
        return prompt[0]
    return prompt


FINISH = {"stop": "stop", "length": "length"}  # the engine's ends an answer may report


class Answer:
    """The answer's bodies: whole (`body`) or as SSE events (`chunk`, `last`, `usage`)."""

    def __init__(self, call: GenerateCall, request_id: str, created: float | None = None):
        self.call = call
        self.id = f"{'chatcmpl' if call.chat else 'cmpl'}-{request_id}"
        self.created = int(created if created is not None else time.time())
        self.object = "chat.completion" if call.chat else "text_completion"

    def body(self, text: str, last: Event) -> bytes:
        """The whole answer of a request without `stream`."""
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}}
                  if self.call.chat else {"index": 0, "text": text})
        choice.update(finish_reason=FINISH[last.finish], logprobs=None)
        return orjson.dumps({"id": self.id, "object": self.object, "created": self.created,
                             "model": self.call.model, "choices": [choice],
                             "usage": usage(last)})

    def first(self) -> bytes:
        """A chat stream opens with the assistant's role (completions send nothing first)."""
        return self._event({"role": "assistant", "content": ""}, None) if self.call.chat \
            else b""

    def chunk(self, text: str) -> bytes:
        if not text:
            return b""
        return self._event({"content": text} if self.call.chat else text, None)

    def last(self, event: Event) -> bytes:
        """The finishing chunk, the usage chunk where asked for, and `[DONE]`."""
        out = self._event({} if self.call.chat else "", FINISH[event.finish])
        if self.call.include_usage:
            out += _sse({"id": self.id, "object": self._chunk_object(), "created": self.created,
                         "model": self.call.model, "choices": [], "usage": usage(event)})
        return out + DONE

    def _event(self, content: dict | str, finish: str | None) -> bytes:
        choice = {"index": 0, "delta": content} if self.call.chat else {"index": 0,
                                                                        "text": content}
        choice.update(finish_reason=finish, logprobs=None)
        return _sse({"id": self.id, "object": self._chunk_object(), "created": self.created,
                     "model": self.call.model, "choices": [choice]})

    def _chunk_object(self) -> str:
        return "chat.completion.chunk" if self.call.chat else "text_completion"


def stream_error(message: str, kind: Literal["server_error", "timeout"] = "server_error"
                 ) -> bytes:
    """How a stream that fails after its first token ends: the SDK raises it."""
    return _sse({"error": {"message": message, "type": kind, "param": None, "code": None}})


def usage(last: Event) -> dict:
    return {"prompt_tokens": last.prompt_tokens, "completion_tokens": last.completion_tokens,
            "total_tokens": last.prompt_tokens + last.completion_tokens}


def _sse(document: dict) -> bytes:
    return b"data: " + orjson.dumps(document) + b"\n\n"


class CompletionsDoor(OpenAIDoor):
    """`POST /v1/completions`: errors in OpenAI's shape (OpenAIDoor's)."""

    name, chat = "completions", False

    def call(self, body: bytes, default_max_tokens: int = 16) -> GenerateCall:
        """The request for the served model (404 naming another), or BadRequest."""
        call = parse(body, self.chat, default_max_tokens)
        self.served.check(call.model)
        return call

    def parse(self, body: bytes, request: Request) -> Parsed:
        """The encoders' request path asks this: the model does not generate."""
        raise BadRequest(f"the model {self.served.name!r} does not generate (an encoder: "
                         f"POST /v1/embeddings)", param="model")


class ChatDoor(CompletionsDoor):
    """`POST /v1/chat/completions`."""

    name, chat = "chat", True
