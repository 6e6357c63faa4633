#!/usr/bin/env python3
"""Static SASS of the fused EXL3 GEMM and MoE for sm_90, compiled without a GPU: registers, main-loop cost.

For each configuration it compiles `_exl3_gemm_kernel` (or a MoE launch) for an H100/H200 target with the Triton in use (pass
`--triton-path` to put another Triton first, e.g. the 3.6 the H200 machine has), disassembles it with the
cuobjdump Triton ships, finds the backward branch whose loop body holds the codebook's IDP instructions,
and reports that loop's SASS instructions per decoded weight (one IDP per weight). Runtime is not measured
here: this is the instruction budget the H200 runs (kernels.md, results/kernels/ncu_h200/).
    python3 benchmarks/sass_sm90.py --out benchmarks/results/sass/sass_sm90.json
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

RAGGED_WIDTHS = (32, 48, 64, 80, 96)  # routed 2-5 bit and a 6-bit shared expert
CONFIGS = [  # (name, width, rows, kind, groups / tiles, warps)
    ("runs 1 row (default), 6 bit", 96, 1, "runs", 4, 1),
    ("runs 1 row (default), 4 bit", 64, 1, "runs", 4, 1),
    ("mma g1, 6 bit, 16 rows", 96, 16, "mma", 1, 4),
    ("mma g2, 6 bit, 16 rows", 96, 16, "mma", 2, 2),
    ("mma g4, 6 bit, 16 rows", 96, 16, "mma", 4, 1),
    ("mma g1, 4 bit, 1 row", 64, 1, "mma", 1, 4),
    ("mma g2, 4 bit, 1 row", 64, 1, "mma", 2, 2),
    ("mma weights-as-A g1, 4 bit, 1 row", 64, 1, "mma_wt", 1, 4),
    ("mma weights-as-A g2, 4 bit, 1 row", 64, 1, "mma_wt", 2, 2),
    ("mma weights-as-A g4, 6 bit, 1 row", 96, 1, "mma_wt", 4, 1),
    ("mma weights-as-A g4, 4 bit, 1 row", 64, 1, "mma_wt", 4, 1),
    ("mma weights-as-A g4, 2 bit, 1 row", 32, 1, "mma_wt", 4, 1),
    ("mma weights-as-A g4, 6 bit, 8 rows", 96, 8, "mma_wt", 4, 1),
    ("mma weights-as-A g2, 6 bit, 16 rows", 96, 16, "mma_wt", 2, 2),
    # The MoE's launches, one token, 4-bit single-width tables: the run decode (MoeConfig(mma=0)) and the
    # weights-as-A mma decode (MoeConfig(mma=G), 4 groups the default); the loop found is the first
    # projection's (w1 / w2). Width 0: a ragged table of RAGGED_WIDTHS, a branch per width.
    ("MoE gate/up, run decode, 4 bit", 64, 1, "moe_gate_up", 0, 2),
    ("MoE down, run decode, 4 bit", 64, 1, "moe_down", 0, 2),
    ("MoE gate/up, run decode, ragged 2-6 bit", 0, 1, "moe_gate_up", 0, 2),
    ("MoE down, run decode, ragged 2-6 bit", 0, 1, "moe_down", 0, 2),
    ("MoE gate/up, mma g4, ragged 2-6 bit", 0, 1, "moe_gate_up", 4, 1),
    ("MoE down, mma g4, ragged 2-6 bit", 0, 1, "moe_down", 4, 1),
    ("MoE gate/up, mma g2, ragged 2-6 bit", 0, 1, "moe_gate_up", 2, 2),
    ("MoE down, mma g2, ragged 2-6 bit", 0, 1, "moe_down", 2, 2),
    *[
        (f"MoE {p}, mma g{g}, 4 bit", 64, 1, f"moe_{p.replace('/', '_')}", g, 4 // g)
        for p in ("gate/up", "down")
        for g in (1, 2, 4)
    ],
]
_MOE_SIGS = {  # argument types of the two MoE kernels (constexprs added by compile_moe)
    "gate_up": {"x_ptr": "*fp16", "ids_ptr": "*i64", "wts_ptr": "*fp32", "xh_ptr": "*fp16", "t1_ptr": "*i32",
                "off1_ptr": "*i64", "wid1_ptr": "*i32", "cb1_ptr": "*i32", "suh1_ptr": "*fp16", "svh1_ptr": "*fp16",
                "t3_ptr": "*i32", "off3_ptr": "*i64", "wid3_ptr": "*i32", "cb3_ptr": "*i32", "suh3_ptr": "*fp16",
                "svh3_ptr": "*fp16", "suh2_ptr": "*fp16", "act_ptr": "*fp16", "ws_ptr": "*fp32", "cnt_ptr": "*i32",
                "P": "i32", "D": "i32", "NI": "i32", "stride_x": "i32", "topk": "i32", "n_routed": "i32",
                "KT": "i32", "limit": "fp32"},
    "down": {"ids_ptr": "*i64", "act_ptr": "*fp16", "t2_ptr": "*i32", "off2_ptr": "*i64", "wid2_ptr": "*i32",
             "cb2_ptr": "*i32", "svh2_ptr": "*fp16", "y_ptr": "*fp32", "ws_ptr": "*fp32", "cnt_ptr": "*i32",
             "D": "i32", "NI": "i32", "stride_y": "i32", "topk": "i32", "n_routed": "i32", "KT": "i32",
             "KS": "i32", "NS": "i32"},
}  # fmt: skip


def compile_moe(kernel: str, width: int, groups: int, warps: int, widths: tuple[int, ...] = ()) -> bytes:
    """The cubin of one MoE launch for sm_90: the run decode (groups 0) or the mma decode with `groups`, on a
    table of one width or (`widths`) of several."""
    import triton
    from tfc.kernels.exl3 import moe
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    projs = ("1", "3") if kernel == "gate_up" else ("2",)
    fp32_act = {"act_ptr": "*fp32"} if not groups else {}
    sig = {
        **_MOE_SIGS[kernel],
        **fp32_act,
        **({"xh_ptr": "*fp32"} if not groups and kernel == "gate_up" else {}),
    }
    one = not widths or len(widths) == 1  # the run decode's default shape: block_k 64, 4 tiles; ragged 32, 2
    consts = {
        "BK": 16 if groups else 64 if one else 32,
        "PF": moe.MoeConfig().prefetch,
        "TPE": 4 if one else 2,
        "MMA": groups,
        "FLIGHT": moe.MoeConfig().reduce_flight,
    }
    consts |= {"RUNS": True} if kernel == "gate_up" else {"RUNS2": True}
    widths = widths or (width,)
    for p in projs:
        consts |= {f"W{p}": width if len(widths) == 1 else 0, f"CB{p}": 2, f"RW{p}": widths}
        if groups:  # the launch's own constexprs for a table of these widths (codebook 2)
            consts |= moe._mma_kw(SimpleNamespace(width_set=widths, codebook=2), groups, p)
    if kernel == "gate_up":
        sig["SPLIT"] = "i32"
    fn = moe._moe_gate_up_kernel if kernel == "gate_up" else moe._moe_down_kernel
    # every constexpr, its default where this launch leaves it (Triton 3.9 refuses a signature without them)
    consts = {p.name: p.default for p in fn.params if p.is_constexpr and p.name not in consts} | consts
    sig |= {k: "constexpr" for k in consts}
    names = list(fn.arg_names)
    src = ASTSource(fn=fn, signature={k: sig[k] for k in names if k in sig},
                    constexprs={(names.index(k),): v for k, v in consts.items()})  # fmt: skip
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps}).asm["cubin"]


def compile_one(width: int, rows: int, kind: str, par: int, warps: int) -> bytes:
    """The cubin of one configuration for sm_90."""
    import triton
    from tfc.kernels.exl3.gemv import _exl3_gemm_kernel
    from tfc.kernels.exl3.mma import mma_asm
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    wt = kind.startswith("mma_wt")
    kind = "mma" if wt else kind
    ptr16, mp = "*fp16", 16 if kind == "mma" else 1
    sig = {"x_ptr": ptr16, "xh_ptr": ptr16 if kind == "mma" else "*fp32", "suh_ptr": ptr16, "svh_ptr": ptr16,
           "t_ptr": "*i32", "y_ptr": ptr16, "ws_ptr": "*fp32", "cnt_ptr": "*i32", "M": "i32", "N": "i32",
           "stride_x": "i32", "stride_y": "i32", "kt_per_split": "i32", "W": "constexpr", "CB": "constexpr",
           "MP": "constexpr", "BK": "constexpr", "SPLIT": "i32", "FUSE_ROT": "constexpr", "USE_DOT": "constexpr",
           "RUNS": "constexpr", "KDIM": "i32", "TPE": "constexpr", "MMA": "constexpr",
           "MMA_SETUP": "constexpr", "MMA_FRAG": "constexpr", "MMA_LOADS": "constexpr", "MMA_STEP": "constexpr",
           "MMA_STORES": "constexpr", "MMA_NACC": "constexpr", "MMA_SPLIT": "constexpr", "REDUCE": "constexpr",
           "goff_ptr": "constexpr", "XHG": "i32", "GROUPED": "constexpr", "LIVE": "i32"}  # fmt: skip
    consts = {"goff_ptr": None, "GROUPED": False, "W": width, "CB": 2, "MP": mp, "BK": 16 if kind == "mma" else 32, "FUSE_ROT": kind == "runs",
              "USE_DOT": kind == "mma", "RUNS": kind == "runs", "TPE": par if kind == "runs" else 1,
              "MMA": par if kind == "mma" else 0, "REDUCE": not (kind == "mma" and rows > 1)}  # fmt: skip
    consts |= mma_asm(width, 2, rows, par, wt) if kind == "mma" else {"MMA_SETUP": "", "MMA_FRAG": "", "MMA_LOADS": (),
                                                                      "MMA_STEP": "", "MMA_STORES": (), "MMA_NACC": 16, "MMA_SPLIT": False}  # fmt: skip
    names = list(sig)
    src = ASTSource(
        fn=_exl3_gemm_kernel, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()}
    )
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps}).asm["cubin"]


def idp_loops(sass: str) -> list[dict]:
    """Each IDP-holding loop of a SASS listing, in address order: instructions, per weight, the top opcodes."""
    ins = []
    for line in sass.splitlines():
        m = re.search(r"/\*([0-9a-f]{4,5})\*/\s+(@!?U?P\w+ )?([A-Z0-9_.]+)([^;]*)", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(3), m.group(4)))
    loops = []
    for addr, op, rest in ins:
        target = re.search(r"0x([0-9a-f]+)", rest) if op == "BRA" else None
        if target and int(target.group(1), 16) < addr:
            body = [o for a, o, _ in ins if int(target.group(1), 16) <= a <= addr]
            idp = sum(o.startswith("IDP") for o in body)
            if idp:
                ops = Counter(o.split(".")[0] for o in body)
                loops.append({"instructions": len(body), "weights": idp, "per_weight": round(len(body) / idp, 2),
                              "top": dict(ops.most_common(10))})  # fmt: skip
    return loops


def loop_stats(sass: str) -> dict:
    """The IDP-holding loop of a SASS listing with the most IDP instructions (the first of equals)."""
    best: dict = {}
    for loop in idp_loops(sass):
        if loop["weights"] > best.get("weights", 0):
            best = loop
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument(
        "--triton-path", default="", help="a folder holding another Triton, put first on sys.path"
    )
    args = ap.parse_args()
    if args.triton_path:
        sys.path.insert(0, args.triton_path)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _bench_env
    import triton

    _bench_env.ensure_tfc()
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    rows = []
    for name, width, nrows, kind, par, warps in CONFIGS:
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            if kind.startswith("moe_"):
                f.write(
                    compile_moe(kind.removeprefix("moe_"), width, par, warps, () if width else RAGGED_WIDTHS)
                )
            else:
                f.write(compile_one(width, nrows, kind, par, warps))
            f.flush()
            res = subprocess.run(
                [str(cuobjdump), "-res-usage", f.name], capture_output=True, text=True
            ).stdout
            sass = subprocess.run([str(cuobjdump), "-sass", f.name], capture_output=True, text=True).stdout
        usage = dict(re.findall(r"(REG|STACK|LOCAL):(\d+)", res))
        row = {"config": name, "registers": int(usage.get("REG", 0)), "stack": int(usage.get("STACK", 0)),
               **loop_stats(sass)}  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)
    args.out.write_text(json.dumps({"triton": triton.__version__, "target": "sm_90", "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
