"""One DeepSeek-V4.1 mHC block after its Engram: attention site, then MoE site, each mixed over the hc streams.

    (pa, qa, ca) = mix_attn(S);  S = expand(attend(attn_norm(collapse(S, pre))), S, qa, ca)
    (pf, qf, cf) = mix_ffn(S);   S = expand(moe(ffn_norm(collapse(S, pa))), S, qf, cf);  next pre = pf
Shared by the backbone (runtime/models/dsv41/reference/forward.py) and the DSpark blocks (dspark.py), which differ only
in their attention and their experts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from tfc.runtime.models.dsv41.config import Dsv41Config
from tfc.runtime.models.dsv41.reference.csa import rms_norm
from tfc.runtime.models.dsv41.reference.mhc import hc_collapse, hc_expand, hc_mix
from tfc.runtime.models.dsv41.reference.moe import moe


def mhc_block(
    cfg: Dsv41Config, get: Callable[[str], torch.Tensor], block: str, streams: torch.Tensor, pre: torch.Tensor,
    attend: Callable[[torch.Tensor], torch.Tensor], experts: int, top_k: int, reduce: Any,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(streams, the FFN site's pre) after block `block`'s two sites; `attend(x)` is its attention."""
    mix = {"norm_eps": cfg.rms_norm_eps, "hc_eps": cfg.hc_eps, "iters": cfg.hc_sinkhorn_iters,
           "post_alpha": cfg.hc_post_alpha}  # fmt: skip
    b = block
    a_pre, a_post, a_comb = hc_mix(
        streams, get(f"{b}.hc_attn_fn"), get(f"{b}.hc_attn_scale"), get(f"{b}.hc_attn_base"), **mix
    )
    x = rms_norm(hc_collapse(streams, pre), get(f"{b}.attn_norm.weight"), cfg.rms_norm_eps)
    streams = hc_expand(attend(x), streams, a_post, a_comb)
    f_pre, f_post, f_comb = hc_mix(
        streams, get(f"{b}.hc_ffn_fn"), get(f"{b}.hc_ffn_scale"), get(f"{b}.hc_ffn_base"), **mix
    )
    x = rms_norm(hc_collapse(streams, a_pre), get(f"{b}.ffn_norm.weight"), cfg.rms_norm_eps)
    y = moe(x, get, f"{b}.ffn", experts, top_k, cfg.routed_scaling_factor, cfg.swiglu_limit, cfg.norm_topk_prob,
            shared=cfg.n_shared_experts > 0, reduce=reduce)  # fmt: skip
    return hc_expand(y, streams, f_post, f_comb), f_pre
