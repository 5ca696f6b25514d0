"""libc's file calls for the numba kernels that read without the GIL.

Declared to numba by symbol name (``ExternalFunction``), not by address: the JIT links them
against this process's libc when a kernel is compiled or loaded, so kernels calling them are
cached like any other (an address embedded in a kernel would change with every process).
Pointers are passed as integers (``array.ctypes.data``).
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct

from numba import types

_i32, _i64, _ptr, _size = types.int32, types.int64, types.intp, types.uintp


def _function(name: str, restype, *argtypes):
    return types.ExternalFunction(name, restype(*argtypes))


preadv = _function("preadv", types.intp, _i32, _ptr, _i32, _i64)
pwritev = _function("pwritev", types.intp, _i32, _ptr, _i32, _i64)
# ``long syscall(long number, ...)`` with the kernel's six arguments (unused ones ignored):
# for calls libc may not wrap (native AIO, preadv2 before glibc 2.26). The integer arguments
# pass in registers as for a fixed signature. (solar/host/barrier.py declares its own: host
# sits below io.)
syscall = _function("syscall", _i64, _i64, _i64, _i64, _i64, _i64, _i64, _i64)
# preadv2(fd, iov, count, offset low, offset high, flags): -1 where not known (never tried;
# the machine names the kernel's architecture: a 32-bit process numbers calls otherwise).
PREADV2 = {"x86_64": 327, "aarch64": 286}.get(platform.machine(), -1) \
    if struct.calcsize("P") == 8 else -1  # fmt: skip
pread = _function("pread", types.intp, _i32, _ptr, _size, _i64)
fadvise = _function("posix_fadvise", _i32, _i32, _i64, _i64, _i32)
open_file = _function("open", _i32, _ptr, _i32)  # no mode: O_CREAT is never passed
close = _function("close", _i32, _i32)
# statx (glibc >= 2.28): its struct's layout is the same on every architecture, unlike stat's.
statx = _function("statx", _i32, _i32, _ptr, _i32, types.uint32, _ptr)
AT_EMPTY_PATH = 0x1000
STATX_BASIC_STATS = 0x7FF

WILLNEED = getattr(os, "POSIX_FADV_WILLNEED", 3)
# preadv2's flag: from the page cache only, else fail at once (EAGAIN; a miss's fetch is
# started as it fails). A kernel or file system without it fails every such call.
NOWAIT = getattr(os, "RWF_NOWAIT", 8)
O_READ = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)  # as os.open: not inherited

# libc for the calls made from Python (ctypes, errno kept): ``syscall`` returns a long.
CLIB = ctypes.CDLL(None, use_errno=True)
CLIB.syscall.restype = ctypes.c_long
