"""Before anything is uploaded: refuse a machine with less GPU memory or host memory than the image's placement
needs (the plan `tfc prepare` recorded), in one line saying what the plan assumed and what is here. The NVMe
tier is read in place from the image's own files (runtime/boot/tiers.py), which the boot opens and checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tfc.cache.contract import TIER_DEVICE, TIERS
from tfc.cache.format import RankManifest
from tfc.runtime.boot.image_open import HINT, ImageRefused

from tfc.errors import TfcError

GIB = 1 << 30
MEMINFO = "/proc/meminfo"


class NotEnoughMemory(TfcError):
    """This machine has less memory (or no NVMe folder) than the image was placed for."""


class TiersNotServed(TfcError):
    """An image placing segments off the device that this runtime does not serve from there."""


@dataclass(frozen=True)
class Machine:
    """What a rank may use here: its GPU's free and total bytes (None on the CPU), host bytes available."""

    device: str
    gpu_free: int | None
    gpu_total: int | None
    host_available: int | None  # None where /proc/meminfo cannot be read: no host check


@dataclass(frozen=True)
class Needs:
    """What an image's placement needs of a machine: this rank's GPU bytes, all ranks' host bytes, NVMe."""

    rank: int
    world: int
    device: int  # this rank's device-tier bytes
    reserve: int  # KV and overhead the plan kept free on the device
    host: int  # every rank's host-tier bytes (pinned), the world running on this machine
    device_world: int  # every rank's device-tier bytes plus reserve (what a CPU run holds in host memory)
    nvme: int  # this rank's NVMe-tier bytes
    nvme_dir: str | None
    inputs: dict | None  # the plan's inputs (None: prepared without a target, everything on the device)


def host_available(path: str = MEMINFO) -> int | None:
    """MemAvailable in bytes, or None where the file cannot be read."""
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def probe(device: str, cuda: Any = None, meminfo: str = MEMINFO) -> Machine:
    """The machine as `device` sees it (`cuda`: torch.cuda, or a stand-in)."""
    if not device.startswith("cuda"):
        return Machine(device, None, None, host_available(meminfo))
    if cuda is None:
        import torch

        cuda = torch.cuda
    index = int(device.split(":", 1)[1]) if ":" in device else cuda.current_device()
    free, total = cuda.mem_get_info(index)
    return Machine(f"cuda:{index}", int(free), int(total), host_available(meminfo))


def needs_of(m: RankManifest) -> Needs:
    """What the manifest's placement needs; a malformed placement record is refused."""
    own = dict.fromkeys(TIERS, 0)
    for seg in m.segments:
        own[seg.tier] += seg.length
    record = m.plan.get("placement")
    if record is None:  # placed without a target: every segment on the device, ranks alike
        device, world = own[TIER_DEVICE], m.world
        return Needs(m.rank, world, device, 0, own["host"] * world, device * world, own["nvme"], None, None)
    try:
        reserve = _count(record["kv_bytes"]) + _count(record["overhead_bytes"])
        ranks = record["ranks"]
        if type(ranks) is not list or len(ranks) != m.world:
            raise ValueError
        host = sum(_count(r["host"]) for r in ranks)
        device_world = sum(_count(r["device"]) + reserve for r in ranks)
        inputs = record["inputs"]
        nvme_dir = inputs["nvme_dir"]
        if type(inputs) is not dict or not (nvme_dir is None or type(nvme_dir) is str):
            raise ValueError
    except (KeyError, TypeError, ValueError):
        raise ImageRefused(f"rank {m.rank}: the manifest's placement record is malformed; {HINT}") from None
    return Needs(
        m.rank, m.world, own[TIER_DEVICE], reserve, host, device_world, own["nvme"], nvme_dir, inputs
    )


def _count(value: Any) -> int:
    if type(value) is not int or value < 0:
        raise ValueError
    return value


def check_room(m: RankManifest, machine: Machine) -> None:
    """Refuse, in one line, a machine with less than the image's placement needs."""
    need = needs_of(m)
    planned = _planned(need)
    if machine.gpu_free is not None:
        wanted = need.device + need.reserve
        if wanted > machine.gpu_free:
            raise NotEnoughMemory(
                f"rank {need.rank} needs {_gib(wanted)} of GPU memory ({_gib(need.device)} of segments on the device"
                f"{_reserve(need)}; {planned}); {machine.device} has {_gib(machine.gpu_free)} free of "
                f"{_gib(machine.gpu_total)}: prepare the image for this GPU (--gpu-memory-gib "
                f"{machine.gpu_total / GIB:.0f}) or use more GPUs (--tp)"
            )
        host = need.host
        what = f"{_gib(host)} of pinned host memory for the segments placed there, over {need.world} rank(s)"
    else:
        host = need.device_world + need.host
        what = f"{_gib(host)} of host memory to run on the CPU, over {need.world} rank(s)"
    if machine.host_available is not None and host > machine.host_available:
        raise NotEnoughMemory(
            f"rank {need.rank}: the image needs {what} ({planned}); this machine has "
            f"{_gib(machine.host_available)} available (MemAvailable): free memory, or prepare it with a "
            "--host-memory-gib this machine has (and --nvme DIR for the Engram rows)"
        )


def refuse_off_device(m: RankManifest) -> None:
    """Refuse an image that places segments in a tier this runtime does not serve them from (Engram rows from host
    memory and NVMe, expert tables from host memory: runtime/boot/tiers.py)."""
    from tfc.runtime.boot.tiers import SERVED_OFF_DEVICE

    off = [
        s for s in m.segments if s.tier != TIER_DEVICE and s.tier not in SERVED_OFF_DEVICE.get(s.layout, ())
    ]
    if off:
        nbytes = sum(s.length for s in off)
        raise TiersNotServed(
            f"rank {m.rank}: {len(off)} segment(s) ({_gib(nbytes)}, e.g. {off[0].name}) are placed in "
            f"{' and '.join(sorted({s.tier for s in off}))}; this runtime serves Engram rows (host, nvme) and "
            "expert tables (host) off the device, every other segment from the device: prepare the image again "
            "with this tfc"
        )


def _gib(nbytes: int | None) -> str:
    return "?" if nbytes is None else f"{nbytes / GIB:.1f} GiB"


def _reserve(need: Needs) -> str:
    return f" + {_gib(need.reserve)} kept free for KV and overhead" if need.reserve else ""


def _planned(need: Needs) -> str:
    """What the plan assumed, in words."""
    if need.inputs is None:
        return "prepared without --gpu-memory-gib: every segment on the device"
    gpu, host = (_size(need.inputs.get(k)) for k in ("gpu_memory_gib", "host_memory_gib"))
    host_text = "no host limit" if host is None else f"{host} GiB of host memory"
    return f"placed for a {gpu} GiB GPU and {host_text}"


def _size(value: Any) -> str | None:
    """A GiB figure from the manifest for a message (anything else reads as '?')."""
    if value is None:
        return None
    return f"{value:g}" if type(value) in (int, float) else "?"
