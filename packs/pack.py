"""Open a DeepSeek-V4.1 EXL3 pack from its headers: config, shards, EXL3 groups, natives and coverage."""

from __future__ import annotations

import gc
import os
import sys
from array import array
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from itertools import groupby
from operator import itemgetter
from pathlib import Path

from tfc.packs import exl3_groups as eg
from tfc.packs.deepseek_v41_config import DeepseekV41Config, load_config
from tfc.packs.deepseek_v41_contract import FAMILY
from tfc.packs.deepseek_v41_names import Expected, NativeSpec, expected_tensors, is_ignored
from tfc.packs.errors import CoverageError, HeaderError, MissingTensor, PackError
from tfc.packs.exl3_groups import Exl3Group, KindRecord
from tfc.packs.files import open_fd
from tfc.packs.safetensors_header import SafetensorsHeader, TensorInfo
from tfc.packs.shards import ShardIndex, TensorTable, load_table

CONFIG_NAME = "config.json"
TOKENIZER_NAME = "tokenizer.json"
NUMPY_DTYPES = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "F8_E4M3": "u1", "F8_E5M2": "u1", "F8_E8M0": "u1",
    "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?",
}  # fmt: skip
_MERGE_GAP = 64 << 10  # marker reads closer than this share one read
_SHOWN = 8
_WORDS = array("I").itemsize == 4


@dataclass(frozen=True, eq=False)
class Pack:
    """An opened, fully validated pack; tensors, groups and natives are built on first use."""

    root: Path
    config: DeepseekV41Config
    shards: list[Path]
    tokenizer_path: Path | None
    config_path: Path
    ignored: list[str]
    dspark: dict[str, str]  # DSpark suffix -> stored name in use ("the latest mtp.i holding it")
    table: TensorTable = field(repr=False)
    records: list[KindRecord] = field(repr=False)
    native_rows: dict[str, int] = field(repr=False)
    native_specs: dict[str, NativeSpec] = field(repr=False)
    siblings: dict[str, dict[str, int]] = field(repr=False)
    headers: list[SafetensorsHeader] = field(repr=False)
    index: ShardIndex | None = field(repr=False, default=None)

    @property
    def family(self) -> str:
        """The model family this pack's images are planned and served as."""
        return FAMILY

    @cached_property
    def tensors(self) -> dict[str, TensorInfo]:
        """Every stored tensor by name."""
        info = self.table.info
        return {name: info(i) for i, name in enumerate(self.table.names)}

    @cached_property
    def natives(self) -> dict[str, TensorInfo]:
        """Native (non-EXL3) tensors in use, by name."""
        info = self.table.info
        return {name: info(i) for name, i in self.native_rows.items()}

    @cached_property
    def groups(self) -> dict[str, Exl3Group]:
        """EXL3 linears by base name (e.g. "layers.3.ffn.experts.17.w2", "head")."""
        info, sib = self.table.info, self.siblings
        out: dict[str, Exl3Group] = {}
        for rec in self.records:
            spec = rec.spec
            for j, name in enumerate(spec.names):
                cb = rec.codebooks[j]
                suh, svh = rec.suh[j], rec.svh[j]
                out[name] = Exl3Group(
                    name, spec.k, spec.n, rec.widths[j], rec.widths[j] / 16, cb, info(rec.trellis[j]),
                    None if suh is None else info(suh), None if svh is None else info(svh),
                    _opt(info, sib["su"], name), _opt(info, sib["sv"], name), _opt(info, sib["bias"], name),
                    None if (m := rec.marker(j)) is None else info(m), spec.kind, spec.block,
                )  # fmt: skip
        return out


def _opt(info, rows: dict[str, int], name: str) -> TensorInfo | None:
    i = rows.get(name)
    return None if i is None else info(i)


@contextmanager
def _gc_paused():
    """Headers become ~10^6 acyclic objects; pausing the cycle collector meanwhile halves the time."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def open_pack(path: Path | str, *, check_markers: bool = True) -> Pack:
    """Read a pack's config and headers, and refuse it unless every tensor is planned or ignored."""
    with _gc_paused():
        return _open(Path(path), check_markers)


def _open(root: Path, check_markers: bool) -> Pack:
    if not root.is_dir():
        raise PackError(f"{root}: not a directory")
    config_path = root / CONFIG_NAME
    if not os.path.lexists(config_path):
        raise PackError(f"{root}: no {CONFIG_NAME}")
    config = load_config(config_path)
    table, headers, index = load_table(root)
    groups = sum(3 * config.num_experts(b) + 8 for b in range(config.num_blocks))
    if groups > len(table.names):  # each group is at least a trellis: this pack cannot be complete
        raise MissingTensor(
            f"config.json needs at least {groups:,} tensors; the pack stores {len(table.names):,}"
        )
    expected = expected_tensors(config, table.index)
    markers = (
        tuple(  # a marker kind no header mentions needs no lookups (escaped JSON may spell it otherwise)
            m
            for m in ("mcg", "mul1")
            if any(f'.{m}"'.encode() in h.header_bytes or b"\\" in h.header_bytes for h in headers)
        )
    )
    records = [eg.lookup_kind(table, spec, markers) for spec in expected.groups]
    native_rows, native_specs, missing = _natives(table, expected)
    columns = [col for rec in records for col in (rec.trellis, rec.suh, rec.svh, rec.mcg, rec.mul1)]
    planned = len(native_rows) + sum(
        len(col) - col.count(None) for col in columns
    )  # distinct names: distinct rows
    siblings: dict[str, dict[str, int]] = {s: {} for s in eg.SIBLINGS}
    ignored: list[str] = []
    unknown: list[int] = []
    if planned != len(table.names):  # something is left over: sort it out
        used = set(native_rows.values()).union(*columns)
        group_dims = {b: (r.spec.k, r.spec.n) for r in records for b in r.spec.names}
        siblings, ignored, unknown = _classify(table, used, group_dims, expected)
        eg.check_siblings(table, siblings, group_dims)
    missing += _missing_groups(records, siblings)
    _refuse(table, unknown, missing)
    for rec in records:
        eg.validate_kind(table, rec, siblings)
    _check_natives(table, native_rows, native_specs)
    if check_markers:
        eg.check_marker_values(table, records, lambda rows: read_u32(table, rows))
    tokenizer = root / TOKENIZER_NAME
    if os.path.lexists(tokenizer):  # present but a pipe, a device or a dangling link: refused here, by name
        os.close(open_fd(tokenizer))
    return Pack(
        root=root, config=config, shards=table.files,
        tokenizer_path=tokenizer if os.path.lexists(tokenizer) else None,
        config_path=config_path, ignored=ignored, dspark=expected.dspark, table=table, records=records,
        native_rows=native_rows, native_specs=native_specs, siblings=siblings, headers=headers, index=index,
    )  # fmt: skip


def _natives(
    table: TensorTable, expected: Expected
) -> tuple[dict[str, int], dict[str, NativeSpec], list[str]]:
    rows: dict[str, int] = {}
    specs: dict[str, NativeSpec] = {}
    missing: list[str] = []
    for spec in expected.natives:
        i = table.index.get(spec.name)
        if i is not None:
            rows[spec.name], specs[spec.name] = i, spec
        elif not spec.optional:
            missing.append(spec.name)
    return rows, specs, missing


def _classify(table: TensorTable, used: set, group_dims: dict, expected: Expected):
    """Sort leftover rows into group siblings, ignored names and unknown rows."""
    siblings: dict[str, dict[str, int]] = {s: {} for s in eg.SIBLINGS}
    ignored: list[str] = []
    unknown: list[int] = []
    superseded = set(expected.superseded)
    names = table.names
    for i in sorted(set(range(len(names))) - used):
        name = names[i]
        base, _, suffix = name.rpartition(".")
        if base in group_dims:
            if suffix in siblings:
                siblings[suffix][base] = i
                continue
            if suffix == "weight":  # a bf16 twin of an EXL3 group
                ignored.append(name)
                continue
        if name in superseded or is_ignored(name):
            ignored.append(name)
        else:
            unknown.append(i)
    return siblings, sorted(ignored), unknown


def _missing_groups(records: list[KindRecord], siblings: dict[str, dict[str, int]]) -> list[str]:
    missing: list[str] = []
    for rec in records:
        names = rec.spec.names
        for col, suffix, legacy in (
            (rec.trellis, "trellis", None),
            (rec.suh, "suh", "su"),
            (rec.svh, "svh", "sv"),
        ):
            if None in col:
                alt = siblings[legacy] if legacy else {}
                missing += [
                    f"{names[j]}.{suffix}" for j, i in enumerate(col) if i is None and names[j] not in alt
                ]
    return missing


def _refuse(table: TensorTable, unknown: list[int], missing: list[str]) -> None:
    if unknown:
        shown = ", ".join(table.where(i) for i in unknown[:_SHOWN])
        more = f" and {len(unknown) - _SHOWN} more" if len(unknown) > _SHOWN else ""
        also = f"; {len(missing)} expected tensor(s) are missing, e.g. {missing[0]}" if missing else ""
        raise CoverageError(
            f"{len(unknown)} stored tensor(s) are neither planned nor ignored: {shown}{more}{also}"
        )
    if missing:
        more = f" (and {len(missing) - 1} more missing)" if len(missing) > 1 else ""
        block = missing[0].split(".")[:2] if missing[0].startswith(("layers.", "mtp.")) else ["model level"]
        raise MissingTensor(f"{missing[0]} is missing (block {'.'.join(block)}){more}")


def _check_natives(table: TensorTable, rows: dict[str, int], specs: dict[str, NativeSpec]) -> None:
    for name, i in rows.items():
        spec = specs[name]
        if table.dtypes[i] not in spec.dtypes or table.shapes[i] not in spec.shapes:
            want = " or ".join(str(list(s)) for s in spec.shapes)
            raise HeaderError(
                f"{table.where(i)}: {table.dtypes[i]} {list(table.shapes[i])}, expected {want} in {'/'.join(sorted(spec.dtypes))}"
            )


def read_u32(table: TensorTable, rows: list[int]) -> tuple[list[int], list[int]]:
    """Little-endian uint32 values of 4-byte tensors as (rows, values) in file order; nearby ones share a read."""
    keys = sorted(
        zip(map(table.file_ids.__getitem__, rows), map(table.offsets.__getitem__, rows), rows, strict=True)
    )
    out_rows: list[int] = []
    values: list[int] = []
    for fid, members in groupby(keys, key=itemgetter(0)):
        members = list(members)
        runs, start = [], 0
        for j in range(1, len(members)):
            if members[j][1] - members[j - 1][1] > _MERGE_GAP:
                runs.append(members[start:j])
                start = j
        runs.append(members[start:])
        fd = open_fd(table.files[fid], HeaderError)
        try:
            for run in runs:
                lo, hi = run[0][1], run[-1][1] + 4
                buf = os.pread(fd, hi - lo, lo)
                if len(buf) != hi - lo:
                    raise HeaderError(f"{table.where(run[-1][2])}: file ends before this tensor's payload")
                out_rows += [m[2] for m in run]
                if _WORDS and hi - lo == 4 * len(run):  # back to back: one conversion for the whole run
                    words = array("I", buf)
                    if sys.byteorder == "big":
                        words.byteswap()
                    values += words.tolist()
                else:
                    values += [int.from_bytes(buf[m[1] - lo : m[1] - lo + 4], "little") for m in run]
        finally:
            os.close(fd)
    return out_rows, values


def read_tensor(info: TensorInfo, as_float: bool = False):
    """A tensor's payload as a numpy array (BF16 as a uint16 view unless as_float; F8 as uint8)."""
    import numpy as np

    out = np.empty(info.nbytes, dtype=np.uint8)
    with os.fdopen(open_fd(info.file, HeaderError), "rb") as f:
        f.seek(info.offset)
        got = f.readinto(memoryview(out))
    if got != info.nbytes:
        raise HeaderError(f"{info.file.name}: {info.name}: file ends before this tensor's payload")
    arr = out.view(NUMPY_DTYPES[info.dtype]).reshape(info.shape)
    if as_float and info.dtype == "BF16":
        return (arr.astype(np.uint32) << 16).view(np.float32)
    return arr
