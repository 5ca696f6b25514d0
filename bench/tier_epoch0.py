"""Does writing the second tier slow the first epoch? One rank, emulated remote storage.

    python bench/tier_epoch0.py [--data .bench-data/ptychonn-4096.h5] [--tier /tmp/nvme]

Loaders without and with a tier (all samples), alternated twice; each epoch 0 starts with the
file's pages evicted. Prints epoch time, stall, and the tier's staging wait and writes.
"""

from __future__ import annotations

import argparse
import time

from solar import Loader
from solar.io.pagecache import evict
from solar.io.throttle import Throttle
from solar.options import ExpertConfig, MemoryConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", default=".bench-data/ptychonn-4096.h5")
    parser.add_argument("--tier", default="/tmp/nvme")
    parser.add_argument("--throttle", default="200,1")
    opts = parser.parse_args()
    for tier in (None, opts.tier, None, opts.tier):
        # Every sample (capped at N).
        memory = MemoryConfig(tier=tier, tier_size=10**9) if tier else None
        ld = Loader(opts.data, batch_size=32, epochs=3, buffer=410, memory=memory,
                    expert=ExpertConfig(throttle=Throttle.parse(opts.throttle)))  # fmt: skip
        evict([opts.data])
        ld.set_epoch(0)
        t0 = time.perf_counter()
        for _ in ld:
            pass
        seconds = time.perf_counter() - t0
        st = ld.stats.epochs[0]
        wait = ld.tier.write_wait_seconds if ld.tier else 0.0
        print(f"tier={tier}: epoch 0 {seconds:.2f} s, stall {st.stall_seconds:.2f} s, "
              f"staging wait {wait:.2f} s, tier writes {st.tier_writes}", flush=True)  # fmt: skip
        ld.close()


if __name__ == "__main__":
    main()
