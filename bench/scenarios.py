"""The benchmark scenarios of the design notes §5, run with `solar bench`.

    python bench/scenarios.py        # headline: PtychoNN-like, P=4, buffer 50 % and 100 %
    python bench/scenarios.py --all  # presets × aggregate buffer 25/50/100 % × P = 1, 2, 4

Datasets are generated once under --data-dir; results go to bench/results/<scenario>.json and
.png, and a markdown table to bench/results/headline.md (or scenarios.md with --all).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

SOLAR = str(Path(sys.executable).with_name("solar"))
RESULTS = Path(__file__).parent / "results"
SAMPLES = {"ptychonn": 4096, "braggnn": 100_000, "autophasenn": 1024}


def scenarios(all_: bool) -> list[tuple[str, int, int]]:
    if not all_:
        return [("ptychonn", 4, 50), ("ptychonn", 4, 100)]
    return [(p, w, b) for p in SAMPLES for w in (1, 2, 4) for b in (25, 50, 100)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true")
    parser.add_argument("--data-dir", type=Path, default=Path(".bench-data"))
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("extra", nargs="*", help="more `solar bench` options, after --")
    opts = parser.parse_args()
    opts.data_dir.mkdir(parents=True, exist_ok=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    rows = []
    for preset, world, buffer in scenarios(opts.all):
        data = opts.data_dir / f"{preset}-{SAMPLES[preset]}.h5"
        if not data.exists():
            subprocess.run([SOLAR, "gen", data, "--preset", preset, "--samples",
                            str(SAMPLES[preset])], check=True)  # fmt: skip
        name = f"{preset}-P{world}-buffer{buffer}"
        cmd = [SOLAR, "bench", str(data), "-P", str(world), "-E", str(opts.epochs),
               "--buffer", f"{buffer}%", "--json", str(RESULTS / f"{name}.json"),
               "--plot", str(RESULTS / f"{name}.png"), *opts.extra]  # fmt: skip
        print("$", " ".join(cmd[1:]), flush=True)
        subprocess.run(cmd, check=True)
        res = json.loads((RESULTS / f"{name}.json").read_text())
        loaders = res["loaders"]
        others = [
            v["samples_per_second"] for k, v in loaders.items() if k not in ("solar", "torch")
        ]
        solar = loaders["solar"]
        rows.append(
            f"| {preset} | {world} | {buffer} % | {solar['samples_per_second']:.0f} | "
            f"{solar['speedup']:.2f}× | "
            f"{solar['samples_per_second'] / max(others):.2f}× | "
            f"{100 * solar['hit_rate']:.1f} % / {100 * res['bound']:.1f} % | "
            f"{solar['share_of_limit']:.2f} |"
            if others
            else f"| {preset} | {world} | {buffer} % | — |"
        )
    table = [
        "| preset | P | buffer | solar samples/s | vs DataLoader | vs best other policy | "
        "hit rate / bound | epoch time / limit |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
    ]
    (RESULTS / ("scenarios.md" if opts.all else "headline.md")).write_text("\n".join(table) + "\n")
    print("\n".join(table))


if __name__ == "__main__":
    main()
