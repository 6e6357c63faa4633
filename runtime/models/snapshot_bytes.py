"""The byte form of a runner's slot snapshot: a magic line, a JSON header naming packed tensors, their bytes.

  magic | u64 little-endian header length | header (UTF-8 JSON) | payload
  header: {..the runner's own fields.., "tensors": [{"name", "dtype", "shape", "offset", "nbytes"}]}
  tensors, little-endian, packed in header order from payload offset 0.
Strict on the way back in: a damaged or foreign blob is refused with the caller's error, never half-read.
"""

from __future__ import annotations

import json
import struct
import sys
from collections.abc import Callable

import torch

MAX_HEADER = 1 << 24
DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "I64": torch.int64,
    "U8": torch.uint8,
}  # fmt: skip
NAMES = {dtype: name for name, dtype in DTYPES.items()}


def pack(magic: bytes, fields: dict, named: list[tuple[str, torch.Tensor]], error: type[Exception]) -> bytes:
    """The blob of `named` tensors under a header holding `fields`."""
    if sys.byteorder != "little":
        raise error("snapshots are written on little-endian machines only")
    specs, blobs, offset = [], [], 0
    for name, t in named:
        blob = t.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes()
        specs.append({"name": name, "dtype": NAMES[t.dtype], "shape": list(t.shape), "offset": offset,
                      "nbytes": len(blob)})  # fmt: skip
        blobs.append(blob)
        offset += len(blob)
    header = json.dumps({**fields, "tensors": specs}).encode()
    return b"".join([magic, struct.pack("<Q", len(header)), header, *blobs])


def unpack(
    magic: bytes, data: bytes, dims: Callable[[str], int | None], error: type[Exception]
) -> tuple[dict, dict[str, torch.Tensor]]:
    """(header, tensors by name) of a blob `pack` wrote; `dims(name)` is a known name's rank (None: unknown)."""
    header, payload = _split(magic, data, error)
    specs = header.get("tensors")
    if not isinstance(specs, list):
        raise error("the header lacks its tensors")
    tensors, end = {}, 0
    for spec in specs:
        name, t = _tensor(spec, payload, end, dims, error)
        if name in tensors:
            raise error(f"tensor {name!r} appears twice")
        tensors[name] = t
        end += spec["nbytes"]
    if end != len(payload):
        raise error(f"{len(payload) - end} payload bytes follow the last tensor")
    return header, tensors


def _split(magic: bytes, data: bytes, error: type[Exception]) -> tuple[dict, memoryview]:
    if len(data) < len(magic) + 8 or data[: len(magic)] != magic:
        raise error("not a snapshot of this kind (bad magic)")
    (size,) = struct.unpack_from("<Q", data, len(magic))
    start = len(magic) + 8
    if size > MAX_HEADER or start + size > len(data):
        raise error(f"header length {size} does not fit the {len(data)}-byte snapshot")
    try:
        header = json.loads(bytes(data[start : start + size]))
    except ValueError:
        raise error("the header is not JSON") from None
    if not isinstance(header, dict):
        raise error("the header is not a JSON object")
    return header, memoryview(data)[start + size :]


def _tensor(spec: object, payload: memoryview, offset: int, dims: Callable[[str], int | None],
            error: type[Exception]) -> tuple[str, torch.Tensor]:  # fmt: skip
    if not isinstance(spec, dict):
        raise error("a tensor entry is not an object")
    name, dtype, shape = spec.get("name"), DTYPES.get(spec.get("dtype")), spec.get("shape")
    rank = dims(name) if isinstance(name, str) else None
    if rank is None:
        raise error(f"unknown tensor {name!r}")
    if dtype is None or not isinstance(shape, list) or len(shape) != rank:
        raise error(f"tensor {name!r}: bad dtype or shape")
    if any(type(d) is not int or d < 0 for d in shape):
        raise error(f"tensor {name!r}: bad shape {shape}")
    nbytes = torch.Size(shape).numel() * dtype.itemsize
    if spec.get("offset") != offset or spec.get("nbytes") != nbytes or offset + nbytes > len(payload):
        raise error(f"tensor {name!r}: its bytes are not where the header says")
    if nbytes == 0:
        return name, torch.empty(shape, dtype=dtype)
    raw = torch.frombuffer(bytearray(payload[offset : offset + nbytes]), dtype=torch.uint8)
    return name, raw.view(dtype).reshape(shape)
