"""Ranks from any launcher, one torch.distributed process group, abort on error, exact gradients.

The same script runs under every launcher::

    mpiexec -n 4 python train.py            # the PyPI mpich wheel's mpiexec needs no system MPI
    torchrun --nproc_per_node 4 train.py
    srun -n 4 python train.py
    python train.py                         # world size 1

:func:`init` reads the launcher from the environment first (:mod:`solar.launch`) and imports
mpi4py only under MPI: importing ``mpi4py.MPI`` initialises MPI, and in a torchrun process that
makes a world of one. Under MPI, ``Dist.comm`` is ``MPI.COMM_WORLD`` and the ranks agree over MPI
on torch.distributed's rendezvous; under torchrun and srun (and for one process) it is a
:class:`TorchComm`, mpi4py's few collectives over torch.distributed. ``Loader(..., comm=...)``
takes either, and :func:`allreduce` with :data:`SUM` or :data:`MAX` works on both.

An uncaught exception on any rank ends the whole job promptly: under MPI with ``MPI_Abort``;
otherwise the failing rank tells every other rank through torch.distributed's store (each rank
has a thread waiting for that word) and they all exit with status 1, so no rank waits in a
collective for a dead peer. A rank killed outright (SIGKILL, out of memory) is the launcher's to
handle: torchrun's agent stops the others, srun does with ``--kill-on-bad-exit``; otherwise the
peers fail at the collective timeout (``timeout_s``).
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import functools
import operator
import os
import pickle
import secrets
import socket
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from solar._held_tensors import hold
from solar._process import poll, run_abort_hooks
from solar.errors import SolarError, first_line
from solar.host.place import place
from solar.launch import Launch, detect_launcher

# The public surface (docs/api.md, the guides and examples); the rest serves solar itself.
__all__ = [
    "MAX",
    "SUM",
    "Dist",
    "TorchComm",
    "allreduce",
    "detect_launcher",
    "init",
    "install_abort_on_error",
    "job_comm",
    "scale_loss",
]

SUM = "sum"  # reduction operations of allreduce, for either kind of comm
MAX = "max"


@dataclass(frozen=True)
class Dist:
    """This process's place in the job."""

    rank: int
    world_size: int
    local_rank: int
    comm: Any  # mpi4py communicator under MPI, else a TorchComm
    backend: str
    launcher: str  # mpi, torchrun, srun or none

    @property
    def is_root(self) -> bool:
        return self.rank == 0


_state: Dist | None = None
_aborting = False  # this process is reporting its own failure and ending the job


def init(backend: str | None = None, timeout_s: float = 120.0) -> Dist:
    """Find this process's launcher and rank, initialise torch.distributed once, return the place.

    ``backend`` defaults to nccl with CUDA, else gloo; ``timeout_s`` bounds the rendezvous and
    every collective. Also makes an uncaught exception on any rank end the whole job.
    """
    global _state
    if _state is not None:
        return _state
    launch = detect_launcher()
    if launch.kind == "mpi":
        _state = _init_mpi(backend, timeout_s)
    else:
        _state = _init_torch(launch, backend, timeout_s)
    # torch wraps sys.excepthook in init_process_group (capturing stderr while it runs the
    # previous hook); ours must be outermost, or its message is swallowed before the abort.
    install_abort_on_error(_state.comm)
    return _state


def job_comm(comm: Any = None, rank: int | None = None, world_size: int | None = None) -> Any:
    """The communicator of a Loader built without one, found as DistributedSampler finds its
    process group: :func:`init`'s; the initialised torch.distributed default group; an MPI
    world of more than one process (mpiexec). ``comm`` if given, and none where the caller
    places the rank itself (``rank``/``world_size``: a plan made offline, ranks simulated in
    one process). None for a process alone. A job its launcher says has several ranks, none
    of which can be had, is refused in one line: a Loader never runs as world 1 there; so is
    a ``rank``/``world_size`` that contradicts the job's initialised group."""
    if comm is not None:
        return comm
    if rank is not None or world_size is not None:
        _check_place(rank, world_size)
        return None
    if _state is not None and _state.world_size > 1:
        return _state.comm
    import torch.distributed as td

    if td.is_available() and td.is_initialized() and td.get_world_size() > 1:
        return TorchComm()
    launch = detect_launcher()
    if launch.world_size <= 1:
        return None
    where = f"launched by {launch.kind} as rank {launch.rank} of {launch.world_size}"
    if launch.kind == "mpi":
        try:
            from mpi4py import MPI
        except ImportError:
            raise SolarError(f"{where} but mpi4py is not installed: pip install 'solar[mpich]', "
                             "or pass comm=") from None  # fmt: skip
        if MPI.COMM_WORLD.Get_size() == launch.world_size:
            unname_mpi_segments(place(MPI.COMM_WORLD).machine_comm)
            return MPI.COMM_WORLD
        raise SolarError(f"{where} but MPI's world has {MPI.COMM_WORLD.Get_size()} (mpi4py "
                         "built for another MPI than mpiexec's?): pass comm=")  # fmt: skip
    raise SolarError(f"{where} but torch.distributed is not initialised: call solar.dist.init() "
                     "(or torch.distributed.init_process_group) first, or pass comm= (one "
                     "process, e.g. a batch script outside srun: SOLAR_LAUNCHER=none or "
                     "rank=0, world_size=1)")  # fmt: skip


def _check_place(rank: int | None, world_size: int | None) -> None:
    """Refuse in one line a place given by hand (``rank``/``world_size``, no comm) that the
    job's initialised group contradicts: another world size, or another rank in it (two ranks
    saying rank 0 would serve the same samples twice; world_size=3 of 2 would never serve a
    third). ``rank=0, world_size=1`` (or rank alone 0) is this process alone, e.g. a validation
    loader of rank 0: accepted in any job. Without a group, any place is the caller's. A part
    of the job (a model-parallel job's data-parallel ranks, whose tensor-parallel peers serve
    the same samples) is given by its communicator, not by hand: the message names
    ``TorchComm(group=dp_group)`` and MPI's ``Split``."""
    r_given = 0 if rank is None else rank
    w_given = 1 if world_size is None else world_size
    if (r_given, w_given) == (0, 1):
        return
    found = _group_place()
    if found is None or (r_given, w_given) == found[:2]:
        return
    r, w, who = found
    given = ", ".join(f"{k}={v}" for k, v in (("rank", rank), ("world_size", world_size))
                      if v is not None)  # fmt: skip
    if rank is None:
        given += " (rank 0 by default)"
    raise SolarError(f"{given} but {who} says rank {r} of {w}: pass neither (or comm=) to "
                     "use it, rank=0, world_size=1 for this process alone, or a part's "
                     "communicator for a part of the job (the data-parallel ranks of a "
                     "model-parallel job: comm=solar.dist.TorchComm(group=dp_group), or an "
                     "MPI sub-communicator, comm.Split(...))")  # fmt: skip


def _group_place() -> tuple[int, int, str] | None:
    """This process's (rank, world size, who says so) in the job's initialised group of
    several ranks: :func:`init`'s, torch.distributed's default group or MPI's world (if this
    process initialised MPI: mpi4py is never imported here, that would initialise it)."""
    if _state is not None and _state.world_size > 1:
        who = "MPI's world" if _state.launcher == "mpi" else "the process group"
        return _state.rank, _state.world_size, who
    import torch.distributed as td

    if td.is_available() and td.is_initialized() and td.get_world_size() > 1:
        return td.get_rank(), td.get_world_size(), "the process group"
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        world = mpi.COMM_WORLD
        if world.Get_size() > 1:
            return world.Get_rank(), world.Get_size(), "MPI's world"
    return None


def _init_mpi(backend: str | None, timeout_s: float) -> Dist:
    try:
        from mpi4py import MPI
    except ImportError:
        raise SolarError(
            "launched by mpiexec (or SOLAR_LAUNCHER=mpi) but mpi4py is not installed: "
            "pip install 'solar[mpich]' (or 'solar[mpi]' to build it for the MPI you have)"
        ) from None
    comm = MPI.COMM_WORLD
    install_abort_on_error(comm)
    rank, world = comm.Get_rank(), comm.Get_size()
    machine = place(comm)  # (the machine's ranks, whatever SOLAR_HOSTS groups: devices)
    local_rank = machine.machine_rank
    unname_mpi_segments(machine.machine_comm)
    backend = _backend(backend, local_rank)
    import torch.distributed as td

    address = comm.bcast(_rendezvous() if rank == 0 else None, root=0)
    if not td.is_initialized():
        td.init_process_group(
            backend,
            init_method=f"tcp://{address[0]}:{address[1]}",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
    return Dist(rank, world, local_rank, comm, backend, "mpi")


_MPICH_SHM = "mpich_shm_"
_unnamed = False


def unname_mpi_segments(local: Any) -> None:
    """Remove the names of MPICH's shared memory in /dev/shm, once every rank of this host
    (``local``, their communicator, ``Place.machine_comm``: solar.host.place; a collective)
    has it mapped.

    MPICH removes them in ``MPI_Finalize`` only: a job ended by ``MPI_Abort`` (solar's abort
    on error) or a killed rank leaves a few MB there per host until reboot. Mapped, the memory
    stays the ranks' until they end, name or not. Once per process; nothing for other MPIs.
    """
    global _unnamed
    if _unnamed or local is None:
        return
    _unnamed = True
    try:
        with open("/proc/self/maps") as f:
            names = {line.split("/dev/shm/", 1)[1].split()[0] for line in f
                     if "/dev/shm/" + _MPICH_SHM in line}  # fmt: skip
    except OSError:  # pragma: no cover - not Linux
        names = set()
    local.Barrier()  # every rank of the host is past MPI_Init, so has the segments mapped
    if local.Get_rank() == 0:
        for name in names:
            with contextlib.suppress(OSError):
                os.unlink(f"/dev/shm/{name}")


def _init_torch(launch: Launch, backend: str | None, timeout_s: float) -> Dist:
    import torch.distributed as td

    backend = _backend(backend, launch.local_rank)
    if td.is_initialized():  # the caller's own process group: use it as it is
        rank, world = td.get_rank(), td.get_world_size()
        return Dist(rank, world, launch.local_rank, TorchComm(), backend, launch.kind)
    timeout = datetime.timedelta(seconds=timeout_s)
    if launch.world_size == 1:
        store, hosts = td.HashStore(), False
    else:
        store, hosts = _store(launch, timeout)
    td.init_process_group(
        backend, store=store, rank=launch.rank, world_size=launch.world_size, timeout=timeout
    )
    # Keys of this attempt only: torchrun's agent keeps its store across restarts.
    prefix = f"solar/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
    comm = TorchComm(store if launch.world_size > 1 else None, prefix, hosts)
    return Dist(launch.rank, launch.world_size, launch.local_rank, comm, backend, launch.kind)


def _backend(backend: str | None, local_rank: int) -> str:
    import torch

    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
    return backend


def _store(launch: Launch, timeout: datetime.timedelta) -> tuple[Any, bool]:
    """The job's TCPStore (where ranks meet), and whether this process serves it."""
    import torch.distributed as td

    # torchrun's agent already serves a store at MASTER_ADDR:MASTER_PORT; otherwise rank 0 does.
    hosts = launch.rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
    where = f"{launch.master_addr}:{launch.master_port}"
    assert launch.master_addr is not None and launch.master_port is not None
    try:
        store = td.TCPStore(
            launch.master_addr, launch.master_port, launch.world_size, hosts, timeout=timeout
        )
    except (RuntimeError, OSError) as exc:
        reason = first_line(exc)
        raise SolarError(
            f"{launch.kind}: rank {launch.rank} of {launch.world_size} did not meet the others at "
            f"{where} within {timeout.total_seconds():.0f} s ({reason}); set MASTER_ADDR and "
            "MASTER_PORT, or SOLAR_LAUNCHER (see solar.launch)"
        ) from None
    return store, hosts


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


_FOREVER = datetime.timedelta(days=365)
_EXIT = "exit"  # the word that wakes a rank's abort watcher at a normal exit
_LINGER_S = 10.0  # how long the rank serving the store waits at exit for the others


# A freed TorchComm's group: torch refuses it in any collective (None would mean the job's).
_FREED = object()


class TorchComm:
    """mpi4py's few collectives that solar and its examples use, over torch.distributed.

    ``dist.init()`` returns one as ``comm`` under torchrun, srun and for a single process. The
    object collectives pickle, as mpi4py's lower-case methods do; ``gather`` returns the list on
    ``root`` and None elsewhere; ``allreduce`` takes numbers or numpy arrays and :data:`SUM` or
    :data:`MAX`. Given the job's ``store`` (a TCPStore; ``prefix`` for solar's keys in it,
    ``hosts_store`` if this process serves it), ``Abort`` ends every rank, not only this one:
    each rank runs a thread waiting in the store for a failing rank's word.
    """

    def __init__(
        self,
        store: Any = None,
        prefix: str = "solar/",
        hosts_store: bool = False,
        *,
        group: Any = None,
        parent: TorchComm | None = None,
    ) -> None:
        import torch
        import torch.distributed as td

        self._td, self._torch = td, torch
        # ``group``: a process group of some of the job's ranks (its ``parent``'s: the job's
        # comm, which ends the job on Abort); None: the default group.
        self._group, self._parent = group, parent
        self._groups: list[list[int]] | None = None  # (split_hosts': every host's ranks)
        self._rank, self._size = td.get_rank(group), td.get_world_size(group)
        # Where the object collectives' tensors live: NCCL moves only CUDA memory.
        self._device = torch.device("cpu")
        if td.get_backend(group) == "nccl":
            self._device = torch.device("cuda", torch.cuda.current_device())
        self._store, self._prefix = store, prefix
        self._peer_failed: int | None = None  # the rank whose failure is ending the job
        self._store_lost = False
        if store is not None and self._size > 1 and parent is None:
            self._watch(hosts_store)

    @property
    def group_key(self) -> tuple[str | None, Any]:
        """The process group whose ranks this communicator names, resolved now (a default
        group's TorchComm made before a re-init names the new one), with its scope: "torch"
        for the default group, one live at a time (solar.host.place memoises a place per
        group, and drops a re-initialised job's)."""
        if self._group is not None:
            return None, self._group
        return "torch", self._td.group.WORLD

    @property
    def peer_failed(self) -> int | None:
        """The rank whose failure is ending the job (None: none seen)."""
        return self._parent.peer_failed if self._parent is not None else self._peer_failed

    def split_hosts(self, groups: list[list[int]]) -> TorchComm:
        """This rank's communicator among ``groups`` (every rank of this one in exactly one,
        listed in the same order on every rank: a collective), over gloo groups of their own
        (CPU tensors, whatever the job's backend)."""
        td = self._td
        if self._group is not None:
            raise SolarError("TorchComm.split_hosts: only the job's communicator splits")
        mine, _ = td.new_subgroups_by_enumeration(groups, backend="gloo")
        made = TorchComm(group=mine, parent=self)
        made._groups = [list(g) for g in groups]
        return made

    def dup(self) -> TorchComm:
        """Another communicator of this one's ranks, over groups of its own (a collective of
        the whole job: a host's communicator is duplicated with every host's)."""
        groups = self._groups
        if self._group is None:
            groups = [list(range(self._size))]
        if groups is None:
            raise SolarError("TorchComm.dup: only the job's or split_hosts' communicators")
        root = self if self._parent is None else self._parent
        return root.split_hosts(groups)

    def Free(self) -> None:
        """Destroy this communicator's group (one of :meth:`split_hosts` or :meth:`dup`; local,
        as MPI's ``Free`` of a duplicate is for its caller); the job's is never freed."""
        if self._parent is None or self._group is None:
            raise SolarError("TorchComm.Free: only split_hosts' or dup's communicators")
        group, self._group = self._group, _FREED
        self._td.destroy_process_group(group)

    def allgather_ints(self, values: np.ndarray, wait: Any = None) -> np.ndarray:
        """Every rank's int64 ``values`` (one row per rank), without pickling; ``wait``: called
        every few milliseconds until the collective completes."""
        torch = self._torch
        mine = torch.from_numpy(np.ascontiguousarray(values, np.int64).copy()).to(self._device)
        every = [torch.empty_like(mine) for _ in range(self._size)]
        work = self._td.all_gather(every, mine, group=self._group, async_op=True)
        try:
            if wait is not None:
                poll(work.is_completed, wait)
            work.wait()
        finally:  # (given up on, the collective may still write them: held)
            hold(mine, *every)
        return np.stack([t.cpu().numpy() for t in every])

    def Get_rank(self) -> int:
        """This process's rank."""
        return self._rank

    def Get_size(self) -> int:
        """The number of ranks."""
        return self._size

    # The object collectives pickle into tensors of their own (as torch's *_object functions
    # do), held by solar._held_tensors until gloo's threads let go of them: a rank must not
    # abort at exit for a tensor a collective released late (see that module).
    def allgather(self, obj: Any) -> list:
        """Every rank's ``obj``, in rank order, on every rank."""
        sizes, send, n = self._sizes(obj)
        recv = [self._torch.empty(n, dtype=self._torch.uint8, device=self._device)
                for _ in range(self._size)]  # fmt: skip
        self._td.all_gather(recv, send, group=self._group)
        hold(send, *recv)
        return [_unpickle(r, k) for r, k in zip(recv, sizes, strict=True)]

    def bcast(self, obj: Any, root: int = 0) -> Any:
        """``root``'s ``obj`` on every rank."""
        torch = self._torch
        data = self._pickled(obj) if self._rank == root else None
        size = torch.tensor([0 if data is None else data.numel()], device=self._device)
        self._td.broadcast(size, group=self._group, group_src=root)
        if data is None:
            data = torch.empty(int(size.item()), dtype=torch.uint8, device=self._device)
        self._td.broadcast(data, group=self._group, group_src=root)
        hold(size, data)
        return _unpickle(data, data.numel())

    def gather(self, obj: Any, root: int = 0) -> list | None:
        """Every rank's ``obj`` in rank order on ``root``; None on the other ranks."""
        sizes, send, n = self._sizes(obj)
        recv = None
        if self._rank == root:
            recv = [self._torch.empty(n, dtype=self._torch.uint8, device=self._device)
                    for _ in range(self._size)]  # fmt: skip
        self._td.gather(send, recv, group=self._group, group_dst=root)
        hold(send, *(recv or []))
        if recv is None:
            return None
        return [_unpickle(r, k) for r, k in zip(recv, sizes, strict=True)]

    def _pickled(self, obj: Any) -> Any:
        data = self._torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=self._torch.uint8)
        return data.to(self._device)

    def _sizes(self, obj: Any) -> tuple[list[int], Any, int]:
        """Every rank's pickled size; this rank's pickle padded to the largest; that size."""
        torch = self._torch
        data = self._pickled(obj)
        mine = torch.tensor([data.numel()], device=self._device)
        every = [torch.empty_like(mine) for _ in range(self._size)]
        self._td.all_gather(every, mine, group=self._group)
        hold(mine, *every)
        sizes = [int(s.item()) for s in every]
        send = torch.zeros(max(sizes), dtype=torch.uint8, device=self._device)
        send[: data.numel()] = data
        return sizes, send, max(sizes)

    def allreduce(self, value: Any, op: str = SUM) -> Any:
        """``value`` (a number or numpy array) summed or maximised over the ranks."""
        _check_op(op)
        values = self.allgather(value)
        if op == SUM:
            return functools.reduce(operator.add, values)
        if any(isinstance(v, np.ndarray) for v in values):
            return functools.reduce(np.maximum, values)
        return max(values)

    def Barrier(self) -> None:
        """Wait until every rank has called Barrier."""
        self._td.barrier(group=self._group)

    barrier = Barrier

    def Abort(self, errorcode: int = 1) -> None:
        """End this process now with ``errorcode``, and every other rank through the store."""
        if self._parent is not None:
            self._parent.Abort(errorcode)
        if self._store is not None:
            others = [self._key(r) for r in range(self._size) if r != self._rank]
            with contextlib.suppress(Exception):
                self._store.multi_set(others, [str(self._rank)] * len(others))
                # The store may live in this process: give it a moment to deliver the word.
                time.sleep(0.2)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        run_abort_hooks()  # os._exit runs no finaliser
        os._exit(errorcode)

    def _key(self, rank: int) -> str:
        return f"{self._prefix}abort/{rank}"

    def _watch(self, hosts_store: bool) -> None:
        client = self._store.clone()  # its own connection: the main thread may use the store
        key = self._key(self._rank)

        def watch() -> None:
            try:
                client.wait([key], _FOREVER)
                word = client.get(key).decode()
            except Exception:  # the store is gone (its host ended): nothing left to watch
                self._store_lost = True
                return
            if word != _EXIT and not _aborting:
                self._peer_failed = int(word)
                err = sys.__stderr__ or sys.stderr
                err.write(f"solar: rank {self._rank}: ending: rank {word} failed\n")
                err.flush()
                run_abort_hooks()
                # Let the failing rank end first, so that the launcher names it as the cause.
                time.sleep(1.0)
                os._exit(1)

        thread = threading.Thread(target=watch, name="solar-abort-watch", daemon=True)
        thread.start()
        atexit.register(self._stop_watching, thread, hosts_store, os.getpid())

    def _stop_watching(self, thread: threading.Thread, hosts_store: bool, pid: int) -> None:
        # Wake the watcher while the interpreter can still run it: a thread blocked in C++ that
        # wakes during finalisation may take the process down with it. A forked child inherits
        # this handler but not the thread, and must not wake its parent's.
        if self._store_lost or os.getpid() != pid:
            return
        with contextlib.suppress(Exception):
            self._store.set(self._key(self._rank), _EXIT)
            thread.join(5)
            done = self._store.add(f"{self._prefix}exited", 1)
            # A store served by this process vanishes with it: stay a little, until every rank
            # has stopped watching it (harmless otherwise, but torch logs each lost connection).
            deadline = time.monotonic() + _LINGER_S
            while hosts_store and done < self._size and time.monotonic() < deadline:
                time.sleep(0.05)
                done = self._store.add(f"{self._prefix}exited", 0)


def _unpickle(data: Any, size: int) -> Any:
    """The object pickled in the first ``size`` bytes of ``data`` (a uint8 tensor)."""
    return pickle.loads(data[:size].cpu().numpy().tobytes())


def allreduce(comm: Any, value: Any, op: str = SUM) -> Any:
    """``value`` (a number or numpy array) summed (:data:`SUM`) or maximised (:data:`MAX`) over
    every rank of ``comm``: an mpi4py communicator, a :class:`TorchComm`, or None (one process).
    """
    _check_op(op)
    if comm is None:
        return value
    if type(comm).__module__.startswith("mpi4py"):
        from mpi4py import MPI

        mpi_op = MPI.SUM if op == SUM else MPI.MAX
        if isinstance(value, np.ndarray):
            # mpi4py's pickling allreduce applies max() to whole arrays, which numpy refuses.
            value = np.ascontiguousarray(value)
            out = np.empty_like(value)
            comm.Allreduce(value, out, op=mpi_op)
            return out
        return comm.allreduce(value, op=mpi_op)
    return comm.allreduce(value, op=op)


def _check_op(op: Any) -> None:
    if op not in (SUM, MAX):
        raise SolarError(f"allreduce: op must be solar.dist.SUM or solar.dist.MAX, got {op!r}")


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
    if getattr(comm, "peer_failed", None) is not None:
        # Another rank failed first and this error follows from it (its exit broke a
        # collective): one traceback tells the story, and the abort watcher is ending this
        # process just after the failing one (so the launcher names that one as the cause).
        run_abort_hooks()
        time.sleep(5)
        os._exit(1)
    global _aborting
    if _aborting:
        # Its error is printed and the job's abort issued: the hooks wrapping one another (and
        # an abort that returns while the launcher ends the job) must not print it again.
        os._exit(1)
    _aborting = True
    exc_type, exc, tb = exc_info or sys.exc_info()
    rank = comm.Get_rank()
    err = sys.__stderr__ or sys.stderr  # the real one, whatever a library put in sys.stderr
    if exc_type is not None and issubclass(exc_type, SolarError):
        err.write(f"solar: rank {rank}: error: {exc}\n")
    elif exc_type is not None:
        err.write(f"solar: rank {rank} failed:\n")
        traceback.print_exception(exc_type, exc, tb, file=err)
    err.flush()
    run_abort_hooks()  # what this process started ends with it (MPI_Abort runs no finaliser)
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

    ``comm`` is None or anything with ``Get_size`` and ``allgather`` (an mpi4py communicator or
    a :class:`TorchComm`).
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


def scale_loss(loss_sum: Any, count: Any, world_size: int | None = None) -> Any:
    """The loss to backpropagate so that DDP's gradient average is the global mean's gradient.

    ``loss_sum`` is the *sum* of per-sample losses over this rank's local batch, whatever its
    size; ``count`` what the loss averages over in the step on all ranks: a :class:`Loader`
    (its :attr:`~solar.Loader.loss_count`: the step's rows, or a GNN batch's seeds) or that
    number. DDP averages gradients over P ranks, so each rank contributes
    ``loss_sum · P / count`` and the average is ∇ (Σ_all losses / count).
    """
    if hasattr(count, "loss_count"):  # a Loader: its count and world
        world_size = count.world_size if world_size is None else world_size
        count = count.loss_count
    if count <= 0:
        raise SolarError(f"scale_loss: the step's count must be positive, got {count}")
    if world_size is None:
        import torch.distributed as td

        world_size = td.get_world_size() if td.is_initialized() else 1
    return loss_sum * (world_size / count)
