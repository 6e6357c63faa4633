"""A rank's segments off the device, placed as the image's plan says: the host tier read into host memory
(page-locked on a GPU machine, so it is never paged out and a copy from it needs no bounce), the NVMe tier left
in the image's own files and read in place, record by record, when a step wants it.

Which off-device segments the runtime serves is decided by layout here: Engram rows from host memory or NVMe,
cold expert tables from host memory, which the GPU maps and its MoE kernels read over PCIe in place; the boot
refuses any other segment placed off the device in one line before anything is allocated
(placement_check.refuse_off_device).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tfc.cache.contract import LAYOUT_ENGRAM_ROWS, LAYOUT_RAGGED, LAYOUT_STACK, TIER_DEVICE
from tfc.cache.format import RankManifest
from tfc.runtime.boot.arena import DeviceArena, UploadItem, plan_arena
from tfc.runtime.records.reader import RecordConfig, RecordFile
from tfc.runtime.records.source import FileRecords, RecordSource, TableRecords

HOST, NVME = "host", "nvme"
PIN_HINT = "check the memlock limit (ulimit -l) or prepare with a smaller --host-memory-gib"
# layout -> the tiers off the device this runtime serves segments of that layout from
SERVED_OFF_DEVICE = {LAYOUT_ENGRAM_ROWS: (HOST, NVME), LAYOUT_STACK: (HOST,), LAYOUT_RAGGED: (HOST,)}


def device_items(items: list[UploadItem], m: RankManifest) -> list[UploadItem]:
    """The upload items of the device tier (what the arena holds)."""
    tiers = {s.name: s.tier for s in m.segments}
    return [i for i in items if tiers[i.name] == TIER_DEVICE]


@dataclass
class OffDevice:
    """The rank's host-tier segments (one host arena, and the same as the device addresses it) and its
    NVMe-tier segments (their files, opened)."""

    host: DeviceArena | None = None
    # the host arena's views as the device addresses them (the host arena itself on the CPU)
    mapped: DeviceArena | None = None
    files: dict[str, FileRecords] = field(default_factory=dict)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    pinned: bool = False
    _unpin: Callable[[], None] | None = None

    def tier(self, name: str) -> str:
        """A segment's tier."""
        if self.host is not None and name in self.host:
            return HOST
        return NVME if name in self.files else TIER_DEVICE

    def source(self, name: str) -> RecordSource | None:
        """The records of an off-device segment (its first dimension), None for a device-tier one."""
        if name in self.files:
            return self.files[name]
        if self.host is None or name not in self.host:
            return None
        rows = self.shapes[name][0]
        table = self.host.raw(name).numpy().reshape(rows, -1)
        return TableRecords(table, f"host tier {name}")

    def view(self, name: str, dtype: str, shape: tuple[int, ...]) -> Any:
        """A host-tier segment as a typed tensor the device reads in place (over PCIe on a GPU)."""
        if self.mapped is None:
            raise KeyError(name)
        return self.mapped.view(name, dtype, shape)

    def __contains__(self, name: str) -> bool:
        return self.host is not None and name in self.host

    @property
    def host_bytes(self) -> int:
        """Bytes held in host memory."""
        return 0 if self.host is None else self.host.nbytes

    def note(self) -> str:
        """The tiers in a phase note."""
        parts = []
        if self.host is not None:
            pinned = "pinned" if self.pinned else "plain"
            parts.append(
                f"{len(self.host.names())} segment(s), {self.host.nbytes:,} bytes in {pinned} host memory"
            )
        if self.files:
            methods = sorted({f.file.method for f in self.files.values()})
            notes = sorted({n for f in self.files.values() for n in f.file.notes})
            parts.append(f"{len(self.files)} read in place ({'; '.join(methods + notes)})")
        return "; ".join(parts) or "every segment on the device"

    def release(self) -> None:
        """Close the NVMe files, unpin and drop the host tier."""
        for f in self.files.values():
            f.close()
        self.files.clear()
        if self._unpin is not None:
            self._unpin()
            self._unpin = None
        self.mapped = None
        if self.host is not None:
            self.host.release()
            self.host = None


def place_off_device(opened: Any, device: str, config: RecordConfig = RecordConfig(),
                     threads: int | None = None) -> OffDevice:  # fmt: skip
    """Read the host tier into host memory (page-locked when `device` is a GPU); open the NVMe tier's files
    (RecordReadError, one line, for a file that cannot serve its records)."""
    m = opened.manifest
    off = OffDevice(shapes={s.name: tuple(s.shape) for s in m.segments if s.tier != TIER_DEVICE})
    try:
        for s in m.segments:
            if s.tier == NVME:
                record = s.length // max(1, s.shape[0])
                off.files[s.name] = FileRecords(RecordFile(opened.path / s.file, s.offset, s.length, record, config),
                                                config)  # fmt: skip
        host = [
            UploadItem(s.name, opened.path / s.file, s.offset, s.length) for s in m.segments if s.tier == HOST
        ]
        if host:
            from tfc.runtime.boot.upload import upload

            off.host = DeviceArena(plan_arena(host), "cpu")
            upload(off.host, "host", threads=threads)
            off.mapped = off.host
            if device.startswith("cuda"):
                off._unpin = _pin(off.host)
                off.pinned = True
                off.mapped = _map(off.host, device)
    except BaseException:
        off.release()
        raise
    return off


def _pin(arena: DeviceArena) -> Callable[[], None]:
    """Page-lock and map every chunk of a host arena (cudaHostRegister); the call that unlocks them."""
    from tfc.runtime.boot.mapped import REGISTER_MAPPED
    from tfc.runtime.boot.upload_files import REGISTER_PORTABLE, Registrar

    reg, done = Registrar(), []
    try:
        for chunk in arena.chunks:
            reg.register(
                chunk.data_ptr(), chunk.numel(), REGISTER_PORTABLE | REGISTER_MAPPED, "host tier", PIN_HINT
            )
            done.append(chunk.data_ptr())
    except BaseException:
        for ptr in done:
            reg.unregister(ptr)
        raise

    def unpin() -> None:
        for ptr in done:
            reg.unregister(ptr)

    return unpin


def _map(arena: DeviceArena, device: str) -> DeviceArena:
    """The page-locked host arena's segments as views the device reads in place."""
    from tfc.runtime.boot.mapped import device_alias

    return DeviceArena.over(arena.plan, [device_alias(chunk, device) for chunk in arena.chunks])
