"""`tfc generate IMAGE --prompt TEXT`: boot a worker, run the engine's generation, stream tokens."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from tfc.cli.options import device_option, example, jobs_option, seed_option
from tfc.cli.progress import byte_bar, count_bar
from tfc.cli.world_cmd import launch_if_world
from tfc.errors import TfcError


class GenerateError(TfcError):
    """A generation request that cannot run (prompt, tokenizer, context, options)."""


@click.command(
    "generate",
    epilog=example('tfc generate ~/.cache/tfc/images/263e81d431bff5c3 --prompt "Hello" --max-tokens 32'),
)
@click.argument("image", type=click.Path(path_type=Path))
@click.option("--prompt", required=True, help="The prompt text.")
@click.option(
    "--max-tokens", type=click.IntRange(1), default=64, show_default=True, help="Tokens to generate."
)
@click.option("--temperature", type=click.FloatRange(0), default=0.0, show_default=True, help="0 = greedy.")
@click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=1.0, show_default=True)
@click.option("--top-k", type=click.IntRange(0), default=0, show_default=True, help="0 = off.")
@seed_option("Sampling seed, 0 to 2**63-1 (same seed, same tokens).")
@click.option(
    "--chat", is_flag=True, help="Apply the DeepSeek-V4.1 chat encoding (one user turn, thinking off)."
)
@click.option("--no-engram", is_flag=True, help="Run Engram layers without their tables (gate off).")
@click.option("--tokenizer", "tokenizer_path", type=click.Path(path_type=Path), default=None,
              help="A tokenizer.json to use instead of the one the image carries.")  # fmt: skip
@device_option()
@click.option("--reference", is_flag=True, help="Run the reference forward (dense, fp64-wide) even on a GPU.")
@click.option("--fast", is_flag=True,
              help="Run the fast forward even without a GPU (the kernels' torch references stand in: slow).")  # fmt: skip
@click.option("--no-graphs", is_flag=True, help="Fast forward: run every step eagerly (no CUDA graphs).")
@click.option("--dtype", type=click.Choice(["float32", "float64"]), default="float32", show_default=True,
              help="Reference forward's activations (the fast forward's are fixed: see docs/fast-forward.md).")  # fmt: skip
@jobs_option("Upload threads (default: as `tfc load`).")
@click.option("--ignore-eos", is_flag=True, help="Do not stop at EOS (for timing a fixed number of tokens).")
@click.option("--draft/--no-draft", default=True, show_default=True,
              help="Draft tokens with the model's DSpark blocks and verify them in one step, where the runner can "
                   "(the same tokens as without).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of streaming text.")
def generate(
    image: Path,
    prompt: str,
    max_tokens: int,
    temperature: float,
    top_p: float,
    top_k: int,
    seed: int | None,
    chat: bool,
    no_engram: bool,
    tokenizer_path: Path,
    device: str,
    reference: bool,
    fast: bool,
    no_graphs: bool,
    dtype: str,
    jobs: int | None,
    ignore_eos: bool,
    draft: bool,
    as_json: bool,
) -> None:
    """Generate from IMAGE (an image folder, or a TP=1 rank folder).

    The image boots as `tfc load` boots it. On a GPU the fast forward runs (EXL3 kernels on the uploaded
    bytes, decode steps replayed from CUDA graphs); --reference, and every CPU run without --fast, runs
    the reference forward (EXL3 decoded to dense once). The prompt is tokenized with the tokenizer.json
    the image carries. Tokens print as they come; generation stops at EOS or --max-tokens. An image
    prepared with --tp N runs as N rank processes on this host (or joins the ranks torchrun's variables
    name), the same forward on every rank, and prints what TP=1 prints (docs/parallel.md).
    """
    if reference and fast:
        raise click.UsageError("--reference and --fast exclude each other")
    from tfc.runtime.options import RuntimeOptions

    options = RuntimeOptions.from_settings(graphs=not no_graphs)  # a bad setting: one line, before any work
    launch_if_world(click.get_current_context(), image)
    import torch

    from tfc.cli.load_cmd import graph_counts
    from tfc.runtime.engine.generate import generate as run
    from tfc.runtime.engine.sampling import SamplingParams
    from tfc.runtime.engine.tokenizer import image_tokenizer, tokenizer_from_file
    from tfc.runtime.engine.warmup import runner_notes, stage_kernels, stages_line, warm_up
    from tfc.runtime.parallel.session import join_world, lead_or_follow, model_options
    from tfc.runtime.worker.worker import Worker

    world = join_world("generate", image, device, options, dtype=dtype, engram=not no_engram, slots=1)
    kind = "reference" if reference else "fast" if fast else "auto"
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
    bars = sys.stderr.isatty() and not as_json and (world is None or world.rank == 0)
    rank, where = (None, device) if world is None else (world.rank, world.device)
    with byte_bar("upload", bars) as bar:
        worker = Worker.start(image, rank=rank, device=where, options=options, jobs=jobs, progress=bar)
    runner = worker
    try:
        with count_bar("decode", bars) as bar:
            worker.load_model(
                dtype=getattr(torch, dtype), engram=not no_engram, slots=1, progress=bar,
                **({"kind": kind} | model_options(world)),
            )  # fmt: skip
        if world is not None:
            runner = lead_or_follow(world, worker)
        if tokenizer_path is not None:
            tok = tokenizer_from_file(tokenizer_path)
        else:
            tok = image_tokenizer(worker.booted.image, str(image))
            tokenizer_path = Path(image) / "tokenizer.json"
        info = worker.info
        for note in info.warnings:
            click.secho(f"tfc: warning: {note}", err=True, fg="yellow", bold=True)
        ids = worker.chat_format(tok).encode(prompt, chat)
        if len(ids) >= info.context:
            raise GenerateError(
                f"the prompt is {len(ids)} tokens; the model's context is {info.context} tokens"
            )
        if any(i >= info.vocab_size for i in ids):
            raise GenerateError(
                f"{tokenizer_path}: token ids past the model's vocabulary ({info.vocab_size})"
            )
        drafting = _drafting(runner, draft)
        warm = time.perf_counter()
        # the decode step's graph captured (and a draft's, when drafting) before the clock, as tfc serve does
        warm_up(runner, info.bos_id, draft=drafting["on"])
        warmup_s = time.perf_counter() - warm
        stream = _Stream(tok, enabled=not as_json)
        out = run(
            runner, [ids], min(max_tokens, info.context - len(ids)), params,
            stop_ids=() if ignore_eos else info.eos_ids, on_token=stream, draft=drafting["on"],
        )[0]  # fmt: skip
        drafting.update(out.drafted.as_dict())
        graphs = graph_counts(worker.booted.graphs)
        stages = stage_kernels(worker.runner)
        notes = runner_notes(worker.runner)
    finally:
        if runner is not worker:
            runner.stop()  # every other rank exits 0
        worker.close()
    tp = {} if runner is worker else {"tp": runner.costs()}
    prefill_tok_s = len(ids) / out.prefill_s if out.prefill_s > 0 else 0.0
    if as_json:
        text = tok.decode(out.tokens, skip_special_tokens=False)
        reply = {"prompt_tokens": ids, "tokens": out.tokens, "text": text, "finish": out.finish}
        rates = {"warmup_s": round(warmup_s, 6), "prefill_s": round(out.prefill_s, 6), "decode_s": round(out.decode_s, 6),
                 "decode_tok_s": round(out.decode_tok_s, 3), "prefill_tok_s": round(prefill_tok_s, 3)}  # fmt: skip
        click.echo(json.dumps({**reply, "token_sha": out.token_sha, **rates, "runner": worker.kind,
                               "graphs": graphs, "stage_kernels": stages, "notes": notes, "drafting": drafting, **tp}))  # fmt: skip
    else:
        stream.finish()
        click.echo(
            f"{len(ids)} prompt tokens in {out.prefill_s:.3f} s to the first token ({prefill_tok_s:.1f} tok/s "
            f"prefill); {len(out.tokens)} tokens, {out.decode_tok_s:.1f} tok/s decode after the first "
            f"({worker.kind} forward; graphs: {graphs['captures']} captured, {graphs['replays']} replayed)",
            err=True,
        )
        if drafting["on"]:
            click.echo(f"drafting: {drafting['accepted_tokens']} of {drafting['draft_tokens']} drafted tokens "
                       f"accepted in {drafting['drafts']} rounds", err=True)  # fmt: skip
        else:
            click.echo(f"drafting off: {drafting['note']}", err=True)
        if stages:
            click.echo(stages_line(stages), err=True)
        for note in notes:
            click.echo(f"note: {note}", err=True)


def _drafting(runner, wanted: bool) -> dict:
    """Whether generation drafts, and why not when it does not (as the worker, or a TP world's leader, states)."""
    if not wanted:
        return {"on": False, "note": "--no-draft"}
    return {"on": runner.capabilities.draft, "note": runner.capabilities.draft_note}


class _Stream:
    """Prints generated text as it comes, holding back a partial multi-byte character."""

    def __init__(self, tok, enabled: bool) -> None:
        self.tok, self.enabled = tok, enabled
        self.shown: list[int] = []
        self.printed = ""

    def __call__(self, _: int, token: int) -> None:
        if not self.enabled:
            return
        self.shown.append(token)
        text = self.tok.decode(self.shown, skip_special_tokens=False)
        if not text.endswith("\ufffd"):  # wait for the rest of a multi-byte character
            click.echo(text[len(self.printed) :], nl=False)
            self.printed = text

    def finish(self) -> None:
        click.echo(self.tok.decode(self.shown, skip_special_tokens=False)[len(self.printed) :])
