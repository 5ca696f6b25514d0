"""The codec libraries: imagecodecs' functions, and the C functions of the libraries it links.

imagecodecs (a default dependency) wraps libdeflate, zstd, lz4, liblzf, c-blosc, bitshuffle and
HDF5's fletcher32, and releases the GIL while it works. Its extension modules also export the
libraries' own C functions, which numba kernels call without Python between chunks or blocks
(solar/io/bitshuffle.py, solar/io/fused.py); such a kernel embeds the functions' addresses, so
it is compiled in each process, never cached.
"""

from __future__ import annotations

import ctypes
import importlib
from typing import Any

try:  # without it only shuffle-only pipelines decode outside h5py
    import imagecodecs as _imagecodecs
except ImportError:  # pragma: no cover - exercised only on a partial install
    _imagecodecs = None  # type: ignore[assignment]

# imagecodecs' stubs accept only bytes, bytearray and mmap, but its functions take any buffer
# (memoryview, ndarray), which is what lets chunks decode without copies: call it untyped.
imagecodecs: Any = _imagecodecs


def c_function(module: str, symbol: str, restype, argtypes):
    """A C function of the library an imagecodecs extension links, or None if not exported."""
    try:
        lib = ctypes.CDLL(importlib.import_module(f"imagecodecs.{module}").__file__)
        fn = getattr(lib, symbol)
    except (ImportError, OSError, AttributeError):
        return None
    fn.restype, fn.argtypes = restype, argtypes
    return fn
