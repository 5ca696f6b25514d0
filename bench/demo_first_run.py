"""What ``make demo`` compiles after ``solar warm``: the promise is nothing.

    flock /tmp/solar-bench.lock python bench/demo_first_run.py [--json OUT] [--data-dir DIR]

In a new empty ``NUMBA_CACHE_DIR``: ``solar warm --jobs 2`` (timed), then ``solar demo`` (what
``make demo`` runs) in a fresh process that counts numba's compilations (not loads from the
cache) by kernel name. ``--data-dir`` keeps the demo's generated dataset between runs (it is
not what is measured).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Runs the demo, then prints the kernels numba compiled (not loaded from its cache) meanwhile.
DEMO = r"""
import json, sys
from solar.cli import cli
from solar.warm import TALLY

try:
    cli.main(["demo", "--dir", sys.argv[1]], standalone_mode=False)
finally:
    print("COMPILED " + json.dumps(TALLY.names), flush=True)
"""


def demo_compiles(cache: Path, data_dir: Path) -> list[str]:
    """The kernels ``solar demo`` compiles with numba's cache in ``cache``."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache)}
    res = subprocess.run([sys.executable, "-c", DEMO, str(data_dir)], env=env,
                         capture_output=True, text=True, check=True)  # fmt: skip
    line = [x for x in res.stdout.splitlines() if x.startswith("COMPILED ")][-1]
    return json.loads(line.removeprefix("COMPILED "))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--data-dir", type=Path, default=None,
                    help="the demo's directory (its dataset kept between runs)")  # fmt: skip
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="solar-demo-cache-") as tmp:
        cache, data_dir = Path(tmp) / "numba", args.data_dir or Path(tmp) / "demo"
        env = {**os.environ, "NUMBA_CACHE_DIR": str(cache)}
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "solar.cli", "warm", "--jobs", str(args.jobs)],
                       env=env, check=True, capture_output=True)  # fmt: skip
        warm_s = time.perf_counter() - t0
        first = demo_compiles(cache, data_dir)
        second = demo_compiles(cache, data_dir)
    out = {"warm_seconds": round(warm_s, 1), "demo_after_warm": first, "demo_again": second}
    print(f"solar warm --jobs {args.jobs}: {warm_s:.1f} s")
    print(f"solar demo after it compiled {len(first)} kernels: {first}")
    print(f"solar demo again compiled {len(second)} kernels: {second}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
