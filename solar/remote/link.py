"""The meeting of trainers and workers, and the pairs they talk over.

Trainer rank 0 serves a TCPStore at the Remote's address; every trainer and worker connects to
it. A worker takes a number (``add``), reads the job (the trainers' plan spec, data and
transform, pickled by rank 0) and the roster (how many workers the trainers took: those that
came within ``join_s``). Each (trainer, worker) pair of :func:`pairs` then makes a gloo process
group of two ranks over its own prefix of the store (trainer 0, worker 1): a dead peer makes
the other side's operations raise, and nothing else. Pairs are made in (trainer, worker)
order on every process, so no two wait for each other.

Messages on a pair: the worker sends each step it owns as a header, int64 ``[step, rows,
digest]`` (the digest of the step's samples and repeats: the trainer refuses a step that is
not its own), then one uint8 tensor per output key; the trainer sends credits, int64
``[position, limit]``: steps below ``position`` are no longer wanted, steps from ``limit`` on
not yet (``position = -1``: the trainer is done).
"""

from __future__ import annotations

import datetime
import hashlib
import pickle
import socket
import time
from typing import Any

import numpy as np

from solar.errors import SolarError, first_line
from solar.remote import Remote

JOB, COUNT, ROSTER = "solar-remote/job", "solar-remote/count", "solar-remote/roster"
DONE = -1  # a credit's position: the trainer serves no more
_FOREVER = datetime.timedelta(days=365)  # a pair's operations: a dead peer raises sooner


def pairs(trainers: int, workers: int) -> list[tuple[int, int]]:
    """The (trainer, worker) pairs, sorted: every worker serves ``trainers / workers`` of them
    (round robin), or every trainer is served by ``workers / trainers`` workers."""
    if workers <= 0:
        return []
    if workers <= trainers:
        return [(r, r % workers) for r in range(trainers)]
    return sorted((w % trainers, w) for w in range(workers))


def owner(k: int, keep: int, workers: list[int]) -> int | None:
    """Who transforms step ``k`` of a trainer served by ``workers`` (live, sorted): None for the
    trainer itself (``keep`` steps of every ``keep + len(workers)``), else a worker."""
    if not workers:
        return None
    p = k % (keep + len(workers))
    return None if p < keep else workers[p - keep]


def digest(samples: np.ndarray, repeat: np.ndarray) -> int:
    """A step's identity on the wire: its samples and their repeats, in batch order."""
    h = hashlib.blake2b(np.ascontiguousarray(samples, np.int64).tobytes(), digest_size=8)
    h.update(np.ascontiguousarray(repeat, np.int64).tobytes())
    return int.from_bytes(h.digest(), "little", signed=True)


def _store(remote: Remote, serve: bool, seconds: float) -> Any:
    """The meeting's store (``serve``: this process serves it); ``seconds`` bounds a wait."""
    import torch.distributed as td

    host, port = remote.host_port
    timeout = datetime.timedelta(seconds=seconds)
    if not serve:
        _reachable(host, port, seconds)
    try:
        return td.TCPStore(host, port, None, serve, timeout=timeout, wait_for_workers=False)
    except (RuntimeError, OSError) as exc:
        what = "serve" if serve else "reach"
        raise SolarError(f"Remote {remote.address}: cannot {what} the workers' store "
                         f"({first_line(exc)})") from None  # fmt: skip


def _reachable(host: str, port: int, seconds: float) -> None:
    """Wait until something listens at ``host:port`` (a connect probe, closed at once), or say
    in one line that nothing did: torch's store client logs pages of C++ frames on a timeout."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise SolarError(f"Remote {host}:{port}: nothing serves the workers' store "
                                 f"there after {seconds:.0f} s ({exc})") from None  # fmt: skip
            time.sleep(0.1)


def _pair(store: Any, trainer: int, worker: int, rank: int) -> Any:
    """The two-rank gloo group of ``(trainer, worker)``; ``rank``: 0 the trainer, 1 the worker."""
    import torch.distributed as td

    prefixed = td.PrefixStore(f"solar-remote/pair/{trainer}/{worker}/", store)
    return td.ProcessGroupGloo(prefixed, rank, 2, _FOREVER)


class TrainerLink:
    """A trainer's side of the meeting: its workers' pairs (a collective of the trainers)."""

    def __init__(self, remote: Remote, rank: int, world: int, comm: Any, job: dict) -> None:
        self.remote = remote
        self.rank = rank
        # Rank 0's serves the meeting; the others wait for its roster (after join_s).
        self.store = _store(remote, rank == 0, 2 * remote.join_s + 30)
        if rank == 0:
            self.store.set(JOB, pickle.dumps(job))
            came = _wait_for(self.store, remote.workers, remote.join_s)
            self.store.set(ROSTER, str(came))
        try:
            roster = int(self.store.get(ROSTER))
        except RuntimeError as exc:  # rank 0 never said: it failed (the job is ending)
            raise SolarError(f"Remote {remote.address}: no roster from trainer rank 0 "
                             f"({first_line(exc)})") from None  # fmt: skip
        self.roster = roster
        self.groups: dict[int, Any] = {}  # worker -> pair group (those that joined)
        for r, w in pairs(world, roster):
            if r != rank:
                continue
            try:
                self.groups[w] = _pair(self.store, r, w, 0)
            except RuntimeError:  # it died before pairing: served without it
                continue
        if comm is not None and comm.Get_size() > 1:
            comm.Barrier()  # rank 0's store lives on: every trainer has its pairs


def _wait_for(store: Any, n: int, seconds: float) -> int:
    """Workers registered within ``seconds`` (at most ``n``)."""
    deadline = time.monotonic() + seconds
    while (came := int(store.add(COUNT, 0))) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    return min(came, n)


class WorkerLink:
    """A worker's side of the meeting: its number, the job, its trainers' pairs."""

    def __init__(self, remote: Remote, wait_s: float) -> None:
        self.store = _store(remote, False, wait_s)  # the trainers may start later
        try:
            self.id = int(self.store.add(COUNT, 1)) - 1
            self.job = pickle.loads(self.store.get(JOB))  # the trainers' own (their store)
            roster = int(self.store.get(ROSTER))
        except RuntimeError as exc:  # gone, or never said within wait_s
            raise SolarError(f"worker at {remote.address}: the trainers did not start within "
                             f"{wait_s:.0f} s ({first_line(exc)})") from None  # fmt: skip
        self.roster = roster
        self.late = self.id >= roster
        self.groups: dict[int, Any] = {}
        if self.late:
            return
        for r, w in pairs(int(self.job["world"]), roster):
            if w == self.id:
                self.groups[r] = _pair(self.store, r, w, 1)
