"""How much memory the machine has free now, and page-aligned memory for O_DIRECT."""

from __future__ import annotations

import mmap
import os
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


CGROUP_FS = "/sys/fs/cgroup"  # where the cgroup hierarchies are mounted
PROC_CGROUP = "/proc/self/cgroup"  # this process's cgroup in each hierarchy
_UNLIMITED = 1 << 60  # v1 writes "no limit" as 2^63 rounded down to a page


def cgroup_room(fs: str | None = None, proc: str | None = None) -> int | None:
    """Bytes this process's memory cgroup, and each one above it, can still take: its limit
    (v2 ``memory.max``, v1 ``memory.limit_in_bytes``) less its usage (``memory.current``,
    ``memory.usage_in_bytes``) not counting the file pages it would reclaim first (page cache
    of the data read: active and inactive file pages). None where no limit applies. ``fs``
    and ``proc`` default to :data:`CGROUP_FS` and :data:`PROC_CGROUP`."""
    fs, proc = fs or CGROUP_FS, proc or PROC_CGROUP
    try:
        with open(proc) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    rooms = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, path = parts
        if hid == "0" and controllers == "":  # v2 (at the root, or under unified/ if hybrid)
            for base in (fs, os.path.join(fs, "unified")):
                rooms += _rooms(base, path, ("memory.max", "memory.current"),
                                ("active_file", "inactive_file"))  # fmt: skip
        elif "memory" in controllers.split(","):  # v1
            for base in {os.path.join(fs, "memory"), os.path.join(fs, controllers)}:
                rooms += _rooms(base, path, ("memory.limit_in_bytes", "memory.usage_in_bytes"),
                                ("total_active_file", "total_inactive_file"))  # fmt: skip
    return min(rooms) if rooms else None


def _rooms(base: str, path: str, files: tuple[str, str], reclaim: tuple[str, ...]) -> list[int]:
    """The room under each limit from ``base/path`` up to ``base`` (a container's own cgroup is
    often mounted as ``base``, whatever ``path`` says)."""
    out = []
    parts = [p for p in path.split("/") if p]
    for depth in range(len(parts), -1, -1):
        d = os.path.join(base, *parts[:depth])
        limit = _number(os.path.join(d, files[0]))
        if limit is None or limit >= _UNLIMITED:
            continue
        used = _number(os.path.join(d, files[1])) or 0
        stat = _stat(os.path.join(d, "memory.stat"))
        used -= min(used, sum(stat.get(k, 0) for k in reclaim))
        out.append(max(0, limit - used))
    return out


def _number(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # v2 "max": no limit


def _stat(path: str) -> dict[str, int]:
    out = {}
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(" ")
                if value.strip().isdigit():
                    out[key] = int(value)
    except OSError:
        pass
    return out


def memory_room() -> tuple[int, str] | None:
    """The memory this process may still take, and whose figure it is: the smaller of the host's
    MemAvailable and its cgroup's room (None where neither is known)."""
    figures = [(x, what) for x, what in ((available_memory(), "available"),
                                         (cgroup_room(), "left under the cgroup's limit"))
               if x is not None]  # fmt: skip
    return min(figures) if figures else None


def require_memory(need: int, what: str, ranks: int = 1) -> None:
    """Stop with a message naming ``what`` if ``need`` bytes exceed the memory available now
    (:func:`memory_room`), shared by the ``ranks`` ranks of this host that each need as much."""
    room = memory_room()
    if room is None or need * max(1, ranks) <= room[0]:
        return
    share, whose = room[0] / max(1, ranks), room[1]
    each = f" (a share of {ranks} ranks on this host)" if ranks > 1 else ""
    raise SolarError(
        f"{what}: {need / 2**30:.2f} GiB exceed the {share / 2**30:.2f} GiB of memory {whose}{each}"
    )
