"""The colocated topology: both arms' models loaded in each gateway replica.

With `CANARY_TOPOLOGY=colocated` a gateway replica routes, tokenizes and runs the chosen arm's
model in its own process: no second Ray hop (handle call, the core worker's gRPC threads,
serialization both ways) per request. Each arm is a `serve.replica.model_server.ModelServer`
instance of its own, with its own batching and fault injection; their forwards take turns on
the process's one compute thread, each batch on every core (`load`; one fewer while the
gateway's event loop is busy: `share_loop`). Each is called through `LocalHandle`, which
answers the calls the gateway makes of a `DeploymentHandle` (`handle.predict.remote(...)`), so
the request path, the shadow, admission and fallback are the same code in both topologies.

The remote topology (one Serve deployment per arm) stays for arms that must scale on their own:
large models, a GPU per arm, a cluster ([production](../docs/production.md#the-topology)).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable

from rollout.policy import Arm
from rollout.settings import Settings

COLOCATED, REMOTE = "colocated", "remote"
ARMS = tuple(arm.value for arm in Arm)


class _LocalMethod:
    __slots__ = ("method",)

    def __init__(self, method):
        self.method = method

    def remote(self, *args, **kwargs) -> asyncio.Future:
        """The call as a task of this event loop (`cancel()` cancels it, as a handle's
        response does); a plain method's result or error as a finished future."""
        try:
            result = self.method(*args, **kwargs)
        except Exception as exc:
            future = asyncio.get_running_loop().create_future()
            future.set_exception(exc)
            return future
        if inspect.isawaitable(result):
            return asyncio.ensure_future(result)
        future = asyncio.get_running_loop().create_future()
        future.set_result(result)
        return future


class LocalHandle:
    """A model server in this process, called as a `DeploymentHandle` is called."""

    def __init__(self, server):
        self.server = server

    def __getattr__(self, name: str) -> _LocalMethod:
        if name.startswith("_"):
            raise AttributeError(name)
        return _LocalMethod(getattr(self.server, name))


async def load(settings: Settings) -> dict[str, LocalHandle]:
    """Both arms' model servers, built one after the other off the event loop (a build may
    take minutes: `auto` measuring, a calibrated artifact). Their forwards take turns on the
    process's one compute thread (serve.replica.compute), so each batch runs on every core
    (`ModelServer.take_turns`) rather than on its arm's share of them: at canary 50 % two
    batches on one thread each would leave a core idle. Their batches run in the order their
    requests arrived (serve.replica.turns)."""
    from serve.replica.model_server import ModelServer, startup_threads
    from serve.replica.turns import Turns

    server_class = ModelServer.func_or_class
    threads = startup_threads(settings)  # every core, unless CANARY_TORCH_THREADS pins a count
    turns = Turns()  # their batches in the order their requests arrived

    def built(arm: str) -> ModelServer:
        server = server_class(settings, arm)
        server.take_turns(threads)  # one compute thread for both: each batch on every core
        server.turns = turns
        return server

    return {arm: LocalHandle(await asyncio.to_thread(built, arm)) for arm in ARMS}


def share_loop(handles: dict[str, LocalHandle], busy: Callable[[], bool]) -> None:
    """Tell each arm's model server when this process's event loop is busy (`busy()`: the
    gateway is shedding, or its loop spends a share of a core: serve.gateway.admission
    `loop_busy`), so that its batches then leave the loop a core (serve.replica.thread_share
    `beside_loop`)."""
    for handle in handles.values():
        handle.server.loop_busy = busy


def reconfigure(handles: dict[str, LocalHandle], arms_config: dict[str, dict]) -> None:
    """Live settings per arm (`ModelServer.reconfigure`: batching, fault injection); an arm
    left out keeps its settings. An unknown arm is a ValueError, before any arm changes."""
    unknown = set(arms_config) - set(handles)
    if unknown:
        raise ValueError(f"unknown arms {sorted(unknown)}: choose from {', '.join(ARMS)}")
    for arm, config in arms_config.items():
        handles[arm].server.reconfigure(config)
