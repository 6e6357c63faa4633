"""A minimal io_uring over raw syscalls (ctypes): batches of reads into caller buffers, nothing else.

The stdlib has no io_uring binding and liburing is no Python dependency; reads need only io_uring_setup and
io_uring_enter, the two rings and the entry array mapped, and IORING_OP_READ. A kernel or sandbox that refuses
io_uring_setup (Docker's default seccomp profile, kernel.io_uring_disabled) raises OSError: the caller then
reads with threads. One ring is used by one thread at a time (its owner's lock).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import mmap
import os

SYS_SETUP, SYS_ENTER = 425, 426  # one number on every architecture since Linux 5.1
OFF_SQ_RING, OFF_CQ_RING, OFF_SQES = 0, 0x8000000, 0x10000000
OP_READ = 22  # IORING_OP_READ (Linux 5.6)
ENTER_GETEVENTS = 1
_U32 = 0xFFFFFFFF

u8, u16, u32, u64, i32 = ctypes.c_uint8, ctypes.c_uint16, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int32


class _SqOffsets(ctypes.Structure):
    _fields_ = [
        (n, u32) for n in ("head", "tail", "mask", "entries", "flags", "dropped", "array", "resv")
    ] + [("user_addr", u64)]


class _CqOffsets(ctypes.Structure):
    _fields_ = [
        (n, u32) for n in ("head", "tail", "mask", "entries", "overflow", "cqes", "flags", "resv")
    ] + [("user_addr", u64)]


class _Params(ctypes.Structure):
    _fields_ = [
        *((n, u32) for n in ("sq_entries", "cq_entries", "flags", "sq_thread_cpu", "sq_thread_idle")),
        ("features", u32),
        ("wq_fd", u32),
        ("resv", u32 * 3),
        ("sq_off", _SqOffsets),
        ("cq_off", _CqOffsets),
    ]


class _Sqe(ctypes.Structure):
    _fields_ = [
        ("opcode", u8),
        ("flags", u8),
        ("ioprio", u16),
        ("fd", i32),
        ("off", u64),
        ("addr", u64),
        ("len", u32),
        ("rw_flags", u32),
        ("user_data", u64),
        ("buf_index", u16),
        ("personality", u16),
        ("splice_fd_in", i32),
        ("addr3", u64),
        ("pad", u64),
    ]


class _Cqe(ctypes.Structure):
    _fields_ = [("user_data", u64), ("res", i32), ("flags", u32)]


@functools.cache
def _syscall():
    fn = ctypes.CDLL(None, use_errno=True).syscall
    fn.restype = ctypes.c_long
    return fn


def _call(*args) -> int:
    """A syscall's result; OSError on failure (EINTR retried)."""
    while True:
        r = _syscall()(*args)
        if r >= 0:
            return r
        code = ctypes.get_errno()
        if code != errno.EINTR:
            raise OSError(code, os.strerror(code))


def _address(m: mmap.mmap) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(m))


class Ring:
    """One io_uring of `entries` submission slots; `read` runs a batch of reads to completion."""

    def __init__(self, entries: int = 256) -> None:
        params = _Params()
        self.fd = _call(ctypes.c_long(SYS_SETUP), ctypes.c_uint(entries), ctypes.byref(params))
        try:
            sq_bytes = params.sq_off.array + params.sq_entries * 4
            cq_bytes = params.cq_off.cqes + params.cq_entries * ctypes.sizeof(_Cqe)
            flags, prot = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0), mmap.PROT_READ | mmap.PROT_WRITE
            self._maps = [
                mmap.mmap(self.fd, size, flags, prot, offset=off)
                for size, off in (
                    (sq_bytes, OFF_SQ_RING),
                    (cq_bytes, OFF_CQ_RING),
                    (params.sq_entries * ctypes.sizeof(_Sqe), OFF_SQES),
                )
            ]
        except BaseException:
            os.close(self.fd)
            raise
        sq, cq, sqes = (_address(m) for m in self._maps)
        so, co = params.sq_off, params.cq_off
        self.entries = params.sq_entries
        self._sq_tail = u32.from_address(sq + so.tail)
        self._sq_mask = u32.from_address(sq + so.mask).value
        self._sq_array = (u32 * self.entries).from_address(sq + so.array)
        self._sqes = (_Sqe * self.entries).from_address(sqes)
        self._cq_head = u32.from_address(cq + co.head)
        self._cq_tail = u32.from_address(cq + co.tail)
        self._cq_mask = u32.from_address(cq + co.mask).value
        self._cqes = (_Cqe * params.cq_entries).from_address(cq + co.cqes)

    def read(self, fd: int, requests: list[tuple[int, int, int]]) -> list[int]:
        """Each read's result (bytes read, or -errno) for requests (buffer address, bytes, file offset), at most
        `entries` in flight (the completion ring holds twice that: it never overflows)."""
        results = [0] * len(requests)
        for start in range(0, len(requests), self.entries):
            batch = requests[start : start + self.entries]
            tail = self._sq_tail.value
            for j, (addr, nbytes, offset) in enumerate(batch):
                slot = (tail + j) & self._sq_mask
                sqe = self._sqes[slot]
                ctypes.memset(ctypes.addressof(sqe), 0, ctypes.sizeof(_Sqe))
                sqe.opcode, sqe.fd, sqe.off, sqe.addr = OP_READ, fd, offset, addr
                sqe.len, sqe.user_data = nbytes, start + j
                self._sq_array[slot] = slot
            self._sq_tail.value = (tail + len(batch)) & _U32  # the kernel reads it inside io_uring_enter
            pending, done = len(batch), 0
            while done < len(batch):
                pending -= _call(ctypes.c_long(SYS_ENTER), self.fd, pending, 1, ENTER_GETEVENTS, None, 0)
                head, last = self._cq_head.value, self._cq_tail.value
                while head != last:
                    cqe = self._cqes[head & self._cq_mask]
                    results[cqe.user_data] = cqe.res
                    head = (head + 1) & _U32
                    done += 1
                self._cq_head.value = head
        return results

    def close(self) -> None:
        """Unmap the rings and close the ring's descriptor."""
        for m in self._maps:
            m.close()
        self._maps = []
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
