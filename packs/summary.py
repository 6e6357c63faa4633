"""What a pack holds, from its headers: model, config, block modes, tensors and bytes by kind, widths."""

from __future__ import annotations

from collections import Counter
from typing import Any

from tfc.packs.pack import Pack

CONFIG_KEYS = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_nextn_predict_layers", "num_attention_heads",
    "head_dim", "qk_rope_head_dim", "q_lora_rank", "o_lora_rank", "o_groups", "n_routed_experts",
    "num_experts_per_tok", "n_shared_experts", "moe_intermediate_size", "dspark_n_routed_experts",
    "dspark_num_experts_per_tok", "sliding_window", "index_n_heads", "index_head_dim", "index_topk",
    "kv_source_layer_ids", "index_source_layer_ids", "candidate_source_layer_id", "engram_layer_ids",
    "engram_num_embeddings", "hc_mult", "max_position_embeddings",
)  # fmt: skip
EXPERT_KINDS = ("ffn.experts.w1", "ffn.experts.w3", "ffn.experts.w2")


def _part(kind: str, block: int | None, dspark: bool) -> str:
    """Which part of the model a group or native kind belongs to, for bytes by part."""
    if dspark and block is not None:
        return "dspark"
    if kind.startswith("ffn.experts."):
        return "routed_experts"
    if kind.startswith("ffn.shared_experts."):
        return "shared_experts"
    if kind.startswith("engram"):
        return "engram_tables" if kind == "engram.table" else "engram"
    if kind in ("head", "embed"):
        return kind
    if kind.startswith("attn"):
        return "attention"
    return "natives"


def _bits_label(width: int) -> str:
    bits = width / 16
    return f"{bits:g}"


def summarize(pack: Pack) -> dict[str, Any]:
    """A JSON-ready description of the pack; reads nothing but what open_pack already read."""
    cfg, table = pack.config, pack.table
    nbytes = table.nbytes
    counts: Counter = Counter()
    kind_bytes: Counter = Counter()
    part_bytes: Counter = Counter()
    widths: dict[str, Counter] = {}
    codebooks: Counter = Counter()
    block_widths: dict[int, dict[str, Counter]] = {}
    for rec in pack.records:
        spec = rec.spec
        dspark = spec.block is not None and cfg.is_dspark(spec.block)
        trellis_bytes = sum(map(nbytes.__getitem__, rec.trellis))
        scales = [i for col in (rec.suh, rec.svh) for i in col if i is not None]
        markers = [i for col in (rec.mcg, rec.mul1) for i in col if i is not None]
        scale_bytes, marker_bytes = (
            sum(map(nbytes.__getitem__, scales)),
            sum(map(nbytes.__getitem__, markers)),
        )
        counts["exl3.trellis"] += len(rec.trellis)
        counts["exl3.scales"] += len(scales)
        counts["exl3.marker"] += len(markers)
        kind_bytes["exl3.trellis"] += trellis_bytes
        kind_bytes["exl3.scales"] += scale_bytes
        kind_bytes["exl3.marker"] += marker_bytes
        part_bytes[_part(spec.kind, spec.block, dspark)] += trellis_bytes + scale_bytes + marker_bytes
        key = f"dspark.{spec.kind}" if dspark else spec.kind
        widths.setdefault(key, Counter()).update(rec.widths)
        codebooks.update(rec.codebooks)
        if spec.block is not None:
            block_widths.setdefault(spec.block, {})[spec.kind] = Counter(rec.widths)
    for suffix, rows in pack.siblings.items():
        if not rows:
            continue
        counts[f"exl3.{suffix}"] += len(rows)
        kind_bytes[f"exl3.{suffix}"] += sum(map(nbytes.__getitem__, rows.values()))
    for name, i in pack.native_rows.items():
        spec = pack.native_specs[name]
        kind = "engram.table" if spec.kind == "engram.table" else "native"
        counts[kind] += 1
        kind_bytes[kind] += nbytes[i]
        dspark = spec.block is not None and cfg.is_dspark(spec.block) and spec.kind != "engram.table"
        part_bytes[_part(spec.kind, spec.block, dspark)] += nbytes[i]
    ignored_bytes = sum(nbytes[table.index[n]] for n in pack.ignored)
    if pack.ignored:
        counts["ignored"] += len(pack.ignored)
        kind_bytes["ignored"] += ignored_bytes
        part_bytes["ignored"] += ignored_bytes
    blocks = []
    for b in range(cfg.num_blocks):
        mode = cfg.layer_mode(b)
        bw = block_widths.get(b, {})
        blocks.append({
            "block": cfg.block_prefix(b), "mode": mode.mode, "compress_ratio": mode.compress_ratio,
            "kv_source": mode.kv_source, "index_source": mode.index_source,
            "uses_candidates": mode.uses_candidates, "engram": mode.engram, "dspark": cfg.is_dspark(b),
            "experts": cfg.num_experts(b),
            "expert_bits": {k.rsplit(".", 1)[1]: _hist(bw.get(k, Counter())) for k in EXPERT_KINDS},
        })  # fmt: skip
    q = cfg.quantization_config or {}
    return {
        "pack": str(pack.root),
        "model": {
            "model_type": cfg.model_type,
            "architectures": list(cfg.architectures),
            "quantization": {
                k: q.get(k)
                for k in ("quant_method", "version", "bits", "avg_bits", "head_bits", "mtp_bits", "codebook")
                if k in q
            },
        },
        "config": {
            k: (list(v) if isinstance(v, tuple) else v) for k in CONFIG_KEYS for v in [getattr(cfg, k)]
        },
        "shards": len(pack.shards),
        "tokenizer": pack.tokenizer_path.name if pack.tokenizer_path else None,
        "tensors": len(table.names),
        "groups": sum(len(r.trellis) for r in pack.records),
        "blocks": blocks,
        "tensors_by_kind": dict(sorted(counts.items())),
        "bytes": {
            "total": sum(nbytes),
            "by_kind": dict(sorted(kind_bytes.items())),
            "by_part": dict(sorted(part_bytes.items())),
        },
        "widths": {k: _hist(c) for k, c in widths.items()},
        "codebooks": dict(sorted(codebooks.items())),
        "ignored": len(pack.ignored),
        "dspark": pack.dspark,
    }


def _hist(counter: Counter) -> dict[str, int]:
    """Bits -> count, ascending bits."""
    return {_bits_label(w): counter[w] for w in sorted(counter)}
