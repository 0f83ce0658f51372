"""The gateway's front doors: the protocols clients already speak, each parsed into the
gateway's one request and answered in its own shape (serve.protocols.door).

- `door.py`: what a door is, the native one, and the served model as the doors describe it;
- `openai_api.py`: OpenAI's `GET /v1/models`, `POST /v1/embeddings`;
- `oip.py`: the Open Inference Protocol v2 over REST (`/v2/...`), with `tensors.py`, its
  binary tensor data extension;
- `tei.py`: Text Embeddings Inference's `POST /embed`, `POST /predict`, `GET /info`;
- `endpoints.py`: their routes, mixed into the gateway deployment.

`predicts(path)` says which paths are predictions, for serve.ingress (which takes their
in-flight slot and sheds them at the door); it imports nothing.
"""

PREDICTION_PATHS = frozenset({"/v1/predict", "/v1/embeddings", "/embed", "/predict"})


def predicts(path: str | None) -> bool:
    """Whether a request for `path` asks for a prediction, whatever its protocol."""
    if path in PREDICTION_PATHS:
        return True
    return path is not None and path.startswith("/v2/models/") and path.endswith("/infer")
