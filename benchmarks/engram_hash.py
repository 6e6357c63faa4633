"""Benchmark: hash 1M token positions for both Engram layers of DeepSeek-V4.1 on the host (target < 1 s)."""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from tfc.compiler.engram_map import build_token_map
from tfc.packs.engram_layout import check_layout, hash_multipliers
from tfc.runtime.models.dsv41.engram_hash import HashTables, compress, hash_compressed, hash_ids

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engram_map import hardware, tokenizer_path
from tfc.fixtures.flash_headers import flash_text_config

POSITIONS = 1_000_000
REPEATS = 7
FLASH = {k: v for k, v in flash_text_config().items() if k.startswith("engram_")}


def timed(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    layout = check_layout(FLASH)
    token_map = build_token_map(tokenizer_path())
    tables = HashTables(
        token_map.ids,
        hash_multipliers(layout.layer_ids, layout.max_ngram, token_map.size),
        layout.primes_array(),
        layout.offsets_array(),
        pad_id=2,
        dead_ids=(129_264,),
    )
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 129_280, POSITIONS)
    ids[rng.integers(0, POSITIONS, 2_000)] = 129_264  # a few image positions
    out = np.empty((POSITIONS, 2, 24), np.int64)  # the runtime hashes into a reused buffer
    x = compress(tables, ids)
    whole = timed(lambda: hash_ids(tables, ids), REPEATS)
    reused = timed(lambda: hash_compressed(tables, compress(tables, ids), out=out), REPEATS)
    single = timed(lambda: hash_compressed(tables, x, out=out, threads=1), REPEATS)
    assert np.array_equal(out, hash_ids(tables, ids))
    result = {
        "benchmark": "Engram hash rows of 1M positions x 2 layers x 24 columns (int64), host numpy",
        "command": "python benchmarks/engram_hash.py",
        "hardware": hardware(),
        "numpy": np.__version__,
        "positions": POSITIONS,
        "repeats": REPEATS,
        "median_s_hash_ids_new_output": round(statistics.median(whole), 4),
        "median_s_compress_and_hash_into_buffer": round(statistics.median(reused), 4),
        "median_s_hash_into_buffer_one_thread": round(statistics.median(single), 4),
        "all_s_hash_ids_new_output": [round(t, 4) for t in whole],
        "target_s": 1.0,
    }
    (Path(__file__).parent / "results" / "engram" / "engram_hash.json").write_text(
        json.dumps(result, indent=1) + "\n"
    )
    json.dump(result, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
