"""Which stage the bottleneck line names on real tiny pipelines, with the spread over runs.

    python bench/stages_bench.py [--repeats 10] [--json OUT]

Three pipelines, each built so that one stage should limit (tests/test_stages.py checks only
what holds at any speed; whether the intended stage wins is a race between this machine's
storage, decompression and Python, so it is reported here):

* ``read``: 96 plain 4 KiB samples behind emulated storage (20 MB/s, 4 ms a request), 4
  reader threads: every thread waits on storage;
* ``decode``: gzip chunks of two 64 KiB samples, page-cached, 8 reader threads and 1
  decoding thread: inflating costs more than reading the cached file;
* ``transform``: 64 plain samples through a transform sleeping 2 ms a sample, on 1 worker.

Per pipeline: how often each stage was named, each active stage's utilisation and the share
of its time the trainer waited (median, min and max over the runs), and for ``decode`` the
read stage's busy time over the decode stage's (the old test wanted it under 8).

    flock /tmp/solar-bench.lock .venv/bin/python bench/stages_bench.py \
        --json bench/results/stages.json
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np

from solar import Loader, ReaderConfig
from solar._atomic import write_json
from solar.io.throttle import Throttle
from solar.options import ExpertConfig
from solar.transform import Transform


def _slow_identity(sample: dict, rng: np.random.Generator) -> dict:
    time.sleep(0.002)  # 2 ms a sample, on one worker
    return {"x": sample["x"] * 1}


def _read(tmp: Path) -> Loader:
    path = tmp / "plain.h5"
    if not path.exists():
        with h5py.File(path, "w") as f:
            f["x"] = np.random.default_rng(0).standard_normal((96, 32, 32), np.float32)
    return Loader(path, batch_size=8, epochs=1, buffer=0, reader=ReaderConfig(threads=4),
                  expert=ExpertConfig(throttle=Throttle(20, 4)))  # fmt: skip


def _decode(tmp: Path) -> Loader:
    path = tmp / "gz.h5"
    if not path.exists():
        data = np.random.default_rng(0).integers(0, 16, (96, 128, 128)).astype(np.float32)
        with h5py.File(path, "w") as f:
            f.create_dataset("x", data=data, chunks=(2, 128, 128), compression="gzip")
    loader = Loader(path, batch_size=8, epochs=2, buffer=0, reader=ReaderConfig(threads=8))
    loader.reader.executor.resize(decode_threads=1)  # one decoding thread: it should limit
    return loader


def _transform(tmp: Path) -> Loader:
    path = tmp / "small.h5"
    if not path.exists():
        with h5py.File(path, "w") as f:
            f["x"] = np.random.default_rng(0).standard_normal((64, 16, 16), np.float32)
    return Loader(path, batch_size=8, epochs=1, buffer=0,
                  transform=Transform(_slow_identity, workers=1))  # fmt: skip


PIPELINES: dict[str, Callable[[Path], Loader]] = {
    "read": _read,
    "decode": _decode,
    "transform": _transform,
}


def run_once(make: Callable[[Path], Loader], tmp: Path) -> dict:
    """One run of a pipeline's every epoch: the named stage and the run's stage figures."""
    with make(tmp) as loader:
        for e in range(loader.run.epochs):
            loader.set_epoch(e)
            for _ in loader:
                pass
        name, line = loader.stats.bottleneck()
        stages = {n: s.as_dict() for n, s in loader.stats.stages().items()}
    return {"named": name, "line": line, "stages": stages}


def spread(values: list[float]) -> dict[str, float]:
    """Median, min and max."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarise(expected: str, runs: list[dict]) -> dict:
    """A pipeline's figures over its runs."""
    active = [n for n in ("read", "decode", "transform")
              if any(r["stages"][n]["busy_seconds"] > 0 for r in runs)]  # fmt: skip
    trainers = [r["stages"]["trainer"] for r in runs]
    waited = [(t["blocked_seconds"] or 0.0) / t["wall_seconds"] for t in trainers]
    out = {
        "expected": expected,
        "named": dict(Counter(r["named"] for r in runs)),
        "utilisation": {n: spread([r["stages"][n]["utilisation"] for r in runs]) for n in active},
        "trainer_waited": spread(waited),
    }
    if expected == "decode":
        busy = [(r["stages"]["read"]["busy_seconds"], r["stages"]["decode"]["busy_seconds"])
                for r in runs]  # fmt: skip
        out["read_over_decode_busy"] = spread([read / decode for read, decode in busy])
    return out


def table(results: dict[str, dict]) -> str:
    """The figures as a markdown table, a pipeline a row."""
    rows = [
        "| pipeline | named (runs) | utilisation: median (min–max) | trainer waited |",
        "|---|---|---|---|",
    ]
    for name, r in results.items():
        named = ", ".join(f"{k} {v}" for k, v in sorted(r["named"].items()))
        util = "; ".join(f"{k} {100 * v['median']:.0f} % ({100 * v['min']:.0f}–"
                         f"{100 * v['max']:.0f})" for k, v in r["utilisation"].items())  # fmt: skip
        w = r["trainer_waited"]
        rows.append(f"| {name} | {named} | {util} | {100 * w['median']:.0f} % "
                    f"({100 * w['min']:.0f}–{100 * w['max']:.0f}) |")  # fmt: skip
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--json", type=Path, help="write the figures and every run here")
    opts = parser.parse_args()
    results, every = {}, {}
    with tempfile.TemporaryDirectory() as d:
        for name, make in PIPELINES.items():
            every[name] = [run_once(make, Path(d)) for _ in range(opts.repeats)]
            results[name] = summarise(name, every[name])
    print(table(results))
    for name, r in results.items():
        if "read_over_decode_busy" in r:
            print(f"{name}: read busy / decode busy {r['read_over_decode_busy']}")
    if opts.json:
        write_json(opts.json, {"results": results, "runs": every})


if __name__ == "__main__":
    main()
