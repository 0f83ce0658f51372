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


def test_the_first_prediction_puts_the_prediction_routes_first_for_serves_route_name(app):
    """Serve names a request's route by matching the app's routes in order: after the first
    prediction the prediction route is matched first, and everything still answers as before."""
    from ray.serve._private.thirdparty.get_asgi_route_name import get_asgi_route_name

    prediction_routes.serve(FakeGateway())
    paths = [getattr(route, "path", None) for route in app.router.routes]
    assert paths[-2:] == ["/v1/predict", "/v1/status"]
    client = TestClient(app)
    assert client.get("/v1/status").json() == {"status": "fine"}
    assert [getattr(r, "path", None) for r in app.router.routes] == paths  # not yet
    assert client.post("/v1/predict", json={}).json()["door"] == "door:native"
    reordered = [getattr(route, "path", None) for route in app.router.routes]
    assert reordered[0] == "/v1/predict" and sorted(map(str, reordered)) == sorted(map(str, paths))
    scope = {"type": "http", "method": "POST", "path": "/v1/predict", "root_path": ""}
    assert get_asgi_route_name(app, scope) == "/v1/predict"
    assert client.get("/v1/status").json() == {"status": "fine"}
    assert client.get("/v1/predict").status_code == 405
    assert client.post("/v1/embeddings", json={}).json()["door"] == "door:openai"
    assert [getattr(r, "path", None) for r in app.router.routes] == reordered  # once


def test_prediction_routes_inside_included_routers_come_first_too():
    """The gateway's app keeps its routes inside included routers (FastAPI's nodes): the
    prediction route comes first in its router and its router first in the app."""
    from fastapi import APIRouter
    from ray.serve._private.thirdparty.get_asgi_route_name import get_asgi_route_name

    inner = APIRouter()

    @inner.get("/v1/status")
    async def status():
        return {"status": "fine"}

    @inner.post("/v1/predict")
    async def predict():
        return {"door": "fastapi"}

    api = FastAPI()
    api.include_router(inner)
    prediction_routes.put_first(api)
    top = api.router.routes
    assert not hasattr(top[0], "path") or top[0].path == "/v1/predict"
    scope = {"type": "http", "method": "POST", "path": "/v1/predict", "root_path": ""}
    assert get_asgi_route_name(api, scope) == "/v1/predict"
    client = TestClient(api)
    assert client.get("/v1/status").json() == {"status": "fine"}
    assert client.post("/v1/predict").json() == {"door": "fastapi"}
    assert client.get("/openapi.json").json()["paths"].keys() == {"/v1/status", "/v1/predict"}


def test_putting_first_leaves_other_routes_in_their_order():
    others = [SimpleNamespace(path=p) for p in ("/b", "/a", "/v1/predictions")]
    app = SimpleNamespace(router=SimpleNamespace(routes=list(others)))
    prediction_routes.put_first(app)
    assert app.router.routes == others
    prediction_routes.put_first(None)  # not an app with a router: nothing to order


def test_in_the_gateways_own_app_serve_matches_one_route_for_a_native_prediction(monkeypatch):
    import starlette.routing
    from ray.serve._private.thirdparty.get_asgi_route_name import get_asgi_route_name

    from serve.gateway.deployment import Gateway

    # the app as Serve froze it for the replicas (serve.ingress keeps it in the constructor)
    [app] = [cell.cell_contents for cell in Gateway.func_or_class.__init__.__closure__
             if type(cell.cell_contents).__name__ == "FastAPI"]

    def flat(routes):
        for route in routes:
            inner = getattr(getattr(route, "original_router", None), "routes", None)
            yield from flat(inner) if inner else [str(getattr(route, "path", None))]

    before = sorted(flat(app.router.routes))
    prediction_routes.put_first(app)
    assert sorted(flat(app.router.routes)) == before  # every route kept
    matched = []
    matches = starlette.routing.Route.matches
    monkeypatch.setattr(starlette.routing.Route, "matches",
                        lambda self, scope: matched.append(self.path) or matches(self, scope))
    for path, name, count in [("/v1/predict", "/v1/predict", 1),
                              ("/v1/embeddings", "/v1/embeddings", 2),
                              ("/v2/models/m/infer", "/v2/models/{name}/infer",
                               len(prediction_routes.ROUTE_PATHS))]:
        matched.clear()
        scope = {"type": "http", "method": "POST", "path": path, "root_path": ""}
        assert get_asgi_route_name(app, scope) == name and len(matched) == count, matched
