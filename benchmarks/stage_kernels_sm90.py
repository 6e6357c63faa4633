#!/usr/bin/env python3
"""Compile every Triton stage kernel for an H200 (sm_90) at DeepSeek-V4.1-Flash shapes, without a GPU.

The stage kernels are those of kernels/dsv41/kv_pack.py, attend_rows.py, mhc_stages.py, router_pick.py, step_rows.py and
hidden_tap.py (device helpers in kernels/dsv41/stage_tl.py), with the prefill's many-row EXL3 product and MoE
(kernels/exl3/rows.py) on both of its paths (the decoded scratch, kernels/exl3/scratch.py, and the tiles that decode
in their loop). Nothing
here needs a GPU or a CUDA driver: each entry point is called on empty CPU tensors of the Flash shapes (rows R = 16,
decode, and 2048, prefill) with Triton's launch caught, so the kernel, constexprs, num_warps, options
(enable_fp_fusion) and the arguments' dtypes and specialisations (divisibility by 16, strides of 1) are the entry
point's own; each distinct launch is then compiled with `triton.compile` for GPUTarget("cuda", 90, 32) through the
bundled ptxas (-v, its log read) in a fresh Triton cache, so every compile is cold and timed. Per kernel the JSON
holds the entry point, constexprs, num_warps, num_stages, registers, spills (`n_spills` as Triton reads it on a GPU:
the thread's local bytes, its stack frame, / 4; with ptxas' spill stores / loads in bytes and the SASS local loads /
stores, which tell a real spill from a small local array), shared memory (the dynamic shared memory Triton launches
with) and the compile seconds, or the error.

    python3 benchmarks/stage_kernels_sm90.py --out benchmarks/results/decode/stage_kernels_sm90_run1.json

`--only exl3_rows` compiles only the entry points whose name holds that text (none: an error). `--triton-path` puts
another Triton first on sys.path (e.g. the 3.6 of the H200 machine); the launch capture uses Triton 3.9's
JITFunction internals (create_function_from_signature, _pack_args).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# DeepSeek-V4.1-Flash (fixtures/flash_headers.py): norms bf16; mHC, sinks and the router bias fp32
ROWS = (16, 2048)  # decode, prefill
D, HC, Q_LORA = 5120, 4, 1280
HEADS, HEAD_DIM, HALF = 64, 512, 32  # rope 64: cos / sin [R, 32]
WINDOW, TOPK = 128, 512
IDX_HEADS, IDX_DIM = 32, 128  # index keys 64 code bytes + 4 UE8M0 scale bytes
ENTRY_BYTES = HEAD_DIM // 2 + HEAD_DIM // 16  # 256 code bytes + 32 e4m3 scale bytes
WINDOW_BYTES = HEAD_DIM + HEAD_DIM // 32  # 512 e4m3 bytes + 16 UE8M0 scale bytes
EXPERTS, TOP_K, SCALING = 384, 6, 1.5
SELECT_COLS, CHUNK, RATIO = 8192, 4096, 2  # select's columns, chunk_scores' chunk (SCORE_CHUNK), pooled ratio
SLOTS, ENTRIES = 8, 65536  # cache slots (the ring / pending tables hold slots + 1), pooled entries
EPS = 1e-6
# the many-row products' paths: scratch (through the decoded scratch), tiles (decoding in the tiles' loop)
ROWS_PATHS = ("scratch", "tiles")
SMEM_MAX = 232448  # an H200 block's largest dynamic shared memory (227 KiB)


def _error_line(exc: BaseException) -> str:
    """A compile error as one string: its message's head and tail and its causes' (Triton's location first)."""
    parts = []
    while exc is not None and len(parts) < 4:
        msg = str(exc).strip()
        parts.append(
            f"{type(exc).__name__}: " + (msg if len(msg) <= 1600 else f"{msg[:800]} ... {msg[-800:]}")
        )
        exc = exc.__cause__ or exc.__context__
    return " <- ".join(parts)


def _launches(torch) -> list[tuple[str, str, object]]:
    """(entry point, variant, call(rows)) of every Flash launch of the stage kernels."""
    from tfc.kernels.dsv41 import attend_rows as ar
    from tfc.kernels.dsv41 import hidden_tap as ht
    from tfc.kernels.dsv41 import index_scores as ks
    from tfc.kernels.dsv41 import kv_pack as kp
    from tfc.kernels.dsv41 import mhc_stages as mh
    from tfc.kernels.dsv41 import router_pick as rp
    from tfc.kernels.dsv41 import step_rows as sr
    from tfc.kernels.exl3 import rows as xr
    from tfc.kernels.exl3.expert_table import ExpertTable

    bf16, i64, u8 = torch.bfloat16, torch.int64, torch.uint8
    e = torch.empty

    def rope(r):
        """cos, sin [r, 32]."""
        return e(r, HALF), e(r, HALF)

    def attend(r, entries):
        """attend_rows over the window (and TOPK entries)."""
        extra = {"entries": e(ENTRIES, ENTRY_BYTES, dtype=u8), "at": e(r, TOPK, dtype=i64),
                 "ok": e(r, TOPK, dtype=torch.bool)} if entries else {}  # fmt: skip
        ring = e((SLOTS + 1) * (WINDOW + r), WINDOW_BYTES, dtype=u8)
        return ar.attend_rows(e(r, HEADS, HEAD_DIM), ring, e(r, WINDOW, dtype=i64),
                              e(r, WINDOW, dtype=torch.bool), e(HEADS), *rope(r), **extra)  # fmt: skip

    def select(r, cand):
        """select without making candidates, given a candidate mask or none."""
        c = e(r, SELECT_COLS, dtype=torch.bool) if cand else None
        return rp.select(e(r, SELECT_COLS), e(r, dtype=i64), TOPK, c, 2048, 8, False)

    def ratio(r):
        """step_rows.ratio_rows at ratio 2 over a slot's page ids."""
        return sr.ratio_rows(e(r, dtype=i64), e(r, 1024, dtype=i64), 2, 32)

    def rows_gemm(r, path):
        """The prefill's many-row EXL3 product at the q-LoRA shape, on one path."""
        one = torch.zeros(1, dtype=i64)
        rotated = (torch.zeros(r, D, dtype=torch.float16), torch.ones(r))
        return xr.launch_rows(rotated, torch.zeros(D // 16 * Q_LORA // 16 * 32, dtype=torch.int32), one,
                              one.int() + 64, one.int() + 2, e(Q_LORA, dtype=torch.float16),
                              xr.dense_tiles(r, torch.device("cpu")), Q_LORA, (64,), 2, e(r, Q_LORA),
                              scratch=path == "scratch")  # fmt: skip

    def table(k, n, ragged):
        """An expert table's shapes: 4-bit stacked, or ragged widths of 2-6 bits (both MUL1, as Flash's tables)."""
        widths = (32, 48, 64, 80, 96) if ragged else (64,)
        return ExpertTable("ragged" if ragged else "stack", torch.zeros(EXPERTS + 1, dtype=torch.int32).view(torch.int16),
                           torch.zeros(EXPERTS + 1, dtype=i64), torch.full((EXPERTS + 1,), 64, dtype=torch.int32),
                           torch.full((EXPERTS + 1,), 2, dtype=torch.int32), e(EXPERTS + 1, k, dtype=torch.float16),
                           e(EXPERTS + 1, n, dtype=torch.float16), k, n, 2, widths)  # fmt: skip

    def rows_moe(r, path, widths):
        """The prefill's MoE (gate/up and down tables) on one path."""
        ragged = widths != "4 bit"
        ids = torch.zeros(r, TOP_K, dtype=i64)
        return xr.moe_rows(torch.zeros(r, D), ids, torch.ones(r, TOP_K), table(D, 2048, ragged),
                           table(D, 2048, ragged), table(2048, D, ragged), 10.0,
                           scratch=path == "scratch")  # fmt: skip

    streams = lambda r: e(r, HC, D)  # noqa: E731
    m = (2 + HC) * HC
    return [
        ("kv_pack.window_rows", "n 512, rope 64, fp8", lambda r: kp.window_rows(
            e(r, HEAD_DIM), e(HEAD_DIM, dtype=bf16), EPS, *rope(r))),
        ("kv_pack.key_rows", "index keys n 128, rope 64", lambda r: kp.key_rows(
            e(r, IDX_DIM), e(IDX_DIM, dtype=bf16), EPS, *rope(r), None)),
        ("kv_pack.entry_rows", "n 512, rope 64", lambda r: kp.entry_rows(e(r, HEAD_DIM), *rope(r), None)),
        ("kv_pack.index_query", "32 heads x 128", lambda r: kp.index_query(
            e(r, IDX_HEADS * IDX_DIM), IDX_HEADS, *rope(r), None)),
        ("index_scores.chunk_scores", f"chunk of {CHUNK} keys, 32 heads x 128", lambda r: ks.chunk_scores(
            e(r, CHUNK, IDX_DIM // 2 + IDX_DIM // 32, dtype=u8), e(r, IDX_HEADS, IDX_DIM), e(r, IDX_HEADS),
            None)),
        ("kv_pack.pooled", f"ratio {RATIO}, n 512", lambda r: kp.pooled(
            e(2, SLOTS + 1, r + RATIO, HEAD_DIM), e(r, 1, dtype=i64), e(r, RATIO, dtype=i64),
            e(HEAD_DIM, dtype=bf16), EPS)),
        ("attend_rows.attend_rows", "window 128 only (ratio-0 layers)", lambda r: attend(r, False)),
        ("attend_rows.attend_rows", f"window 128 + {TOPK} entries", lambda r: attend(r, True)),
        *[("mhc_stages.rms_norm", f"n {n}{note}", lambda r, n=n: mh.rms_norm(e(r, n), e(n, dtype=bf16), EPS))
          for n, note in ((Q_LORA, " (q_lora)"), (HEAD_DIM, " (compressor, ratio 1)"), (D, " (dspark)"))],
        ("mhc_stages.collapse_norm", "hc 4 x 5120", lambda r: mh.collapse_norm(
            streams(r), e(r, HC), e(D, dtype=bf16), EPS)),
        ("mhc_stages.hc_expand", "hc 4 x 5120", lambda r: mh.hc_expand(
            e(r, D), streams(r), e(r, HC), e(r, HC, HC))),
        ("mhc_stages.hc_mix_logits", "fn [24, 20480]", lambda r: mh.hc_mix_logits(
            streams(r), e(m, HC * D), e(3), e(m), norm_eps=EPS, hc_eps=EPS)),
        ("mhc_stages.engram_gate", "hc 4 x 5120", lambda r: mh.engram_gate(
            streams(r), e(r, (HC + 1) * D), e(HC, D, dtype=bf16), EPS, 1e-6)),
        ("mhc_stages.rope_heads", "64 heads x 512, rope 64", lambda r: mh.rope_heads(
            e(r, HEADS * HEAD_DIM), HEADS, *rope(r))),
        ("router_pick.split3", "5120 to bf16", lambda r: rp.split3(e(r, D), bf16)),
        ("router_pick.pick", "split, E 384, top 6, normalised", lambda r: rp.pick(
            e(3 * r, EXPERTS), True, e(EXPERTS), TOP_K, SCALING, True)),
        ("router_pick.select", f"{SELECT_COLS} columns, k {TOPK}, no candidates", lambda r: select(r, False)),
        ("router_pick.select", f"{SELECT_COLS} columns, k {TOPK}, candidates", lambda r: select(r, True)),
        ("router_pick.select", f"{SELECT_COLS} columns, k {TOPK}, making candidates", lambda r: rp.select(
            e(r, SELECT_COLS), e(r, dtype=i64), TOPK, None, 2048, 8, True)),
        ("step_rows.ring_rows", f"window {WINDOW}", lambda r: sr.ring_rows(
            e(r, dtype=i64), e(r, dtype=i64), WINDOW, WINDOW + r)),
        ("step_rows.ratio_rows", "ratio 2, 32 entries a page", ratio),
        ("step_rows.page_rows", f"{TOPK} entries", lambda r: sr.page_rows(
            e(r, 1024, dtype=i64), e(r, TOPK, dtype=i64), 32)),
        ("hidden_tap.stream_mean_into", "hc 4 x 5120", lambda r: ht.stream_mean_into(streams(r), e(r, D))),
        *[(f"exl3_rows.exl3_gemm_rows ({p})", f"k {D}, n {Q_LORA}, 4 bit", lambda r, p=p: rows_gemm(r, p))
          for p in ROWS_PATHS],
        *[(f"exl3_rows.moe_rows ({p})", f"E {EXPERTS}, top {TOP_K}, {w}", lambda r, p=p, w=w: rows_moe(r, p, w))
          for p in ROWS_PATHS for w in ("4 bit", "ragged 2-6 bit")],
    ]  # fmt: skip


def _caught(call, rows: int) -> list[tuple]:
    """The (kernel, args, kwargs, grid) of each Triton launch `call(rows)` makes, none run."""
    from triton.runtime.jit import JITFunction

    seen = []
    run = JITFunction.run

    def catch(self, *args, grid, warmup, **kwargs):
        """Keep the launch instead of running it."""
        seen.append((self, args, kwargs, grid))

    JITFunction.run = catch
    try:
        call(rows)
    finally:
        JITFunction.run = run
    return seen


def _specialise(fn, args, kwargs, backend):
    """(signature, constexprs, attrs, options) exactly as Triton's launch of fn(*args, **kwargs) builds them."""
    from triton import knobs
    from triton.runtime.jit import create_function_from_signature

    kwargs = {"debug": bool(knobs.runtime.debug), **kwargs}
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, spec, opts = binder(*args, **kwargs)
    options, sig, consts, attrs = fn._pack_args(backend, kwargs, bound, spec, opts)
    return sig, consts, attrs, options


def _plain(v):
    """A JSON-able constexpr value."""
    v = getattr(v, "value", v)
    return v if isinstance(v, bool | int | float | str) or v is None else str(v)


def _tools(cubin: bytes) -> dict:
    """cuobjdump's resource usage and the SASS local loads / stores of one cubin."""
    from sass_sm90 import idp_loops
    from triton import knobs

    cuobjdump = knobs.nvidia.cuobjdump.path
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        res = subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True, text=True).stdout
        sass = subprocess.run([cuobjdump, "-sass", f.name], capture_output=True, text=True).stdout
    usage = {k: int(v) for k, v in re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", res)}
    local = len(re.findall(r"\b(?:LDL|STL)(?:\.\w+)*\s", sass))
    return {"usage": usage, "sass_local_ops": local, "decode_loops": idp_loops(sass)}


def _ptxas(log: str) -> dict:
    """Registers, stack and spill bytes from ptxas -v's log."""
    out = {}
    if m := re.search(r"Used (\d+) registers", log):
        out["ptxas_regs"] = int(m.group(1))
    if m := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log):
        out["stack_frame"], out["spill_stores"], out["spill_loads"] = map(int, m.groups())
    return out


def compile_one(fn, sig: dict, consts: dict, attrs: dict, options, target) -> dict:
    """Compile one launch for `target`: its registers, spills, shared memory and compile seconds."""
    import triton
    from triton import knobs
    from triton.compiler import ASTSource

    knobs.nvidia.dump_ptxas_log = True  # ptxas -v's log printed after each (cold) compile: caught below
    buf = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(buf):
        k = triton.compile(ASTSource(fn, sig, consts, attrs), target=target, options=options.__dict__)
    row = {"compile_s": round(time.perf_counter() - t0, 3), **_ptxas(buf.getvalue())}
    tools = _tools(k.asm["cubin"])
    usage = tools["usage"]
    row |= {
        "n_regs": usage.get("REG", row.get("ptxas_regs")),
        # Triton's n_spills on a GPU: CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES / 4, the thread's stack frame
        "n_spills": (usage.get("STACK", row.get("stack_frame", 0)) + usage.get("LOCAL", 0)) // 4,
        "shared": k.metadata.shared,
        "static_shared": usage.get("SHARED", 0),
        "stack": usage.get("STACK", 0),
        "sass_local_ops": tools["sass_local_ops"],
        "ptx_local": k.asm["ptx"].count(".local"),
        "fits_smem": k.metadata.shared <= SMEM_MAX,
        "threads": k.metadata.num_warps * 32,
    }
    if tools[
        "decode_loops"
    ]:  # the loops that decode MUL1 weights (one IDP each; a ragged table's: one a width)
        row["decode_loops"] = tools["decode_loops"]
    return row


def main() -> None:
    """Catch every stage launch at the Flash shapes, compile each distinct one for sm_90, write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument(
        "--triton-path", default="", help="a folder holding another Triton, put first on sys.path"
    )
    ap.add_argument(
        "--keep", action="store_true", help="keep the Triton cache (each kernel's ttgir, ptx, cubin)"
    )
    ap.add_argument("--only", default="", help="compile only the entry points whose name holds this text")
    args = ap.parse_args()
    if args.triton_path:
        sys.path.insert(0, args.triton_path)
    os.environ.pop("TRITON_INTERPRET", None)  # the launches must be those of the compiled kernels
    cache = tempfile.mkdtemp(prefix="stage_sm90_")
    os.environ["TRITON_CACHE_DIR"] = cache  # cold compiles: ptxas runs for each
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _bench_env

    _bench_env.ensure_tfc()
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend

    t_all = time.perf_counter()
    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    kernels: dict[str, dict] = {}  # one row per distinct compile (kernel, specialisation, options)
    launches = [launch for launch in _launches(torch) if args.only in launch[0]]
    if not launches:
        ap.error(
            f"--only {args.only!r} names no entry point; they are {', '.join(sorted({n for n, _, _ in _launches(torch)}))}"
        )
    for entry, variant, call in launches:
        for rows in ROWS:
            for fn, fargs, fkw, grid in _caught(call, rows):
                sig, consts, attrs, options = _specialise(fn, fargs, fkw, backend)
                names = fn.arg_names
                declared = {p.name for p in fn.params if p.is_constexpr}
                cx = {names[k[0]]: _plain(v) for k, v in sorted(consts.items())}
                key = json.dumps([fn.module, fn.__name__, sig, cx, sorted(map(str, attrs.items())),
                                  options.num_warps, options.num_stages, options.enable_fp_fusion],
                                 default=str)  # fmt: skip
                grid = [int(g) for g in grid]
                if key in kernels:
                    kernels[key]["rows"].append(rows)
                    kernels[key]["grid"][str(rows)] = grid
                    continue
                row = {
                    "kernel": f"{fn.module.rsplit('.', 1)[-1]}.{fn.__name__}",
                    "entry": entry,
                    "variant": variant,
                    "rows": [rows],
                    "grid": {str(rows): grid},
                    "constexprs": {k: v for k, v in cx.items() if k in declared},
                    "specialised": {k: v for k, v in cx.items() if k not in declared},
                    "num_warps": options.num_warps,
                    "num_stages": options.num_stages,
                    "enable_fp_fusion": options.enable_fp_fusion,
                    "signature": {k: v for k, v in sig.items() if v != "constexpr"},
                    "divisible_by_16": [names[k[0]] for k, v in sorted(attrs.items()) if v],
                }
                try:
                    row |= compile_one(fn, sig, consts, attrs, options, target)
                except Exception as exc:  # a kernel that does not lower or assemble: kept, the rest go on
                    row["error"] = _error_line(exc)
                kernels[key] = row
                brief = {k: row.get(k) for k in ("n_regs", "n_spills", "shared", "compile_s", "error")}
                print(f"{row['kernel']:34s} {variant:40s} R {rows:5d} {brief}", flush=True)
    ptxas = subprocess.run([triton.knobs.nvidia.ptxas_blackwell.path, "--version"], capture_output=True,
                           text=True).stdout.strip().splitlines()[-1:]  # fmt: skip
    res = {
        "what": "the stage kernels compiled for sm_90 at DeepSeek-V4.1-Flash shapes, no GPU",
        "triton": triton.__version__,
        "torch": torch.__version__,
        "ptxas": ptxas[0] if ptxas else None,
        "target": "cuda 90 (sm_90a), warp 32",
        "host": f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus",
        "rows": list(ROWS),
        "compiles": len(kernels),
        "failed": sum("error" in r for r in kernels.values()),
        "spilling": [
            f"{r['kernel']} ({r['variant']})"
            for r in kernels.values()
            if r.get("spill_stores") or r.get("sass_local_ops")
        ],
        "compile_s_total": round(sum(r.get("compile_s", 0.0) for r in kernels.values()), 2),
        "wall_s": round(time.perf_counter() - t_all, 2),
        "kernels": list(kernels.values()),
    }
    if args.keep:
        res["cache_dir"] = cache
    else:
        shutil.rmtree(cache, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"{res['compiles']} compiles, {res['failed']} failed, spilling {res['spilling']}, "
          f"{res['wall_s']} s -> {args.out}")  # fmt: skip


if __name__ == "__main__":
    main()
