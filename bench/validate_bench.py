"""What it costs to prove an untrusted plan file safe, beside the time to plan the same run.

    python bench/validate_bench.py [--quick] [--json bench/results/validate.json]

Plans N=10^6, P=8, B=64, E=20, C=12500 per rank (2·10^7 accesses) in this process (numba
warmed up first), saves the plan, then times what a Loader does with a plan file for one rank:
read its arrays and checksum them, then ``validate_rank`` (ranges, the seed's permutation of
every epoch, a replay proving every hit). Every rank does this for itself, in parallel.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from solar import BufferConfig, PlanSpec, RunConfig, load_plan, make_plan
from solar._atomic import write_json
from solar.schedule.plans.validate import validate_rank


def measure(run: RunConfig, capacity: int) -> dict:
    spec = PlanSpec(run, BufferConfig(capacity))
    small = PlanSpec(RunConfig(1000, 8, 4, 2), BufferConfig(10))
    with tempfile.TemporaryDirectory() as tmp:
        warm = make_plan(small).save(Path(tmp) / "warm.h5")
        load_plan(warm).rank(0)  # compile every kernel outside the timings
        plan = make_plan(spec)
        path = plan.save(Path(tmp) / "run.plan.h5")
        loaded = load_plan(path)
        t0 = time.perf_counter()
        # What each rank does under a communicator: read, checksum and validate its own part
        # epoch by epoch (then one allgather of E digests).
        loaded._validated([0], key=1, keep=False)
        rank_seconds = time.perf_counter() - t0
        rp = plan.rank(0)
        t0 = time.perf_counter()
        validate_rank(rp, run, loaded.epoch_order, key=1)
        validate_seconds = time.perf_counter() - t0
        t0 = time.perf_counter()
        loaded.validate(0)  # no communicator: this process checks every rank's part
        alone_seconds = time.perf_counter() - t0
    return {
        "accesses": run.num_accesses,
        "rank_accesses": int(rp.sample.size),
        "plan_seconds": plan.plan_seconds,
        "load_and_validate_rank_seconds": rank_seconds,
        "validate_rank_seconds": validate_seconds,
        "share_of_planning": rank_seconds / plan.plan_seconds,
        "validate_all_ranks_without_comm_seconds": alone_seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N=10^5, E=5")
    parser.add_argument("--json", type=Path, help="also write the results here")
    opts = parser.parse_args()
    run = RunConfig(100_000, 8, 64, 5) if opts.quick else RunConfig(1_000_000, 8, 64, 20)
    r = measure(run, 1250 if opts.quick else 12_500)
    print(
        f"N={run.num_samples} P={run.world_size} B={run.batch_size} E={run.epochs}: "
        f"plan {r['plan_seconds']:.2f} s for {r['accesses']} accesses; one rank's "
        f"{r['rank_accesses']} accesses: read+checksum+validate "
        f"{r['load_and_validate_rank_seconds']:.2f} s (validation alone "
        f"{r['validate_rank_seconds']:.2f} s) = {100 * r['share_of_planning']:.0f} % of planning; "
        f"without a communicator one process checks all ranks: "
        f"{r['validate_all_ranks_without_comm_seconds']:.2f} s"
    )
    if opts.json:
        write_json(opts.json, r)


if __name__ == "__main__":
    main()
