"""`solar bench`'s epoch time limit against the epochs it bounds, with the spread over runs.

    python bench/limit_bench.py [--repeats 5] [--only ptychonn-P1-b25,...] [--json OUT]

The limit (``solar.bench.limit_terms``: the largest of storage reads over the measured read
bandwidth, RAM hits' copies, tier reads and compute) should stay below each run's measured
epoch time. Both are wall-clock measurements on a shared virtual disk, so whether it does is
reported here, not decided in a test (tests/test_bench_limit.py checks the formula and the
terms, and failed at random while it compared the two, issue 37).

Every scenario of the test, as small: each preset of bench/scenarios.py × aggregate buffer
25/50/100 % on one rank; PtychoNN-like on two ranks (buffer 50 %; buffer 25 % with a tier of
50 %); PtychoNN-like on one rank with a tier. Each runs ``--repeats`` times (`solar bench
--loaders solar -E 2`, files evicted before every epoch). Per scenario: the run's epoch time
over its limit (both summed over the run; at least 1 when the limit is below the epochs) as
median, min and max over the runs; the smallest per-epoch ratio; how many runs kept the limit
below their epochs within the old test's margin (limit ≤ 1.25 × epochs); and which term set
each epoch's limit.

    flock /tmp/solar-bench.lock .venv/bin/python bench/limit_bench.py \
        --json bench/results/limit.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from solar._atomic import write_json
from solar.io.generate import generate

SOLAR = str(Path(sys.executable).with_name("solar"))
SMALL = {"ptychonn": 96, "braggnn": 1500, "autophasenn": 40}  # a few tens of MB at most
MARGIN = 1.25  # the margin tests/test_bench_limit.py allowed the limit over the epochs


def _scenario(preset: str, world: int, buffer: int, tier: int = 0) -> dict:
    # Batches of 16 on one rank, 8 on two: the test's shapes.
    return {"preset": preset, "world": world, "buffer": buffer, "tier": tier,
            "batch": 16 if world == 1 else 8}  # fmt: skip


def scenarios() -> dict[str, dict]:
    """Name → preset, ranks, buffer %, tier % and batch size: the test's scenarios."""
    out = {f"{p}-P1-b{b}": _scenario(p, 1, b) for p in SMALL for b in (25, 50, 100)}
    out["ptychonn-P2-b50"] = _scenario("ptychonn", 2, 50)
    out["ptychonn-P2-b25-tier50"] = _scenario("ptychonn", 2, 25, tier=50)
    out["ptychonn-P1-b25-tier50"] = _scenario("ptychonn", 1, 25, tier=50)
    return out


def run_once(data: Path, s: dict, tmp: Path) -> dict:
    """One `solar bench` run of scenario ``s``: its JSON result."""
    out = tmp / "r.json"
    cmd = [SOLAR, "bench", str(data), "-P", str(s["world"]), "-E", "2", "-B", str(s["batch"]),
           "--buffer", f"{s['buffer']}%", "--loaders", "solar", "--workers", "0",
           "--json", str(out)]  # fmt: skip
    if s["tier"]:
        tier = tmp / "tier"
        tier.mkdir(exist_ok=True)
        cmd += ["--tier", str(tier), "--tier-size", f"{s['tier']}%"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.read_text())


def spread(values: list[float]) -> dict[str, float]:
    """Median, min and max."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarise(runs: list[dict]) -> dict:
    """Scenario figures over its runs (each a `solar bench` result)."""
    ratios, worst, within, binding = [], [], 0, Counter()
    for res in runs:
        solar = res["loaders"]["solar"]
        seconds, limits = solar["epoch_seconds"], solar["epoch_limit_seconds"]
        ratios.append(sum(seconds) / sum(limits))
        worst.append(min(t / lim for t, lim in zip(seconds, limits, strict=True)))
        within += sum(limits) <= MARGIN * sum(seconds)
        binding.update(max(t, key=t.__getitem__) for t in solar["epoch_limit_terms"] if t)
    return {
        "runs": len(runs),
        "epochs_over_limit": spread(ratios),
        "smallest_epoch_over_limit": spread(worst),
        "limit_within_margin": within,
        "binding_terms": dict(binding),
        "read_bytes_per_s": spread([r["limits"]["read_bytes_per_s"] for r in runs]),
    }


def table(results: dict[str, dict]) -> str:
    """The figures as a markdown table, a scenario a row."""
    rows = [
        "| scenario | runs | epochs / limit: median (min–max) | smallest epoch / limit | "
        f"limit ≤ {MARGIN} × epochs | terms setting the limit | read GB/s: median (min–max) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        share, worst = r["epochs_over_limit"], r["smallest_epoch_over_limit"]
        bw = {k: v / 1e9 for k, v in r["read_bytes_per_s"].items()}
        terms = ", ".join(f"{k} {v}" for k, v in sorted(r["binding_terms"].items()))
        rows.append(
            f"| {name} | {r['runs']} | {share['median']:.2f} ({share['min']:.2f}–"
            f"{share['max']:.2f}) | {worst['min']:.2f} | {r['limit_within_margin']}/{r['runs']} "
            f"| {terms} | {bw['median']:.2f} ({bw['min']:.2f}–{bw['max']:.2f}) |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", default="", help="comma-separated scenario names")
    parser.add_argument("--json", type=Path, help="write the figures and every run here")
    opts = parser.parse_args()
    chosen = scenarios()
    if opts.only:
        names = opts.only.split(",")
        unknown = sorted(set(names) - set(chosen))
        if unknown:
            parser.error(f"unknown scenarios {unknown}; choose from {', '.join(chosen)}")
        chosen = {n: chosen[n] for n in names}
    results, every = {}, {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for name, s in chosen.items():
            data = tmp / f"{s['preset']}.h5"
            if not data.exists():
                generate(data, s["preset"], SMALL[s["preset"]])
            every[name] = [run_once(data, s, tmp) for _ in range(opts.repeats)]
            results[name] = summarise(every[name])
            print(f"{name}: epochs / limit {results[name]['epochs_over_limit']}", flush=True)
    print(table(results))
    if opts.json:
        write_json(opts.json, {"margin": MARGIN, "scenarios": chosen, "results": results,
                               "runs": every})  # fmt: skip


if __name__ == "__main__":
    main()
