"""How much memory the machine has free now, and page-aligned memory for O_DIRECT."""

from __future__ import annotations

import mmap
import threading

import numpy as np

from solar.errors import SolarError

PAGE = 4096  # the alignment O_DIRECT needs of offsets, lengths and memory


def aligned(nbytes: int) -> np.ndarray:
    """Page-aligned private memory of at least one page (an anonymous mmap)."""
    return np.frombuffer(mmap.mmap(-1, max(nbytes, PAGE), flags=mmap.MAP_PRIVATE), np.uint8)


def thread_buffer(local: threading.local, nbytes: int) -> np.ndarray:
    """This thread's page-aligned buffer in ``local``, grown to at least ``nbytes``."""
    buf = getattr(local, "bounce", None)
    if buf is None or buf.size < nbytes:
        buf = local.bounce = aligned(nbytes)
    return buf


def available_memory() -> int | None:
    """MemAvailable from /proc/meminfo, in bytes (None where unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def require_memory(need: int, what: str) -> None:
    """Stop with a message naming ``what`` if ``need`` bytes exceed the memory available now."""
    avail = available_memory()
    if avail is not None and need > avail:
        raise SolarError(
            f"{what}: {need / 2**30:.2f} GiB exceed the {avail / 2**30:.2f} GiB of memory available"
        )
