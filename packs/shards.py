"""Shard discovery (index json or *.safetensors) and the merged tensor table of a pack, from headers only."""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from tfc.packs.errors import HeaderError, MissingTensor, PackError
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


def read_index(root: Path) -> dict[str, str] | None:
    """The index's weight_map (tensor -> shard file name), or None without an index."""
    path = root / INDEX_NAME
    if not path.exists():
        return None
    try:
        if path.stat().st_size > MAX_INDEX_BYTES:
            raise HeaderError(f"{INDEX_NAME}: larger than {MAX_INDEX_BYTES} bytes")
        raw = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as error:
        raise HeaderError(f"{INDEX_NAME}: cannot read: {error.strerror or error}") from None
    except (ValueError, RecursionError) as error:
        raise HeaderError(f"{INDEX_NAME}: not valid UTF-8 JSON ({str(error)[:120]})") from None
    weight_map = raw.get("weight_map") if type(raw) is dict else None
    if type(weight_map) is not dict or any(type(v) is not str for v in weight_map.values()):
        raise HeaderError(f"{INDEX_NAME}: weight_map must map tensor names to shard file names")
    for shard in set(weight_map.values()):
        if not _plain_shard_name(shard):
            raise HeaderError(f"{INDEX_NAME}: {shard!r:.120} is not a plain *.safetensors file name")
    return weight_map


def _plain_shard_name(name: str) -> bool:
    return (
        name.endswith(SHARD_SUFFIX) and "/" not in name and "\\" not in name and "\0" not in name
        and not name.startswith(".") and len(name) <= 255
    )  # fmt: skip


def discover_shards(root: Path) -> tuple[list[Path], dict[str, str] | None]:
    """Shards in order: those the index lists (by name) then any other *.safetensors; or all, by name."""
    root = Path(root)
    weight_map = read_index(root)
    on_disk = sorted(
        e.name
        for e in os.scandir(root)
        if e.name.endswith(SHARD_SUFFIX) and _plain_shard_name(e.name) and e.is_file()
    )
    if weight_map is None:
        if not on_disk:
            raise PackError(f"{root}: no *.safetensors shards and no {INDEX_NAME}")
        return [root / name for name in on_disk], None
    listed = sorted(set(weight_map.values()))
    present = set(on_disk)
    missing = [name for name in listed if name not in present]
    if missing:
        count = sum(1 for v in weight_map.values() if v in set(missing))
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise MissingTensor(f"{INDEX_NAME} lists shard(s) that are missing: {shown} ({count} tensors)")
    extra = [name for name in on_disk if name not in set(listed)]
    return [root / name for name in listed + extra], weight_map


def check_against_index(headers: list[SafetensorsHeader], weight_map: dict[str, str]) -> None:
    """Every tensor of an indexed shard is listed for that shard, and every listed tensor is in it."""
    listed = Counter(weight_map.values())
    for h in headers:
        shard = h.path.name
        if shard not in listed:
            continue  # not in the index: its tensors are checked for duplicates when merged
        owners = list(map(weight_map.get, h.names))
        if owners.count(shard) != len(owners):
            i = next(i for i, o in enumerate(owners) if o != shard)
            where = "is not listed in the index" if owners[i] is None else f"is listed for {owners[i]}"
            raise HeaderError(f"{shard}: tensor {h.names[i]} {where}")
        if listed[shard] != len(owners):
            names = set(h.names)
            absent = [n for n, f in weight_map.items() if f == shard and n not in names]
            shown = ", ".join(absent[:5]) + (f" and {len(absent) - 5} more" if len(absent) > 5 else "")
            raise MissingTensor(f"{INDEX_NAME} lists tensor(s) for {shard} that it lacks: {shown}")


def load_table(root: Path) -> tuple[TensorTable, list[SafetensorsHeader], dict[str, str] | None]:
    """Read every shard header, check them against the index, and merge them; a tensor stored twice is refused."""
    shards, weight_map = discover_shards(root)
    headers = [read_header(p) for p in shards]
    if weight_map is not None:
        check_against_index(headers, weight_map)
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
    index = dict(zip(names, range(len(names)), strict=True))
    if len(index) != len(names):
        first: dict[str, int] = {}
        for i, name in enumerate(names):
            if name in first:
                a, b = shards[file_ids[first[name]]].name, shards[file_ids[i]].name
                raise HeaderError(f"tensor {name} is stored twice: in {a} and in {b}")
            first[name] = i
    return TensorTable(shards, names, dtypes, shapes, offsets, nbytes, file_ids, index), headers, weight_map
