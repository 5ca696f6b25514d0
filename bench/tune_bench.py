"""threads="auto" against a grid of fixed settings, on pipelines each limited by another stage.

For each pipeline, every fixed setting of the grid (``--threads``) and ``threads="auto"`` run
the same epochs with a Loader made for the run (so auto starts from its default each time and
its search is paid inside the timing), ``--repeat`` times, in an order rotated every repeat
(drifts of the host hit every setting alike); each reports the median samples/s, and auto's
as a fraction of the best fixed setting's (the issue's target: at least 0.9), over the whole
run and over its last epoch (converged). The bottleneck line of every run and where auto left
its knobs are in the JSON.

Pipelines (``--pipelines``):

* ``io``: uncompressed samples behind emulated remote storage (``--throttle`` MB/s and ms
  per request, solar/io/throttle.py): latency-bound, so reader threads are concurrency;
* ``decode``: gzip chunks of one sample (the ptychonn preset), page-cached: decoding limits;
* ``transform``: page-cached contiguous samples through examples/transforms.py's ``augment``
  (1-3 ms a sample): the transform workers limit (reader threads × transform workers).

To add a stage's dimension (e.g. transform workers) or a pipeline: a ``DIMENSIONS`` entry
maps a setting's value into the Loader's keyword arguments, ``AUTO`` says which value of it
means "tuned", and a ``PIPELINES`` entry makes the files and the Loader's fixed arguments
and names its grid.

    flock /tmp/solar-bench.lock .venv/bin/python bench/tune_bench.py \
        --json bench/results/tune.json
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from solar import ExpertConfig, Loader, ReaderConfig, Transform
from solar._atomic import write_json
from solar.io.generate import generate
from solar.io.throttle import Throttle
from solar.transform import load_transform


def _threads(kw: dict, value: Any) -> None:
    kw["reader"] = ReaderConfig(threads=value)


def _transform_workers(kw: dict, value: Any) -> None:
    kw["transform"] = Transform(load_transform(TRANSFORM), workers=value)


# The transform of the ``transform`` pipeline: 1-3 ms per 256x256 float32 sample.
TRANSFORM = str(Path(__file__).resolve().parents[1] / "examples" / "transforms.py") + ":augment"

# A setting's dimensions: how each value reaches the Loader, and the value meaning "tuned".
DIMENSIONS: dict[str, Callable[[dict, Any], None]] = {
    "threads": _threads,
    "transform_workers": _transform_workers,
}
AUTO: dict[str, Any] = {"threads": "auto", "transform_workers": "auto"}


@dataclass
class Pipeline:
    name: str
    paths: list[Path]
    loader: dict[str, Any]  # the Loader's arguments common to every setting
    grid: dict[str, list[Any]]  # dimension -> fixed values tried
    notes: str = ""
    runs: dict[str, list[dict]] = field(default_factory=dict)  # setting label -> runs


def io_pipeline(folder: Path, args: argparse.Namespace) -> Pipeline:
    path = folder / "io.h5"
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:  # 64 KiB samples, contiguous
        f["x"] = rng.standard_normal((args.samples, 128, 128), np.float32)
    return Pipeline(
        "io", [path],
        {"expert": ExpertConfig(throttle=Throttle.parse(args.throttle)),
         "batch_size": args.batch_size},
        # (1 and 2 threads: 4 and 8 ms a sample, minutes a run, and clearly not the best)
        {"threads": [int(t) for t in args.threads.split(",") if int(t) >= 4]},
        f"{args.samples} samples of 64 KiB, contiguous, throttle {args.throttle} (MB/s,ms)",
    )  # fmt: skip


def decode_pipeline(folder: Path, args: argparse.Namespace) -> Pipeline:
    path = generate(folder / "gz.h5", "ptychonn", args.gzip_samples, chunks=1, compression="gzip")
    return Pipeline(
        "decode", [path], {"batch_size": args.batch_size},
        {"threads": [int(t) for t in args.threads.split(",") if int(t) <= 16]},
        f"{args.gzip_samples} ptychonn samples, gzip, one sample a chunk, page-cached",
    )  # fmt: skip


def transform_pipeline(folder: Path, args: argparse.Namespace) -> Pipeline:
    path = generate(folder / "t.h5", "ptychonn", args.transform_samples)
    return Pipeline(
        "transform", [path], {"batch_size": args.batch_size},
        {"threads": [2, 8], "transform_workers": [1, 2, 3, 4]},
        f"{args.transform_samples} ptychonn samples, contiguous, page-cached, transform "
        f"{TRANSFORM.rsplit('/', 1)[-1]} (crop, flip, log, blur, normalise, noise)",
    )  # fmt: skip


PIPELINES: dict[str, Callable[[Path, argparse.Namespace], Pipeline]] = {
    "io": io_pipeline,
    "decode": decode_pipeline,
    "transform": transform_pipeline,
}


def settings(p: Pipeline) -> list[dict[str, Any]]:
    """Every fixed setting of the grid, then the tuned one."""
    dims = list(p.grid)
    fixed = [dict(zip(dims, values, strict=True)) for values in itertools.product(*p.grid.values())]
    return [*fixed, {d: AUTO[d] for d in dims}]


def label(setting: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in setting.items())


def run_once(p: Pipeline, setting: dict[str, Any], epochs: int) -> dict:
    """One Loader over ``epochs`` epochs (buffer 0: every sample read), timed after it is
    made; samples/s over the run and over its last epoch."""
    kw = dict(p.loader)
    for dim, value in setting.items():
        DIMENSIONS[dim](kw, value)
    loader = Loader(p.paths, epochs=epochs, buffer=0, **kw)
    times, served = [], 0
    t0 = time.perf_counter()
    for e in range(epochs):
        loader.set_epoch(e)
        for b in loader:
            served += b["index"].numel()
        times.append(time.perf_counter())
    loader.wait_reads()
    total = time.perf_counter() - t0
    per_epoch = served / epochs
    last = times[-1] - (times[-2] if epochs > 1 else t0)
    out = {
        "rate": served / total,
        "last_epoch_rate": per_epoch / last,
        "bottleneck": loader.stats.bottleneck()[1],
        "tuned": loader.stats.tuned,
        "moves": len(loader.stats.tuning),
    }
    loader.close()
    return out


def summarise(p: Pipeline) -> dict:
    med = {k: statistics.median(r["rate"] for r in runs) for k, runs in p.runs.items()}
    last = {k: statistics.median(r["last_epoch_rate"] for r in runs) for k, runs in p.runs.items()}
    auto = label({d: AUTO[d] for d in p.grid})
    fixed = {k: v for k, v in med.items() if k != auto}
    best = max(fixed, key=lambda k: fixed[k])
    best_last = max((k for k in last if k != auto), key=lambda k: last[k])
    return {
        "pipeline": p.name, "notes": p.notes, "median_rate": med, "median_last_epoch_rate": last,
        "best_fixed": best, "auto_vs_best": med[auto] / fixed[best],
        "auto_last_epoch_vs_best": last[auto] / last[best_last],
        "runs": p.runs,
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pipelines", default=",".join(PIPELINES))
    ap.add_argument("--threads", default="1,2,4,8,16,32,64", help="fixed reader threads tried")
    ap.add_argument("--samples", type=int, default=4000, help="io pipeline samples")
    ap.add_argument("--gzip-samples", type=int, default=1000, help="decode pipeline samples")
    ap.add_argument("--transform-samples", type=int, default=1000,
                    help="transform pipeline samples")  # fmt: skip
    ap.add_argument("--throttle", default="400,4", help="io pipeline: MB/s,ms per request")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where to write the files (default: a tmp dir)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    out = {"meta": {**vars(args), "cpus": len(os.sched_getaffinity(0))}, "pipelines": []}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for name in args.pipelines.split(","):
            p = PIPELINES[name](Path(tmp), args)
            order = settings(p)
            for r in range(args.repeat):
                shift = r % len(order)
                for s in order[shift:] + order[:shift]:
                    got = run_once(p, s, args.epochs)
                    p.runs.setdefault(label(s), []).append(got)
                    tuned = f" tuned {got['tuned']}" if got["tuned"] else ""
                    print(f"{p.name} {label(s):>20s} {got['rate']:7.0f}/s "
                          f"(last epoch {got['last_epoch_rate']:7.0f}/s) {got['bottleneck']}"
                          f"{tuned}", flush=True)  # fmt: skip
            res = summarise(p)
            out["pipelines"].append(res)
            print(f"== {p.name}: auto {res['auto_vs_best']:.2f}× the best fixed "
                  f"({res['best_fixed']}), last epoch {res['auto_last_epoch_vs_best']:.2f}×",
                  flush=True)  # fmt: skip
    if args.json:
        write_json(args.json, out)


if __name__ == "__main__":
    main()
