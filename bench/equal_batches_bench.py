"""Equal local batches at the hit bound: `solar plan` with slack and variable batches, with
slack 0 (equal batches by serving only the share), and with slack and equal batches (rows
handed between ranks), side by side.

    PYTHONPATH=. python bench/equal_batches_bench.py [--json bench/results/equal-batches-plan.json]

N=10^5, P=8, B=32, E=5, aggregate buffers 10/50/100 % of N, PtychoNN-like samples (288 KiB);
with and without --drop-last (with it every local batch is exactly B; without, the short last
step is split evenly). Per row: hits as a share of the bound, the delivered local batches
(min-max over ranks and steps), and the rows (bytes) moved between ranks per epoch, also as a
share of the epoch's samples.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

N, P, B, E = 100_000, 8, 32, 5
SAMPLE_BYTES = 256 * 1024 + 2 * 16 * 1024  # PtychoNN-like: diffraction, amplitude, phase
VARIANTS = {
    "slack 0.25, variable": ["--slack", "0.25", "--variable-batches"],
    "slack 0": ["--slack", "0", "--variable-batches"],
    "slack 0.25, equal batches (the default)": ["--slack", "0.25"],
}


def plan(share: float, extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "solar.cli", "plan", "--samples", str(N), "--sample-bytes",
           str(SAMPLE_BYTES), "-P", str(P), "-B", str(B), "-E", str(E), "-C",
           str(round(share * N / P)), "--json", *extra]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", help="write the rows here")
    opts = parser.parse_args()
    rows = []
    print("| buffer | drop_last | plan | hits / bound | local batches | moved / epoch | share |")
    print("|---|---|---|---|---|---|---|")
    for drop in (False, True):
        for share in (0.1, 0.5, 1.0):
            for name, extra in VARIANTS.items():
                s = plan(share, extra + (["--drop-last"] if drop else []))
                low = min(r["min_batch"] for r in s["ranks"])
                high = max(r["max_batch"] for r in s["ranks"])
                row = {
                    "buffer": share, "drop_last": drop, "plan": name,
                    "of_bound": s["hit_rate"] / s["bound"], "min_batch": low, "max_batch": high,
                    "rows_moved_per_epoch": s.get("rows_moved_per_epoch", 0.0),
                    "bytes_moved_per_epoch": s.get("bytes_moved_per_epoch", 0.0),
                    "moved_share": s.get("moved_share", 0.0),
                }  # fmt: skip
                rows.append(row)
                print(f"| {share:.0%} | {drop} | {name} | {100 * row['of_bound']:.2f} % | "
                      f"{low}-{high} | {row['rows_moved_per_epoch']:.0f} rows, "
                      f"{row['bytes_moved_per_epoch'] / 2**30:.2f} GiB | "
                      f"{100 * row['moved_share']:.2f} % |", flush=True)  # fmt: skip
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
