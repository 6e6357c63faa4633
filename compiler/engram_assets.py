"""Engram image segments: host-side hash assets and each rank's table rows in the 264-byte row format."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tfc.cache.contract import LAYOUT_ENGRAM_ASSET, LAYOUT_ENGRAM_ROWS
from tfc.compiler.engram_map import TokenMap
from tfc.compiler.segments import Zeros
from tfc.packs.deepseek_v41_contract import (
    ENGRAM_PARAMS,
    SEG_LAYER_IDS,
    SEG_MULTIPLIERS,
    SEG_OFFSETS,
    SEG_PARAMS,
    SEG_PRIMES,
    SEG_ROW_RANGES,
    SEG_SHARDS,
    SEG_TOKEN_MAP,
    engram_rows_name,
)
from tfc.packs.engram_layout import SCALE_BLOCK, EngramLayout, config_field, hash_multipliers, head_shards
from tfc.packs.errors import PackError
from tfc.packs.files import open_fd

DEFAULT_CHUNK_ROWS = 1 << 18  # 64 MiB of e4m3 bytes per read at head_dim 256


class EngramTableError(PackError):
    """Engram table files that are missing a tensor or have the wrong shape or dtype."""


@dataclass(frozen=True)
class AssetSegment:
    """A small host-side segment whose bytes the compiler decides outright."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    layout: str
    data: np.ndarray

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)


@dataclass(frozen=True)
class EngramTable:
    """One Engram layer's two stored tensors (TensorInfo of tfc.packs.safetensors_header)."""

    layer_id: int
    weight: Any
    scale: Any
    head_dim: int

    @property
    def rows(self) -> int:
        return int(self.weight.shape[0])


@dataclass(frozen=True)
class RowSegment:
    """A rank's contiguous row range [lo, hi) of one layer's table, stored in the row format."""

    name: str
    table: EngramTable
    lo: int
    hi: int

    @property
    def row_bytes(self) -> int:
        return self.table.head_dim + self.table.head_dim // SCALE_BLOCK

    @property
    def shape(self) -> tuple[int, int]:
        return (self.hi - self.lo, self.row_bytes)

    @property
    def nbytes(self) -> int:
        return (self.hi - self.lo) * self.row_bytes

    dtype = "uint8"
    layout = LAYOUT_ENGRAM_ROWS


def asset_segments(
    layout: EngramLayout, token_map: TokenMap, cfg: Any, world: int, rank: int
) -> list[AssetSegment]:
    """Every host-side Engram segment of one rank: map, multipliers, primes, offsets, shards, ranges."""
    pad = config_field(cfg, "engram_pad_token_id")
    image = _image_token_id(cfg)
    shards = head_shards(layout.n_cols, world)
    params = {
        "max_ngram": layout.max_ngram,
        "n_heads": layout.n_heads,
        "head_dim": layout.head_dim,
        "pad_id": pad,
        "compressed_vocab": token_map.size,
        "image_token_id": image,
        "world": world,
        "rank": rank,
    }
    arrays = {
        SEG_TOKEN_MAP: token_map.ids.astype("<i4"),
        SEG_MULTIPLIERS: hash_multipliers(layout.layer_ids, layout.max_ngram, token_map.size),
        SEG_PRIMES: layout.primes_array(),
        SEG_OFFSETS: layout.offsets_array(),
        SEG_PARAMS: np.array([params[name] for name in ENGRAM_PARAMS], np.int64),
        SEG_LAYER_IDS: np.asarray(layout.layer_ids, np.int64),
        SEG_SHARDS: np.array([[s.start, s.stop] for s in shards], np.int64).reshape(world, 2),
        SEG_ROW_RANGES: np.array(
            [layout.rank_rows(i, world, rank) for i in range(layout.n_layers)], np.int64
        ).reshape(layout.n_layers, 2),
    }
    out = []
    for name, arr in arrays.items():
        arr = np.ascontiguousarray(arr.astype(arr.dtype.newbyteorder("<")))
        out.append(AssetSegment(name, str(arr.dtype.name), tuple(arr.shape), LAYOUT_ENGRAM_ASSET, arr))
    return out


def _image_token_id(cfg: Any) -> int:
    """The top-level image token id (image positions are DEAD), -1 where the config has none."""
    if isinstance(cfg, Mapping):
        value = cfg.get("image_token_id", -1)
    else:
        value = getattr(cfg, "image_token_id", -1)
    return -1 if value is None else int(value)


def find_tables(tensors: Mapping[str, Any], layout: EngramLayout) -> dict[int, EngramTable] | None:
    """The validated Engram tables among `tensors` (name -> TensorInfo); None if there are none at all."""
    found: dict[int, EngramTable] = {}
    for i, layer in enumerate(layout.layer_ids):
        wname, sname = f"layers.{layer}.engram.embed.weight", f"layers.{layer}.engram.embed.scale"
        weight, scale = tensors.get(wname), tensors.get(sname)
        if weight is None and scale is None:
            continue
        if weight is None or scale is None:
            have = weight or scale
            missing = wname if weight is None else sname
            raise EngramTableError(f"{have.file}: has {have.name} but {missing} is missing")
        rows = layout.rows[i]
        _check(weight, "F8_E4M3", (rows, layout.head_dim))
        _check(scale, "F8_E8M0", (rows, layout.head_dim // SCALE_BLOCK))
        found[layer] = EngramTable(layer, weight, scale, layout.head_dim)
    if not found:
        return None
    if len(found) != layout.n_layers:
        missing = [layer for layer in layout.layer_ids if layer not in found]
        raise EngramTableError(f"Engram tables of layers {missing} are missing (found {sorted(found)})")
    return found


def _check(info: Any, dtype: str, shape: tuple[int, ...]) -> None:
    if info.dtype != dtype or tuple(info.shape) != shape:
        raise EngramTableError(
            f"{info.file}: {info.name} is {info.dtype} {list(info.shape)}, expected {dtype} {list(shape)}"
        )
    if info.nbytes != int(np.prod(shape)):
        raise EngramTableError(
            f"{info.file}: {info.name} holds {info.nbytes} bytes, expected {int(np.prod(shape))}"
        )


def table_tensors_in_dir(directory: Path) -> dict[str, Any]:
    """Engram table tensors found in the safetensors headers of a folder (e.g. --engram-dir)."""
    from tfc.packs.safetensors_header import read_header

    directory = Path(directory)
    if not directory.is_dir():
        raise EngramTableError(f"{directory}: Engram table folder does not exist")
    out: dict[str, Any] = {}
    for path in sorted(directory.glob("*.safetensors")):
        for name, info in read_header(path).tensors.items():
            if ".engram.embed." in name:
                if name in out:
                    raise EngramTableError(f"{path}: {name} is also stored in {out[name].file}")
                out[name] = info
    return out


def row_segments(
    layout: EngramLayout, tables: Mapping[int, EngramTable], world: int, rank: int
) -> list[RowSegment]:
    """The table-row segments of one rank: its contiguous row range of every Engram layer."""
    out = []
    for i, layer in enumerate(layout.layer_ids):
        lo, hi = layout.rank_rows(i, world, rank)
        out.append(RowSegment(engram_rows_name(layer), tables[layer], lo, hi))
    return out


def iter_rows(
    seg: RowSegment, chunk_rows: int = DEFAULT_CHUNK_ROWS, jobs: int = 4, holes: bool = False
) -> Iterator[tuple[int, np.ndarray | Zeros]]:
    """(byte offset in the segment, uint8 [k, row_bytes]) chunks in order; reads only the rank's rows. With
    `holes`, a chunk whose source rows are holes of sparse files comes as Zeros instead, unread."""
    spans = _spans(seg, chunk_rows)
    if not spans:
        return
    read = _read_or_skip if holes else _read_chunk
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        # a bounded window of reads in flight keeps memory at jobs+1 chunks
        pending = [pool.submit(read, seg, lo, hi) for lo, hi in spans[: jobs + 1]]
        nxt = len(pending)
        for lo, _hi in spans:
            chunk = pending.pop(0).result()
            if nxt < len(spans):
                pending.append(pool.submit(read, seg, *spans[nxt]))
                nxt += 1
            yield (lo - seg.lo) * seg.row_bytes, chunk


def fill_rows(
    seg: RowSegment,
    write: Callable[[int, memoryview], None],
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    jobs: int = 4,
    zeros: Callable[[int, int], None] | None = None,
) -> int:
    """Write a row segment through `write(rel_offset, bytes)` (e.g. ImageWriter.write); returns bytes written.
    With `zeros(rel_offset, nbytes)`, rows whose source is a hole go there instead (ImageWriter.write_zeros)."""
    total = 0
    for offset, chunk in iter_rows(seg, chunk_rows, jobs, holes=zeros is not None):
        if isinstance(chunk, Zeros):
            zeros(offset, chunk.nbytes)
            total += chunk.nbytes
        else:
            write(offset, memoryview(chunk).cast("B"))
            total += chunk.nbytes
    return total


def hole_bytes(seg: RowSegment, chunk_rows: int = DEFAULT_CHUNK_ROWS) -> int:
    """Bytes of the segment that fill_rows with `zeros` hands over as Zeros (their source rows are holes)."""
    return sum(
        (hi - lo) * seg.row_bytes for lo, hi in _spans(seg, chunk_rows) if _rows_are_holes(seg, lo, hi)
    )


def read_rows(seg: RowSegment, chunk_rows: int = DEFAULT_CHUNK_ROWS) -> np.ndarray:
    """The whole row segment in memory (tests, small tables)."""
    out = np.empty(seg.shape, np.uint8)
    for offset, chunk in iter_rows(seg, chunk_rows, jobs=1):
        start = offset // seg.row_bytes
        out[start : start + chunk.shape[0]] = chunk
    return out


def _spans(seg: RowSegment, chunk_rows: int) -> list[tuple[int, int]]:
    return [(lo, min(lo + chunk_rows, seg.hi)) for lo in range(seg.lo, seg.hi, chunk_rows)]


def _read_or_skip(seg: RowSegment, lo: int, hi: int) -> np.ndarray | Zeros:
    if _rows_are_holes(seg, lo, hi):
        return Zeros((hi - lo) * seg.row_bytes)
    return _read_chunk(seg, lo, hi)


def _rows_are_holes(seg: RowSegment, lo: int, hi: int) -> bool:
    """Whether rows lo..hi-1 of both tensors lie in holes of their files (zeros, never written)."""
    d = seg.table.head_dim
    s = d // SCALE_BLOCK
    weight, scale = seg.table.weight, seg.table.scale
    return _is_hole(weight, lo * d, (hi - lo) * d) and _is_hole(scale, lo * s, (hi - lo) * s)


def _is_hole(info: Any, rel: int, length: int) -> bool:
    """Whether a tensor's byte range holds no data: inside the file, before its next data (SEEK_DATA)."""
    seek_data = getattr(os, "SEEK_DATA", None)
    if seek_data is None:
        return False
    fd = open_fd(info.file, EngramTableError)
    try:
        start = info.offset + rel
        if start + length > os.fstat(fd).st_size:
            return False  # a short file is read, and refused, as such
        try:
            return os.lseek(fd, start, seek_data) >= start + length
        except OSError as error:
            return error.errno == errno.ENXIO  # no data after `start`
    finally:
        os.close(fd)


def _read_chunk(seg: RowSegment, lo: int, hi: int) -> np.ndarray:
    """Rows lo..hi-1 interleaved: two coalesced reads (values, scales), then one strided copy each."""
    d = seg.table.head_dim
    s = d // SCALE_BLOCK
    out = np.empty((hi - lo, d + s), np.uint8)
    out[:, :d] = _pread(seg.table.weight, lo * d, (hi - lo) * d).reshape(hi - lo, d)
    out[:, d:] = _pread(seg.table.scale, lo * s, (hi - lo) * s).reshape(hi - lo, s)
    return out


def _pread(info: Any, rel: int, length: int) -> np.ndarray:
    buf = bytearray(length)
    view = memoryview(buf)
    fd = open_fd(info.file, EngramTableError)
    try:
        done = 0
        while done < length:
            n = os.preadv(fd, [view[done:]], info.offset + rel + done)
            if n <= 0:
                raise EngramTableError(
                    f"{info.file}: {info.name} ends early (short read at byte {rel + done})"
                )
            done += n
    finally:
        os.close(fd)
    return np.frombuffer(buf, np.uint8)
