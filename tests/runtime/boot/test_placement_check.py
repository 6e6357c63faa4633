"""The boot refuses, before anything is uploaded, a machine with less than an image's placement needs: GPU memory
(torch.cuda.mem_get_info, faked here), host memory (MemAvailable), the NVMe folder; one line each."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from support.fakes import FakeCuda
from tfc.cache.key import image_key
from tfc.cache.writer import ImageWriter
from tfc.runtime.boot import placement_check as pc
from tfc.runtime.boot import rank as boot_rank
from tfc.runtime.boot.image_open import ImageRefused

GIB = 1 << 30


def _placement(ranks, gpu=141, host=None, nvme=None, kv=GIB, overhead=6 * GIB) -> dict:
    inputs = {"gpu_memory_gib": gpu, "host_memory_gib": host, "nvme_dir": nvme, "max_context": 4096,
              "max_seqs": 16, "overhead_gib": overhead / GIB}  # fmt: skip
    return {"inputs": inputs, "kv_bytes": kv, "overhead_bytes": overhead, "cold_layers": [], "ranks": ranks}


def _manifest(segments, placement=None, world=1, rank=0):
    """What the check reads of a manifest: segments (name, tier, length), the plan, world and rank."""
    segs = [SimpleNamespace(name=n, tier=t, length=b) for n, t, b in segments]
    plan = {} if placement is None else {"placement": placement}
    return SimpleNamespace(segments=segs, plan=plan, world=world, rank=rank)


TP2 = [("weights", "device", 94 * GIB), ("layers.1.engram.rows", "host", 47 * GIB)]
TP2_RANKS = [{"device": 94 * GIB, "host": 47 * GIB, "nvme": 0}] * 2


class Cuda(FakeCuda):
    memory = (139 * GIB, 140 * GIB)


def test_probe_reads_the_gpu_and_meminfo(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       131072000 kB\nMemAvailable:    1000000 kB\n")
    machine = pc.probe("cuda", Cuda, str(meminfo))
    assert machine == pc.Machine("cuda:0", 139 * GIB, 140 * GIB, 1_024_000_000)
    assert pc.probe("cuda:3", Cuda, str(meminfo)).device == "cuda:3"
    assert pc.probe("cpu", Cuda, str(tmp_path / "none")) == pc.Machine("cpu", None, None, None)


def test_a_gpu_with_room_passes_and_one_without_is_refused_in_one_line():
    m = _manifest(TP2, _placement(TP2_RANKS), world=2, rank=1)
    pc.check_room(m, pc.Machine("cuda:1", 101 * GIB, 140 * GIB, 200 * GIB))  # 94 + 1 KV + 6 overhead
    with pytest.raises(pc.NotEnoughMemory) as info:
        pc.check_room(m, pc.Machine("cuda:1", 78 * GIB, 79 * GIB, 200 * GIB))
    line = str(info.value)
    assert "\n" not in line and line.startswith("rank 1 needs 101.0 GiB of GPU memory")
    assert "placed for a 141 GiB GPU" in line and "cuda:1 has 78.0 GiB free of 79.0 GiB" in line
    assert "--gpu-memory-gib 79" in line and "--tp" in line


def test_host_memory_counts_every_rank_of_the_world():
    m = _manifest(TP2, _placement(TP2_RANKS, host=120), world=2)
    pc.check_room(m, pc.Machine("cuda:0", 139 * GIB, 140 * GIB, 95 * GIB))
    with pytest.raises(pc.NotEnoughMemory) as info:
        pc.check_room(m, pc.Machine("cuda:0", 139 * GIB, 140 * GIB, 93 * GIB))  # 2 x 47 GiB pinned
    assert "94.0 GiB of pinned host memory" in str(info.value) and "120 GiB of host memory" in str(info.value)
    pc.check_room(m, pc.Machine("cuda:0", 139 * GIB, 140 * GIB, None))  # no /proc/meminfo: no host check


def test_on_the_cpu_the_device_tier_and_reserve_count_as_host_memory():
    m = _manifest(TP2, _placement(TP2_RANKS), world=2)
    need = 2 * (94 + 1 + 6) * GIB + 2 * 47 * GIB
    pc.check_room(m, pc.Machine("cpu", None, None, need))
    with pytest.raises(pc.NotEnoughMemory, match="to run on the CPU"):
        pc.check_room(m, pc.Machine("cpu", None, None, need - 1))


def test_an_nvme_tier_is_read_in_place_so_its_folder_is_not_needed():
    segs = [("weights", "device", GIB), ("layers.1.engram.rows", "nvme", 47 * GIB)]
    ranks = [{"device": GIB, "host": 0, "nvme": 47 * GIB}]
    machine = pc.Machine("cuda:0", 139 * GIB, 140 * GIB, 100 * GIB)
    pc.check_room(
        _manifest(segs, _placement(ranks, nvme="/no/such/dir")), machine
    )  # the image's files serve it


def test_an_image_placed_without_a_target_needs_its_bytes_on_the_device():
    m = _manifest([("weights", "device", 190 * GIB)])
    with pytest.raises(
        pc.NotEnoughMemory, match="prepared without --gpu-memory-gib: every segment on the device"
    ):
        pc.check_room(m, pc.Machine("cuda:0", 139 * GIB, 140 * GIB, 500 * GIB))
    pc.check_room(
        _manifest([("weights", "device", 100 * GIB)]), pc.Machine("cuda:0", 139 * GIB, 140 * GIB, 0)
    )


@pytest.mark.parametrize(
    "broken",
    [
        lambda p: p.__setitem__("kv_bytes", -1),
        lambda p: p.__setitem__("ranks", p["ranks"][:1]),
        lambda p: p["ranks"][0].__setitem__("host", "lots"),
        lambda p: p.__setitem__("inputs", []),
        lambda p: p["inputs"].__setitem__("nvme_dir", 3),
        lambda p: p.pop("overhead_bytes"),
    ],
)
def test_a_malformed_placement_record_is_refused(broken):
    placement = _placement([dict(r) for r in TP2_RANKS])
    broken(placement)
    with pytest.raises(ImageRefused, match="placement record is malformed; re-run `tfc prepare`"):
        pc.check_room(_manifest(TP2, placement, world=2), pc.Machine("cuda:0", 139 * GIB, 140 * GIB, None))


def _seg(name: str, tier: str, nbytes: int, layout: str = "native.v1") -> SimpleNamespace:
    return SimpleNamespace(name=name, tier=tier, length=nbytes, layout=layout)


def test_engram_rows_and_expert_tables_are_the_segments_served_off_the_device():
    rows = "engram.rows.e4m3e8m0.v1"
    served = [_seg("weights", "device", GIB), _seg("layers.1.engram.rows", "host", 47 * GIB, rows),
              _seg("layers.14.engram.rows", "nvme", 47 * GIB, rows)]  # fmt: skip
    pc.refuse_off_device(SimpleNamespace(segments=served, rank=0))
    cold = [*served, _seg("layers.4.ffn.experts.w1.trellis", "host", 2 * GIB, "exl3.experts.stack.v1"),
            _seg("layers.5.ffn.experts.w2.trellis", "host", 2 * GIB, "exl3.experts.ragged.v1")]  # fmt: skip
    pc.refuse_off_device(SimpleNamespace(segments=cold, rank=0))
    odd = [*cold, _seg("layers.4.ffn.experts.w1.trellis", "nvme", 2 * GIB, "exl3.experts.stack.v1"),
           _seg("layers.4.attn.wq_a.trellis", "host", GIB, "exl3.trellis.v1")]  # fmt: skip
    with pytest.raises(pc.TiersNotServed) as info:
        pc.refuse_off_device(SimpleNamespace(segments=odd, rank=0))
    line = str(info.value)
    assert "\n" not in line and line.startswith(
        "rank 0: 2 segment(s) (3.0 GiB, e.g. layers.4.ffn.experts.w1.trellis) are placed in host and nvme;"
    )
    assert "expert tables (host) off the device" in line


def _placed_image(root, host_bytes: int, tier: str = "device"):
    """A one-segment image whose placement record says every rank pins `host_bytes`."""
    inputs = {
        "format_version": 1,
        "family": "deepseek_v41",
        "world": 1,
        "salt": f"placed-{host_bytes}-{tier}",
    }
    world_key = image_key(inputs)
    writer = ImageWriter(root, world_key, 0)
    slot = writer.add_segment("layers.0.norm", "float32", (256,), "native.v1", 1024, "L00.bin", tier)
    writer.write(slot, 0, np.ones(256, np.float32))
    ranks = [{"device": 1024 * (tier == "device"), "host": host_bytes, "nvme": 0}]
    plan = {"world": 1, "rank": 0, "placement": _placement(ranks, kv=0, overhead=0)}
    return writer.publish({"family": "deepseek_v41", "key": image_key({"world_key": world_key, "rank": 0}),
                           "key_inputs": inputs, "world": 1, "plan": plan})  # fmt: skip


def test_boot_refuses_before_allocating_anything(tmp_path, monkeypatch):
    path = _placed_image(tmp_path, 0)
    monkeypatch.setattr(pc, "host_available", lambda path=None: 512)
    monkeypatch.setattr(boot_rank, "DeviceArena", lambda *a, **k: pytest.fail("allocated before the check"))
    with pytest.raises(pc.NotEnoughMemory, match="of host memory to run on the CPU"):
        boot_rank.boot(path, device="cpu")
    monkeypatch.setattr(pc, "host_available", lambda path=None: 1 << 40)
    with pytest.raises(
        pc.TiersNotServed
    ):  # a native segment in host memory: not a tier this runtime serves it from
        boot_rank.boot(_placed_image(tmp_path, 0, tier="host"), device="cpu")


@pytest.mark.slow
def test_tfc_load_refusal_is_one_line(tmp_path):
    path = _placed_image(tmp_path, 1 << 60)  # no machine pins an exbibyte
    r = subprocess.run([sys.executable, "-m", "tfc", "load", str(path), "--device", "cpu"],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "MemAvailable" in r.stderr and "--host-memory-gib" in r.stderr
