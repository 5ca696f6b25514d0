"""Launcher detection from the environment (a pure function) and the torch.distributed comm."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest

from solar.errors import SolarError
from solar.launch import Launch, detect_launcher, first_host, srun_port

TORCHRUN = {"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "node1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "x"}  # fmt: skip
HYDRA = {"PMI_RANK": "1", "PMI_SIZE": "3", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "3"}
OPEN_MPI = {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8",
            "OMPI_COMM_WORLD_LOCAL_RANK": "1"}  # fmt: skip
SRUN = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_LOCALID": "1", "SLURM_JOB_ID": "123456", "SLURM_STEP_ID": "2",
        "SLURM_STEP_NODELIST": "gpu[017-018]", "SLURM_JOB_NODELIST": "gpu[016-018]"}  # fmt: skip


@pytest.mark.parametrize(("env", "want"), [
    ({}, Launch("none", 0, 1, 0)),
    ({"HOME": "/root"}, Launch("none", 0, 1, 0)),
    (TORCHRUN, Launch("torchrun", 2, 4, 0, "node1", 29500)),
    ({"RANK": "0", "WORLD_SIZE": "1"}, Launch("torchrun", 0, 1, 0)),
    (HYDRA, Launch("mpi", 1, 3, 1)),
    (OPEN_MPI, Launch("mpi", 5, 8, 1)),
    (SRUN, Launch("srun", 3, 4, 1, "gpu017", srun_port(123456, 2))),
    # A torchrun started by srun on each node: torchrun's numbers are the workers'.
    ({**SRUN, **TORCHRUN}, Launch("torchrun", 2, 4, 0, "node1", 29500)),
    # srun with a PMI plugin: the same numbers, so srun launched these tasks itself.
    ({**SRUN, "PMI_RANK": "3", "PMI_SIZE": "4"}, Launch("srun", 3, 4, 1, "gpu017",
                                                        srun_port(123456, 2))),
    # mpiexec in an allocation starts its daemons with srun: the ranks inherit a daemon's.
    ({**SRUN, "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2", **HYDRA}, Launch("mpi", 1, 3, 1)),
    ({**SRUN, "MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "4000"},
     Launch("srun", 3, 4, 1, "10.0.0.7", 4000)),
    # srun -n 2 inside a 4-task allocation: the step's count, not the allocation's.
    ({**SRUN, "SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2"},
     Launch("srun", 1, 2, 1, "gpu017", srun_port(123456, 2))),
    ({**TORCHRUN, "SOLAR_LAUNCHER": "none"}, Launch("none", 0, 1, 0)),
    ({**SRUN, **HYDRA, "SOLAR_LAUNCHER": "MPI"}, Launch("mpi", 1, 3, 1)),
    ({"SOLAR_LAUNCHER": "mpi"}, Launch("mpi", 0, 1, 0)),
    ({**SRUN, "PMI_RANK": "3", "PMI_SIZE": "4", "SOLAR_LAUNCHER": "mpi"}, Launch("mpi", 3, 4, 0)),
])  # fmt: skip
def test_detects_the_launcher_from_the_environment(env, want):
    assert detect_launcher(env) == want


@pytest.mark.parametrize(("env", "message"), [
    ({"RANK": "0"}, "RANK is set but WORLD_SIZE is not"),
    ({"WORLD_SIZE": "2"}, "WORLD_SIZE is set but RANK is not"),
    ({**TORCHRUN, "RANK": "4"}, "RANK=4 is not within WORLD_SIZE=4"),
    ({**TORCHRUN, "RANK": "-1"}, "RANK=-1 is not within WORLD_SIZE=4"),
    ({**TORCHRUN, "WORLD_SIZE": "0", "RANK": "0"}, "WORLD_SIZE=0 must be at least 1"),
    ({**TORCHRUN, "RANK": "one"}, "RANK='one' is not an integer"),
    ({**TORCHRUN, "MASTER_PORT": "99999"}, "MASTER_PORT=99999 is not a port"),
    ({k: v for k, v in TORCHRUN.items() if k != "MASTER_ADDR"}, "MASTER_ADDR is not set"),
    ({**HYDRA, "PMI_RANK": "3"}, "PMI_RANK=3 is not within PMI_SIZE=3"),
    ({"PMI_RANK": "0"}, "PMI_SIZE is not set"),
    ({**SRUN, "SLURM_PROCID": "4"}, "SLURM_PROCID=4 is not within SLURM_STEP_NUM_TASKS=4"),
    ({k: v for k, v in SRUN.items() if k != "SLURM_JOB_ID"}, "SLURM_JOB_ID is not set"),
    ({k: v for k, v in SRUN.items() if "NODELIST" not in k}, "SLURM_STEP_NODELIST"),
    ({**SRUN, "SLURM_STEP_ID": "batch"}, "SLURM_STEP_ID='batch' is not an integer"),
    ({"SOLAR_LAUNCHER": "slurm"}, "SOLAR_LAUNCHER='slurm': expected one of mpi, torchrun"),
    ({"SOLAR_LAUNCHER": "srun"}, "SOLAR_LAUNCHER=srun needs SLURM_PROCID"),
    ({"SOLAR_LAUNCHER": "torchrun"}, "RANK is not set"),
])  # fmt: skip
def test_bad_launcher_variables_are_named(env, message):
    with pytest.raises(SolarError, match=re.escape(message)) as e:
        detect_launcher(env)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(("nodes", "host"), [
    ("node07", "node07"), ("node[07-09,12],gpu1", "node07"), ("a1,b[1-2]", "a1"),
    ("rack[2-3]-n[010,004]", "rack2-n010"), ("gpu[017]", "gpu017"),
])  # fmt: skip
def test_first_host_of_a_slurm_node_list(nodes, host):
    assert first_host(nodes) == host


def test_srun_ports_differ_across_steps_and_jobs_and_avoid_ephemeral_ports():
    ports = {srun_port(job, step) for job in range(1000, 1100) for step in range(4)}
    assert len(ports) == 400 and all(1024 < p < 32768 for p in ports)


def test_one_process_gets_a_torch_comm_and_never_initialises_mpi():
    """No launcher: world size 1 and a TorchComm whose collectives mirror mpi4py's (their
    tensors held until torch lets go); importing solar and initialising it leaves MPI alone
    (importing mpi4py.MPI would initialise it)."""
    code = """
import sys
import numpy as np
import solar, solar.bench, solar.cli, solar.dist, solar.loader
from solar import dist
d = dist.init()
c = d.comm
assert (d.launcher, d.rank, d.world_size, type(c).__name__) == ("none", 0, 1, "TorchComm")
assert c.allgather({"a": 1}) == [{"a": 1}] and c.bcast(7) == 7 and c.gather("x") == ["x"]
assert dist.allreduce(c, 3) == 3 and isinstance(dist.allreduce(c, 3), int)
assert dist.allreduce(c, np.array([1.5, -2.0]), dist.MAX).tolist() == [1.5, -2.0]
c.Barrier()
dist.agree(c, "fingerprint", "the plan")
# The collectives' tensors stay Python's until gloo's threads let go (else a late release at
# exit aborts the rank); at exit, solar waits for that.
from solar import _held_tensors
assert _held_tensors._held
_held_tensors.wait_for_release()
assert _held_tensors._held == []
assert "mpi4py" not in sys.modules, "mpi4py imported"  # solar works without it installed
print("ok")
"""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env["SOLAR_LAUNCHER"] = "none"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=env, check=False)  # fmt: skip
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_allreduce_combines_like_mpi_for_numbers_and_arrays():
    """TorchComm.allreduce's reduction over gathered values, with a stand-in for the gather."""
    from solar.dist import MAX, SUM, TorchComm, allreduce

    comm = TorchComm.__new__(TorchComm)  # no process group: only the reduction is under test
    values = [np.array([1, 5]), np.array([4, 2]), np.array([3, 3])]
    comm.allgather = lambda _: values
    assert comm.allreduce(None, SUM).tolist() == [8, 10]
    assert comm.allreduce(None, MAX).tolist() == [4, 5]
    comm.allgather = lambda _: [2.5, 7, 1]
    assert comm.allreduce(None, SUM) == 10.5 and comm.allreduce(None, MAX) == 7
    assert allreduce(None, 4.0, MAX) == 4.0
    with pytest.raises(SolarError, match=r"op must be solar\.dist\.SUM or solar\.dist\.MAX"):
        allreduce(comm, 1, "min")


def test_ranks_here_reads_each_launchers_local_size():
    from solar.launch import ranks_here

    assert ranks_here({}) == 1
    assert ranks_here({"LOCAL_WORLD_SIZE": "4"}) == 4  # torchrun
    assert ranks_here({"OMPI_COMM_WORLD_LOCAL_SIZE": "3"}) == 3  # Open MPI
    assert ranks_here({"MPI_LOCALNRANKS": "2"}) == 2  # MPICH hydra
    assert ranks_here({"SLURM_NTASKS_PER_NODE": "8(x2)"}) == 8  # Slurm, 2 nodes of 8
    assert ranks_here({"LOCAL_WORLD_SIZE": "junk"}) == 1
