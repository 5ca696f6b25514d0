"""What ``solar warm`` costs, for source trees side by side (e.g. before and after a change):

    git archive BASE | tar -x -C /tmp/base
    flock /tmp/solar-bench.lock python bench/warm_cost.py /tmp/base . [--jobs 2 --rounds 2
        --json OUT]

Each round runs ``solar warm --jobs J`` of every tree in turn (``PYTHONPATH=TREE``), each
into a new empty ``NUMBA_CACHE_DIR``, and reports its wall seconds and the CPU seconds of its
processes (steadier than wall time on a shared machine), the kernel signatures it left in the
cache, and (``--jobs 1``: one process compiles them all) numba's compile seconds and count.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def warm(tree: str, jobs: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="solar-warm-cost-") as cache:
        root = str(Path(tree).resolve())  # (and the working directory: python -m looks there first)
        env = {**os.environ, "PYTHONPATH": root, "NUMBA_CACHE_DIR": cache}
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "solar.cli", "warm", "--jobs", str(jobs)],
                           env=env, cwd=root, capture_output=True, text=True,
                           check=True)  # fmt: skip
        wall = time.perf_counter() - t
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cached = sum(1 for _ in Path(cache).rglob("*.nbc"))
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    # "warm in W s (this process compiled N kernels in S s)"
    said = p.stdout.strip().splitlines()[-1]
    words = said.replace("(", " ").split()
    compiled = int(words[words.index("compiled") + 1])
    seconds = float(words[words.index("kernels") + 2])
    return {"wall_s": wall, "cpu_s": cpu, "signatures_cached": cached,
            "compiled_in_process": compiled, "compile_s_in_process": seconds}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trees", nargs="+")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args()
    out: dict[str, list[dict]] = {t: [] for t in a.trees}
    for r in range(a.rounds):
        for tree in a.trees:
            got = warm(tree, a.jobs)
            out[tree].append(got)
            print(f"round {r}: {tree}: {got['wall_s']:.1f} s wall, {got['cpu_s']:.1f} s CPU, "
                  f"{got['signatures_cached']} signatures cached; this process compiled "
                  f"{got['compiled_in_process']} in {got['compile_s_in_process']:.1f} s",
                  flush=True)  # fmt: skip
    if a.json:
        Path(a.json).write_text(json.dumps({"jobs": a.jobs, "runs": out}, indent=1))


if __name__ == "__main__":
    main()
