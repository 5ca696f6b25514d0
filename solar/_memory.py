"""How much memory the machine has free now."""

from __future__ import annotations

from solar.errors import SolarError


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
