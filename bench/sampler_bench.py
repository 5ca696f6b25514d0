"""Planner benchmark for a weighted sampler: hits of every policy, the horizon, affinity, speed.

    python bench/sampler_bench.py [--quick] [--json bench/results/sampler.json]

The trace: ``Weighted`` draws with replacement, weights ∝ (1 + i)^-0.6 over a random order of
N samples (N = 10^6; --quick 10^5), B = 64, E = 5, one rank with a 10 % buffer; then P = 4
with the same aggregate buffer. Reported:

1. hits of ``solar`` (default horizon, and full future), ``lru``, ``static``, ``nopfs``;
2. hits against the horizon (epochs of look-ahead);
3. planning speed of ``solar`` (accesses per second; kernels warmed first);
4. at P = 4 (the same aggregate buffer): ``solar`` with affinity (the default: the planner
   splits each global batch's distinct draws, slack 0.25) and without (each rank plans the
   sampler's contiguous share), beside lru and static; storage reads per epoch.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from solar import BufferConfig, PlanSpec, RunConfig, Weighted
from solar._atomic import write_json
from solar.schedule.plans.plan import simulate


def weights(n: int, seed: int = 0) -> np.ndarray:
    w = (1.0 + np.arange(n)) ** -0.6
    np.random.default_rng(seed).shuffle(w)
    return w


def hits(spec: PlanSpec) -> tuple[float, float, int]:
    """(hit rate, seconds, accesses) of ``spec``'s plan."""
    s = simulate(spec)
    return s.hit_rate, s.plan_seconds, s.accesses


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    n = 100_000 if args.quick else 1_000_000
    b, e = 64, 5
    w = weights(n)
    sampler = Weighted(w)  # (each timed plan below draws with a fresh one: no cached epochs)
    # Warm every kernel on a small run first: the timed plans must not time numba's compiler.
    small = Weighted(weights(2000))
    for pol in ("solar", "lru", "static", "nopfs"):
        simulate(PlanSpec(RunConfig(2000, 2, 8, 2), BufferConfig(100, 0.0), pol, sampler=small))
    out: dict = {"num_samples": n, "batch_size": b, "epochs": e, "weights": "(1+i)^-0.6 shuffled"}

    run = RunConfig(n, 1, b, e)
    buf = BufferConfig(n // 10, 0.0)
    rows = {}
    for name, pol, horizon in [
        ("solar", "solar", None), ("solar full future", "solar", e - 1), ("lru", "lru", None),
        ("static", "static", None), ("nopfs", "nopfs", None),
    ]:  # fmt: skip
        rate, secs, acc = hits(PlanSpec(run, buf, pol, sampler=Weighted(w), horizon=horizon))
        rows[name] = {"hit_rate": rate, "seconds": secs, "accesses_per_second": acc / secs}
        print(f"P=1 {name:18s} hit rate {rate:.4f}  planned in {secs:.2f} s "
              f"({acc / secs / 1e6:.2f} M accesses/s)")  # fmt: skip
    s = rows["solar"]["hit_rate"]
    print(f"solar / lru {s / rows['lru']['hit_rate']:.2f}x, solar / static "
          f"{s / rows['static']['hit_rate']:.2f}x, default horizon / full future "
          f"{s / rows['solar full future']['hit_rate']:.4f}")  # fmt: skip
    out["P1"] = rows

    out["horizon"] = {}
    for h in (0, 1, 2, e - 1):
        rate, _, _ = hits(PlanSpec(run, buf, "solar", sampler=sampler, horizon=h))
        out["horizon"][h] = rate
        print(f"horizon {h} epochs: hit rate {rate:.4f}")

    world = 4
    run4 = RunConfig(n, world, b // world, e)
    c4 = n // 10 // world
    rows4 = {}
    for name, pol, smp, slack in [
        ("solar (affinity)", "solar", sampler, 0.25),
        ("solar (sampler's split)", "solar", Weighted(w, affinity=False), 0.0),
        ("lru", "lru", sampler, 0.0),
        ("static", "static", sampler, 0.0),
    ]:  # fmt: skip
        summary = simulate(PlanSpec(run4, BufferConfig(c4, slack), pol, sampler=smp))
        reads = (summary.accesses - summary.hits) / e
        batches = (
            f"{min(s.min_batch for s in summary.stats)}-{max(s.max_batch for s in summary.stats)}"
        )
        rows4[name] = {"hit_rate": summary.hit_rate, "reads_per_epoch": reads,
                       "accesses": summary.accesses, "local_batches": batches}  # fmt: skip
        print(f"P=4 {name:24s} hit rate {summary.hit_rate:.4f}, reads/epoch {reads:.0f}, "
              f"local batches (distinct ids) {batches}")  # fmt: skip
    out["P4"] = rows4
    if args.json:
        write_json(args.json, out)
    else:
        print(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
