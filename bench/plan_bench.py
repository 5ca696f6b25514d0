"""Planner benchmark: speed and memory at scale, hit rates of every policy beside the bound.

    python bench/plan_bench.py [--quick] [--json bench/results/plan.json]

1. Scale: `solar plan --samples 1000000 -P 8 -B 64 -E 20 -C 12500` in a fresh process pinned
   to one core, once with an empty numba cache (start-up + JIT, as a first run) and once warm;
   wall time, peak RSS of the whole process and plan file size, per access.
2. Kernel throughput: the `solar` policy alone on a precomputed access sequence, in process.
3. Hit rates at N=20000, P=8, B=32, E=6, C=500 for every policy and slack, with the bound
   min(P·C, N)·(E−1)/(N·E); a slack sweep; the gain of epoch reordering.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from solar import BufferConfig, PlanSpec, RunConfig, make_plan
from solar._atomic import write_json
from solar.schedule import POLICIES
from solar.schedule.draw.order import access_sequence
from solar.schedule.keep.policies import get_policy

SCALE = ["--samples", "1000000", "-P", "8", "-B", "64", "-E", "20", "-C", "12500"]
QUICK_SCALE = ["--samples", "100000", "-P", "8", "-B", "64", "-E", "5", "-C", "1250"]


def scale_run(args: list[str], cold: bool, tmp: Path) -> dict:
    """One `solar plan` in a child process on one core; its wall time and peak RSS."""
    env = dict(os.environ)
    if cold:
        env["NUMBA_CACHE_DIR"] = str(tmp / "numba-cold")  # empty: compile everything
    out = tmp / "scale.plan.h5"
    exe = str(Path(sys.executable).with_name("solar"))
    cmd = [exe, "plan", *args, "-o", str(out), "--json"]
    if shutil.which("taskset"):
        cmd = ["taskset", "-c", "0", *cmd]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env)
    stdout = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if status != 0:
        raise SystemExit(f"solar plan failed: {cmd}")
    summary = json.loads(stdout)
    accesses = summary["accesses"]
    return {
        "cold_jit": cold,
        "accesses": accesses,
        "wall_seconds": wall,
        "plan_seconds": summary["plan_seconds"],
        # `solar plan` compiles (or loads) the planner's kernels on a tiny copy first: not
        # in plan_seconds, but in the wall time.
        "warm_seconds": summary.get("warm_seconds", 0.0),
        "compile_seconds": summary.get("compile_seconds", 0.0),
        "accesses_per_second": accesses / summary["plan_seconds"],
        "peak_rss_bytes_per_access": usage.ru_maxrss * 1024 / accesses,
        "file_bytes_per_access": summary["bytes_per_access"],
        "hit_rate": summary["hit_rate"],
        "bound": summary["bound"],
    }


def kernel_throughput(run: RunConfig, capacity: int) -> dict:
    seq = access_sequence(run)
    policy = get_policy("solar")
    policy(RunConfig(1000, 8, 4, 2), BufferConfig(10), access_sequence(RunConfig(1000, 8, 4, 2)))
    t0 = time.perf_counter()
    policy(run, BufferConfig(capacity), seq)
    seconds = time.perf_counter() - t0
    return {"accesses": seq.size, "seconds": seconds, "accesses_per_second": seq.size / seconds}


def hit_rates(run: RunConfig, capacity: int) -> list[dict]:
    rows = []

    def row(policy: str, slack: float, reorder: bool = False) -> None:
        plan = make_plan(PlanSpec(run, BufferConfig(capacity, slack), policy, reorder))
        rows.append(
            {
                "policy": policy,
                "slack": slack,
                "reorder_epochs": reorder,
                "hit_rate": plan.hit_rate,
                "bound": plan.bound,
                "share_of_bound": plan.hit_rate / plan.bound,
                "max_local_batch": max(s.max_batch for s in plan.stats),
                "plan_seconds": plan.plan_seconds,
            }
        )

    for policy in POLICIES:
        for slack in (0.0, 0.25):
            row(policy, slack)
    for slack in (0.1, 0.5, 1.0):
        row("solar", slack)
    for policy in ("solar", "solar-artifact"):
        row(policy, 0.25, reorder=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller scale case")
    parser.add_argument("--json", type=Path, help="also write the results here")
    opts = parser.parse_args()
    scale = QUICK_SCALE if opts.quick else SCALE
    results: dict = {"scale_args": " ".join(scale)}
    with tempfile.TemporaryDirectory() as tmp:
        results["scale"] = [scale_run(scale, cold, Path(tmp)) for cold in (True, False)]
    results["kernel"] = kernel_throughput(
        RunConfig(1_000_000, 8, 64, 20 if not opts.quick else 5), 12_500
    )
    ref = RunConfig(20_000, 8, 32, 6, seed=0)
    results["hit_rates"] = hit_rates(ref, 500)

    print(f"## Scale: solar plan {results['scale_args']} (one core)\n")
    print(
        "| JIT | wall s | warm-up s (compiling) | plan s | accesses/s | RSS B/access | "
        "file B/access | hit rate / bound |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for s in results["scale"]:
        print(
            f"| {'cold' if s['cold_jit'] else 'cached'} | {s['wall_seconds']:.2f} | "
            f"{s['warm_seconds']:.2f} ({s['compile_seconds']:.2f}) | {s['plan_seconds']:.2f} | "
            f"{s['accesses_per_second'] / 1e6:.1f} M | "
            f"{s['peak_rss_bytes_per_access']:.1f} | {s['file_bytes_per_access']:.2f} | "
            f"{100 * s['hit_rate']:.2f} % / {100 * s['bound']:.2f} % |"
        )
    k = results["kernel"]
    print(
        f"\nsolar policy kernel alone: {k['accesses']} accesses in {k['seconds']:.2f} s = "
        f"{k['accesses_per_second'] / 1e6:.1f} M accesses/s\n"
    )
    print("## Hit rates: N=20000, P=8, B=32, E=6, C=500 per rank (bound 16.67 %)\n")
    print("| policy | slack | reorder | hit rate | % of bound | max local batch |")
    print("|---|---|---|---|---|---|")
    for r in results["hit_rates"]:
        print(
            f"| {r['policy']} | {r['slack']} | {'yes' if r['reorder_epochs'] else 'no'} | "
            f"{100 * r['hit_rate']:.2f} % | {100 * r['share_of_bound']:.1f} % | "
            f"{r['max_local_batch']} |"
        )
    if opts.json:
        write_json(opts.json, results)


if __name__ == "__main__":
    main()
