"""Where prefix-cache entries live: byte-budgeted LRU tiers in memory (device, host) and on disk (digested files).

A tier stores and hands back a runner's snapshots by entry; the cache (prefix_cache.py) decides what moves
where. The disk tier writes one file per entry: magic, a blake3 digest of the entry's key and payload, the
payload's length, the payload (the runner's snapshot bytes); a file whose digest, length or form is wrong is
refused with DamagedEntry and removed, never read as a state.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import blake3

from tfc.errors import TfcError

FILE_MAGIC = b"TFCPFX1\n"
FILE_SUFFIX = ".tfcprefix"
_HEAD = struct.Struct("<8s32sQ")  # magic, digest, payload length


class PrefixCacheError(TfcError):
    """A prefix-cache tier that cannot be opened (the disk folder: missing rights, in use by another server)."""


class DamagedEntry(PrefixCacheError):
    """A stored entry that fails its digest or cannot be read back: refused, counted, dropped."""


@dataclass(eq=False)
class Entry:
    """One cached prefix: its key, its token count, the page digest it hangs off, where it lives, its pins."""

    key: bytes
    tokens: int
    parent: bytes
    tier: Any = None  # the Tier holding it (None: gone)
    pins: int = 0  # requests reading it right now: never evicted while pinned


class MemoryTier:
    """Snapshots held as objects under a byte budget, least recently used first out."""

    def __init__(self, name: str, budget: int, convert: Callable[[Any], Any] = lambda s: s) -> None:
        self.name, self.budget, self._convert = name, budget, convert
        self.used = 0
        self.damaged = 0  # entries refused as damaged: memory keeps objects, never bytes to check
        self._held: OrderedDict[bytes, tuple[Entry, Any, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._held)

    def size(self, snapshot: Any) -> int:
        """The bytes a snapshot takes here."""
        return snapshot.nbytes

    def put(self, entry: Entry, snapshot: Any) -> bool:
        """Keep a snapshot (most recently used; the caller made room); True."""
        held = self._convert(snapshot)
        self._held[entry.key] = (entry, held, held.nbytes)
        self.used += held.nbytes
        entry.tier = self
        return True

    def get(self, entry: Entry) -> Any:
        """The snapshot of an entry held here."""
        return self._held[entry.key][1]

    def touch(self, entry: Entry) -> None:
        """Mark an entry most recently used."""
        self._held.move_to_end(entry.key)

    def take(self, entry: Entry) -> Any:
        """Remove an entry; its snapshot."""
        _, held, size = self._held.pop(entry.key)
        self.used -= size
        entry.tier = None
        return held

    def oldest(self) -> list[tuple[Entry, int]]:
        """(entry, bytes) from least to most recently used."""
        return [(entry, size) for entry, _, size in self._held.values()]

    def close(self) -> None:
        """Forget every snapshot."""
        self._held.clear()
        self.used = 0


class DiskTier:
    """Snapshots as digested files in a folder this server owns while it runs (a lock file says so)."""

    name = "disk"

    def __init__(self, folder: str | Path, budget: int, load: Callable[[bytes], Any]) -> None:
        self.folder, self.budget, self._load = Path(folder), budget, load
        self.used = 0
        self.damaged = 0
        self._held: OrderedDict[bytes, tuple[Entry, int]] = OrderedDict()
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._lock = open(self.folder / ".lock", "a")  # noqa: SIM115 (held for the tier's life)
        except OSError as error:
            raise PrefixCacheError(f"{self.folder}: cannot use as the disk cache: {error.strerror}") from None
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock.close()
            raise PrefixCacheError(f"{self.folder}: another server uses this disk cache") from None
        for stale in self.folder.glob(f"*{FILE_SUFFIX}*"):  # an earlier run's entries: no index, not ours
            with contextlib.suppress(OSError):
                stale.unlink()

    def __len__(self) -> int:
        return len(self._held)

    def _path(self, entry: Entry) -> Path:
        return self.folder / f"{entry.key.hex()}{FILE_SUFFIX}"

    def size(self, snapshot: Any) -> int:
        """The bytes a snapshot's file is expected to take (its in-memory size plus the file head)."""
        return snapshot.nbytes + _HEAD.size

    def put(self, entry: Entry, snapshot: Any) -> bool:
        """Write an entry's file (False when the disk refused it: the entry is then not kept here)."""
        payload = snapshot.to_bytes()
        digest = blake3.blake3(entry.key + payload).digest()
        path = self._path(entry)
        part = path.with_name(path.name + ".part")
        try:
            with open(part, "wb") as f:
                f.write(_HEAD.pack(FILE_MAGIC, digest, len(payload)))
                f.write(payload)
            os.replace(part, path)
        except OSError:
            with contextlib.suppress(OSError):
                part.unlink()
            return False
        size = _HEAD.size + len(payload)
        self._held[entry.key] = (entry, size)
        self.used += size
        entry.tier = self
        return True

    def get(self, entry: Entry) -> Any:
        """Read, check and decode an entry's file; DamagedEntry (the entry dropped) when it does not check."""
        try:
            data = self._path(entry).read_bytes()
            magic, digest, length = _HEAD.unpack_from(data)
        except (OSError, struct.error):
            raise self._refuse(entry, "unreadable") from None
        payload = memoryview(data)[_HEAD.size :]
        if magic != FILE_MAGIC or length != len(payload):
            raise self._refuse(entry, "bad head or length")
        if blake3.blake3(entry.key + payload).digest() != digest:
            raise self._refuse(entry, "digest mismatch")
        try:
            return self._load(bytes(payload))
        except TfcError as error:
            raise self._refuse(entry, str(error)) from None

    def _refuse(self, entry: Entry, why: str) -> DamagedEntry:
        self.damaged += 1
        self.take(entry)
        return DamagedEntry(f"{self._path(entry).name}: {why}")

    def touch(self, entry: Entry) -> None:
        """Mark an entry most recently used."""
        self._held.move_to_end(entry.key)

    def take(self, entry: Entry) -> None:
        """Remove an entry and its file."""
        _, size = self._held.pop(entry.key)
        self.used -= size
        entry.tier = None
        with contextlib.suppress(OSError):
            self._path(entry).unlink()

    def oldest(self) -> list[tuple[Entry, int]]:
        """(entry, bytes) from least to most recently used."""
        return list(self._held.values())

    def close(self) -> None:
        """Remove every file and let the folder go (entries never outlive the server)."""
        for entry, _ in self.oldest():
            self.take(entry)
        with contextlib.suppress(OSError):
            fcntl.flock(self._lock, fcntl.LOCK_UN)
        self._lock.close()
