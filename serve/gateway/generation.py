"""A causal LM's requests through the gateway: OpenAI's completions and chat completions
(serve.gateway.protocols.openai_generate), whole or streamed as server-sent events, on the
arms' decode loops (serve.replica.generate_server).

The rollout rules are the encoders' (serve.gateway.deployment): the arm is decided from the
cached rollout state (sticky share, header routes, the override, the kill switch), and the
request's deadline (`X-Request-Timeout-Ms`, capped at `stream_timeout_s`) bounds the whole
answer, its last token included. Until the answer's first event arrives the request may still
move: a canary that fails, or has not started answering within its share of the deadline
(`canary_timeout_fraction`), is cancelled and the request asked again on baseline within what
is left (`fallback`). After it the answer is its arm's to finish: a kill switch flipped
mid-stream leaves flowing streams on their arm, and the next request follows the kill. A client
that leaves mid-stream cancels its sequence (the replica frees its KV cache at its next step).

Refused before the first token: a prompt the model's context cannot hold (400), a prompt plus
`max_tokens` over the arm's KV cache budget even alone (413 naming it), no room in the KV cache
within the deadline or a full model queue (503 + Retry-After). After it, a failure or the
deadline ends the stream with an error event in OpenAI's shape (the `openai` SDK raises it).
A whole answer (no `stream`) may carry an `Idempotency-Key`; a stream cannot be replayed, so a
key on one is refused (400).

An answer that ends normally with tokens is offered to the shadow (serve.gateway.shadow
`offer_tokens`, through `offer`): sampled, it is scored off the response path by `score`, the
optimized replica's log-probabilities of the answered tokens, teacher-forced, compared by the
baseline replica with its own (serve.replica.generate_server), whichever arm answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from ray.exceptions import RayTaskError
from ray.serve.exceptions import BackPressureError

from rollout import Arm
from rollout.settings import ModelSettings, ServingSettings, Settings, StateSettings
from serve.common.answer import BatchShape, ModelAnswer, StageTiming
from serve.common.errors import (
    GatewayError,
    InputTooLarge,
    InvalidInput,
    ModelFailed,
    ModelTimeout,
    Overloaded,
    id_headers,
)
from serve.common.json_body import JSONBody
from serve.gateway.exchange import Exchange, abandoned, server_timing
from serve.gateway.idempotent import REPLAYED, Idempotency
from serve.gateway.override import override_allowed
from serve.gateway.protocols.door import BadRequest, FrontDoor
from serve.gateway.protocols.openai_generate import (
    Answer,
    CompletionsDoor,
    GenerateCall,
    stream_error,
)
from serve.gateway.schemas import GenerateParameters
from serve.generative.prompts import BadPrompt, chat_ids, completion_ids
from serve.generative.wire import Event, NeverFits, PromptTooLong, Sampling
from serve.recipes.source import model_dir
from serve.telemetry.token_metrics import TokenMetrics

log = logging.getLogger("canary.gateway")
TASK = "generate"
GRACE_S = 5.0  # past the deadline the replica ends a sequence itself; this bounds a lost one
ENDS = ("stop", "length")  # an answer's normal ends (serve.generative.wire.Event.finish)


@dataclass
class Opened:
    """An answer that has begun: its arm, its first event, the rest to come."""

    arm: Arm
    first: dict
    events: Any  # Serve's DeploymentResponseGenerator, the first event taken
    fallback: bool
    first_at: float  # perf_counter when the first event arrived
    called_ns: int = 0  # time_ns when the arm that answers was called, and when it first did
    first_ns: int = 0
    tokenized: tuple[int, int] = (0, 0)  # time_ns of the prompt's tokenizing
    call: Any = None  # the observation's model call (its span, from the call to the end)
    prompt: list[int] = dataclasses.field(default_factory=list)
    prompt_text: str = ""  # what the prompt's slices are read from

    def cancel(self) -> None:
        with contextlib.suppress(Exception):
            self.events.cancel()


@dataclass
class Tally:
    """What an answer produced so far: its text, its last event, when each token came."""

    text: list[str] = dataclasses.field(default_factory=list)
    last: dict | None = None
    token_at: list[float] = dataclasses.field(default_factory=list)
    tokens: list[int] = dataclasses.field(default_factory=list)

    def add(self, event: dict) -> None:
        self.text.append(event["text"])
        if event["token"] is not None:
            self.token_at.append(time.perf_counter())
            self.tokens.append(event["token"])
        if event["finish"] is not None:
            self.last = event


def _first_stages(opened: Opened) -> list[tuple[str, int, int]]:
    """The time to the first token as spans: `queue` (the call reaching the replica and the
    wait in its decode loop) then `prefill`, as long as the replica measured it, ending when the
    first token arrived; one `first_token` span where the replica did not say."""
    prefill = opened.first.get("prefill_ms")
    if prefill is None:
        return [("first_token", opened.called_ns, opened.first_ns)]
    began = max(opened.called_ns, opened.first_ns - int(prefill * 1e6))
    return [("queue", opened.called_ns, began), ("prefill", began, opened.first_ns)]


def native_sampling(parameters: GenerateParameters | None) -> Sampling:
    """`POST /v1/predict`'s `parameters` as the decode loop's sampling (greedy, 16 tokens when
    none are sent)."""
    parameters = parameters or GenerateParameters()
    return Sampling(max_tokens=parameters.max_tokens, temperature=parameters.temperature,
                    top_p=parameters.top_p, seed=parameters.seed, stop=tuple(parameters.stop))


def settings_for(settings: Settings, tasks: set[str]) -> Settings:
    """The gateway's settings for arms serving `tasks`: where they generate, a request's
    deadline is `stream_timeout_s` (`request_timeout_s` would cut long answers) and prompts are
    tokenized here, not by the encoders' preprocessor."""
    if TASK not in tasks:
        return settings
    return settings.model_copy(update={"request_timeout_s": settings.stream_timeout_s,
                                       "gateway_tokenize_threads": 0})


class Generation:
    """A generative gateway's request path (see the module docstring). `route` is the
    gateway's own (`Gateway._route`): the arm of a request, from the cached rollout state."""

    def __init__(self, handles: dict[Arm, Any], tokenizer, serving: ServingSettings,
                 state: StateSettings, idempotency: Idempotency, route: Callable, meter,
                 versions: dict[Arm, str] | None = None, offer: Callable | None = None):
        self.handles, self.tokenizer, self.versions = handles, tokenizer, versions or {}
        self.offer = offer  # the gateway's shadow offer (Gateway._offer_tokens), or none
        self.canary_share = serving.canary_timeout_fraction
        self.operator_token = state.operator_token
        self.idempotency, self.route = idempotency, route
        self.infos: dict[str, dict] = {}  # per arm, its replica's last `info()` (`poll`)
        self.metrics = TokenMetrics(meter, lambda: self.infos)

    @classmethod
    async def open(cls, handles: dict[Arm, Any], models: ModelSettings,
                   serving: ServingSettings, state: StateSettings, idempotency: Idempotency,
                   route: Callable, meter, versions: dict[Arm, str],
                   offer: Callable | None = None) -> Generation:
        """The path with the baseline folder's tokenizer, its gauges kept fresh; `versions`:
        each arm's model version; `offer`: the shadow's."""
        from transformers import AutoTokenizer

        folder = model_dir(models, "baseline", generative=True)
        tokenizer = await asyncio.to_thread(AutoTokenizer.from_pretrained, folder,
                                            local_files_only=True)
        generation = cls(handles, tokenizer, serving, state, idempotency, route, meter,
                         versions, offer)
        generation.polling = asyncio.get_running_loop().create_task(generation.poll())
        return generation

    async def poll(self, every_s: float = 1.0) -> None:
        """Keep `infos` (the KV cache and sequence gauges) fresh; a failed call keeps the last
        one. Runs until cancelled."""
        while True:
            for arm, handle in self.handles.items():
                try:
                    self.infos[arm.value] = await asyncio.wait_for(handle.info.remote(), 2.0)
                except Exception:
                    pass
            await asyncio.sleep(every_s)

    async def serve(self, request: Request, body: bytes, ex: Exchange) -> Response:
        """One admitted request of a generative door (`ex.door`), answered whole or streamed;
        a GatewayError before the first byte is the client's error in OpenAI's shape."""
        try:
            if ex.door.name == FrontDoor.name:  # POST /v1/predict
                return await self._native(request, body, ex)
            if not isinstance(ex.door, CompletionsDoor):
                raise BadRequest(f"this model generates: POST /v1/completions, "
                                 f"/v1/chat/completions or /v1/predict, not {ex.door.name} "
                                 "requests", status=422)
            overridden = override_allowed(self.operator_token, request.headers)
            tokenizing = time.time_ns()
            call, prompt, text = self._parse(body, ex)
            tokenized = (tokenizing, time.time_ns())
            key = request.headers.get("idempotency-key")
            if call.stream and key is not None:
                raise BadRequest("Idempotency-Key: a streamed answer cannot be replayed; send "
                                 "the key without `stream`", param="stream")
            decision = self.route(request, overridden, ex, call.routing_key)
            if not call.stream:
                def render(text: str, last: Event, _: Opened) -> dict:
                    return orjson.loads(Answer(call, ex.rid).body(text, last))

                return await self._whole(key, body, (prompt, call.sampling, tokenized, text),
                                         render, decision, ex)
            opened = await self._open(decision.arm, prompt, call.sampling, ex)
            opened.tokenized, opened.prompt_text = tokenized, text
        except GatewayError as exc:
            return ex.failed(exc)
        except BaseException as exc:
            abandoned(exc, ex.obs)
            raise
        answer = Answer(call, ex.rid)
        return StreamingResponse(self._stream(opened, answer, len(prompt), ex),
                                 media_type="text/event-stream",
                                 headers=self._headers(opened, decision.label, ex))

    def _parse(self, body: bytes, ex: Exchange) -> tuple[GenerateCall, list[int], str]:
        """The request, its prompt as token ids (400 naming the field) and as text."""
        door: CompletionsDoor = ex.door
        call = door.call(body)
        try:
            if call.chat:
                prompt = chat_ids(self.tokenizer, call.messages)
                text = " ".join(str(m.get("content", "")) for m in call.messages)
            else:
                prompt = completion_ids(self.tokenizer, call.prompt)
                text = call.prompt if isinstance(call.prompt, str) else ""
        except BadPrompt as exc:
            raise BadRequest(str(exc), param="messages" if call.chat else "prompt") from None
        ex.obs.parsed([text], TASK)
        return call, prompt, text

    async def _native(self, request: Request, body: bytes, ex: Exchange) -> Response:
        """`POST /v1/predict` with the task generate (or none): one prompt, its `parameters`
        (the completions' sampling fields; greedy and 16 tokens by default), the native
        answer with one output (text, finish_reason, token counts)."""
        overridden = override_allowed(self.operator_token, request.headers)
        tokenizing = time.time_ns()
        parsed = ex.door.parse(body, request)
        if parsed.task not in (None, TASK):
            raise InvalidInput(f"task {parsed.task!r}: this model generates (task {TASK!r})")
        if len(parsed.inputs) != 1:
            raise InvalidInput(f"inputs: one prompt per {TASK} request, not "
                               f"{len(parsed.inputs)}")
        prompt = completion_ids(self.tokenizer, parsed.inputs[0])
        ex.obs.parsed(parsed.inputs, TASK)
        sampling = native_sampling(parsed.options)
        tokenized = (tokenizing, time.time_ns())
        decision = self.route(request, overridden, ex, None)

        def render(text: str, last: Event, opened: Opened) -> dict:
            return {"request_id": ex.rid, "arm": opened.arm.value,
                    "model_version": self.versions.get(opened.arm, ""), "task": TASK,
                    "outputs": [{"text": text, "finish_reason": last.finish,
                                 "prompt_tokens": last.prompt_tokens,
                                 "completion_tokens": last.completion_tokens}],
                    "fallback": opened.fallback, "routing": decision.label}

        return await self._whole(request.headers.get("idempotency-key"), body,
                                 (prompt, sampling, tokenized, parsed.inputs[0]), render,
                                 decision, ex)

    async def _whole(self, key: str | None, body: bytes,
                     asked: tuple[list[int], Sampling, tuple[int, int], str],
                     render: Callable, decision, ex: Exchange) -> Response:
        """The answer as one body (`render(text, last event, opened)`), under its
        Idempotency-Key when it has one. `asked`: the prompt, its sampling, when it was
        tokenized, its text."""
        prompt, sampling, tokenized, text = asked
        async with self.idempotency.claim(key, TASK, [body.decode("utf-8", "replace")]) \
                as claim:
            if claim.replay is not None:
                stored = claim.replay
                ex.obs.finish(stored["status"], arm=stored["headers"]["X-Canary-Arm"],
                              replayed=True)
                return JSONBody(stored["body"], status_code=stored["status"],
                                headers={**stored["headers"], **REPLAYED})
            opened = await self._open(decision.arm, prompt, sampling, ex)
            opened.tokenized, opened.prompt_text = tokenized, text
            try:
                tally = await self._drain(opened, ex)
                if tally.last["finish"] not in ENDS:
                    raise self._ended(opened.arm, tally.last)
            except BaseException as exc:
                opened.call.__exit__(type(exc), exc, None)  # a failed attempt, as in _first
                raise
            self._finish(opened, tally, len(prompt), ex, 200)
            headers = self._headers(opened, decision.label, ex)
            document = render("".join(tally.text), Event(**tally.last), opened)
            claim.complete({"status": 200, "body": document,
                            "headers": {k: v for k, v in headers.items()
                                        if k != "Server-Timing"}})
            return JSONBody(document, headers=headers)

    async def _drain(self, opened: Opened, ex: Exchange) -> Tally:
        """Every event of an opened answer, the first included."""
        tally = Tally()
        tally.add(opened.first)
        try:
            async with asyncio.timeout(max(ex.deadline - time.perf_counter(), 0) + GRACE_S):
                while tally.last is None:
                    tally.add(await anext(opened.events))
        except BaseException as exc:
            opened.cancel()
            if isinstance(exc, Exception):
                raise self._failure(opened.arm, exc) from None
            raise
        return tally

    async def _stream(self, opened: Opened, answer: Answer, prompt_tokens: int,
                      ex: Exchange) -> AsyncIterator[bytes]:
        """The SSE body: the opening, a chunk per event with text, then the end (`[DONE]`
        after a normal end, an error event otherwise). The client leaving cancels the
        sequence."""
        tally, status = Tally(), 200
        try:
            yield answer.first()
            event = opened.first
            async with asyncio.timeout(max(ex.deadline - time.perf_counter(), 0) + GRACE_S):
                while True:
                    tally.add(event)
                    if event["finish"] is not None:
                        break
                    if chunk := answer.chunk(event["text"]):
                        yield chunk
                    event = await anext(opened.events)
            if event["finish"] in ENDS:
                yield answer.chunk(event["text"]) + answer.last(Event(**event))
            else:
                ended = self._ended(opened.arm, event)
                status = ended.status
                yield stream_error(ended.message, "timeout" if event["finish"] == "timeout"
                                   else "server_error")
        except asyncio.CancelledError:
            status = 499
            raise
        except Exception as exc:
            failure = self._failure(opened.arm, exc)
            status = failure.status
            yield stream_error(failure.message)
        finally:
            opened.cancel()
            self._finish(opened, tally, prompt_tokens, ex, status)

    async def _open(self, arm: Arm, prompt: list[int], sampling: Sampling,
                    ex: Exchange) -> Opened:
        """The answer begun on `arm`, or on baseline when the canary fails or is late before
        its first event (and the deadline leaves time)."""
        try:
            return await self._first(arm, prompt, sampling, ex)
        except GatewayError as exc:
            left = ex.deadline - time.perf_counter()
            if arm is not Arm.OPTIMIZED or left <= 0 or exc.status == 400:
                raise
            log.warning("optimized arm failed before its first token (%s): baseline answers",
                        exc.message)
            opened = await self._first(Arm.BASELINE, prompt, sampling, ex)
            opened.fallback = True
            return opened

    async def _first(self, arm: Arm, prompt: list[int], sampling: Sampling,
                     ex: Exchange) -> Opened:
        """`arm`'s first event for the prompt: the canary waits for it at most its share of
        the deadline; baseline until the replica ends the sequence at the deadline itself
        (its last event says why: no room in the KV cache, or the model's failure), or a
        grace period past it."""
        left = ex.deadline - time.perf_counter()
        wait = min(left, ex.timeout_s * self.canary_share) \
            if arm is Arm.OPTIMIZED else left + GRACE_S
        events = self.handles[arm].options(stream=True).generate.remote(
            prompt, dataclasses.asdict(sampling), left)
        opened = Opened(arm, {}, events, False, 0.0, called_ns=time.time_ns(),
                        call=ex.obs.call(arm.value).__enter__(), prompt=prompt)
        try:
            opened.first = await self._first_event(opened, wait)
        except BaseException as exc:
            opened.cancel()
            opened.call.__exit__(type(exc), exc, None)  # a failed attempt on `arm`
            raise
        opened.first_at, opened.first_ns = time.perf_counter(), time.time_ns()
        return opened

    async def _first_event(self, opened: Opened, wait: float) -> dict:
        """The answer's first event within `wait` seconds, or the GatewayError it means."""
        arm = opened.arm
        try:
            async with asyncio.timeout(max(wait, 0.001)):
                first = await anext(opened.events)
        except TimeoutError:
            self.metrics.refused(arm.value, "timeout")
            raise ModelTimeout(f"the {arm.value} model did not start answering within "
                               f"{wait:.2f} s") from None
        except Exception as exc:
            raise self._failure(arm, exc) from None
        if first["finish"] not in (None, *ENDS):
            raise self._ended(arm, first)
        return first

    def _failure(self, arm: Arm, exc: Exception) -> GatewayError:
        """What a failed call to `arm`'s replica means for the client."""
        if isinstance(exc, GatewayError):
            return exc
        if isinstance(exc, TimeoutError):
            return ModelTimeout(f"the {arm.value} model's answer did not end within the "
                                "request's deadline")
        if isinstance(exc, BackPressureError):
            self.metrics.refused(arm.value, "queue_full")
            return Overloaded(f"the {arm.value} model's queue is full; retry later")
        cause = exc.cause if isinstance(exc, RayTaskError) else exc
        if isinstance(cause, PromptTooLong):
            return BadRequest(str(cause), param="prompt")
        if isinstance(cause, NeverFits):
            self.metrics.refused(arm.value, "never_fits")
            return InputTooLarge(f"the {arm.value} model: {cause}")
        log.warning("%s model stream failed: %s", arm.value, type(cause).__name__)
        return ModelFailed(f"the {arm.value} model failed: {type(cause).__name__}")

    def _ended(self, arm: Arm, event: dict) -> GatewayError:
        """An answer that ended other than normally: out of time (waiting for room in the KV
        cache when no token came yet), or failed."""
        if event["finish"] == "timeout" and not event["completion_tokens"]:
            self.metrics.refused(arm.value, "kv_wait")
            return Overloaded(f"no room in the {arm.value} model's KV cache within the "
                              "request's deadline; retry later")
        if event["finish"] == "timeout":
            return ModelTimeout(f"the answer did not finish within its deadline "
                                f"({event['completion_tokens']} tokens)")
        return ModelFailed(f"the {arm.value} model failed: {event.get('error') or 'ended'}")

    async def score(self, prompt: list[int], tokens: list[int], timeout_s: float) -> dict:
        """The answered `tokens` scored teacher-forced by both arms: the optimized replica's
        log-probabilities, compared by the baseline replica with its own (its
        `token_fidelity`), within `timeout_s`."""
        async with asyncio.timeout(timeout_s):
            other = self.handles[Arm.OPTIMIZED].logprobs.remote(prompt, tokens)
            return await self.handles[Arm.BASELINE].token_fidelity.remote(prompt, tokens, other)

    def _headers(self, opened: Opened, reason: str, ex: Exchange) -> dict[str, str]:
        first_ms = (opened.first_at - ex.start) * 1000
        return {**id_headers(ex.rid, ex.incoming), "X-Canary-Arm": opened.arm.value,
                "X-Canary-Reason": reason, "X-Canary-Fallback": str(opened.fallback).lower(),
                "Server-Timing": server_timing({"first_token": first_ms})}

    def _finish(self, opened: Opened, tally: Tally, prompt_tokens: int, ex: Exchange,
                status: int) -> None:
        """The answer's telemetry: per arm its time to first token, gaps between tokens and
        token counts; the request's observation (its model call with them)."""
        now = time.perf_counter()
        completion = (tally.last or {}).get("completion_tokens") or len(tally.token_at)
        self.metrics.answered(opened.arm.value, (opened.first_at - ex.start) * 1000,
                              tally.token_at, prompt_tokens, completion)
        timing = StageTiming(preprocess=0.0, queue=(opened.first_at - ex.start) * 1000,
                             model=(now - opened.first_at) * 1000, postprocess=0.0)
        ex.obs.stages([("tokenize", *opened.tokenized), *_first_stages(opened),
                       ("decode", opened.first_ns, time.time_ns())],  # detokenizing included
                      **{"canary.arm": opened.arm.value,
                         "canary.completion_tokens": completion})
        if status == 200:
            opened.call.answered(ModelAnswer(opened.arm.value, self.versions.get(opened.arm, ""),
                                             [], prompt_tokens, BatchShape(1, 1), 0, timing))
            opened.call.__exit__(None, None, None)
            ex.obs.generated(timing.queue, timing.model, completion)
            ex.obs.finish(200, arm=opened.arm.value, fallback=opened.fallback)
            if self.offer is not None and tally.tokens and not opened.fallback:
                self.offer(opened, tally.tokens, ex)
        else:
            failed = ModelFailed(f"the answer ended with status {status}")
            opened.call.__exit__(ModelFailed, failed, None)
            ex.obs.finish(status, error_type="client_disconnected" if status == 499
                          else "stream_failed", arm=opened.arm.value, fallback=opened.fallback)

