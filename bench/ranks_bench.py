"""Planner speed as the world grows: make_plan's accesses/s and hit rate per world size P.

    python bench/ranks_bench.py [--worlds 8,64,256,1024,4096] [--repeat 2] [--no-pin]
                                [--json bench/results/ranks.json]

N=10^6 samples, B=32, E=4, default slack, an aggregate buffer of 20 % of N (C = 0.2·N/P per
rank). Each P is planned ``--repeat`` times in one warm process (numba cache loaded by a tiny
plan first), pinned to one core with ``taskset -c 0`` when it exists; the best time counts.
Wall time suffers from other processes on a shared machine, so CPU time is reported too.
Only the public API is used (make_plan, hit_rate, bound), so the same script measures any
version of the planner.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from solar._atomic import write_json

N, B, E = 1_000_000, 32, 4
BUFFER_SHARE = 0.2  # aggregate buffer as a share of N
WORLDS = (8, 64, 256, 1024, 4096)


def measure(world: int, repeat: int) -> dict:
    """Plan one world size; the best of ``repeat`` wall and CPU times."""
    from solar import BufferConfig, PlanSpec, RunConfig, make_plan

    run = RunConfig(N, world, B, E)
    buffer = BufferConfig(int(BUFFER_SHARE * N / world))
    spec = PlanSpec(run, buffer)
    wall, cpu = [], []
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        plan = make_plan(spec)
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    return {
        "world_size": world,
        "capacity": buffer.capacity,
        "steps": run.num_steps,
        "accesses": run.num_accesses,
        "wall_seconds": min(wall),
        "cpu_seconds": min(cpu),
        "accesses_per_second": run.num_accesses / min(wall),
        "accesses_per_cpu_second": run.num_accesses / min(cpu),
        "hit_rate": plan.hit_rate,
        "bound": plan.bound,
        "share_of_bound": plan.hit_rate / plan.bound,
    }


def child(worlds: list[int], repeat: int) -> list[dict]:
    """Every measurement, in this process: warm the numba cache once, then each P in turn."""
    from solar import BufferConfig, PlanSpec, RunConfig, make_plan

    make_plan(PlanSpec(RunConfig(2000, 4, 8, 2), BufferConfig(10)))  # same dtypes as below
    return [measure(p, repeat) for p in worlds]


def table(rows: list[dict]) -> str:
    base = next((r for r in rows if r["world_size"] == 8), rows[0])
    lines = [
        f"N={N}, B={B}, E={E}, aggregate buffer {BUFFER_SHARE:.0%} of N, default slack; "
        "rates are the best of the repeats\n",
        "| P | C | steps | wall s | M acc/s (wall) | M acc/s (CPU) "
        f"| vs P={base['world_size']} (CPU) | hit rate | bound | % of bound |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['world_size']} | {r['capacity']} | {r['steps']} | {r['wall_seconds']:.2f} | "
            f"{r['accesses_per_second'] / 1e6:.2f} | {r['accesses_per_cpu_second'] / 1e6:.2f} | "
            f"{100 * r['accesses_per_cpu_second'] / base['accesses_per_cpu_second']:.0f} % | "
            f"{100 * r['hit_rate']:.2f} % | "
            f"{100 * r['bound']:.2f} % | {100 * r['share_of_bound']:.1f} % |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", default=",".join(map(str, WORLDS)))
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--no-pin", action="store_true", help="measure in this process")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    worlds = [int(p) for p in opts.worlds.split(",")]
    if opts.child:
        print(json.dumps(child(worlds, opts.repeat)))
        return
    pinned = not opts.no_pin and shutil.which("taskset") is not None
    if pinned:
        # A child on one core: the planner is single-threaded, and this keeps the scheduler
        # from moving it between cores mid-measurement.
        cmd = ["taskset", "-c", "0", sys.executable, __file__, "--child"]
        cmd += ["--worlds", opts.worlds, "--repeat", str(opts.repeat)]
        out = subprocess.run(cmd, stdout=subprocess.PIPE, check=True, env=dict(os.environ))
        rows = json.loads(out.stdout)
    else:
        rows = child(worlds, opts.repeat)
    print(table(rows))
    if opts.json:
        results = {
            "config": {"num_samples": N, "batch_size": B, "epochs": E,
                       "buffer_share": BUFFER_SHARE, "pinned": pinned, "repeat": opts.repeat},
            "rows": rows,
        }  # fmt: skip
        write_json(opts.json, results)


if __name__ == "__main__":
    main()
