"""Where `tfc serve`'s start-to-ready goes: starts to /health ready, the boot thread and the main thread profiled.

    python benchmarks/serve_boot_profile.py --image IMG/rank0 --device cuda --tokenizer TOK --out DIR

Starts `tfc serve` `--starts` times (the first compiles what a restart loads), each to its first 200 from
/health and then SIGTERM; the start numbered `--profile` (default: the second) runs with cProfile on the boot
thread (`run._boot_steps`: worker, model, warm-up) and on the main thread (interpreter start, imports, the
HTTP stack). Writes DIR/serve_boot_profile.json (ready seconds and boot phases of every start) and, for the
profiled start, boot_cumulative.txt, boot_self.txt, main_cumulative.txt.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))


def child(prof_dir: Path, argv: list[str]) -> None:
    """Run `tfc ARGV` with the boot thread and the main thread profiled into prof_dir."""
    import atexit
    import runpy

    main_prof = cProfile.Profile()
    main_prof.enable()
    atexit.register(lambda: (main_prof.disable(), main_prof.dump_stats(prof_dir / "main.prof")))
    from tfc.runtime import serve as run

    boot_steps = run._boot_steps

    def profiled(*args, **kwargs):
        prof = cProfile.Profile()
        try:
            prof.enable()
        except ValueError:  # Python 3.12 on: one profiler sees every thread, main.prof holds the boot too
            return boot_steps(*args, **kwargs)
        try:
            return boot_steps(*args, **kwargs)
        finally:
            prof.disable()
            prof.dump_stats(prof_dir / "boot.prof")

    run._boot_steps = profiled
    sys.argv = ["tfc", *argv]
    runpy.run_module("tfc", run_name="__main__", alter_sys=True)


def top(prof: Path, out: Path, sort: str, count: int) -> None:
    with open(out, "w") as f:
        pstats.Stats(str(prof), stream=f).sort_stats(sort).print_stats(count)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tokenizer")
    ap.add_argument("--starts", type=int, default=3)
    ap.add_argument("--profile", type=int, default=2, help="which start (1-based) runs profiled")
    ap.add_argument("--serve-args", default="--no-draft", help="more `tfc serve` options, one string")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    from serve_cpu import PHASE
    from support.server import ServerProcess

    args.out.mkdir(parents=True, exist_ok=True)
    extra = ["--model-name", "m", *args.serve_args.split()]
    if args.tokenizer:
        extra += ["--tokenizer", args.tokenizer]
    starts = []
    for i in range(1, args.starts + 1):
        profiled = i == args.profile  # the same command through this script's child mode
        command = (
            [sys.executable, str(Path(__file__).resolve()), "--child", str(args.out)] if profiled else None
        )
        proc = ServerProcess(args.image, *extra, device=args.device, log=args.out / f"serve_start{i}.log",
                             command=command)  # fmt: skip
        started = time.perf_counter()
        try:
            proc.wait_ready(600)
            ready = time.perf_counter() - started
            _, text, _ = proc.get("/metrics")
            starts.append({"start": i, "profiled": profiled, "ready_s": round(ready, 3),
                           "phases_s": {k: round(float(v), 4) for k, v in PHASE.findall(str(text))}})  # fmt: skip
            print(f"start {i}{' (profiled)' if profiled else ''}: ready in {ready:.2f} s", flush=True)
        finally:
            proc.stop()
    (args.out / "serve_boot_profile.json").write_text(
        json.dumps({"image": args.image, "starts": starts}, indent=1)
    )
    for name in ("boot", "main"):
        prof = args.out / f"{name}.prof"
        if prof.exists():
            top(prof, args.out / f"{name}_cumulative.txt", "cumulative", 120)
            top(prof, args.out / f"{name}_self.txt", "tottime", 50)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:  # the profiled server: --child DIR, then tfc's own arguments
        child(Path(sys.argv[2]), sys.argv[3:])
    else:
        main()
