"""A generative gateway's own instruments (serve.gateway.generation), beside the request metrics
every gateway records (serve.telemetry.instruments), each per arm:

    canary.generate.first_token  histogram  ms, arm: from the request's arrival to its first
                                            event (queueing for the KV cache and prefill
                                            included)
    canary.generate.inter_token  histogram  ms, arm: between two tokens of an answer
    canary.generate.tokens       counter    arm, kind (prompt, completion)
    canary.generate.refused      counter    arm, reason (kv_wait: no room in the KV cache
                                            within the deadline; never_fits: over the budget
                                            even alone; queue_full; timeout: no first token in
                                            time)
    canary.generate.kv_bytes     gauge      arm, kind (in_use, peak, budget): the arm's KV
                                            cache as its replica last reported it
    canary.generate.sequences    gauge      arm, state (running, waiting)

Output tokens per second is `rate(canary_generate_tokens_total{kind="completion"})`.
"""

from __future__ import annotations

from collections.abc import Callable

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from serve.telemetry.aggregate import SdkInstruments
from serve.telemetry.instruments import ARM, LATENCY_MS

INTER_TOKEN_MS = (0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 50, 75, 100, 250, 500, 1000)
KV_KINDS = {"in_use": "kv_in_use_bytes", "peak": "kv_peak_bytes", "budget": "kv_budget_bytes"}
STATES = {"running": "sequences_running", "waiting": "sequences_waiting"}


class TokenMetrics:
    """The instruments above, on `meter`; `infos()` gives per arm its replica's last `info()`
    for the gauges."""

    def __init__(self, meter: Meter, infos: Callable[[], dict[str, dict]] | None = None):
        make = SdkInstruments(meter)
        self.first_token = make.histogram(
            "canary.generate.first_token", "ms", "time to an answer's first token", ARM,
            LATENCY_MS)
        self.inter_token = make.histogram(
            "canary.generate.inter_token", "ms", "time between two tokens of an answer", ARM,
            INTER_TOKEN_MS)
        self.tokens = make.counter(
            "canary.generate.tokens", "{token}", "prompt and completion tokens of answers",
            ("arm", "kind"))
        self.refusals = make.counter(
            "canary.generate.refused", "{request}", "generative requests refused before their "
            "first token", ("arm", "reason"))
        if infos is not None:
            _gauges(meter, infos)

    def answered(self, arm: str, first_ms: float, token_at: list[float], prompt_tokens: int,
                 completion_tokens: int) -> None:
        """One answer (whole, cut or failed after its first event): `token_at`, the
        perf_counter of each token's arrival."""
        self.first_token.record((arm,), first_ms)
        for before, after in zip(token_at, token_at[1:], strict=False):
            self.inter_token.record((arm,), (after - before) * 1000)
        self.tokens.add((arm, "prompt"), prompt_tokens)
        self.tokens.add((arm, "completion"), completion_tokens)

    def refused(self, arm: str, reason: str) -> None:
        self.refusals.add((arm, reason), 1)


def _gauges(meter: Meter, infos: Callable[[], dict[str, dict]]) -> None:
    def kv(_: CallbackOptions):
        for arm, info in infos().items():
            for kind, key in KV_KINDS.items():
                if key in info:
                    yield Observation(info[key], {"arm": arm, "kind": kind})

    def sequences(_: CallbackOptions):
        for arm, info in infos().items():
            for state, key in STATES.items():
                if key in info:
                    yield Observation(info[key], {"arm": arm, "state": state})

    meter.create_observable_gauge("canary.generate.kv_bytes", [kv], "By",
                                  "KV cache bytes of an arm's replica")
    meter.create_observable_gauge("canary.generate.sequences", [sequences], "{sequence}",
                                  "sequences an arm's replica decodes or holds waiting")
