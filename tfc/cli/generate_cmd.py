"""`tfc generate IMAGE --prompt TEXT`: generate with the DeepSeek-V4.1 reference forward, streaming tokens."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from tfc.errors import TfcError

# DeepSeek-V4.1 chat encoding, chat mode (thinking off), one user turn: BOS, User, Assistant, </think>.
BOS, USER, ASSISTANT, THINK_END = "<｜begin▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "</think>"


class GenerateError(TfcError):
    """A generation request that cannot run (prompt, tokenizer, Engram tables, options)."""


def chat_text(prompt: str) -> str:
    """The prompt as one user turn, rendered with the V4.1 chat template in chat (non-thinking) mode."""
    return f"{BOS}{USER}{prompt}{ASSISTANT}{THINK_END}"


def encode(tokenizer, prompt: str, chat: bool, bos_id: int | None) -> list[int]:
    """Prompt ids: the chat rendering (special tokens matched), or BOS + the plain text."""
    if chat:
        return tokenizer.encode(chat_text(prompt), add_special_tokens=False).ids
    ids = tokenizer.encode(prompt, add_special_tokens=False).ids
    return ([bos_id] if bos_id is not None else []) + ids


def _tokenizer(path: Path):
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as error:  # the Rust library raises a bare Exception on bad files
        raise GenerateError(f"{path}: not a usable tokenizer.json ({str(error).splitlines()[0]})") from None


def _image_tokenizer(opened, image):
    """The tokenizer.json an image carries (prepare stores the pack's own)."""
    from tokenizers import Tokenizer

    if "tokenizer.json" not in opened.image.segments:
        raise GenerateError(f"{image}: the image carries no tokenizer.json; pass --tokenizer")
    try:
        return Tokenizer.from_str(bytes(opened.image.segment("tokenizer.json")).decode("utf-8"))
    except Exception as error:  # the Rust library raises a bare Exception on bad JSON
        raise GenerateError(
            f"{image}: its tokenizer.json does not load ({str(error).splitlines()[0]})"
        ) from None


def _decode_all(weights, names: list[str], enabled: bool) -> None:
    """Decode every weight the forward reads up front, with a progress bar on stderr."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    with Progress(
        TextColumn("[bold]decode"),
        BarColumn(),
        MofNCompleteColumn(),
        console=Console(stderr=True),
        transient=True,
        disable=not enabled,
    ) as bar:
        task = bar.add_task("", total=len(names))
        for name in names:
            weights[name]
            bar.advance(task)


@click.command("generate")
@click.argument("image", type=click.Path(path_type=Path))
@click.option("--prompt", required=True, help="The prompt text.")
@click.option(
    "--max-tokens", type=click.IntRange(1), default=64, show_default=True, help="Tokens to generate."
)
@click.option("--temperature", type=click.FloatRange(0), default=0.0, show_default=True, help="0 = greedy.")
@click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=1.0, show_default=True)
@click.option("--top-k", type=click.IntRange(0), default=0, show_default=True, help="0 = off.")
@click.option("--seed", type=int, help="Sampling seed (same seed, same tokens).")
@click.option(
    "--chat", is_flag=True, help="Apply the DeepSeek-V4.1 chat encoding (one user turn, thinking off)."
)
@click.option("--no-engram", is_flag=True, help="Run Engram layers without their tables (gate off).")
@click.option("--tokenizer", "tokenizer_path", type=click.Path(path_type=Path), default=None,
              help="A tokenizer.json to use instead of the one the image carries.")  # fmt: skip
@click.option("--device", default="cpu", show_default=True, help="torch device, e.g. cpu or cuda.")
@click.option("--dtype", type=click.Choice(["float32", "float64"]), default="float32", show_default=True)
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
    dtype: str,
    as_json: bool,
) -> None:
    """Generate from IMAGE (a TP=1 DeepSeek-V4.1 image: rank folder or image folder) with the reference forward.

    Weights come from the image only (EXL3 decoded to dense once); the prompt is tokenized with the
    pack's tokenizer.json. Tokens print as they come; generation stops at EOS or --max-tokens.
    """
    import torch

    from tfc.runtime.dsv41_generate import generate as run
    from tfc.runtime.dsv41_model import Dsv41Model
    from tfc.runtime.dsv41_weights import engram_feed, open_dense
    from tfc.runtime.sampling import SamplingParams

    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
    cfg, weights, opened = open_dense(image)
    if tokenizer_path is not None:
        tok = _tokenizer(tokenizer_path)
    else:
        tok = _image_tokenizer(opened, image)
        tokenizer_path = Path(image) / "tokenizer.json"
    feed = None
    if cfg.engram_layer_ids and no_engram:
        click.secho(
            f"tfc: warning: --no-engram: Engram layers {list(cfg.engram_layer_ids)} run WITHOUT their memory "
            "tables (gate off); outputs are not the model's",
            err=True,
            fg="yellow",
            bold=True,
        )
    if cfg.engram_layer_ids and not no_engram:
        feed = engram_feed(weights, cfg.engram_layer_ids, cfg.engram_head_dim)
        if feed is None:
            raise GenerateError(
                f"{image}: the model has Engram layers {list(cfg.engram_layer_ids)} but the image holds no "
                "Engram tables; prepare it with --engram-dir, or pass --no-engram"
            )
    ids = encode(tok, prompt, chat, cfg.bos_token_id)
    context = cfg.max_position_embeddings
    if len(ids) >= context:
        raise GenerateError(f"the prompt is {len(ids)} tokens; the model's context is {context} tokens")
    if any(i >= cfg.vocab_size for i in ids):
        raise GenerateError(f"{tokenizer_path}: token ids past the model's vocabulary ({cfg.vocab_size})")
    try:
        model = Dsv41Model(cfg, weights, dtype=getattr(torch, dtype), device=device, engram=feed is not None)
    except (RuntimeError, ValueError) as error:
        raise GenerateError(f"device {device!r}: {str(error).splitlines()[0]}") from None
    forward_names = [n for n in weights if not n.startswith("mtp.")]
    _decode_all(weights, forward_names, sys.stderr.isatty() and not as_json)

    shown: list[int] = []
    printed = [""]

    def stream(_: int, token: int) -> None:
        if as_json:
            return
        shown.append(token)
        text = tok.decode(shown, skip_special_tokens=False)
        if not text.endswith("\ufffd"):  # wait for the rest of a multi-byte character
            click.echo(text[len(printed[0]) :], nl=False)
            printed[0] = text

    stop = [cfg.eos_token_id] if cfg.eos_token_id is not None else []
    out = run(
        model, [ids], min(max_tokens, context - len(ids)), params, feed=feed, stop_ids=stop, on_token=stream
    )[0]
    if as_json:
        click.echo(
            json.dumps(
                {
                    "prompt_tokens": ids,
                    "tokens": out.tokens,
                    "text": tok.decode(out.tokens, skip_special_tokens=False),
                    "finish": out.finish,
                }
            )
        )
    else:
        rest = tok.decode(shown, skip_special_tokens=False)[len(printed[0]) :]
        click.echo(rest)
