"""Shard discovery (index json or *.safetensors) and the merged tensor table of a pack, from headers only."""

from __future__ import annotations

import json
import os
import re
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path

from tfc.packs.errors import HeaderError, MissingTensor, PackError
from tfc.packs.files import read_bytes
from tfc.packs.safetensors_header import SafetensorsHeader, TensorInfo, read_header

INDEX_NAME = "model.safetensors.index.json"
MAX_INDEX_BYTES = 256 << 20
SHARD_SUFFIX = ".safetensors"


@dataclass
class TensorTable:
    """Every stored tensor of a pack as parallel columns; `index` maps a name to its row."""

    files: list[Path]
    names: list[str]
    dtypes: list[str]
    shapes: list[tuple[int, ...]]
    offsets: list[int]
    nbytes: list[int]
    file_ids: list[int]
    index: dict[str, int]

    def where(self, i: int) -> str:
        """'<file>: <tensor>' for error messages."""
        return f"{self.files[self.file_ids[i]].name}: {self.names[i]}"

    def info(self, i: int) -> TensorInfo:
        """The public record of row i."""
        return TensorInfo(
            self.names[i],
            self.dtypes[i],
            self.shapes[i],
            self.files[self.file_ids[i]],
            self.offsets[i],
            self.nbytes[i],
        )


@dataclass(frozen=True)
class ShardIndex:
    """model.safetensors.index.json's weight_map as parallel lists (tensor name, shard file name)."""

    names: list[str]
    shards: list[str]

    @property
    def weight_map(self) -> dict[str, str]:
        """Tensor name -> shard file name."""
        return dict(zip(self.names, self.shards, strict=True))


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_COLON = re.compile(r"\s*:\s*")
_COMMA = re.compile(r"\s*,\s*")
_OPEN = re.compile(r"\s*:\s*\{\s*")
_CLOSE = re.compile(r"\s*\}\s*\}\s*")


def read_index(root: Path) -> ShardIndex | None:
    """The index's weight_map, or None without an index; shard names must be plain *.safetensors names."""
    path = root / INDEX_NAME
    if not os.path.lexists(path):
        return None
    try:
        text = read_bytes(path, MAX_INDEX_BYTES, HeaderError).decode("utf-8")
    except ValueError as error:
        raise HeaderError(f"{INDEX_NAME}: not UTF-8 ({str(error)[:120]})") from None
    index = _fast_index(text) or _strict_index(text)
    for shard in set(index.shards):
        if not _plain_shard_name(shard):
            raise HeaderError(f"{INDEX_NAME}: {shard!r:.120} is not a plain *.safetensors file name")
    return index


def _fast_index(text: str) -> ShardIndex | None:
    """Split an escape-free index at its quotes (each string is one piece); None: take the json path."""
    if "\\" in text:
        return None
    pieces = text.split('"')
    try:
        at = pieces.index("weight_map")
    except ValueError:
        return None
    body = pieces[at + 1 :]
    if at % 2 == 0 or len(body) < 5 or (len(body) - 1) % 4 or not _OPEN.fullmatch(body[0]):
        return None
    names, shards = body[1::4], body[3::4]
    if (
        not all(_COLON.fullmatch(c) for c in set(body[2::4])) or not all(_COMMA.fullmatch(c) for c in set(body[4:-1:4]))
        or not _CLOSE.fullmatch(body[-1])
    ):  # fmt: skip
        return None  # names are checked against the stored ones, uniqueness included, by check_index
    try:  # what comes before the weight_map key must be valid JSON members (metadata)
        head = json.loads('"'.join(pieces[:at]) + '"weight_map":{}}', object_pairs_hook=_unique)
    except (ValueError, RecursionError):
        return None
    return ShardIndex(names, shards) if head.get("weight_map") == {} else None


def _unique(pairs: list) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError("duplicate key")
    return out


def _strict_index(text: str) -> ShardIndex:
    try:
        raw = json.loads(text, object_pairs_hook=_unique)
    except (ValueError, RecursionError) as error:
        raise HeaderError(f"{INDEX_NAME}: not valid JSON ({str(error)[:120]})") from None
    weight_map = raw.get("weight_map") if type(raw) is dict else None
    if type(weight_map) is not dict or not set(map(type, weight_map.values())) <= {str}:
        raise HeaderError(f"{INDEX_NAME}: weight_map must map tensor names to shard file names")
    if any(_CONTROL.search(name) for name in weight_map):
        raise HeaderError(f"{INDEX_NAME}: a tensor name holds a control character")
    return ShardIndex(list(weight_map), list(weight_map.values()))


def _plain_shard_name(name: str) -> bool:
    return (
        name.endswith(SHARD_SUFFIX) and "/" not in name and "\\" not in name and not _CONTROL.search(name)
        and not name.startswith(".") and len(name) <= 255
    )  # fmt: skip


def list_shards(root: Path) -> list[Path]:
    """Every plain *.safetensors file of the pack, by name."""
    on_disk = sorted(  # anything but a folder: read_header refuses a pipe or a device by name
        e.name
        for e in os.scandir(root)
        if e.name.endswith(SHARD_SUFFIX) and _plain_shard_name(e.name) and not e.is_dir()
    )
    if not on_disk:
        raise PackError(f"{root}: no *.safetensors shards")
    return [Path(root) / name for name in on_disk]


def check_listed(index: ShardIndex | None, shards: list[Path]) -> None:
    """Every shard the index lists must exist."""
    if index is None:
        return
    present = {p.name for p in shards}
    missing = sorted(name for name in set(index.shards) if name not in present)
    if missing:
        count = sum(1 for v in index.shards if v in set(missing))
        raise MissingTensor(
            f"{INDEX_NAME} lists shard(s) that are missing: {_few(missing)} ({count} tensors)"
        )


def discover_shards(root: Path) -> tuple[list[Path], ShardIndex | None]:
    """Every *.safetensors of the pack by name, and the index; a shard the index lists must exist."""
    index = read_index(Path(root))
    shards = list_shards(Path(root))
    check_listed(index, shards)
    return shards, index


def _few(items: list[str], shown: int = 5) -> str:
    """The first few items on one line (names from files may hold anything: control characters escaped)."""
    text = ", ".join(i if i.isprintable() else repr(i) for i in items[:shown])
    return text + (f" and {len(items) - shown} more" if len(items) > shown else "")


def check_index(table: TensorTable, index: ShardIndex) -> None:
    """Each listed tensor is stored in the shard the index names; each tensor of a listed shard is listed."""
    file_names = [f.name for f in table.files]
    listed = set(index.shards)
    ranges = _file_ranges(table.file_ids)
    if len(listed) == len(file_names):  # the usual case: the index lists every shard, in storage order
        expected_shards: list[str] = []
        for name, (start, stop) in zip(file_names, ranges, strict=True):
            expected_shards += [name] * (stop - start)
        if index.names == table.names and index.shards == expected_shards:
            return
    rows = list(map(table.index.get, index.names))
    if None not in rows and len(set(rows)) != len(rows):
        raise HeaderError(f"{INDEX_NAME} lists a tensor twice")
    if None in rows:
        absent = [n for n, r in zip(index.names, rows, strict=True) if r is None]
        shard = index.shards[rows.index(None)]
        raise MissingTensor(
            f"{INDEX_NAME} lists tensor(s) that no shard holds: {_few(absent)} (e.g. for {shard})"
        )
    stored_in = list(map(file_names.__getitem__, map(table.file_ids.__getitem__, rows)))
    if stored_in != index.shards:
        j = next(j for j, (a, b) in enumerate(zip(stored_in, index.shards, strict=True)) if a != b)
        raise MissingTensor(
            f"{INDEX_NAME} lists {_few([index.names[j]])} for {index.shards[j]}, which lacks it (it is in {stored_in[j]})"
        )
    listed_ids = {file_names.index(name) for name in listed}
    if sum(ranges[f][1] - ranges[f][0] for f in listed_ids) != len(rows):
        names = set(index.names)
        unlisted = [
            table.where(i)
            for i, f in enumerate(table.file_ids)
            if f in listed_ids and table.names[i] not in names
        ]
        raise HeaderError(f"tensor(s) not listed in {INDEX_NAME}: {_few(unlisted)}")


def _file_ranges(file_ids: list[int]) -> list[tuple[int, int]]:
    """Row range of each file (rows are stored file by file)."""
    if not file_ids:
        return []
    ranges, start = [], 0
    for fid in range(file_ids[-1] + 1):
        stop = bisect_right(file_ids, fid, lo=start)
        ranges.append((start, stop))
        start = stop
    return ranges


def load_table(root: Path) -> tuple[TensorTable, list[SafetensorsHeader], ShardIndex | None]:
    """Read every shard header, merge them (a tensor stored twice is refused) and check them against the index."""
    shards, index = discover_shards(Path(root))
    headers = [read_header(p) for p in shards]
    names: list[str] = []
    dtypes: list[str] = []
    shapes: list[tuple[int, ...]] = []
    offsets: list[int] = []
    nbytes: list[int] = []
    file_ids: list[int] = []
    for fid, h in enumerate(headers):
        names += h.names
        dtypes += h.dtypes
        shapes += h.shapes
        offsets += h.offsets
        nbytes += h.nbytes
        file_ids += [fid] * len(h.names)
    rows = dict(zip(names, range(len(names)), strict=True))
    if len(rows) != len(names):
        first: dict[str, int] = {}
        for i, name in enumerate(names):
            if name in first:
                a, b = shards[file_ids[first[name]]].name, shards[file_ids[i]].name
                raise HeaderError(f"tensor {name} is stored twice: in {a} and in {b}")
            first[name] = i
    table = TensorTable(shards, names, dtypes, shapes, offsets, nbytes, file_ids, rows)
    if index is not None:
        check_index(table, index)
    return table, headers, index
