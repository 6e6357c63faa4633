"""`tfc serve IMAGE`: the options, then runtime/serve.py's wiring (the HTTP server over every rank's worker)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import click

from tfc import settings
from tfc.cli.options import device_option, example, jobs_option
from tfc.cli.world_cmd import launch_if_world


@click.command(
    "serve",
    epilog=example(
        "tfc serve ~/.cache/tfc/images/263e81d431bff5c3 --port 8000 --max-seqs 16",
        "tfc serve ~/.cache/tfc/images/263e81d431bff5c3 --host-cache-gib 8 --disk-cache /var/cache/tfc-prefix",
    ),
)
@click.argument("image", type=click.Path(path_type=Path))
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option("--model-name", help="The model id clients ask for (default: deepseek-v41-<image folder>).")
@click.option(
    "--api-key", "api_keys", multiple=True, help="A key clients must present (repeatable; also TFC_API_KEY)."
)
@click.option(
    "--api-key-file", type=click.Path(path_type=Path), help="A file of keys, one a line (mode 0600)."
)
@click.option("--max-seqs", type=click.IntRange(1, 1024),
              help="Sequences generated at once (slots; default: on a GPU, as many as half the memory free after "
                   "the weights holds at the served context, up to 256, one step's rows; else 16).")  # fmt: skip
@click.option(
    "--max-context", type=click.IntRange(2), help="Tokens a sequence may reach (default: the model's)."
)
@click.option("--max-waiting", type=click.IntRange(0), default=64, show_default=True,
              help="Requests queued beyond the free slots before 429.")  # fmt: skip
@click.option("--max-step-tokens", type=click.IntRange(1),
              help="Tokens one step may hold: every decoding row first, then prompt chunks while they fit (default: "
                   "a prompt chunk beside every slot's row and drafts; at least --prefill-chunk).")  # fmt: skip
@click.option("--prefill-chunk", type=click.IntRange(1), default=256, show_default=True,
              help="Prompt tokens a sequence prefills per step (on a GPU, also the rows of a prefill step when more than 16).")  # fmt: skip
@device_option()
@click.option("--dtype", type=click.Choice(["float32", "float64"]), default="float32", show_default=True,
              help="Activation dtype of the reference forward.")  # fmt: skip
@click.option("--no-graphs", is_flag=True, help="Turn CUDA graphs off (every step eager).")
@jobs_option("Upload threads (default: as `tfc load`).")
@click.option("--drain-s", type=click.FloatRange(0), default=20.0, show_default=True,
              help="Seconds in-flight requests get to finish after SIGTERM.")  # fmt: skip
@click.option("--prefix-cache/--no-prefix-cache", default=True, show_default=True,
              help="Resume prompts from the saved states of earlier ones (where the runner can snapshot).")  # fmt: skip
@click.option("--prefix-cache-gib", type=click.FloatRange(0), default=1.0, show_default=True,
              help="Prefix-cache states kept where the model runs (GiB).")  # fmt: skip
@click.option("--host-cache-gib", type=click.FloatRange(0), default=0.0, show_default=True,
              help="Host memory (pinned on CUDA) for states pushed out of --prefix-cache-gib (GiB).")  # fmt: skip
@click.option("--disk-cache", type=click.Path(path_type=Path),
              help="A folder for states pushed out of memory (digested files, removed when the server stops).")  # fmt: skip
@click.option("--disk-cache-gib", type=click.FloatRange(0), default=16.0, show_default=True,
              help="Bytes --disk-cache may hold (GiB).")  # fmt: skip
@click.option("--tokenizer", "tokenizer_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A tokenizer.json to use instead of the one the image carries.")  # fmt: skip
@click.option("--draft/--no-draft", default=True, show_default=True,
              help="Draft tokens with the model's DSpark blocks and verify them in one step, where the runner can "
                   "(same tokens as without; a request's \"draft\": false turns it off for that request).")  # fmt: skip
def serve(image, host, port, model_name, api_keys, api_key_file, max_seqs, max_context, max_waiting, max_step_tokens,
          prefill_chunk,
          device, dtype, no_graphs, jobs, drain_s, prefix_cache, prefix_cache_gib, host_cache_gib, disk_cache,
          disk_cache_gib, tokenizer_path, draft) -> None:  # fmt: skip
    """Serve IMAGE (an image folder, or a TP=1 rank folder) over an OpenAI-compatible HTTP API.

    The worker boots while /health answers 503 "booting"; once the model is loaded and warmed up,
    /health is 200 and /v1/models lists the model. SIGTERM or SIGINT drains: new requests get 503,
    requests in flight get --drain-s seconds, a second signal cuts the drain short.
    """
    started = time.monotonic()
    if max_step_tokens is not None and max_step_tokens < prefill_chunk:
        raise click.BadParameter(f"{max_step_tokens} is less than --prefill-chunk {prefill_chunk}: no prompt chunk "
                                 "would fit a step", param_hint="'--max-step-tokens'")  # fmt: skip
    if disk_cache is not None and disk_cache.exists() and not disk_cache.is_dir():
        raise click.BadParameter(f"{disk_cache} is not a folder", param_hint="'--disk-cache'")
    from tfc.runtime.options import RuntimeOptions

    runtime = RuntimeOptions.from_settings(graphs=not no_graphs)  # a bad setting: one line, before any work
    keepalive_s = settings.get("TFC_SSE_KEEPALIVE_S")
    launch_if_world(click.get_current_context(), image)
    early = _early_cuda(device)  # the server's modules import torch: start CUDA beside that import
    from tfc.runtime.serve import ServeOptions, main
    from tfc.runtime.server.auth import gather_keys

    keys = gather_keys(api_keys, api_key_file)
    options = ServeOptions(
        image=image, host=host, port=port, model_name=model_name, max_seqs=max_seqs, max_context=max_context,
        device=device, runtime=runtime, jobs=jobs, dtype=dtype, drain_s=drain_s, chunk=prefill_chunk,
        max_step_tokens=max_step_tokens,
        max_waiting=max_waiting, prefix_cache=prefix_cache, prefix_cache_gib=prefix_cache_gib,
        host_cache_gib=host_cache_gib, disk_cache=disk_cache, disk_cache_gib=disk_cache_gib, draft=draft,
        tokenizer=tokenizer_path, keepalive_s=keepalive_s,
    )  # fmt: skip
    try:
        code = main(options, keys, started)
    finally:
        if early is not None:
            early.release()
    if code:
        sys.exit(code)


def _early_cuda(device: str):
    """Start this rank's CUDA context on a thread (runtime/boot/cuda_start.py), or None off CUDA."""
    from tfc.runtime.boot import cuda_start

    local = os.environ.get("LOCAL_RANK")
    if local is not None and device in ("auto", "cuda") and cuda_start.uses_cuda(device):
        device = f"cuda:{local}"
    return cuda_start.start(device)
