"""Checks only: the reference forward's weights decoded on the device from the same arena views the fast forward reads.

`DeviceDense` is the mapping `Dsv41Model` takes (pack name -> dense [in, out]): natives are the arena's views,
EXL3 groups and expert-table entries are decoded on first use with the kernels' Triton dense decode
(kernels/exl3/decode.py, itself tested against the numpy reference). It lets a GPU check the fast forward
against the reference at Flash geometry, where the numpy decode would take minutes; nothing serves from it.
`reference_layers` / `fast_layers` run one sequence through either forward keeping every layer's streams;
`image_agreement` boots a prepared image on the GPU and runs `agreement` on it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping

import torch
from tfc.runtime.models.dsv41.fast.weights import FastWeights

_EXPERT = re.compile(r"^(?P<block>.+)\.ffn\.(?:experts\.(?P<e>\d+)|shared_experts)\.(?P<p>w[123])$")


class DeviceDense(Mapping):
    """Pack name -> dense fp32 weight on the arena's device, decoded lazily (natives: the views as stored)."""

    def __init__(self, weights: FastWeights) -> None:
        self.weights = weights
        self._held: dict[str, torch.Tensor] = {}

    def __getitem__(self, name: str) -> torch.Tensor:
        held = self._held.get(name)
        if held is None:
            held = self._held[name] = self._decode(name)
        return held

    def _decode(self, name: str) -> torch.Tensor:
        from tfc.kernels.exl3.decode import exl3_decode

        w = self.weights
        if w.has(f"{name}.trellis"):
            lin = w.linear(name)
            return exl3_decode(lin.trellis, lin.suh, lin.svh, lin.codebook, dtype=torch.float32)
        m = _EXPERT.match(name)
        if m is not None and w.has(f"{m['block']}.ffn.experts.{m['p']}.trellis"):
            table = getattr(w.experts(m["block"]), m["p"])
            e = table.entries - 1 if m["e"] is None else int(m["e"])
            if e >= table.entries - 1 and m["e"] is not None:
                raise KeyError(name)
            width, tk, tn = int(table.widths[e]), table.k // 16, table.n // 16
            if table.layout == "stack":
                trellis = table.trellis[e]
            else:
                start = int(table.offsets[e])
                trellis = (
                    table.trellis[start : start + tk * tn * width * 2].view(torch.int16).view(tk, tn, width)
                )
            return exl3_decode(
                trellis, table.suh[e], table.svh[e], int(table.codebooks[e]), dtype=torch.float32
            )
        if w.has(name):
            return w.native(name)
        raise KeyError(name)

    def __contains__(self, name: object) -> bool:
        try:
            self[name]  # type: ignore[index]
        except KeyError:
            return False
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(self._held)

    def __len__(self) -> int:
        return len(self._held)


def reference_layers(model, tokens: list[int], engram_rows=None) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(logits [n, V], each layer's output streams [n, hc, D]) of one fresh sequence through the reference."""
    layers: list[torch.Tensor] = []
    block = model._block

    def record(*args, **kwargs):
        streams, pre = block(*args, **kwargs)
        layers.append(streams)
        return streams, pre

    model._block = record
    try:
        logits = model.forward([tokens], [model.new_state()], engram_rows)[0]
    finally:
        del model._block
    return logits, layers


def fast_layers(runner, slot: int, tokens: list[int]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(logits [n, V], each layer's output streams [n, hc, D]) of a fresh sequence in `slot` (released after)."""
    forward = runner.forward
    forward.trace = []
    try:
        logits = runner.logits_of(slot, tokens, 0)
        trace = forward.trace
    finally:
        forward.trace = None
        runner.release(slot)
    n = forward.cfg.num_hidden_layers
    steps = len(trace) // n
    layers = [torch.cat([trace[s * n + i] for s in range(steps)])[: len(tokens)] for i in range(n)]
    return logits, layers


AGREE_TOKENS = [0, 17, 4242, 99, 123, 5000, 77, 31000]  # a Flash slice's check: 8 tokens of its vocabulary
AGREE_FLOOR = 1e-2  # relative L2 a few bf16 roundings (2^-9 each) per layer leave after 4 layers


def _l2(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want.double()).norm() / want.double().norm())


def agreement(fast, loose, tokens: list[int], weights: Mapping | None = None) -> dict:
    """Each layer's streams (and the logits, last) of a fresh sequence through the fast forward against the
    reference in fp32 on device-decoded weights, in relative L2; an entry passes within AGREE_FLOOR or within
    the distance of the same reference run in bf16 (its activations and weights rounded to bf16) from fp32.
    From the first CSA layer on, the FP8 / FP4 cache quantisers turn rounding noise into flipped codes, so any
    bf16 evaluation lands that far from fp32; a wrong op lands farther. `loose` (each shape's own launches: the
    same maths in another summation order) is reported beside it. `weights`: the reference's (default: the
    fast forward's, decoded on its device)."""
    from tfc.runtime.models.dsv41.reference.forward import Dsv41Model

    got, streams = fast_layers(fast, 0, tokens)
    got_l, streams_l = fast_layers(loose, 0, tokens)
    weights = weights or DeviceDense(fast.forward.weights)
    device = fast.forward.weights.arena.device
    runs = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = Dsv41Model(fast.forward.cfg, weights, dtype=dtype, device=device, engram=False)
        logits, layers = reference_layers(model, tokens)
        runs[dtype] = [*layers, logits]
        del model
    mine, theirs, want, half = [*streams, got], [*streams_l, got_l], runs[torch.float32], runs[torch.bfloat16]
    out = {
        "fast_vs_reference": [_l2(a, b) for a, b in zip(mine, want, strict=True)],
        "reference_bf16_vs_fp32": [_l2(a, b) for a, b in zip(half, want, strict=True)],
        "loose_vs_reference": [_l2(a, b) for a, b in zip(theirs, want, strict=True)],
        "fast_vs_loose": [_l2(a, b) for a, b in zip(mine, theirs, strict=True)],
        "fast_vs_reference_max": [_rel(a, b) for a, b in zip(mine, want, strict=True)],
        "top1_equal": float((got.argmax(-1) == want[-1].argmax(-1)).double().mean()),
        "top1_equal_bf16_reference": float((half[-1].argmax(-1) == want[-1].argmax(-1)).double().mean()),
    }
    out["bound"] = [max(AGREE_FLOOR, n) for n in out["reference_bf16_vs_fp32"]]
    out["pass"] = all(e <= b for e, b in zip(out["fast_vs_reference"], out["bound"], strict=True))
    return out


def image_agreement(image, tokens: list[int] = AGREE_TOKENS) -> dict:
    """`agreement` of a prepared image's fast forward (one slot, 4,096 tokens, no Engram) booted on CUDA, with
    its loose twin on the same arena."""
    from types import SimpleNamespace

    from tfc.runtime.boot.rank import boot
    from tfc.runtime.graphs.graph_cache import GraphCache, GraphSettings
    from tfc.runtime.models.dsv41.fast.build import build_fast

    booted = boot(image, device="cuda")
    try:
        fast = build_fast(booted, slots=1, tokens_per_slot=4096, engram=False)
        own = SimpleNamespace(image=booted.image, arena=booted.arena, graphs=GraphCache(GraphSettings()))
        loose = build_fast(own, slots=1, tokens_per_slot=4096, exact=False, engram=False)
        return agreement(fast, loose, tokens)
    finally:
        booted.close()


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want.double()).abs().max() / want.double().abs().max())


def kernel_errors(runner, layer: int, rows: int = 16, numpy_max: int = 50_000_000) -> dict[str, float]:
    """Relative errors of one layer's kernel calls (and the head's) on random inputs, to localise a disagreement:
    each EXL3 group's product against x @ its device-decoded weight ("gemm"), the device decode against the numpy
    reference decode for groups of at most `numpy_max` weights ("decode"), the MoE against the SwiGLU of the
    decoded entries in fp64, one routed and the shared entry's decode, the router's bf16 product against fp64."""
    from tfc.kernels.exl3.reference import dequant
    from tfc.runtime.models.dsv41.fast.moe import split3

    w, ops, cfg = runner.forward.weights, runner.forward.ops, runner.forward.cfg
    dense, dev = DeviceDense(w), w.arena.device
    gen = torch.Generator(device=dev).manual_seed(0)

    def numpy_dense(trellis, suh, svh, codebook: int) -> torch.Tensor:
        return torch.from_numpy(
            dequant(trellis.cpu().numpy(), suh.cpu().numpy(), svh.cpu().numpy(), codebook)
        )

    out: dict[str, float] = {}
    groups = sorted({s.name[: -len(".trellis")] for s in w.image.manifest.segments
                     if s.name.startswith(f"layers.{layer}.") and s.name.endswith(".trellis") and ".experts." not in s.name})  # fmt: skip
    for name in [*groups, "head"]:
        lin = w.linear(name)
        x = torch.randn(rows, lin.k, device=dev, generator=gen)
        out[f"gemm {name}"] = _rel(ops.linear(x, lin), x.double() @ dense[name].double())
        if lin.k * lin.n <= numpy_max:
            out[f"decode {name}"] = _rel(
                dense[name].cpu(), numpy_dense(lin.trellis, lin.suh, lin.svh, lin.codebook)
            )
        del dense._held[name]
    p = f"layers.{layer}.ffn"
    tables = w.experts(f"layers.{layer}")
    k = cfg.num_experts_per_tok
    x = torch.randn(1, cfg.hidden_size, device=dev, generator=gen)
    ids = torch.randperm(cfg.n_routed_experts, device=dev, generator=gen)[:k].unsqueeze(0)
    wts = torch.rand(1, k, device=dev, generator=gen) + 0.1
    want = torch.zeros(1, cfg.hidden_size, dtype=torch.float64, device=dev)
    for e, weight in [*zip(ids[0].tolist(), wts[0].tolist(), strict=True), (None, 1.0)]:
        q = f"{p}.shared_experts" if e is None else f"{p}.experts.{e}"
        xd = x.double()
        gate = (xd @ dense[f"{q}.w1"].double()).clamp(max=cfg.swiglu_limit)
        up = (xd @ dense[f"{q}.w3"].double()).clamp(-cfg.swiglu_limit, cfg.swiglu_limit)
        want += (torch.nn.functional.silu(gate) * up * weight) @ dense[f"{q}.w2"].double()
    out["moe"] = _rel(ops.moe(x, ids, wts, tables, cfg.swiglu_limit), want)
    for label, e in (("routed", int(ids[0, 0])), ("shared", tables.w1.entries - 1)):
        name = f"{p}.shared_experts.w2" if label == "shared" else f"{p}.experts.{e}.w2"
        t = tables.w2
        width, tk, tn = int(t.widths[e]), t.k // 16, t.n // 16
        if t.layout == "stack":
            trellis = t.trellis[e]
        else:
            start = int(t.offsets[e])
            trellis = t.trellis[start : start + tk * tn * width * 2].view(torch.int16).view(tk, tn, width)
        out[f"decode {label} w2"] = _rel(
            dense[name].cpu(), numpy_dense(trellis, t.suh[e], t.svh[e], int(t.codebooks[e]))
        )
    gate_w = w.native(f"{p}.gate.weight")
    x = torch.randn(rows, cfg.hidden_size, device=dev, generator=gen)
    if gate_w.dtype != torch.float32:
        prod = ops.mm_bf16(split3(x, gate_w.dtype), gate_w)
        out["router"] = _rel(
            (prod[:rows] + prod[rows : 2 * rows]) + prod[2 * rows :], x.double() @ gate_w.double().T
        )
    return out
