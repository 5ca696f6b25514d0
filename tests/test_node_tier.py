"""The node tier (share="node" with tier=): every rank's steps of a node plan with a tier,
executed as the host runs them (hits and tier hits read at the step's start, updates applied
side by side by the ranks the plan names, segment by segment where the host updates a cell
twice), serve exactly the samples planned; under mpiexec, h5py's bytes, the plan's reads, an
exact (snapshot) and an elastic resume, and nothing left on disk or in /dev/shm."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import write_h5
from ranks_apart import MPIEXEC, run_job

from solar import BufferConfig, PlanSpec, RunConfig, Shuffle, Weighted
from solar.errors import SolarError
from solar.host.region import PREFIX
from solar.schedule.keep.grouping import Hosts, stage_bound
from solar.schedule.keep.hostplan import HostPlanner
from solar.schedule.plans.stream import RankStream

SHM_DIR = "/dev/shm"  # where no node region or tier may leave a name


def _execute(spec: PlanSpec, hosts: Hosts) -> tuple[int, int, int]:
    """Run every host's node plan over sample ids (a cell holds the id of the sample in it):
    every hit, tier hit and peer row must be its sample. Returns (tier hits, steps in order,
    storage reads)."""
    bound = stage_bound(spec, hosts)
    streams = [RankStream(spec, r, hosts=hosts, stage_rows=bound) for r in range(hosts.world)]
    slots, tslots = streams[0].slots, streams[0].tier_slots
    assert tslots > 0
    ram = np.full((hosts.count, slots), -1, np.int64)
    tier = np.full((hosts.count, tslots), -1, np.int64)
    thits = ordered = reads = 0
    for k in range(spec.run.num_steps):
        for h, group in enumerate(hosts.groups):
            plans = [streams[r].window(k).step(k) for r in group]
            batches = [np.concatenate([p.samples, p.side_samples]) for p in plans]
            staging: dict[int, int] = {}
            for p, b in zip(plans, batches, strict=True):  # before the first barrier
                assert np.array_equal(ram[h, p.hit_slots], b[p.hit_rows]), k
                assert np.array_equal(tier[h, p.tier_slots], b[p.tier_rows]), k
                thits += p.tier_rows.size
                reads += p.read_rows.size + p.side_samples.size
                staging.update(zip(p.stage_at.tolist(), b[p.stage_rows].tolist(), strict=True))
            for p, b in zip(plans, batches, strict=True):
                assert [staging[a] for a in p.peer_at.tolist()] == b[p.peer_rows].tolist(), k
            waits = plans[0].phase_waits
            waits = [False] if waits is None else waits.tolist()
            for p in plans:  # the same waits on every rank
                assert (p.phase_waits is None and waits == [False]) or \
                    p.phase_waits.tolist() == waits  # fmt: skip
            ordered += len(waits) > 1
            touched: dict = {}  # cell -> local rank, since the ranks last waited
            for n, wait in enumerate(waits):  # in turn; within one, the ranks side by side
                if wait:
                    touched = {}
                parts = [_phase(p, n) for p in plans]
                for q, (_, d_tslots, _, a_slots, _, t_slots) in enumerate(parts):
                    for cell in [*a_slots.tolist(), *(-1 - np.r_[d_tslots, t_slots]).tolist()]:
                        assert touched.setdefault(cell, q) == q, k  # one rank's, till a wait
                for d_slots, d_tslots, *_ in parts:
                    tier[h, d_tslots] = ram[h, d_slots]
                for q in reversed(range(len(group))):
                    _, _, a_rows, a_slots, t_rows, t_slots = parts[q]
                    ram[h, a_slots] = batches[q][a_rows]
                    tier[h, t_slots] = batches[q][t_rows]
    for s in streams:
        s.close()
    return thits, ordered, reads


def _phase(p, n: int) -> tuple:
    """Step ``p``'s updates in its phase ``n``."""
    if p.phase_waits is None:
        if n:
            return tuple(a[:0] for a in _phase(p, 0))
        return (p.demote_slots, p.demote_tslots, p.admit_rows, p.admit_slots, p.tadmit_rows,
                p.tadmit_tslots)  # fmt: skip
    d, a, t = p.demote_phase == n, p.admit_phase == n, p.tadmit_phase == n
    return (p.demote_slots[d], p.demote_tslots[d], p.admit_rows[a], p.admit_slots[a],
            p.tadmit_rows[t], p.tadmit_tslots[t])  # fmt: skip


@pytest.mark.parametrize("kind, grid", [("weighted", (1, 4)), ("affinity", (2, 2)),
                                        ("shuffle", (1, 4))])  # fmt: skip
def test_a_node_plan_with_a_tier_runs_as_planned(kind, grid):
    n = 301
    w = (1.0 + np.arange(n)) ** -0.8
    sampler = {"weighted": Weighted(w, affinity=False), "affinity": Weighted(w),
               "shuffle": Shuffle()}[kind]  # fmt: skip
    run = RunConfig(n, 4, 11, 3, seed=5)
    spec = PlanSpec(run, BufferConfig(n // 40, 0.1, n // 20), sampler=sampler)
    hosts = Hosts.grid(*grid)
    thits, ordered, reads = _execute(spec, hosts)
    assert thits > 0 and ordered > 0  # tier hits, and steps whose host updates a cell twice
    planner = HostPlanner(spec, hosts)
    assert reads == sum(planner.next().storage_reads() for _ in range(run.epochs))


# -- under mpiexec ---------------------------------------------------------------------------
HERE = Path(__file__).parent / "mpi"
FOREIGN_PREFIXES = ("SLURM_", "PMI_", "OMPI_", "TORCHELASTIC_", "MPI_")


def _mpiexec(n: int, *args, timeout: float):
    if not MPIEXEC.exists():
        pytest.skip("no mpiexec beside python")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(FOREIGN_PREFIXES) and k != "SOLAR_HOSTS"}  # fmt: skip
    return run_job(MPIEXEC, n, [str(HERE / "node_tier.py"), *map(str, args)], timeout, env)


def _shm() -> set[str]:
    return {p for p in os.listdir(SHM_DIR) if p.startswith(PREFIX)}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    x = np.random.default_rng(0).integers(0, 2**31, (613, 24), dtype=np.int64)
    return write_h5(tmp_path_factory.mktemp("nodetier") / "d.h5", x=x)


@pytest.mark.xdist_group("launchers")
def test_a_node_tier_serves_h5py_bytes_resumes_and_leaves_nothing(data, tmp_path):
    """(A killed rank: tests/test_node_buffer.py's killed node loader runs with a tier.)"""
    before = _shm()
    tier, snaps = tmp_path / "tier", tmp_path / "snaps"
    tier.mkdir()
    snaps.mkdir()
    result = _mpiexec(4, data, tier, snaps, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "node tier: " in result.stdout and "resumed exactly" in result.stdout
    assert os.listdir(tier) == [] and _shm() - before == set()


def test_a_node_tier_too_large_is_refused_in_one_line(tmp_path):
    from solar.cache.nodetier import NodeTierFile
    from solar.io.executor import Executor
    from solar.io.info import KeyInfo

    keys = (KeyInfo("x", (1 << 20,), np.dtype(np.uint8)),)
    with pytest.raises(SolarError) as err:
        NodeTierFile(tmp_path, slots=2**30, keys=keys, executor=Executor(1), comm=None, key=7,
                     host=0, local_rank=0)  # fmt: skip
    msg = str(err.value)
    assert "\n" not in msg and "the node's tier needs" in msg and "free" in msg, msg
    assert os.listdir(tmp_path) == []


def test_a_node_tier_left_by_a_killed_job_is_removed_and_a_new_one_leaves_no_name(tmp_path):
    from solar.cache.nodetier import PREFIX as TIER_PREFIX
    from solar.cache.nodetier import NodeTierFile
    from solar.io.executor import Executor
    from solar.io.info import KeyInfo

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    left = tmp_path / f"{TIER_PREFIX}{7:016x}-0-{os.uname().nodename}-{dead.stdout.strip()}.bin"
    left.write_bytes(b"x")
    keys = (KeyInfo("x", (3,), np.dtype(np.int64)),)
    with pytest.warns(UserWarning, match="left by a crashed run"):
        tier = NodeTierFile(tmp_path, slots=5, keys=keys, executor=Executor(1), comm=None,
                            key=8, host=0, local_rank=0)  # fmt: skip
    assert os.listdir(tmp_path) == []  # the old one removed, the new one unlinked
    rows = np.arange(6, dtype=np.int64).reshape(2, 3)
    tier.submit_write(np.array([4, 1]), [rows], np.array([0, 1]))
    tier.wait_writes()
    out = np.zeros((2, 3), np.int64)
    for f in tier.submit_read(np.array([1, 4]), [out], np.array([0, 1])):
        f.result()
    assert out.tolist() == [[3, 4, 5], [0, 1, 2]]
    tier.close()
