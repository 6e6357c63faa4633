"""The one-launch run copy (the host-tier restore's) against its torch reference, interpreted: bit for bit.

Runs of random lengths (zero, shorter than a block, several blocks, long enough to take several programs) at
random offsets, in 4-, 2- and 1-byte words, the last runs read from the aux buffer; every word outside the
runs must keep its value.
"""

from __future__ import annotations

import pytest


def _case(seed: int, dtype, n_runs: int):
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    lengths = rng.choice([0, 1, 7, 1023, 1024, 1025, 5000, 9000], size=n_runs)
    src_at = np.concatenate([[0], np.cumsum(lengths + rng.integers(0, 9, n_runs))[:-1]])
    order = rng.permutation(n_runs)  # destinations laid out in another order than the sources
    dst_at = np.zeros(n_runs, np.int64)
    dst_at[order] = 3 + np.concatenate([[0], np.cumsum(lengths[order] + rng.integers(0, 9, n_runs))[:-1]])
    runs = torch.from_numpy(np.stack([src_at, dst_at, lengths, np.zeros(n_runs)]).astype(np.int64))
    src = torch.from_numpy(rng.integers(-99, 99, int(src_at[-1] + lengths[-1] + 5))).to(dtype)
    dst = torch.from_numpy(rng.integers(-99, 99, int(dst_at.max() + lengths.max() + 7))).to(dtype)
    return src, dst, runs, int(lengths.max())


@pytest.mark.parametrize(
    ("seed", "dtype", "n_runs"), [(0, "int32", 12), (1, "int16", 5), (2, "uint8", 9), (3, "int32", 1)]
)
def test_run_copy_kernel_equals_the_reference(tk, seed, dtype, n_runs):
    import torch

    src, dst, runs, longest = _case(seed, getattr(torch, dtype), n_runs)
    want, got = dst.clone(), dst.clone()
    tk.run_copy.copy_runs_reference(src, want, runs)
    tk.run_copy.copy_runs_triton(src, got, runs, longest)
    assert torch.equal(got, want)
    s, d, n, _ = runs.tolist()
    assert all(torch.equal(want[b : b + k], src[a : a + k]) for a, b, k in zip(s, d, n, strict=True))
    touched = torch.zeros(len(dst), dtype=torch.bool)
    for b, k in zip(d, n, strict=True):
        touched[b : b + k] = True
    assert torch.equal(want[~touched], dst[~touched])


def test_run_copy_refuses_mixed_words(tk):
    import torch

    with pytest.raises(ValueError, match="one 1-, 2- or 4-byte word"):
        tk.run_copy.copy_runs_reference(torch.zeros(4, dtype=torch.int32), torch.zeros(4, dtype=torch.int16),
                                        torch.zeros(4, 1, dtype=torch.int64))  # fmt: skip


def test_runs_past_n_main_read_the_aux_buffer(tk):
    import torch

    src, dst, runs, longest = _case(4, torch.int32, 6)
    aux = torch.arange(5000, 5000 + int(runs[0].max() + runs[2].max()) + 5, dtype=torch.int32)
    want, got = dst.clone(), dst.clone()
    tk.run_copy.copy_runs_reference(src, want, runs, aux, n_main=4)
    tk.run_copy.copy_runs_triton(src, got, runs, longest, aux, n_main=4)
    assert torch.equal(got, want)
    for i, (a, b, k, _) in enumerate(zip(*runs.tolist(), strict=True)):
        assert torch.equal(want[b : b + k], (src if i < 4 else aux)[a : a + k]), i


@pytest.mark.parametrize(("seed", "dtype"), [(5, "int32"), (6, "uint8")])
def test_paged_runs_land_in_their_pages(tk, seed, dtype):
    # a paged run (page words p) writes its chunk c at destination + pages[c] * p: a source's entries into a
    # slot's pages in any order, the last page partly; a plain run and an aux run beside it
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    p, n = 96, 96 * 5 + 17  # words a page, words of the paged run (six pages, the last one partial)
    pages = torch.from_numpy(rng.permutation(12)[:6]).to(torch.int64)
    src = torch.from_numpy(rng.integers(-99, 99, 2000)).to(getattr(torch, dtype))
    dst = torch.from_numpy(rng.integers(-99, 99, 64 + 12 * p + 300)).to(src.dtype)
    aux = torch.arange(40, dtype=src.dtype)
    runs = torch.tensor([[3, 700, 5], [64, 64 + 12 * p + 10, 0], [n, 200, 30], [p, 0, 0]], dtype=torch.int64)
    want, got = dst.clone(), dst.clone()
    tk.run_copy.copy_runs_reference(src, want, runs, aux, n_main=2, pages=pages)
    tk.run_copy.copy_runs_triton(src, got, runs, n, aux, n_main=2, pages=pages)
    assert torch.equal(got, want)
    for c, page in enumerate(pages.tolist()):
        k = min(p, n - c * p)
        at = 64 + page * p
        assert torch.equal(want[at : at + k], src[3 + c * p : 3 + c * p + k]), c
    assert torch.equal(want[64 + 12 * p + 10 :][:200], src[700:900])
    assert torch.equal(want[:30], aux[5:35])
    free = sorted(set(range(12)) - set(pages.tolist()))
    assert all(
        torch.equal(want[64 + q * p : 64 + (q + 1) * p], dst[64 + q * p : 64 + (q + 1) * p]) for q in free
    )
