"""The fast forward's KV memory on the CPU: row formats against the reference quantisers, bytes per token, paging.

Row formats must reproduce the reference's fake quantisers bit for bit (the fast forward reads back exactly
what the reference attends to); the layout's byte counts are the formats' own (no padding); pages are shared,
handed out lowest first, given back on release, and nothing on the device moves when slots come and go.
"""

from __future__ import annotations

import pytest
import torch
from tfc.fixtures.flash_headers import flash_config
from tfc.fixtures.tiny import tiny_config
from tfc.packs.deepseek_v41_config import config_from_dict as pack_config
from tfc.runtime.models.dsv41.config import config_from_dict
from tfc.runtime.models.dsv41.fast.kv.layout import kv_layout
from tfc.runtime.models.dsv41.fast.kv.memory import KvMemory
from tfc.runtime.models.dsv41.fast.kv.pages import KvFull, PagePool
from tfc.runtime.models.dsv41.fast.kv.rows import (
    Fp4Grid,
    fake_fp4,
    pack_fp4,
    pack_fp8,
    unpack_fp4,
    unpack_fp8,
)
from tfc.runtime.models.dsv41.reference.quant import fake_quant_fp4, fake_quant_fp8

GRID = Fp4Grid.on(torch.device("cpu"))


def _config(raw):
    return config_from_dict(raw, pack_config(raw).layer_mode_records())


def _values(scale: float, n: int) -> torch.Tensor:
    """Random rows with the awkward cases in: zeros, exact grid ties, tiny and huge blocks, negative zeros."""
    x = torch.randn(48, n, generator=torch.Generator().manual_seed(int(scale * 1000) + n)) * scale
    x[0, :32] = 0.0
    x[1, :32] = -0.0
    x[2, :16] = 1.25  # halfway between e2m1 1.0 and 1.5 once scaled: ties to the even code
    x[3, :32] = torch.linspace(-6, 6, 32)
    x[4, :32] = 1e-30
    x[5, :32] = 3e4
    return x


@pytest.mark.parametrize("scale", [1e-3, 0.7, 9.0, 300.0])
def test_row_formats_equal_the_reference_quantisers_bit_for_bit(scale):
    x = _values(scale, 512)
    rows = pack_fp8(x)
    assert rows.dtype == torch.uint8 and rows.shape == (48, 528)
    assert torch.equal(unpack_fp8(rows, 512).view(torch.int32), fake_quant_fp8(x, 32).view(torch.int32))
    entry = pack_fp4(x, 16, True, GRID)
    assert entry.shape == (48, 288)
    want = fake_quant_fp4(x, 16, e4m3_scale=True)
    assert torch.equal(unpack_fp4(entry, 512, 16, True, GRID), want)
    key = pack_fp4(x[:, :128], 32, False, GRID)
    assert key.shape == (48, 68)
    assert torch.equal(unpack_fp4(key, 128, 32, False, GRID), fake_quant_fp4(x[:, :128], 32))
    assert torch.equal(fake_fp4(x[:, :128], 32, GRID), fake_quant_fp4(x[:, :128], 32))


def test_an_entry_scale_past_e4m3s_range_saturates_on_every_torch():
    """amax / 6 over 448: the scale byte is 448's (0x7E) and the values finite, not torch <= 2.11's NaN cast."""
    x = torch.randn(4, 512, generator=torch.Generator().manual_seed(7)) * 2.0**14
    x[0, :16] = 3e5  # amax / 6 = 5e4
    scales = pack_fp4(x, 16, True, GRID)[:, 256:]
    assert int(scales[0, 0]) == 0x7E and bool((scales != 0x7F).all())
    assert bool(fake_quant_fp4(x, 16, e4m3_scale=True).isfinite().all())
    assert torch.equal(
        unpack_fp4(pack_fp4(x, 16, True, GRID), 512, 16, True, GRID), fake_quant_fp4(x, 16, True)
    )


def test_flash_bytes_per_token_are_the_formats_own():
    layout = kv_layout(_config(flash_config()), 16)
    assert (layout.window_row.nbytes, layout.entry_row.nbytes, layout.key_row.nbytes) == (528, 288, 68)
    assert [(s.layer, s.ratio) for s in layout.sources] == [(2, 2), (8, 2), (14, 2), (20, 1)]
    # 3 sources at ratio 2 and one at ratio 1: 2.5 entries a token, each an entry row and an index key row
    assert layout.bytes_per_token == 2.5 * (288 + 68) == 890
    # window rings: 40 layers x (128 + 16) rows; the ratio-2 compressor rings: fp32 kv and gate rows
    assert layout.bytes_per_slot == 40 * 144 * 528 + 3 * 2 * 18 * 512 * 4
    # against TensorFold's FP8 rows (584 B entries, 132 B keys: 1,790 B a token) the model's FP4 rows take half
    assert layout.bytes_per_token / (2.5 * (584 + 132)) == pytest.approx(0.497, abs=1e-3)


def test_page_pool_shares_pages_lowest_first_and_takes_them_back():
    pool = PagePool(pages=6, page_tokens=256, slots=3, tokens_per_slot=1024)
    assert pool.ensure(0, 1) and pool.table(0) == [1]
    assert not pool.ensure(0, 256)  # still the first page
    assert pool.ensure(1, 600) and pool.table(1) == [2, 3, 4]
    assert pool.ensure(0, 257) and pool.table(0) == [1, 5]
    with pytest.raises(KvFull, match="1 of 6 are free"):
        pool.ensure(2, 600)
    with pytest.raises(KvFull, match="1024 tokens a slot may hold"):
        pool.ensure(2, 1025)
    pool.release(1)
    assert pool.free_pages == 4 and pool.table(1) == []
    assert pool.ensure(2, 700) and pool.table(2) == [2, 3, 4]  # the lowest free pages again
    pool.release(1)  # an empty slot: a no-op
    assert pool.free_pages == 1
    assert pool.truncate(0, 256) and pool.table(0) == [1] and pool.free_pages == 2  # a rollback's page back
    assert not pool.truncate(0, 200) and pool.table(0) == [1]


def test_kv_memory_is_allocated_once_and_slots_reuse_it_in_place():
    cfg = config_from_dict(tiny_config(), pack_config(tiny_config()).layer_mode_records())
    layout = kv_layout(cfg, 16, page_tokens=64)
    kv = KvMemory(
        layout, slots=3, tokens=512, tokens_per_slot=256, table_tokens=512, device=torch.device("cpu")
    )
    addresses = [t.data_ptr() for t in kv.tensors]
    assert kv.window.shape == (8, 4, 32 + 16, 132) and kv.dummy_slot == 3
    assert sorted(kv.entries) == [2, 4] and sorted(kv.keys) == [2, 4] and sorted(kv.pending) == [2]
    assert kv.entries[2].shape == (9 * 32, 72) and kv.entries[4].shape == (9 * 64, 72)  # 8 pages + scratch
    assert kv.page_table.shape == (4, 8)
    kv.ensure(1, 130)
    assert kv.page_table[1].tolist() == [1, 2, 3, 0, 0, 0, 0, 0]
    kv.release(1)
    assert kv.page_table[1].tolist() == [0] * 8 and kv.pool.free_pages == 8
    kv.ensure(2, 64)
    assert kv.page_table[2, 0] == 1
    assert [t.data_ptr() for t in kv.tensors] == addresses
    assert kv.nbytes == sum(t.numel() * t.element_size() for t in kv.tensors)
