"""Rows each member of a trainer's plan reads from storage (issue 49's preprocessing workers)
under the default sampler, Shuffle over several trainers with equal batches: before two-pass
planning (the trainer read every step's misses as if alone, each worker every row of its
steps, unplanned) and with it (each member its own buffer's planned misses over the batches
the whole plan decides). Counted from the plans: a member reads exactly its plan's misses
(tests/test_remote.py checks it of real runs), so the counts are exact, not timed.

    python bench/member_reads.py --samples 4096 --ranks 2 --batch 32 --epochs 3 --buffer 410
"""

from __future__ import annotations

import argparse
import json

from solar.config import BufferConfig, RunConfig
from solar.runtime.steps import planned_rows
from solar.schedule.draw.members import TRAINER, owner
from solar.schedule.plans.members import member_spec
from solar.schedule.spec import PlanSpec


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--ranks", type=int, default=2, help="trainers")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--buffer", type=int, default=410, help="samples per rank")
    p.add_argument("--workers", type=int, default=1, help="per trainer")
    p.add_argument("--keep", type=int, default=1, help="steps the trainer keeps per cycle")
    p.add_argument("--unequal", action="store_true", help="batches vary within the slack")
    args = p.parse_args()
    run = RunConfig(args.samples, args.ranks, args.batch, args.epochs)
    spec = PlanSpec(run, BufferConfig(args.buffer), equal_batches=not args.unequal)
    out = []
    for r in range(args.ranks):
        workers = [r * args.workers + i for i in range(args.workers)]
        roster = ((0, tuple(workers)),)
        alone = planned_rows(spec, r, spec)[0]
        row = {"rank": r, "trainer_alone": alone}
        mine = member_spec(spec, r, args.keep, roster, TRAINER)
        assert mine is not None
        row["trainer"] = planned_rows(spec, r, mine)[0]
        for w in workers:
            theirs = member_spec(spec, r, args.keep, roster, w)
            assert theirs is not None
            reads, hits, _ = planned_rows(spec, r, theirs)
            of = tuple(workers)  # (a worker's steps read unplanned: every row of them)
            unplanned = planned_rows(
                spec, r, spec, mine=lambda k, w=w, of=of: owner(k, args.keep, of) == w
            )[2]
            row[f"worker{w}"] = {"unplanned": unplanned, "reads": reads, "hits": hits}
        out.append(row)
        print(json.dumps(row), flush=True)
    before = sum(x["trainer_alone"] for x in out)
    after = sum(x["trainer"] for x in out)
    wb = sum(v["unplanned"] for x in out for k, v in x.items() if k.startswith("worker"))
    wa = sum(v["reads"] for x in out for k, v in x.items() if k.startswith("worker"))
    print(f"rows read over {args.epochs} epochs, {args.ranks} trainers x {args.workers} "
          f"worker(s), keep {args.keep}: trainers {before} before -> {after} with two passes "
          f"({after / before:.2f}x); workers {wb} (unplanned) -> {wa}; all members "
          f"{before + wb} -> {after + wa} (every row served: "
          f"{run.samples_per_epoch * args.epochs})")  # fmt: skip


if __name__ == "__main__":
    main()
