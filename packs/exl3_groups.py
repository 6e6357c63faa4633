"""EXL3 groups: one quantized linear = trellis + suh + svh [+ codebook marker, bias], checked together."""

from __future__ import annotations

from dataclasses import dataclass, field

from tfc.packs.errors import HeaderError, MissingTensor
from tfc.packs.safetensors_header import TensorInfo

MCG_MARKER = 0xCBAC1FED
MUL1_MARKER = 0x83DCD12D
MARKER_VALUES = {"mcg": MCG_MARKER, "mul1": MUL1_MARKER}
CODEBOOKS = ("3inst", "mcg", "mul1")
INT_WIDTHS = frozenset(range(16, 129, 16))  # K = 1..8 bits, any codebook
HALF_WIDTHS = frozenset((24, 40, 56))  # K = 1.5, 2.5, 3.5, MUL1 only
SIBLINGS = frozenset(("su", "sv", "bias"))  # rare optional siblings, found among leftover names
MARKER_FORMS = frozenset((("I32", ()), ("I32", (1,)), ("I32", (0,))))  # numel 1: value checked; 0: presence
SCALE_DTYPES = frozenset(("F16",))
BIAS_DTYPES = frozenset(("F16", "F32", "BF16"))


@dataclass(frozen=True, slots=True)
class Exl3Group:
    """One EXL3 linear y = x W (+ bias), W of shape (k, n); trellis int16 (k/16, n/16, width)."""

    name: str
    k: int
    n: int
    width: int
    bits: float
    codebook: str  # "3inst" | "mcg" | "mul1"
    trellis: TensorInfo
    suh: TensorInfo | None
    svh: TensorInfo | None
    su: TensorInfo | None
    sv: TensorInfo | None
    bias: TensorInfo | None
    marker: TensorInfo | None
    kind: str = ""  # projection kind, e.g. "ffn.experts.w1"
    block: int | None = None

    @property
    def tile_bytes(self) -> int:
        """Bytes of one 16x16 tile."""
        return 2 * self.width


def width_error(width: int, codebook: str) -> str | None:
    """Why a trellis width (int16 words per tile) is not allowed with a codebook, or None."""
    if width in INT_WIDTHS:
        return None
    if width in HALF_WIDTHS:
        return (
            None
            if codebook == "mul1"
            else f"half-rate width {width} ({width / 16} bits) needs the mul1 codebook"
        )
    return f"width {width} is not 16..128 in steps of 16 (or 24/40/56 with mul1)"


@dataclass
class KindRecord:
    """Columns of one GroupKind: table rows per group (None where absent), then widths and codebooks."""

    spec: object  # deepseek_v41_names.GroupKind (or another family's)
    trellis: list[int | None]
    suh: list[int | None]
    svh: list[int | None]
    mcg: list[int | None]
    mul1: list[int | None]
    widths: list[int] = field(default_factory=list)
    codebooks: list[str] = field(default_factory=list)

    def marker(self, j: int) -> int | None:
        """Row of group j's codebook marker."""
        return self.mul1[j] if self.mul1[j] is not None else self.mcg[j]


def lookup_kind(table, spec, markers: tuple[str, ...] = ("mcg", "mul1")) -> KindRecord:
    """Table rows of one kind's trellis, scales and markers (only the marker kinds the pack holds at all)."""
    get, names = table.index.get, spec.names
    trellis, suh, svh = (
        list(map(get, [b + suffix for b in names])) for suffix in (".trellis", ".suh", ".svh")
    )
    mcg, mul1 = (
        list(map(get, [b + "." + m for b in names])) if m in markers else [None] * len(names)
        for m in ("mcg", "mul1")
    )
    return KindRecord(spec, trellis, suh, svh, mcg, mul1)


def validate_kind(table, record: KindRecord, siblings: dict[str, dict[str, int]]) -> None:
    """Check one kind's groups against each other and the expected (k, n), columns at a time."""
    dtypes, shapes, spec = table.dtypes, table.shapes, record.spec
    k, n, names = spec.k, spec.n, spec.names
    trellis, suh, svh = record.trellis, record.suh, record.svh
    if None in trellis:
        b = names[trellis.index(None)]
        raise MissingTensor(f"{b}.trellis is missing (EXL3 group {b})")
    for col, scale, legacy in ((suh, "suh", "su"), (svh, "svh", "sv")):
        if None in col:
            for j, i in enumerate(col):
                if i is None and names[j] not in siblings[legacy]:
                    raise MissingTensor(
                        f"{names[j]}.{scale} is missing (EXL3 group {names[j]} needs .{scale} or .{legacy})"
                    )
    tk, tn = k // 16, n // 16
    bad = {s for s in set(map(shapes.__getitem__, trellis)) if len(s) != 3 or s[:2] != (tk, tn)}
    if bad or set(map(dtypes.__getitem__, trellis)) != {"I16"}:
        i = next(i for i in trellis if shapes[i] in bad or dtypes[i] != "I16")
        raise HeaderError(
            f"{table.where(i)}: trellis {dtypes[i]} {list(shapes[i])}, expected I16 [{tk}, {tn}, width] for {k} x {n}"
        )
    _check_vectors(table, suh, (k,), "suh")
    _check_vectors(table, svh, (n,), "svh")
    mcg, mul1 = record.mcg, record.mul1
    has_mcg, has_mul1 = mcg.count(None) != len(mcg), mul1.count(None) != len(mul1)
    if has_mcg and has_mul1:
        both = [j for j, (a, b) in enumerate(zip(mcg, mul1, strict=True)) if a is not None and b is not None]
        if both:
            raise HeaderError(
                f"{table.where(mul1[both[0]])}: EXL3 group {names[both[0]]} carries both .mcg and .mul1 markers"
            )
    if has_mcg or has_mul1:
        codebooks = [
            "mul1" if b is not None else "mcg" if a is not None else "3inst"
            for a, b in zip(mcg, mul1, strict=True)
        ]
        rows = [i for i in (mcg if has_mcg else []) + (mul1 if has_mul1 else []) if i is not None]
        _check_markers(table, rows)
    else:
        codebooks = ["3inst"] * len(names)
    widths = [shapes[i][2] for i in trellis]
    for width, codebook in set(zip(widths, codebooks, strict=True)):
        problem = width_error(width, codebook)
        if problem:
            j = next(j for j, wc in enumerate(zip(widths, codebooks, strict=True)) if wc == (width, codebook))
            raise HeaderError(f"{table.where(trellis[j])}: {problem} (codebook {codebook})")
    record.widths, record.codebooks = widths, codebooks


def check_siblings(table, siblings: dict[str, dict[str, int]], dims: dict[str, tuple[int, int]]) -> None:
    """Dtypes and shapes of the optional siblings (legacy signs, biases) of known groups."""
    for base, i in siblings["su"].items():
        _expect(table, i, ("I16",), (dims[base][0] // 16,), "su")
    for base, i in siblings["sv"].items():
        _expect(table, i, ("I16",), (dims[base][1] // 16,), "sv")
    for base, i in siblings["bias"].items():
        _expect(table, i, BIAS_DTYPES, (dims[base][1],), "bias")


def check_marker_values(table, records: list[KindRecord], read_values) -> None:
    """Markers holding a value (numel 1) must hold their codebook's constant; numel 0 marks presence only."""
    nbytes = table.nbytes
    for marker, expected in MARKER_VALUES.items():
        rows, values = read_values(
            [i for rec in records for i in getattr(rec, marker) if i is not None and nbytes[i] == 4]
        )
        if set(values) - {expected}:
            i, value = next((i, v) for i, v in zip(rows, values, strict=True) if v != expected)
            raise HeaderError(
                f"{table.where(i)}: unknown codebook marker value {value:#010x} (.{marker} must hold {expected:#010x})"
            )


def _check_markers(table, rows: list[int]) -> None:
    kinds = set(zip(map(table.dtypes.__getitem__, rows), map(table.shapes.__getitem__, rows), strict=True))
    if kinds - MARKER_FORMS:
        i = next(i for i in rows if (table.dtypes[i], table.shapes[i]) not in MARKER_FORMS)
        raise HeaderError(
            f"{table.where(i)}: codebook marker must be an I32 scalar, got {table.dtypes[i]} {list(table.shapes[i])}"
        )


def _check_vectors(table, col: list[int | None], shape: tuple[int, ...], what: str) -> None:
    present = [i for i in col if i is not None] if None in col else col
    if (
        set(map(table.shapes.__getitem__, present)) - {shape}
        or set(map(table.dtypes.__getitem__, present)) - SCALE_DTYPES
    ):
        i = next(i for i in present if table.shapes[i] != shape or table.dtypes[i] not in SCALE_DTYPES)
        raise HeaderError(
            f"{table.where(i)}: {what} {table.dtypes[i]} {list(table.shapes[i])} does not match the trellis: "
            f"expected F16 {list(shape)}"
        )


def _expect(table, i: int, dtypes, shape: tuple[int, ...], what: str) -> None:
    if table.dtypes[i] not in dtypes or table.shapes[i] != shape:
        want = "/".join(sorted(dtypes))
        raise HeaderError(
            f"{table.where(i)}: {what} {table.dtypes[i]} {list(table.shapes[i])}, expected {want} {list(shape)}"
        )
