"""Benchmark: why the warm mmap upload stops short of the pinned H2D floor, on an H200 host.

    python3 benchmarks/boot_pipeline_h200.py --image DIR --out DIR [--budget-s 300]

DIR is a rank folder (manifest.json) as for boot_h200.py; the image is read into the page cache first.
Measured in one run, each part skipped when it would pass --budget-s:

1. contention: pinned H2D alone; a 16-thread memmove out of a fresh mmap of the image alone; both at once
   (the H2D loop runs on its own thread while the memmove copies the whole image);
2. pinning cost of 256 MiB of staging: fresh small pages, the same pages registered again, huge pages,
   torch's allocator;
3. warm boots of the `mmap` path (3 each): the default, with `direct` threads that page-lock windows of
   the mapping and copy from them beside the staging threads, and the default with its staging pinned
   before the timer ("pool") to show what the staging costs inside a boot. Each boot reports its
   per-step seconds summed over threads.

`--plan short` runs the contention part and two boots only (for a second process under other settings,
e.g. GLIBC_TUNABLES). Writes boot_pipeline_h200_{plan}.json into --out and prints a summary table.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import boot_h200
import boot_host

MIB = 1 << 20


def h2d_loop(torch, stop: threading.Event, out: dict, piece: int = 128 * MIB, total: int = 1 << 30) -> None:
    """Copy a pinned buffer to the device piece by piece on two streams until `stop`; count bytes and time."""
    src = torch.empty(total, dtype=torch.uint8, pin_memory=True)
    src.fill_(3)
    dst = torch.empty(total, dtype=torch.uint8, device="cuda")
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    torch.cuda.synchronize()
    moved, j = 0, 0
    out["ready"].set()
    t0 = time.perf_counter()
    while not stop.is_set():
        for off in range(0, total, piece):
            with torch.cuda.stream(streams[j % 2]):
                dst[off : off + piece].copy_(src[off : off + piece], non_blocking=True)
            j += 1
        for s in streams:
            s.synchronize()
        moved += total
    out["gbps"] = round(moved / (time.perf_counter() - t0) / 1e9, 2)
    out["bytes"] = moved
    del src, dst


def beside_h2d(torch, work, settle: float) -> tuple[object, float]:
    """Run `work()` while the H2D loop runs (started `settle` s before); returns its result and the H2D GB/s."""
    stop = threading.Event()
    state: dict = {"ready": threading.Event()}
    t = threading.Thread(target=h2d_loop, args=(torch, stop, state))
    t.start()
    state["ready"].wait()
    time.sleep(settle)
    try:
        result = work()
    finally:
        stop.set()
        t.join()
    return result, state["gbps"]


def contention(torch, files: list[Path], threads: int, piece: int) -> dict:
    """H2D alone, memmove (into `piece`-sized buffers) alone, and both at once."""
    res: dict = {}
    _, res["h2d_alone_gbps"] = beside_h2d(torch, lambda: None, 0.6)
    res["memmove_alone"] = boot_host.mmap_copy(files, threads, piece=piece, drop=True)
    res["memmove_with_h2d"], res["h2d_with_memmove_gbps"] = beside_h2d(
        torch, lambda: boot_host.mmap_copy(files, threads, piece=piece, drop=True), 0.05
    )
    for k in ("memmove_alone", "memmove_with_h2d"):
        res[k] = {"gbps": res[k]["gbps"], "seconds": res[k]["seconds"], "threads": threads, "piece": piece}
    print(f"contention ({threads} threads): {json.dumps(res)}", file=sys.stderr)
    return res


def pin_costs(torch, nbytes: int = 256 * MIB) -> list[dict]:
    """Seconds to page-lock `nbytes` of staging: fresh pages, the same pages again, huge pages, torch."""
    from tfc.runtime.boot import upload_files as uf
    from tfc.runtime.boot.pages import MADV_HUGEPAGE, MADV_POPULATE_WRITE, libc

    lib, reg, out = libc(), uf.Registrar(), []
    for huge in (False, True):
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
        addr = lib.mmap(None, nbytes, mmap.PROT_READ | mmap.PROT_WRITE, flags, -1, 0)
        t0 = time.perf_counter()
        if huge:
            lib.madvise(addr, nbytes, MADV_HUGEPAGE)
        if lib.madvise(addr, nbytes, MADV_POPULATE_WRITE) != 0:
            ctypes.memset(addr, 0, nbytes)
        t1 = time.perf_counter()
        reg.register(addr, nbytes, uf.REGISTER_PORTABLE)
        t2 = time.perf_counter()
        reg.unregister(addr)
        t3 = time.perf_counter()
        reg.register(addr, nbytes, uf.REGISTER_PORTABLE)
        t4 = time.perf_counter()
        reg.unregister(addr)
        lib.munmap(addr, nbytes)
        out.append({"pages": "huge" if huge else "small", "fault_s": round(t1 - t0, 4),
                    "register_s": round(t2 - t1, 4), "unregister_s": round(t3 - t2, 4),
                    "register_again_s": round(t4 - t3, 4)})  # fmt: skip
    t0 = time.perf_counter()
    x = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    out.append({"pages": "torch pin_memory", "register_s": round(time.perf_counter() - t0, 4)})
    del x
    for r in out:
        print(f"pin 256 MiB: {r}", file=sys.stderr)
    return out


class _Pool:
    """Staging slots pinned before the timer and handed out again (what a resident pool would save)."""

    def __init__(self, real, n: int, nbytes: int) -> None:
        self.real, self.free_slots = real, [real(nbytes) for _ in range(n)]

    def make(self, nbytes: int):
        pool = self

        class Pooled:
            take_s = 0.0

            def __init__(self) -> None:
                self.inner = pool.free_slots.pop()
                self.addr, self.tensor = self.inner.addr, self.inner.tensor

            def free(self) -> None:
                pool.free_slots.append(self.inner)

        return Pooled()

    def close(self) -> None:
        for s in self.free_slots:
            s.free()


def boots(torch, arena_mod, upload_mod, image: Path, method: str, cfg: dict, reps: int) -> dict:
    runs = [boot_h200.boot_once(torch, arena_mod, upload_mod, image, method, cfg) for _ in range(reps)]
    secs = [r["seconds"] for r in runs]
    med = sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2]
    row = {"method": method, "cfg": {k: v for k, v in cfg.items()}, "median_s": round(statistics.median(secs), 4),
           "min_s": round(min(secs), 4), "all_s": [round(s, 4) for s in secs], "gbps": round(med["gbps"], 2),
           "read_s": round(med["read_s"], 4), "steps": med.get("steps", {}), "config": med["config"]}  # fmt: skip
    print(f"boot {method} {cfg}: {row['all_s']} steps {row['steps']}", file=sys.stderr)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--image", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget-s", type=float, default=300.0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--plan", choices=("main", "short"), default="main", help="short: contention and 2 boots")
    args = ap.parse_args()
    start = time.perf_counter()
    arena_mod, upload_mod = boot_h200._import_tfc()
    import torch
    from tfc.runtime.boot import upload_mmap

    items, _ = boot_h200.image_items(args.image, arena_mod.UploadItem)
    files = sorted({it.path for it in items})
    nbytes = arena_mod.plan_arena(items).nbytes
    res: dict = {"command": " ".join([Path(sys.executable).name, *sys.argv]),
                 "date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "gpu": torch.cuda.get_device_name(0),
                 "image_bytes": nbytes, "skipped": []}  # fmt: skip
    boot_h200.warm_cache(files)
    res["resident"] = boot_h200.resident(files)

    def left() -> float:
        return args.budget_s - (time.perf_counter() - start)

    try:
        res["h2d_pinned_gbps"] = boot_h200.pinned_h2d_gbps(torch)
        res["floor_warm_s"] = nbytes / (res["h2d_pinned_gbps"]["best"] * 1e9)
        res["contention"] = [contention(torch, files, 16, piece) for piece in (8 * MIB, 1 * MIB)]
        if args.plan == "main":
            res["pin_costs"] = pin_costs(torch)
        res["boots"] = []
        base = dict(threads=16, slot_bytes=8 * MIB, slots_per_thread=2)
        plan = [("mmap", base)] + [
            ("mmap", {**base, **extra})
            for extra in (
                [dict(slot_bytes=16 * MIB), dict(threads=12), dict(issuer="single", streams=2)]
                if args.plan == "main" else []
            )
        ]  # fmt: skip
        for method, cfg in plan:
            if left() < 3 * args.reps * 1.5:
                res["skipped"].append(f"{method} {cfg}")
                continue
            res["boots"].append(boots(torch, arena_mod, upload_mod, args.image, method, cfg, args.reps))
        if left() > 3 * args.reps * 1.5:
            pool = _Pool(
                upload_mmap.StagingSlot, base["threads"] * base["slots_per_thread"], base["slot_bytes"]
            )
            real = upload_mmap.StagingSlot
            upload_mmap.StagingSlot = pool.make
            try:
                row = boots(torch, arena_mod, upload_mod, args.image, "mmap", base, args.reps)
                row["cfg"] = {**base, "pool": "staging pinned before the timer"}
                res["boots"].append(row)
            finally:
                upload_mmap.StagingSlot = real
                pool.close()
    finally:
        res["wall_s"] = round(time.perf_counter() - start, 1)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"boot_pipeline_h200_{args.plan}.json").write_text(json.dumps(res, indent=1))
    floor = res.get("floor_warm_s", 0)
    print(f"floor {floor:.3f} s; target {1.25 * floor:.3f} s")
    for b in res.get("boots", []):
        print(f"{b['method']:8} {json.dumps(b['cfg']):90} median {b['median_s']:.3f} min {b['min_s']:.3f} "
              f"({b['median_s'] / floor:.2f}x) steps {b['steps']}")  # fmt: skip


if __name__ == "__main__":
    main()
