"""The front doors end to end (serve.gateway.protocols), on the shared real app (real Ray Serve,
real Redis, real HTTP), with the clients teams already have: the `openai` SDK, `tritonclient.http`
and `huggingface_hub`'s InferenceClient. Each gets the answer `POST /v1/predict` gives for the
same routing key; the share, the kill switch and header routes reach every door; bad input is
each protocol's own 4xx."""

from __future__ import annotations

import json
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

import numpy as np
import pytest

from rollout import decide

NAME = "tiny-encoder"  # the served model's name: the test model folder's (tests.serve_app)
TEXTS = ["The new GPU doubles inference speed", "a quiet afternoon by the lake"]
HTTP_PROTOCOLS = ("openai", "oip", "tei")
PROTOCOLS = (*HTTP_PROTOCOLS, "grpc")


def _native(gw, texts, task, key):
    response = gw.client.post("/v1/predict", json={"inputs": texts, "task": task},
                              headers={"X-Routing-Key": key})
    assert response.status_code == 200, response.text
    return response.json()["outputs"]


def _cosine(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _same_vectors(got, native_outputs):
    expected = [out["embedding"] for out in native_outputs]
    assert len(got) == len(expected)
    for vector, reference in zip(got, expected, strict=True):
        assert len(vector) == len(reference)
        assert _cosine(vector, reference) >= 0.9999


def test_openai_sdk_default_base64_and_float_match_native(gw):
    import openai

    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0)
    assert [model.id for model in client.models.list()] == [NAME]
    native = _native(gw, TEXTS, "embed", "oa-1")
    raw = client.embeddings.with_raw_response.create(input=TEXTS, model=NAME, user="oa-1")
    assert isinstance(raw.http_response.json()["data"][0]["embedding"], str)  # base64 asked
    default = raw.parse()
    _same_vectors([item.embedding for item in default.data], native)
    assert default.model == NAME and default.usage.prompt_tokens > 0
    floats = client.embeddings.create(input=TEXTS, model=NAME, encoding_format="float",
                                      extra_headers={"X-Routing-Key": "oa-1"})
    _same_vectors([item.embedding for item in floats.data], native)
    single = client.embeddings.create(input=TEXTS[0], model=NAME, dimensions=32, user="oa-1")
    _same_vectors([single.data[0].embedding], native[:1])
    with pytest.raises(openai.NotFoundError) as missing:
        client.embeddings.create(input="x", model="text-embedding-3-small")
    assert missing.value.code == "model_not_found"


def _triton(gw):
    import tritonclient.http as httpclient

    return httpclient, httpclient.InferenceServerClient(url=urlparse(gw.url).netloc)


def _text_input(httpclient, texts, binary):
    tensor = httpclient.InferInput("text", [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array(texts, dtype=object), binary_data=binary)
    return tensor


def test_tritonclient_http_binary_and_json_match_native(gw):
    httpclient, client = _triton(gw)
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(NAME)
    metadata = client.get_model_metadata(NAME)
    assert metadata["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    assert {"name": "embedding", "datatype": "FP32", "shape": [-1, 32]} in metadata["outputs"]
    native = _native(gw, TEXTS, "embed", "tr-1")
    for binary in (True, False):
        result = client.infer(NAME, [_text_input(httpclient, TEXTS, binary)], outputs=[
            httpclient.InferRequestedOutput("embedding", binary_data=binary)],
            headers={"X-Routing-Key": "tr-1"})
        vectors = result.as_numpy("embedding")
        assert vectors.dtype == np.float32 and vectors.shape == (2, 32)
        _same_vectors(vectors.tolist(), native)
    labels = _native(gw, TEXTS, "classify", "tr-1")
    result = client.infer(NAME, [_text_input(httpclient, TEXTS, True)],
                          headers={"X-Routing-Key": "tr-1"})  # no outputs: all of them, raw
    assert [label.decode() for label in result.as_numpy("label")] == [
        out["label"] for out in labels]
    scores = result.as_numpy("scores")
    assert scores.shape == (2, len(gw.settings.labels))
    assert np.allclose(scores, [[out["scores"][x] for x in gw.settings.labels] for out in labels],
                       atol=1e-5)


def test_huggingface_inference_client_on_tei_routes_matches_native(gw):
    from huggingface_hub import InferenceClient

    headers = {"X-Routing-Key": "hf-1"}
    native = _native(gw, TEXTS, "embed", "hf-1")
    vectors = InferenceClient(model=f"{gw.url}/embed", headers=headers).feature_extraction(
        TEXTS[0])
    _same_vectors(np.asarray(vectors).reshape(1, -1).tolist(), native[:1])
    labels = _native(gw, TEXTS[:1], "classify", "hf-1")
    top = InferenceClient(model=f"{gw.url}/predict", headers=headers).text_classification(
        TEXTS[0])
    best = top[0] if isinstance(top, list) else top  # the client keeps the best label
    assert best.label == labels[0]["label"]
    info = gw.client.get("/info").json()
    assert info["model_id"] == NAME and info["max_client_batch_size"] == gw.settings.max_items


def _send(gw, protocol: str, texts, headers=None):
    """One embedding request through `protocol`'s door, as raw HTTP."""
    if protocol == "openai":
        return gw.client.post("/v1/embeddings", json={"input": texts, "model": NAME},
                              headers=headers)
    if protocol == "oip":
        body = {"inputs": [{"name": "text", "shape": [len(texts)], "datatype": "BYTES",
                            "data": texts}], "outputs": [{"name": "embedding"}]}
        return gw.client.post(f"/v2/models/{NAME}/infer", json=body, headers=headers)
    if protocol == "tei":
        return gw.client.post("/embed", json={"inputs": texts}, headers=headers)
    return gw.client.post("/v1/predict", json={"inputs": texts, "task": "embed"},
                          headers=headers)


def _stub(gw):
    import grpc
    from tritonclient.grpc import service_pb2_grpc

    channel = grpc.insecure_channel(f"127.0.0.1:{gw.settings.grpc_port}")
    return channel, service_pb2_grpc.GRPCInferenceServiceStub(channel)


def _infer_request(texts, *, model=NAME, outputs=("embedding",), raw=True, **tensor):
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=model, id="g-1")
    request.inputs.add(**{"name": "text", "datatype": "BYTES", "shape": [len(texts)],
                          **tensor})
    for output in outputs:
        request.outputs.add(name=output)
    encoded = [t.encode() if isinstance(t, str) else t for t in texts]
    if raw:
        request.raw_input_contents.append(b"".join(struct.pack("<I", len(t)) + t
                                                   for t in encoded))
    else:
        request.inputs[0].contents.bytes_contents.extend(encoded)
    return request


def _grpc_arm(gw, key: str, extra=None) -> str:
    """The arm a ModelInfer call was answered by, from its trailing metadata."""
    channel, stub = _stub(gw)
    with channel:
        metadata = (("x-routing-key", key), *((k.lower(), v) for k, v in (extra or {}).items()))
        _, call = stub.ModelInfer.with_call(_infer_request(["route me"]), metadata=metadata,
                                            timeout=10)
    return dict(call.trailing_metadata())["x-canary-arm"]


def _arm(gw, protocol: str, key: str, extra=None) -> str:
    if protocol == "grpc":
        return _grpc_arm(gw, key, extra)
    for _ in range(20):  # shed under load (503 + Retry-After): retried, as a client would
        response = _send(gw, protocol, ["route me"], {"X-Routing-Key": key, **(extra or {})})
        if response.status_code != 503 or "retry-after" not in response.headers:
            break
        time.sleep(0.05)
    assert response.status_code == 200, response.text
    return response.headers["x-canary-arm"]


def test_share_kill_and_header_routes_reach_every_protocol(gw):
    state = gw.set_state(canary_bp=3_000)
    keys = [f"proto-{i}" for i in range(400)]
    expected = {key: decide(state, key, salt=gw.settings.routing_salt).arm.value for key in keys}
    with ThreadPoolExecutor(16) as pool:
        for protocol in PROTOCOLS:
            arms = list(pool.map(lambda key, p=protocol: _arm(gw, p, key), keys))
            share = arms.count("optimized") / len(keys)
            assert 0.27 <= share <= 0.33, (protocol, share)
            assert arms == [expected[key] for key in keys], protocol
    canary = [key for key in keys if expected[key] == "optimized"][:10]
    control = gw.rollout()
    try:
        _, routed = control.add_route("X-User-Group", ["qa"], "optimized", actor="test",
                                      reason="protocol routes")
        gw.wait_for_revision(routed.revision)
        for protocol in PROTOCOLS:
            assert _arm(gw, protocol, "proto-route", {"X-User-Group": "qa"}) == "optimized"
        started = time.monotonic()
        killed = control.kill(actor="test", reason="protocols")[1]
        gw.wait_for_revision(killed.revision, timeout=1.0)  # one cached state serves every door
        assert time.monotonic() - started < 1.0
        for protocol in PROTOCOLS:  # and every door answers the canary's keys from baseline
            assert {_arm(gw, protocol, key) for key in canary} == {"baseline"}, protocol
    finally:
        state = control.state()
        for route in state.routes:
            control.remove_route(route.id, actor="test", reason="test cleanup")
        control.store.close()
        gw.set_state(canary_bp=0, kill=False)


def test_common_headers_and_idempotency_on_every_protocol(gw):
    for protocol in HTTP_PROTOCOLS:
        headers = {"X-Request-ID": f"req-{protocol}", "X-Routing-Key": "hdr",
                   "Idempotency-Key": f"idem-{protocol}", "X-Request-Timeout-Ms": "4000"}
        first = _send(gw, protocol, TEXTS, headers)
        assert first.status_code == 200, first.text
        assert first.headers["x-request-id"] == f"req-{protocol}"
        assert first.headers["x-canary-arm"] == "baseline"
        assert first.headers["x-canary-reason"] == "share"
        assert "model;dur=" in first.headers["server-timing"]
        again = _send(gw, protocol, TEXTS, headers)
        assert again.headers["idempotency-status"] == "replayed"
        assert again.json() == first.json(), protocol  # replayed in the protocol's own shape
    metrics = gw.client.get("/metrics").text  # the request metrics name the front door
    for protocol in HTTP_PROTOCOLS:
        assert f'protocol="{protocol}"' in metrics, protocol


OVERSIZE = "x" * 20_000  # over the test app's body limit (max_total_chars 800)
OPENAI_BAD = [
    (b"{", None), (b"[]", None), ({"model": NAME}, "input"), ({"input": 5, "model": NAME}, "input"),
    ({"input": "", "model": NAME}, "input"), ({"input": [], "model": NAME}, "input"),
    ({"input": [1, 2, 3], "model": NAME}, "input"), ({"input": [[1, 2]], "model": NAME}, "input"),
    ({"input": "x", "model": NAME, "encoding_format": "int8"}, "encoding_format"),
    ({"input": "x", "model": NAME, "dimensions": 7}, "dimensions"),
    ({"input": "x", "model": NAME, "dimensions": "32"}, "dimensions"),
    ({"input": "x", "model": NAME, "temperature": 1}, "temperature"),
    ({"input": ["x"] * 9, "model": NAME}, "input"),
    ({"input": "x", "model": NAME, "user": 5}, "user"),
    ({"input": "x", "model": 3}, "model"), ({"input": OVERSIZE, "model": NAME}, None),
    ({"input": "x" * 300, "model": NAME}, "input"),
]


def _post(gw, path, body, headers=None):
    if isinstance(body, bytes):
        return gw.client.post(path, content=body, headers={
            "Content-Type": "application/json", **(headers or {})})
    return gw.client.post(path, json=body, headers=headers)


@pytest.mark.parametrize(("body", "param"), OPENAI_BAD)
def test_malformed_openai_requests_get_openai_errors(gw, body, param):
    response = _post(gw, "/v1/embeddings", body)
    assert response.status_code in (400, 413), response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] == param, error


def test_openai_unknown_model_and_bad_timeout_header(gw):
    missing = _post(gw, "/v1/embeddings", {"input": "x", "model": "other"})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    bad = _post(gw, "/v1/embeddings", {"input": "x", "model": NAME},
                {"X-Request-Timeout-Ms": "soon"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_timeout"


def _binary(texts, *, declared=None, extra=b""):
    raw = b"".join(struct.pack("<I", len(t)) + t for t in texts) + extra
    header = json.dumps({"inputs": [{"name": "text", "shape": [len(texts)], "datatype": "BYTES",
                                     "parameters": {"binary_data_size": declared or len(raw)}}]})
    return header.encode(), raw


def _oip_json(**tensor):
    return {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["x"],
                        **tensor}]}


OIP_BAD = [
    b"{", {"inputs": []}, {"outputs": []}, _oip_json(name="input-0"), _oip_json(datatype="FP32"),
    _oip_json(shape=[3]), _oip_json(data=[1]), _oip_json(data=[""]), _oip_json(shape=["1"]),
    {**_oip_json(), "outputs": [{"name": "logits"}]},
    {**_oip_json(), "outputs": [{"name": "embedding"}, {"name": "label"}]},
    {"inputs": _oip_json()["inputs"] * 2}, _oip_json(data=None),
    _oip_json(data=["x"] * 9, shape=[9]),
]
OIP_BAD_BINARY = [  # (header, binary data, Inference-Header-Content-Length or None: the right one)
    (*_binary([b"ok"]), "abc"), (*_binary([b"ok"]), "99999"), (*_binary([b"ok"]), "0"),
    (*_binary([b"ok"], declared=3), None), (*_binary([b"ok"], extra=b"\x01"), None),
    (*_binary([b"\xff\xfe"]), None),
    (json.dumps(_oip_json()).encode(), b"stray", None),
]


@pytest.mark.parametrize("body", OIP_BAD)
def test_malformed_oip_json_requests_get_oip_errors(gw, body):
    response = _post(gw, f"/v2/models/{NAME}/infer", body)
    assert response.status_code in (400, 413), response.text
    assert set(response.json()) == {"error"} and response.json()["error"]


@pytest.mark.parametrize(("header", "data", "length"), OIP_BAD_BINARY)
def test_bad_binary_oip_requests_get_oip_errors(gw, header, data, length):
    response = gw.client.post(f"/v2/models/{NAME}/infer", content=header + data, headers={
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": length or str(len(header))})
    assert response.status_code == 400, response.text
    assert set(response.json()) == {"error"} and response.json()["error"]


def test_oip_unknown_model_is_a_404_everywhere(gw):
    for response in (gw.client.get("/v2/models/other"), gw.client.get("/v2/models/other/ready"),
                     _post(gw, "/v2/models/other/infer", _oip_json())):
        assert response.status_code == 404 and set(response.json()) == {"error"}
    oversize = _post(gw, f"/v2/models/{NAME}/infer", _oip_json(data=[OVERSIZE]))
    assert oversize.status_code == 413 and set(oversize.json()) == {"error"}


TEI_BAD = [
    ("/embed", b"{"), ("/embed", {}), ("/embed", {"inputs": 5}), ("/embed", {"inputs": []}),
    ("/embed", {"inputs": ""}), ("/embed", {"inputs": "x", "normalize": False}),
    ("/embed", {"inputs": "x", "prompt_name": "query"}),
    ("/embed", {"inputs": "x", "dimensions": 7}),
    ("/embed", {"inputs": "x", "colour": "red"}), ("/embed", {"inputs": ["x"] * 9}),
    ("/predict", {"inputs": [["a", "b"]]}), ("/predict", {"inputs": "x", "raw_scores": "yes"}),
    ("/predict", {"inputs": "x", "parameters": {"top_k": "all"}}), ("/predict", {"inputs": None}),
    ("/embed", {"inputs": OVERSIZE}), ("/predict", {"inputs": "x" * 300}),
]


@pytest.mark.parametrize(("path", "body"), TEI_BAD)
def test_malformed_tei_requests_get_tei_errors(gw, path, body):
    response = _post(gw, path, body)
    assert response.status_code in (413, 422), response.text
    error = response.json()
    assert set(error) == {"error", "error_type"} and error["error_type"] == "Validation"


def test_tritonclient_grpc_matches_native_and_trails_the_arm(gw):
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{gw.settings.grpc_port}")
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(NAME)
    metadata = client.get_model_metadata(NAME)
    assert metadata.inputs[0].name == "text" and metadata.inputs[0].datatype == "BYTES"
    assert "embedding" in [output.name for output in metadata.outputs]
    text = grpcclient.InferInput("text", [len(TEXTS)], "BYTES")
    text.set_data_from_numpy(np.array(TEXTS, dtype=object))
    result = client.infer(NAME, [text], outputs=[grpcclient.InferRequestedOutput("embedding")],
                          headers={"x-routing-key": "gr-1"}, client_timeout=10)
    _same_vectors(result.as_numpy("embedding").tolist(), _native(gw, TEXTS, "embed", "gr-1"))
    labels = client.infer(NAME, [text], headers={"x-routing-key": "gr-1"}, client_timeout=10)
    assert [x.decode() for x in labels.as_numpy("label")] == [
        out["label"] for out in _native(gw, TEXTS, "classify", "gr-1")]
    channel, stub = _stub(gw)
    with channel:  # bytes_contents instead of raw; the arm and why in the trailing metadata
        reply, call = stub.ModelInfer.with_call(_infer_request(TEXTS, raw=False), metadata=(
            ("x-routing-key", "gr-1"), ("x-request-id", "grpc-req-1")), timeout=10)
    trailing = dict(call.trailing_metadata())
    assert trailing["x-canary-arm"] == "baseline" and trailing["x-canary-reason"] == "share"
    assert trailing["x-request-id"] == "grpc-req-1" and reply.id == "g-1"
    with pytest.raises(Exception, match="not found|NOT_FOUND"):
        client.is_model_ready("other")


GRPC_BAD = [
    _infer_request(["x"], model="other"), _infer_request(["x"], outputs=("logits",)),
    _infer_request(["x"], outputs=("embedding", "label")), _infer_request([""]),
    _infer_request(["x"] * 9), _infer_request(["x" * 300]), _infer_request([b"\xff\xfe"]),
    _infer_request(["x"], shape=[3]),
    _infer_request(["x"], datatype="FP32"), _infer_request(["x"], **{"name": "input-0"}),
]


def _grpc_bad_extra():
    from tritonclient.grpc import service_pb2

    empty = service_pb2.ModelInferRequest(model_name=NAME)
    two = _infer_request(["x"])
    two.inputs.add(name="text", datatype="BYTES", shape=[1])
    truncated = _infer_request(["x"])
    truncated.raw_input_contents[0] = truncated.raw_input_contents[0][:-1]
    doubled = _infer_request(["x"])
    doubled.raw_input_contents.append(b"")
    return [empty, two, truncated, doubled]


@pytest.mark.parametrize("index", range(len(GRPC_BAD) + 4))
def test_malformed_grpc_calls_get_grpc_errors(gw, index):
    import grpc

    request = (GRPC_BAD + _grpc_bad_extra())[index]
    channel, stub = _stub(gw)
    with channel, pytest.raises(grpc.RpcError) as refused:
        stub.ModelInfer(request, timeout=10)
    assert refused.value.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                                    grpc.StatusCode.RESOURCE_EXHAUSTED), refused.value
    assert refused.value.details()


def test_a_grpc_call_that_is_not_protobuf_is_invalid(gw):
    import grpc

    channel = grpc.insecure_channel(f"127.0.0.1:{gw.settings.grpc_port}")
    with channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as refused:
            infer(b"\xff\x00not protobuf", timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
