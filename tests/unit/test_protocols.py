"""The front doors' pieces without Ray: a request shed at the door answered in its protocol's
shape (serve.gateway.ingress with serve.gateway.protocols.shed_response), the binary tensor codec
(serve.gateway.protocols.tensors) and the served model's name (serve.gateway.protocols.door)."""

from __future__ import annotations

import asyncio
import json
import struct
from pathlib import Path

import numpy as np
import pytest

from rollout.settings import ModelSettings
from serve.gateway.protocols import predicts
from serve.gateway.protocols.door import BadRequest, served_name
from serve.gateway.protocols.tensors import bytes_elements, bytes_tensor, fp32_tensor, split_body
from tests.unit.test_ingress import Saturated, Sent, client, scope, settings


@pytest.mark.parametrize(("path", "shape"), [
    ("/v1/embeddings", lambda body: body["error"]["code"] == "overloaded"
     and set(body["error"]) == {"message", "type", "param", "code"}),
    ("/v2/models/m/infer", lambda body: set(body) == {"error"}),
    ("/embed", lambda body: body["error_type"] == "Overloaded"),
    ("/predict", lambda body: body["error_type"] == "Overloaded"),
    ("/v1/predict", lambda body: body["error"]["type"] == "overloaded"),
])
def test_a_request_shed_at_the_door_is_answered_in_its_protocols_shape(monkeypatch, path,
                                                                       shape):
    from serve.gateway import ingress

    monkeypatch.setattr(ingress, "_gateway", ingress._Gateway())
    shed: list[float] = []
    ingress.configure(settings(), settings(), Saturated(True, retry_after=2), shed.append)
    sent = Sent()
    request = {**scope(headers=[(b"content-length", b"2")]), "path": path}
    asyncio.run(ingress.BodyGate(lambda *a: None)(request, client(b"{}"), sent))
    assert sent[0]["status"] == 503 and sent.headers()["retry-after"] == "2"
    assert shape(json.loads(sent[1]["body"])) and len(shed) == 1


def test_prediction_paths_of_every_door():
    assert all(map(predicts, ["/v1/predict", "/v1/embeddings", "/embed", "/predict",
                              "/v2/models/any/infer"]))
    assert not any(map(predicts, ["/v1/models", "/v2/models/any", "/info", "/v1/rollout", None]))


def test_binary_tensors_round_trip_and_bad_lengths_are_bad_requests():
    raw = bytes_tensor(["a text", "ünïcode", ""])
    assert [e.decode() for e in bytes_elements(raw)] == ["a text", "ünïcode", ""]
    assert np.frombuffer(fp32_tensor([[1.5, -2.0]]), dtype="<f4").tolist() == [1.5, -2.0]
    assert split_body(b'{"a":1}xyz', "7") == (b'{"a":1}', b"xyz")
    assert split_body(b"{}", None) == (b"{}", b"")
    for blob in (raw[:-1], raw + b"\x00", struct.pack("<I", 9) + b"short"):
        with pytest.raises(BadRequest):
            bytes_elements(blob)
    for length in ("-1", "0", "8", "x", "1e3"):
        with pytest.raises(BadRequest):
            split_body(b"{}", length)


def test_the_served_name_defaults_to_the_baseline_folders(tmp_path: Path):
    assert served_name(ModelSettings(_env_file=None), Path("/x/model")) == "all-MiniLM-L6-v2"
    folder = tmp_path / "my-encoder"
    assert served_name(ModelSettings(model_path=str(folder)), folder) == "my-encoder"
    named = ModelSettings(model_path=str(folder), served_model_name="prod-embed")
    assert served_name(named, folder) == "prod-embed"


def test_a_gateway_without_the_model_folder_serves_with_an_unknown_width(tmp_path: Path):
    from serve.gateway.protocols.door import served_model

    info = {"labels": ["a", "b"], "version": "fp32-x"}
    settings = ModelSettings(model_path=str(tmp_path / "elsewhere"))
    served = served_model(settings, tmp_path / "elsewhere", info, {"embed", "classify"})
    assert served.name == "elsewhere" and served.width == -1
    served.check_width(None)
    with pytest.raises(BadRequest) as refused:
        served.check_width(384, status=422)
    assert refused.value.status == 422 and refused.value.param == "dimensions"
    (tmp_path / "here").mkdir()
    (tmp_path / "here" / "config.json").write_text('{"hidden_size": 32}')
    known = served_model(ModelSettings(model_path=str(tmp_path / "here")), tmp_path / "here",
                         info, {"classify"})
    known.check_width(32)
    with pytest.raises(BadRequest, match="have 32, not 7"):
        known.check_width(7)


def test_the_grpc_messages_are_numbered_as_the_clients_protos():
    from tritonclient.grpc import service_pb2

    from serve.gateway.protocols.grpc_wire import CLASSES

    for name, ours in CLASSES.items():
        outer = getattr(service_pb2, name, None)
        theirs = outer.DESCRIPTOR if outer is not None else next(
            m.DESCRIPTOR.nested_types_by_name[name] for m in (
                service_pb2.ModelMetadataResponse, service_pb2.ModelInferRequest,
                service_pb2.ModelInferResponse) if name in m.DESCRIPTOR.nested_types_by_name)
        for field in ours.DESCRIPTOR.fields:
            match = theirs.fields_by_name[field.name]
            assert (match.number, match.type) == (field.number, field.type), (name, field.name)
    request = service_pb2.ModelInferRequest(model_name="m", id="r")
    request.inputs.add(name="text", datatype="BYTES", shape=[1])
    request.raw_input_contents.append(b"\x01\x00\x00\x00a")
    read = CLASSES["ModelInferRequest"].FromString(request.SerializeToString())
    assert (read.model_name, read.inputs[0].shape[0], read.raw_input_contents[0]) == (
        "m", 1, b"\x01\x00\x00\x00a")
