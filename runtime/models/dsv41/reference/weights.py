"""Dense weights of a DeepSeek-V4.1 rank image for the reference forward: natives as stored, EXL3 decoded to [in, out].

Segments read (compiler lowering, contracts "Expert tables"): natives (`native.v1`) by pack name; EXL3
groups `<name>.trellis|suh|svh` (codebook from the plan's attrs) decoded with the kernels' numpy reference
decode; expert tables `<block>.ffn.experts.<p>.*` (stack or ragged, E routed entries then the shared
expert) decoded per entry into `<block>.ffn.experts.<e>.<p>` and `<block>.ffn.shared_experts.<p>`;
Engram hash assets and row shards (`engram.rows.e4m3e8m0.v1`) for an `EngramFeed`. Decoding is lazy:
a name is decoded when a forward first reads it (DSpark blocks `mtp.*` only when the drafter runs).
A TP=N rank's image holds its slices (column, row and vocabulary splits on 128-value blocks); each
128 x 128 tile decodes on its own, so a rank's slice has the bits of the same columns decoded at TP=1.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tfc.cache.contract import LAYOUT_NATIVE, LAYOUT_STACK, LAYOUT_TRELLIS
from tfc.packs.deepseek_v41_contract import FAMILY, SEG_ROW_RANGES, SEG_TOKEN_MAP, engram_rows_name
from tfc.runtime.models.dsv41.config import Dsv41Config, config_from_dict
from tfc.runtime.models.dsv41.reference.engram import EngramFeed

from tfc.errors import TfcError

_TABLE = re.compile(r"^(?P<block>.+)\.ffn\.experts\.(?P<p>w[123])\.trellis$")


class WeightLoadError(TfcError):
    """An image the reference forward cannot take its weights from."""


class ImageWeights(Mapping):
    """Pack name -> dense tensor, decoded from an opened rank image on first access."""

    def __init__(self, image: Any, plan_attrs: Mapping[str, Any], where: str) -> None:
        self._image = image
        self._attrs = plan_attrs
        self._where = where
        self._cache: dict[str, torch.Tensor] = {}
        self._sources: dict[str, tuple[str, Any]] = {}
        names = set(image.segments)
        for name in names:
            entry = image.entry(name)
            if entry.layout == LAYOUT_NATIVE:
                self._sources[name] = ("native", name)
            elif entry.layout == LAYOUT_TRELLIS and name.endswith(".trellis"):
                self._sources[name[: -len(".trellis")]] = ("group", name[: -len(".trellis")])
            elif (m := _TABLE.match(name)) is not None:
                base = name[: -len(".trellis")]
                count = int(np.prod(image.entry(f"{base}.offsets").shape))
                for e in range(count - 1):
                    self._sources[f"{m['block']}.ffn.experts.{e}.{m['p']}"] = ("expert", (base, e))
                self._sources[f"{m['block']}.ffn.shared_experts.{m['p']}"] = ("expert", (base, count - 1))

    def __getitem__(self, name: str) -> torch.Tensor:
        held = self._cache.get(name)
        if held is None:
            kind, src = self._sources[name]
            if kind == "native":
                held = self.native(src)
            elif kind == "group":
                held = self._group(src)
            else:
                held = self._expert(*src)
            self._cache[name] = held
        return held

    def __iter__(self) -> Iterator[str]:
        return iter(self._sources)

    def __len__(self) -> int:
        return len(self._sources)

    def __contains__(self, name: object) -> bool:
        return name in self._sources

    def array(self, name: str) -> np.ndarray:
        """One segment as a numpy array (bfloat16 as a torch-viewable uint16 array)."""
        entry = self._image.entry(name)
        dtype = np.uint16 if entry.dtype == "bfloat16" else np.dtype(entry.dtype)
        arr = np.frombuffer(self._image.segment(name), dtype=np.dtype(dtype).newbyteorder("<"))
        return arr.reshape(entry.shape)

    def native(self, name: str) -> torch.Tensor:
        """A native segment as a torch tensor (bfloat16 kept as bfloat16)."""
        entry = self._image.entry(name)
        t = torch.from_numpy(self.array(name).copy())
        return t.view(torch.bfloat16) if entry.dtype == "bfloat16" else t

    def _group(self, base: str) -> torch.Tensor:
        from tfc.kernels.exl3.codebook import CODEBOOKS

        attrs = self._attrs.get(f"{base}.trellis", {})
        codebook = attrs.get("codebook")
        if codebook not in CODEBOOKS:
            raise WeightLoadError(f"{self._where}: plan gives {base} no known codebook ({codebook!r})")
        trellis = self.array(f"{base}.trellis")
        return dequant_tiles(
            trellis, self.array(f"{base}.suh"), self.array(f"{base}.svh"), CODEBOOKS.index(codebook)
        )

    def _expert(self, base: str, e: int) -> torch.Tensor:
        suh, svh = self.array(f"{base}.suh")[e], self.array(f"{base}.svh")[e]
        k, n = suh.shape[0], svh.shape[0]
        width = int(self.array(f"{base}.widths")[e])
        codebook = int(self.array(f"{base}.codebooks")[e])
        layout = self._image.entry(f"{base}.trellis").layout
        if layout == LAYOUT_STACK:
            trellis = self.array(f"{base}.trellis")[e]
        else:
            start = int(self.array(f"{base}.offsets")[e])
            size = (k // 16) * (n // 16) * width * 2
            blob = self.array(f"{base}.trellis")
            if start < 0 or start + size > blob.shape[0]:
                raise WeightLoadError(f"{self._where}: {base} entry {e} runs past its table")
            trellis = blob[start : start + size].view(np.int16).reshape(k // 16, n // 16, width)
        return dequant_tiles(trellis, suh, svh, codebook)


def dequant_tiles(trellis: np.ndarray, suh: np.ndarray, svh: np.ndarray, codebook: int) -> torch.Tensor:
    """W [k, n] float32 by the one EXL3 decode (kernels/exl3/reference.py), as a tensor."""
    from tfc.kernels.exl3.reference import Exl3FormatError, dequant

    try:
        return torch.from_numpy(dequant(trellis, suh, svh, codebook))
    except Exl3FormatError as e:
        raise WeightLoadError(str(e)) from None


def dense_from_opened(opened: Any) -> tuple[Dsv41Config, ImageWeights]:
    """(model config with its recorded layer modes, lazily decoded weights) of an opened rank image."""
    m = opened.manifest
    if m.family != FAMILY:
        raise WeightLoadError(f"{opened.path}: an image of family {m.family!r}, not DeepSeek-V4.1 ({FAMILY})")
    meta = m.meta or {}
    config = meta.get("pack_config")
    if not isinstance(config, dict):
        raise WeightLoadError(f"{opened.path}: the manifest carries no model config (meta.pack_config)")
    cfg = config_from_dict(config, meta.get("layer_modes"), str(opened.path))
    attrs = (m.plan or {}).get("attrs", {})
    return cfg, ImageWeights(opened.image, attrs, str(opened.path))


def open_dense(image_path: str | Path) -> tuple[Dsv41Config, ImageWeights, Any]:
    """(model config with its recorded layer modes, lazily decoded weights, the opened image) of a TP=1 image."""
    from tfc.runtime.boot.image_open import open_image

    opened = open_image(image_path)
    try:
        cfg, weights = dense_from_opened(opened)
    except BaseException:
        opened.close()
        raise
    return cfg, weights, opened


def load_dense_weights(image_path: str | Path) -> tuple[Dsv41Config, ImageWeights]:
    """(config, weights) of a TP=1 DeepSeek-V4.1 image; weights decode on first access."""
    cfg, weights, _ = open_dense(image_path)
    return cfg, weights


def engram_feed(
    weights: ImageWeights, layer_ids: tuple[int, ...], head_dim: int, cols: tuple[int, int] | None = None,
    off_device: Any = None,
) -> EngramFeed | None:  # fmt: skip
    """The image's Engram hasher and row shards as a feed (a TP rank's: its `cols`), or None without tables; a
    shard the boot placed off the device (`off_device`: runtime/boot/tiers.py) is read from its tier."""
    from tfc.kernels.dsv41.engram_rows import decode_rows_reference
    from tfc.runtime.models.dsv41.engram_hash import hash_ids, tables_from_segments

    image = weights._image
    names = set(image.segments)
    shards = [engram_rows_name(layer) for layer in layer_ids]
    if SEG_TOKEN_MAP not in names or any(s not in names for s in shards):
        return None
    tables = tables_from_segments(weights.array)
    ranges = weights.array(SEG_ROW_RANGES)
    sources = [None if off_device is None else off_device.source(s) for s in shards]
    records = [
        torch.from_numpy(weights.array(s).copy()) if src is None else None
        for s, src in zip(shards, sources, strict=True)
    ]

    def gather(k: int, ids: torch.Tensor) -> torch.Tensor:
        local = ids.to(torch.int64) - int(ranges[k][0])
        if sources[k] is not None:  # host memory or NVMe: the record bytes, then the same decode
            got = sources[k].gather(local.numpy())
            return decode_rows_reference(torch.from_numpy(got).reshape(*local.shape, -1), head_dim).float()
        if local.numel() and (int(local.min()) < 0 or int(local.max()) >= records[k].shape[0]):
            raise WeightLoadError(f"Engram rows of layer {layer_ids[k]} fall outside this image's shard")
        return decode_rows_reference(records[k][local], head_dim).float()

    return EngramFeed(
        layer_ids, tables.max_ngram, lambda ids, back: hash_ids(tables, ids, back), gather, cols
    )
