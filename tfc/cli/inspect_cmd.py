"""`tfc inspect PACK_OR_IMAGE [--json]`: what a pack or image holds, from headers and manifests alone."""

from __future__ import annotations

import gc
import json

import click

from tfc.cli.options import example


def _gb(n: int) -> str:
    return f"{n / 1e9:,.2f} GB" if n >= 1e8 else f"{n / 1e6:,.2f} MB"


def _hist(h: dict[str, int]) -> str:
    return " ".join(f"{bits}:{count}" for bits, count in h.items()) or "-"


def _text(s: dict) -> str:
    c, m = s["config"], s["model"]
    q = ", ".join(f"{k} {v}" for k, v in m["quantization"].items())
    lines = [
        f"pack     {s['pack']}  ({s['shards']} shards, {s['tensors']:,} tensors, {s['groups']:,} EXL3 groups, "
        f"{_gb(s['bytes']['total'])}, tokenizer: {s['tokenizer'] or 'none'})",
        f"model    {m['model_type']} {' '.join(m['architectures'])}; {q}",
        f"config   hidden {c['hidden_size']}, vocab {c['vocab_size']}, layers {c['num_hidden_layers']} + "
        f"{c['num_nextn_predict_layers']} DSpark, heads {c['num_attention_heads']} x {c['head_dim']} "
        f"(rope {c['qk_rope_head_dim']}), q_lora {c['q_lora_rank']}, o_lora {c['o_lora_rank']} x {c['o_groups']} groups",
        f"         experts {c['n_routed_experts']} top-{c['num_experts_per_tok']} + {c['n_shared_experts']} shared "
        f"(width {c['moe_intermediate_size']}), DSpark {c['dspark_n_routed_experts']} top-"
        f"{c['dspark_num_experts_per_tok']}, window {c['sliding_window']}, indexer {c['index_n_heads']} x "
        f"{c['index_head_dim']} top-{c['index_topk']}, mHC {c['hc_mult']}",
        f"         KV sources {c['kv_source_layer_ids']}, index sources {c['index_source_layer_ids']}, candidates "
        f"from {c['candidate_source_layer_id']}, Engram layers {c['engram_layer_ids']} rows {c['engram_num_embeddings']}",
        "",
        f"{'block':<10} {'mode':<8} {'ratio':>5} {'kv':>4} {'idx':>4}  {'extras':<14} expert bits w1 | w3 | w2",
    ]
    for b in s["blocks"]:
        extras = ",".join(x for x, on in (("engram", b["engram"]), ("cand", b["uses_candidates"]),
                                          ("dspark", b["dspark"])) if on)  # fmt: skip
        kv = "-" if b["kv_source"] is None else b["kv_source"]
        idx = "-" if b["index_source"] is None else b["index_source"]
        eb = b["expert_bits"]
        lines.append(
            f"{b['block']:<10} {b['mode']:<8} {b['compress_ratio']:>5} {kv:>4} {idx:>4}  {extras or '-':<14} "
            f"{_hist(eb['w1'])} | {_hist(eb['w3'])} | {_hist(eb['w2'])}"
        )
    lines += ["", f"{'tensors by kind':<22} {'count':>9} {'bytes':>14}"]
    for kind, count in s["tensors_by_kind"].items():
        lines.append(f"  {kind:<20} {count:>9,} {_gb(s['bytes']['by_kind'].get(kind, 0)):>14}")
    lines += ["", "bytes by part"]
    lines += [f"  {part:<20} {_gb(n):>24}" for part, n in s["bytes"]["by_part"].items()]
    lines += ["", "widths by projection (bits:groups)"]
    lines += [f"  {kind:<28} {_hist(h)}" for kind, h in s["widths"].items()]
    lines.append("codebooks  " + ", ".join(f"{k} {v:,}" for k, v in s["codebooks"].items()))
    if s["ignored"]:
        lines.append(f"ignored    {s['ignored']} tensor(s) on the ignore list")
    return "\n".join(lines)


@click.command(epilog=example("tfc inspect ./pack --json"))
@click.argument("pack", metavar="PACK_OR_IMAGE", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
def inspect(pack: str, as_json: bool) -> None:
    """What a pack (headers) or a prepared image (manifests) holds: model, blocks, tensors, widths, bytes."""
    from pathlib import Path

    from tfc.cli.image_summary import image_text, is_image, summarize_image

    if is_image(Path(pack)):
        summary = summarize_image(Path(pack))
        click.echo(json.dumps(summary, indent=1) if as_json else image_text(summary))
        return
    gc.disable()  # short-lived and acyclic: the collector would only rescan a million header objects
    from tfc.packs.pack import open_pack
    from tfc.packs.summary import summarize

    summary = summarize(open_pack(pack))
    click.echo(json.dumps(summary, indent=1) if as_json else _text(summary))
