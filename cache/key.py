"""Image keys: canonical-JSON digests of every input that changes an image's bytes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import blake3
from tfc.cache.errors import ImageError


def canonical_json(obj) -> bytes:
    """The one byte form of a JSON value that keys and root digests are computed over."""
    try:
        return json.dumps(
            obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
        ).encode("ascii")
    except (TypeError, ValueError) as error:
        raise ImageError(
            f"value is not plain JSON (dicts with str keys, lists, str, int, float, bool, null): {error}"
        ) from None


def image_key(inputs: dict) -> str:
    """The hex BLAKE3 digest (64 chars) of the canonical JSON of a key's inputs."""
    if not isinstance(inputs, dict):
        raise ImageError(f"key inputs must be a dict, got {type(inputs).__name__}")
    return blake3.blake3(canonical_json(inputs)).hexdigest()


def source_hash(paths: list[Path], base: Path | None = None) -> str:
    """Digest of source files' bytes, keyed by their names relative to `base` (default: their common folder).

    Independent of the order of `paths` and of where the tree is installed.
    """
    files = [Path(p).resolve() for p in paths]
    if not files:
        raise ImageError("source_hash needs at least one file")
    root = Path(base).resolve() if base is not None else Path(os.path.commonpath([f.parent for f in files]))
    named = []
    for f in files:
        try:
            rel = f.relative_to(root).as_posix()
        except ValueError:
            raise ImageError(f"source file {f} is not under {root}") from None
        named.append((rel, f))
    named.sort()
    h = blake3.blake3(b"tfc.source.v1\0")
    for rel, f in named:
        try:
            data = f.read_bytes()
        except OSError as error:
            raise ImageError(f"cannot read source file {f}: {error.strerror}") from None
        name = rel.encode()
        h.update(len(name).to_bytes(8, "little") + name + len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()
