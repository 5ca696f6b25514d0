"""The meeting of trainers and workers, and the pairs they talk over.

Trainer rank 0 serves a TCPStore at the Remote's address; every trainer and worker connects to
it. A worker takes a number (``add``), reads the job (the trainers' plan spec, data and
transform, pickled by rank 0) and the roster (how many workers the trainers took: those that
came within ``join_s``). Each (trainer, worker) pair of :func:`pairs` then makes a gloo process
group of two ranks over its own prefix of the store (trainer 0, worker 1): a dead peer makes
the other side's operations raise, and nothing else. Pairs are made in (trainer, worker)
order on every process, so no two wait for each other.

Messages on a pair: the worker sends each step it owns as a header, int64 ``[step, rows,
digest, mac x 4]`` (the digest of the step's samples and repeats: the trainer refuses a step
that is not its own; the mac an HMAC-SHA256 under the job's key over the header's first three
and the rows' bytes), then one uint8 tensor per output key; after its trainer's last credit, a
header of step ``DONE`` alone. The trainer sends credits, int64 ``[position, limit]``: steps
below ``position`` are no longer wanted, steps from ``limit`` on not yet (``position = -1``:
the trainer is done).

Trust: the store and the pairs are plain TCP. What a worker runs (the pickled job) and what a
trainer copies into a batch (the rows) are signed with the shared key (``Remote(key=)`` or
``SOLAR_REMOTE_KEY``, given to workers out of band): a process without it can delay or
disturb a run (credits, the roster, connecting as a worker), never make a worker unpickle its
job or a trainer serve its bytes. Nothing is encrypted.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import importlib.util
import json
import logging
import os
import pickle
import socket
import threading
import time
from typing import Any

import numpy as np

from solar.errors import SolarError, first_line
from solar.remote import Remote

JOB, COUNT, ROSTER = "solar-remote/job", "solar-remote/count", "solar-remote/roster"
LIVE = "solar-remote/live/"  # + a trainer's rank: its workers that paired, still live (json)
# + an epoch: every trainer's workers in it (json {rank: workers}), decided by trainer rank 0
# as it starts the epoch (each trainer's live workers then), read by everyone.
EPOCH = "solar-remote/epoch/"
LATEST = "solar-remote/latest"  # the last epoch decided (workers not paired yet look there)
READY = "solar-remote/ready/"  # + a worker's number: it opened the job (it can pair)
FINISHED = "solar-remote/finished"  # trainer rank 0 is done: workers not paired end
KEY_ENV = "SOLAR_REMOTE_KEY"
HEAD = 7  # a delivery's header: step, rows, digest, HMAC-SHA256 as 4 int64
DONE = -1  # a credit's position: the trainer serves no more
_FOREVER = datetime.timedelta(days=365)  # a pair's operations: a dead peer raises sooner
MAX_WORKERS = 4096  # numbers beyond it, in the store, are not workers (the store is untrusted)
log = logging.getLogger(__name__)


def pairs(trainers: int, workers: int) -> list[tuple[int, int]]:
    """The (trainer, worker) pairs, sorted: every worker serves ``trainers / workers`` of them
    (round robin), or every trainer is served by ``workers / trainers`` workers."""
    if workers <= 0:
        return []
    if workers <= trainers:
        return [(r, r % workers) for r in range(trainers)]
    return sorted((w % trainers, w) for w in range(workers))


def assign(trainers: int, workers: list[int]) -> dict[int, list[int]]:
    """Each trainer's workers when ``workers`` (sorted numbers) serve ``trainers``: as
    :func:`pairs` divides as many."""
    got: dict[int, list[int]] = {r: [] for r in range(trainers)}
    for r, i in pairs(trainers, len(workers)):
        got[r].append(workers[i])
    return got


def digest(samples: np.ndarray, repeat: np.ndarray) -> int:
    """A step's identity on the wire: its samples and their repeats, in batch order."""
    h = hashlib.blake2b(np.ascontiguousarray(samples, np.int64).tobytes(), digest_size=8)
    h.update(np.ascontiguousarray(repeat, np.int64).tobytes())
    return int.from_bytes(h.digest(), "little", signed=True)


def key(remote: Remote | None, who: str) -> bytes:
    """The shared secret: ``Remote(key=)``, else ``$SOLAR_REMOTE_KEY``; required."""
    k = (remote.key if remote is not None else None) or os.environ.get(KEY_ENV)
    if not k:
        raise SolarError(f"{who}: no key: pass Remote(key=...) or set {KEY_ENV} (the same "
                         "secret on the trainers and the workers)")  # fmt: skip
    return k.encode()


def mac(secret: bytes, *parts: bytes | memoryview) -> bytes:
    """HMAC-SHA256 of ``parts`` under ``secret``."""
    h = hmac.new(secret, digestmod=hashlib.sha256)
    for part in parts:
        h.update(part)
    return h.digest()


def versions(module: str | None) -> dict[str, str | None]:
    """What must match between trainers and workers for their bytes to match: solar, numpy
    and torch, and the source of the transform's ``module`` (None: not to be found)."""
    import torch

    from solar import _version

    return {"solar": _version.__version__, "numpy": np.__version__, "torch": torch.__version__,
            "module": module, "source": _module_hash(module)}  # fmt: skip


def sign_job(secret: bytes, job: dict, module: str | None) -> bytes:
    """The job as stored: its HMAC, then the trainers' versions (json, one line), then the
    pickle; the worker checks both before unpickling anything."""
    body = json.dumps(versions(module)).encode() + b"\n" + pickle.dumps(job)
    return mac(secret, body) + body


def open_job(secret: bytes, signed: bytes, where: str) -> dict:
    """The job a worker may run: signed under ``secret``, by the same code (one line if not)."""
    body = signed[32:]
    if not hmac.compare_digest(signed[:32], mac(secret, body)):
        raise SolarError(f"{where}: the job's signature does not match this worker's key "
                         f"({KEY_ENV}): refused unread")  # fmt: skip
    head, _, pickled = body.partition(b"\n")
    theirs = json.loads(head)
    mine = versions(theirs.get("module"))
    if mine != theirs:
        diff = ", ".join(f"{k} {theirs.get(k)} there, {v} here"
                         for k, v in mine.items() if theirs.get(k) != v)  # fmt: skip
        raise SolarError(f"{where}: the trainers run other code ({diff}): refused")
    return pickle.loads(pickled)  # signed by trainer rank 0, same code


def _module_hash(name: str | None) -> str | None:
    if not name or name == "__main__":
        return None
    try:
        spec = importlib.util.find_spec(name)
        src = spec.loader.get_source(name) if spec and spec.loader else None  # type: ignore[attr-defined]
    except (ImportError, AttributeError, ValueError, OSError):
        return None
    return None if src is None else hashlib.sha256(src.encode()).hexdigest()[:16]


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


def _pair(store: Any, trainer: int, worker: int, rank: int, epoch: int, seconds: float) -> Any:
    """The two-rank gloo group of ``(trainer, worker)`` made at ``epoch``'s start; ``rank``: 0
    the trainer, 1 the worker. Made within ``seconds`` (a peer that never comes raises: it
    registered and then failed); its operations wait as long as they must (:func:`done`)."""
    import torch.distributed as td

    at = "" if epoch == 0 else f"{epoch}/"
    prefixed = td.PrefixStore(f"solar-remote/pair/{at}{trainer}/{worker}/", store)
    return td.ProcessGroupGloo(prefixed, rank, 2, datetime.timedelta(seconds=seconds))


def done(work: Any) -> None:
    """Wait for a pair's operation: a dead peer raises; a slow one is waited for (the pair's
    own timeout bounds only its making)."""
    work.wait(_FOREVER)


def parse_ids(raw: bytes | str, what: str) -> list[int]:
    """Workers' numbers as a store holds them (json), checked: a list of distinct numbers
    below :data:`MAX_WORKERS` (one line if not: the store is untrusted)."""
    try:
        got = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        got = None
    ok = isinstance(got, list) and all(
        isinstance(i, int) and not isinstance(i, bool) and 0 <= i < MAX_WORKERS for i in got
    )
    if not ok or len(set(got)) != len(got):
        raise SolarError(f"the workers' store: {what} is not a list of workers: refused")
    return sorted(got)


def parse_members(raw: bytes | str, world: int, what: str) -> dict[int, list[int]]:
    """Every trainer's workers as trainer rank 0 wrote them (json ``{rank: workers}``),
    checked: ranks below ``world``, each a list of workers (one line if not)."""
    try:
        got = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        got = None
    if not isinstance(got, dict) or not all(isinstance(r, str) and r.isdigit() and
                                            int(r) < world for r in got):  # fmt: skip
        raise SolarError(f"the workers' store: {what} is not the trainers' workers: refused")
    # (A worker may serve several trainers: fewer workers than trainers.)
    return {int(r): parse_ids(json.dumps(w), what) for r, w in got.items()}


def _count(store: Any) -> int:
    """Workers registered (numbers taken), at most :data:`MAX_WORKERS`."""
    return max(0, min(int(store.add(COUNT, 0)), MAX_WORKERS))


class TrainerLink:
    """A trainer's side of the meeting: its workers' pairs (a collective of the trainers)."""

    def __init__(self, remote: Remote, rank: int, world: int, comm: Any, job: dict,
                 module: str | None) -> None:  # fmt: skip
        self.remote = remote
        self.rank = rank
        self.pid = os.getpid()  # its pairs and threads are this process's (a copy has none)
        self.key = key(remote, f"Remote {remote.address}")
        # Rank 0's serves the meeting; the others wait for its roster (after join_s).
        self.store = _store(remote, rank == 0, 2 * remote.join_s + 30)
        if rank == 0:
            self.store.set(JOB, sign_job(self.key, job, module))  # workers unpickle it
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
                self.groups[w] = _pair(self.store, r, w, 0, 0, remote.join_s)
            except RuntimeError:  # it failed before pairing: served without it
                continue
        # Who owns which step follows from the workers that paired: they read it here.
        self.world = world
        self._ever = set(range(roster))  # rank 0: every worker ever given a trainer
        self._lock = threading.Lock()  # the store's client, from the receivers' threads too
        self.live(list(self.groups))
        if comm is not None and comm.Get_size() > 1:
            comm.Barrier()  # rank 0's store lives on: every trainer has its pairs

    def live(self, live: list[int]) -> None:
        """This trainer's workers now (one was lost, or came): trainer rank 0 reads them as it
        starts the next epoch. A store gone (trainer rank 0 ended) is no matter: there is no
        next epoch."""
        with self._lock:
            if self.store is None:
                return
            try:
                self.store.set(f"{LIVE}{self.rank}", json.dumps(sorted(live)))
            except RuntimeError as exc:
                log.info("Remote %s: trainer %d's workers not said (%s)", self.remote.address,
                         self.rank, first_line(exc))  # fmt: skip

    def members(self, epoch: int) -> dict[int, list[int]]:
        """Every trainer's workers in ``epoch`` (> 0): decided by trainer rank 0 as it starts
        it, once (:func:`assign`), waited for by the others."""
        where = f"{EPOCH}{epoch}"
        # Polled, the lock (and the store's client) free between looks: the receivers'
        # threads say a lost worker meanwhile.
        deadline = time.monotonic() + 2 * self.remote.join_s + 30
        got, why = None, "not said in time"
        while got is None:
            with self._lock:
                try:
                    if self.rank == 0 and not self.store.check([where]):
                        self.store.set(where, json.dumps(self._decide()))
                        self.store.set(LATEST, str(epoch))
                    got = self.store.get(where) if self.store.check([where]) else None
                except RuntimeError as exc:  # rank 0's store is gone: the job is ending
                    why = first_line(exc)
                    break
            if got is None and time.monotonic() >= deadline:
                break
            if got is None:
                time.sleep(0.02)
        if got is None:  # rank 0 never said: it failed (the job is ending)
            raise SolarError(f"Remote {self.remote.address}: no workers of epoch {epoch} "
                             f"from trainer rank 0 ({why})")  # fmt: skip
        return parse_members(got, self.world, f"the workers of epoch {epoch}")

    def _decide(self) -> dict[int, list[int]]:
        """Rank 0: the workers live now (those every trainer still has, and those that came
        since, never given a trainer, and opened the job: ready) divided among the trainers."""
        store, ever = self.store, self._ever
        live: set[int] = set()
        for r in range(self.world):
            try:
                live.update(parse_ids(store.get(f"{LIVE}{r}"), f"trainer {r}'s live workers"))
            except SolarError as exc:  # (written by a trainer: someone else's bytes)
                log.warning("%s", exc)
        came = {i for i in range(_count(store)) if i not in ever and store.check([f"{READY}{i}"])}
        self._ever = ever | came
        return assign(self.world, sorted((live & ever) | came))

    def pair(self, epoch: int, worker: int) -> Any:
        """A new pair with ``worker``, given this trainer at ``epoch``'s start, made within
        ``join_s`` (None: it never came: failed or gone meanwhile)."""
        try:
            return _pair(self.store, self.rank, worker, 0, epoch, self.remote.join_s)
        except RuntimeError:
            return None

    def finish(self) -> None:
        """Rank 0: the trainers are done; workers never given a trainer end."""
        with self._lock:
            if self.rank == 0 and self.store is not None:
                self.store.set(FINISHED, "1")

    def close(self) -> None:
        """Release the pairs and the store (rank 0: its port)."""
        for g in self.groups.values():
            try:
                g.shutdown()
            except RuntimeError:
                pass
        self.groups.clear()
        with self._lock:
            self.store = None


def _wait_for(store: Any, n: int, seconds: float) -> int:
    """Workers registered within ``seconds`` (at most ``n``)."""
    deadline = time.monotonic() + seconds
    while (came := _count(store)) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    return min(came, n)


class WorkerLink:
    """A worker's side of the meeting: its number, the job, its trainers' pairs."""

    def __init__(self, remote: Remote, wait_s: float) -> None:
        where = f"worker at {remote.address}"
        self.key = key(remote, where)
        self.store = _store(remote, False, wait_s)  # the trainers may start later
        try:
            self.id = int(self.store.add(COUNT, 1)) - 1
            signed = self.store.get(JOB)
            roster = int(self.store.get(ROSTER))
        except RuntimeError as exc:  # gone, or never said within wait_s
            raise SolarError(f"{where}: the trainers did not start within "
                             f"{wait_s:.0f} s ({first_line(exc)})") from None  # fmt: skip
        if not 0 <= self.id < MAX_WORKERS:
            raise SolarError(f"{where}: number {self.id}: more than {MAX_WORKERS} workers came")
        self.job = open_job(self.key, signed, where)
        self.join_s = float(self.job.get("join_s", 60.0))
        self.store.set(f"{READY}{self.id}", "1")  # it can pair: trainer rank 0 may assign it
        self.roster = roster
        self.late = self.id >= roster
        self.groups: dict[int, Any] = {}
        self.live: dict[int, list[int]] = {}  # a trainer -> its workers that paired
        if self.late:
            return
        for r, w in pairs(int(self.job["world"]), roster):
            if w == self.id:
                self.groups[r] = _pair(self.store, r, w, 1, 0, self.join_s)
        try:
            for r in self.groups:
                self.live[r] = parse_ids(self.store.get(f"{LIVE}{r}"), f"trainer {r}'s workers")
        except RuntimeError as exc:
            raise SolarError(f"{where}: a trainer did not say its workers "
                             f"({first_line(exc)})") from None  # fmt: skip

    def members(self, epoch: int) -> dict[int, list[int]] | None:
        """Every trainer's workers in ``epoch``, once trainer rank 0 has decided them (None:
        not yet; the worker goes on with the last it knows)."""
        where = f"{EPOCH}{epoch}"
        try:
            if not self.store.check([where]):
                return None
            got = self.store.get(where)
        except RuntimeError:  # the store is gone: so are the trainers
            return None
        return parse_members(got, int(self.job["world"]), f"the workers of epoch {epoch}")

    def latest(self) -> int:
        """The last epoch whose workers trainer rank 0 decided (0: none since the start; -1:
        the trainers' store is gone)."""
        try:
            raw = self.store.get(LATEST) if self.store.check([LATEST]) else b"0"
        except RuntimeError:
            return -1
        try:
            return max(0, int(raw))
        except ValueError:
            raise SolarError(f"the workers' store: the last epoch {raw[:20]!r}: refused") from None

    def finished(self) -> bool:
        """Whether the trainers are done (or their store gone)."""
        try:
            return bool(self.store.check([FINISHED]))
        except RuntimeError:
            return True

    def pair(self, epoch: int, trainer: int) -> Any:
        """A new pair with ``trainer``, which took this worker at ``epoch``'s start, made within
        ``join_s`` (None: it is gone)."""
        try:
            return _pair(self.store, trainer, self.id, 1, epoch, self.join_s)
        except RuntimeError:
            return None
