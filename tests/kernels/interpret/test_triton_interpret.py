"""The interpreter is really on for the Triton tests of this folder, and only for them.

A native launch cannot be what passed there: without a GPU it finds no driver, and with one it refuses the CPU
tensors the tests pass; the last test shows the first on this machine.
"""

from __future__ import annotations

import sys

import pytest

pytest.importorskip("triton")


def _kernels(modules):
    from triton.runtime.jit import KernelInterface

    return {
        f"{mod.__name__}.{name}": obj
        for mod in modules
        for name, obj in vars(mod).items()
        if isinstance(obj, KernelInterface)
    }


def test_the_copy_runs_every_kernel_in_the_interpreter(tk):
    from triton.runtime.interpreter import InterpretedFunction

    kernels = _kernels(vars(tk).values())
    assert len(kernels) >= 10, sorted(kernels)
    native = [name for name, k in kernels.items() if not isinstance(k, InterpretedFunction)]
    assert not native, native
    assert tk.exl3_tl.INTERPRET and not tk.exl3_tl.USE_ASM.value  # the plain-op codebooks, not inline PTX
    import triton  # what a test or Triton itself imports meanwhile is the interpreted copy, tl's helpers too

    assert isinstance(triton.language.standard.zeros, InterpretedFunction)
    assert sys.modules["tfc.kernels.exl3.gemv"] is tk.exl3_gemv


def test_the_process_keeps_its_native_kernels(interpreted):
    """Outside a test that asks for `tk`, sys.modules is the process's own: the other tests (the GPU ones) import
    native triton and native kernels."""
    if interpreted.process_interprets:
        pytest.skip("this pytest process runs with TRITON_INTERPRET set")
    import triton
    from tfc.kernels.exl3 import decode as exl3_decode
    from tfc.kernels.exl3 import gemv as exl3_gemv
    from tfc.kernels.exl3 import moe as moe_exl3
    from tfc.kernels.exl3 import tl as exl3_tl
    from triton.runtime.jit import JITFunction

    assert exl3_gemv is not interpreted.modules["tfc.kernels.exl3.gemv"] and not exl3_tl.INTERPRET
    assert isinstance(triton.language.standard.zeros, JITFunction)
    kernels = _kernels([exl3_decode, exl3_gemv, moe_exl3])
    assert kernels and all(isinstance(k, JITFunction) for k in kernels.values())


def test_a_native_launch_here_fails(interpreted):
    """A decode launched natively: no GPU here, so it must raise; the interpreted copy runs the same call."""
    import torch
    from tfc.kernels.exl3.decode import exl3_decode

    if interpreted.process_interprets:
        pytest.skip("this pytest process runs with TRITON_INTERPRET set")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: native launches are the GPU tests' business")
    tr = torch.ones(8, 16, 16, dtype=torch.int16)
    suh, svh = torch.ones(128, dtype=torch.float16), torch.ones(256, dtype=torch.float16)
    with pytest.raises(RuntimeError):
        exl3_decode(tr, suh, svh, 0)
    with interpreted.active() as copy:
        out = copy.modules["tfc.kernels.exl3.decode"].exl3_decode(tr, suh, svh, 0)
    assert out.shape == (128, 256) and out.isfinite().all()
