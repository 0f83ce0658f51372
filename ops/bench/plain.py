"""A plain Ray Serve deployment of the gateway's baseline model: the anchor that
`python -m ops.bench --plain` measures the gateway against (ops.bench.anchor).

Written as a competent Ray Serve user serves one model over HTTP, with nothing of the gateway
(no routing, no admission, no rollout state, no second arm):

- **One deployment, `@serve.batch` over texts**, as Serve's batching guide shows it: each text
  of a request is one call of the batched method (a request's texts are awaited together); a
  batch closes at `max_batch_size` texts or after `batch_wait_ms`, is tokenized in one call
  and forwarded at once, padded to its longest text. Batching whole requests instead pads a
  batch of sixteen 8-text requests, 128 texts, to the longest of them: on the shipped
  workload (one text of 256 tokens, most under 40) that measured 4.8 texts/s at concurrency
  64 against 113 through the gateway, an anchor no user would pick.
- **The same model, fp32, all cores.** The project's own `Variant` of the baseline's weights
  under fp32 (a plain user's default, whatever `baseline_recipe` says), so both sides give the
  same answers; one padded forward per batch, without the gateway's length packing, and the
  eager transformers model a plain user runs (`torchscript` off: no frozen trace,
  serve.recipes.frozen).
  `torch.set_num_threads(os.cpu_count())`, also in the one worker thread that runs the
  batches (torch's count is per thread), so the event loop keeps receiving requests while a
  forward runs.
- **HTTP.** `POST <ROUTE>/v1/predict` takes the gateway's body (`{"inputs": [...], "task":
  "classify"}`) and answers `{"outputs": [...]}`, one per input as in the gateway's answer;
  `GET <ROUTE>/healthz` answers 200. A bare `__call__` on a Starlette request, Serve's own
  minimal form, no web framework.
- **Serve at its best.** A second application under `ROUTE` in the gateway's own Ray instance,
  so it runs in the mode the local app runs in (serve.ray_env: throughput mode, direct ingress,
  where HAProxy routes by the longest route prefix). `max_ongoing_requests` is at least
  `max_batch_size` (below it a batch can never fill, Serve warns) and the queue is Serve's
  default, unbounded: it never refuses. It reserves what one of the gateway's model replicas
  does (`model_num_cpus`, a fraction, so it fits beside the gateway app on 2 cores).

One thing is not plain: Serve's HTTP proxy callback is set for the whole cluster
(serve.gateway.ingress: a body is received in full before it is handed on), so it wraps this app's
requests as well; with no gateway in this replica's process it sheds nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import torch
from ray import serve
from ray.serve import Application
from starlette.requests import Request
from starlette.responses import JSONResponse

from ops.bench.endtoend import BenchError, check_reachable
from ops.bench.target import PLAIN
from rollout.settings import Settings
from serve.recipes.variants import TASKS, Variant, VariantSettings

APP = PLAIN  # its Serve application and deployment name, as the benchmark's target
ROUTE = "/plain"
RECIPE = "fp32"


class BadRequest(ValueError):
    """A body the endpoint cannot take (answered 422 with this message)."""


def parse_body(body: bytes, default_task: str = "classify") -> tuple[list[str], str]:
    """(texts, task) of a `POST /v1/predict` body, or BadRequest."""
    try:
        data = json.loads(body)
    except ValueError:
        raise BadRequest("the body is not JSON") from None
    inputs = data.get("inputs") if isinstance(data, dict) else None
    if (not isinstance(inputs, list) or not inputs
            or not all(isinstance(text, str) and text.strip() for text in inputs)):
        raise BadRequest("`inputs`: give a non-empty list of non-blank strings")
    task = data.get("task") or default_task
    if task not in TASKS:
        raise BadRequest(f"`task`: one of {', '.join(TASKS)}")
    return inputs, task


@serve.deployment(name=APP)
class PlainModel:
    """The model behind one batched HTTP endpoint (module docstring)."""

    def __init__(self, settings: Settings):
        cores = os.cpu_count() or 1
        torch.set_num_threads(cores)
        eager = settings.model_copy(update={"torchscript": False})
        self.variant = Variant(VariantSettings(eager, eager, eager, eager),
                               "baseline", recipe=RECIPE)
        self.default_task = settings.default_task
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="plain-forward",
                                        initializer=torch.set_num_threads, initargs=(cores,))
        self.predict.set_max_batch_size(settings.max_batch_size)
        self.predict.set_batch_wait_timeout_s(settings.batch_wait_ms / 1000)

    async def __call__(self, request: Request) -> JSONResponse:
        path = request.url.path.rstrip("/")
        if request.method == "GET" and path.endswith("/healthz"):
            return JSONResponse({"status": "ok"})
        if request.method != "POST" or not path.endswith("/v1/predict"):
            return JSONResponse({"detail": "not found"}, status_code=404)
        try:
            texts, task = parse_body(await request.body(), self.default_task)
            if task == "embed" and self.variant.has_head:
                raise BadRequest("this model is a classifier: it has no `embed` task")
        except BadRequest as exc:
            return JSONResponse({"detail": str(exc)}, status_code=422)
        outputs = await asyncio.gather(*(self.predict((text, task)) for text in texts))
        return JSONResponse({"outputs": outputs})

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.005)
    async def predict(self, items: list[tuple[str, str]]) -> list[dict]:
        """One forward of the batch's texts, in the worker thread."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._infer, items)

    def _infer(self, items: list[tuple[str, str]]) -> list[dict]:
        rows = self.variant.forward_rows(self.variant.encode([text for text, _ in items]).ids)
        return [self.variant.postprocess(task, row.unsqueeze(0))[0]
                for (_, task), row in zip(items, rows, strict=True)]


def app(settings: Settings) -> Application:
    """The plain deployment of `settings`' baseline model, sized as in the module docstring."""
    return PlainModel.options(
        ray_actor_options={"num_cpus": settings.model_num_cpus,
                           "num_gpus": settings.model_num_gpus},
        max_ongoing_requests=max(settings.model_max_ongoing_requests, settings.max_batch_size),
    ).bind(settings)


@contextlib.contextmanager
def deployed(settings: Settings, url: str, timeout: float = 60.0) -> Iterator[str]:
    """`app(settings)` as application `APP` under `ROUTE` of the Serve instance this process
    started, whose HTTP address is `url`; yields its URL once it answers `GET /healthz` (the
    ingress learns of a new route a moment after the deploy), deletes it afterwards."""
    serve.run(app(settings), name=APP, route_prefix=ROUTE)
    try:
        plain_url = url + ROUTE
        _wait_reachable(plain_url, timeout)
        yield plain_url
    finally:
        with contextlib.suppress(Exception):
            serve.delete(APP)


def _wait_reachable(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            check_reachable(url)
            return
        except BenchError as exc:
            if time.monotonic() > deadline:
                raise BenchError(f"the plain deployment never answered: {exc}") from None
            time.sleep(0.2)
