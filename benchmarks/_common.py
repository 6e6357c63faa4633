"""What every benchmark shares: the hardware it ran on, timers, the rates a figure is held against (memory
copy, the bf16 matrix peak, pinned host-to-device copy, disk reads), tfc run as its users run it, and a run's
result file and summary.json entries."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import types
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _summary import SUMMARY, apply_result, format_target, format_value, parse_target

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
_FOLDERS = {"tfc": "tfc", "tfc.packs": "packs", "tfc.compiler": "compiler", "tfc.cache": "cache",
            "tfc.runtime": "runtime", "tfc.kernels": "kernels", "tfc.fixtures": "fixtures"}  # fmt: skip


def ensure_tfc() -> None:
    """Import tfc as installed, or map the checkout's folders onto tfc.* package names."""
    if importlib.util.find_spec("tfc") is not None and importlib.util.find_spec("tfc.packs") is not None:
        return
    for name, folder in _FOLDERS.items():
        module = types.ModuleType(name)
        module.__path__ = [str(ROOT / folder)]
        module.__file__ = str(ROOT / folder / "__init__.py")
        sys.modules[name] = module  # `import tfc.x` and `from tfc import x` both find it here


# -- arguments and the machine ------------------------------------------------------------------------------


def parser(doc: str, device: bool = True) -> argparse.ArgumentParser:
    """The options every benchmark takes: --json, --commit, and --device where a device matters."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if device:
        ap.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda if available, else cpu")
    ap.add_argument("--json", action="store_true",
                    help="write a result file under benchmarks/results/<topic>/ and update summary.json")  # fmt: skip
    ap.add_argument("--commit", help="the commit measured (default: git's HEAD of this checkout)")
    return ap


def fail(line: str) -> None:
    """One line on stderr and exit 2, as tfc's commands refuse bad input."""
    print(line, file=sys.stderr)
    sys.exit(2)


def pick_device(asked: str | None) -> str:
    """The device asked for, or cuda where torch sees one, else cpu."""
    import torch

    if asked == "cuda" and not torch.cuda.is_available():
        fail("--device cuda: torch sees no CUDA device here")
    return asked or ("cuda" if torch.cuda.is_available() else "cpu")


def needs_cuda(device: str, script: str, why: str) -> None:
    """Stop with one line where a GPU-only benchmark was asked to run elsewhere."""
    if device != "cuda":
        fail(f"{script}: needs a CUDA device ({why}), and --device is {device}")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def hardware(device: str) -> dict:
    """The machine: its GPU (where one runs the benchmark), CPU, memory and software."""
    out: dict = {"cpu": cpu_name(), "cores": os.cpu_count(), "python": platform.python_version(),
                 "platform": platform.platform()}  # fmt: skip
    with contextlib.suppress(ValueError, OSError):
        out["ram_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    if "torch" in sys.modules or device == "cuda":
        import torch

        out["torch"] = torch.__version__
        if device == "cuda":
            out["gpu"] = torch.cuda.get_device_name()
            out["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
            try:
                import triton

                out["triton"] = triton.__version__
            except ImportError:
                pass
    return out


def hardware_line(hw: dict) -> str:
    """The machine in one line, as summary.json's `hardware` holds it: the GPU first where one ran."""
    host = f"{hw['cores']}-core {hw['cpu']}"
    return f"{hw['gpu']} ({host})" if hw.get("gpu") else f"{host}, CPU only"


def git_commit() -> str:
    """This checkout's HEAD, short, with '+' where the tree differs from it; 'unknown' without git."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True, timeout=10).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()  # fmt: skip
        return head + ("+" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


# -- timing and the rates a figure is held against ------------------------------------------------------------


def median(values) -> float:
    return statistics.median(list(values))


def cuda_timed(fn, reps: int = 20, warm: int = 3) -> float:
    """Median seconds of fn between CUDA events."""
    import torch

    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e-3)
    return median(out)


def host_timed(fn, reps: int = 20, warm: int = 3) -> float:
    """Median seconds of fn by the host's clock."""
    for _ in range(warm):
        fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return median(out)


def timed(device: str, fn, reps: int = 20, warm: int = 3) -> float:
    """Median seconds of fn on this device: between CUDA events, or by the host's clock on the CPU."""
    return (cuda_timed if device == "cuda" else host_timed)(fn, reps, warm)


def sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def graphed(fn, device: str = "cuda"):
    """fn captured once as a CUDA graph (after a warm-up run): a replay callable; on the CPU fn itself."""
    if device != "cuda":
        return fn
    import torch

    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def copy_gbps(device: str) -> float:
    """Memory bandwidth of the device: a copy (1 GiB on a GPU, 256 MiB on the CPU), bytes read plus written."""
    import torch

    n = 1 << (30 if device == "cuda" else 28)
    src = torch.randint(0, 255, (n,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * n / timed(device, lambda: dst.copy_(src), reps=30 if device == "cuda" else 5) / 1e9


def bf16_tflops(device: str) -> float:
    """The bf16 matrix peak as torch reaches it: an 8192³ product on a GPU, graphed (2048³ on the CPU)."""
    import torch

    n = 8192 if device == "cuda" else 2048
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    return 2 * n**3 / timed(device, graphed(lambda: a @ b, device), reps=20 if device == "cuda" else 3) / 1e12


def pinned_h2d_gbps(nbytes: int = 2 << 30, reps: int = 5) -> float:
    """Host-to-device bandwidth from page-locked memory, the best of `reps` copies, GB/s."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True).fill_(7)
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    rates = []
    for _ in range(reps):
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        rates.append(nbytes / (time.perf_counter() - t0) / 1e9)
    del src, dst
    torch.cuda.empty_cache()
    return max(rates)


def drop_page_cache(files: list[Path]) -> str:
    """Evict files from the page cache (posix_fadvise, and /proc/sys/vm/drop_caches where allowed); how."""
    os.sync()
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    try:
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
        return "fadvise+drop_caches"
    except OSError:
        return "fadvise"


def in_threads(items, fn, threads: int) -> None:
    """fn over items on `threads` threads; the first error is raised."""
    it, lock, errors = iter(list(items)), threading.Lock(), []

    def work() -> None:
        while not errors:
            with lock:
                x = next(it, None)
            if x is None:
                return
            try:
                fn(x)
            except BaseException as e:
                errors.append(e)

    ts = [threading.Thread(target=work) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]


def read_gbps(files: list[Path], threads: int, request: int = 64 << 20) -> float:
    """Plain parallel pread of every file into per-thread buffers, GB/s (what the page cache or disk gives)."""
    work = [
        (f, off, min(request, f.stat().st_size - off))
        for f in files
        for off in range(0, f.stat().st_size, request)
    ]
    local = threading.local()

    def read(w) -> None:
        f, off, n = w
        if not hasattr(local, "buf"):
            local.buf = bytearray(request)
        fd = os.open(f, os.O_RDONLY)
        try:
            os.preadv(fd, [memoryview(local.buf)[:n]], off)
        finally:
            os.close(fd)

    t0 = time.perf_counter()
    in_threads(work, read, threads)
    return sum(n for _, _, n in work) / (time.perf_counter() - t0) / 1e9


# -- tfc as its users run it ---------------------------------------------------------------------------------


def tfc_command(*args: str) -> list[str]:
    """`python -m tfc ARGS`, as a subprocess argument list."""
    return [sys.executable, "-m", "tfc", *args]


def tfc(*args: str, env: dict | None = None, timeout: float | None = None) -> str:
    """Run `tfc ARGS` outside the checkout (whose tfc/ folder would shadow the install); its last stdout line."""
    r = subprocess.run(tfc_command(*args), capture_output=True, text=True, env={**os.environ, **(env or {})},
                       cwd=tempfile.gettempdir(), timeout=timeout)  # fmt: skip
    if r.returncode:
        raise RuntimeError(f"tfc {' '.join(args[:2])} failed ({r.returncode}): {r.stderr.strip()[-600:]}")
    lines = r.stdout.strip().splitlines()
    return lines[-1] if lines else ""


def tiny_image(folder: Path) -> str:
    """The tiny pack (`tfc fixture tiny`) prepared at TP=1 under folder; its image's path."""
    tfc("fixture", "tiny", str(folder / "pack"))
    return tfc("prepare", str(folder / "pack"), "--tp", "1", "--store", str(folder / "store"))


def slice_image(folder: Path, layers: int = 4, jobs: int = 16) -> Path:
    """A Flash-geometry slice (`tfc fixture flash-random --layers N`, 22 GB at 4) prepared under folder, the pack
    removed after; its rank folder."""
    pack, store = folder / "pack", folder / "store"
    tfc("fixture", "flash-random", str(pack), "--layers", str(layers), "-j", str(jobs))
    image = Path(tfc("prepare", str(pack), "--store", str(store)))
    subprocess.run(["rm", "-rf", str(pack)], check=True)
    return image / "rank0" if (image / "rank0").is_dir() else image


# -- results --------------------------------------------------------------------------------------------------


@dataclass
class Metric:
    """One headline figure of a run: summary.json's entry less the run's own fields."""

    id: str
    value: float | None
    unit: str
    target: dict | None
    limit: str | None


@dataclass
class Run:
    """A benchmark run: its topic, machine, raw data and headline metrics; `finish` prints and writes them."""

    topic: str
    script: str
    device: str
    commit: str | None = None
    data: dict = field(default_factory=dict)
    metrics: list[Metric] = field(default_factory=list)
    started: float = field(default_factory=time.time)

    def metric(self, id: str, value: float | None, unit: str, target: str | None, limit: str | None) -> None:
        """Record a headline figure; `target` is written as ">= 0.5" or "<= 6" (None: stated, no target)."""
        self.metrics.append(
            Metric(id, None if value is None else float(f"{value:.4g}"), unit, parse_target(target), limit)
        )

    def finish(self, write: bool) -> Path | None:
        """Print every metric with its target, limit and the hardware; with `write`, the result file and the
        summary entries."""
        hw = hardware(self.device)
        command = " ".join(["python", f"benchmarks/{self.script}", *sys.argv[1:]])
        date = time.strftime("%Y-%m-%d")
        software = ", ".join(f"{k} {hw[k]}" for k in ("torch", "triton") if k in hw)
        print(f"\n{self.script} on {hardware_line(hw)}" + (f"; {software}" if software else ""))
        width = max([len(m.id) for m in self.metrics] + [6])
        for m in self.metrics:
            print(f"  {m.id:<{width}}  {format_value(m.value, m.unit):>14}  target {format_target(m.target, m.unit):<10}"
                  f"  against {m.limit or '-'}")  # fmt: skip
        if not write:
            return None
        commit = self.commit or git_commit()
        slug = re.sub(r"[^a-z0-9]+", "", (hw.get("gpu") or "cpu").lower().replace("nvidia", ""))[:12] or "cpu"
        out = (
            BENCH
            / "results"
            / self.topic
            / f"{Path(self.script).stem}_{slug}_{time.strftime('%Y%m%d_%H%M%S')}.json"
        )
        out.parent.mkdir(parents=True, exist_ok=True)
        doc = {"script": self.script, "command": command, "date": date, "commit": commit, "hardware": hw,
               "hardware_line": hardware_line(hw),
               "wall_s": round(time.time() - self.started, 1),
               "metrics": [m.__dict__ for m in self.metrics], "data": self.data}  # fmt: skip
        out.write_text(json.dumps(doc, indent=1, default=str) + "\n")
        apply_result(out)
        print(f"wrote {out.relative_to(ROOT)} and {len([m for m in self.metrics if m.value is not None])} "
              f"entries of {SUMMARY.relative_to(ROOT)}")  # fmt: skip
        return out
