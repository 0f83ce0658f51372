"""The messages of the Open Inference Protocol's gRPC service (`inference.GRPCInferenceService`,
as Triton's and KServe's protos number them), built at import from a descriptor in a pool of
their own: no generated code, no client library, and no clash with a client's own copy of the
same protos in a process that has both.

Only what the gateway serves is described: health, metadata and `ModelInfer`. Request fields
it does not read (`parameters` maps) are kept by protobuf as unknown fields and ignored.
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PACKAGE = "inference"
SERVICE = f"{PACKAGE}.GRPCInferenceService"
_F = descriptor_pb2.FieldDescriptorProto
_TYPES = {"string": _F.TYPE_STRING, "bool": _F.TYPE_BOOL, "int64": _F.TYPE_INT64,
          "bytes": _F.TYPE_BYTES, "float": _F.TYPE_FLOAT}

# message -> [(field, number, type or message name, repeated)], nested messages as "A.B"
MESSAGES: dict[str, list[tuple[str, int, str, bool]]] = {
    "ServerLiveRequest": [], "ServerLiveResponse": [("live", 1, "bool", False)],
    "ServerReadyRequest": [], "ServerReadyResponse": [("ready", 1, "bool", False)],
    "ModelReadyRequest": [("name", 1, "string", False), ("version", 2, "string", False)],
    "ModelReadyResponse": [("ready", 1, "bool", False)],
    "ServerMetadataRequest": [],
    "ServerMetadataResponse": [("name", 1, "string", False), ("version", 2, "string", False),
                               ("extensions", 3, "string", True)],
    "ModelMetadataRequest": [("name", 1, "string", False), ("version", 2, "string", False)],
    "TensorMetadata": [("name", 1, "string", False), ("datatype", 2, "string", False),
                       ("shape", 3, "int64", True)],
    "ModelMetadataResponse": [("name", 1, "string", False), ("versions", 2, "string", True),
                              ("platform", 3, "string", False),
                              ("inputs", 4, "TensorMetadata", True),
                              ("outputs", 5, "TensorMetadata", True)],
    "InferTensorContents": [("fp32_contents", 6, "float", True),
                            ("bytes_contents", 8, "bytes", True)],
    "InferInputTensor": [("name", 1, "string", False), ("datatype", 2, "string", False),
                         ("shape", 3, "int64", True), ("contents", 5, "InferTensorContents",
                                                       False)],
    "InferRequestedOutputTensor": [("name", 1, "string", False)],
    "ModelInferRequest": [("model_name", 1, "string", False), ("model_version", 2, "string", False),
                          ("id", 3, "string", False), ("inputs", 5, "InferInputTensor", True),
                          ("outputs", 6, "InferRequestedOutputTensor", True),
                          ("raw_input_contents", 7, "bytes", True)],
    "InferOutputTensor": [("name", 1, "string", False), ("datatype", 2, "string", False),
                          ("shape", 3, "int64", True),
                          ("contents", 5, "InferTensorContents", False)],
    "ModelInferResponse": [("model_name", 1, "string", False),
                           ("model_version", 2, "string", False), ("id", 3, "string", False),
                           ("outputs", 5, "InferOutputTensor", True),
                           ("raw_output_contents", 6, "bytes", True)],
}
# where the protos nest a message inside another (the wire does not care; names do)
_NESTED = {"TensorMetadata": "ModelMetadataResponse", "InferInputTensor": "ModelInferRequest",
           "InferRequestedOutputTensor": "ModelInferRequest",
           "InferOutputTensor": "ModelInferResponse"}


def _full(name: str) -> str:
    outer = _NESTED.get(name)
    return f".{PACKAGE}.{outer}.{name}" if outer else f".{PACKAGE}.{name}"


def _message(name: str) -> descriptor_pb2.DescriptorProto:
    message = descriptor_pb2.DescriptorProto(name=name)
    for field, number, kind, repeated in MESSAGES[name]:
        proto = message.field.add(name=field, number=number,
                                  label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL)
        if kind in _TYPES:
            proto.type = _TYPES[kind]
        else:
            proto.type, proto.type_name = _F.TYPE_MESSAGE, _full(kind)
    message.nested_type.extend(_message(inner) for inner, outer in _NESTED.items()
                               if outer == name)
    return message


def _classes() -> dict[str, type]:
    file = descriptor_pb2.FileDescriptorProto(name="canary_inference.proto", package=PACKAGE,
                                              syntax="proto3")
    file.message_type.extend(_message(name) for name in MESSAGES if name not in _NESTED)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(
        _full(name)[1:])) for name in MESSAGES}


CLASSES = _classes()
