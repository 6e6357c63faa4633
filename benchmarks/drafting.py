#!/usr/bin/env python3
"""DSpark drafting on a Flash-geometry slice: the drafter's round and the verify windows against a one-row step,
and the whole-Flash decode rate drafting projects at the published acceptance.

    python benchmarks/drafting.py [--image IMG/rank0] [--json]
    python benchmarks/drafting.py --device cpu --image TINY/rank0          # a smoke of the script

IMG: `tfc fixture flash-random --layers 4` prepared (made under --work without --image). At a 4k context, one
sequence, as the engine drafts: a verify window of w = 1..6 consecutive rows (the last token and up to 5 drafts),
graphed, against w = 1; the drafter's round (the committed rows observed, then 5 drafts; wall time, the host's
syncs included) with Flash's three blocks (the slice's block thrice, the same shapes), graphed, for 1, 4 and 8
sequences drafting together (each against as many rounds of one sequence); each also drafts once more with nothing
new to observe (the replay and the walk alone), profiled for its GPU time and kernels. The whole-Flash
one-row step is decode.py's projection from the same run; a drafted round = the drafter's round + a 6-row verify
window of whole Flash; tok/s at an acceptance of A tokens a round (the bonus token included) = A / that round.
Random weights cannot measure acceptance: the published figures (2.82 on GSM8K, 3.51 on code) are applied.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c
from decode import CONTEXT, build, flash_config, open_image, step_times

WINDOWS = (1, 2, 3, 4, 5, 6)
SEQUENCES = (1, 4, 8)  # slots drafting together in one round (the engine drafts while at most 8 decode)
ACCEPTANCE = (2.8, 3.5)
PEER = "TensorFold 90 tok/s (2x GB10, DSpark); vLLM 123 (4x RTX PRO 6000, DSpark)"


def verify_windows(runner, device: str, context: int) -> dict:
    """A draft-verify window: w consecutive rows of one sequence, graphed, against w = 1."""
    from tfc.runtime.models.dsv41.fast.step_plan import TileRow, make_tile

    table = {}
    for w in WINDOWS:
        runner.kv.ensure(0, context + w)
        rows = [TileRow(0, (7919 * i + 11) % runner.info.vocab_size, context - 1 + i) for i in range(w)]
        tile = make_tile(rows, runner.kv.dummy_slot, runner.buckets)
        runner.launch(tile)
        table[w] = {
            "step_s": c.timed(device, lambda t=tile: runner.replay(t.key), reps=20 if device == "cuda" else 3)
        }
    for row in table.values():
        row["vs_one_row"] = row["step_s"] / table[1]["step_s"]
    runner.kv.release(0)
    return table


def drafter_round(runner, device: str, context: int, sequences: int, rounds: int = 12) -> dict:
    """The round of a drafter with Flash's three blocks for `sequences` slots drafting together: each observes 4
    committed rows, then drafts 5 (median wall of one draft call for them all)."""
    import numpy as np
    from tfc.runtime.models.dsv41.dspark.fast import FastDsparkDrafter
    from tfc.runtime.worker.runner import DraftAsk
    from tfc.runtime.worker.step import SequenceStep, StepPlan

    if runner.drafter is None:
        raise RuntimeError(f"this runner has no drafter: {runner.draft_note}")
    slots, vocab = runner.drafter, runner.info.vocab_size
    single = slots.drafter
    blocks = flash_config().num_nextn_predict_layers
    as_flash = FastDsparkDrafter(runner.forward, runner.graphs if runner.graphs.enabled else None)
    as_flash.blocks = (single.blocks * blocks)[:blocks]  # the slice's block as many times as Flash has blocks
    slots.drafter, floor = as_flash, slots.floor
    slots.floor = (
        0.0  # verify every draft: random weights' confidence would cut some, and the round is timed whole
    )
    every = range(sequences)
    try:
        toks = np.random.default_rng(5).integers(0, vocab, context).tolist()
        for s in every:
            runner.release(s)
            runner.execute(StepPlan((SequenceStep(s, tuple(toks), 0, drafting=True),)))
        c.sync(device)
        t0 = time.perf_counter()
        runner.draft([DraftAsk(s, 11, 5) for s in every])  # observes the prompts' last rows (and captures)
        c.sync(device)
        first = time.perf_counter() - t0
        position, times = context, []
        for _ in range(rounds):
            fed = [(7919 * (position + i) + 11) % vocab for i in range(4)]
            runner.execute(
                StepPlan(tuple(SequenceStep(s, tuple(fed), position, drafting=True) for s in every))
            )
            position += 4
            c.sync(device)
            t0 = time.perf_counter()
            drafts = runner.draft([DraftAsk(s, fed[-1], 5) for s in every])
            c.sync(device)
            times.append(time.perf_counter() - t0)
            if any(len(d) != 5 for d in drafts):
                raise RuntimeError(f"the drafter proposed {[len(d) for d in drafts]} tokens, not 5 each")
        # the same draft again, nothing new observed: the replay and the walk alone, and their GPU time
        asks = [DraftAsk(s, fed[-1], 5) for s in every]
        again = c.timed(device, lambda: runner.draft(asks), reps=rounds)
        gpu = gpu_time(device, lambda: runner.draft(asks))
    finally:
        slots.drafter, slots.floor = single, floor
        for s in every:
            runner.release(s)
    return {"blocks": blocks, "sequences": sequences, "graphed": runner.graphs.enabled, "first_round_s": first,
            "round_s": statistics.median(times[2:]), "draft_without_rows_s": again, **gpu}  # fmt: skip


def gpu_time(device: str, draft, reps: int = 5) -> dict:
    """Kernels and GPU time of a draft call (torch.profiler over `reps` calls), beside its wall time: what is
    left of the wall is the host's (launches, waits)."""
    if device != "cuda":
        return {}
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(reps):
            draft()
        torch.cuda.synchronize()
    events = sorted(
        (e for e in p.key_averages() if e.device_time_total > 0), key=lambda e: -e.device_time_total
    )
    return {"gpu_s": sum(e.device_time_total for e in events) / reps / 1e6,
            "kernels": sum(e.count for e in events) / reps,
            "top": [{"name": e.key[:100], "us": e.device_time_total / reps, "calls": e.count / reps}
                    for e in events[:15]]}  # fmt: skip


def main() -> None:
    ap = c.parser(__doc__)
    ap.add_argument(
        "--image", help="a prepared flash-random --layers 4 image's rank folder (default: make one)"
    )
    ap.add_argument(
        "--work", help="where to make the slice when --image is not given (default: a temporary folder)"
    )
    args = ap.parse_args()
    device = c.pick_device(args.device)
    if device == "cpu" and not args.image:
        ap.error("--device cpu runs a smoke of the script on a small image: give --image (the tiny one)")
    c.ensure_tfc()
    run = c.Run("drafting", "drafting.py", device, args.commit)
    context = CONTEXT[device]
    image = open_image(args)
    runner = build(image, device, tokens=context + 2048)
    copy = c.copy_gbps(device)
    one = step_times(runner, device, [1], context, copy)[1]
    windows = verify_windows(runner, device, context)
    together = {n: drafter_round(runner, device, context, n) for n in SEQUENCES}
    rnd = together[1]
    step = one["flash_step_s"]
    drafted = rnd["round_s"] + step * windows[6]["vs_one_row"]
    run.data.update(image=str(image), copy_gbps=copy, one_row=one, verify=windows, drafter=rnd,
                    drafter_together=together, flash_drafted_round_s=drafted)  # fmt: skip
    for n, r in together.items():
        gpu = (
            f", of it {r['gpu_s'] * 1e3:.2f} ms on the GPU in {r['kernels']:.0f} kernels"
            if "gpu_s" in r
            else ""
        )
        print(f"[drafting] {n} sequences: a round {r['round_s'] * 1e3:.2f} ms; the same draft with nothing new to "
              f"observe {r['draft_without_rows_s'] * 1e3:.2f} ms{gpu}", flush=True)  # fmt: skip
    print(f"[drafting] round {rnd['round_s'] * 1e3:.2f} ms ({rnd['blocks']} blocks), whole-Flash one-row step "
          f"{step * 1e3:.2f} ms, 6-row window {windows[6]['vs_one_row']:.2f}x the one-row step", flush=True)  # fmt: skip
    run.metric("drafter.round_vs_step", rnd["round_s"] / step, "fraction",
               "<= 0.25 of the whole-model one-row step at >= 250 tok/s (a ~1 ms round on an H200)",
               f"the projected whole-Flash one-row step of the same run ({rnd['round_s'] * 1e3:.2f} ms round, "
               f"{step * 1e3:.1f} ms step)")  # fmt: skip
    run.metric("drafter.verify6_vs_step", windows[6]["vs_one_row"], "x", None,
               "the one-row step of the same run (a 6-row verify window: the last token and 5 drafts)")  # fmt: skip
    for n in SEQUENCES[1:]:
        run.metric(f"drafter.round_vs_alone.sequences{n}", together[n]["round_s"] / (n * rnd["round_s"]), "fraction",
                   None, f"{n} rounds of one sequence in the same run ({together[n]['round_s'] * 1e3:.2f} ms for "
                   f"{n} together, {rnd['round_s'] * 1e3:.2f} ms alone)")  # fmt: skip
    for a in ACCEPTANCE:
        run.metric(f"decode.whole_flash_tok_s.drafted_al{a}", a / drafted, "tok/s", None,
                   f"serial {1 / step:,.1f} tok/s in the same run; {PEER}")  # fmt: skip
    run.finish(args.json and device == "cuda")
    if args.json and device != "cuda":
        print("(--json ignored on the CPU: the smoke's numbers are not figures)")


if __name__ == "__main__":
    main()
