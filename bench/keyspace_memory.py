"""Peak bytes per access of ``keyspace.key_space`` on its two paths (offset, sort).

    python bench/keyspace_memory.py [--accesses 2000000]

Four parts of random int64 keys, their span 0.5 to 1000 times their count; the peak of
tracemalloc (key_space is numpy alone: every allocation is seen) over the accesses, and the
keys per access. What ``keyspace.OFFSET_BYTES``, ``SORT_BYTES`` and ``KEY_BYTES`` (used by
``plans/plan.py``'s memory estimate) record.
"""

from __future__ import annotations

import argparse
import tracemalloc

import numpy as np

from solar.schedule.draw.keyspace import OFFSET_SPAN, key_space


def main() -> None:
    """Print one line per span: the path taken, keys per access, peak bytes per access."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--accesses", type=int, default=2_000_000)
    total = ap.parse_args().accesses
    rng = np.random.default_rng(0)
    for spread in (0.5, 1, 3, 5.9, 6.1, 20, 1000):
        span = int(spread * total)
        parts = [rng.integers(0, span, total // 4).astype(np.int64) for _ in range(4)]
        tracemalloc.start()
        keys, local = key_space(parts)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        path = "offset" if int(keys[-1] - keys[0]) < OFFSET_SPAN * total and \
            keys.size == keys[-1] - keys[0] + 1 else "sort"  # fmt: skip
        print(f"span/access {spread:7}: {path:6} keys/access {keys.size / total:6.2f} "
              f"peak {peak / total:6.1f} B/access")  # fmt: skip
        del keys, local


if __name__ == "__main__":
    main()
