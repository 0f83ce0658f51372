"""The OpenAPI document is the contract: requests generated from the running app's own
/openapi.json (schemathesis; valid ones, and for predict invalid ones too) get a status the
document declares for the operation, a body that validates against the schema declared for that
status, and never a 500. The dashboard's actions (POSTs that change the rollout) are not fuzzed
here; test_fuzz_http.py fuzzes predict's raw bytes."""

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance]
PUBLIC = ["/v1/predict", "/v1/rollout", "/healthz", "/readyz"]
NAME = "tiny-encoder"  # the served model (tests.serve_app's model folder)
DOORS = ["/v1/embeddings", "/v2/models/{name}/infer", "/embed", "/predict", "/v1/completions",
         "/v1/chat/completions"]  # the doors (the last two refuse: this model does not generate)
DOOR_READS = ["/v1/models", "/v2", "/v2/health/live", "/v2/health/ready", "/v2/models/{name}",
              "/v2/models/{name}/ready", "/info"]
REQUEST_TIMEOUT_S = 10  # one request's deadline; the whole module stays well under a minute


def _fuzz(examples: int):
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow, HealthCheck.filter_too_much])


@pytest.fixture(scope="module")
def contract(gateway):
    """The running app's own OpenAPI document, its public endpoints only."""
    loaded = schemathesis.openapi.from_url(f"{gateway.url}/openapi.json", timeout=30)
    return loaded.include(path=PUBLIC + DOORS + DOOR_READS)


def test_the_running_app_serves_the_declared_predict_contract(gw):
    document = gw.client.get("/openapi.json").json()
    operation = document["paths"]["/v1/predict"]["post"]
    assert "PredictRequest" in document["components"]["schemas"]
    assert operation["requestBody"]["content"]["application/json"]["schema"]
    assert {"200", "413", "422", "503"} <= set(operation["responses"])


def _encoder_only(case):
    """A valid predict body for this gateway's encoder: without what only a causal LM takes
    (the task generate, its `parameters`), which this gateway refuses (422, also checked)."""
    if isinstance(case.body, dict):
        case.body.pop("parameters", None)
        if case.body.get("task") == "generate":
            case.body.pop("task")
    return case


def test_fuzzed_predict_requests_get_declared_answers(gw, contract):
    operation = contract["/v1/predict"]["POST"]
    cases = (operation.as_strategy(GenerationMode.POSITIVE).map(_encoder_only)
             | operation.as_strategy(GenerationMode.NEGATIVE))
    seen: set[int] = set()
    before = gw.rollout().state()

    @_fuzz(110)
    @given(case=cases)
    def run(case):
        response = case.call(base_url=gw.url, timeout=REQUEST_TIMEOUT_S)
        seen.add(response.status_code)
        case.validate_response(response, checks=CHECKS)

    run()
    assert {200, 422} <= seen, seen  # both the answer and the refusal were checked
    assert gw.rollout().state().revision == before.revision  # fuzzing changed no state


def test_a_valid_request_is_answered_as_declared(gw, contract):
    operation = contract["/v1/predict"]["POST"]
    for body in ({"inputs": ["a fine day", "b"]}, {"inputs": ["x"], "task": "embed"}):
        case = operation.Case(body=body, media_type="application/json")
        response = case.call(base_url=gw.url, timeout=REQUEST_TIMEOUT_S)
        assert response.status_code == 200, response.text
        case.validate_response(response, checks=CHECKS)


@pytest.mark.parametrize("path", ["/v1/rollout", "/healthz", "/readyz", *DOOR_READS])
def test_the_other_public_endpoints_answer_as_declared(gw, contract, path):
    operation = contract[path]["GET"]

    @_fuzz(5)
    @given(case=operation.as_strategy(GenerationMode.POSITIVE))
    def run(case):
        case.validate_response(case.call(base_url=gw.url, timeout=REQUEST_TIMEOUT_S),
                               checks=CHECKS)

    run()


@pytest.mark.parametrize("path", DOORS)
def test_fuzzed_front_door_requests_get_declared_answers(gw, contract, path):
    operation = contract[path]["POST"]
    cases = (operation.as_strategy(GenerationMode.POSITIVE)
             | operation.as_strategy(GenerationMode.NEGATIVE))
    seen: set[int] = set()

    @_fuzz(30)
    @given(case=cases)
    def run(case):
        if case.path_parameters is not None and "name" in case.path_parameters:
            case.path_parameters["name"] = NAME  # the served model, else every case is a 404
        response = case.call(base_url=gw.url, timeout=REQUEST_TIMEOUT_S)
        seen.add(response.status_code)
        case.validate_response(response, checks=CHECKS)

    run()
    assert seen - {200}, seen  # refusals were checked against the contract too

