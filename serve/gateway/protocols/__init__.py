"""The gateway's front doors: the protocols clients already speak, each parsed into the
gateway's one request and answered in its own shape (serve.gateway.protocols.door).

- `door.py`: what a door is, the native one, and the served model as the doors describe it;
- `openai_api.py`: OpenAI's `GET /v1/models`, `POST /v1/embeddings`;
- `openai_generate.py`: OpenAI's `POST /v1/completions`, `POST /v1/chat/completions`, whole or
  streamed (a causal LM's: serve.gateway.generation);
- `oip.py`: the Open Inference Protocol v2 over REST (`/v2/...`), with `tensors.py`, its
  binary tensor data extension; `oip_grpc.py`: the same over gRPC, with `grpc_wire.py`, its
  messages;
- `tei.py`: Text Embeddings Inference's `POST /embed`, `POST /predict`, `GET /info`;
- `endpoints.py`: their routes, mixed into the gateway deployment.

`predicts(path)` says which paths are predictions, for serve.gateway.ingress (which takes their
in-flight slot and sheds them at the door), and `shed_response` what a request shed there is
answered in its protocol's shape; neither imports the doors.
"""

from starlette.responses import JSONResponse

PREDICTION_PATHS = frozenset({"/v1/predict", "/v1/embeddings", "/embed", "/predict",
                              "/v1/completions", "/v1/chat/completions"})
OPENAI_PATHS = frozenset({"/v1/embeddings", "/v1/completions", "/v1/chat/completions"})


def predicts(path: str | None) -> bool:
    """Whether a request for `path` asks for a prediction, whatever its protocol."""
    if path in PREDICTION_PATHS:
        return True
    return path is not None and path.startswith("/v2/models/") and path.endswith("/infer")


def shed_response(path: str | None, message: str, request_id: str,
                  retry_after: int) -> JSONResponse | None:
    """The 503 (with `Retry-After`) for a request serve.gateway.ingress sheds before the gateway
    sees it, in the shape of its door (the doors' own `error`); None for the native route."""
    if path in OPENAI_PATHS:
        body: dict = {"error": {"message": message, "type": "server_error", "param": None,
                                "code": "overloaded"}}
    elif path in ("/embed", "/predict"):
        body = {"error": message, "error_type": "Overloaded"}
    elif predicts(path) and path != "/v1/predict":
        body = {"error": message}
    else:
        return None
    return JSONResponse(body, status_code=503, headers={
        "X-Request-ID": request_id, "Retry-After": str(retry_after)})
