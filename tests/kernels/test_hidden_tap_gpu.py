"""kernels/hidden_tap on a CUDA GPU (skipped without one) against torch's float64 mean on the same GPU: bit for
bit into a strided slice of the hidden rows, and inside a CUDA graph."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize(("rows", "s"), [(1, 4), (16, 4), (16, 3)])
def test_the_tap_is_torchs_mean_on_the_gpu(rows, s):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from tfc.kernels.dsv41.hidden_tap import stream_mean_into

    gen = torch.Generator(device="cuda").manual_seed(rows)
    streams = torch.randn(rows, s, 5120, device="cuda", generator=gen)
    streams *= torch.exp2(torch.randint(-60, 60, streams.shape, device="cuda", generator=gen))
    hidden = torch.zeros(rows, 3 * 5120, device="cuda")
    want = streams.to(torch.float64).mean(-2).to(torch.float32)
    stream_mean_into(streams, hidden[:, 5120:10240])
    assert torch.equal(hidden[:, 5120:10240], want)
    hidden.zero_()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        stream_mean_into(streams, hidden[:, 5120:10240])
    streams.mul_(2.0)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(hidden[:, 5120:10240], want * 2.0)
