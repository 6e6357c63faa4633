#!/usr/bin/env python3
"""The header-only commands on the full-scale flash-headers pack: whole `tfc inspect` and `tfc plan --tp 2 --json`
processes, Python's start included, against a bare Python process of the same run.

    python benchmarks/cli.py [--runs 9] [--pack FLASH] [--json]

Builds `tfc fixture flash-headers` (46 shards, ~192k tensors, ~400 GB of holes in sparse files; about a second)
unless --pack names one. Each command runs once to warm the page cache, then --runs times; the figure is the
median wall time. A shared machine's load raises it: the load average is recorded with the runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c

COMMANDS = (
    ("cli.inspect_s", ["inspect"], "<= 1.0"),
    ("cli.plan_tp2_s", ["plan", "--tp", "2", "--json"], "<= 1.5"),
)


def wall(command: list[str], runs: int) -> tuple[float, list[float], float]:
    """Median wall seconds of `runs` processes after one warm-up, every run, and the median load average."""
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, cwd=tempfile.gettempdir())
    walls, loads = [], []
    for _ in range(runs):
        loads.append(os.getloadavg()[0])
        t0 = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, cwd=tempfile.gettempdir())
        walls.append(time.perf_counter() - t0)
    return c.median(walls), walls, c.median(loads)


def main() -> None:
    ap = c.parser(__doc__, device=False)
    ap.add_argument("--runs", type=int, default=9, help="timed processes a command (median)")
    ap.add_argument(
        "--pack", type=Path, help="a flash-headers pack (default: build one in a temporary folder)"
    )
    args = ap.parse_args()
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    run = c.Run("cli", "cli.py", "cpu", args.commit)
    with tempfile.TemporaryDirectory() as tmp:
        pack = args.pack
        if pack is None:
            pack = Path(tmp) / "flash"
            c.tfc("fixture", "flash-headers", str(pack))
        python, _, _ = wall([sys.executable, "-c", "pass"], args.runs)
        run.data["python_start_s"] = python
        for id, words, target in COMMANDS:
            median, walls, load = wall(c.tfc_command(words[0], str(pack), *words[1:]), args.runs)
            run.data[id] = {"command": f"tfc {words[0]} FLASH {' '.join(words[1:])}".strip(), "median_s": median,
                            "walls_s": walls, "load": load}  # fmt: skip
            print(f"[cli] tfc {' '.join(words)}: {median:.3f} s (load {load:.2f})", flush=True)
            run.metric(id, median, "s", target, f"a bare Python process of the same run: {python:.3f} s")
    run.finish(args.json)


if __name__ == "__main__":
    main()
