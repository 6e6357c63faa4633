"""kernels/step_rows on a CUDA GPU (skipped without one) against step_context's torch code on the CPU: every
integer equal at a decode step's rows and a prefill step's, and the launches replay in a CUDA graph."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu


class _OnCpu:
    """step_context's functions run on CPU copies of their arguments (its torch code: no stage kernel there),
    their results moved back to the GPU."""

    def __getattr__(self, name: str):
        from tfc.runtime.models.dsv41.fast import step_context

        def run(*args):
            out = getattr(step_context, name)(*(a.cpu() if isinstance(a, torch.Tensor) else a for a in args))
            return tuple(o.cuda() for o in out) if isinstance(out, tuple) else out.cuda()

        return run


@pytest.fixture
def torch_code():
    """step_context with its torch code (on the CPU, where no stage kernel runs)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    return _OnCpu()


@pytest.mark.parametrize("rows", [1, 16, 2048])
def test_step_rows_equal_the_torch_code_at_flash(torch_code, rows):
    from tfc.kernels.dsv41 import step_rows

    gen = torch.Generator(device="cuda").manual_seed(rows)
    slots = torch.randint(0, 17, (rows,), device="cuda", generator=gen)
    positions = torch.randint(0, 65536, (rows,), device="cuda", generator=gen)
    positions[0] = 0
    table = torch.randint(1, 4096, (rows, 1024), device="cuda", generator=gen)
    got = step_rows.ring_rows(slots, positions, 128, 160)
    assert all(
        torch.equal(g, w) for g, w in zip(got, torch_code.ring_rows(slots, positions, 128, 160), strict=True)
    )
    for ratio in (1, 4, 128):
        per = max(1, 64 // ratio)
        got = step_rows.ratio_rows(positions, table, ratio, per)
        want = torch_code.ratio_rows(positions, table, ratio, per)
        assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    entry = torch.randint(0, 16384, (rows, 512), device="cuda", generator=gen)
    assert torch.equal(step_rows.page_rows(table, entry, 16), torch_code.page_rows(table, entry, 16))


def test_step_rows_replay_in_a_cuda_graph(torch_code):
    from tfc.kernels.dsv41 import step_rows

    slots = torch.arange(16, device="cuda")
    positions = torch.arange(16, device="cuda") * 1000
    table = torch.randint(1, 4096, (16, 1024), device="cuda")
    entry = torch.randint(0, 16384, (16, 512), device="cuda")

    def step():
        return (*step_rows.ring_rows(slots, positions, 128, 160), *step_rows.ratio_rows(positions, table, 4, 16),
                step_rows.page_rows(table, entry, 16))  # fmt: skip

    eager = step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        held = step()
    positions += 7
    graph.replay()
    torch.cuda.synchronize()
    again = step()
    assert all(torch.equal(a, b) for a, b in zip(held, again, strict=True))
    assert not torch.equal(held[0], eager[0])
