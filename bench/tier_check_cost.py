"""What a checksum per tier slot would cost (issue 45, 6): a tier file overwritten in place by
a process holding its descriptor would be caught only by a tag of each slot's bytes, written
with the slot and verified on every read. Measured side by side in one process: the tier's
reads (O_DIRECT, random slots, ``--threads`` at a time, as the rank's executor reads them) and
checksums of the same bytes in memory on one thread: zlib.crc32, zlib.adler32, a compiled
4-lane multiply-xor hash of 64-bit words (numba, no new dependency) and xxhash's xxh3 (not a
dependency of solar; for reference, if installed). Prints MB/s of each and each checksum's
cost in % of a tier read of the same bytes.

    python bench/tier_check_cost.py [--dir /tmp] [--mib 512] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from numba import njit

from solar._memory import aligned

_P1, _P2 = np.uint64(0x9E3779B185EBCA87), np.uint64(0xC2B2AE3D27D4EB4F)


@njit(cache=True, nogil=True)
def words_hash(w):  # pragma: no cover - compiled
    """A 4-lane multiply-rotate hash of 64-bit words (xxh64's round): memory speed."""
    a = np.uint64(1)
    b, c, d = np.uint64(2), np.uint64(3), np.uint64(4)
    n = w.shape[0] - w.shape[0] % 4
    for i in range(0, n, 4):
        a = ((a + w[i] * _P2) << np.uint64(31) | (a + w[i] * _P2) >> np.uint64(33)) * _P1
        b = ((b + w[i + 1] * _P2) << np.uint64(31) | (b + w[i + 1] * _P2) >> np.uint64(33)) * _P1
        c = ((c + w[i + 2] * _P2) << np.uint64(31) | (c + w[i + 2] * _P2) >> np.uint64(33)) * _P1
        d = ((d + w[i + 3] * _P2) << np.uint64(31) | (d + w[i + 3] * _P2) >> np.uint64(33)) * _P1
    return a ^ (b * _P1) ^ (c * _P2) ^ d


def read_slots(fd: int, slots: np.ndarray, stride: int, bufs: list, threads: int) -> None:
    """Read ``slots`` (one pread each, O_DIRECT) on ``threads`` threads."""

    def one(j: int) -> None:
        os.preadv(fd, [bufs[j % len(bufs)]], int(slots[j]) * stride)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(len(slots))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="node-local storage")
    ap.add_argument("--mib", type=int, default=512, help="tier file size")
    ap.add_argument("--stride", type=int, default=256 * 1024, help="bytes per tier slot")
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    nbytes = a.mib * 2**20
    nslots = nbytes // a.stride
    fd = os.open(a.dir, os.O_TMPFILE | os.O_RDWR, 0o600)
    try:
        block = np.random.default_rng(0).integers(0, 255, 2**24, np.uint8).tobytes()
        for off in range(0, nbytes, len(block)):
            os.pwrite(fd, block[: nbytes - off], off)
        os.fsync(fd)
        dfd = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_DIRECT)
        bufs = [aligned(a.stride) for _ in range(64)]
        # Bytes not in any CPU cache, as slots just read are: 256 MiB.
        mem = np.tile(np.frombuffer(block, np.uint8), 16)
        words = mem.view(np.uint64)
        words_hash(words)  # compile
        sums = {
            "zlib.crc32": lambda: zlib.crc32(mem),
            "zlib.adler32": lambda: zlib.adler32(mem),
            "numba words_hash": lambda: words_hash(words),
        }
        try:
            import xxhash

            sums["xxhash.xxh3_64 (not a dep)"] = lambda: xxhash.xxh3_64_intdigest(mem)
        except ImportError:
            pass
        rng = np.random.default_rng(1)
        per_mb: dict[str, list[float]] = {k: [] for k in ["tier read", *sums]}
        for _ in range(a.rounds):  # interleaved: the machine's load hits all alike
            slots = rng.permutation(nslots)
            t = time.perf_counter()
            read_slots(dfd, slots, a.stride, bufs, a.threads)
            per_mb["tier read"].append((time.perf_counter() - t) / (nbytes / 1e6))
            for name, f in sums.items():
                t = time.perf_counter()
                f()
                per_mb[name].append((time.perf_counter() - t) / (mem.nbytes / 1e6))
        os.close(dfd)
    finally:
        os.close(fd)
    read = statistics.median(per_mb["tier read"])
    print(f"tier file {a.mib} MiB in {a.dir}, slots of {a.stride} B, {a.threads} read threads, "
          f"median of {a.rounds} rounds")  # fmt: skip
    for name, v in per_mb.items():
        m = statistics.median(v)
        cost = "" if name == "tier read" else f"  {100 * m / read:6.1f} % of a tier read"
        print(f"{name:28s} {m * 1e3:8.3f} ms/MB  {1 / m:8.0f} MB/s{cost}")


if __name__ == "__main__":
    main()
