"""The numpy EXL3 reference decode against tables and bit streams computed independently from the spec.

Exactness of the decode stage (spec exl3.md §7 steps 1-6) is checked to the bit: every one of the 65,536
states of each codebook against a table built here with pure-Python integers and `struct` half floats
(no numpy), ring windows against a bit-string walk of the ring, and the tile permutation against the spec's
lane description. The rotation and scale steps are checked against a float64 computation that builds the
Hadamard matrix as a Kronecker power.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from tfc.kernels.exl3 import codebook as cbk
from tfc.kernels.exl3 import reference as ref
from tfc.kernels.exl3.hadamard import hadamard128

ALL_WIDTHS = [(w, cb) for w in range(16, 129, 16) for cb in (0, 1, 2)] + [(w, 2) for w in (24, 40, 56)]


def _half(bits: int) -> float:
    return struct.unpack("<e", struct.pack("<H", bits & 0xFFFF))[0]


def _to_half_bits(value: float) -> int:
    # struct's 'e' packing rounds to nearest, ties to even (PyFloat_Pack2).
    return struct.unpack("<H", struct.pack("<e", value))[0]


def _independent_value(state: int, codebook: int) -> int:
    """fp16 bits of a codebook value, from the spec's recipe in Python integers (no numpy)."""
    if codebook == 2:
        x = (state * 2212286765) % (1 << 32)
        b = sum((x >> (8 * q)) & 0xFF for q in range(4))
        return _to_half_bits((1024 + b) * _half(0x1EEE) + _half(0xC931))
    mult, add = (89226354, 64248484) if codebook == 0 else (3417055213, 0)
    x = (state * mult + add) % (1 << 32)
    x = (x & 0x8FFF8FFF) ^ 0x3B603B60
    return _to_half_bits(_half(x) + _half(x >> 16))


@pytest.mark.parametrize("codebook", [0, 1, 2])
def test_codebook_lut_all_states_bit_exact(codebook):
    table = np.array([_independent_value(s, codebook) for s in range(65536)], dtype=np.uint16)
    lut = cbk.lut(codebook)
    assert lut.dtype == np.float16 and lut.shape == (65536,)
    mismatch = np.flatnonzero(lut.view(np.uint16) != table)
    assert mismatch.size == 0, f"states {mismatch[:8]} differ"


def test_codebook_statistics_match_spec():
    rms = [float(np.sqrt(np.mean(cbk.lut(c).astype(np.float64) ** 2))) for c in range(3)]
    assert rms[0] == pytest.approx(1.24371088, abs=2e-6)
    assert rms[1] == pytest.approx(1.2441, abs=1e-4)
    assert rms[2] == pytest.approx(1.0003, abs=1e-4)
    mul1 = cbk.lut(2).astype(np.float64)
    assert mul1.min() == pytest.approx(-3.453, abs=1e-3) and mul1.max() == pytest.approx(3.348, abs=1e-3)
    assert cbk.MUL1_K_INV == 1774 * 2.0**-18 and cbk.MUL1_K_BIAS == -10.3828125


def test_permutation_matches_lane_description():
    r, c = ref.position_rc()
    flat = 16 * r + c
    assert sorted(flat.tolist()) == list(range(256))
    assert flat[:10].tolist() == [0, 16, 128, 144, 8, 24, 136, 152, 32, 48]
    # Independently: lane t holds 8 consecutive positions; m16n8k16 B-fragment style placement.
    for i in range(256):
        lane, p = divmod(i, 8)
        row = (lane % 4) * 2 + (p % 2) + (8 if p in (2, 3, 6, 7) else 0)
        col = lane // 4 + (8 if p >= 4 else 0)
        assert (r[i], c[i]) == (row, col)


def _ring_bits(tile: np.ndarray) -> str:
    """The tile's ring as a '0'/'1' string: u16 pairs -> little-endian u32 words, each MSB first."""
    u16 = struct.unpack(f"<{tile.size}H", tile.astype("<i2").tobytes())
    words = [u16[2 * j] | (u16[2 * j + 1] << 16) for j in range(len(u16) // 2)]
    return "".join(format(w, "032b") for w in words)


@pytest.mark.parametrize(("width", "codebook"), ALL_WIDTHS)
def test_states_against_bit_string_walk(width, codebook):
    rng = np.random.default_rng(width * 7 + codebook)
    tiles = rng.integers(-32768, 32768, size=(3, width), dtype=np.int16)
    states = ref.tile_states(tiles)
    for tile, got in zip(tiles, states, strict=True):
        ring = _ring_bits(tile)
        assert len(ring) == 16 * width
        end = 0
        for i in range(256):
            budget = width // 16 + ((0xAAAA >> (i % 16)) & 1 if width % 16 else 0)
            end += budget
            window = "".join(ring[(end - 16 + q) % len(ring)] for q in range(16))
            assert int(window, 2) == got[i], f"position {i}"
        assert end == len(ring)


@pytest.mark.parametrize("bits", range(1, 9))
def test_tail_biting_and_recurrence(bits):
    rng = np.random.default_rng(bits)
    s = ref.tile_states(rng.integers(-32768, 32768, size=(4, 5, 16 * bits), dtype=np.int16)).astype(np.int64)
    assert ((s[..., 0] >> bits) == (s[..., 255] & ((1 << (16 - bits)) - 1))).all()
    code = s[..., 1:] & ((1 << bits) - 1)
    assert ((((s[..., :-1] << bits) | code) & 0xFFFF) == s[..., 1:]).all()


@pytest.mark.parametrize(("width", "codebook"), [(32, 0), (48, 1), (40, 2), (128, 2)])
def test_decode_rotated_places_every_position(width, codebook):
    rng = np.random.default_rng(width)
    trellis = rng.integers(-32768, 32768, size=(2, 3, width), dtype=np.int16)
    what = ref.decode_rotated(trellis, codebook)
    assert what.shape == (32, 48) and what.dtype == np.float16
    r, c = ref.position_rc()
    for kb in range(2):
        for nb in range(3):
            states = ref.tile_states(trellis[kb, nb])
            for i in range(0, 256, 17):
                want = _independent_value(int(states[i]), codebook)
                assert what[16 * kb + r[i], 16 * nb + c[i]].view(np.uint16) == want


def test_hadamard_is_natural_order_kronecker():
    h2 = np.array([[1.0, 1.0], [1.0, -1.0]])
    h = np.ones((1, 1))
    for _ in range(7):
        h = np.kron(h, h2)
    np.testing.assert_array_equal(hadamard128("float64", normalized=False), h)
    hn = hadamard128("float64")
    np.testing.assert_allclose(hn @ hn, np.eye(128), atol=1e-12)


def _dequant_fp64(trellis, suh, svh, codebook):
    what = ref.decode_rotated(trellis, codebook).astype(np.float64)
    k, n = what.shape
    h = np.ones((1, 1))
    for _ in range(7):
        h = np.kron(h, np.array([[1.0, 1.0], [1.0, -1.0]]))
    hk = np.kron(np.eye(k // 128), h) / np.sqrt(128.0)
    hn = np.kron(np.eye(n // 128), h) / np.sqrt(128.0)
    return suh.astype(np.float64)[:, None] * (hk @ what @ hn) * svh.astype(np.float64)[None, :]


# fp32 reconstruction tolerance: |W32 - W64| <= 1e-6 * max|W64| elementwise (measured ~1.5e-7).
@pytest.mark.parametrize(("width", "codebook"), [(32, 2), (48, 0), (24, 2), (64, 1)])
def test_reconstruction_within_fp32_tolerance(width, codebook):
    rng = np.random.default_rng(100 + width)
    trellis = rng.integers(-32768, 32768, size=(16, 24, width), dtype=np.int16)
    suh = (rng.standard_normal(256) * 0.05).astype(np.float16)
    svh = rng.standard_normal(384).astype(np.float16)
    w32 = ref.dequant(trellis, suh, svh, codebook)
    w64 = _dequant_fp64(trellis, suh, svh, codebook)
    assert w32.dtype == np.float32 and w32.shape == (256, 384)
    assert np.abs(w32 - w64).max() <= 1e-6 * np.abs(w64).max()
    # Streaming in row blocks gives the same bytes as the whole matrix.
    blocks = dict(ref.iter_dequant(trellis, suh, svh, codebook, rows=128))
    np.testing.assert_array_equal(np.concatenate([blocks[0], blocks[128]]), w32)


@pytest.mark.parametrize(("width", "codebook"), [(72, 2), (136, 0), (8, 2), (24, 0), (40, 1), (88, 2)])
def test_widths_refused(width, codebook):
    with pytest.raises(ref.Exl3FormatError):
        ref.check_width(width, codebook)


def test_legacy_sign_words():
    packed = np.array([0b1000000000000101, 0], dtype=np.uint16).view(np.int16)
    signs = ref.signs_from_packed(packed)
    assert signs.shape == (32,)
    assert signs[0] == -1 and signs[1] == 1 and signs[2] == -1 and signs[15] == -1 and (signs[16:] == 1).all()
