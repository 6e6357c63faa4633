"""Benchmark: Engram lookup per decode step from each tier, against the device-resident gather, as shares of a
whole-model decode step.

A step of R rows looks up R x cols records in each Engram layer. Per tier, over `--steps` steps of fresh random
rows (no LRU hits: every NVMe record is a cold read), the time until the step's Engram inputs are on the device:
- device: the gather kernel over a table in device memory (the arena path);
- host: rows gathered on the host from a table in host memory into the pinned staging, one copy a layer, the same
  kernel over the staged table (fast/engram_staging.py, the runtime's own code);
- nvme: the records read in place from a file with O_DIRECT (io_uring, or threads where refused:
  runtime/records), then as host.
- nvme, LRU warm: the same steps again once an LRU large enough holds their records.
`engram.<tier>_step_share` is that time at one row a step (both layers) over the whole-model one-row decode step
(`--step-s`, default 1/65.7 s: the latest H100 decode figure); the NVMe share is the warm one, the cold one beside
it. The host and device tables have the real shard's rows (`--table-rows`: a TP=2 rank's 12 columns of layer 1);
the NVMe file is `--nvme-gib` of random records written and fsynced in `--nvme-dir` (reads of a sparse file's
holes never reach the drive).

Prefetch in a prompt's prefill: a `--prompt-tokens` prompt in `--chunk`-token steps, each step's records read from
NVMe cold before it runs and its step standing in as a wait of `--chunk-s` (whole Flash's prefill chunk: 2048
tokens at the latest 2,358 tok/s); with prefetch the next chunk's records are read during the step, as the fast
runner does. `engram.nvme_prefill_overhead`: the wall over the steps' own time, with prefetch (without beside it).

Run on a GPU: python benchmarks/engram.py --device cuda --json
On the CPU (small sizes; proves it runs): python benchmarks/engram.py --device cpu --table-rows 200000 --nvme-gib 0.05
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c

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


def prefill_with_prefetch(record_file, ids: np.ndarray, chunk_s: float, prefetch: bool) -> float:
    """Wall seconds of a prompt's chunks ids [chunks, tokens, layers, cols] whose records are read before each
    step (a wait of `chunk_s`), the next chunk's read during the step when `prefetch`; every read cold."""
    from tfc.runtime.records.reader import RecordConfig
    from tfc.runtime.records.source import FileRecords

    per_chunk = ids.shape[1] * ids.shape[3]
    layers = [
        FileRecords(record_file, RecordConfig(cache_records=2 * per_chunk)) for _ in range(ids.shape[2])
    ]
    t0 = time.perf_counter()
    try:
        for i in range(ids.shape[0]):
            for k, src in enumerate(layers):
                src.gather(ids[i, :, k])
            if prefetch and i + 1 < ids.shape[0]:
                for k, src in enumerate(layers):
                    src.prefetch(ids[i + 1, :, k])
            time.sleep(chunk_s)
        return time.perf_counter() - t0
    finally:
        for src in layers:
            src._ahead.shutdown(wait=True)


def main() -> None:
    ap = c.parser(__doc__)
    ap.add_argument("--rows", default="1,16,64", help="rows a step, comma-separated")
    ap.add_argument("--cols", type=int, default=12, help="hash columns a rank gathers (12 at TP=2)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--table-rows", type=int, default=SHARD_ROWS)
    ap.add_argument("--nvme-gib", type=float, default=16.0)
    ap.add_argument(
        "--nvme-dir", default=None, help="a folder on the drive to measure (default: a temp folder)"
    )
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--step-s", type=float, default=1 / 65.7, help="whole-model one-row decode step, seconds")
    ap.add_argument(
        "--prompt-tokens", type=int, default=16384, help="the prefill prompt (0: no prefill part)"
    )
    ap.add_argument("--chunk", type=int, default=2048, help="prompt tokens a prefill step")
    ap.add_argument(
        "--chunk-s", type=float, default=2048 / 2358, help="a prefill step of whole Flash, seconds"
    )
    args = ap.parse_args()
    device_name = c.pick_device(args.device)
    c.ensure_tfc()
    import torch
    from tfc.kernels.dsv41.engram_rows import bf16_lut, gather_rows, gather_rows_reference
    from tfc.runtime.models.dsv41.fast.engram_staging import EngramStaging
    from tfc.runtime.records.reader import RecordConfig, RecordFile
    from tfc.runtime.records.source import FileRecords, TableRecords

    run = c.Run("engram", "engram.py", device_name, args.commit)
    device = torch.device(device_name)
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
    out: dict = {"args": vars(args), "points": {}}
    dev_table = _table(args.table_rows, device_name)
    host_table = _table(args.table_rows, "cpu").numpy()
    folder = Path(args.nvme_dir or tempfile.mkdtemp(prefix="tfc-engram-bench-"))
    path, nvme_rows = _record_file(folder, args.nvme_gib)
    record_file = RecordFile(path, 0, nvme_rows * RECORD, RECORD, RecordConfig())
    out["nvme"] = {"file_gib": args.nvme_gib, "reads": record_file.method, "notes": record_file.notes}
    warm = RecordConfig(cache_records=(args.steps + 2) * widest * args.cols)  # every timed step's records
    tiers = {
        "host": {k: TableRecords(host_table, "host table") for k in range(args.layers)},
        "nvme": {k: FileRecords(record_file, RecordConfig(cache_records=0)) for k in range(args.layers)},
        "nvme_warm": {k: FileRecords(record_file, warm) for k in range(args.layers)},
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
                if tier == "nvme_warm":  # this row count's steps, read once into the LRU
                    for i in range(-2, args.steps):
                        staging.write(staging.records(_padded(ids_of[i], widest), None))
                local = torch.as_tensor(staging.local[:rows], device=device)

                def staged(i, staging=staging, ids_of=ids_of, local=local, rows=rows):
                    staging.write(staging.records(_padded(ids_of[i], widest), None))
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
        if args.prompt_tokens:
            chunks = rng.integers(
                0, nvme_rows, (args.prompt_tokens // args.chunk, args.chunk, args.layers, args.cols)
            )
            walls = {p: prefill_with_prefetch(record_file, chunks, args.chunk_s, p) for p in (False, True)}
            steps_s = len(chunks) * args.chunk_s
            out["prefill"] = {"steps_s": steps_s, "no_prefetch_s": walls[False], "prefetch_s": walls[True]}
            print(f"prefill of {args.prompt_tokens} tokens: {walls[True]:.2f} s with prefetch, {walls[False]:.2f} s "
                  f"without, {steps_s:.2f} s of steps", flush=True)  # fmt: skip
    finally:
        for sources in (tiers["nvme"], tiers["nvme_warm"]):
            for src in sources.values():
                src._ahead.shutdown(wait=True)
        record_file.close()
        if args.nvme_dir is None:
            path.unlink()
            folder.rmdir()
    run.data.update(out)
    one = out["points"][min(rows_list)]
    shares = {tier: one[f"{tier}_s"] / args.step_s for tier in ("device", "host", "nvme", "nvme_warm")}
    step = f"a whole-model one-row decode step of {args.step_s * 1e3:.1f} ms (--step-s)"
    run.metric("engram.host_step_share", shares["host"], "fraction", "<= 0.10",
               f"{step}; the device-resident gather {shares['device']:.2%}")  # fmt: skip
    run.metric("engram.nvme_step_share", shares["nvme_warm"], "fraction", "<= 0.25",
               f"{step}, the LRU warm; every record read cold {shares['nvme']:.2%} ({out['nvme']['reads']})")  # fmt: skip
    if "prefill" in out:
        pre = out["prefill"]
        run.metric("engram.nvme_prefill_overhead", pre["prefetch_s"] / pre["steps_s"] - 1, "fraction", None,
                   f"a {args.prompt_tokens}-token prompt's {pre['steps_s']:.2f} s of steps; without prefetch "
                   f"{pre['no_prefetch_s'] / pre['steps_s'] - 1:.2%}")  # fmt: skip
    run.finish(args.json)


def _padded(ids: np.ndarray, widest: int) -> np.ndarray:
    """A step's ids [rows, layers, cols] in the staging's [widest, layers, cols] (padding rows read row 0)."""
    out = np.zeros((widest, *ids.shape[1:]), np.int64)
    out[: ids.shape[0]] = ids
    return out


if __name__ == "__main__":
    main()
