"""Which launcher started this process, and its place in the job, from the environment alone.

A pure function of the environment (no MPI, no torch), so that :func:`solar.dist.init` can
decide *before* importing ``mpi4py.MPI`` (which initialises MPI: in a torchrun process that makes
a world of one). The rules, in order:

1. ``SOLAR_LAUNCHER=mpi|torchrun|srun|none`` forces a launcher.
2. torchrun (or any ``env://`` launcher): ``RANK`` and ``WORLD_SIZE`` are set, with
   ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``. They win over Slurm's variables, since a
   torchrun started by srun on each node gives its workers the right ones.
3. mpiexec/mpirun: MPICH hydra's ``PMI_RANK``/``PMI_SIZE`` or Open MPI's
   ``OMPI_COMM_WORLD_RANK``/``OMPI_COMM_WORLD_SIZE``. Under Slurm both kinds appear in two cases:
   srun launching tasks directly with a PMI plugin sets ``PMI_RANK`` equal to ``SLURM_PROCID``
   (then srun is the launcher), while mpiexec inside an allocation starts its daemons with srun,
   so its ranks inherit a daemon's ``SLURM_PROCID``, which differs (then MPI is).
4. srun: ``SLURM_PROCID`` with ``SLURM_STEP_NUM_TASKS`` (or ``SLURM_NTASKS``) and
   ``SLURM_LOCALID``. Ranks meet over torch.distributed, not MPI (no mpi4py needed, and no
   dependence on the cluster's PMI): at ``MASTER_ADDR`` or else the first host of the step's node
   list (task 0 runs there), on ``MASTER_PORT`` or else a port derived from ``SLURM_JOB_ID`` and
   ``SLURM_STEP_ID``, the same on every task. Set ``SOLAR_LAUNCHER=mpi`` to use MPI under srun.
   A batch script run without srun also has ``SLURM_PROCID=0`` and the job's ``SLURM_NTASKS``:
   launch the script with srun, or set ``SOLAR_LAUNCHER=none``.
5. Otherwise one process: world size 1.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from solar.errors import SolarError

LAUNCHERS = ("mpi", "torchrun", "srun", "none")

# (rank, size, local rank) variables of the MPI launchers, most common first.
_MPI_VARS = (
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),  # MPICH hydra (and Intel MPI)
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),  # Open MPI
)
# Ports derived for srun lie below Linux's ephemeral range (32768-60999), where no outgoing
# connection can hold them.
_PORT_BASE, _PORT_SPAN = 15000, 15000


@dataclass(frozen=True)
class Launch:
    """How this process was launched and its place in the job.

    ``master_addr``/``master_port`` are where torch.distributed's ranks meet (None under MPI,
    which agrees on an address itself, and for a single process). Under MPI the numbers are the
    launcher's and MPI's own have the last word.
    """

    kind: str  # one of LAUNCHERS
    rank: int
    world_size: int
    local_rank: int
    master_addr: str | None = None
    master_port: int | None = None


def detect_launcher(environ: Mapping[str, str] | None = None) -> Launch:
    """The launcher of this process and its rank, world size and rendezvous, from ``environ``.

    ``environ`` defaults to ``os.environ``. Raises :class:`SolarError` naming the variable when
    the launcher's variables are incomplete or inconsistent (``RANK`` without ``WORLD_SIZE``,
    ``RANK`` ≥ ``WORLD_SIZE``, a non-integer, ...).
    """
    env = os.environ if environ is None else environ
    forced = env.get("SOLAR_LAUNCHER", "").strip().lower()
    if forced and forced not in LAUNCHERS:
        raise SolarError(
            f"SOLAR_LAUNCHER={env['SOLAR_LAUNCHER']!r}: expected one of {', '.join(LAUNCHERS)}"
        )
    kind = forced or _guess(env)
    if kind == "torchrun":
        return _torchrun(env)
    if kind == "srun":
        return _srun(env)
    if kind == "mpi":
        return _mpi(env)
    return Launch("none", 0, 1, 0)


def _guess(env: Mapping[str, str]) -> str:
    if "RANK" in env or "WORLD_SIZE" in env:
        return "torchrun"
    mpi = next((v for v in _MPI_VARS if v[0] in env or v[1] in env), None)
    size_var = _slurm_size_var(env)
    srun = "SLURM_PROCID" in env and size_var is not None
    if mpi and size_var is not None and srun:
        size = env[size_var]
        same = env.get(mpi[0]) == env["SLURM_PROCID"] and env.get(mpi[1]) == size
        return "srun" if same else "mpi"
    return "mpi" if mpi else "srun" if srun else "none"


def _torchrun(env: Mapping[str, str]) -> Launch:
    for have, need in (("RANK", "WORLD_SIZE"), ("WORLD_SIZE", "RANK")):
        if have in env and need not in env:
            raise SolarError(f"{have} is set but {need} is not (torchrun sets both)")
    rank, world = _rank_and_size(env, "RANK", "WORLD_SIZE")
    local = _int(env, "LOCAL_RANK", 0)
    if world == 1:
        return Launch("torchrun", rank, world, local)
    for var in ("MASTER_ADDR", "MASTER_PORT"):
        if not env.get(var):
            raise SolarError(f"WORLD_SIZE={world} but {var} is not set (torchrun sets it)")
    return Launch("torchrun", rank, world, local, env["MASTER_ADDR"], _port(env, "MASTER_PORT"))


def _srun(env: Mapping[str, str]) -> Launch:
    size_var = _slurm_size_var(env)
    if "SLURM_PROCID" not in env or size_var is None:
        raise SolarError(
            "SOLAR_LAUNCHER=srun needs SLURM_PROCID and SLURM_STEP_NUM_TASKS or SLURM_NTASKS"
        )
    rank, world = _rank_and_size(env, "SLURM_PROCID", size_var)
    local = _int(env, "SLURM_LOCALID", 0)
    if world == 1:
        return Launch("srun", rank, world, local)
    addr = env.get("MASTER_ADDR")
    if not addr:
        lists = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
        nodes = next((env[v] for v in lists if env.get(v)), None)
        if nodes is None:
            raise SolarError(f"srun: none of {', '.join(lists)} or MASTER_ADDR is set")
        addr = first_host(nodes)
    if env.get("MASTER_PORT"):
        port = _port(env, "MASTER_PORT")
    elif env.get("SLURM_JOB_ID"):
        port = srun_port(_int(env, "SLURM_JOB_ID"), _int(env, "SLURM_STEP_ID", 0))
    else:
        raise SolarError("srun: SLURM_JOB_ID is not set, and no MASTER_PORT either")
    return Launch("srun", rank, world, local, addr, port)


def _mpi(env: Mapping[str, str]) -> Launch:
    for rank_var, size_var, local_var in _MPI_VARS:
        if rank_var in env or size_var in env:
            rank, world = _rank_and_size(env, rank_var, size_var)
            return Launch("mpi", rank, world, _int(env, local_var, 0))
    # Forced, with no launcher variables (srun --mpi=pmix, say): MPI itself will tell.
    return Launch("mpi", 0, 1, 0)


def _slurm_size_var(env: Mapping[str, str]) -> str | None:
    # The step's task count: SLURM_NTASKS may describe the whole allocation.
    return next((v for v in ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS") if v in env), None)


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list: ``node[07-09,12],gpu1`` → ``node07``."""
    depth, end = 0, len(nodelist)
    for i, c in enumerate(nodelist):
        depth += (c == "[") - (c == "]")
        if c == "," and depth == 0:
            end = i
            break
    host = re.sub(r"\[([^\]]*)\]", lambda m: re.split(r"[,-]", m.group(1))[0], nodelist[:end])
    if not host or "[" in host or "]" in host:
        raise SolarError(f"cannot read a host from the Slurm node list {nodelist!r}")
    return host.strip()


def srun_port(job_id: int, step_id: int) -> int:
    """The rendezvous port of a Slurm job step: the same on every task, distinct across steps."""
    return _PORT_BASE + (job_id * 16 + step_id) % _PORT_SPAN


def _rank_and_size(env: Mapping[str, str], rank_var: str, size_var: str) -> tuple[int, int]:
    rank, world = _int(env, rank_var), _int(env, size_var)
    if world < 1:
        raise SolarError(f"{size_var}={world} must be at least 1")
    if not 0 <= rank < world:
        raise SolarError(f"{rank_var}={rank} is not within {size_var}={world}")
    return rank, world


def _int(env: Mapping[str, str], var: str, default: int | None = None) -> int:
    text = env.get(var)
    if text is None or (text.strip() == "" and default is not None):
        if default is None:
            raise SolarError(f"{var} is not set")
        return default
    try:
        return int(text)
    except ValueError:
        raise SolarError(f"{var}={text!r} is not an integer") from None


def _port(env: Mapping[str, str], var: str) -> int:
    port = _int(env, var)
    if not 0 < port < 65536:
        raise SolarError(f"{var}={port} is not a port number (1-65535)")
    return port


# How many ranks the launcher started on this host, by launcher: torchrun, Open MPI, MPICH
# hydra, Slurm (``SLURM_NTASKS_PER_NODE`` may read "4(x2)": its leading count).
_LOCAL_SIZES = ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS",
                "SLURM_NTASKS_PER_NODE")  # fmt: skip


def ranks_here(env: Mapping[str, str] | None = None) -> int:
    """The ranks the launcher started on this host (1 outside a launch or where it does not
    say): no collective, so a memory check made before any communicator exists can count the
    copies every local rank will make."""
    env = os.environ if env is None else env
    for name in _LOCAL_SIZES:
        m = re.match(r"\s*(\d+)", env.get(name, ""))
        if m and int(m.group(1)) > 0:
            return int(m.group(1))
    return 1
