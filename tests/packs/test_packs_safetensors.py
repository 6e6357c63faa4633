"""The safetensors header parser against hand-made malformations and random hostile bytes."""

from __future__ import annotations

import contextlib
import json
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tfc.packs import safetensors_header as sh
from tfc.packs.errors import HeaderError
from tfc.packs.safetensors_header import MAX_HEADER_BYTES, parse_file_bytes, read_header


def build(header: dict | str | bytes, payload: bytes = b"", *, length: int | None = None) -> bytes:
    """A file from a header (dict -> compact JSON, str/bytes as given) and a payload."""
    if isinstance(header, dict):
        header = json.dumps(header, separators=(",", ":"))
    raw = header.encode() if isinstance(header, str) else header
    return struct.pack("<Q", len(raw) if length is None else length) + raw + payload


def entry(dtype: str, shape: list, begin: int, end: int) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def valid_file(rng: np.random.Generator, count: int = 5) -> bytes:
    """A valid random file: random dtypes and shapes, tensors back to back, random payload."""
    header: dict = {"__metadata__": {"format": "pt"}}
    position = 0
    for i in range(count):
        dtype = str(rng.choice(list(sh.DTYPE_SIZES)))
        shape = [int(d) for d in rng.integers(1, 6, size=int(rng.integers(0, 4)))]
        size = sh.DTYPE_SIZES[dtype] * int(np.prod(shape, dtype=np.int64))
        header[f"t{i}.w"] = entry(dtype, shape, position, position + size)
        position += size
    return build(header, rng.integers(0, 256, size=position, dtype=np.uint8).tobytes())


GOOD = build({"a": entry("F16", [2, 2], 0, 8), "b": entry("I32", [1], 8, 12)}, bytes(range(1, 13)))

MALFORMED = {
    "truncated length": b"\x10\x00\x00",
    "length past the end": build({"a": entry("U8", [1], 0, 1)}, b"\x01", length=10_000),
    "length over the limit": build("{}", length=MAX_HEADER_BYTES + 1),
    "absurd length u64 max": build("{}", length=2**64 - 1),
    "bad JSON": build('{"a": {"dtype": "F16", '),
    "non-UTF-8": build(b'{"a\xff\xfe": {"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\x01"),
    "not an object": build('["a"]'),
    "leading space": build(' {"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\x01"),
    "overlapping offsets": build({"a": entry("U8", [4], 0, 4), "b": entry("U8", [4], 2, 6)}, bytes(6)),
    "out-of-bounds offsets": build({"a": entry("U8", [4], 0, 4), "b": entry("U8", [4], 4, 8)}, bytes(6)),
    "gapped offsets": build({"a": entry("U8", [2], 0, 2), "b": entry("U8", [2], 4, 6)}, bytes(6)),
    "first tensor not at 0": build({"a": entry("U8", [2], 2, 4)}, bytes(4)),
    "trailing bytes": build({"a": entry("U8", [2], 0, 2)}, bytes(5)),
    "size mismatch": build({"a": entry("F32", [3], 0, 8)}, bytes(8)),
    "unknown dtype": build({"a": entry("F12", [2], 0, 4)}, bytes(4)),
    "lowercase dtype": build({"a": entry("f16", [2], 0, 4)}, bytes(4)),
    "negative dim": build({"a": entry("U8", [-2, -2], 0, 4)}, bytes(4)),
    "absurd dims": build({"a": entry("U8", [2**62, 2**62], 0, 4)}, bytes(4)),
    "product wraps to zero in 64 bits": build({"a": entry("U8", [2**32, 2**32], 0, 0)}),
    "float dim": build({"a": entry("U8", [2.0], 0, 2)}, bytes(2)),
    "bool dim": build({"a": entry("U8", [True], 0, 1)}, bytes(1)),
    "too many dims": build({"a": entry("U8", [1] * 9, 0, 1)}, bytes(1)),
    "duplicate tensor name": build(
        '{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"a":{"dtype":"I16","shape":[1],"data_offsets":[0,2]}}',
        bytes(2),
    ),
    "duplicate key inside an entry": build(
        '{"a":{"dtype":"U8","dtype":"I8","shape":[2],"data_offsets":[0,2]}}',
        bytes(2),
    ),
    "non-string metadata": build({"__metadata__": {"format": 1}, "a": entry("U8", [1], 0, 1)}, b"\x01"),
    "metadata not an object": build({"__metadata__": ["x"], "a": entry("U8", [1], 0, 1)}, b"\x01"),
    "extra field": build({"a": {**entry("U8", [1], 0, 1), "strides": [1]}}, b"\x01"),
    "missing field": build({"a": {"dtype": "U8", "shape": [1]}}, b"\x01"),
    "offsets backwards": build({"a": entry("U8", [0], 3, 1)}, bytes(3)),
    "three offsets": build({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1, 2]}}, b"\x01"),
    "negative offset": build({"a": entry("U8", [1], -1, 0)}, b"\x01"),
    "leading zero offset": build('{"a":{"dtype":"U8","shape":[1],"data_offsets":[00,1]}}', b"\x01"),
    "NaN dim": build('{"a":{"dtype":"U8","shape":[NaN],"data_offsets":[0,1]}}', b"\x01"),
    "control character in name": build({"a\nb": entry("U8", [1], 0, 1)}, b"\x01"),
    "empty name": build({"": entry("U8", [1], 0, 1)}, b"\x01"),
    "deep nesting": build("{" + '"a":[' * 100_000 + "]" * 100_000 + "}"),
    "giant integer": build('{"a":{"dtype":"U8","shape":[' + "9" * 5000 + '],"data_offsets":[0,1]}}', b"\x01"),
    "no tensors yet payload": build("{}", bytes(4)),
    "header only padding": build(b"        "),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_headers_raise_header_error(case):
    with pytest.raises(HeaderError):
        parse_file_bytes(MALFORMED[case], f"{case}.safetensors")


def test_good_file_parses_with_absolute_offsets():
    h = parse_file_bytes(GOOD, "good.safetensors")
    assert h.names == ["a", "b"]
    a, b = h.tensors["a"], h.tensors["b"]
    assert (a.dtype, a.shape, a.offset, a.nbytes) == ("F16", (2, 2), h.data_start, 8)
    assert (b.dtype, b.shape, b.offset, b.nbytes) == ("I32", (1,), h.data_start + 8, 4)
    assert GOOD[b.offset : b.offset + 4] == bytes(range(9, 13))


def test_header_length_checked_before_reading(tmp_path):
    path = tmp_path / "huge.safetensors"
    path.write_bytes(struct.pack("<Q", 2**60) + b"{}")
    with pytest.raises(HeaderError, match="exceeds the limit"):
        read_header(path)


def test_zero_size_tensors_may_share_an_offset():
    data = build(
        {"z": entry("F32", [0, 3], 0, 0), "a": entry("U8", [2], 0, 2), "y": entry("I8", [0], 2, 2)},
        b"\x01\x02",
    )
    h = parse_file_bytes(data)
    assert [h.tensors[n].nbytes for n in ("z", "a", "y")] == [0, 2, 0]


def test_tensors_in_any_header_order():
    data = build({"b": entry("U8", [2], 2, 4), "a": entry("U8", [2], 0, 2)}, b"\x01\x02\x03\x04")
    h = parse_file_bytes(data)
    assert h.tensors["a"].offset == h.data_start and h.tensors["b"].offset == h.data_start + 2


def test_reference_writer_output_takes_the_fast_path_and_agrees_with_strict(tmp_path):
    from safetensors.numpy import save_file

    rng = np.random.default_rng(7)
    tensors = {f"layers.{i}.w": rng.standard_normal((3, i + 1)).astype(np.float16) for i in range(6)}
    tensors["marker"] = np.array(-5, dtype=np.int32)
    tensors["empty"] = np.zeros((0, 4), dtype=np.float32)
    path = tmp_path / "ref.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    h = read_header(path)
    text = h.header_bytes.decode()
    fast = sh._fast_parse(text, h.file_size - h.data_start)
    assert fast is not None, "the reference writer's form must take the fast path"
    strict = sh._strict_parse(text, path)
    assert fast[:4] == (strict[0], strict[1], strict[2], strict[3])
    assert fast[4] == strict[4]
    for name, arr in tensors.items():
        info = h.tensors[name]
        assert info.shape == arr.shape and info.nbytes == arr.nbytes
        assert path.read_bytes()[info.offset : info.offset + info.nbytes] == arr.tobytes()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1), st.integers(1, 12))
def test_fast_and_strict_paths_agree_on_valid_files(seed, count):
    data = valid_file(np.random.default_rng(seed), count)
    n = int.from_bytes(data[:8], "little")
    text = data[8 : 8 + n].decode()
    fast = sh._fast_parse(text, len(data) - 8 - n)
    assert fast is not None
    metadata, names, dtypes, shapes, begins, ends = sh._strict_parse(text, Path("x"))
    assert fast == (
        metadata,
        names,
        dtypes,
        shapes,
        begins,
        [e - b for b, e in zip(begins, ends, strict=True)],
    )


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_only_raise_header_error(data):
    with contextlib.suppress(HeaderError):
        parse_file_bytes(data)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1), st.data())
def test_mutated_valid_headers_only_raise_header_error(seed, data):
    original = bytearray(valid_file(np.random.default_rng(seed), 4))
    n = int.from_bytes(original[:8], "little")
    kind = data.draw(st.sampled_from(["flip", "byte", "cut", "insert", "length"]))
    mutated = bytearray(original)
    if kind == "flip":
        i = data.draw(st.integers(0, 8 + n - 1))
        mutated[i] ^= 1 << data.draw(st.integers(0, 7))
    elif kind == "byte":
        i = data.draw(st.integers(8, 8 + n - 1))
        mutated[i] = data.draw(st.sampled_from(b'{}[]",:0123456789-.eE \\\x00\xff'))
    elif kind == "cut":
        mutated = mutated[: data.draw(st.integers(0, len(mutated) - 1))]
    elif kind == "insert":
        i = data.draw(st.integers(8, 8 + n))
        mutated[i:i] = data.draw(st.binary(min_size=1, max_size=8))
        mutated[:8] = struct.pack("<Q", n + len(mutated) - len(original))
    else:
        mutated[:8] = struct.pack("<Q", data.draw(st.integers(0, 2**64 - 1)))
    try:
        h = parse_file_bytes(bytes(mutated))
    except HeaderError:
        return
    end = max((t.offset + t.nbytes for t in h.tensors.values()), default=h.data_start)
    assert end == len(mutated), "an accepted file is covered exactly by its tensors"
    strict = sh._strict_parse(h.header_bytes.decode(), Path("x"))  # no parser differential: json agrees
    assert (strict[1], strict[2], strict[3]) == (h.names, h.dtypes, h.shapes)
