"""The codec libraries: imagecodecs' functions, and the C functions of the libraries it links.

imagecodecs (a default dependency) wraps libdeflate, zstd, lz4, liblzf, c-blosc, bitshuffle and
HDF5's fletcher32, and releases the GIL while it works. Its extension modules also export the
libraries' own C functions, which numba kernels call without Python between chunks or blocks
(solar/io/bitshuffle.py, solar/io/fused.py). The kernels declare them by name and
:func:`link_codec_libraries` makes them visible to numba's linker, so the kernels are cached
like any other (an embedded address would change with every process: compiled in each).
"""

from __future__ import annotations

import ctypes
import functools
import importlib
from typing import Any

try:  # without it only shuffle-only pipelines decode outside h5py
    import imagecodecs as _imagecodecs
except ImportError:  # pragma: no cover - exercised only on a partial install
    _imagecodecs = None  # type: ignore[assignment]

# imagecodecs' stubs accept only bytes, bytearray and mmap, but its functions take any buffer
# (memoryview, ndarray), which is what lets chunks decode without copies: call it untyped.
imagecodecs: Any = _imagecodecs


def external(symbol: str, restype: Any, *argtypes: Any) -> Any:
    """A C function declared to numba by name (``types.ExternalFunction``), for cached kernels
    (its library made visible by :func:`link_codec_libraries`)."""
    from numba import types

    return types.ExternalFunction(symbol, restype(*argtypes))


def link_codec_libraries(symbols: dict[str, list[str]]) -> bool:
    """Make the C functions ``symbols`` names (by imagecodecs extension module) visible to
    numba's linker, for kernels that declare them by name (``types.ExternalFunction``) and so
    are cached; False if any module or function is missing (the kernel is then not used)."""
    for module, names in symbols.items():
        try:
            path = importlib.import_module(f"imagecodecs.{module}").__file__
            lib = ctypes.CDLL(path)
            if path is None or not all(hasattr(lib, n) for n in names):
                return False
        except (ImportError, OSError):
            return False
        _load_permanently(path)
    return True


@functools.cache
def _load_permanently(path: str) -> None:
    import llvmlite.binding as llvm

    llvm.load_library_permanently(path)
