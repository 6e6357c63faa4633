#!/usr/bin/env python3
"""Prefill of 2k and 16k-token prompts through the fast forward's many-row steps on a Flash-geometry slice, against
the bf16 tensor-core peak measured in the same run, and the whole-Flash prefill rate it projects.

    python benchmarks/prefill.py [--image IMG/rank0] [--prompts 2048,16384] [--step-rows 2048] [--json]
    python benchmarks/prefill.py --device cpu --image TINY/rank0 --prompts 96 --step-rows 32   # a smoke

IMG: `tfc fixture flash-random --layers 4` prepared (made under --work without --image). Each prompt is one
sequence's prompt rows in steps of --step-rows rows; the figure is the median of --repeats timed prefills after a
first (which loads or compiles what each context bucket needs). Whole-Flash projection: the slice's time less its
heads, scaled by the weights a token multiplies in Flash's layers over the slice's, plus the head of every step
(timed alone on the rows a step reads). Peak share = 2 x Flash's weights a token x tokens / projected time, over
the bf16 peak (an 8192³ product, graphed). The last logits are checked against the same prompt in two other
chunkings (bit for bit) before anything is timed.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c
from decode import active_params, build, flash_config, open_image

PEER = "vLLM 12.0K tok/s at a 32k prompt (4x RTX PRO 6000); TensorFold 2.7K (2x GB10)"


def prompt_logits(runner, slot: int, toks: list[int], size: int):
    from tfc.runtime.worker.step import SequenceStep, StepPlan

    for lo in range(0, len(toks), size):
        out = runner.execute(StepPlan((SequenceStep(slot, tuple(toks[lo : lo + size]), lo, prompt=True),)))
    logits = out.logits[0].clone()
    runner.release(slot)
    return logits


def check_chunkings(runner, n: int, step_rows: int) -> dict:
    """A prompt's last logits whole and in two other chunkings, bit for bit (chunked == whole)."""
    import numpy as np
    import torch

    toks = np.random.default_rng(7).integers(0, runner.info.vocab_size, n).tolist()
    whole = prompt_logits(runner, 3, toks, n)
    sizes = (n // 2 + 1, max(1, n // 3 - 7))  # two other cuts, neither on the whole's step boundaries
    equal = {str(size): bool(torch.equal(prompt_logits(runner, 3, toks, size), whole)) for size in sizes}
    if not all(equal.values()):
        raise RuntimeError(f"prefill chunkings differ ({equal}): nothing is timed")
    return equal


def prefill_times(runner, device: str, prompts, step_rows: int, repeats: int, peak: float) -> dict:
    import numpy as np
    import torch
    from tfc.runtime.models.dsv41.fast.forward import HEAD_ROWS
    from tfc.runtime.worker.step import SequenceStep, StepPlan

    cfg, w = runner.forward.cfg, runner.forward.weights
    segs, flash = w.image.manifest.segments, flash_config()
    layers_ratio = active_params(segs, cfg, flash, head=False) / active_params(segs, cfg, cfg, head=False)
    flops = 2 * active_params(segs, cfg, flash)
    x, head = torch.randn(HEAD_ROWS, cfg.hidden_size, device=device), w.linear("head")
    head_s = c.timed(device, lambda: runner.prefill.ops.linear(x, head), reps=5)
    table: dict = {"layers_ratio": layers_ratio, "flash_flop_per_token": flops, "head_s_a_step": head_s}

    def once(plan) -> float:
        c.sync(device)
        t0 = time.perf_counter()
        runner.execute(plan)
        c.sync(device)
        runner.release(plan.rows[0].slot)
        return time.perf_counter() - t0

    for n in prompts:
        toks = np.random.default_rng(n).integers(0, cfg.vocab_size, n).tolist()
        plan = StepPlan((SequenceStep(1, tuple(toks), 0, prompt=True),))
        first = once(plan)
        walls = [once(plan) for _ in range(repeats)]
        wall = c.median(walls)
        steps = -(-n // step_rows)
        flash_s = (wall - steps * head_s) * layers_ratio + steps * head_s
        table[n] = {"wall_s": wall, "walls_s": walls, "first_s": first, "tok_s": n / wall, "steps": steps,
                    "flash_s": flash_s, "flash_tok_s": n / flash_s, "flash_tflops": flops * n / flash_s / 1e12,
                    "peak_ratio": flops * n / flash_s / 1e12 / peak}  # fmt: skip
        print(f"[prefill] {n} tokens: {n / wall:,.0f} slice tok/s, whole Flash {n / flash_s:,.0f} tok/s projected, "
              f"{table[n]['peak_ratio']:.2%} of the bf16 peak", flush=True)  # fmt: skip
    return table


def main() -> None:
    ap = c.parser(__doc__)
    ap.add_argument(
        "--image", help="a prepared flash-random --layers 4 image's rank folder (default: make one)"
    )
    ap.add_argument(
        "--work", help="where to make the slice when --image is not given (default: a temporary folder)"
    )
    ap.add_argument("--prompts", default="2048,16384", help="prompt lengths, comma-separated")
    ap.add_argument(
        "--step-rows", type=int, default=2048, help="rows of a prefill step (the runner's prefill_rows)"
    )
    ap.add_argument(
        "--repeats", type=int, default=3, help="timed prefills of each prompt after the first (median)"
    )
    args = ap.parse_args()
    try:
        prompts = [int(v) for v in args.prompts.split(",")]
    except ValueError:
        ap.error(f"--prompts takes comma-separated integers, got {args.prompts!r}")
    if args.repeats < 1 or args.step_rows <= 16:
        ap.error("--repeats must be at least 1 and --step-rows above 16 (a decode step's rows)")
    device = c.pick_device(args.device)
    if device == "cpu" and not args.image:
        ap.error("--device cpu runs a smoke of the script on a small image: give --image (the tiny one)")
    c.ensure_tfc()
    run = c.Run("prefill", "prefill.py", device, args.commit)
    image = open_image(args)
    runner = build(image, device, tokens=max(prompts) + 1024, prefill_rows=args.step_rows)
    peak = c.bf16_tflops(device)
    run.data.update(
        image=str(image), step_rows=args.step_rows, bf16_tflops=peak, copy_gbps=c.copy_gbps(device)
    )
    run.data["chunkings_equal"] = check_chunkings(runner, min(700, max(prompts)), args.step_rows)
    table = prefill_times(runner, device, prompts, args.step_rows, args.repeats, peak)
    run.data["prefill"] = table
    limit = f"the bf16 tensor-core peak of the same run ({peak:,.0f} TFLOP/s)"
    for n, target in ((2048, ">= 0.20"), (16384, ">= 0.30")):
        if n in table:
            run.metric(f"prefill.peak_ratio.{n // 1024}k", table[n]["peak_ratio"], "fraction", target, limit)
    if 16384 in table:
        run.metric("prefill.whole_flash_tok_s.16k", table[16384]["flash_tok_s"], "tok/s", None, PEER)
    run.finish(args.json and device == "cuda")
    if args.json and device != "cuda":
        print("(--json ignored on the CPU: the smoke's numbers are not figures)")


if __name__ == "__main__":
    main()
