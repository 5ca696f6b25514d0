"""How much memory the machine has free now."""

from __future__ import annotations


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
