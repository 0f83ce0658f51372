"""The Open Inference Protocol v2 over gRPC (`inference.GRPCInferenceService`, as
`tritonclient.grpc` and KServe speak it) on `grpc_port` of every gateway replica.

    ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata   as over REST
    ModelInfer   one BYTES input `text` (raw_input_contents, as tritonclient sends it, or
                 contents.bytes_contents) -> the outputs as REST answers them, raw
                 (raw_output_contents)

A `ModelInfer` call becomes an HTTP-shaped request for the gateway's one request path
(`Gateway.serve_door`): its metadata are the headers (`x-routing-key`, `idempotency-key`,
`x-request-id`, `x-request-timeout-ms`, ...), the call's own deadline caps the request's, and
the arm and why come back in the trailing metadata (`x-canary-arm`, `x-canary-reason`,
`x-request-id`). The gateway's errors become gRPC status codes (`GRPC_CODES`).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import grpc
from fastapi.responses import Response
from google.protobuf.message import DecodeError
from starlette.requests import Request

from rollout.settings import ServingSettings
from serve.common.errors import GatewayError
from serve.gateway.ingress import BODY
from serve.gateway.protocols.door import BadRequest, Parsed, error_headers
from serve.gateway.protocols.grpc_wire import CLASSES, SERVICE
from serve.gateway.protocols.oip import INPUT, SERVER, InferInput, InferRequest, OipDoor, Plan
from serve.gateway.protocols.tensors import bytes_elements
from serve.gateway.schemas import check_inputs
from serve.telemetry.metrics_targets import address

log = logging.getLogger("canary.grpc")
GRPC_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 403: grpc.StatusCode.PERMISSION_DENIED,
              404: grpc.StatusCode.NOT_FOUND, 408: grpc.StatusCode.DEADLINE_EXCEEDED,
              409: grpc.StatusCode.ABORTED, 413: grpc.StatusCode.RESOURCE_EXHAUSTED,
              422: grpc.StatusCode.INVALID_ARGUMENT, 503: grpc.StatusCode.UNAVAILABLE,
              504: grpc.StatusCode.DEADLINE_EXCEEDED}
TRAILING = ("x-canary-arm", "x-canary-reason", "x-request-id", "idempotency-status")
PATH = f"/{SERVICE}/ModelInfer"


def _texts(asked: Any) -> list[str]:
    """The one input's texts, from its raw contents or its bytes_contents."""
    if len(asked.inputs) != 1:
        raise BadRequest(f"the model has one input, {INPUT!r}; {len(asked.inputs)} were sent")
    tensor = asked.inputs[0]
    if tensor.name != INPUT or tensor.datatype != "BYTES":
        raise BadRequest(f"the model's input is {INPUT!r} (BYTES), not {tensor.name!r} "
                         f"({tensor.datatype})")
    if len(asked.raw_input_contents) > 1:
        raise BadRequest(f"{len(asked.raw_input_contents)} raw inputs for one input")
    elements = (bytes_elements(asked.raw_input_contents[0]) if asked.raw_input_contents
                else list(tensor.contents.bytes_contents))
    if not tensor.shape or any(d < 0 for d in tensor.shape) \
            or len(elements) != math.prod(tensor.shape):
        raise BadRequest(f"input {INPUT!r} has shape {list(tensor.shape)} but "
                         f"{len(elements)} elements")
    try:
        return [element.decode() for element in elements]
    except UnicodeDecodeError:
        raise BadRequest(f"input {INPUT!r} holds bytes that are not UTF-8 text") from None


class OipGrpcDoor(OipDoor):
    name = "oip-grpc"

    def parse(self, body: bytes, request: Request) -> Parsed:
        try:
            asked = CLASSES["ModelInferRequest"].FromString(body)
        except DecodeError:
            raise BadRequest("the request is not a ModelInferRequest") from None
        self.served.check(asked.model_name)
        texts = _texts(asked)
        outputs = [{"name": output.name} for output in asked.outputs] or None
        as_rest = InferRequest(inputs=[InferInput(name=INPUT, shape=[1], datatype="BYTES")],
                               outputs=outputs, parameters={"binary_data_output": True})
        task, planned = self._outputs(as_rest)
        check_inputs(texts, self.limits, name=INPUT)
        return Parsed(texts, task, options=Plan(asked.id or None,
                                                tuple((name, True) for name, _ in planned)))

    def answer(self, body: dict, tokens: int, parsed: Parsed) -> Response:
        plan: Plan = parsed.options
        reply = CLASSES["ModelInferResponse"](model_name=self.served.name,
                                              model_version=body["model_version"],
                                              id=plan.id or "")
        for name, _ in plan.outputs:
            datatype, shape, data, encode = self._tensor(name, body["outputs"])
            reply.outputs.add(name=name, datatype=datatype, shape=shape)
            reply.raw_output_contents.append(encode(data))
        return Response(reply.SerializeToString(), media_type="application/grpc+proto")

    def error(self, exc: GatewayError, request_id: str, incoming: str | None) -> Response:
        return Response(exc.message.encode(), status_code=exc.status,
                        headers=error_headers(exc, request_id, incoming))


def _request(raw: bytes, context: grpc.aio.ServicerContext, serving: ServingSettings) -> Request:
    """The call as the HTTP-shaped request the gateway serves: metadata as headers, the body,
    and the call's deadline as `X-Request-Timeout-Ms` when it is the shorter."""
    headers = {key.lower(): value for key, value in context.invocation_metadata() or ()
               if isinstance(value, str) and not key.startswith(":")}
    left = context.time_remaining()
    if left is not None:
        asked = headers.get("x-request-timeout-ms", "")
        own = int(asked) if asked.isdigit() else serving.request_timeout_s * 1000
        headers["x-request-timeout-ms"] = str(max(1, int(min(own, left * 1000))))
    return Request({"type": "http", "method": "POST", "path": PATH, "path_params": {},
                    "query_string": b"", BODY: raw,
                    "headers": [(k.encode("latin-1"), v.encode("latin-1"))
                                for k, v in headers.items()]})


class GrpcService:
    """`inference.GRPCInferenceService` for one gateway replica (`gateway`: its serve_door,
    doors and baseline_ready)."""

    def __init__(self, gateway: Any, serving: ServingSettings):
        self.gateway, self.serving = gateway, serving

    async def model_infer(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        request = _request(raw, context, self.serving)
        response = await self.gateway.serve_door(request, self.gateway.doors.oip_grpc)
        # the id is in the answer only when the gateway replaced the client's (HTTP's proxy
        # echoes a well-formed one; here nobody does)
        answered = {"x-request-id": request.headers.get("x-request-id", ""),
                    **{name: response.headers[name] for name in TRAILING
                       if name in response.headers}}
        trailing = tuple((name, value) for name, value in answered.items() if value)
        if response.status_code != 200:
            await context.abort(GRPC_CODES.get(response.status_code, grpc.StatusCode.INTERNAL),
                                response.body.decode(errors="replace"),
                                trailing_metadata=trailing)
        context.set_trailing_metadata(trailing)
        return response.body

    async def server_live(self, request, context):
        return CLASSES["ServerLiveResponse"](live=True)

    async def server_ready(self, request, context):
        return CLASSES["ServerReadyResponse"](ready=await self.gateway.baseline_ready())

    async def model_ready(self, request, context):
        await self._known(request.name, context)
        return CLASSES["ModelReadyResponse"](ready=await self.gateway.baseline_ready())

    async def server_metadata(self, request, context):
        return CLASSES["ServerMetadataResponse"](**SERVER)

    async def model_metadata(self, request, context):
        await self._known(request.name, context)
        described = self.gateway.doors.oip.metadata(request.name)
        return CLASSES["ModelMetadataResponse"](**{key: described[key] for key in (
            "name", "versions", "platform", "inputs", "outputs")})

    async def _known(self, name: str, context) -> None:
        try:
            self.gateway.doors.oip.served.check(name)
        except GatewayError as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, exc.message)


def _handlers(service: GrpcService) -> grpc.GenericRpcHandler:
    unary = grpc.unary_unary_rpc_method_handler
    methods = {
        "ModelInfer": unary(service.model_infer),  # raw bytes: the door parses them
        **{method: unary(handler, request_deserializer=CLASSES[f"{kind}Request"].FromString,
                         response_serializer=lambda reply: reply.SerializeToString())
           for method, kind, handler in (
               ("ServerLive", "ServerLive", service.server_live),
               ("ServerReady", "ServerReady", service.server_ready),
               ("ModelReady", "ModelReady", service.model_ready),
               ("ServerMetadata", "ServerMetadata", service.server_metadata),
               ("ModelMetadata", "ModelMetadata", service.model_metadata))},
    }
    return grpc.method_handlers_generic_handler(SERVICE, methods)


async def serve_grpc(gateway: Any, serving: ServingSettings) -> grpc.aio.Server | None:
    """The service on `listen_host`:`grpc_port` of this replica (replicas on one node share the
    port), or None when it is off (0) or the port cannot be had (logged; HTTP serves on)."""
    if not serving.grpc_port:
        return None
    server = grpc.aio.server(options=[("grpc.so_reuseport", 1)])
    server.add_generic_rpc_handlers((_handlers(GrpcService(gateway, serving)),))
    try:
        server.add_insecure_port(address(serving.listen_host, serving.grpc_port))
        await server.start()
    except RuntimeError as exc:
        log.warning("gRPC on port %s is off: %s", serving.grpc_port, exc)
        return None
    return server
