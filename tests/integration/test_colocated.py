"""The colocated topology end to end: the same app with both models loaded in the gateway's
replica (serve.gateway.colocated), as a second Serve application in the shared test cluster, on the
shared Redis under its own app name.

The contract is the remote topology's: the tests below are the shared app's own, imported and
run here against the colocated app (this module's `gw`), so a behaviour that holds in one
topology and not in the other fails here: kill switch, sticky share, header routes, fallback,
admission by deadline, live fault injection, telemetry and the ramp. One of each kind: every
live change restarts the gateway replica, which loads both models again (about 10 s each);
tests/unit/test_colocated.py covers the batching of two arms in one process.
"""

from __future__ import annotations

import pytest

from ops.cli.format import gateway_rows
from tests.integration.test_gateway import (  # noqa: F401  (run here, on the colocated app)
    test_a_canary_that_cannot_answer_within_its_share_gives_the_request_to_baseline,
    test_embed_returns_unit_vectors,
    test_failed_canary_falls_back_to_baseline,
    test_gateway_reports_what_it_serves_and_the_share_is_bound_to_it,
    test_kill_switch_beats_share_and_unkill_restores,
    test_predict_answers_with_contract_fields_and_headers,
    test_share_hundred_sends_everything_to_optimized,
    test_sticky_and_monotone_widening,
)
from tests.integration.test_gateway_telemetry import (  # noqa: F401
    test_known_sequence_gives_known_metrics_windows_and_a_fallback_trace,
)
from tests.integration.test_ramp_gateway import (  # noqa: F401
    ramp_env,
    test_a_healthy_canary_is_promoted_through_a_short_plan,
)
from tests.integration.test_routes import (  # noqa: F401
    routes,
    test_a_route_sends_its_requests_to_optimized_at_zero_share_until_removed,
    test_the_kill_switch_beats_routes_and_overrides,
)
from tests.integration.test_shadow import shadow_stats, total, wait_for


@pytest.fixture(scope="module")
def colocated_app(gateway):
    from tests.serve_app import start_colocated, stop_beside

    app = start_colocated(gateway)
    yield app
    stop_beside(app)


@pytest.fixture
def gw(colocated_app):
    """The colocated app with the rollout reset to 0 %, kill switch off, no faults."""
    return colocated_app.reset()


def test_the_gateway_and_rollout_status_say_the_topology(gw):
    assert gw.served_state()["topology"] == "colocated"
    store = gw.rollout().store
    try:
        reports = store.deployments()
        state = store.get()
    finally:
        store.close()
    assert {report.topology for report in reports} == {"colocated"}
    rows = dict(gateway_rows(state, reports, now=reports[0].ts, ttl_s=60))
    assert rows["  topology"].startswith("colocated: both models run in this gateway")


def test_both_models_answer_from_the_gateways_own_process(gw):
    """No model deployment exists for this app: each arm's answer comes from the process that
    served the request (the same pid for both arms and for the gateway's readiness)."""
    from ray import serve

    status = serve.status().applications[gw.name]
    assert set(status.deployments) == {"gateway", "ramp-controller"}
    assert gw.client.get("/readyz").json()["models"] == {"baseline": True, "optimized": True}
    gw.set_state(canary_bp=10_000)
    assert gw.predict(["to the optimized arm"]).json()["arm"] == "optimized"


def test_one_trace_holds_the_gateway_the_model_and_the_shadow(gw):
    """The model's spans (service canary-model) join the request's trace from the same
    process, and the shadow's comparison with the other arm lands in it too."""
    gw.redeploy({}, shadow_share=1.0)
    before = total(shadow_stats(gw))
    response = gw.predict(["one trace, both arms"], **{"X-Request-ID": "colocated-trace-1"})
    assert response.status_code == 200
    wait_for(gw, lambda stats: total(stats) > before, "the shadow call")
    store = gw.telemetry()
    try:
        # the root span is named after the path, under this app's route prefix here
        _, spans = gw.wait_for_trace(store, "colocated-trace-1", "model.predict", "forward",
                                     "shadow")
    finally:
        store.close()
    assert {span["service"] for span in spans} == {"canary-gateway", "canary-model"}
    shadow = next(span for span in spans if span["name"] == "shadow")
    assert shadow["attrs"]["canary.arm"] == "optimized"
    assert shadow["attrs"]["canary.shadow.outcome"] == "ok"
