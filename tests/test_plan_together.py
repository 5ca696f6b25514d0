"""``solar plan`` under mpiexec as one host (solar/schedule/plans/together.py): each process
plans its share of the ranks, process 0 writes the plan file rank by rank; the file is the
one a single process writes, byte for byte but its planning time; the totals alike."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
from click.testing import CliRunner
from ranks_apart import MPIEXEC, run_job

from solar.cli import cli
from solar.graph import generate_graph

SCRIPT = Path(__file__).parent / "mpi" / "plan_cli.py"

pytestmark = pytest.mark.skipif(not MPIEXEC.exists(), reason="no mpiexec beside python")


def _datasets(path: Path) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    with h5py.File(path) as f:
        f.visititems(lambda name, d: out.update({name: d[()]}) if isinstance(d, h5py.Dataset)
                     else None)  # fmt: skip
        out.update({f"attr {k}": v for k, v in f.attrs.items() if k != "plan_seconds"})
    return out


@pytest.fixture(scope="module")
def graph(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("together") / "g.h5"
    generate_graph(path, 1999, 6.0, 24, seed=5, train_fraction=0.3)
    return path


@pytest.mark.parametrize("procs,window", [(3, None), (2, 2)])
def test_processes_plan_as_one_host_the_file_one_process_writes(graph, tmp_path, procs, window):
    args = [str(graph), "--sampler", "neighbor", "--fanouts", "4,2", "-B", "24", "-P", "4",
            "-E", "3", "--buffer", "120", "--json",
            *([] if window is None else ["--window", str(window)])]  # fmt: skip
    one = tmp_path / "one.h5"
    res = CliRunner().invoke(cli, ["plan", *args, "-o", str(one)])
    assert res.exit_code == 0, res.output
    together = tmp_path / "together.h5"
    job = run_job(MPIEXEC, procs, [str(SCRIPT), str(together), *args], 240)
    assert job.returncode == 0, job.stderr[-3000:]
    out0, err0 = job.ranks[0]
    assert "shared topology: ok" in out0
    # The memory figure comes first, then the summary, once (from process 0).
    assert f"{procs} processes plan the 4 ranks as one host" in err0
    assert "planning: about" in err0
    assert "of memory per process (process 0)" in err0
    assert f"for this host's {procs} processes" in err0
    assert all(not out for out, _ in job.ranks[1:])
    summary = json.loads(out0.splitlines()[0])
    assert summary["hits"] == json.loads(res.output.splitlines()[-1])["hits"] > 0
    a, b = _datasets(one), _datasets(together)
    assert sorted(a) == sorted(b)
    for name in a:
        assert np.array_equal(a[name], b[name]), name
    # Totals alone (no file): the same figures.
    job = run_job(MPIEXEC, procs, [str(SCRIPT), "-", *args], 240)
    assert job.returncode == 0, job.stderr[-3000:]
    alone = json.loads(job.ranks[0][0].splitlines()[0])
    assert (alone["accesses"], alone["hits"]) == (summary["accesses"], summary["hits"])


def test_a_node_buffer_is_refused_under_mpiexec_in_one_line(graph):
    args = [str(graph), "--sampler", "neighbor", "--fanouts", "4,2", "-B", "24", "-P", "2",
            "-E", "2", "--buffer", "120", "--share", "node"]  # fmt: skip
    job = run_job(MPIEXEC, 2, [str(SCRIPT), "-", *args], 120)
    assert job.returncode != 0
    assert "under mpiexec plans a buffer per rank as one host" in job.stderr


def test_a_plan_written_rank_by_rank_is_the_plan_written_whole(graph, tmp_path):
    """PlanWriter.add_ranks (each rank's part as it comes, from its own planner) writes the
    file plan_to_file writes; a part that is not its offsets' is refused."""
    from solar import BufferConfig, NeighborSampler, PlanSpec, RunConfig, SolarError
    from solar.schedule.keep.planner import Planner
    from solar.schedule.plans.plan import plan_to_file
    from solar.schedule.plans.planfile import PlanWriter
    from solar.schedule.plans.together import share

    sampler = NeighborSampler(graph, (4, 2), batch_size=24)
    n = sampler.graph.num_nodes
    run = RunConfig(n, 3, 24, 2, 1, False, sampler.draws(n, 72))
    spec = PlanSpec(run, BufferConfig(100, 0.25, 30), sampler=sampler)
    assert share(spec, 2, 0) == [0, 2] and share(spec, 2, 1) == [1]
    whole = plan_to_file(spec, tmp_path / "whole.h5")
    planners = [Planner(spec, only_rank=r) for r in range(3)]
    with PlanWriter(tmp_path / "ranks.h5", spec, planners[0].epoch_order) as writer:
        for k in range(2):
            parts = [p.next_rank(r) for r, p in enumerate(planners)]
            offsets = np.stack([p.step_offsets for p in parts])
            writer.add_ranks(k, offsets, iter(parts))
        writer.finish(whole.stats, whole.plan_seconds)
    a, b = _datasets(tmp_path / "whole.h5"), _datasets(tmp_path / "ranks.h5")
    assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)
    planners = [Planner(spec, only_rank=r) for r in range(3)]
    parts = [p.next_rank(r) for r, p in enumerate(planners)]
    offsets = np.stack([p.step_offsets for p in parts])
    with pytest.raises(SolarError, match="rank 1's part is not its offsets'"), \
            PlanWriter(tmp_path / "bad.h5", spec) as writer:  # fmt: skip
        writer.add_ranks(0, offsets, iter([parts[0], parts[0], parts[2]]))
    assert not list(tmp_path.glob("*bad*"))  # nothing half-written


def test_a_part_narrower_than_its_offsets_is_refused_in_one_line(graph, tmp_path):
    """Process 1 sends its ranks' slots as int16: process 0 refuses the part (never writes the
    uninitialised rest as the plan), the job ends, nothing is written."""
    args = [str(graph), "--sampler", "neighbor", "--fanouts", "4,2", "-B", "24", "-P", "2",
            "-E", "2", "--buffer", "120"]  # fmt: skip
    out = tmp_path / "narrow.h5"
    job = run_job(MPIEXEC, 2, [str(SCRIPT), "--narrow", str(out), *args], 120)
    assert job.returncode != 0
    err = job.ranks[0][1]
    assert "process 1 sent rank 1's slots of epoch 0 as" in err, job.stderr[-3000:]
    assert "bytes, not the" in err and "int32 its offsets say" in err
    assert "Traceback" not in err
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_processes_with_no_rank_of_their_own_wait_asleep(tmp_path):
    """Shuffle's ranks are planned together by process 0 (the file one process writes); the
    other process waits for it asleep, not polling a core (its CPU time a small part of its
    wait: process 0 sleeps 1 s before planning)."""
    args = ["--samples", "4000", "-B", "16", "-P", "4", "-E", "2", "--buffer", "200", "--json"]
    one = tmp_path / "one.h5"
    res = CliRunner().invoke(cli, ["plan", *args, "-o", str(one)])
    assert res.exit_code == 0, res.output
    together = tmp_path / "together.h5"
    job = run_job(MPIEXEC, 2, [str(SCRIPT), "--slow", str(together), *args], 240)
    assert job.returncode == 0, job.stderr[-3000:]
    out0, err0 = job.ranks[0]
    assert "2 processes plan the 4 ranks as one host, each its share (process 0: ranks " \
           "[0, 1, 2, 3])" in err0  # fmt: skip
    assert "per process (process 0)" in err0 and "for this host's 2 processes" in err0
    a, b = _datasets(one), _datasets(together)
    assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)
    waited = json.loads(next(x for x in out0.splitlines() if x.startswith("waited: "))[8:])
    cpu, wall = waited[1]
    assert wall >= 1.0 and cpu < 0.05 * wall, waited  # (MPICH polling: about 0.3 here)


def test_the_memory_check_sums_the_processes_of_a_host(graph, tmp_path):
    """Each process's share fits in the memory free, the host's processes together do not:
    refused in one line, before any plans, nothing written."""
    args = [str(graph), "--sampler", "neighbor", "--fanouts", "4,2", "-B", "24", "-P", "4",
            "-E", "2", "--buffer", "120"]  # fmt: skip
    job = run_job(MPIEXEC, 2, [str(SCRIPT), "--room", str(tmp_path / "p.h5"), *args], 120)
    assert job.returncode != 0
    err = job.ranks[0][1]
    assert "with this host's 2 processes: " in err and "of memory available" in err, \
        job.stderr[-3000:]  # fmt: skip
    assert "Traceback" not in err and "processes plan the" not in err
    assert not list(tmp_path.iterdir())
