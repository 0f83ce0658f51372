"""The gateway's OpenAPI document is its contract: `POST /v1/predict` declares its request body
(read by the gateway itself, never by FastAPI), its 200 body and every error status it answers
with the error body; the other public endpoints declare their bodies. Built from the FastAPI
application alone: no Ray, no server."""

import json

import pytest
from fastapi.responses import JSONResponse

from serve.common.errors import ClientGone, ErrorBody, GatewayError, error_response
from serve.gateway.deployment import api
from serve.gateway.schemas import PredictRequest, PredictResponse

PREDICT_ERRORS = {"400", "403", "408", "409", "413", "422", "500", "503", "504"}


@pytest.fixture(scope="module")
def document():
    api.openapi_schema = None  # built afresh, not a copy another test cached
    return json.loads(json.dumps(api.openapi()))  # as /openapi.json serves it


def _ref(response_or_body: dict) -> str:
    return response_or_body["content"]["application/json"]["schema"]["$ref"]


def test_predict_declares_its_request_body_and_registers_the_model(document):
    operation = document["paths"]["/v1/predict"]["post"]
    assert operation["requestBody"]["required"] is True
    assert _ref(operation["requestBody"]) == "#/components/schemas/PredictRequest"
    registered = document["components"]["schemas"]["PredictRequest"]
    expected = PredictRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    nested = expected.pop("$defs")  # registered beside it, where its references point
    assert registered == json.loads(json.dumps(expected))
    for name, schema in nested.items():
        assert document["components"]["schemas"][name] == json.loads(json.dumps(schema))
    assert registered["required"] == ["inputs"] and registered["additionalProperties"] is False
    headers = {p["name"] for p in operation["parameters"] if p["in"] == "header"}
    assert headers == {"X-Request-ID", "X-Routing-Key", "Idempotency-Key", "X-Canary-Arm-Override"}


def test_predict_declares_its_200_body_and_headers(document):
    ok = document["paths"]["/v1/predict"]["post"]["responses"]["200"]
    assert _ref(ok) == "#/components/schemas/PredictResponse"
    assert {"X-Request-ID", "X-Canary-Arm", "Server-Timing"} <= set(ok["headers"])
    schema = document["components"]["schemas"]["PredictResponse"]
    assert set(schema["required"]) == {
        "request_id", "arm", "model_version", "task", "outputs", "fallback", "routing"}
    body = {"request_id": "r", "arm": "baseline", "model_version": "fp32-x", "task": "classify",
            "outputs": [{"label": "a", "scores": {"a": 0.9, "b": 0.1}}], "fallback": False,
            "routing": "share"}
    assert PredictResponse.model_validate(body).model_dump() == body


def test_predict_declares_every_error_status_with_the_error_body(document):
    responses = document["paths"]["/v1/predict"]["post"]["responses"]
    errors = set(responses) - {"200"}
    assert errors == PREDICT_ERRORS
    assert "499" not in responses  # a log status, never sent
    for status in errors:
        assert _ref(responses[status]) == "#/components/schemas/ErrorBody", status
    assert "Retry-After" in responses["503"]["headers"]
    assert "Retry-After" in responses["409"]["headers"]
    assert "`overloaded`" in responses["503"]["description"]
    assert "`model_unavailable`" in responses["503"]["description"]


def test_every_error_the_gateway_sends_has_its_status_declared(document):
    responses = document["paths"]["/v1/predict"]["post"]["responses"]
    sent = [cls for cls in GatewayError.__subclasses__()  # the request path's (serve.common.errors)
            if cls.__module__ == "serve.common.errors" and cls is not ClientGone]
    assert sent, "no error classes found"
    for cls in sent:
        assert str(cls.status) in responses, f"{cls.__name__} ({cls.status}) is not declared"
        assert f"`{cls.type}`" in responses[str(cls.status)]["description"]


def test_the_error_body_is_the_declared_model_and_unchanged_on_the_wire():
    response = error_response(503, "overloaded", "retry later", "rid-1", retry_after=1)
    body = json.loads(response.body)
    assert ErrorBody.model_validate(body).model_dump() == body
    before = JSONResponse({"error": {"type": "overloaded", "message": "retry later",
                                     "request_id": "rid-1"}}, status_code=503)
    assert response.body == before.body
    assert response.headers["retry-after"] == "1"


@pytest.mark.parametrize(("path", "model"), [
    ("/v1/rollout", "RolloutView"), ("/healthz", "Health"), ("/readyz", "Readiness")])
def test_other_public_endpoints_declare_their_bodies(document, path, model):
    responses = document["paths"][path]["get"]["responses"]
    assert _ref(responses["200"]) == f"#/components/schemas/{model}"
    assert _ref(responses["500"]) == "#/components/schemas/ErrorBody"
    if path == "/readyz":
        assert _ref(responses["503"]) == "#/components/schemas/Readiness"
