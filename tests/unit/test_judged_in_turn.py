"""Requests that reach the gateway together are judged in turn (serve.gateway.deployment
`_call_arm`, serve.gateway.admission `Slot.reserve`): each behind the rows of those admitted
before it, though each awaits its tokenizing between its judgement and its call, so a burst of
large requests on an empty queue is not admitted whole."""

import asyncio
import time

from rollout import Arm, Settings
from serve.common.errors import Overloaded
from serve.gateway.admission import RATE_WINDOW_S, Admission, ShedSummary
from serve.gateway.arms import Arms
from serve.gateway.exchange import Exchange
from serve.telemetry.observe import NULL_OBSERVATION


class SlowModel:
    """A model that answers nothing until the test ends (its calls stay in flight)."""

    def __init__(self):
        self.predict = self
        self.calls = 0

    def remote(self, *args):
        self.calls += 1
        return asyncio.get_running_loop().create_future()


class Tokenizer:
    """The gateway's tokenizing step, which awaits (off the loop for large inputs)."""

    async def encode(self, texts):
        await asyncio.sleep(0)
        return texts


def gateway_with(model: SlowModel, admission: Admission):
    from serve.gateway.deployment import Gateway

    gateway_class = Gateway.func_or_class.__mro__[1]  # the class serve.gateway.ingress wraps
    gateway = gateway_class.__new__(gateway_class)
    settings = Settings()
    gateway.settings, gateway.admission, gateway.preprocess = settings, admission, Tokenizer()
    gateway.arms = Arms({Arm.BASELINE: model, Arm.OPTIMIZED: model}, settings, settings,
                        admission, ShedSummary(admission, lambda line: None), local=True)
    return gateway


def measured_admission() -> Admission:
    """The baseline arm measured at 100 rows per second, in forwards of 20 ms."""
    now = [100.0]
    admission = Admission(ceiling=128, clock=lambda: now[0])
    queue = admission.queue("baseline")
    rows = int(100 * RATE_WINDOW_S * 2)
    queue.add(rows, now[0])
    now[0] += rows / 100
    queue.remove(rows, now[0], answered=True)
    queue.forwarded(0.02, 1)
    return admission


def test_requests_that_arrive_together_are_each_judged_behind_those_admitted_before():
    model, admission = SlowModel(), measured_admission()
    gateway = gateway_with(model, admission)

    async def burst():
        async def one(i):
            ex = Exchange(f"r{i}", None, NULL_OBSERVATION, admission.enter(),
                          time.perf_counter(), 1.0, None)
            return await gateway._call_arm(Arm.BASELINE, [f"text {j}" for j in range(40)],
                                           "classify", ex)

        tasks = [asyncio.create_task(one(i)) for i in range(10)]
        await asyncio.sleep(0.05)  # every request judged; the admitted ones wait for the model
        done = [t for t in tasks if t.done()]
        refused = [t for t in done if isinstance(t.exception(), Overloaded)]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return len(refused), len(done)

    refused, done = asyncio.run(burst())
    # 40 rows each at 100 rows/s within 1 s: 0.4 + 0.02 s, 0.8 + 0.02 s, then 1.2 s is too late
    assert model.calls == 2
    assert refused == done == 8
    assert admission.queue("baseline").rows == 0  # the cancelled calls gave their rows back


class RecordingModel(SlowModel):
    """A SlowModel that keeps the time left each call was sent with."""

    def __init__(self):
        super().__init__()
        self.remaining: list[float] = []

    def remote(self, texts, task, carrier=None, remaining=None):
        self.remaining.append(remaining)
        return super().remote(texts, task, carrier, remaining)


def test_a_late_canary_stays_on_the_canary_where_the_baseline_would_wait_longer():
    """Colocated (`shared_compute`): a canary request predicted past its share of the deadline
    but within the whole of it, which the baseline would answer later still (the same rows
    ahead, a slower forward), is called on the canary with the whole deadline; with remote
    arms it goes to the baseline, as before."""
    def called(shared: bool) -> tuple[int, int, list[float]]:
        now = [100.0]
        admission = Admission(ceiling=128, clock=lambda: now[0], shared_compute=shared)
        for arm, rate, forward_s in (("baseline", 100, 0.02), ("optimized", 400, 0.005)):
            queue = admission.queue(arm)
            rows = int(rate * RATE_WINDOW_S * 2)
            queue.add(rows, now[0])
            now[0] += rows / rate
            queue.remove(rows, now[0], answered=True)
            queue.forwarded(forward_s, 1)
        admission.queue("optimized").add(240, now[0])  # 0.6 s ahead: past half of 1 s
        baseline, optimized = RecordingModel(), RecordingModel()
        gateway = gateway_with(baseline, admission)
        gateway.arms.handles = {Arm.BASELINE: baseline, Arm.OPTIMIZED: optimized}

        async def one():
            ex = Exchange("r", None, NULL_OBSERVATION, admission.enter(), time.perf_counter(),
                          1.0, None)
            task = asyncio.create_task(gateway._call_arm(Arm.OPTIMIZED, ["t"], "classify", ex))
            await asyncio.sleep(0.05)  # the call is out
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

        asyncio.run(one())
        return baseline.calls, optimized.calls, optimized.remaining

    baseline_calls, optimized_calls, remaining = called(shared=True)
    assert (baseline_calls, optimized_calls) == (0, 1)
    assert remaining[0] > 0.9  # the whole deadline, not the canary's half of it
    baseline_calls, optimized_calls, _ = called(shared=False)
    assert (baseline_calls, optimized_calls) == (1, 0)
