"""MPI and torch.distributed glue: ranks from mpirun, one process group, exact gradients.

Launch with ``mpiexec -n P python train.py`` (the PyPI ``mpich`` wheel's mpiexec needs no
system MPI); a plain ``python train.py`` is world size 1. :func:`init` finds rank and world
size from MPI, agrees on a rendezvous address over MPI and initialises torch.distributed (gloo
on CPU, nccl with CUDA). It also makes an uncaught exception on any rank abort the whole job
(``MPI_Abort``), so that no rank waits forever in a collective for a peer that died.
"""

from __future__ import annotations

import contextlib
import datetime
import secrets
import socket
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from solar.errors import SolarError


@dataclass(frozen=True)
class Dist:
    """This process's place in the job."""

    rank: int
    world_size: int
    local_rank: int
    comm: Any  # mpi4py communicator
    backend: str

    @property
    def is_root(self) -> bool:
        return self.rank == 0


_state: Dist | None = None


def init(backend: str | None = None, timeout_s: float = 120.0) -> Dist:
    """Initialise MPI and torch.distributed once per process and return this rank's place."""
    global _state
    if _state is not None:
        return _state
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    install_abort_on_error(comm)
    rank, world = comm.Get_rank(), comm.Get_size()
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    local_rank = local.Get_rank()
    local.Free()

    import torch
    import torch.distributed as td

    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
    address = comm.bcast(_rendezvous() if rank == 0 else None, root=0)
    if not td.is_initialized():
        td.init_process_group(
            backend,
            init_method=f"tcp://{address[0]}:{address[1]}",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
    # torch wraps sys.excepthook in init_process_group (capturing stderr while it runs the
    # previous hook); ours must be outermost, or its message is swallowed before the abort.
    install_abort_on_error(comm)
    _state = Dist(rank, world, local_rank, comm, backend)
    return _state


def _rendezvous() -> tuple[str, int]:
    """An address of rank 0's host and a free port on it."""
    host = socket.gethostname()
    try:
        addr = socket.gethostbyname(host)
    except OSError:
        addr = "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    return addr, port


def install_abort_on_error(comm: Any) -> None:
    """Make an uncaught exception print its traceback and abort every rank of ``comm``."""
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        if comm.Get_size() > 1:
            abort(comm, (exc_type, exc, tb))
        previous(exc_type, exc, tb)

    sys.excepthook = hook


def abort(comm: Any, exc_info: tuple | None = None) -> None:
    """Print the current (or given) error with this rank's number, then abort every rank."""
    exc_type, exc, tb = exc_info or sys.exc_info()
    rank = comm.Get_rank()
    err = sys.__stderr__ or sys.stderr  # the real one, whatever a library put in sys.stderr
    if exc_type is not None and issubclass(exc_type, SolarError):
        err.write(f"solar: rank {rank}: error: {exc}\n")
    elif exc_type is not None:
        err.write(f"solar: rank {rank} failed:\n")
        traceback.print_exception(exc_type, exc, tb, file=err)
    err.flush()
    # Give the launcher's proxy a moment to forward this output: MPI_Abort kills it too.
    time.sleep(0.5)
    comm.Abort(1)


@contextlib.contextmanager
def abort_job_on_error(comm: Any) -> Iterator[None]:
    """Abort every rank of ``comm`` (size > 1) if the block raises, so none waits for this one."""
    try:
        yield
    except Exception:
        if comm is not None and comm.Get_size() > 1:
            abort(comm)
        raise


def agree(comm: Any, value: Any, what: str) -> None:
    """Stop unless every rank of ``comm`` holds the same ``value`` (a collective: all must call).

    ``comm`` is None or anything with ``Get_size`` and ``allgather`` (an mpi4py communicator).
    """
    if comm is None or comm.Get_size() <= 1:
        return
    values = comm.allgather(value)
    bad = [r for r, v in enumerate(values) if v != values[0]]
    if bad:
        raise SolarError(f"ranks disagree on {what}: ranks {bad} differ from rank 0")


def shared_key(comm: Any) -> int:
    """A random 64-bit number, the same on every rank of ``comm`` (a collective)."""
    key = secrets.randbits(64)
    if comm is not None and comm.Get_size() > 1:
        key = comm.bcast(key, root=0)
    return key


def scale_loss(loss_sum: Any, global_batch: int, world_size: int | None = None) -> Any:
    """The loss to backpropagate so that DDP's gradient average is the global mean's gradient.

    ``loss_sum`` is the *sum* of per-sample losses over this rank's local batch, whatever its
    size; ``global_batch`` is the number of samples in the step over all ranks (the loader's
    ``global_batch``). DDP averages gradients over P ranks, so each rank contributes
    ``loss_sum · P / global_batch`` and the average is ∇ (Σ_all losses / global_batch).
    """
    if global_batch <= 0:
        raise SolarError(f"global_batch must be positive, got {global_batch}")
    if world_size is None:
        import torch.distributed as td

        world_size = td.get_world_size() if td.is_initialized() else 1
    return loss_sum * (world_size / global_batch)
