"""The tier's cost per epoch, its writes (epoch 0) and its reads (later epochs): what the
unlinked tier file and its size checks around every task cost (issue 33, cause 4).

    python bench/tier_slots_bench.py [--samples 4096] [--tier /tmp/nvme] [--dir DIR]

One rank, a RAM buffer of 1/16 of the samples and a tier holding them all (O_DIRECT where
the file system takes it), so that epochs 1-2 are served mostly by tier reads; the data's pages
are evicted before every epoch. Prints seconds per epoch and the tier's bytes; compare two
checkouts side by side with PYTHONPATH (the file and dataset are the same for both).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from solar import Loader
from solar.io.generate import generate
from solar.io.pagecache import evict
from solar.options import MemoryConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--preset", default="ptychonn")
    parser.add_argument("--tier", default="/tmp/nvme")
    parser.add_argument("--dir", type=Path, default=None, help="where the dataset is (kept)")
    parser.add_argument("--repeats", type=int, default=2)
    opts = parser.parse_args()
    Path(opts.tier).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        where = opts.dir or Path(tmp)
        path = where / f"{opts.preset}-{opts.samples}.h5"
        if not path.exists():
            generate(path, opts.preset, opts.samples)
        rows = []
        for _ in range(opts.repeats):
            ld = Loader(path, batch_size=32, epochs=3, buffer=opts.samples // 16,
                        memory=MemoryConfig(tier=opts.tier, tier_size=opts.samples))  # fmt: skip
            seconds = []
            for e in range(3):
                evict([path])
                ld.set_epoch(e)
                t0 = time.perf_counter()
                for _ in ld:
                    pass
                seconds.append(round(time.perf_counter() - t0, 3))
            tier_bytes = sum(s.tier_bytes for s in ld.stats.epochs.values())
            ld.close()
            rows.append({"epoch_seconds": seconds, "tier_bytes": tier_bytes})
            print(json.dumps(rows[-1]), flush=True)


if __name__ == "__main__":
    main()
