"""Triton kernels compiled for an H100 / H200 (sm_90) on a machine without a GPU: every launch inside
`compile_only()` compiles (ptxas included, inline PTX checked) and returns without running. The interpreter runs
a kernel's logic but not its compilation: a construct it accepts can still fail to compile (a loop-carried
variable changing type, a list held in a variable), and PTX it cannot run at all."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager


class _Sm90:
    """The parts of Triton's driver a compile-only launch asks for."""

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", 90, 32)

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device=None) -> int:
        return 0


@contextmanager
def compile_only() -> Iterator[list]:
    """Inside: launches compile for sm_90 and run nothing; yields the (kernel name, compiled kernel) list."""
    import triton.runtime.jit as jit
    from triton.runtime import driver

    run, active, compiled = jit.JITFunction.run, driver._active, []

    def compile_run(self, *args, grid, warmup, **kwargs):
        kernel = run(self, *args, grid=grid, warmup=True, **kwargs)
        compiled.append((self.fn.__name__, kernel))
        return kernel

    driver.set_active(_Sm90())
    jit.JITFunction.run = compile_run
    try:
        yield compiled
    finally:
        jit.JITFunction.run = run
        driver._active = active


def resources(kernel) -> dict[str, int]:
    """REG, STACK, LOCAL, SHARED of a compiled kernel's cubin (cuobjdump --dump-resource-usage)."""
    import triton.backends.nvidia as nv

    tool = os.path.join(os.path.dirname(nv.__file__), "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        out = subprocess.run(
            [tool, "--dump-resource-usage", f.name], capture_output=True, text=True, check=True
        )
    fields = [w.split(":") for line in out.stdout.splitlines() if "REG:" in line for w in line.split()]
    return {k: int(v) for k, v in (f for f in fields if len(f) == 2 and f[1].isdigit())}
