"""KServe V2 / Open Inference Protocol tensors: JSON, and Triton's binary tensor data extension.

A request body is JSON, or JSON followed by raw tensor bytes (its length in the
Inference-Header-Content-Length header; each input's share in parameters.binary_data_size). BYTES
elements travel as a 4-byte little-endian length and the bytes. Responses mirror what each output
asked for.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtimes.api.bodies import BodyError, load_json

DTYPES: dict[str, Any] = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "FP16": np.float16,
    "FP32": np.float32, "FP64": np.float64, "BYTES": np.object_,
}
HEADER = "inference-header-content-length"
MAX_ELEMENTS = 1 << 24  # per input; the body limit bounds real data far below this


class TensorError(ValueError):
    """A malformed tensor: the caller's mistake (HTTP 400)."""


@dataclass
class InferRequest:
    id: str | None
    inputs: dict[str, np.ndarray]
    binary_outputs: dict[str, bool]  # requested output name -> wants binary
    parameters: dict[str, Any]


def _bytes_elements(raw: bytes) -> list[bytes]:
    items, offset = [], 0
    while offset < len(raw):
        if offset + 4 > len(raw):
            raise TensorError("a BYTES tensor ends inside an element's length prefix")
        (size,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        if offset + size > len(raw):
            raise TensorError("a BYTES element is longer than the data sent")
        items.append(raw[offset:offset + size])
        offset += size
    return items


def _tensor(entry: dict[str, Any], binary: bytes | None) -> np.ndarray:
    name, datatype, shape = entry.get("name"), entry.get("datatype"), entry.get("shape")
    if not isinstance(name, str) or datatype not in DTYPES:
        raise TensorError(f"input {name!r}: datatype {datatype!r} is not one of {sorted(DTYPES)}")
    if not isinstance(shape, list) or len(shape) > 8 or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise TensorError(f"input {name!r}: shape must be a list of at most 8 non-negative integers")
    count = math.prod(shape)  # Python integers: a product past int64 cannot wrap around
    if count > MAX_ELEMENTS:
        raise TensorError(f"input {name!r}: shape {shape[:8]} holds {count} values; at most {MAX_ELEMENTS}")
    if binary is not None:
        if datatype == "BYTES":
            values: Any = np.array(_bytes_elements(binary) or [], dtype=object)
        else:
            dtype = np.dtype(DTYPES[datatype]).newbyteorder("<")
            if len(binary) != count * dtype.itemsize:
                raise TensorError(f"input {name!r}: {len(binary)} bytes do not hold {count} {datatype} values")
            values = np.frombuffer(binary, dtype=dtype)
    else:
        data = entry.get("data")
        if not isinstance(data, list):
            raise TensorError(f"input {name!r} has no 'data' list (nor binary data)")
        try:  # ragged or nested-object data is the caller's mistake, not ours
            flat = np.array(data, dtype=object).reshape(-1) if data else np.array([], dtype=object)
        except ValueError as exc:
            raise TensorError(f"input {name!r}: 'data' must be a flat or regularly nested list") from exc
        if any(isinstance(v, list | dict) for v in flat):
            raise TensorError(f"input {name!r}: 'data' must be a flat or regularly nested list of values")
        if datatype == "BYTES":
            values = np.array([v.encode() if isinstance(v, str) else v for v in flat], dtype=object)
            if not all(isinstance(v, bytes) for v in values):
                raise TensorError(f"input {name!r}: BYTES data must be strings")
        else:
            try:
                values = flat.astype(DTYPES[datatype])
            except (TypeError, ValueError, OverflowError) as exc:
                raise TensorError(f"input {name!r}: data are not {datatype} values") from exc
            if datatype.startswith(("INT", "UINT")) and not all(isinstance(v, int | bool) for v in flat):
                raise TensorError(f"input {name!r}: {datatype} data must be integers")
    if values.size != count:
        raise TensorError(f"input {name!r}: shape {shape} holds {count} values, {values.size} were sent")
    return values.reshape(shape)


def _parameters(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TensorError(f"{where} 'parameters' must be an object, not {type(value).__name__}")
    return value


def parse_infer(body: bytes, header_length: str | None) -> InferRequest:
    if header_length is not None:
        if not (header_length.isascii() and header_length.isdigit()) or int(header_length) > len(body):
            raise TensorError(f"{HEADER} {header_length!r} does not fit a body of {len(body)} bytes")
        head, rest = body[:int(header_length)], body[int(header_length):]
    else:
        head, rest = body, b""
    try:
        document = load_json(head)
    except BodyError as exc:
        raise TensorError(str(exc)) from exc
    if not isinstance(document, dict) or not isinstance(document.get("inputs"), list) or not document["inputs"]:
        raise TensorError("the request must be a JSON object with a non-empty 'inputs' list")
    inputs: dict[str, np.ndarray] = {}
    offset = 0
    for entry in document["inputs"]:
        if not isinstance(entry, dict):
            raise TensorError("each input must be an object with name, datatype, shape and data")
        size = _parameters(entry.get("parameters"), f"input {str(entry.get('name'))[:64]!r}").get(
            "binary_data_size")
        binary = None
        if size is not None:
            if not isinstance(size, int) or isinstance(size, bool) or size < 0 or offset + size > len(rest):
                raise TensorError(f"input {entry.get('name')!r}: binary_data_size {size!r} runs past the body")
            binary, offset = rest[offset:offset + size], offset + size
        tensor = _tensor(entry, binary)
        if entry["name"] in inputs:
            raise TensorError(f"input {entry['name']!r} is given twice")
        inputs[entry["name"]] = tensor
    outputs = document.get("outputs") or []
    if not isinstance(outputs, list) or not all(isinstance(o, dict) and isinstance(o.get("name"), str)
                                                for o in outputs):
        raise TensorError("'outputs' must be a list of objects with a name")
    wanted = {o["name"]: bool(_parameters(o.get("parameters"), "an output's").get("binary_data")) for o in outputs}
    request_id = document.get("id")
    if request_id is not None and (not isinstance(request_id, str) or len(request_id) > 256):
        raise TensorError("'id' must be a string of at most 256 characters")
    return InferRequest(request_id, inputs, wanted, _parameters(document.get("parameters"), "the request's"))


def _encode_binary(array: np.ndarray, datatype: str) -> bytes:
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", len(v)) + v for v in (x if isinstance(x, bytes) else str(x).encode()
                                                                 for x in array.reshape(-1)))
    return np.ascontiguousarray(array, dtype=np.dtype(DTYPES[datatype]).newbyteorder("<")).tobytes()


def encode_response(model: str, request: InferRequest, outputs: dict[str, tuple[np.ndarray, str]],
                    ) -> tuple[bytes, dict[str, str]]:
    """(body, headers): JSON data, or JSON plus binary for the outputs that asked for it."""
    names = list(request.binary_outputs) or list(outputs)
    entries, blobs = [], []
    for name in names:
        array, datatype = outputs[name]
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        if request.binary_outputs.get(name):
            blob = _encode_binary(array, datatype)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        elif datatype == "BYTES":
            entry["data"] = [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
                             for v in array.reshape(-1)]
        else:
            entry["data"] = array.reshape(-1).tolist()
        entries.append(entry)
    document: dict[str, Any] = {"model_name": model, "model_version": "1", "outputs": entries}
    if request.id is not None:
        document["id"] = request.id
    head = json.dumps(document).encode()
    if not blobs:
        return head, {"content-type": "application/json"}
    return head + b"".join(blobs), {"content-type": "application/octet-stream", HEADER: str(len(head))}
