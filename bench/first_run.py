"""What a first run costs: a Loader's construction and epochs with an empty numba cache, then
again with the cache it filled, each in a fresh process (as a user's first and second job).

    python bench/first_run.py DATA [--epochs 3] [--world 1] [--one-per-file] [--no-warm]
        [--json OUT]

Each epoch starts with the data's pages evicted (cold storage in both runs). Prints, per run:
construction seconds (torch's import included), of which warming (compile/load kernels) and numba's
compile seconds, each epoch's seconds, and how many kernels compiled or loaded during the
epochs (0: none landed in an epoch). Compare "fresh" with "warm": the target is epoch 0 of
the fresh run within 1.3x of the warm run's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
from solar import ExpertConfig, Loader, ReaderConfig
from solar.io.pagecache import evict
from solar.warm import TALLY, signatures
data, epochs, world, warm = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
one = sys.argv[5] == "1"
t1 = time.perf_counter()
ld = Loader(data, batch_size=16, epochs=epochs, buffer=128, rank=0, world_size=world,
            reader=ReaderConfig(one_per_file=one), expert=ExpertConfig(warm=warm))
t2 = time.perf_counter()
before, compiled = signatures(), TALLY.count
out = {"import_s": t1 - t0, "construct_s": t2 - t1, "warm_s": ld.stats.warm_seconds,
       "compile_s": ld.stats.compile_seconds, "compiled": ld.stats.compiled, "epochs_s": []}
for e in range(epochs):
    ld.set_epoch(e)
    evict(ld.info.all_files)  # cold, every epoch, in both runs: only compilation may differ
    t = time.perf_counter()
    for _ in ld:
        pass
    out["epochs_s"].append(time.perf_counter() - t)
after = signatures()
out["compiled_in_epochs"] = TALLY.count - compiled
out["new_signatures_in_epochs"] = {k: after[k] - before.get(k, 0) for k in after
                                   if after[k] != before.get(k, 0)}
ld.close()
print(json.dumps(out))
"""


def run(data: str, cache: str, epochs: int, world: int, warm: bool, one: bool) -> dict:
    env = {**os.environ, "NUMBA_CACHE_DIR": cache}
    p = subprocess.run([sys.executable, "-c", CHILD, data, str(epochs), str(world),
                        "1" if warm else "0", "1" if one else "0"], env=env,
                       capture_output=True, text=True, check=True)  # fmt: skip
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument(
        "--no-warm",
        action="store_true",
        help="Loader(expert=ExpertConfig(warm=False)): the old way",
    )
    ap.add_argument("--one-per-file", action="store_true", help="DATA: one-sample files")
    ap.add_argument("--json")
    opts = ap.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="numba-cache-") as cache:
        for name in ("fresh", "warm"):
            r = run(opts.data, cache, opts.epochs, opts.world, not opts.no_warm, opts.one_per_file)
            results[name] = r
            epochs = " ".join(f"{t:.2f}" for t in r["epochs_s"])
            print(f"{name:>5}: construct {r['construct_s']:.2f} s (warming {r['warm_s']:.2f} s, "
                  f"numba compiling {r['compile_s']:.2f} s, {r['compiled']} kernels); epochs "
                  f"{epochs} s; kernels compiled in epochs {r['compiled_in_epochs']}, "
                  f"new signatures {sum(r['new_signatures_in_epochs'].values())}")  # fmt: skip
    ratio = results["fresh"]["epochs_s"][0] / results["warm"]["epochs_s"][0]
    print(f"epoch 0, fresh / warm: {ratio:.2f}")
    results["epoch0_ratio"] = ratio
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
