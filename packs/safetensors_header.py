"""Hostile-input safetensors header parser: reads the header bytes and the file size, never the payload."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from itertools import accumulate
from operator import mul, sub
from pathlib import Path

from tfc.packs.errors import HeaderError
from tfc.packs.files import open_fd

MAX_HEADER_BYTES = 100_000_000  # the reference parser's limit, checked before allocating
MAX_NDIM = 8
MAX_NAME_CHARS = 4096
DTYPE_SIZES: dict[str, int] = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
}  # fmt: skip
_TENSOR_KEYS = frozenset(("dtype", "shape", "data_offsets"))
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

# Fast path: the exact compact form safetensors writers emit (no escapes, fixed key order). A header that
# does not tile exactly into these entries goes through the strict json path, which is authoritative.
_ENTRY = re.compile(
    r'"([^"\\\x00-\x1f\x7f]{1,4096})":\{("dtype":"[A-Z0-9_]+","shape":\[[0-9,]*\]),'
    r'"data_offsets":\[(0|[1-9][0-9]{0,19}),(0|[1-9][0-9]{0,19})\]\},'
)  # dtype and shape travel as one text: headers repeat few of them, so they are parsed once each
_ENTRY_FIXED = len('"":{,"data_offsets":[,]},')
_NUM = r"(?:0|[1-9][0-9]{0,19})"
_DTYPE_SHAPE = re.compile(
    r'"dtype":"([A-Z0-9_]{1,16})","shape":\[((?:' + _NUM + r"(?:," + _NUM + r"){0,7})?)\]"
)
_META_PREFIX = '{"__metadata__":{'


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One stored tensor: where its payload lives (absolute file offset) and what it holds."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    file: Path
    offset: int
    nbytes: int


@dataclass(frozen=True)
class SafetensorsHeader:
    """A validated header; tensor columns are parallel lists in header order."""

    path: Path
    header_len: int
    header_bytes: bytes = field(repr=False)
    file_size: int
    data_start: int
    metadata: dict[str, str]
    names: list[str] = field(repr=False)
    dtypes: list[str] = field(repr=False)
    shapes: list[tuple[int, ...]] = field(repr=False)
    offsets: list[int] = field(repr=False)  # absolute, in the file
    nbytes: list[int] = field(repr=False)

    @cached_property
    def tensors(self) -> dict[str, TensorInfo]:
        """Every tensor by name, in header order."""
        path = self.path
        return {
            n: TensorInfo(n, d, s, path, o, b)
            for n, d, s, o, b in zip(
                self.names, self.dtypes, self.shapes, self.offsets, self.nbytes, strict=True
            )
        }


def read_header(path: Path | str) -> SafetensorsHeader:
    """Read and validate one file's header; only the header bytes and the file size are read."""
    path = Path(path)
    fd = open_fd(path, HeaderError)
    try:
        with os.fdopen(fd, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            prefix = f.read(8)
            if len(prefix) < 8:
                raise HeaderError(f"{path.name}: {size} bytes is too short for a safetensors header length")
            n = _check_length(path, int.from_bytes(prefix, "little"), size)
            raw = f.read(n)
    except OSError as error:
        raise HeaderError(f"{path}: cannot read: {error.strerror or error}") from None
    if len(raw) != n:
        raise HeaderError(f"{path.name}: header truncated ({len(raw)} of {n} bytes)")
    return parse_header(raw, size, path)


def parse_file_bytes(data: bytes, path: Path | str = "<bytes>") -> SafetensorsHeader:
    """Validate a whole file held in memory (tests and tools)."""
    path = Path(path)
    if len(data) < 8:
        raise HeaderError(f"{path.name}: {len(data)} bytes is too short for a safetensors header length")
    n = _check_length(path, int.from_bytes(data[:8], "little"), len(data))
    return parse_header(bytes(data[8 : 8 + n]), len(data), path)


def _check_length(path: Path, n: int, size: int) -> int:
    if n > MAX_HEADER_BYTES:
        raise HeaderError(f"{path.name}: header length {n} exceeds the limit of {MAX_HEADER_BYTES} bytes")
    if 8 + n > size:
        raise HeaderError(f"{path.name}: header length {n} runs past the end of the {size}-byte file")
    return n


def parse_header(raw: bytes, file_size: int, path: Path | str) -> SafetensorsHeader:
    """Validate header bytes `raw` of a file of `file_size` bytes whose payload starts at 8 + len(raw)."""
    path = Path(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise HeaderError(f"{path.name}: header is not UTF-8 (byte {error.start})") from None
    if not text.startswith("{"):
        raise HeaderError(f"{path.name}: header does not start with '{{'")
    data_start = 8 + len(raw)
    parsed = _fast_parse(text, file_size - data_start)
    if parsed is None:  # anything unusual: every rule checked the general way, with precise messages
        metadata, names, dtypes, shapes, begins, ends = _strict_parse(text, path)
        nbytes = _validate(path, names, dtypes, shapes, begins, ends, file_size - data_start)
    else:
        metadata, names, dtypes, shapes, begins, nbytes = parsed
    return SafetensorsHeader(
        path=path, header_len=len(raw), header_bytes=raw, file_size=file_size, data_start=data_start,
        metadata=metadata, names=names, dtypes=dtypes, shapes=shapes,
        offsets=list(map(data_start.__add__, begins)), nbytes=nbytes,
    )  # fmt: skip


def _fast_parse(text: str, buffer_size: int):
    """Columns of a valid header in the writers' exact form (tensors back to back in header order).

    Returns None for anything else, valid or not; the strict path then decides and explains.
    """
    body = text.rstrip(" \t\r\n")
    if not body.endswith("}"):
        return None
    metadata: dict[str, str] = {}
    if body.startswith(_META_PREFIX):
        end = body.find("}", len(_META_PREFIX) - 1)
        blob = body[len(_META_PREFIX) - 1 : end + 1]
        if end < 0 or "\\" in blob or "{" in blob[1:]:
            return None
        try:
            metadata = json.loads(blob, object_pairs_hook=_no_duplicates)
        except (ValueError, RecursionError):
            return None
        if any(type(v) is not str for v in metadata.values()):
            return None
        body = body[end + 1 :]
        if body == "}":
            return (metadata, [], [], [], [], []) if buffer_size == 0 else None
        if not body.startswith(","):
            return None
    body = body[1:-1] + ","
    found = _ENTRY.findall(body)
    if not found:
        return None
    names, kinds, begin_texts, end_texts = zip(*found, strict=True)
    if begin_texts[0] != "0" or begin_texts[1:] != end_texts[:-1]:
        return None  # not back to back in header order
    counts = Counter(kinds)
    covered = (  # matches that cover the body exactly, char for char, leave nothing unparsed between them
        sum(map(len, names)) + sum(len(k) * c for k, c in counts.items()) + sum(map(len, end_texts)) * 2
        - len(end_texts[-1]) + 1 + _ENTRY_FIXED * len(found)
    )  # fmt: skip
    if covered != len(body) or len(set(names)) != len(names) or "__metadata__" in names:
        return None
    dtype_of, shape_of, size_of = {}, {}, {}
    for kind in counts:
        m = _DTYPE_SHAPE.fullmatch(kind)
        if m is None or m[1] not in DTYPE_SIZES:
            return None
        shape = tuple(map(int, m[2].split(","))) if m[2] else ()
        size = DTYPE_SIZES[m[1]]
        for d in shape:
            size *= d
        dtype_of[kind], shape_of[kind], size_of[kind] = m[1], shape, size
    sizes = list(map(size_of.__getitem__, kinds))
    ends = list(map(int, end_texts))
    if list(accumulate(sizes)) != ends or ends[-1] != buffer_size:
        return None
    dtypes = list(map(dtype_of.__getitem__, kinds))
    shapes = list(map(shape_of.__getitem__, kinds))
    return metadata, list(names), dtypes, shapes, [0, *ends[:-1]], sizes


class _Duplicate(ValueError):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _no_duplicates(pairs: list) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Duplicate(key)
            seen.add(key)
    return out


def _strict_parse(text: str, path: Path):
    """Columns of any valid JSON header, every rule checked entry by entry."""
    try:
        obj = json.loads(text, object_pairs_hook=_no_duplicates)
    except _Duplicate as dup:
        raise HeaderError(f"{path.name}: header has the key {dup.key!r:.200} twice") from None
    except RecursionError:
        raise HeaderError(f"{path.name}: header JSON nests too deeply") from None
    except ValueError as error:
        raise HeaderError(f"{path.name}: header is not valid JSON ({str(error)[:120]})") from None
    if type(obj) is not dict:
        raise HeaderError(f"{path.name}: header is not a JSON object")
    metadata = obj.pop("__metadata__", {})
    if type(metadata) is not dict or any(type(v) is not str for v in metadata.values()):
        raise HeaderError(f"{path.name}: __metadata__ must map strings to strings")
    names, dtypes, shapes, begins, ends = [], [], [], [], []
    for name, entry in obj.items():
        where = f"{path.name}: tensor {name!r:.200}"
        if not name or len(name) > MAX_NAME_CHARS or _CONTROL.search(name):
            raise HeaderError(f"{where}: bad tensor name")
        if type(entry) is not dict or entry.keys() != _TENSOR_KEYS:
            raise HeaderError(f"{where}: entry must hold exactly dtype, shape and data_offsets")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if type(dtype) is not str:
            raise HeaderError(f"{where}: dtype is not a string")
        if (
            type(shape) is not list
            or len(shape) > MAX_NDIM
            or any(type(d) is not int or d < 0 for d in shape)
        ):
            raise HeaderError(f"{where}: shape {shape!r:.80} is not a list of at most {MAX_NDIM} sizes >= 0")
        if (
            type(offsets) is not list
            or len(offsets) != 2
            or any(type(o) is not int or o < 0 for o in offsets)
        ):
            raise HeaderError(f"{where}: data_offsets {offsets!r:.80} is not two integers >= 0")
        if offsets[0] > offsets[1]:
            raise HeaderError(f"{where}: data_offsets {offsets} run backwards")
        names.append(name)
        dtypes.append(dtype)
        shapes.append(tuple(shape))
        begins.append(offsets[0])
        ends.append(offsets[1])
    return metadata, names, dtypes, shapes, begins, ends


def _validate(path, names, dtypes, shapes, begins, ends, buffer_size: int) -> list[int]:
    """Dtypes known, sizes equal to prod(shape) * itemsize, offsets contiguous from 0 to the buffer end.

    Returns every tensor's byte length.
    """
    if buffer_size < 0:
        raise HeaderError(f"{path.name}: header runs past the end of the file")
    unknown = set(dtypes) - DTYPE_SIZES.keys()
    if unknown:
        i = next(i for i, d in enumerate(dtypes) if d in unknown)
        raise HeaderError(f"{path.name}: tensor {names[i]!r}: unknown dtype {dtypes[i]!r:.40}")
    numel: dict[tuple[int, ...], int] = {}
    for shape in set(shapes):
        if len(shape) > MAX_NDIM:
            raise HeaderError(f"{path.name}: a shape has {len(shape)} dimensions (at most {MAX_NDIM})")
        count = 1
        for d in shape:
            count *= d
        numel[shape] = count
    want = list(map(mul, map(numel.__getitem__, shapes), map(DTYPE_SIZES.__getitem__, dtypes)))
    have = list(map(sub, ends, begins))
    if want != have:
        i = next(i for i, (w, h) in enumerate(zip(want, have, strict=True)) if w != h)
        what = "more than the file holds" if want[i] > buffer_size else f"but data_offsets span {have[i]}"
        raise HeaderError(
            f"{path.name}: tensor {names[i]!r}: {dtypes[i]} {list(shapes[i])} needs {want[i]} bytes, {what}"
        )
    if not begins:
        if buffer_size:
            raise HeaderError(f"{path.name}: no tensors, yet {buffer_size} payload bytes follow the header")
        return have
    if begins[0] == 0 and begins[1:] == ends[:-1] and ends[-1] == buffer_size:
        return have  # the usual case: stored in offset order, contiguous
    order = sorted(range(len(begins)), key=lambda i: (begins[i], ends[i]))
    position, previous = 0, None
    for i in order:  # zero-size tensors may share an offset; anything else must follow exactly
        if begins[i] != position:
            kind = "overlaps" if begins[i] < position else "leaves a gap after"
            after = f"tensor {names[previous]!r}" if previous is not None else "the buffer start"
            raise HeaderError(f"{path.name}: tensor {names[i]!r}: data_offsets {begins[i]} {kind} {after}")
        position, previous = ends[i], i
    if position != buffer_size:
        kind = "past the end of" if position > buffer_size else "short of"
        raise HeaderError(f"{path.name}: data ends at byte {position}, {kind} the {buffer_size}-byte buffer")
    return have
