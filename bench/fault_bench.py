"""Seeded faults at the executor's calls over whole epochs, many seeds (issue 33).

    python bench/fault_bench.py [--seeds 50] [--rate 0.03] [--json bench/results/faults.json]

Every mode of tests/faults.py (buffered, O_DIRECT, one sample per file beyond the descriptor
cache, a tier) under seeds 0..N-1: each run must serve exactly h5py's bytes or stop in one
line naming the fault it injected, and leave no descriptor, child process, /dev/shm name or
tier file. Prints per mode the runs, faults injected by kind, outcomes and leftovers; exits 1
if any run broke the rule (the test suite runs a few of these seeds: tests/test_faults.py).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/faults.py

from solar._atomic import write_json
from tests import faults


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--rate", type=float, default=0.03)
    parser.add_argument("--modes", default=",".join(faults.MODES))
    parser.add_argument("--json", default=None)
    opts = parser.parse_args()
    report: dict = {"seeds": opts.seeds, "rate": opts.rate, "modes": {}}
    bad = 0
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        for mode in opts.modes.split(","):
            originals = faults.make_data(Path(tmp) / "orig" / mode, mode)
            injected: Counter[str] = Counter()
            outcomes: Counter[str] = Counter()
            left: Counter[str] = Counter()
            t0 = time.perf_counter()
            for seed in range(opts.seeds):
                try:
                    o = faults.run(seed, mode, originals, Path(tmp) / "run", rate=opts.rate)
                except AssertionError as exc:  # wrong bytes served
                    outcomes["WRONG BYTES"] += 1
                    print(f"{mode} seed {seed}: {exc}", flush=True)
                    bad += 1
                    continue
                injected.update(o.injected)
                left.update({k: v for k, v in o.leftovers.items() if v})
                kind = "exact" if o.stopped is None else (
                    "stop: I/O error" if "Input/output error" in o.stopped
                    else "stop: changed" if "changed since it was opened" in o.stopped
                    else "stop: other")  # fmt: skip
                outcomes[kind] += 1
                if not o.ok:
                    bad += 1
                    print(f"{mode} seed {seed}: BROKE THE RULE {o}", flush=True)
            seconds = round(time.perf_counter() - t0, 1)
            row = {"runs": opts.seeds, "injected": dict(injected), "outcomes": dict(outcomes),
                   "leftovers": dict(left), "seconds": seconds}  # fmt: skip
            report["modes"][mode] = row
            print(f"{mode}: {row}", flush=True)
    report["broke_the_rule"] = bad
    print(f"runs that broke the rule: {bad}")
    if opts.json:
        write_json(opts.json, report)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
