"""What an image is, one answer for verify, load and cache ls: its rank folders, each manifest's fit to them."""

from __future__ import annotations

import importlib
import os
import re
import stat
from pathlib import Path

from tfc.cache.contract import (
    LAYOUT_ENGRAM_ASSET,
    LAYOUT_ENGRAM_ROWS,
    LAYOUT_RAGGED,
    LAYOUT_SCALES,
    LAYOUT_STACK,
    LAYOUT_TABLE_INDEX,
    LAYOUT_TOKENIZER,
    LAYOUT_TRELLIS,
    LAYOUTS,
)
from tfc.cache.errors import ImageError
from tfc.cache.format import MANIFEST_NAME, RankManifest
from tfc.cache.key import image_key

from tfc.errors import TfcError

RANK_DIR = re.compile(r"rank(\d{1,4})")
WORLD_DIR = re.compile(r"[0-9a-f]{16}")

# layout -> (element dtypes, numbers of dimensions) of every segment in it; a native.v1 array may be anything.
LAYOUT_SHAPES: dict[str, tuple[frozenset[str], tuple[int, ...]]] = {
    LAYOUT_TRELLIS: (frozenset({"int16"}), (3,)),
    LAYOUT_STACK: (frozenset({"int16"}), (4,)),
    LAYOUT_RAGGED: (frozenset({"uint8"}), (1,)),
    LAYOUT_TABLE_INDEX: (frozenset({"int32", "int64"}), (1,)),
    LAYOUT_SCALES: (frozenset({"float16"}), (1, 2)),
    LAYOUT_ENGRAM_ROWS: (frozenset({"uint8"}), (2,)),
    LAYOUT_ENGRAM_ASSET: (frozenset({"int32", "int64"}), (1, 2)),
    LAYOUT_TOKENIZER: (frozenset({"uint8"}), (1,)),
}


# family -> the family's stdlib-only module whose expected_segments(config, world, rank, attrs, names) states
# every segment's dtype and shape from the config and plan a manifest records
FAMILY_SEGMENTS = {"deepseek_v41": "tfc.packs.deepseek_v41_image"}


def rank_folders(path: Path) -> tuple[bool, dict[int | None, Path]]:
    """(is_world, {rank: folder}) for a world folder or a single rank folder (links listed, for refusal)."""
    path = Path(path)
    if not path.exists():
        raise ImageError(f"{path}: no such image")
    m = RANK_DIR.fullmatch(path.name)
    if (path / MANIFEST_NAME).exists() or m:
        return False, {int(m.group(1)) if m else None: path}
    if not path.is_dir():
        raise ImageError(f"{path}: not an image folder")
    ranks = {}
    for entry in os.scandir(path):
        rm = RANK_DIR.fullmatch(entry.name)
        if rm and (entry.is_dir(follow_symlinks=False) or entry.is_symlink()):
            ranks[int(rm.group(1))] = Path(entry.path)
    if not ranks:
        raise ImageError(f"{path}: not an image (no manifest.json and no rank folders)")
    return True, dict(sorted(ranks.items()))


def check_rank_folder(folder: Path) -> None:
    """Refuse a rank folder that is a symbolic link (the writer never makes one) before reading from it."""
    if not RANK_DIR.fullmatch(folder.name):
        return  # a path the user named: theirs to point anywhere
    try:
        mode = os.lstat(folder).st_mode
    except OSError as error:
        raise ImageError(f"{folder}: cannot read the rank folder: {error.strerror}") from None
    if stat.S_ISLNK(mode):
        raise ImageError(
            f"{folder}: the rank folder is a symlink (refused: an image's folders are never links)"
        )
    if not stat.S_ISDIR(mode):
        raise ImageError(f"{folder}: the rank folder is not a folder")


def check_rank(m: RankManifest, folder: Path) -> None:
    """Refuse, in one line, a manifest outside its folder, with keys that do not match, or off the layout contract."""
    where = str(folder)
    named = RANK_DIR.fullmatch(folder.name)
    if named and int(named.group(1)) != m.rank:
        _refuse(where, f"the manifest is for rank {m.rank} of {m.world}, but sits in {folder.name}")
    if WORLD_DIR.fullmatch(folder.parent.name) and folder.parent.name != m.world_key[:16]:
        _refuse(where, f"world key {m.world_key[:16]}… does not match its folder {folder.parent.name}")
    if m.world != m.key_inputs.get("world", m.world):
        _refuse(
            where,
            f"the manifest says world {m.world}, its key inputs world {m.key_inputs.get('world')!r:.20}",
        )
    if image_key(m.key_inputs) != m.world_key:
        _refuse(where, "the world key is not the digest of the recorded key inputs")
    if image_key({"world_key": m.world_key, "rank": m.rank}) != m.key:
        _refuse(where, "the rank key does not match its world key and rank")
    if not m.segments:
        _refuse(where, "the manifest lists no segments")
    for s in m.segments:
        if s.layout not in LAYOUTS:
            _refuse(where, f"segment {s.name} has layout {s.layout!r}, which this tfc does not know")
        rule = LAYOUT_SHAPES.get(s.layout)
        if rule is not None and (s.dtype not in rule[0] or len(s.shape) not in rule[1]):
            dims = " or ".join(map(str, rule[1]))
            _refuse(
                where,
                f"segment {s.name} is {s.dtype}{list(s.shape)}, but {s.layout} holds "
                f"{'/'.join(sorted(rule[0]))} with {dims} dimension(s)",
            )
    check_segments(m, where)


def check_segments(m: RankManifest, where: str) -> None:
    """Refuse a segment whose dtype or shape is not the one its family states (a retyped or reshaped record)."""
    module = FAMILY_SEGMENTS.get(m.family)
    config = m.meta.get("pack_config")
    if module is None or config is None:
        return  # no family or no model config to state them from: no runtime builds a model of it either
    try:
        expected = importlib.import_module(module).expected_segments(
            config, m.world, m.rank, m.plan.get("attrs", {}), m.segment_map
        )
    except TfcError as error:
        raise ImageError(
            f"{where}: its segments cannot be checked against its config and plan: {error}"
        ) from None
    for s in m.segments:
        if s.name not in expected:
            _refuse(where, f"segment {s.name} is not one a {m.family} image holds")
        dtype, shapes = expected[s.name]
        if (dtype is not None and s.dtype != dtype) or not any(_fits(s.shape, shape) for shape in shapes):
            want = " or ".join(f"{dtype or s.dtype}{_dims(shape)}" for shape in shapes)
            _refuse(where, f"segment {s.name}: expected {want}, found {s.dtype}{_dims(s.shape)}")


def _fits(shape: tuple[int, ...], want: tuple[int | None, ...]) -> bool:
    return len(shape) == len(want) and all(w is None or w == x for x, w in zip(shape, want, strict=True))


def _dims(shape: tuple) -> str:
    return "[" + ", ".join("*" if d is None else str(d) for d in shape) + "]"


def _refuse(where: str, why: str) -> None:
    raise ImageError(f"{where}: {why}")
