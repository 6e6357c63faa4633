"""A cheap view of an opened pack for planning: groups as table rows, tensor records made on demand."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

from tfc.compiler.errors import PlanError


@dataclass(frozen=True, eq=False)
class GroupRef:
    """One EXL3 linear as rows of the pack's tensor table; TensorInfo records are built only when read."""

    table: object
    name: str
    k: int
    n: int
    width: int
    codebook: str
    trellis_row: int
    suh_row: int
    svh_row: int
    bias_row: int | None

    @property
    def bits(self) -> float:
        return self.width / 16

    @property
    def tile_bytes(self) -> int:
        return 2 * self.width

    @cached_property
    def trellis(self):
        return self.table.info(self.trellis_row)

    @cached_property
    def suh(self):
        return self.table.info(self.suh_row)

    @cached_property
    def svh(self):
        return self.table.info(self.svh_row)

    @cached_property
    def bias(self):
        return None if self.bias_row is None else self.table.info(self.bias_row)


@dataclass(frozen=True, eq=False)
class KindView:
    """All groups of one projection kind in one block (e.g. the 384 routed w1 of layers.3)."""

    block: str
    kind: str
    k: int
    n: int
    names: tuple[str, ...]
    widths: list[int]
    codebooks: list[str]
    record: object = None
    table: object = None
    bias: dict | None = None

    @cached_property
    def groups(self) -> tuple[GroupRef, ...]:
        """The kind's groups as table-row references (made on first use: plans of bytes never need them)."""
        rec = self.record
        return tuple(
            GroupRef(self.table, name, self.k, self.n, self.widths[j], self.codebooks[j], rec.trellis[j],
                     rec.suh[j], rec.svh[j], (self.bias or {}).get(name))
            for j, name in enumerate(self.names)
        )  # fmt: skip


def block_name(config, block: int | None) -> str:
    return "top" if block is None else config.block_prefix(block)


@lru_cache(maxsize=4)
def kinds(pack) -> list[KindView]:
    """Every group kind of the pack, groups in stored order."""
    table, bias = pack.table, pack.siblings.get("bias", {})
    out = []
    for rec in pack.records:
        spec = rec.spec
        if None in rec.suh or None in rec.svh:
            legacy = next(
                n for n, a, b in zip(spec.names, rec.suh, rec.svh, strict=True) if a is None or b is None
            )
            raise PlanError(
                f"{legacy}: legacy .su/.sv sign vectors are not supported; re-quantise with suh/svh"
            )
        out.append(KindView(block_name(pack.config, spec.block), spec.kind, spec.k, spec.n, tuple(spec.names),
                            rec.widths, rec.codebooks, rec, table, bias))  # fmt: skip
    return out


def natives(pack) -> list[tuple[str, str, int]]:
    """(block, name, table row) of every native tensor in use."""
    specs = pack.native_specs
    return [(block_name(pack.config, specs[name].block), name, row) for name, row in pack.native_rows.items()]
