"""Planning cost at many ranks: ``solar plan --samples 1000000 -B 32 -E 4 -C 20%`` at P=8 and
P=1024, equal and variable batches, run in turn (P=8, P=1024, P=8, ...) as whole processes, so
that a shared machine's drift hits both alike; per pair the ratio P=1024 / P=8 of the planning
time (``plan_seconds``: the planner alone) and of the process's wall time, min and median,
and each run's hit rate against its bound. ``--file``: each run writes its plan file (``-o``),
whose per-rank checksums with equal batches each cover every rank's counts (P^2 bytes an
epoch, solar/schedule/plans/planfile.py).

    PYTHONPATH=. python bench/plan_ratio.py [--rounds 7] [--file] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ARGS = ["plan", "--samples", "1000000", "-B", "32", "-E", "4", "-C", "20%", "--json"]
MODES = ("--equal-batches", "--variable-batches")
WORLDS = (8, 1024)


def run_once(world: int, mode: str, out_file: Path | None = None) -> dict:
    """One ``solar plan`` process (writing ``out_file`` if given): its planning and wall
    seconds, hit rate and bound."""
    exe = Path(sys.executable).with_name("solar")
    extra = [] if out_file is None else ["-o", str(out_file), "--force"]
    t = time.perf_counter()
    out = subprocess.run([str(exe), *ARGS, "-P", str(world), mode, *extra], check=True,
                         capture_output=True, text=True).stdout  # fmt: skip
    wall = time.perf_counter() - t
    s = json.loads(out)
    return {"plan_seconds": s["plan_seconds"], "wall_seconds": wall, "hit_rate": s["hit_rate"],
            "bound": s["bound"]}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--file", action="store_true", help="write each run's plan file (-o)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out_file = Path(tmp) / "plan.h5" if a.file else None
        for mode in MODES:  # a warm-up of each: numba's cache loaded, files in the page cache
            run_once(WORLDS[0], mode, out_file)
        runs: dict[str, dict[int, list[dict]]] = {m: {w: [] for w in WORLDS} for m in MODES}
        for _ in range(a.rounds):
            for mode in MODES:
                for w in WORLDS:
                    runs[mode][w].append(run_once(w, mode, out_file))
    command = "solar " + " ".join(ARGS) + (" -o PLAN" if a.file else "")
    out = {"command": command, "rounds": a.rounds, "modes": {}}
    for mode in MODES:
        small, large = runs[mode][WORLDS[0]], runs[mode][WORLDS[1]]
        fig: dict = {}
        for key in ("plan_seconds", "wall_seconds"):
            ratios = [y[key] / x[key] for x, y in zip(small, large, strict=True)]
            fig[key] = {f"P={w} median": statistics.median(r[key] for r in runs[mode][w])
                        for w in WORLDS}  # fmt: skip
            fig[key].update(ratio_min=min(ratios), ratio_median=statistics.median(ratios))
        fig["of_bound"] = {f"P={w}": runs[mode][w][0]["hit_rate"] / runs[mode][w][0]["bound"]
                           for w in WORLDS}  # fmt: skip
        out["modes"][mode] = fig
        p, wl = fig["plan_seconds"], fig["wall_seconds"]
        print(f"{mode}: plan {p['P=8 median']:.3f} s (P=8) vs {p['P=1024 median']:.3f} s "
              f"(P=1024): ratio min {p['ratio_min']:.2f} median {p['ratio_median']:.2f}; wall "
              f"ratio min {wl['ratio_min']:.2f} median {wl['ratio_median']:.2f}; hit rate of "
              f"bound {fig['of_bound']['P=8']:.4f} / {fig['of_bound']['P=1024']:.4f}")  # fmt: skip
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
