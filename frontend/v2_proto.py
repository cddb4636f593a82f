"""The Open Inference Protocol's gRPC messages (KServe's ``inference.GRPCInferenceService``,
which Triton and MLServer serve too), the part of them that clipstream answers.

The messages are built here from a descriptor rather than from code that ``protoc``
generates: generated code checks the protobuf runtime's version against its own, and the
protocol's own clients pin protobuf versions of their own. The field numbers are the
protocol's, which is all the wire carries (``tests/unit/test_gateway_grpc.py`` compares them
with tritonclient's).
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PACKAGE = "inference"
SERVICE = f"{PACKAGE}.GRPCInferenceService"

_F = descriptor_pb2.FieldDescriptorProto
_TYPES = {"string": _F.TYPE_STRING, "bytes": _F.TYPE_BYTES, "bool": _F.TYPE_BOOL, "int32": _F.TYPE_INT32,
          "int64": _F.TYPE_INT64, "uint32": _F.TYPE_UINT32, "uint64": _F.TYPE_UINT64, "float": _F.TYPE_FLOAT,
          "double": _F.TYPE_DOUBLE}
_PARAMETERS = ("map", "InferParameter")  # map<string, InferParameter>

# message -> (field name, number, type, repeated); a type not in _TYPES names a message; nested
# messages are written "Outer.Inner", as the protocol nests them
_MESSAGES: dict[str, list[tuple[str, int, Any, bool]]] = {
    "ServerLiveRequest": [],
    "ServerLiveResponse": [("live", 1, "bool", False)],
    "ServerReadyRequest": [],
    "ServerReadyResponse": [("ready", 1, "bool", False)],
    "ModelReadyRequest": [("name", 1, "string", False), ("version", 2, "string", False)],
    "ModelReadyResponse": [("ready", 1, "bool", False)],
    "ServerMetadataRequest": [],
    "ServerMetadataResponse": [("name", 1, "string", False), ("version", 2, "string", False),
                               ("extensions", 3, "string", True)],
    "ModelMetadataRequest": [("name", 1, "string", False), ("version", 2, "string", False)],
    "ModelMetadataResponse": [("name", 1, "string", False), ("versions", 2, "string", True),
                              ("platform", 3, "string", False),
                              ("inputs", 4, "ModelMetadataResponse.TensorMetadata", True),
                              ("outputs", 5, "ModelMetadataResponse.TensorMetadata", True)],
    "ModelMetadataResponse.TensorMetadata": [("name", 1, "string", False), ("datatype", 2, "string", False),
                                             ("shape", 3, "int64", True)],
    "InferParameter": [("bool_param", 1, "bool", False), ("int64_param", 2, "int64", False),
                       ("string_param", 3, "string", False), ("double_param", 4, "double", False),
                       ("uint64_param", 5, "uint64", False)],
    "InferTensorContents": [("bool_contents", 1, "bool", True), ("int_contents", 2, "int32", True),
                            ("int64_contents", 3, "int64", True), ("uint_contents", 4, "uint32", True),
                            ("uint64_contents", 5, "uint64", True), ("fp32_contents", 6, "float", True),
                            ("fp64_contents", 7, "double", True), ("bytes_contents", 8, "bytes", True)],
    "ModelInferRequest": [("model_name", 1, "string", False), ("model_version", 2, "string", False),
                          ("id", 3, "string", False), ("parameters", 4, _PARAMETERS, True),
                          ("inputs", 5, "ModelInferRequest.InferInputTensor", True),
                          ("outputs", 6, "ModelInferRequest.InferRequestedOutputTensor", True),
                          ("raw_input_contents", 7, "bytes", True)],
    "ModelInferRequest.InferInputTensor": [("name", 1, "string", False), ("datatype", 2, "string", False),
                                           ("shape", 3, "int64", True), ("parameters", 4, _PARAMETERS, True),
                                           ("contents", 5, "InferTensorContents", False)],
    "ModelInferRequest.InferRequestedOutputTensor": [("name", 1, "string", False),
                                                     ("parameters", 2, _PARAMETERS, True)],
    "ModelInferResponse": [("model_name", 1, "string", False), ("model_version", 2, "string", False),
                           ("id", 3, "string", False), ("parameters", 4, _PARAMETERS, True),
                           ("outputs", 5, "ModelInferResponse.InferOutputTensor", True),
                           ("raw_output_contents", 6, "bytes", True)],
    "ModelInferResponse.InferOutputTensor": [("name", 1, "string", False), ("datatype", 2, "string", False),
                                             ("shape", 3, "int64", True), ("parameters", 4, _PARAMETERS, True),
                                             ("contents", 5, "InferTensorContents", False)],
    "ModelStreamInferResponse": [("error_message", 1, "string", False),
                                 ("infer_response", 2, "ModelInferResponse", False)],
}
# the service's methods this gateway answers: name -> (request, response); others are UNIMPLEMENTED
METHODS: dict[str, tuple[str, str]] = {
    name: (f"{name}Request", f"{name}Response")
    for name in ("ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer")
}
# the streaming method: a stream of ModelInferRequests, each answered on the response stream
STREAM: dict[str, tuple[str, str]] = {"ModelStreamInfer": ("ModelInferRequest", "ModelStreamInferResponse")}


def _field(owner: descriptor_pb2.DescriptorProto, full: str, name: str, number: int, kind: Any,
           repeated: bool) -> None:
    f = owner.field.add(name=name, number=number, label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL)
    if kind == _PARAMETERS:  # a map is a repeated nested entry message, as protoc writes it
        entry = owner.nested_type.add(name=f"{''.join(p.title() for p in name.split('_'))}Entry")
        entry.options.map_entry = True
        _field(entry, f"{full}.{entry.name}", "key", 1, "string", False)
        _field(entry, f"{full}.{entry.name}", "value", 2, "InferParameter", False)
        f.type, f.type_name = _F.TYPE_MESSAGE, f".{PACKAGE}.{full}.{entry.name}"
    elif kind in _TYPES:
        f.type = _TYPES[kind]
    else:
        f.type, f.type_name = _F.TYPE_MESSAGE, f".{PACKAGE}.{kind}"


def _file() -> descriptor_pb2.FileDescriptorProto:
    file = descriptor_pb2.FileDescriptorProto(name="clipstream_grpc_predict_v2.proto", package=PACKAGE,
                                              syntax="proto3")
    made: dict[str, descriptor_pb2.DescriptorProto] = {}
    for full, fields in _MESSAGES.items():
        outer, _, inner = full.partition(".")
        msg = made[outer].nested_type.add(name=inner) if inner else file.message_type.add(name=outer)
        made[full] = msg
        for name, number, kind, repeated in fields:
            _field(msg, full, name, number, kind, repeated)
        if full == "InferParameter":  # its values are one of its fields
            msg.oneof_decl.add(name="parameter_choice")
            for f in msg.field:
                f.oneof_index = 0
    service = file.service.add(name=SERVICE.rpartition(".")[2])
    for name, (req, resp) in METHODS.items():
        service.method.add(name=name, input_type=f".{PACKAGE}.{req}", output_type=f".{PACKAGE}.{resp}")
    for name, (req, resp) in STREAM.items():
        service.method.add(name=name, input_type=f".{PACKAGE}.{req}", output_type=f".{PACKAGE}.{resp}",
                           client_streaming=True, server_streaming=True)
    return file


def _classes() -> dict[str, Any]:
    pool = descriptor_pool.DescriptorPool()  # its own pool: a client's messages of the same names may be loaded
    pool.Add(_file())
    return {full: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{full}"))
            for full in _MESSAGES}


MESSAGES: dict[str, Any] = _classes()
