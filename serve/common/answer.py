"""What a model replica answers for one request (serve.replica.model_server), typed as it crosses
the Ray call to the gateway (Ray pickles it) and as the gateway, its telemetry
(serve.telemetry.observe) and its shadow comparisons (serve.gateway.shadow) read it. Frozen: a step
that needs another value makes a copy (`ModelAnswer.in_call`), none changes the answer another step
reads.

The gateway's response carries `arm`, `model_version` and `outputs` as they are here; the
timing and the batch go into its `Server-Timing` header.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class StageTiming:
    """Milliseconds of each stage inside the replica, in the order they ran."""

    preprocess: float  # tokenizing (by the gateway when it sent ids: serve.gateway.preprocess)
    queue: float  # waiting for a batch
    model: float  # the batch's forward, shared by every request in it
    postprocess: float

    def as_dict(self) -> dict[str, float]:
        """Stage name -> ms, in order (the `Server-Timing` entries)."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class BatchShape:
    """The batch the request rode in."""

    requests: int  # requests in the batch
    items: int  # their inputs
    call: int = 1  # requests that shared the gateway's model call (serve.gateway.coalesce)


@dataclass(frozen=True)
class ModelAnswer:
    """One request's answer from one arm's replica."""

    arm: str  # the arm that answered ("baseline" or "optimized")
    model_version: str
    outputs: list[dict]  # per input: a label and its scores, or an embedding
    tokens: int  # tokens of the request's inputs
    batch: BatchShape
    queue: int  # requests queued in the replica ahead of this one when it joined
    timing: StageTiming
    cpu_s: float | None = None  # its share (by rows) of its batch's forward CPU seconds
    gpu: bool = False  # cpu_s is GPU seconds (a CUDA replica: serve.replica.cputime)

    def in_call(self, calls: int) -> ModelAnswer:
        """This answer as one of `calls` requests a gateway sent together
        (serve.gateway.coalesce)."""
        return dataclasses.replace(self, batch=dataclasses.replace(self.batch, call=calls))


class CallFailed(Exception):
    """One request's failure inside a coalesced call, carried back in its place: any exception
    of the model's code reduced to its type name and message, so it always crosses processes."""

    def __init__(self, kind: str, message: str):
        super().__init__(f"{kind}: {message}")
        self.kind, self.message = kind, message

    def __reduce__(self):
        return type(self), (self.kind, self.message)
