"""Read and replace the float initializers of an ONNX model on a device that has neither `onnx` nor torch.

An ONNX file is a protobuf `ModelProto`; its parameters are `TensorProto`s in `graph.initializer`.
The protobuf wire format is simple enough to walk by hand: this module decodes the fields it needs
(model.graph = 7, graph.initializer = 5; tensor dims = 1, data_type = 2, float_data = 4, name = 8,
raw_data = 9) and copies every other byte through unchanged, so writing parameters back changes
nothing but those tensors. Only numpy is needed.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from fedzoo.errors import InvalidInputError

_MODEL_GRAPH = 7
_GRAPH_INITIALIZER = 5
_TENSOR_DIMS, _TENSOR_DATA_TYPE, _TENSOR_FLOAT_DATA, _TENSOR_NAME, _TENSOR_RAW_DATA = 1, 2, 4, 8, 9
_TENSOR_DATA_LOCATION = 14
_FLOAT = 1  # TensorProto.FLOAT
_VARINT, _FIXED64, _LENGTH_DELIMITED, _FIXED32 = 0, 1, 2, 5


@dataclass(frozen=True)
class _Field:
    number: int
    wire_type: int
    raw: bytes  # the whole field as stored: tag, (length,) payload
    payload: bytes | int  # bytes for length-delimited fields, the integer for varints


def _read_varint(data: bytes, position: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if position >= len(data):
            raise InvalidInputError("the ONNX model is truncated (a varint runs past the end)")
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, position
        shift += 7


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _fields(data: bytes) -> Iterator[_Field]:
    position = 0
    while position < len(data):
        start = position
        tag, position = _read_varint(data, position)
        number, wire_type = tag >> 3, tag & 7
        if wire_type == _VARINT:
            payload, position = _read_varint(data, position)
        elif wire_type == _LENGTH_DELIMITED:
            length, position = _read_varint(data, position)
            payload = data[position : position + length]
            position += length
        elif wire_type == _FIXED64:
            payload, position = data[position : position + 8], position + 8
        elif wire_type == _FIXED32:
            payload, position = data[position : position + 4], position + 4
        else:
            raise InvalidInputError(f"the ONNX model uses protobuf wire type {wire_type}, which is not supported")
        if position > len(data):
            raise InvalidInputError("the ONNX model is truncated")
        yield _Field(number, wire_type, data[start:position], payload)


def _length_delimited(number: int, payload: bytes) -> bytes:
    return _encode_varint(number << 3 | _LENGTH_DELIMITED) + _encode_varint(len(payload)) + payload


def _graph_bytes(model: bytes) -> bytes:
    for field in _fields(model):
        if field.number == _MODEL_GRAPH and field.wire_type == _LENGTH_DELIMITED:
            return field.payload
    raise InvalidInputError("the ONNX model has no graph")


def _decode_tensor(tensor: bytes) -> tuple[str, np.ndarray | None]:
    """(name, array) of a TensorProto; the array is None unless it is a float tensor stored in the file."""
    name, dims, data_type, raw, floats, external = "", [], 0, None, [], False
    for field in _fields(tensor):
        if field.number == _TENSOR_NAME:
            name = field.payload.decode()
        elif field.number == _TENSOR_DIMS:
            if field.wire_type == _VARINT:
                dims.append(field.payload)
            else:
                position = 0
                while position < len(field.payload):
                    dim, position = _read_varint(field.payload, position)
                    dims.append(dim)
        elif field.number == _TENSOR_DATA_TYPE:
            data_type = field.payload
        elif field.number == _TENSOR_RAW_DATA:
            raw = field.payload
        elif field.number == _TENSOR_FLOAT_DATA:
            floats.append(field.payload)  # packed or one fixed32: little-endian floats either way
        elif field.number == _TENSOR_DATA_LOCATION and field.payload == 1:
            external = True
    if data_type != _FLOAT or external:
        return name, None
    data = raw if raw is not None else b"".join(floats)
    return name, np.frombuffer(data, dtype="<f4").astype(np.float32).reshape(dims)


def _encode_tensor(name: str, array: np.ndarray) -> bytes:
    dims = b"".join(_encode_varint(int(dim)) for dim in array.shape)
    body = b""
    if array.ndim:
        body += _length_delimited(_TENSOR_DIMS, dims)
    body += _encode_varint(_TENSOR_DATA_TYPE << 3 | _VARINT) + _encode_varint(_FLOAT)
    body += _length_delimited(_TENSOR_NAME, name.encode())
    body += _length_delimited(_TENSOR_RAW_DATA, np.ascontiguousarray(array, dtype="<f4").tobytes())
    return body


def read_float_initializers(model: bytes) -> dict[str, np.ndarray]:
    """Every float initializer stored inside the model, by name."""
    arrays = {}
    for field in _fields(_graph_bytes(model)):
        if field.number == _GRAPH_INITIALIZER and field.wire_type == _LENGTH_DELIMITED:
            name, array = _decode_tensor(field.payload)
            if array is not None:
                arrays[name] = array
    return arrays


def replace_initializers(model: bytes, parameters: Mapping[str, np.ndarray]) -> bytes:
    """The model with the named float initializers replaced by `parameters` (same shapes); all else unchanged."""
    remaining = dict(parameters)
    graph_parts = []
    for field in _fields(_graph_bytes(model)):
        if field.number == _GRAPH_INITIALIZER and field.wire_type == _LENGTH_DELIMITED:
            name, current = _decode_tensor(field.payload)
            if name in remaining:
                new = np.asarray(remaining.pop(name))
                if current is None or current.shape != new.shape:
                    old = "not a float tensor" if current is None else f"shape {current.shape}"
                    raise InvalidInputError(
                        f"parameter {name!r} has shape {new.shape} but the model's initializer is {old}", field=name
                    )
                graph_parts.append(_length_delimited(_GRAPH_INITIALIZER, _encode_tensor(name, new)))
                continue
        graph_parts.append(field.raw)
    if remaining:
        raise InvalidInputError(
            f"parameters {sorted(remaining)} are not initializers of the model", field=sorted(remaining)[0]
        )
    graph = b"".join(graph_parts)
    model_parts = [
        _length_delimited(_MODEL_GRAPH, graph) if field.number == _MODEL_GRAPH else field.raw for field in _fields(model)
    ]
    return b"".join(model_parts)
