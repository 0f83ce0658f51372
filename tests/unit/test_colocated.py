"""The colocated topology's in-process arms (serve.gateway.colocated) and how the app is built for
each topology (serve.config.build)."""

import asyncio
import os
import threading

import pytest

from rollout import Settings
from serve.gateway.colocated import LocalHandle, reconfigure
from serve.replica import compute


class FakeServer:
    def __init__(self):
        self.configured: list[dict] = []
        self.cancelled = False

    async def predict(self, texts, task, trace=None, remaining_s=None):
        await asyncio.sleep(0)
        return {"texts": texts, "task": task, "remaining_s": remaining_s}

    async def slow(self):
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            self.cancelled = True
            raise

    def info(self) -> dict:
        return {"arm": "baseline"}

    def broken(self):
        raise RuntimeError("no model")

    async def failing(self):
        raise ValueError("bad rows")

    def reconfigure(self, config: dict) -> None:
        self.configured.append(config)


def test_a_local_call_answers_as_a_handle_call_does():
    async def scenario():
        handle = LocalHandle(FakeServer())
        answer = await handle.predict.remote(["a"], "embed", None, 1.5)
        info = await handle.info.remote()
        return answer, info

    answer, info = asyncio.run(scenario())
    assert answer == {"texts": ["a"], "task": "embed", "remaining_s": 1.5}
    assert info == {"arm": "baseline"}


def test_errors_come_back_when_awaited_from_plain_and_async_methods():
    async def scenario():
        handle = LocalHandle(FakeServer())
        plain, coroutine = handle.broken.remote(), handle.failing.remote()
        with pytest.raises(RuntimeError, match="no model"):
            await plain
        with pytest.raises(ValueError, match="bad rows"):
            await coroutine

    asyncio.run(scenario())


def test_a_timed_out_call_is_cancelled_in_the_model_server():
    """The gateway's `wait_for` on a local call cancels the model's work, as `cancel()` on a
    handle's response does for a remote one."""
    server = FakeServer()

    async def scenario():
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(LocalHandle(server).slow.remote(), timeout=0.05)

    asyncio.run(scenario())
    assert server.cancelled


def test_private_attributes_are_not_offered_as_calls():
    with pytest.raises(AttributeError):
        LocalHandle(FakeServer())._batched  # noqa: B018


def test_reconfigure_applies_per_arm_and_refuses_an_unknown_arm_before_changing_any():
    servers = {"baseline": FakeServer(), "optimized": FakeServer()}
    handles = {arm: LocalHandle(server) for arm, server in servers.items()}
    reconfigure(handles, {"optimized": {"fault_error": True}})
    assert servers["optimized"].configured == [{"fault_error": True}]
    assert servers["baseline"].configured == []
    with pytest.raises(ValueError, match="unknown arms \\['canary'\\]"):
        reconfigure(handles, {"baseline": {"fault_delay_ms": 5}, "canary": {}})
    assert servers["baseline"].configured == []


def _deployments(app) -> dict[str, object]:
    """Every deployment bound into a Serve application, by name."""
    found, todo = {}, [app]
    while todo:
        deployment = todo.pop()._bound_deployment
        found[deployment.name] = deployment
        todo.extend(arg for arg in (*deployment.init_args, *deployment.init_kwargs.values())
                    if hasattr(arg, "_bound_deployment"))
    return found


def test_the_remote_topology_binds_a_model_deployment_per_arm():
    from serve.config import build

    deployments = _deployments(build(Settings(topology="remote"), {"optimized": {"x": 1}}))
    assert set(deployments) == {"gateway", "baseline", "optimized", "ramp-controller"}
    assert deployments["optimized"].user_config["x"] == 1
    assert deployments["gateway"].user_config is None


@pytest.mark.parametrize("topology", ["remote", "colocated"])
def test_serves_access_log_is_off_where_the_gateway_writes_its_request_log(topology):
    from serve.config import build

    def access_log(**changed):
        gateway = _deployments(build(Settings(topology=topology, **changed)))["gateway"]
        return gateway.logging_config["enable_access_log"]

    assert access_log() is False
    assert access_log(request_log=False) is True
    assert access_log(telemetry_enabled=False) is True


def test_a_model_deployment_keeps_its_version_unless_its_code_or_settings_change():
    """Serve reloads a model only on a new version: live settings alone reconfigure it."""
    from serve.config import build

    def versions(settings, live=None):
        deployments = _deployments(build(settings, live))
        return {arm: deployments[arm].version for arm in ("baseline", "optimized")}

    settings = Settings(topology="remote")
    first = versions(settings)
    assert first == versions(Settings(topology="remote"), {"optimized": {"fault_error": True}})
    assert first["baseline"] != first["optimized"]
    for changed in ({"torch_threads": 3}, {"webhook_secret": "s" * 32}):
        assert not set(versions(settings.model_copy(update=changed)).values()) & set(
            first.values()), changed


def test_the_colocated_topology_puts_both_arms_in_the_gateway_with_their_cpus():
    from serve.config import build

    settings = Settings(topology="colocated", gateway_num_cpus=0.25, model_num_cpus=0.5,
                        max_batch_size=12)
    deployments = _deployments(build(settings, {"optimized": {"fault_error": True}}))
    assert set(deployments) == {"gateway", "ramp-controller"}
    gateway = deployments["gateway"]
    assert gateway.ray_actor_options["num_cpus"] == pytest.approx(1.25)
    arms = gateway.user_config["arms"]
    assert arms["optimized"] == {"max_batch_size": 12, "batch_wait_ms": 5.0, "fault_error": True}
    assert arms["baseline"] == {"max_batch_size": 12, "batch_wait_ms": 5.0}


def test_an_unknown_topology_is_refused_with_the_choices():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="colocated"):
        Settings(topology="sidecar")


@pytest.fixture
def two_servers(tmp_path_factory):
    """Both arms' model servers in this one process, as a colocated gateway holds them (new
    ones for each test: a batch queue belongs to the event loop of its first call).
    Serve's batch queue warns at creation when its size passes the replica's
    `max_ongoing_requests`, read from the replica's context: there is none outside Serve."""
    from ray.serve.batching import _BatchQueue

    from serve.replica.model_server import ModelServer
    from tests.tiny_model import make_tiny_encoder

    patch = pytest.MonkeyPatch()
    patch.setattr(_BatchQueue, "_warn_if_max_batch_size_exceeds_max_ongoing_requests",
                  lambda self: None)

    settings = Settings(model_path=str(make_tiny_encoder(tmp_path_factory.mktemp("enc"))),
                        optimized_recipe="bf16", torch_threads=1, telemetry_enabled=False,
                        max_batch_size=8)
    servers = {arm: ModelServer.func_or_class(settings, arm) for arm in ("baseline", "optimized")}
    for server in servers.values():
        server.reconfigure({"max_batch_size": 8, "batch_wait_ms": 20})
    yield servers
    patch.undo()


@pytest.fixture
def torch_threads_seen(monkeypatch):
    """The threads on which the variants forward and postprocess (names, in call order),
    from before the servers are built (a build forwards its label texts)."""
    from serve.recipes.variants import Variant

    seen: list[tuple[str, str]] = []
    for name in ("forward_rows", "postprocess"):
        original = getattr(Variant, name)

        def spy(self, *args, _original=original, _name=name, **kwargs):
            seen.append((_name, threading.current_thread().name))
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(Variant, name, spy)
    return seen


def test_both_arms_build_forward_and_postprocess_on_the_one_compute_thread(
        torch_threads_seen, two_servers):
    """Every torch op of the process's models runs on one thread (serve.replica.compute): a
    second thread's OpenMP team would slow every forward."""
    built = len(torch_threads_seen)
    assert built >= 2  # each arm's build forwarded its label texts
    answers = _four_each_at_once(two_servers)
    assert len(answers) == 8
    calls = {name for name, _ in torch_threads_seen[built:]}
    assert calls == {"forward_rows", "postprocess"}
    assert {thread for _, thread in torch_threads_seen} == {compute.THREAD_NAME + "_0"}
    assert threading.current_thread().name not in {t for _, t in torch_threads_seen}


def _four_each_at_once(servers) -> list:
    """Four single-text requests per arm, interleaved, all at once; their answers in order."""
    handles = {arm: LocalHandle(server) for arm, server in servers.items()}

    async def scenario():
        calls = [handles[arm].predict.remote([f"{arm} text {i}"], "classify")
                 for i in range(4) for arm in ("baseline", "optimized")]
        return await asyncio.gather(*calls)

    return asyncio.run(scenario())


def test_two_servers_in_one_process_batch_apart(two_servers):
    """Each server has a batch queue of its own: concurrent requests for both arms are
    answered by their own arm, in batches of their own arm's requests only."""
    answers = _four_each_at_once(two_servers)
    assert [a.arm for a in answers] == ["baseline", "optimized"] * 4
    assert {a.model_version.split("-")[0] for a in answers if a.arm == "optimized"} == {"bf16"}
    assert max(a.batch.requests for a in answers) <= 4  # never the other arm's requests
    assert sum(a.batch.requests > 1 for a in answers) > 0  # but batched with their own


def test_live_batching_limits_apply_to_one_server_only(two_servers):
    two_servers["baseline"].reconfigure({"max_batch_size": 1, "batch_wait_ms": 20})
    answers = _four_each_at_once(two_servers)
    assert {a.batch.requests for a in answers if a.arm == "baseline"} == {1}
    assert max(a.batch.requests for a in answers if a.arm == "optimized") > 1


def test_live_settings_for_an_unknown_arm_are_refused_in_either_topology():
    from serve.config import build

    for topology in ("remote", "colocated"):
        with pytest.raises(ValueError, match="unknown arms \\['canary'\\]"):
            build(Settings(topology=topology), {"canary": {"fault_error": True}})


def test_a_colocated_server_leaves_a_shedding_loop_a_core(two_servers, monkeypatch):
    """A server told when its process's event loop is busy (serve.gateway.colocated
    `share_loop`) runs a batch with requests queued behind it on at most cores - 1 threads
    while the loop is busy, and on all of its own otherwise; a remote model replica (never
    told) on its own unless its machine is saturated (tests/unit/test_host_load.py)."""
    from serve.gateway.colocated import share_loop
    from serve.replica import model_server

    server = two_servers["baseline"]
    monkeypatch.setattr(model_server.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(server, "threads", 2)
    server.waiting = 3
    monkeypatch.setattr(server, "host_load", None)  # the machine's load aside (host_load)
    assert server._batch_threads(100) == 2  # as a remote replica: nobody says the loop is busy
    busy = [True]
    share_loop({"baseline": LocalHandle(server)}, lambda: busy[0])
    assert server._batch_threads(100) == 1
    busy[0] = False
    assert server._batch_threads(100) == 2  # not shedding: every thread
    busy[0] = True
    server.waiting = 0
    assert server._batch_threads(100) == 2  # nothing behind the batch

    seen: list[int] = []
    original = model_server.ensure_threads
    monkeypatch.setattr(model_server, "ensure_threads",
                        lambda threads: (seen.append(threads), original(1)))
    server.reconfigure({"max_batch_size": 1, "batch_wait_ms": 20})
    handle = LocalHandle(server)

    async def four_at_once():
        return await asyncio.gather(*(handle.predict.remote([f"text {i}"], "classify")
                                      for i in range(4)))

    assert len(asyncio.run(four_at_once())) == 4
    assert len(seen) == 4  # one batch per request
    assert seen[0] == 1  # three waited behind the first
    assert seen[-1] == 2  # nothing behind the last


def test_colocated_arms_take_turns_on_every_core_and_stop_following_the_share(
        tmp_path_factory, monkeypatch):
    """Both arms' batches run one at a time on the process's compute thread, so `load` gives
    each every core (`take_turns`) instead of its arm's share, and a server that followed the
    share stops following it; a count pinned by `CANARY_TORCH_THREADS` is kept."""
    from ray.serve.batching import _BatchQueue

    from serve.gateway import colocated
    from tests.tiny_model import make_tiny_encoder

    monkeypatch.setattr(_BatchQueue, "_warn_if_max_batch_size_exceeds_max_ongoing_requests",
                        lambda self: None)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    model = str(make_tiny_encoder(tmp_path_factory.mktemp("enc")))
    settings = Settings(model_path=model, optimized_recipe="bf16", telemetry_enabled=False,
                        compute_follows_share=False)
    assert settings.threads_per_model() == 1  # the share of one of two arms on 2 cores
    handles = asyncio.run(colocated.load(settings))
    assert {arm: h.server.threads for arm, h in handles.items()} == {
        "baseline": 2, "optimized": 2}
    assert all(h.server.compute is None for h in handles.values())

    pinned = asyncio.run(colocated.load(settings.model_copy(update={"torch_threads": 1})))
    assert {h.server.threads for h in pinned.values()} == {1}

    class Follower:
        stopped = False

        def stop(self):
            self.stopped = True

    server = handles["baseline"].server
    server.compute = follower = Follower()
    server.take_turns(1)
    assert follower.stopped and server.compute is None and server.threads == 1


def test_a_batch_waiting_for_the_other_arms_forward_counts_the_wait_as_queue(two_servers,
                                                                             monkeypatch):
    """Both arms share one compute thread: a batch that waits there behind the other arm's
    forward reports that wait as queue, and its model time as its own forward only, which is
    what the admission fits forward time on (it adds the other arm's rows ahead itself)."""
    import time

    baseline, optimized = two_servers["baseline"], two_servers["optimized"]
    assert baseline._compute_thread is optimized._compute_thread
    original = optimized._forward

    def forward(rows):  # 0.15 s: the forward's own time, well apart from the 0.5 s wait
        time.sleep(0.15)
        return original(rows)

    monkeypatch.setattr(optimized, "_forward", forward)

    async def scenario():
        handle = LocalHandle(optimized)
        alone = await handle.predict.remote(["a text"], "classify")
        busy = baseline._compute_thread.submit(time.sleep, 0.5)  # the other arm's forward
        behind = await handle.predict.remote(["a text"], "classify")
        busy.result()
        return alone, behind

    alone, behind = asyncio.run(scenario())
    assert alone.timing.queue < 100 and 150 <= alone.timing.model < 400
    assert behind.timing.queue >= 450  # waited for the other arm's turn
    assert 150 <= behind.timing.model < 400  # its own forward, not the other arm's


def test_colocated_batches_run_in_the_order_their_requests_arrived(two_servers, monkeypatch):
    """The optimized arm's request that arrived while a baseline request waited behind the
    baseline's running forward runs after it, not in between (serve.replica.turns): the
    admission predicted it behind every row ahead of it."""
    import time

    from serve.replica.turns import Turns

    ran: list[str] = []
    turns = Turns()
    for arm, server in two_servers.items():
        server.turns = turns
        original = server._forward

        def forward(rows, _arm=arm, _original=original):
            time.sleep(0.2 if _arm == "baseline" else 0.01)
            out = _original(rows)
            ran.append(_arm)
            return out

        monkeypatch.setattr(server, "_forward", forward)

    async def scenario():
        baseline = LocalHandle(two_servers["baseline"])
        optimized = LocalHandle(two_servers["optimized"])
        first = asyncio.ensure_future(baseline.predict.remote(["first"], "classify"))
        await asyncio.sleep(0.05)  # its forward runs
        second = asyncio.ensure_future(baseline.predict.remote(["second"], "classify"))
        await asyncio.sleep(0.02)  # queued behind it
        third = asyncio.ensure_future(optimized.predict.remote(["third"], "classify"))
        return await asyncio.gather(first, second, third)

    answers = asyncio.run(scenario())
    assert [a.arm for a in answers] == ["baseline", "baseline", "optimized"]
    assert ran == ["baseline", "baseline", "optimized"]
    assert answers[2].timing.queue >= 150  # it waited for the second baseline forward
