"""Benchmark: Engram lookup per decode step from each tier, against the device-resident gather, as shares of a
whole-model decode step.

A step of R rows looks up R x cols records in each Engram layer. Per tier, over `--steps` steps of fresh random
rows (no LRU hits: every NVMe record is a cold read), the time until the step's Engram inputs are on the device:
- device: the gather kernel over a table in device memory (the arena path);
- host: rows gathered on the host from a table in host memory into the pinned staging, one copy a layer, the same
  kernel over the staged table (fast/engram_staging.py, the runtime's own code);
- nvme: the records read in place from a file with O_DIRECT (io_uring, or threads where refused:
  runtime/records), then as host.
`engram.<tier>_step_share` is that time at one row a step (both layers) over the whole-model one-row decode step
(`--step-s`, default 1/65.7 s: the latest H100 decode figure). The host and device tables have the real shard's
rows (`--table-rows`: a TP=2 rank's 12 columns of layer 1); the NVMe file is `--nvme-gib` of random records
written and fsynced in `--nvme-dir` (reads of a sparse file's holes never reach the drive).

Run on a GPU: python benchmarks/engram.py --device cuda --json benchmarks/results/engram/engram_tiers_h100.json
On the CPU (small sizes; proves it runs): python benchmarks/engram.py --device cpu --table-rows 200000 --nvme-gib 0.05
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HEAD_DIM, RECORD = 256, 264
SHARD_ROWS = 192_003_084  # a TP=2 rank's shard of layer 1 (its 12 hash columns' primes)


def _table(rows: int, device: str):
    """uint8 [rows, RECORD] with every page written (untouched pages would fault in during the timing)."""
    import torch

    table = torch.empty((rows, RECORD), dtype=torch.uint8, device=device)
    table[:, :HEAD_DIM].fill_(0x38)  # e4m3 1.0
    table[:, HEAD_DIM:].fill_(127)  # scale 2^0
    return table


def _record_file(folder: Path, gib: float) -> tuple[Path, int]:
    """A file of records, fsynced; (path, its records)."""
    rows = int(gib * (1 << 30)) // RECORD
    path = folder / "engram-records.bin"
    block = np.random.default_rng(0).integers(0, 256, (1 << 18) * RECORD, dtype=np.uint8).tobytes()
    with open(path, "wb") as f:  # one random block over and over: real bytes on the drive, quick to write
        for lo in range(0, rows, 1 << 18):
            f.write(block[: min(1 << 18, rows - lo) * RECORD])
        f.flush()
        os.fsync(f.fileno())
    return path, rows


def _time(fn, steps: int, sync) -> float:
    """Median seconds of fn(step) over `steps` calls after two warm-ups."""
    for i in range(2):
        fn(-1 - i)
    sync()
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        fn(i)
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--rows", default="1,16,64", help="rows a step, comma-separated")
    ap.add_argument("--cols", type=int, default=12, help="hash columns a rank gathers (12 at TP=2)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--table-rows", type=int, default=SHARD_ROWS)
    ap.add_argument("--nvme-gib", type=float, default=16.0)
    ap.add_argument(
        "--nvme-dir", default=None, help="a folder on the drive to measure (default: a temp folder)"
    )
    ap.add_argument("--cache-records", type=int, default=0, help="the NVMe LRU (0: every read cold)")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--step-s", type=float, default=1 / 65.7, help="whole-model one-row decode step, seconds")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import torch
    from tfc.kernels.dsv41.engram_rows import bf16_lut, gather_rows, gather_rows_reference
    from tfc.runtime.models.dsv41.fast.engram_staging import EngramStaging
    from tfc.runtime.records.reader import RecordConfig, RecordFile
    from tfc.runtime.records.source import FileRecords, TableRecords

    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device here; use --device cpu")
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    lut = bf16_lut(device)

    def gather(table, ids):
        if cuda:
            return gather_rows(table, ids, HEAD_DIM, 0, lut)
        return gather_rows_reference(table, ids, HEAD_DIM, 0)

    rows_list = [int(r) for r in args.rows.split(",")]
    widest = max(rows_list)
    rng = np.random.default_rng(1)
    out: dict = {"device": torch.cuda.get_device_name() if cuda else "cpu", "args": vars(args), "points": {}}
    dev_table = _table(args.table_rows, args.device)
    host_table = _table(args.table_rows, "cpu").numpy()
    folder = Path(args.nvme_dir or tempfile.mkdtemp(prefix="tfc-engram-bench-"))
    path, nvme_rows = _record_file(folder, args.nvme_gib)
    config = RecordConfig(cache_records=args.cache_records)
    record_file = RecordFile(path, 0, nvme_rows * RECORD, RECORD, config)
    out["nvme"] = {"file_gib": args.nvme_gib, "reads": record_file.method, "notes": record_file.notes}
    tiers = {
        "host": {k: TableRecords(host_table, "host table") for k in range(args.layers)},
        "nvme": {k: FileRecords(record_file, config) for k in range(args.layers)},
    }
    stagings = {
        t: EngramStaging(src, (0,) * args.layers, widest, args.cols, device) for t, src in tiers.items()
    }
    try:
        for rows in rows_list:
            draws = {n: rng.integers(0, n, (args.steps + 2, rows, args.layers, args.cols)) for n in
                     (args.table_rows, nvme_rows)}  # fmt: skip
            dev_ids = torch.as_tensor(draws[args.table_rows], device=device)

            def on_device(i, ids=dev_ids):
                for k in range(args.layers):
                    gather(dev_table, ids[i, :, k])

            point = {"device_s": _time(on_device, args.steps, sync)}
            for tier, staging in stagings.items():
                ids_of = draws[args.table_rows if tier == "host" else nvme_rows]
                local = torch.as_tensor(staging.local[:rows], device=device)

                def staged(i, staging=staging, ids_of=ids_of, local=local, rows=rows):
                    ids = np.zeros((widest, args.layers, args.cols), np.int64)
                    ids[:rows] = ids_of[i]
                    staging.write(staging.records(ids, None))
                    staging.start(rows)
                    for k in range(args.layers):
                        gather(staging.table(k), local)
                    staging.join()

                point[f"{tier}_s"] = _time(staged, args.steps, sync)
            out["points"][rows] = point
            print(
                f"{rows:3d} rows: " + ", ".join(f"{k[:-2]} {v * 1e3:.3f} ms" for k, v in point.items()),
                flush=True,
            )
    finally:
        for src in tiers["nvme"].values():
            src._ahead.shutdown(wait=True)
        record_file.close()
        if args.nvme_dir is None:
            path.unlink()
            folder.rmdir()
    one = out["points"][min(rows_list)]
    for tier in ("device", "host", "nvme"):
        out[f"engram.{tier}_step_share"] = round(one[f"{tier}_s"] / args.step_s, 5)
    print(json.dumps({k: v for k, v in out.items() if k.startswith("engram.")}))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
