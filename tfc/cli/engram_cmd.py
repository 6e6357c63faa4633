"""`tfc engram PACK_OR_IMAGE`: which Engram table rows a text or a list of token ids touches."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import numpy as np

from tfc.cli.options import example
from tfc.errors import TfcError


class EngramCommandError(TfcError):
    """An input `tfc engram` cannot show rows for."""


def _id_list(ctx: click.Context, param: click.Parameter, value: str | None) -> list[int] | None:
    if value is None:
        return None
    try:
        return [int(x) for x in value.replace(" ", "").split(",") if x != ""]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None


@click.command(
    "engram", epilog=example('tfc engram ./pack --text "Hello world"', "tfc engram ./pack --ids 1,2,3")
)
@click.argument("source", metavar="PACK_OR_IMAGE", type=click.Path(path_type=Path))
@click.option("--text", help="Text to tokenize (no special tokens are added).")
@click.option(
    "--ids", callback=_id_list, help="Token ids, comma-separated (image-token ids are image positions)."
)
@click.option(
    "--lookback", callback=_id_list, default="", help="Up to max_ngram-1 token ids before the window."
)
@click.option("--tokenizer", type=click.Path(path_type=Path), help="tokenizer.json for --text on an image.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout.")
def engram(
    source: Path,
    text: str | None,
    ids: list[int] | None,
    lookback: list[int],
    tokenizer: Path | None,
    as_json: bool,
) -> None:
    """Show token ids, compressed ids and, per position, the table row of every column of every Engram layer.

    PACK_OR_IMAGE is a pack folder (config.json + tokenizer.json) or a prepared image (a rank folder
    holding manifest.json, or a world folder: its lowest rank). Image positions are shown as DEAD:
    they and the n-grams through them hash as the pad id.
    """
    from tfc.runtime.models.dsv41.engram_hash import hash_ids

    if (text is None) == (ids is None):
        raise click.UsageError("give exactly one of --text and --ids")
    rank_dir = _rank_dir(source)
    view = _open_image(rank_dir, tokenizer) if rank_dir else _open_pack(source)
    if text is not None:
        if view["tokenizer"] is None:
            raise EngramCommandError(f"{source}: an image holds no tokenizer; pass --tokenizer or use --ids")
        ids = view["tokenizer"].encode(text, add_special_tokens=False).ids
    tables = view["tables"]
    n = len(tables.token_map)
    if text is not None:
        _check_ids(ids, "--text", n, " (is --tokenizer this image's tokenizer?)")
    else:
        _check_ids(ids, "--ids", n)
    _check_ids(lookback, "--lookback", n)
    rows = hash_ids(tables, ids, lookback)
    report = _report(view, tables, ids, lookback, rows)
    if as_json:
        click.echo(json.dumps(report))
    else:
        _print(report, view["tokenizer"])


def _check_ids(ids: list[int], option: str, vocab: int, why: str = "") -> None:
    """Refuse an id that is no token of the map (-1, ids past it, 2**70) before numpy sees it."""
    bad = next((i for i in ids if not 0 <= i < vocab), None)
    if bad is not None:
        shown = f"{bad:.3e}" if abs(bad) >= 10**20 else str(bad)
        raise click.BadParameter(
            f"token id {shown} is outside the vocabulary of the token map (0..{vocab - 1}){why}",
            param_hint=f"'{option}'",
        )


def _rank_dir(path: Path) -> Path | None:
    """The rank folder to read: `path` itself, or the lowest rank of a world folder."""
    if (path / "manifest.json").is_file():
        return path
    ranks = sorted(
        (int(p.name[4:]), p)
        for p in (path.glob("rank*") if path.is_dir() else [])
        if p.name[4:].isdigit() and (p / "manifest.json").is_file()
    )
    return ranks[0][1] if ranks else None


def _open_pack(path: Path) -> dict[str, Any]:
    """Hash tables built from a pack's config.json and tokenizer.json (what prepare stores)."""
    from tfc.compiler.engram_map import build_token_map, check_token_map, load_tokenizer
    from tfc.packs.deepseek_v41_config import load_config
    from tfc.packs.engram_layout import check_layout, hash_multipliers
    from tfc.runtime.models.dsv41.engram_hash import HashTables

    if not (path / "config.json").is_file():
        raise EngramCommandError(f"{path}: neither a pack (no config.json) nor an image (no manifest.json)")
    cfg = load_config(path / "config.json")
    if not cfg.engram_layer_ids:
        raise EngramCommandError(f"{path / 'config.json'}: this model has no Engram layers")
    layout = check_layout(cfg)
    tok_path = path / "tokenizer.json"
    tok = load_tokenizer(tok_path)
    token_map = build_token_map(tok)
    check_token_map(token_map, cfg, tok_path)
    image = cfg.image_token_id
    tables = HashTables(
        token_map=token_map.ids,
        multipliers=hash_multipliers(layout.layer_ids, layout.max_ngram, token_map.size),
        primes=layout.primes_array(),
        offsets=layout.offsets_array(),
        pad_id=cfg.engram_pad_token_id,
        dead_ids=(image,) if image is not None else (),
        n_heads=layout.n_heads,
    )
    return {
        "kind": "pack",
        "layer_ids": list(layout.layer_ids),
        "tokenizer": tok,
        "tables": tables,
        "compressed_vocab": token_map.size,
    }


def _open_image(rank_dir: Path, tokenizer: Path | None) -> dict[str, Any]:
    """Hash tables read from an image's host-side Engram segments (never recomputed)."""
    from tfc.cache.reader import open_rank
    from tfc.packs.deepseek_v41_contract import SEG_LAYER_IDS
    from tfc.runtime.models.dsv41.engram_hash import SEG_TOKEN_MAP, params_of, tables_from_segments

    image = open_rank(rank_dir)
    if SEG_TOKEN_MAP not in image.segments:
        raise EngramCommandError(f"{rank_dir}: this image has no Engram segments")

    def get(name: str) -> np.ndarray:
        entry = image.entry(name)
        return np.frombuffer(image.segment(name), dtype=np.dtype(entry.dtype).newbyteorder("<")).reshape(
            entry.shape
        )

    tables = tables_from_segments(get)
    layer_ids = [int(x) for x in get(SEG_LAYER_IDS)]
    vocab = params_of(get)["compressed_vocab"]
    tok = None
    if tokenizer is not None:
        from tfc.compiler.engram_map import load_tokenizer

        tok = load_tokenizer(tokenizer)
    return {
        "kind": "image",
        "layer_ids": layer_ids,
        "tokenizer": tok,
        "tables": tables,
        "compressed_vocab": vocab,
    }


def _report(view: dict, tables: Any, ids: list[int], lookback: list[int], rows: np.ndarray) -> dict:
    from tfc.runtime.models.dsv41.engram_hash import DEAD, compress

    compressed = compress(tables, ids)
    return {
        "source": view["kind"],
        "layers": view["layer_ids"],
        "max_ngram": tables.max_ngram,
        "heads": tables.n_heads,
        "columns": tables.n_cols,
        "compressed_vocab": view["compressed_vocab"],
        "lookback": [int(x) for x in lookback[-(tables.max_ngram - 1) :]],
        "ids": [int(x) for x in ids],
        "compressed": [None if c == DEAD else int(c) for c in compressed],
        "rows": {str(layer): rows[:, i, :].tolist() for i, layer in enumerate(view["layer_ids"])},
    }


def _print(report: dict, tok: Any) -> None:
    n, heads = report["max_ngram"], report["heads"]
    click.echo(
        f"Engram layers {', '.join(map(str, report['layers']))}: {report['columns']} columns "
        f"(orders 2..{n} x {heads} heads), compressed vocabulary {report['compressed_vocab']}"
    )
    if report["lookback"]:
        click.echo(f"look-back ids: {', '.join(map(str, report['lookback']))}")
    width = max(len(str(layer)) for layer in report["layers"])
    for t, (tid, cid) in enumerate(zip(report["ids"], report["compressed"], strict=True)):
        shown = ""
        if tok is not None and tid >= 0:
            piece = tok.decode([tid], skip_special_tokens=False)
            shown = f" {piece!r}"
        click.echo(f"[{t}] id {tid}{shown} -> {'DEAD' if cid is None else f'compressed {cid}'}")
        for layer in report["layers"]:
            row = report["rows"][str(layer)][t]
            for k in range(n - 1):
                label = f"layer {layer:<{width}}" if k == 0 else " " * (6 + width)
                cols = " ".join(str(r) for r in row[k * heads : (k + 1) * heads])
                click.echo(f"    {label} {k + 2}-gram: {cols}")
