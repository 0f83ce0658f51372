"""The Open Inference Protocol's binary tensor data extension, as `tritonclient.http` uses it
by default: a body is a JSON header of `Inference-Header-Content-Length` bytes followed by the
tensors' raw bytes, in the order of the inputs (or outputs) whose `parameters` carry a
`binary_data_size`. A `BYTES` tensor's raw form is each element as a 4-byte little-endian
length and its bytes; an `FP32` tensor's is little-endian float32, row-major.

Every malformed length is a BadRequest (400) naming what is wrong, never an exception.
"""

from __future__ import annotations

import struct

import numpy as np

from serve.gateway.protocols.door import BadRequest

HEADER_LENGTH = "Inference-Header-Content-Length"


def split_body(body: bytes, header_length: str | None) -> tuple[bytes, bytes]:
    """The JSON header and the binary data of a request body (all of it is JSON without the
    header)."""
    if header_length is None:
        return body, b""
    if not header_length.isdigit() or not 0 < int(header_length) <= len(body):
        raise BadRequest(f"{HEADER_LENGTH} must be a whole number of bytes from 1 to the body's "
                         f"{len(body)}, not {header_length[:40]!r}")
    size = int(header_length)
    return body[:size], body[size:]


def bytes_elements(blob: bytes) -> list[bytes]:
    """A BYTES tensor's elements from its raw form."""
    elements, at = [], 0
    while at < len(blob):
        if at + 4 > len(blob):
            raise BadRequest(f"binary BYTES data ends inside an element's length at byte {at}")
        (size,) = struct.unpack_from("<I", blob, at)
        at += 4
        if at + size > len(blob):
            raise BadRequest(f"binary BYTES element at byte {at - 4} declares {size} bytes, "
                             f"{len(blob) - at} are left")
        elements.append(blob[at:at + size])
        at += size
    return elements


def bytes_tensor(items: list[str]) -> bytes:
    """The raw form of a BYTES tensor of texts."""
    encoded = [item.encode() for item in items]
    return b"".join(struct.pack("<I", len(item)) + item for item in encoded)


def fp32_tensor(rows: list[list[float]]) -> bytes:
    """The raw form of an FP32 tensor (little-endian, row-major)."""
    return np.asarray(rows, dtype="<f4").tobytes()
