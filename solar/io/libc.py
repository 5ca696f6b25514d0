"""libc's file calls as ctypes functions, for the numba kernels that read without the GIL.

A kernel calling one embeds its address, so such kernels are compiled in each process, never
cached (solar/io/executor.py, solar/io/fused.py).
"""

from __future__ import annotations

import ctypes
import os

_libc = ctypes.CDLL(None, use_errno=True)


def _function(name: str, restype, argtypes: list):
    fn = getattr(_libc, name)
    fn.restype, fn.argtypes = restype, argtypes
    return fn


_int, _i64, _vp = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p
preadv = _function("preadv", ctypes.c_ssize_t, [_int, _vp, _int, _i64])
pwritev = _function("pwritev", ctypes.c_ssize_t, [_int, _vp, _int, _i64])
pread = _function("pread", ctypes.c_ssize_t, [_int, _vp, ctypes.c_size_t, _i64])
fadvise = _function("posix_fadvise", _int, [_int, _i64, _i64, _int])
open_file = _function("open", _int, [_vp, _int])  # no mode: O_CREAT is never passed
close = _function("close", _int, [_int])

WILLNEED = getattr(os, "POSIX_FADV_WILLNEED", 3)
O_READ = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)  # as os.open: not inherited
