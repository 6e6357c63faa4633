"""Opening prepared images (refusals), uploading into an arena (host, and CUDA when present), `tfc load`."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tfc.cache.key import image_key
from tfc.cache.writer import ImageWriter
from tfc.runtime.boot.arena import ArenaError, DeviceArena, UploadItem, plan_arena
from tfc.runtime.boot.image_open import ImageRefused, SegmentSpec, open_image
from tfc.runtime.boot.upload import upload

RNG = np.random.default_rng(6)


def make_image(root: Path, rank: int = 0, world: int = 1, layout: str = "exl3.trellis.v1", big: bool = False):
    """A small image of random segments over two files, written by the cache's ImageWriter."""
    inputs = {"format_version": 1, "family": "deepseek_v41", "world": world, "salt": "test-runtime"}
    world_key = image_key(inputs)
    arrays = {}
    writer = ImageWriter(root, world_key, rank)
    specs = [
        ("layers.0.attn.wq.trellis", "int16", (4, 8, 48), layout, "L00.bin"),
        ("layers.0.attn.wq.suh", "float16", (1000,), "exl3.scales.v1", "L00.bin"),
        ("layers.0.norm", "float32", (333,), "native.v1", "L00.bin"),
        ("head.trellis", "int16", (16, 3, 64) if not big else (64, 64, 1024), "exl3.trellis.v1", "top.bin"),
        ("embed", "bfloat16", (77, 5), "native.v1", "top.bin"),
    ]
    for name, dtype, shape, lay, file in specs:
        n = int(np.prod(shape)) * np.dtype("uint16" if dtype == "bfloat16" else dtype).itemsize
        data = RNG.integers(0, 256, n, dtype=np.uint8)
        arrays[name] = data.tobytes()
        slot = writer.add_segment(name, dtype, shape, lay, n, file)
        writer.write(slot, 0, data)
    path = writer.publish(
        {
            "family": "deepseek_v41",
            "key": image_key({"world_key": world_key, "rank": rank}),
            "key_inputs": inputs,
            "world": world,
            "plan": {"world": world, "rank": rank},
        }
    )
    return path, arrays


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    return make_image(tmp_path_factory.mktemp("img"))


def test_open_accepts_and_maps(image):
    path, arrays = image
    with open_image(path.parent, rank=0) as opened:
        assert opened.path == path
        assert {"manifest", "keys", "layouts", "rank"} <= set(opened.checks)
        for name, data in arrays.items():
            assert bytes(opened.image.segment(name)) == data
        assert [i.name for i in opened.items()] == list(arrays)
        assert opened.hold is not None and opened.hold.held
        assert len(opened.signature) == 64


def _copy(image, tmp_path) -> Path:
    src = image[0].parent
    dst = tmp_path / src.name
    shutil.copytree(src, dst)
    return dst / "rank0"


def _refused(path, match, hint=True, **kw):
    with pytest.raises(ImageRefused, match=match) as info:
        open_image(path, **kw)
    msg = str(info.value)
    assert "\n" not in msg and ("re-run `tfc prepare`" in msg or not hint)
    return msg


def test_refuses_wrong_format_version(image, tmp_path):
    rank_dir = _copy(image, tmp_path)
    m = json.loads((rank_dir / "manifest.json").read_text())
    m["format_version"] = 99
    (rank_dir / "manifest.json").write_text(json.dumps(m))
    _refused(rank_dir, "format version")


def test_refuses_unknown_layout(tmp_path):
    path, _ = make_image(tmp_path, layout="exl3.trellis.v9")
    _refused(path, "layout 'exl3.trellis.v9'")


def test_refuses_truncated_file(image, tmp_path):
    rank_dir = _copy(image, tmp_path)
    data = rank_dir / "top.bin"
    os.truncate(data, data.stat().st_size - 4096)
    _refused(rank_dir, "truncated")


def test_refuses_manifest_of_another_rank(tmp_path):
    path, _ = make_image(tmp_path, rank=1, world=2)
    shutil.copytree(path, path.parent / "rank0")
    _refused(path.parent, "for rank 1 of 2", rank=0)
    _refused(path, "not rank 0", hint=False, rank=0)
    with open_image(path.parent, rank=1) as opened:
        assert opened.manifest.rank == 1


def test_refuses_altered_key_inputs(image, tmp_path):
    from tfc.cache.format import RankManifest, root_digest_of

    rank_dir = _copy(image, tmp_path)
    m = RankManifest.load(rank_dir)
    body = m.body()
    body["key_inputs"] = {**body["key_inputs"], "salt": "other"}
    (rank_dir / "manifest.json").write_text(json.dumps({**body, "root_digest": root_digest_of(body)}))
    _refused(rank_dir, "world key")


def test_refuses_unexpected_structure(image):
    path, _ = image
    with open_image(path) as opened:
        expect = {s.name: SegmentSpec(s.dtype, s.shape, s.layout) for s in opened.manifest.segments}
    with open_image(path, expect=expect) as opened:
        assert "structure" in opened.checks
    wrong = dict(expect)
    wrong["layers.0.norm"] = SegmentSpec("float32", (334,), "native.v1")
    _refused(path, "layers.0.norm is float32", expect=wrong)
    del wrong["embed"]
    _refused(path, "unexpected embed", expect=wrong)


def test_verify_finds_damaged_payload(image, tmp_path):
    pytest.importorskip("tfc.cache.verify")
    from tfc.runtime.boot.image_open import verify_digests

    rank_dir = _copy(image, tmp_path)
    with open(rank_dir / "L00.bin", "r+b") as f:
        f.seek(10)
        b = f.read(1)
        f.seek(10)
        f.write(bytes([b[0] ^ 0xFF]))
    with open_image(rank_dir) as opened, pytest.raises(ImageRefused, match="trellis"):
        verify_digests(opened, "full")


def test_arena_plan_chunks_alignment_and_errors(tmp_path):
    f = tmp_path / "a.bin"
    items = [UploadItem(f"s{i}", f, i * 8192, 5000 + i) for i in range(10)]
    plan = plan_arena(items, chunk_bytes=3 * 8192)
    assert len(plan.chunks) == 4 and plan.payload_bytes == sum(i.length for i in items)
    assert all(p.offset % 256 == 0 for p in plan.placements.values())
    with pytest.raises(ArenaError, match="overlap"):
        plan_arena([UploadItem("a", f, 0, 8192), UploadItem("b", f, 4096, 10)])
    with pytest.raises(ArenaError, match="aligned"):
        plan_arena([UploadItem("a", f, 100, 10)])


def test_host_upload_equals_file_bytes(image):
    path, arrays = image
    with open_image(path) as opened:
        arena = DeviceArena(plan_arena(opened.items(), chunk_bytes=8192), "cpu")
        report = upload(arena, threads=3)
        assert report.method == "host" and report.bytes == arena.nbytes
        for s in opened.manifest.segments:
            raw = arena.raw(s.name)
            assert raw.data_ptr() % 256 == 0
            assert raw.numpy().tobytes() == arrays[s.name]
            assert arena.view(s.name, s.dtype, s.shape).shape == tuple(s.shape)
        with pytest.raises(ArenaError):
            arena.view("embed", "float32", (77, 5))


def test_tfc_load_cli_prints_phases_and_their_json(image):
    path, _ = image

    def load(*args: str) -> str:
        r = subprocess.run(
            [sys.executable, "-m", "tfc", "load", str(path.parent), "--device", "cpu", "--verify", *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        return r.stdout

    out = load()
    for phase in ("open", "alloc", "upload", "read", "capture"):
        assert f"  {phase} " in out
    assert "captured at warm-up" in out or "graphs off" in out
    data = json.loads(load("--json"))
    assert data["notes"] == [] or all(isinstance(n, str) for n in data["notes"])  # the runner's notes, listed
    assert data["bytes"] > 0 and data["upload"]["bytes"] == data["bytes"] and data["rank"] == 0
    assert data["method"] == "host" and "upload_config" in data and data["upload_steps"] == {}
    assert all(phase in data for phase in ("open", "alloc", "upload", "read", "capture"))


def test_tfc_load_cli_refusal_is_one_line(tmp_path):
    path, _ = make_image(tmp_path, layout="exl3.trellis.v9")
    r = subprocess.run(
        [sys.executable, "-m", "tfc", "load", str(path), "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "tfc prepare" in r.stderr


@pytest.mark.parametrize(
    ("args", "says"), [(["--method", "mmap"], "needs a CUDA device"), (["--threads", "0"], "0")]
)
def test_tfc_load_cli_bad_options_are_one_line(image, args, says):
    path, _ = image
    r = subprocess.run(
        [sys.executable, "-m", "tfc", "load", str(path), "--device", "cpu", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert says in r.stderr.strip().splitlines()[-1]  # the error is the last line (after click's usage)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "method, staging",
    [
        ("ring", {}),
        ("register", {}),
        ("mmap", {}),
        ("mmap", {"copier": "python", "slots_per_thread": 1}),
        ("mmap", {"copier": "native", "slots_per_thread": 3}),
        ("auto", {}),
    ],
)
def test_cuda_upload_equals_file_bytes(tmp_path, monkeypatch, method, staging):
    """Each path on the GPU, with small pieces (so that slots and windows are reused) where the path has them."""
    import dataclasses

    import torch
    from tfc.runtime.boot import upload as up

    monkeypatch.setattr(up, "WINDOW_BYTES", 1 << 19)
    path, arrays = make_image(tmp_path, big=True)
    with open_image(path) as opened:
        arena = DeviceArena(plan_arena(opened.items(), chunk_bytes=1 << 20), "cuda")
        plan = up.plan_upload(arena, method, threads=4)
        if plan.mmap is not None:
            plan = dataclasses.replace(
                plan, mmap=dataclasses.replace(plan.mmap, slot_bytes=1 << 18, **staging)
            )
        elif plan.method == "ring":
            plan = dataclasses.replace(plan, slot_bytes=1 << 18)
        report = up.run_upload(arena, plan)
        assert report.method == (method if method != "auto" else "mmap")  # just written: cached
        torch.cuda.synchronize()
        for s in opened.manifest.segments:
            raw = arena.raw(s.name)
            assert raw.is_cuda and raw.data_ptr() % 256 == 0
            assert raw.cpu().numpy().tobytes() == arrays[s.name], s.name


def test_register_windows_are_disjoint_pages_covering_every_chunk(tmp_path):
    from tfc.runtime.boot.upload_paths import PAGE, windows

    f, g = tmp_path / "a.bin", tmp_path / "b.bin"
    items = [UploadItem(f"s{i}", f, i * 8192, 5000 + 7 * i) for i in range(20)]
    items.append(UploadItem("big", g, 0, 100_003))

    class Planned:
        plan = plan_arena(items, chunk_bytes=3 * 8192)

    found = windows(Planned, 4 * PAGE)
    spans = sorted((str(p), a, b) for p, a, b, _ in found)
    for (p1, _, b1), (p2, a2, _) in itertools.pairwise(spans):
        assert p1 != p2 or b1 <= a2
    assert all(a % PAGE == 0 and b % PAGE == 0 for _, a, b in spans)
    assert all(a <= c[1] and c[1] + c[3] <= b for _, a, b, cs in found for c in cs)
    assert sum(c[3] for _, _, _, cs in found for c in cs) == Planned.plan.nbytes


@pytest.mark.parametrize("method", ["ring", "register"])
def test_ring_and_register_control_flow_on_cpu(tmp_path, fake_cuda, method):
    from tfc.runtime.boot import upload_paths
    from tfc.runtime.boot.upload_files import RankFiles

    path, arrays = make_image(tmp_path, big=True)
    with open_image(path) as opened:
        arena = DeviceArena(plan_arena(opened.items(), chunk_bytes=1 << 20), "cpu")
        with RankFiles(arena) as files:
            if method == "ring":
                upload_paths.upload_ring(arena, files, 3, 1 << 17, 2, lambda n: None)
            else:
                upload_paths.upload_register(arena, files, 3, 1 << 18, lambda n: None)
        assert not fake_cuda.live
        for s in opened.manifest.segments:
            assert arena.raw(s.name).numpy().tobytes() == arrays[s.name], s.name


def test_resident_fraction_and_ring_staging_choice(tmp_path):
    """The ring picks its staging from how much of the image the page cache holds (mincore, no reads)."""
    import os

    from tfc.runtime.boot import upload as up

    f = tmp_path / "data.bin"
    f.write_bytes(os.urandom(1 << 20))
    assert up.resident_fraction([f]) == 1.0  # just written: every page is cached
    assert (
        up.resident_fraction([tmp_path / "empty.bin"] if (tmp_path / "empty.bin").touch() is None else [])
        == 0.0
    )
    assert up.WARM_RING[0] < up.COLD_RING[0]  # small slots from cache, large reads from disk


def test_resident_fraction_samples_agree_with_the_full_probe(tmp_path):
    """A probe of a few evenly spaced runs of pages gives the full probe's fraction (half the file evicted)."""
    import os

    from tfc.runtime.boot import upload as up

    f = tmp_path / "data.bin"
    f.write_bytes(os.urandom(4 << 20))
    fd = os.open(f, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 2 << 20, 2 << 20, os.POSIX_FADV_DONTNEED)  # drop the second half (clean pages)
    finally:
        os.close(fd)
    full = up.resident_fraction([f], samples=1 << 30)
    if not 0.4 <= full <= 0.6:
        pytest.skip(f"this file system did not evict the pages (full probe {full})")
    assert abs(up.resident_fraction([f], samples=64) - full) <= 0.05  # 64 single pages
    assert abs(up.resident_fraction([f], samples=256, windows=16) - full) <= 0.05  # 16 runs of 16 pages


def test_ring_staging_follows_the_page_cache(tmp_path, monkeypatch):
    import contextlib
    import types

    from tfc.runtime.boot import upload as up
    from tfc.runtime.boot import upload_files, upload_paths

    f = tmp_path / "image.bin"
    f.write_bytes(b"\x5a" * 4096)
    arena = types.SimpleNamespace(
        device=types.SimpleNamespace(type="cuda"),
        plan=types.SimpleNamespace(chunks=[types.SimpleNamespace(path=f)]),
        nbytes=4096,
    )
    seen = []
    monkeypatch.setattr(upload_files, "RankFiles", lambda a: contextlib.nullcontext(None))
    monkeypatch.setattr(
        upload_paths, "upload_ring", lambda a, files, t, slot, per, tick: seen.append((slot, per)) or 0.0
    )
    warm = up.upload(arena, "ring")
    monkeypatch.setattr(up, "resident_fraction", lambda paths: 0.0)
    cold = up.upload(arena, "ring")
    assert seen == [up.WARM_RING, up.COLD_RING]
    assert "100% of the image in page cache" in warm.config and "0% of the image" in cold.config
    up.run_upload(arena, up.UploadPlan("ring", 2, 1 << 20, 3))  # a plan of one's own runs as it says
    assert seen[-1] == (1 << 20, 3)


def test_cpu_arena_refuses_a_cuda_upload_method_and_bad_thread_counts(tmp_path):
    """Asking for a CUDA path on the CPU is an error, not a silent switch to host copies."""
    from tfc.runtime.boot.upload import UploadError

    path, _ = make_image(tmp_path)
    with open_image(path) as opened:
        arena = DeviceArena(plan_arena(opened.items(), chunk_bytes=1 << 20), "cpu")
        for method in ("mmap", "ring", "register"):
            with pytest.raises(UploadError, match="needs a CUDA device"):
                upload(arena, method)
        with pytest.raises(UploadError, match="at least one thread"):
            upload(arena, threads=0)
        assert upload(arena, "auto").method == "host"


def test_boot_notes_the_mmap_steps(image, monkeypatch):
    """The upload phase says where the mmap path's threads spent their time (summed over threads)."""
    from tfc.runtime.boot import rank as boot_mod
    from tfc.runtime.boot.upload import UploadReport

    steps = {"staging": 0.25, "pool": 0.2, "wait": 0.5, "copy": 4.0, "issue": 0.75, "ramp": 0.125}

    def fake_upload(arena, method, threads=None, progress=None):
        return UploadReport("mmap", str(arena.device), arena.nbytes, 1.0, 0.9, 16, "16 threads", 0.25, steps)

    monkeypatch.setattr(boot_mod, "upload", fake_upload)
    booted = boot_mod.boot(image[0].parent, rank=0, device="cpu")
    try:
        phases = booted.phases.to_dict()
        note = phases["upload"]["note"]
        assert "summed over threads: pool 0.200 s, wait 0.500 s, copy 4.000 s, issue 0.750 s;" in note
        assert note.endswith("first byte copied after 0.125 s")  # a wall time, not summed
        assert phases["staging"]["ms"] == 250.0
    finally:
        booted.image.close()


def test_boot_prefaults_staging_and_says_so(image, monkeypatch):
    """Where the mmap path may run, boot faults the staging in first, notes how much the upload took, and
    releases the rest afterwards."""
    from tfc.runtime.boot import rank as boot_mod
    from tfc.runtime.boot import staging_pool

    monkeypatch.setattr(staging_pool, "wanted", lambda device, method: True)
    booted = boot_mod.boot(image[0].parent, rank=0, device="cpu", threads=2)
    try:
        note = booted.phases.to_dict()["upload"]["note"]
        assert "staging prefaulted: 0 of 4 slots taken" in note  # the CPU's host copies stage nothing
        assert staging_pool.note() == "" and staging_pool.release() == 0  # released by boot
    finally:
        booted.image.close()
