"""Fuzz the HTTP API with hypothesis against the real gateway: no 500, no hang, state unchanged."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FUZZ = settings(
    max_examples=120, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5)
    ),
    max_leaves=20,
)
bodies = st.one_of(
    json_values.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries(
        {"inputs": st.lists(st.text(max_size=250), max_size=10)},
        optional={"task": st.sampled_from(["classify", "embed", "x", ""]) | json_values},
    ).map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=300),
)
header_text = st.text(  # printable ASCII; HTTP forbids surrounding whitespace in values
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=200
).map(str.strip)


def _check(response):
    assert response.status_code in (200, 413, 422), (response.status_code, response.text)
    body = response.json()
    if response.status_code == 200:
        assert len(body["outputs"]) >= 1 and body["arm"] in ("baseline", "optimized")
    else:
        assert set(body["error"]) == {"type", "message", "request_id"}


def test_fuzzed_bodies_and_headers_never_500(gw):
    before = gw.rollout().state()

    @FUZZ
    @given(body=bodies, request_id=header_text, routing_key=header_text)
    def run(body, request_id, routing_key):
        response = gw.client.post(
            "/v1/predict", content=body, timeout=15,
            headers={"content-type": "application/json", "X-Request-ID": request_id,
                     "X-Routing-Key": routing_key},
        )
        _check(response)

    run()
    after = gw.rollout().state()
    assert after.revision == before.revision  # fuzzing changed no rollout state


@pytest.mark.parametrize("path", ["/v1/rollout", "/healthz", "/readyz", "/v1/predict/x", "/%00"])
@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "DELETE"])
def test_other_paths_and_methods_answer_json_without_500(gw, path, method):
    response = gw.client.request(method, path, content=b"{}")
    assert response.status_code < 500, (method, path, response.status_code)
    assert response.headers["content-type"].startswith("application/json")
