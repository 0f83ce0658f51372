"""The prediction routes answered before FastAPI's router (serve.gateway.prediction_routes), and
everything else left to FastAPI, in a real FastAPI app over Starlette's test client."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.testclient import TestClient

from serve.gateway import prediction_routes
from serve.gateway.prediction_routes import PredictionRoutes


class FakeGateway:
    """Answers every door with which door it was and what it saw."""

    def __init__(self, fail: bool = False):
        self.doors = SimpleNamespace(**{name: f"door:{name}" for name in (
            "native", "openai", "oip", "tei_embed", "tei_predict")})
        self.fail = fail

    async def serve_door(self, request: Request, door) -> JSONResponse:
        if self.fail:
            raise RuntimeError("a bug in the gateway")
        body = await request.body()
        return JSONResponse({"door": door, "body": body.decode(), "path": request.url.path,
                             "params": request.path_params,
                             "id": request.headers.get("x-request-id")})


@pytest.fixture
def app():
    """An app as the gateway's: routes of its own behind the middleware, a 500 handler."""
    api = FastAPI()
    api.add_middleware(PredictionRoutes)

    @api.post("/v1/predict")
    async def through_fastapi(request: Request):
        return {"door": "fastapi"}

    @api.get("/v1/status")
    async def status():
        return {"status": "fine"}

    @api.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception):
        return JSONResponse({"error": "internal error"}, status_code=500)

    yield api
    prediction_routes._serving.clear()


@pytest.mark.parametrize("path, door", [
    ("/v1/predict", "door:native"), ("/v1/embeddings", "door:openai"),
    ("/embed", "door:tei_embed"), ("/predict", "door:tei_predict"),
    ("/v2/models/all-MiniLM-L6-v2/infer", "door:oip"),
])
def test_a_prediction_goes_to_its_door_without_fastapis_router(app, path, door):
    prediction_routes.serve(FakeGateway())
    answer = TestClient(app).post(path, content=b'{"inputs":["a"]}',
                                  headers={"X-Request-ID": "r-1"})
    assert answer.status_code == 200
    assert answer.json() == {"door": door, "body": '{"inputs":["a"]}', "path": path,
                             "params": {"name": "all-MiniLM-L6-v2"} if "v2" in path else {},
                             "id": "r-1"}


def test_before_the_gateway_starts_predictions_go_through_fastapi(app):
    assert TestClient(app).post("/v1/predict", json={}).json() == {"door": "fastapi"}


def test_other_methods_paths_and_routes_are_fastapis(app):
    prediction_routes.serve(FakeGateway())
    client = TestClient(app)
    assert client.get("/v1/predict").status_code == 405
    assert client.get("/v1/status").json() == {"status": "fine"}
    assert client.post("/v1/predictions").status_code == 404
    assert client.post("/v2/models/a/b/infer").status_code == 404  # no such route
    assert client.post("/v2/models//infer").status_code == 404


def test_an_unexpected_error_reaches_the_apps_handler(app):
    prediction_routes.serve(FakeGateway(fail=True))
    answer = TestClient(app, raise_server_exceptions=False).post("/v1/predict", json={})
    assert answer.status_code == 500 and answer.json() == {"error": "internal error"}
