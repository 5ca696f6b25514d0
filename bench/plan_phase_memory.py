"""Per-process memory of ``solar plan --sampler neighbor`` under mpiexec, phase by phase: where
the private (RssAnon) bytes of a planning process go, and how they grow with N and the ranks.

    PYTHONPATH=. mpiexec -n 2 python bench/plan_phase_memory.py /work/benchdata/g30m.h5 \\
        --fanouts 15,10,5 -B 1024 -P 8 --buffer 10% --windows 3 [--trace]

Does what the CLI does (solar/cli.py ``plan``, then solar/schedule/plans/together.py), one
phase at a time: the job's communicator, the sampler (the sealed topology, read once a host),
the feature rows' page layout, the spec, the memory estimate, the kernels' rehearsal, this
process's planners (``Planner(spec, only_rank=r)``), then the first ``--windows`` windows of
one step of epoch 0 of its first rank (the rest of the plan repeats them). Per phase and
process: RssAnon and RssShmem as it ends, and the highest RssAnon seen during it (sampled
every 2 ms). ``--trace``: tracemalloc's largest live allocations (numpy's are traced; numba's
are not) at each phase's end, by line (``--frames K``: K callers), on process 0, with the
traced total and its peak during the phase.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import threading
import tracemalloc

_FIELDS = ("RssAnon", "RssShmem")


def status() -> dict[str, int]:
    """This process's memory figures, kB."""
    with open("/proc/self/status") as f:
        text = f.read()
    return {k: int(re.search(rf"^{k}:\s+(\d+)", text, re.M).group(1)) for k in _FIELDS}


class Peak:
    """The highest RssAnon since the last :meth:`take` (a sampling thread)."""

    def __init__(self) -> None:
        self.high = 0
        self._stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self._stop.wait(0.002):
            self.high = max(self.high, status()["RssAnon"])

    def take(self) -> int:
        got, self.high = max(self.high, status()["RssAnon"]), 0
        return got


class Phases:
    """The figures at each phase's end (:meth:`end`), and tracemalloc's if ``frames``."""

    def __init__(self) -> None:
        self.peak = Peak()
        self.frames = 0  # (tracing from start_tracing on)
        self.rows: list[tuple[str, dict[str, int], int]] = []
        self.tops: list[tuple[str, list[str]]] = []

    def start_tracing(self, frames: int) -> None:
        self.frames = frames
        tracemalloc.start(frames)

    def end(self, name: str) -> None:
        self.rows.append((name, status(), self.peak.take()))
        if not self.frames:
            return
        snap = tracemalloc.take_snapshot().statistics("traceback" if self.frames > 1 else
                                                      "lineno")  # fmt: skip
        now, high = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        top = [f"{s.size / 2**20:9.1f} MiB  " + " < ".join(_where(f) for f in s.traceback)
               for s in snap[:6]]  # fmt: skip
        self.tops.append((f"{name}' (traced {now / 2**20:.0f} MiB, peak {high / 2**20:.0f})", top))


def _where(frame: tracemalloc.Frame) -> str:
    return f"{frame.filename.split('/')[-1]}:{frame.lineno}"


def plan_phases(a: argparse.Namespace, phases: Phases) -> tuple:
    """What ``solar plan`` does, phase by phase; returns (comm, N, buffer rows a rank)."""
    phases.end("python started")
    import numpy as np  # noqa: F401

    from solar.cli import _job_comm, _warm_planner
    from solar.config import BufferConfig, parse_size
    from solar.graph.bench import parse_fanouts
    from solar.graph.neighbor import NeighborSampler
    from solar.io.sources import describe_source
    from solar.options import PlanningConfig
    from solar.runtime.setup import page_layout
    from solar.schedule.draw.samplers import sampler_run
    from solar.schedule.keep.planner import Planner
    from solar.schedule.plans.together import host_memory, share
    from solar.schedule.spec import PlanSpec, equal_by_default

    phases.end("solar imported")
    comm = _job_comm("rank", None)
    q = comm.Get_rank() if comm is not None else 0
    if a.trace and q == 0:
        phases.start_tracing(a.frames)
    phases.end("MPI communicator")
    sampler = NeighborSampler(a.graph, parse_fanouts(a.fanouts), a.batch_size,
                              features="features", comm=comm)  # fmt: skip
    phases.end("NeighborSampler (topology)")
    info = describe_source(a.graph, ["features"])
    pages = page_layout(info)
    phases.end("describe_source, page layout")
    n, p = info.num_samples, a.world_size
    run = sampler_run(sampler, n, p, a.batch_size, 1, 0, False)
    cap = parse_size(a.buffer, sample_bytes=info.sample_bytes, name="--buffer", num_samples=n,
                     world_size=p)  # fmt: skip
    planning = PlanningConfig(window=1)  # (the CLI's defaults, --window 1)
    spec = PlanSpec(run, BufferConfig(cap, planning.slack, 0), planning.policy, False,
                    info.sample_bytes, info.identity, sampler, planning.horizon,
                    equal_by_default(p, sampler), None, planning.window)  # fmt: skip
    if spec.plans_page_mates:
        spec = dataclasses.replace(spec, pages=pages)
    phases.end("run, spec")
    if comm is not None:
        host_memory(spec, comm, tallied=True)
    phases.end("plan_memory estimate")
    _warm_planner(spec, False)
    phases.end("kernels rehearsed")
    mine = share(spec, 1 if comm is None else comm.Get_size(), q)
    planners = {r: Planner(spec, only_rank=r) for r in mine}
    phases.end(f"Planner x{len(planners)}")
    parts = planners[mine[0]].next_parts()
    for j in range(a.windows):
        next(parts)
        phases.end(f"window {j} planned")
    return comm, n, cap


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("graph")
    ap.add_argument("--fanouts", default="15,10,5")
    ap.add_argument("-B", "--batch-size", type=int, default=1024)
    ap.add_argument("-P", "--world-size", type=int, default=8)
    ap.add_argument("--buffer", default="10%")
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--trace", action="store_true")
    ap.add_argument("--frames", type=int, default=1, help="--trace: callers shown per allocation")
    a = ap.parse_args()
    phases = Phases()
    comm, n, cap = plan_phases(a, phases)
    every = [phases.rows] if comm is None else comm.gather(phases.rows)
    if comm is not None and comm.Get_rank() != 0:
        return
    print(f"{a.graph}: N={n}, P={a.world_size}, processes={len(every)}, buffer {cap} rows/rank "
          f"(MiB; 'peak' = highest RssAnon during the phase)")  # fmt: skip
    print(f"{'phase':32s}" + "".join(f" | p{i} anon  peak shmem" for i in range(len(every))))
    for i, (name, _, _) in enumerate(phases.rows):
        line = f"{name:32s}"
        for rows in every:
            st, hi = rows[i][1], rows[i][2]
            line += f" | {st['RssAnon'] / 1024:7.0f} {hi / 1024:5.0f} {st['RssShmem'] / 1024:5.0f}"
        print(line)
    for name, top in phases.tops:
        print(f"-- live at the end of '{name}', process 0:")
        print("\n".join(top))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
