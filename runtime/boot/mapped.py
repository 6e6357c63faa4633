"""Page-locked host memory as the GPU addresses it: a CUDA tensor over the device pointer of a mapped host
range, so a kernel reads host-tier segments (cold expert tables) over PCIe through the same code as arena
segments."""

from __future__ import annotations

import ctypes
from typing import Any

from tfc.errors import TfcError

REGISTER_MAPPED = 0x02  # cudaHostRegisterMapped: the range gets a device pointer


class HostMappingError(TfcError):
    """Host memory the GPU was to read in place could not be mapped into its address space."""


class _DeviceRange:
    """A device address range in the CUDA array interface (torch.as_tensor aliases it, no copy)."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (ptr, False),
            "version": 3,
            "strides": None,
        }


def device_pointer(host_ptr: int) -> int:
    """The device address of a page-locked, mapped host address (cuMemHostGetDevicePointer)."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise HostMappingError(f"the CUDA driver (libcuda.so.1) cannot be loaded: {e}") from None
    out = ctypes.c_uint64(0)
    err = driver.cuMemHostGetDevicePointer_v2(ctypes.byref(out), ctypes.c_void_p(host_ptr), ctypes.c_uint(0))
    if err != 0:
        raise HostMappingError(
            f"cuMemHostGetDevicePointer failed with CUDA error {err} for mapped host memory"
        )
    return out.value


def device_alias(host: Any, device: str) -> Any:
    """A uint8 CUDA tensor on `device` over a page-locked, mapped host uint8 tensor's bytes (reads cross
    PCIe)."""
    import torch

    dev = torch.device(device)
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    with torch.cuda.device(dev):
        pointer = device_pointer(host.data_ptr())
        alias = torch.as_tensor(_DeviceRange(pointer, host.numel()), device=dev)
        probe = min(host.numel(), 4096)
        # the same address (torch made no device copy), and the host's bytes read through it
        if alias.data_ptr() != pointer or not torch.equal(alias[:probe].cpu(), host[:probe]):
            raise HostMappingError(f"mapped host memory does not read back through {dev}'s address space")
    return alias


__all__ = ["REGISTER_MAPPED", "HostMappingError", "device_alias", "device_pointer"]
