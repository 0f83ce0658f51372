"""The Open Inference Protocol v2 over REST (Triton, KServe, Seldon Core 2, MLServer, OpenVINO
Model Server speak it), as `tritonclient.http` calls it:

    GET  /v2                         the server: name, version, extensions
    GET  /v2/health/live, /ready     200 when live / when the baseline model answers
    GET  /v2/models/{name}           metadata: the input `text` (BYTES [-1]), the outputs
    GET  /v2/models/{name}/ready     200 when the baseline model answers
    POST /v2/models/{name}/infer     one BYTES input of texts -> `embedding` (FP32 [n, dim]), or
                                     `label` (BYTES [n]) and `scores` (FP32 [n, labels])

The requested outputs choose the task (`embedding`: embed; `label` / `scores`: classify; both
kinds in one request is a 400); none requested: the gateway's default task. Inputs and
outputs may use the binary tensor data extension (serve.gateway.protocols.tensors), which
`tritonclient.http` uses by default, or plain JSON. Errors are `{"error": "..."}`: 400 for a
malformed request, 404 for another model, the gateway's statuses otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError

from serve.common.errors import GatewayError
from serve.common.json_body import JSONBody, dumps
from serve.gateway.protocols.door import BadRequest, FrontDoor, Parsed, error_headers, first_error
from serve.gateway.protocols.tensors import (
    HEADER_LENGTH,
    bytes_elements,
    bytes_tensor,
    fp32_tensor,
    split_body,
)
from serve.gateway.schemas import check_inputs

INPUT = "text"
EMBED_OUTPUTS, CLASSIFY_OUTPUTS = ("embedding",), ("label", "scores")
SERVER = {"name": "canary-gateway", "version": "0.1.0", "extensions": ["binary_tensor_data"]}


class InferInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: StrictStr
    shape: list[StrictInt] = Field(description="its elements' count (any shape of that product)")
    datatype: StrictStr = Field(description="BYTES")
    parameters: dict[str, Any] | None = Field(None, description="`binary_data_size`: raw")
    data: list[Any] | None = None


class RequestedOutput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: StrictStr
    parameters: dict[str, Any] | None = Field(None, description="`binary_data`: raw bytes")


class InferRequest(BaseModel):
    """The JSON of `POST /v2/models/{name}/infer` (the header, with binary data)."""

    model_config = ConfigDict(extra="forbid")

    id: StrictStr | None = None
    parameters: dict[str, Any] | None = Field(None, description="`binary_data_output`")
    inputs: list[InferInput] = Field(min_length=1, max_length=1)
    outputs: list[RequestedOutput] | None = None


class OutputTensor(BaseModel):
    name: str
    datatype: str
    shape: list[int]
    parameters: dict[str, Any] | None = None
    data: list[Any] | None = None


class InferResponse(BaseModel):
    """The 200 body of `POST /v2/models/{name}/infer` (its JSON header with binary outputs)."""

    model_name: str
    model_version: str
    id: str | None = None
    outputs: list[OutputTensor]


class OipError(BaseModel):
    """The protocol's error body."""

    error: str


@dataclass(frozen=True)
class Plan:
    """What the answer holds: the request's id, and each output with whether it is raw."""

    id: str | None
    outputs: tuple[tuple[str, bool], ...]


def _elements(tensor: InferInput, blob: bytes) -> list:
    """The input's elements, from its raw bytes or its JSON `data`."""
    size = (tensor.parameters or {}).get("binary_data_size")
    if size is None:
        if blob:
            raise BadRequest(f"{len(blob)} bytes of binary data that no input declares")
        if tensor.data is None:
            raise BadRequest(f"input {INPUT!r} has neither data nor binary_data_size")
        return _flat(tensor.data)
    if not isinstance(size, int) or isinstance(size, bool) or size != len(blob):
        raise BadRequest(f"input {INPUT!r} declares binary_data_size {size!r}; "
                         f"{len(blob)} bytes follow the header")
    if tensor.data is not None:
        raise BadRequest(f"input {INPUT!r} has both data and binary_data_size")
    return bytes_elements(blob)


def _flat(data: list) -> list:
    out: list = []
    for item in data:
        out.extend(_flat(item) if isinstance(item, list) else [item])
    return out


def _texts(tensor: InferInput, blob: bytes) -> list[str]:
    """The texts of the one input: BYTES named `text`, as many elements as its shape says."""
    if tensor.name != INPUT:
        raise BadRequest(f"unknown input {tensor.name!r}: the model's input is {INPUT!r}")
    if tensor.datatype != "BYTES":
        raise BadRequest(f"input {INPUT!r} has datatype BYTES, not {tensor.datatype!r}")
    if not tensor.shape or any(d < 0 for d in tensor.shape):
        raise BadRequest(f"input {INPUT!r} has an invalid shape {tensor.shape}")
    elements = _elements(tensor, blob)
    if len(elements) != math.prod(tensor.shape):
        raise BadRequest(f"input {INPUT!r} has shape {tensor.shape} but {len(elements)} "
                         f"elements")
    try:
        return [e.decode() if isinstance(e, bytes) else _text(e) for e in elements]
    except UnicodeDecodeError:
        raise BadRequest(f"input {INPUT!r} holds bytes that are not UTF-8 text") from None


def _text(element: Any) -> str:
    if not isinstance(element, str):
        raise BadRequest(f"input {INPUT!r} holds {type(element).__name__} elements, not texts")
    return element


class OipDoor(FrontDoor):
    name = "oip"

    def parse(self, body: bytes, request: Request) -> Parsed:
        header, blob = split_body(body, request.headers.get(HEADER_LENGTH))
        try:
            asked = InferRequest.model_validate_json(header)
        except ValidationError as exc:
            raise BadRequest(first_error(exc)[0]) from None
        self.served.check(request.path_params.get("name", ""))
        texts = _texts(asked.inputs[0], blob)
        task, outputs = self._outputs(asked)
        check_inputs(texts, self.limits, name=INPUT)
        return Parsed(texts, task, options=Plan(asked.id, outputs))

    def _outputs(self, asked: InferRequest) -> tuple[str, tuple[tuple[str, bool], ...]]:
        """The task the requested outputs ask for, and each output with whether it is raw."""
        raw = (asked.parameters or {}).get("binary_data_output") is True
        if not asked.outputs:
            names = EMBED_OUTPUTS if self.served.default_task == "embed" else CLASSIFY_OUTPUTS
            return self.served.default_task, tuple((name, raw) for name in names)
        known = self._output_names()
        for output in asked.outputs:
            if output.name not in known:
                raise BadRequest(f"unknown output {output.name!r}: the model's outputs are "
                                 f"{', '.join(known)}")
        names = {output.name for output in asked.outputs}
        if names & set(EMBED_OUTPUTS) and names & set(CLASSIFY_OUTPUTS):
            raise BadRequest("ask for `embedding`, or for `label` / `scores`, not both")
        task = "embed" if names <= set(EMBED_OUTPUTS) else "classify"
        return task, tuple((o.name, (o.parameters or {}).get("binary_data", raw) is True)
                           for o in asked.outputs)

    def _output_names(self) -> tuple[str, ...]:
        embeds = EMBED_OUTPUTS if "embed" in self.served.tasks else ()
        return (*embeds, *CLASSIFY_OUTPUTS)

    def answer(self, body: dict, tokens: int, parsed: Parsed) -> Response:
        plan: Plan = parsed.options
        tensors, blobs = [], []
        for name, raw in plan.outputs:
            datatype, shape, data, encode = self._tensor(name, body["outputs"])
            tensor: dict[str, Any] = {"name": name, "datatype": datatype, "shape": shape}
            if raw:
                blobs.append(encode(data))
                tensor["parameters"] = {"binary_data_size": len(blobs[-1])}
            else:
                tensor["data"] = _flat(data)
            tensors.append(tensor)
        answer = {"model_name": self.served.name, "model_version": body["model_version"],
                  "outputs": tensors, **({"id": plan.id} if plan.id is not None else {})}
        if not blobs:
            return JSONBody(answer)
        header = dumps(answer)
        return Response(header + b"".join(blobs), media_type="application/octet-stream",
                        headers={HEADER_LENGTH: str(len(header))})

    def _tensor(self, name: str, outputs: list[dict]) -> tuple[str, list[int], list, Any]:
        """An output's datatype, shape, rows and raw encoder."""
        if name == "embedding":
            rows = [out["embedding"] for out in outputs]
            return "FP32", [len(rows), len(rows[0]) if rows else 0], rows, fp32_tensor
        if name == "label":
            return "BYTES", [len(outputs)], [out["label"] for out in outputs], bytes_tensor
        rows = [[out["scores"][label] for label in self.served.labels] for out in outputs]
        return "FP32", [len(rows), len(self.served.labels)], rows, fp32_tensor

    def error(self, exc: GatewayError, request_id: str, incoming: str | None) -> Response:
        status = 400 if exc.status == 422 else exc.status
        return JSONResponse({"error": exc.message}, status_code=status,
                            headers=error_headers(exc, request_id, incoming))

    def metadata(self, name: str) -> dict:
        """`GET /v2/models/{name}` (ModelNotFound for another name)."""
        self.served.check(name)
        outputs = []
        if "embed" in self.served.tasks:
            outputs.append({"name": "embedding", "datatype": "FP32",
                            "shape": [-1, self.served.width]})
        outputs += [{"name": "label", "datatype": "BYTES", "shape": [-1]},
                    {"name": "scores", "datatype": "FP32",
                     "shape": [-1, len(self.served.labels)]}]
        return {"name": self.served.name, "versions": [self.served.version],
                "platform": "canary-gateway", "inputs": [
                    {"name": INPUT, "datatype": "BYTES", "shape": [-1]}], "outputs": outputs,
                "parameters": {"labels": list(self.served.labels)}}
