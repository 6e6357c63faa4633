"""Reading a hostile manifest: bounded bytes, strict JSON, and every field checked into a RankManifest."""

from __future__ import annotations

import itertools
import json
import math
import os
import re
from pathlib import Path

from tfc.cache import digest as _digest
from tfc.cache.contract import DTYPES, ID, TIER_DEVICE, TIERS
from tfc.cache.errors import ImageError
from tfc.cache.files import open_regular
from tfc.cache.format import (
    ALIGN,
    FILE_NAME,
    FORMAT_VERSION,
    HEX64,
    MANIFEST_NAME,
    MAX_NDIM,
    SEGMENT_NAME,
    FileEntry,
    RankManifest,
    SegmentEntry,
)

MAX_MANIFEST_BYTES = 64 << 20
MAX_FILES = 4096
MAX_SEGMENTS = 1 << 20
MAX_WORLD = 1024
MAX_FILE_BYTES = 1 << 50
MAX_DEPTH = 64  # objects and lists within one another, the manifest's own object counted as 1

_TOP_KEYS = {
    "format_version",
    "family",
    "key",
    "world_key",
    "key_inputs",
    "world",
    "rank",
    "plan",
    "files",
    "segments",
    "meta",
    "root_digest",
}
_SEGMENT_KEYS = {"name", "file", "offset", "length", "dtype", "shape", "layout", "digest", "chunks", "tier"}


def read_manifest(path: str | os.PathLike) -> RankManifest:
    """Read and strictly validate a manifest file (or a rank folder's manifest.json)."""
    p = Path(path)
    if p.is_dir():
        p = p / MANIFEST_NAME
    fd, st = open_regular(p, "manifest", "no manifest (not a published rank image)")
    try:
        if st.st_size > MAX_MANIFEST_BYTES:
            raise ImageError(f"{p}: manifest is {st.st_size} bytes, over the {MAX_MANIFEST_BYTES}-byte limit")
        chunks = []
        remaining = MAX_MANIFEST_BYTES + 1
        while remaining > 0:
            b = os.read(fd, min(remaining, 1 << 20))
            if not b:
                break
            chunks.append(b)
            remaining -= len(b)
        data = b"".join(chunks)
    finally:
        os.close(fd)
    if len(data) > MAX_MANIFEST_BYTES:
        raise ImageError(f"{p}: manifest is over the {MAX_MANIFEST_BYTES}-byte limit")
    return manifest_from_bytes(data, source=str(p))


def manifest_from_bytes(data: bytes, source: str = "manifest") -> RankManifest:
    """Parse and strictly validate manifest bytes (hostile input)."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise ImageError(f"{source}: manifest is over the {MAX_MANIFEST_BYTES}-byte limit")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ImageError(f"{source}: manifest is not UTF-8") from None
    if not text.lstrip().startswith("{"):
        raise ImageError(f"{source}: manifest is not a JSON object")
    try:
        obj = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except RecursionError:
        raise ImageError(f"{source}: manifest JSON is nested more than {MAX_DEPTH} levels deep") from None
    except ValueError as error:
        raise ImageError(f"{source}: manifest is not valid JSON: {error}") from None
    return parse_manifest(obj, source)


def _no_duplicates(pairs: list) -> dict:
    d = {}
    for k, v in pairs:
        if k in d:
            raise ValueError(f"duplicate key {k!r}")
        d[k] = v
    return d


def _no_constant(name: str):
    raise ValueError(f"{name} is not allowed")


def _int(v, what: str, lo: int, hi: int) -> int:
    # bool is an int subclass in Python; a manifest's true is never a count
    if type(v) is not int or not lo <= v <= hi:
        raise ImageError(f"{what} must be an integer in [{lo}, {hi}], got {v!r:.80}")
    return v


def _str(v, what: str, pattern: re.Pattern) -> str:
    if type(v) is not str or not pattern.fullmatch(v):
        raise ImageError(f"{what} is malformed: {v!r:.80}")
    return v


def _dict(v, what: str) -> dict:
    if type(v) is not dict:
        raise ImageError(f"{what} must be a JSON object")
    return v


def _list(v, what: str, most: int) -> list:
    if type(v) is not list:
        raise ImageError(f"{what} must be a JSON list")
    if len(v) > most:
        raise ImageError(f"{what} has {len(v)} entries, over the limit of {most}")
    return v


def _check_depth(value: dict, what: str) -> None:
    """Refuse a free-form field nested deeper than MAX_DEPTH, walked without recursion."""
    # JSON a little deeper than Python's recursion limit still parses, then breaks the root digest,
    # `inspect --json` and every later dump of it.
    stack = [(value, 2)]  # the field's own object sits one level below the manifest's
    while stack:
        v, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ImageError(f"{what} is nested more than {MAX_DEPTH} levels deep")
        children = v.values() if type(v) is dict else v
        stack += [(c, depth + 1) for c in children if type(c) in (dict, list)]


def parse_manifest(obj, source: str = "manifest") -> RankManifest:
    """Validate a decoded manifest object and build the RankManifest (every field checked)."""
    try:
        return _parse(obj, source)
    except ImageError as error:
        msg = str(error)
        raise ImageError(msg if msg.startswith(source) else f"{source}: {msg}") from None


def _parse(obj, source: str) -> RankManifest:
    top = _dict(obj, "manifest")
    version = top.get("format_version")
    if version != FORMAT_VERSION or type(version) is not int:
        raise ImageError(
            f"image format version {version!r:.20} is not the version this tfc reads ({FORMAT_VERSION}); "
            "re-run `tfc prepare` to rebuild the image"
        )
    missing = (_TOP_KEYS - {"meta"}) - top.keys()
    if missing:
        raise ImageError(f"manifest lacks {', '.join(sorted(missing))}")
    unknown = top.keys() - _TOP_KEYS
    if unknown:
        raise ImageError(f"manifest has unknown fields {', '.join(sorted(map(repr, unknown)))[:200]}")
    family = _str(top["family"], "family", ID)
    key = _str(top["key"], "key", HEX64)
    world_key = _str(top["world_key"], "world_key", HEX64)
    root = _str(top["root_digest"], "root_digest", HEX64)
    world = _int(top["world"], "world", 1, MAX_WORLD)
    rank = _int(top["rank"], "rank", 0, world - 1)
    key_inputs = _dict(top["key_inputs"], "key_inputs")
    plan = _dict(top["plan"], "plan")
    meta = _dict(top.get("meta", {}), "meta")
    for what, value in (("key_inputs", key_inputs), ("plan", plan), ("meta", meta)):
        _check_depth(value, what)

    files: dict[str, FileEntry] = {}
    for i, f in enumerate(_list(top["files"], "files", MAX_FILES)):
        f = _dict(f, f"files[{i}]")
        if set(f) != {"name", "size"}:
            raise ImageError(f"files[{i}] must have exactly name and size")
        name = _str(f["name"], f"files[{i}].name", FILE_NAME)
        size = _int(f["size"], f"file {name} size", 0, MAX_FILE_BYTES)
        if size % ALIGN:
            raise ImageError(f"file {name} size {size} is not a multiple of {ALIGN}")
        if name in files:
            raise ImageError(f"file {name} is listed twice")
        files[name] = FileEntry(name, size)

    segments: list[SegmentEntry] = []
    names: set[str] = set()
    for i, s in enumerate(_list(top["segments"], "segments", MAX_SEGMENTS)):
        seg = _segment(_dict(s, f"segments[{i}]"), i, files)
        if seg.name in names:
            raise ImageError(f"segment {seg.name} is listed twice")
        names.add(seg.name)
        segments.append(seg)
    _check_overlaps(segments)

    m = RankManifest(
        FORMAT_VERSION, family, key, world_key, key_inputs, world, rank, plan,
        list(files.values()), segments, root, meta,
    )  # fmt: skip
    try:
        actual = m.compute_root_digest()
    except ImageError as error:
        raise ImageError(f"manifest content is not canonical JSON: {error}") from None
    if actual != root:
        raise ImageError(
            f"manifest root digest mismatch (stored {root[:16]}…, content {actual[:16]}…): the manifest was altered"
        )
    return m


def _segment(s: dict, i: int, files: dict[str, FileEntry]) -> SegmentEntry:
    keys = set(s)
    if (
        not {"name", "file", "offset", "length", "dtype", "shape", "layout", "digest"}
        <= keys
        <= _SEGMENT_KEYS
    ):
        raise ImageError(f"segments[{i}] has fields {sorted(keys)!r:.200}, expected {sorted(_SEGMENT_KEYS)}")
    name = _str(s["name"], f"segments[{i}].name", SEGMENT_NAME)
    what = f"segment {name}"
    fname = s["file"]
    if type(fname) is not str or fname not in files:
        raise ImageError(f"{what}: file {fname!r:.80} is not one of the manifest's files")
    fentry = files[fname]
    offset = _int(s["offset"], f"{what} offset", 0, MAX_FILE_BYTES)
    length = _int(s["length"], f"{what} length", 0, MAX_FILE_BYTES)
    if offset % ALIGN:
        raise ImageError(f"{what}: offset {offset} is not {ALIGN}-aligned")
    if offset + length > fentry.size:
        raise ImageError(
            f"{what}: bytes [{offset}, {offset + length}) lie outside {fname} ({fentry.size} bytes)"
        )
    dtype = s["dtype"]
    if type(dtype) is not str or dtype not in DTYPES:
        raise ImageError(f"{what}: unknown dtype {dtype!r:.40}")
    shape = _list(s["shape"], f"{what} shape", MAX_NDIM)
    for d in shape:
        _int(d, f"{what} shape dimension", 0, MAX_FILE_BYTES)
    if math.prod(shape) * DTYPES[dtype] != length:
        raise ImageError(
            f"{what}: shape {shape} of {dtype} is {math.prod(shape) * DTYPES[dtype]} bytes, length says {length}"
        )
    layout = _str(s["layout"], f"{what} layout", ID)
    dig = _str(s["digest"], f"{what} digest", HEX64)
    chunks = _list(s.get("chunks", []), f"{what} chunks", MAX_FILE_BYTES // _digest.CHUNK + 1)
    want = _digest.chunk_count(length) if length > _digest.CHUNK else 0
    if len(chunks) != want:
        raise ImageError(f"{what}: {len(chunks)} chunk digests, a {length}-byte segment has {want}")
    for c in chunks:
        _str(c, f"{what} chunk digest", HEX64)
    if chunks and _digest.combine([bytes.fromhex(c) for c in chunks], length) != dig:
        raise ImageError(f"{what}: digest does not match its chunk digests")
    tier = s.get("tier", TIER_DEVICE)
    if type(tier) is not str or tier not in TIERS:
        raise ImageError(f"{what}: tier {tier!r:.40} is not one of {', '.join(TIERS)}")
    return SegmentEntry(name, fname, offset, length, dtype, tuple(shape), layout, dig, tuple(chunks), tier)


def _check_overlaps(segments: list[SegmentEntry]) -> None:
    by_file: dict[str, list[SegmentEntry]] = {}
    for s in segments:
        if s.length:
            by_file.setdefault(s.file, []).append(s)
    for fname, segs in by_file.items():
        segs.sort(key=lambda s: s.offset)
        for a, b in itertools.pairwise(segs):
            if a.offset + a.length > b.offset:
                raise ImageError(f"segments {a.name} and {b.name} overlap in {fname}")
