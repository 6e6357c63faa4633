"""kernels/hidden_tap interpreted against torch's float64 mean: bit for bit into a strided slice of the hidden rows,
at 4 streams (a factor of 1/4) and 3 (1/3 rounded), values whose float64 sum depends on the order, a row alone
as among others."""

from __future__ import annotations

import pytest
import torch


def _want(streams):
    return streams.to(torch.float64).mean(-2).to(torch.float32)


@pytest.mark.parametrize(("rows", "s", "d"), [(1, 4, 5120), (16, 4, 1000), (5, 3, 64)])
def test_the_tap_is_torchs_mean_bit_for_bit(tk, rows, s, d):
    gen = torch.Generator().manual_seed(rows * s)
    streams = torch.randn(rows, s, d, generator=gen) * torch.exp2(
        torch.randint(-60, 60, (rows, s, d), generator=gen)
    )
    streams[0, :, 0] = torch.tensor(
        [1.0, 2.0**-40, -1.0, 2.0**-70, 3.0][:s]
    )  # an order-dependent float64 sum
    hidden = torch.full((rows, 3 * d), float("nan"))
    tk.hidden_tap.stream_mean_into(streams, hidden[:, d : 2 * d])
    assert torch.equal(hidden[:, d : 2 * d], _want(streams))
    assert hidden[:, :d].isnan().all() and hidden[:, 2 * d :].isnan().all()
    alone = torch.empty(1, d)
    tk.hidden_tap.stream_mean_into(streams[-1:], alone)
    assert torch.equal(alone, hidden[-1:, d : 2 * d])


def test_the_tap_refuses_a_wrong_out(tk):
    with pytest.raises(ValueError, match="is not"):
        tk.hidden_tap.stream_mean_into(torch.zeros(2, 4, 8), torch.zeros(2, 9))
