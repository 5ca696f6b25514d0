"""What the identity checks (solar/io/identity.py) and the tier's size checks cost per step,
measured in one process with the checks on and off, interleaved (issue 33, causes 3 and 4).

    python bench/identity_cost.py [--rounds 7] [--json bench/results/identity_cost.json]

Warm page cache on purpose: the checks are CPU (an fstat per descriptor use, a statx per file
opened in the compiled loop), so storage time would only hide them. Steps of 64 random samples:
``buffered`` (one contiguous file: preadv runs), ``cached files`` (200 one-sample files,
descriptors cached), ``streamed files`` (2,000 one-sample files, more than a descriptor cache
of 64: opened per read, checked by statx in the compiled loop), and ``tier`` (64 random slots
of a buffered tier file). "off" replaces the checks by no-ops (the statx in the compiled loop
cannot be switched off: for it, compare with the commit before, bench/tier_slots_bench.py and
bench/perfile_bench.py). Prints the median µs per step and the cost in %.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from concurrent.futures import wait
from pathlib import Path

import h5py
import numpy as np

from solar._atomic import write_json
from solar.cache.tier import TierFile
from solar.config import ReaderConfig
from solar.io import handles
from solar.io.executor import Executor, _same_files
from solar.io.hdf5 import describe
from solar.io.identity import Identities
from solar.io.info import KeyInfo
from solar.io.reader import Reader

STEP = 64


@contextlib.contextmanager
def checks_off():
    """The Python-side checks as no-ops: identity on open and after use, tier size."""
    saved = (Identities.check, TierFile.check_size)
    Identities.check = lambda self, i, st: None  # type: ignore[method-assign]
    TierFile.check_size = lambda self: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        Identities.check, TierFile.check_size = saved  # type: ignore[method-assign]


def timed(step, steps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t0) / steps * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--json")
    opts = ap.parse_args()
    rng = np.random.default_rng(0)
    cases = {}
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        d = Path(tmp)
        one = d / "one.h5"
        with h5py.File(one, "w") as f:
            f["x"] = rng.standard_normal((20_000, 256), np.float32)
        for name, n in (("cached", 200), ("streamed", 2000)):
            (d / name).mkdir()
            for i in range(n):
                with h5py.File(d / name / f"{i:05d}.h5", "w") as f:
                    f["x"] = np.full(256, i, np.float32)
        readers = {
            "buffered": Reader(describe([one]), ReaderConfig(threads=2)),
            "cached files": Reader(
                describe(sorted((d / "cached").glob("*.h5")), one_per_file=True),
                ReaderConfig(threads=2),
            ),
        }
        real = handles.fd_capacity
        handles.fd_capacity = lambda: 64  # type: ignore[assignment]
        streamed = Reader(describe(sorted((d / "streamed").glob("*.h5")), one_per_file=True),
                          ReaderConfig(threads=2))  # fmt: skip
        readers["streamed files"] = streamed
        assert streamed.files.streams
        handles.fd_capacity = real  # type: ignore[assignment]
        out = [np.empty((STEP, 256), np.float32)]
        for name, r in readers.items():
            n = int(r._starts[-1])
            cases[name] = lambda r=r, n=n: r.read(rng.integers(0, n, STEP), out)
        ex = Executor(2)
        keys = (KeyInfo("x", (256,), np.dtype(np.float32)),)
        tier = TierFile(d, slots=4096, keys=keys, name="cost", executor=ex, direct_io=False)
        src = [rng.standard_normal((4096, 256), np.float32)]
        wait(tier.submit_write(np.arange(4096), src, np.arange(4096)))
        tier.wait_writes()

        def tier_step() -> None:
            for f in tier.submit_read(rng.integers(0, 4096, STEP), out, np.arange(STEP)):
                f.result()

        cases["tier"] = tier_step
        # Warm: compiled, opened, every page in the page cache (the tier's writes drop theirs).
        everything = [np.empty((4096, 256), np.float32)]
        wait(tier.submit_read(np.arange(4096), everything, np.arange(4096)))
        for r in readers.values():
            n = int(r._starts[-1])
            r.read(np.arange(n), [np.empty((n, 256), np.float32)])
        for step in cases.values():
            timed(step, 20)
        results = {name: {"on": [], "off": []} for name in cases}
        for k in range(opts.rounds):
            for name, step in cases.items():
                for mode in ("on", "off") if k % 2 else ("off", "on"):  # either order
                    with checks_off() if mode == "off" else contextlib.nullcontext():
                        results[name][mode].append(timed(step, opts.steps))
        # The compiled check (statx) of 64 cached descriptors: what "off" keeps.
        files = readers["cached files"].files
        held = list(range(STEP))
        fds = np.array(files.fds.acquire(held), np.int64)
        idx = np.array(held, np.int64)
        t0 = time.perf_counter()
        for _ in range(2000):
            _same_files(fds, idx, files.identities.table)
        statx_us = (time.perf_counter() - t0) / 2000 * 1e6
        files.fds.release(held)
        print(f"compiled identity check (statx) of {STEP} descriptors: {statx_us:.1f} µs")
        report: dict = {"statx_check_us_per_64": round(statx_us, 1)}
        for name, r in results.items():
            on, off = statistics.median(r["on"]), statistics.median(r["off"])
            report[name] = {"us_per_step_on": round(on, 1), "us_per_step_off": round(off, 1),
                            "cost_percent": round(100 * (on / off - 1), 2)}  # fmt: skip
            print(f"{name}: {on:.1f} µs per step of {STEP} with the checks, {off:.1f} without: "
                  f"{100 * (on / off - 1):+.2f} %", flush=True)  # fmt: skip
        tier.close()
        ex.close()
        for r in readers.values():
            r.close()
    if opts.json:
        write_json(opts.json, report)


if __name__ == "__main__":
    main()
