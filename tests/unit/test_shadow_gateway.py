"""The gateway's shadow comparisons (serve.gateway.shadow) with a scripted model call: sampling, the
safety skips, shedding, the background call that the response path never waits for, what is
recorded (sink items, metrics, the `shadow` span), failures and cancellation on shutdown."""

from __future__ import annotations

import asyncio
import random

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from rollout import Arm, FakeClock, Reason, Settings
from rollout.shadow import ShadowItem, aggregate_shadow, kld_outcomes
from serve.common.answer import BatchShape, ModelAnswer, StageTiming
from serve.common.errors import ModelFailed, ModelTimeout
from serve.gateway.shadow import Shadow
from serve.telemetry.otel import Telemetry

LABELS = ("sports", "politics")


def answer(arm: str, *labels: str, queue: int = 0) -> ModelAnswer:
    outputs = [{"label": label, "scores": {name: 0.9 if name == label else 0.1 for name in LABELS}}
               for label in labels]
    return ModelAnswer(arm=arm, model_version="", outputs=outputs, tokens=0,
                       batch=BatchShape(requests=1, items=len(labels)), queue=queue,
                       timing=StageTiming(preprocess=0.0, queue=0.0, model=0.0, postprocess=0.0))


class Store:
    def __init__(self):
        self.items = []

    def write(self, items):
        self.items.extend(items)


class Model:
    """The other arm: answers with `labels`, or raises `error`, once `gate` is set."""

    def __init__(self, *labels: str, error: Exception | None = None, gate: bool = False):
        self.labels, self.error = labels, error
        self.gate = asyncio.Event() if gate else None
        self.calls: list[tuple] = []

    async def __call__(self, arm, texts, task, timeout, carrier):
        self.calls.append((arm, tuple(texts), task, timeout))
        if self.gate is not None:
            await self.gate.wait()
        if self.error is not None:
            raise self.error
        return answer(arm.value, *self.labels)


class Rig:
    def __init__(self, model: Model, *, seed: int = 7, **overrides):
        self.store, self.spans = Store(), InMemorySpanExporter()
        self.reader = InMemoryMetricReader()
        self.settings = Settings(**{"shadow_share": 1.0, "telemetry_flush_s": 0.01,
                                    "trace_sample_ratio": 1.0, **overrides})
        self.telemetry = Telemetry(self.settings, self.settings, "canary-gateway",
                                   span_exporters=[self.spans], metric_readers=[self.reader],
                                   store=self.store, environ={})
        self.model = model
        self.shadow = Shadow(self.settings, model, self.telemetry, rng=random.Random(seed),
                             clock=FakeClock(1_700_000_000.0))

    def offer(self, *labels: str, answered: Arm = Arm.BASELINE, in_flight: int = 1,
              override: Reason | None = None, queue: int = 0, parent=None) -> str:
        return self.shadow.offer(answered=answered, result=answer(answered.value, *labels,
                                 queue=queue), texts=[f"t{i}" for i in range(len(labels))],
                                 task="classify", in_flight=in_flight, override=override,
                                 parent=parent)

    async def settle(self) -> None:
        while self.shadow.tasks:
            await asyncio.sleep(0)

    def stats(self):
        self.telemetry.flush()
        items = [item for item in self.store.items if isinstance(item, ShadowItem)]
        return aggregate_shadow([item.fields for item in items], 1.0)

    def metric(self, name: str) -> dict[tuple, float]:
        out = {}
        for resource in self.reader.get_metrics_data().resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        for point in metric.data.data_points:
                            out[tuple(sorted(point.attributes.items()))] = point.value
        return out

    def close(self):
        self.telemetry.shutdown()


def test_a_shadowed_baseline_answer_is_compared_with_the_optimized_arm_in_the_background():
    async def scenario():
        rig = Rig(Model("sports", "sports", gate=True))
        root = rig.telemetry.tracer.start_span("POST /v1/predict")
        parent = trace.set_span_in_context(root)
        assert rig.offer("sports", "politics", parent=parent) == "started"
        assert rig.model.calls == []  # offer() only scheduled it: the response goes out first
        await asyncio.sleep(0)
        # the shadow call has started and waits for the other arm; nothing is recorded yet
        assert rig.model.calls == [(Arm.OPTIMIZED, ("t0", "t1"), "classify", 5.0)]
        assert rig.shadow.active == 1 and rig.stats().pairs == 0
        root.end()
        rig.model.gate.set()
        await rig.settle()
        return rig, root

    rig, root = asyncio.run(scenario())
    stats = rig.stats()
    assert (stats.calls, stats.pairs, stats.agreed, stats.shed, stats.errors) == (1, 2, 1, 0, 0)
    assert rig.shadow.active == 0
    span = next(s for s in rig.spans.get_finished_spans() if s.name == "shadow")
    assert span.parent.span_id == root.get_span_context().span_id
    assert span.context.trace_id == root.get_span_context().trace_id
    assert span.attributes["canary.arm"] == "optimized"
    assert span.attributes["canary.shadow.of"] == "baseline"
    assert span.attributes["canary.shadow.agreed"] is False
    assert span.attributes["canary.shadow.agreed_pairs"] == 1
    assert span.attributes["canary.shadow.margin"] == pytest.approx(0.8)
    pairs = rig.metric("canary.shadow.pairs")
    assert sum(pairs.values()) == 2
    assert pairs[(("agreed", "false"), ("arm", "optimized"), ("margin", ">=0.1"))] == 1
    assert rig.metric("canary.shadow.calls") == {(("arm", "optimized"), ("outcome", "ok")): 1}
    rig.close()


def test_a_canary_answer_is_shadowed_on_baseline_and_compared_the_right_way_round():
    async def scenario():
        rig = Rig(Model("politics"))
        assert rig.offer("sports", answered=Arm.OPTIMIZED) == "started"
        await rig.settle()
        return rig

    rig = asyncio.run(scenario())
    assert rig.model.calls[0][0] is Arm.BASELINE
    assert rig.stats().pairs == 1 and rig.stats().agreed == 0
    rig.close()


def test_sampling_follows_the_share_and_zero_turns_it_off():
    async def scenario(share: float) -> list[str]:
        rig = Rig(Model("sports"), shadow_share=share, shadow_max_concurrency=10_000)
        outcomes = [rig.offer("sports") for _ in range(2_000)]
        await rig.settle()
        rig.close()
        return outcomes

    outcomes = asyncio.run(scenario(0.1))
    assert set(outcomes) == {"started", "unsampled"}
    assert 150 <= outcomes.count("started") <= 250  # 10 % of 2,000; seeded RNG
    assert set(asyncio.run(scenario(0.0))) == {"off"}


@pytest.mark.parametrize("reason", [Reason.KILL_SWITCH, Reason.STALE_STATE,
                                    Reason.VERSION_MISMATCH])
def test_no_shadow_while_the_canary_is_killed_stale_or_another_version(reason):
    async def scenario():
        rig = Rig(Model("sports"))
        assert rig.offer("sports", override=reason) == "unsafe"
        await rig.settle()
        return rig

    rig = asyncio.run(scenario())
    assert rig.model.calls == [] and rig.stats().shed == 0
    rig.close()


def test_past_the_concurrency_bound_shadow_work_is_shed_not_queued():
    async def scenario():
        rig = Rig(Model("sports", gate=True), shadow_max_concurrency=2)
        outcomes = [rig.offer("sports") for _ in range(5)]
        await asyncio.sleep(0)
        assert len(rig.model.calls) == 2 and rig.shadow.active == 2
        rig.model.gate.set()
        await rig.settle()
        assert rig.offer("sports") == "started"  # slots are free again
        await rig.settle()
        return rig, outcomes

    rig, outcomes = asyncio.run(scenario())
    assert outcomes == ["started", "started", "shed", "shed", "shed"]
    stats = rig.stats()
    assert (stats.calls, stats.shed) == (3, 3)
    assert rig.metric("canary.shadow.calls")[(("arm", "optimized"), ("outcome", "shed"))] == 3
    rig.close()


def test_a_busy_gateway_or_a_long_queue_sheds_shadow_work():
    async def scenario():
        rig = Rig(Model("sports"), shadow_shed_in_flight=4, shadow_shed_queue=2)
        outcomes = [rig.offer("sports", in_flight=5), rig.offer("sports", queue=3),
                    rig.offer("sports", in_flight=4, queue=2)]
        await rig.settle()
        return rig, outcomes

    rig, outcomes = asyncio.run(scenario())
    assert outcomes == ["shed", "shed", "started"]
    assert rig.stats().shed == 2 and len(rig.model.calls) == 1
    rig.close()


@pytest.mark.parametrize("error, outcome", [
    (ModelTimeout("too slow"), "timeout"), (ModelFailed("boom"), "error"),
    (RuntimeError("replica died"), "error")])
def test_a_failing_shadowed_arm_is_counted_as_an_error(error, outcome):
    async def scenario():
        rig = Rig(Model(error=error))
        assert rig.offer("sports") == "started"
        await rig.settle()
        return rig

    rig = asyncio.run(scenario())
    stats = rig.stats()
    assert (stats.errors, stats.pairs, stats.calls) == (1, 0, 0)
    assert rig.metric("canary.shadow.calls") == {(("arm", "optimized"), ("outcome", outcome)): 1}
    span = next(s for s in rig.spans.get_finished_spans() if s.name == "shadow")
    assert span.attributes["canary.shadow.outcome"] == outcome
    assert rig.shadow.active == 0
    rig.close()


def test_answers_that_cannot_be_paired_count_as_a_mismatch_error():
    async def scenario():
        rig = Rig(Model("sports", "sports"))  # two outputs for one input
        rig.offer("sports")
        await rig.settle()
        return rig

    rig = asyncio.run(scenario())
    assert rig.stats().errors == 1
    assert rig.metric("canary.shadow.calls") == {(("arm", "optimized"), ("outcome", "mismatch")): 1}
    rig.close()


def test_close_cancels_outstanding_shadow_calls_and_records_nothing_for_them():
    async def scenario():
        rig = Rig(Model("sports", gate=True), shadow_max_concurrency=3)
        for _ in range(3):
            rig.offer("sports")
        jobs = list(rig.shadow.tasks)
        await asyncio.sleep(0)
        rig.shadow.close()
        await asyncio.gather(*jobs, return_exceptions=True)
        return rig, jobs

    rig, jobs = asyncio.run(scenario())
    assert all(job.cancelled() for job in jobs)
    assert rig.shadow.active == 0 and not rig.shadow.tasks
    stats = rig.stats()
    assert (stats.calls, stats.errors, stats.pairs) == (0, 0, 0)
    spans = [s for s in rig.spans.get_finished_spans() if s.name == "shadow"]
    assert [s.attributes["canary.shadow.outcome"] for s in spans] == ["cancelled"] * 3
    rig.close()


def test_telemetry_off_means_no_shadow_calls():
    async def scenario():
        rig = Rig(Model("sports"), telemetry_enabled=False)
        outcome = rig.offer("sports")
        await rig.settle()
        return rig, outcome

    rig, outcome = asyncio.run(scenario())
    assert outcome == "off" and rig.model.calls == []
    rig.close()


def test_a_telemetry_failure_while_recording_is_logged_and_never_raised(caplog):
    class Broken:
        def offer(self, item):
            raise RuntimeError("sink broke")

    async def scenario():
        rig = Rig(Model("sports"), shadow_max_concurrency=1)
        real, rig.telemetry.sink = rig.telemetry.sink, Broken()
        first = rig.offer("sports")
        await rig.settle()
        second = rig.offer("sports")
        await rig.settle()
        rig.telemetry.sink = real
        return rig, first, second

    rig, first, second = asyncio.run(scenario())
    assert (first, second) == ("started", "started")  # the slot was released all the same
    assert "recording a shadow comparison failed" in caplog.text
    assert rig.metric("canary.shadow.calls")[(("arm", "optimized"), ("outcome", "ok"))] == 2
    rig.close()


def test_close_from_another_thread_cancels_on_the_loop_and_after_the_loop_is_gone():
    import threading

    async def scenario():
        rig = Rig(Model("sports", gate=True), shadow_max_concurrency=2)
        rig.offer("sports")
        rig.offer("sports")
        jobs = list(rig.shadow.tasks)
        await asyncio.sleep(0)
        closer = threading.Thread(target=rig.shadow.close)  # as a replica's __del__ may run
        closer.start()
        closer.join()
        await asyncio.gather(*jobs, return_exceptions=True)
        return rig, jobs

    rig, jobs = asyncio.run(scenario())
    assert all(job.cancelled() for job in jobs) and not rig.shadow.tasks

    rig.close()
    stranded = Rig(Model("sports", gate=True))

    async def leave_one_running():
        stranded.offer("sports")
        await asyncio.sleep(0)

    loop = asyncio.new_event_loop()
    loop.run_until_complete(leave_one_running())
    loop.close()  # the task never finished; its loop is closed
    assert len(stranded.shadow.tasks) == 1
    stranded.shadow.close()  # must not raise
    stranded.close()


def test_pairs_are_counted_per_slice_with_the_header_value_capped():
    async def scenario():
        rig = Rig(Model("sports", "politics"), slice_header="X-Tenant")
        texts = ["比赛以平局结束", "The match ended"]
        for tenant in ["acme", "x" * 300, *(f"t{j}" for j in range(40))]:
            result = answer("baseline", "politics", "politics")  # the optimized: sports first
            assert rig.shadow.offer(answered=Arm.BASELINE, result=result, texts=texts,
                                    task="classify", in_flight=1, override=None,
                                    header=tenant) == "started"
            await rig.settle()
        stats = rig.stats()
        rig.close()
        return stats, rig.shadow.header_values

    stats, values = asyncio.run(scenario())
    assert stats.pairs == 84 and stats.agreed == 42
    assert stats.slices["script:han"] == (42, 0, 42)  # margin 0.8: confident flips
    assert stats.slices["script:latin"] == (42, 42, 0)
    assert stats.slices["label:politics"] == (84, 42, 42)
    assert stats.slices["length:1-16"] == (84, 42, 42)
    assert stats.slices["header:acme"] == (2, 1, 1)
    assert stats.slices["header:" + "x" * 64] == (2, 1, 1)  # cut to 64 characters
    headers = [key for key in stats.slices if key.startswith("header:")]
    assert len(headers) == 33 and stats.slices["header:other"] == (20, 10, 10)
    assert len(values.seen) == 32
    assert stats.slice_rows(min_pairs=30)[0].slice == "script:han"


def scored(kld: list[float], same: list[bool]) -> dict:
    return {"kld": kld, "same_top": same, "reference_nll": [0.5] * len(kld),
            "other_nll": [0.6] * len(kld)}


def test_a_generated_answer_is_scored_by_its_tokens_and_filed_under_its_prompt_slices():
    timeouts = []

    async def score(timeout):
        timeouts.append(timeout)
        return scored([0.002, 0.004, 0.0, 0.002], [True, True, False, True])

    async def scenario():
        rig = Rig(Model())
        assert rig.shadow.offer_tokens(answered=Arm.BASELINE, score=score, prompt="Local news",
                                       prompt_tokens=3, in_flight=1, override=None) == "started"
        await rig.settle()
        return rig

    rig = asyncio.run(scenario())
    stats = rig.stats()
    assert timeouts == [5.0] and stats.calls == 1 and stats.pairs == 0
    assert stats.token_responses == 1 and stats.token_tokens == 4
    assert stats.token_kld == pytest.approx(0.002) and stats.token_agreement == 0.75
    assert stats.token_slices == {"script:latin": (1, pytest.approx(0.002), 0.75),
                                  "length:1-16": (1, pytest.approx(0.002), 0.75)}
    assert kld_outcomes(stats.token_bins, 0.1) == pytest.approx(0.02)  # bin's upper edge
    span = next(s for s in rig.spans.get_finished_spans() if s.name == "shadow")
    assert span.attributes["canary.shadow.tokens"] == 4
    assert rig.metric("canary.shadow.calls") == {(("arm", "optimized"), ("outcome", "ok")): 1}
    rig.close()


@pytest.mark.parametrize("error, outcome", [
    (ModelTimeout("too slow"), "timeout"), (ValueError("vocabularies differ"), "error")])
def test_a_failing_scorer_is_counted_and_a_killed_canary_never_scored(error, outcome):
    async def score(timeout):
        raise error

    async def scenario():
        rig = Rig(Model())
        offer = dict(answered=Arm.OPTIMIZED, score=score, prompt="x", prompt_tokens=2,
                     in_flight=1)
        assert rig.shadow.offer_tokens(**offer, override=Reason.KILL_SWITCH) == "unsafe"
        assert rig.shadow.offer_tokens(**offer, override=None) == "started"
        await rig.settle()
        return rig

    rig = asyncio.run(scenario())
    stats = rig.stats()
    assert (stats.errors, stats.token_responses, stats.calls) == (1, 0, 0)
    assert rig.metric("canary.shadow.calls") == {(("arm", "baseline"), ("outcome", outcome)): 1}
    rig.close()


def test_with_flip_capture_a_prompt_whose_arms_part_early_is_captured():
    from rollout.flips import FlipItem

    async def parts_early(timeout):
        return scored([0.01, 0.2, 0.0], [True, False, True])

    async def agrees(timeout):
        return scored([0.001] * 3, [True] * 3)

    async def scenario():
        rig = Rig(Model(), flip_capture=True)
        for score, rid in ((parts_early, "r-early"), (agrees, "r-same")):
            rig.shadow.offer_tokens(answered=Arm.BASELINE, score=score, prompt=f"prompt {rid}",
                                    prompt_tokens=4, in_flight=1, override=None,
                                    request_id=rid, versions=("fp32-a", "int8-b"))
        await rig.settle()
        return rig

    rig = asyncio.run(scenario())
    rig.telemetry.flush()
    [item] = [i for i in rig.store.items if isinstance(i, FlipItem)]
    record = item.record
    assert (record.task, record.text, record.request_id, record.parted_at) == (
        "generate", "prompt r-early", "r-early", 1)
    assert (record.baseline_version, record.optimized_version) == ("fp32-a", "int8-b")
    assert record.kld == pytest.approx(0.07)
    assert rig.metric("canary.shadow.flips") == {(("outcome", "captured"),): 1}
    rig.close()
