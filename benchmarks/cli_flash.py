"""Time a whole header-only `tfc` process on the flash-headers pack (Python start included) and record it.

Usage:
  .venv/bin/python benchmarks/cli_flash.py --command inspect --limit 1.0 --out benchmarks/results/cli/inspect_flash.md
  .venv/bin/python benchmarks/cli_flash.py --command "plan --tp 2 --json" --limit 1.5 --out benchmarks/results/cli/plan_flash.md
Builds the flash-headers pack once (sparse files, ~200 GB apparent) unless --pack points at one.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tfc.packs.safetensors_header import read_header

ROOT = Path(__file__).resolve().parents[1]


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--command",
        default="inspect",
        help="the tfc subcommand and its options; the pack goes after the first word",
    )
    ap.add_argument("--limit", type=float, default=1.0, help="the target, seconds of wall time")
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--pack", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "cli" / "inspect_flash.md")
    args = ap.parse_args()
    tfc = [str(Path(sys.executable).with_name("tfc"))]
    with tempfile.TemporaryDirectory() as tmp:
        pack = args.pack
        if pack is None:
            pack = Path(tmp) / "flash"
            t0 = time.perf_counter()
            subprocess.run(
                [*tfc, "fixture", "flash-headers", str(pack)], check=True, stdout=subprocess.DEVNULL
            )
            build_s = time.perf_counter() - t0
        else:
            build_s = float("nan")
        words = args.command.split()
        command = [*tfc, words[0], str(pack), *words[1:]]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)  # warm the page cache once
        walls, cpus, loads = [], [], []
        for _ in range(args.runs):
            loads.append(os.getloadavg()[0])
            before = os.times()
            t0 = time.perf_counter()
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
            walls.append(time.perf_counter() - t0)
            after = os.times()
            cpus.append(
                (after.children_user - before.children_user)
                + (after.children_system - before.children_system)
            )
        tensors = sum(len(read_header(p).names) for p in pack.glob("*.safetensors"))
        apparent = sum(p.stat().st_size for p in pack.glob("*.safetensors"))
        shards = len(list(pack.glob("*.safetensors")))
    median = statistics.median(walls)
    verdict = "PASS" if median <= args.limit else "FAIL"
    shown = " ".join(["tfc", words[0], "FLASH", *words[1:]])
    text = f"""# `tfc {words[0]}` on flash-headers

Whole process wall time (Python start included), `{shown}`, page cache warm.
The process parses all 44 headers and the index, validates every rule (coverage, shapes, widths, codebook
marker values) and does its work from headers alone. This 2-core machine is shared: other work running
at the same time raises the wall time, so the load average of the runs is recorded with them.

| quantity | value |
| --- | --- |
| median wall, {args.runs} runs | **{median:.3f} s** ({verdict}: limit {args.limit} s) |
| min / max wall | {min(walls):.3f} / {max(walls):.3f} s |
| median CPU (user + sys) | {statistics.median(cpus):.3f} s |
| 1-min load average during runs (median) | {statistics.median(loads):.2f} |
| pack | flash-headers: {shards} shards, {tensors:,} tensors, {apparent / 1e9:,.1f} GB apparent (holes) |
| fixture build time | {build_s:.2f} s |
| hardware | {os.cpu_count()} CPUs, {_cpu()}; Python {platform.python_version()}; {platform.system()} {platform.release()} |

Command: `.venv/bin/python benchmarks/cli_flash.py --command "{args.command}" --limit {args.limit} --runs {args.runs} --out {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}`

All runs (s): {", ".join(f"{w:.3f}" for w in walls)}
"""
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
