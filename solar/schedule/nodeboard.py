"""Plan once per host, in shared memory: the host's ranks post what they plan and take what
the others post (issue 35: planning a host on every local rank cost every rank several times
one rank's planning, in time and memory).

An :class:`EpochBoard` is made by the host's ranks together (a collective of the host's
communicator, in the foreground: the background planning threads never call one). It is a
``memfd`` (no name anywhere: nothing is left in /dev/shm whatever happens to the job, ``kill
-9`` included) holding a small mailbox that every local rank maps read-write, one row of
entries per local rank (each posts in its own row and marks in the others' what it took),
through ``/proc/<pid>/fd/<fd>`` with the inode that proves it is still that file.

What is posted: where the host's buffer is planned in parts (solar/schedule/nodeparts.py),
each rank's draws of an epoch, one section per part (:func:`pack_draws`), and each rank's part
of the epoch (:func:`pack`, cells numbered within the part); otherwise local rank 0's plan of
the host's epoch. An epoch's payload holds this host's part only — the buffer decisions, the
host's ranks' service, every step's staging set (the rows of the host some local rank takes
from another's read, sorted) and the buffer as the epoch starts. Every payload is a memfd of
its own, sealed once written (no process can then rewrite, shrink or grow it: its checks hold
while it is used in place). Its mailbox entry (a seqlock: odd while written) names the memfd;
a rank that wants one waits for its entry, opens the memfd, maps it read-only, marks it taken
(the poster closes its descriptor once every local rank took it: its memory goes with the
last mapping) and checks it (:func:`unpack`, :func:`unpack_draws`) before anything uses it: a
payload is untrusted input, refused in one line unless it is sealed, its header names this
run, host, epoch (and rank or part) and every offset, slot, sample and index is in range (a
part's draws: every row that part's). A rank touches only its own service (with a tier, its
host's updates too: the phases order them), the staging sets, its part's draws and, on a
resume, the host's decisions (checked when first used): the pages of the others' services
stay out of its memory. A rank waiting for a poster that has ended
is refused in one line.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from solar.errors import CorruptPlanError, SolarError, first_error
from solar.host import memfd as _memfd
from solar.schedule._common import PEER
from solar.schedule.draws import EpochDraws
from solar.schedule.grouping import Hosts, NodeEpoch
from solar.schedule.nodeparts import Parts
from solar.schedule.planner import EpochPlan, RankEpoch
from solar.schedule.spec import PlanSpec

MAGIC = 0x534F4C41524E4F44  # "SOLARNOD"
VERSION = 3  # 2: every rank's step offsets (w_steps); 3: parts, draws, one row per poster
ENTRIES = 16  # mailbox entries per local rank: payloads posted and not yet recycled
_HEAD = 16  # int64 fields of a payload's header
_FIELDS = 8  # int64 fields of a mailbox entry, before its taken marks
_SEQ, _EPOCH, _PID, _FD, _INO, _NBYTES, _KIND = range(7)
# What an entry names: local rank 0's epoch of the host (the host planned in one), a rank's
# draws of an epoch, or a part's epoch (solar/schedule/nodeparts.py: each local rank plans one).
WHOLE, DRAWS, PART = 0, 1, 2
DRAWS_MAGIC = 0x534F4C4152445257  # "SOLARDRW"
_PEER = "node plan: a local rank's shared payload"  # (names it in errors)
_WAIT_ALIVE = 2.0  # seconds between checks that the poster still runs
# A poster alive but never posting what is awaited (a rank that seeked alone waits for epochs
# its host's ranks planned long ago): refused after torch.distributed's default timeout.
WAIT_LIMIT = 1800.0
_KINDS = {WHOLE: "epoch", DRAWS: "draws", PART: "part"}


def digest(fingerprint: str, hosts: Hosts, host: int) -> tuple[int, int]:
    """Two int64 naming the run, the grouping and the host (a payload's header carries them)."""
    h = hashlib.blake2b(repr((fingerprint, hosts.as_record(), host)).encode(), digest_size=16)
    a, b = np.frombuffer(h.digest(), np.int64)
    return int(a), int(b)


def _layout(steps: int, world: int, n_host: int, n_ranks: int, n_shared: int,
            n_contents: int) -> list[tuple[str, Any, int]]:  # fmt: skip
    """The payload's arrays after its header: (name, dtype, length), in order."""
    return [
        ("h_steps", np.int64, steps + 1), ("h_sample", np.int64, n_host),
        ("h_slot", np.int32, n_host), ("h_tslot", np.int32, n_host),
        ("w_steps", np.int64, world * (steps + 1)), ("r_sample", np.int64, n_ranks),
        ("r_slot", np.int32, n_ranks), ("r_tslot", np.int32, n_ranks),
        ("r_at", np.int64, n_ranks), ("r_reader", np.int16, n_ranks),
        ("s_offsets", np.int64, steps + 1), ("s_values", np.int64, n_shared),
        ("contents", np.int64, n_contents),
        ("h_flags", np.uint8, n_host), ("r_flags", np.uint8, n_ranks),
    ]  # fmt: skip


def _offsets(layout: list[tuple[str, Any, int]]) -> tuple[dict[str, int], int]:
    at, out = _HEAD * 8, {}
    for name, dt, n in layout:
        out[name] = at
        at += -(-(n * np.dtype(dt).itemsize) // 8) * 8
    return out, at


def staging_sets(h_steps: np.ndarray, at: np.ndarray, flags: np.ndarray,
                 n_host: int) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Every step's staging set: the host accesses (``at``) some local rank takes as ``PEER``,
    sorted and distinct per step, as (offsets, values). A rank's access at step t is one of
    its host's accesses of step t, ``h_steps[t]..h_steps[t + 1]``: marking them in one pass
    sorts them by step (no sort: an epoch's rows are millions)."""
    mark = np.zeros(n_host, np.bool_)
    mark[at[(flags & PEER) != 0]] = True
    values = np.flatnonzero(mark).astype(np.int64)
    return np.searchsorted(values, h_steps).astype(np.int64), values


def pack(ne: NodeEpoch, host: int, contents: np.ndarray, tag: tuple[int, int],
         part: int = -1) -> int:  # fmt: skip
    """Host ``host``'s part of ``ne`` (and its buffer ``contents`` as the epoch starts) in a
    new memfd; returns its descriptor. ``part``: ``ne`` is that part of the host's buffer."""
    group = sorted(ne.hosts.groups[host])
    h = ne.host.rank(host)
    steps = h.step_offsets.size - 1
    ro, so = ne.ranks.rank_offsets, ne.ranks.step_offsets
    lo, hi = int(ro[group[0]]), int(ro[group[-1] + 1])  # the group's ranks are consecutive
    if group != list(range(group[0], group[-1] + 1)):
        raise SolarError(f"node plan: host {host}'s ranks {group} are not consecutive")
    r_at = ne.at[lo:hi] - ne.host.rank_offsets[host]  # (indexes into the host's own part)
    s_off, s_val = staging_sets(h.step_offsets, r_at, ne.ranks.flags[lo:hi], h.sample.size)
    arrays = {
        "h_steps": h.step_offsets, "h_sample": h.sample, "h_slot": h.slot, "h_tslot": h.tslot,
        "h_flags": h.flags, "w_steps": so.reshape(-1),
        "r_sample": ne.ranks.sample[lo:hi], "r_slot": ne.ranks.slot[lo:hi],
        "r_tslot": ne.ranks.tslot[lo:hi], "r_at": r_at, "r_reader": ne.reader[lo:hi],
        "r_flags": ne.ranks.flags[lo:hi], "s_offsets": s_off, "s_values": s_val,
        "contents": contents,
    }  # fmt: skip
    layout = _layout(steps, ne.hosts.world, h.sample.size, hi - lo, s_val.size, contents.size)
    where, nbytes = _offsets(layout)
    fd = _memfd.create("solar-nodeplan", nbytes)
    try:
        head = np.array([MAGIC, VERSION, ne.epoch, host, ne.hosts.world, steps, ne.hosts.count,
                         len(group), h.sample.size, r_at.size, s_val.size, contents.size, nbytes,
                         tag[0], tag[1], part + 1], np.int64)  # fmt: skip
        _write(fd, head, 0)
        for name, dt, n in layout:
            a = np.ascontiguousarray(arrays[name], dtype=dt)
            if a.size != n:
                raise SolarError(f"node plan: {name} has {a.size} entries, not {n}")
            _write(fd, a, where[name])
        # Checked once, then used in place: sealed, no process can rewrite, shrink (SIGBUS in
        # every rank mapping it) or grow it after its checks.
        _memfd.seal(fd, _memfd.FROZEN)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _write(fd: int, a: np.ndarray, at: int) -> None:
    """``a``'s bytes at offset ``at`` (the kernel copies: no page faults of a fresh mapping)."""
    view = np.ascontiguousarray(a).data.cast("B")
    done = 0
    while done < view.nbytes:
        done += os.pwrite(fd, view[done:], at + done)


def pack_draws(parts: list[EpochDraws], epoch: int, rank: int, tag: tuple[int, int]) -> int:
    """Rank ``rank``'s draws of ``epoch``, one section per part of its host's buffer (each
    part's planner reads only its own), in a new sealed memfd; returns its descriptor."""
    steps = parts[0].offsets.size - 1
    sizes = [d.ids.size for d in parts]
    starts = np.concatenate([[0], np.cumsum(sizes)])
    offsets = np.concatenate([d.offsets + starts[j] for j, d in enumerate(parts)])
    n = int(starts[-1])
    nbytes = (_HEAD + offsets.size + n) * 8
    fd = _memfd.create("solar-nodedraws", nbytes)
    try:
        head = np.array([DRAWS_MAGIC, VERSION, epoch, rank, steps, len(parts), n, nbytes,
                         tag[0], tag[1], 0, 0, 0, 0, 0, 0], np.int64)  # fmt: skip
        _write(fd, head, 0)
        _write(fd, offsets.astype(np.int64), _HEAD * 8)
        for j, d in enumerate(parts):
            _write(fd, np.asarray(d.ids, np.int64), (_HEAD + offsets.size + int(starts[j])) * 8)
        _memfd.seal(fd, _memfd.FROZEN)
    except BaseException:
        os.close(fd)
        raise
    return fd


def unpack_draws(m: mmap.mmap, *, epoch: int, rank: int, steps: int, layout: Parts, part: int,
                 num_samples: int, tag: tuple[int, int]) -> EpochDraws:  # fmt: skip
    """Part ``part``'s section of rank ``rank``'s draws of ``epoch`` (views of the mapping),
    checked: header, offsets, every id in range and of that part of ``layout``."""
    parts = layout.count
    bad = f"node plan (rank {rank}'s shared draws)"
    if len(m) < _HEAD * 8:
        raise CorruptPlanError(f"{bad}: {len(m)} bytes, shorter than its header")
    head = [int(v) for v in np.ndarray(_HEAD, np.int64, buffer=m)]
    if head[:6] != [DRAWS_MAGIC, VERSION, epoch, rank, steps, parts] or \
            (head[8], head[9]) != tag:  # fmt: skip
        raise CorruptPlanError(f"{bad}: its header names another run, rank or epoch")
    n, nbytes = head[6], head[7]
    k = parts * (steps + 1)
    if n < 0 or nbytes != (_HEAD + k + n) * 8 or len(m) < nbytes:
        raise CorruptPlanError(f"{bad}: impossible sizes in its header")
    offsets = np.ndarray(steps + 1, np.int64, buffer=m, offset=(_HEAD + part * (steps + 1)) * 8)
    lo, hi = int(offsets[0]), int(offsets[-1])
    if lo < 0 or hi > n or np.any(np.diff(offsets) < 0):
        raise CorruptPlanError(f"{bad}: its offsets are not offsets into its {n} ids")
    ids = np.ndarray(hi - lo, np.int64, buffer=m, offset=(_HEAD + k + lo) * 8)
    _in("drawn ids", ids, 0, num_samples, bad)
    if ids.size and np.any(layout.of(ids) != part):
        raise CorruptPlanError(f"{bad}: part {part}'s section holds rows of other parts")
    out = offsets - lo
    ids.flags.writeable = False
    return EpochDraws(ids, out)


class _Host(EpochPlan):
    """The host's decisions of a published epoch, checked when first used (a resume's replay,
    an epoch's first step): until then a rank never touches their pages."""

    _limits: tuple[int, int, int]

    def rank(self, r: int) -> RankEpoch:
        if not getattr(self, "_checked", False):  # (all of it: the payload's host's alone)
            n, slots, tier = self._limits
            _in("host samples", self.sample, 0, n)
            _in("host slots", self.slot, -1, slots)
            _in("host tier slots", self.tslot, -1, tier)
            object.__setattr__(self, "_checked", True)
        return super().rank(r)


def _in(what: str, a: np.ndarray, lo: int, hi: int,
        bad: str = "node plan (shared epoch)") -> None:  # fmt: skip
    if a.size and (int(a.min()) < lo or int(a.max()) >= hi):
        raise CorruptPlanError(f"{bad}: {what} outside [{lo}, {hi})")


def _offsets_ok(what: str, o: np.ndarray, end: int) -> None:
    if o.size == 0 or o[0] != 0 or o[-1] != end or np.any(np.diff(o) < 0):
        raise CorruptPlanError(f"node plan (shared epoch): {what} are not offsets 0..{end}")


def unpack(m: mmap.mmap, *, epoch: int, hosts: Hosts, host: int, rank: int, steps: int,
           num_samples: int, slots: int, tier: int, tag: tuple[int, int],
           part: int = -1) -> NodeEpoch:  # fmt: skip
    """The NodeEpoch a payload holds (``part``: that part of the host's buffer, its cells
    ``slots`` and ``tier``), seen by global rank ``rank``: its views of the mapping, after
    checking the header and everything this rank uses (see the module's docstring)."""
    bad = "node plan (shared epoch)"
    if len(m) < _HEAD * 8:
        raise CorruptPlanError(f"{bad}: {len(m)} bytes, shorter than its header")
    head = [int(v) for v in np.ndarray(_HEAD, np.int64, buffer=m)]
    group = sorted(hosts.groups[host])
    want = [MAGIC, VERSION, epoch, host, hosts.world, steps, hosts.count, len(group)]
    if head[:8] != want or (head[13], head[14]) != tag or head[15] != part + 1:
        raise CorruptPlanError(
            f"{bad}: its header names another run, host or epoch "
            f"(epoch {head[2]}, host {head[3]}; wanted {epoch}, {host})"
        )
    n_host, n_ranks, n_shared, n_contents, nbytes = head[8:13]
    if min(n_host, n_ranks, n_shared, n_contents) < 0 or n_contents != slots + tier:
        raise CorruptPlanError(f"{bad}: impossible sizes in its header")
    layout = _layout(steps, hosts.world, n_host, n_ranks, n_shared, n_contents)
    where, size = _offsets(layout)
    if nbytes != size or len(m) < size:
        raise CorruptPlanError(f"{bad}: {len(m)} bytes, its header says {nbytes}, sizes {size}")
    a = {name: np.ndarray(n, dt, buffer=m, offset=where[name]) for name, dt, n in layout}
    for v in a.values():
        v.flags.writeable = False
    _offsets_ok("host step offsets", a["h_steps"], n_host)
    # Every rank's step offsets (the exchange of equal batches counts other hosts' ranks too);
    # this host's ranks' services follow.
    w_steps = a["w_steps"].reshape(hosts.world, steps + 1)
    if np.any(w_steps[:, 0] != 0) or np.any(np.diff(w_steps, axis=1) < 0):
        raise CorruptPlanError(f"{bad}: a rank's step offsets are not offsets")
    r_steps = w_steps[group]
    counts = r_steps[:, -1]
    if int(counts.sum()) != n_ranks:
        raise CorruptPlanError(f"{bad}: the ranks' accesses do not add up to {n_ranks}")
    _offsets_ok("staging offsets", a["s_offsets"], n_shared)
    _in("staged accesses", a["s_values"], 0, max(1, n_host))
    _in("buffer contents", a["contents"], -1, num_samples)
    # This rank's own service: everything the step plans it makes read.
    j = group.index(rank)
    lo = int(counts[:j].sum())
    hi = lo + int(counts[j])
    _in("samples", a["r_sample"][lo:hi], 0, num_samples)
    _in("slots", a["r_slot"][lo:hi], -1, slots)
    _in("tier slots", a["r_tslot"][lo:hi], -1, tier)
    _in("host indexes", a["r_at"][lo:hi], 0, max(1, n_host))
    world = hosts.world
    rank_offsets = np.zeros(world + 1, np.int64)
    step_offsets = np.zeros((world, steps + 1), np.int64)
    for i, q in enumerate(group):
        rank_offsets[q + 1] = counts[i]
        step_offsets[q] = r_steps[i]
    np.cumsum(rank_offsets, out=rank_offsets)
    h_offsets = np.zeros(hosts.count + 1, np.int64)
    h_offsets[host + 1 :] = n_host
    h_steps = np.zeros((hosts.count, steps + 1), np.int64)
    h_steps[host] = a["h_steps"]
    host_plan = _Host(epoch, h_offsets, h_steps, a["h_sample"], a["h_slot"], a["h_flags"],
                      a["h_tslot"])  # fmt: skip
    object.__setattr__(host_plan, "_limits", (num_samples, slots, tier))
    ranks = EpochPlan(epoch, rank_offsets, step_offsets, a["r_sample"], a["r_slot"],
                      a["r_flags"], a["r_tslot"])  # fmt: skip
    return NodeEpoch(epoch, hosts, host_plan, ranks, a["r_reader"], a["r_at"],
                     staged=(a["s_offsets"], a["s_values"]), initial=a["contents"],
                     all_steps=w_steps)  # fmt: skip


class Interrupted(SolarError):
    """A wait on the board ended by :meth:`EpochBoard.interrupt` (its planner is dropped)."""


class EpochBoard:
    """The mailbox of a host's published payloads (see the module's docstring). Made by every
    rank of ``comm`` together (the host's communicator, or a superset: each rank finds its
    host's local rank 0 in an allgather); ``group`` is this host's ranks, ``rank`` this one.
    Every local rank has its own row of entries: local rank 0 posts a host planned in one;
    with a buffer in parts, every rank posts its draws and its part."""

    def __init__(self, comm: Any, hosts: Hosts, host: int, rank: int, tag: tuple[int, int],
                 steps: int, saves: bool = False) -> None:  # fmt: skip
        self.hosts, self.host, self.rank, self.tag, self.steps = hosts, host, rank, tag, steps
        self.group = sorted(hosts.groups[host])
        self.local = self.group.index(rank)
        self.publisher = self.local == 0
        self._fds: dict[int, int] = {}  # own entry -> descriptor of the payload it names
        self._count = 0  # payloads posted (the next own entry: count % ENTRIES)
        self._lock = threading.Lock()
        self.wait_limit = WAIT_LIMIT
        # Called as a rank waits (raises to end the wait): its host barrier's check that its
        # host's ranks wait for the same step (NodeStream.watch).
        self.watch: Callable[[], None] | None = None
        self._era = 0  # interrupts so far: a wait begun in an earlier era ends
        self.closed = False
        width = _FIELDS + len(self.group)
        size = len(self.group) * ENTRIES * width * 8
        fd, err = -1, ""
        name = (os.getpid(), -1, -1)
        if self.publisher:
            try:
                fd = _memfd.create("solar-nodeboard", size)
                _memfd.seal(fd, _memfd.SIZE_SEALS)  # never shorter than mapped
                name = _memfd.ident(fd)
            except OSError as exc:
                err = f"node plan: no shared memory for its mailbox ({exc})"
        mine = (host, self.local, name, err, saves)
        everyone = comm.allgather(mine) if comm is not None else [mine]
        err = next((e for *_, e, _ in everyone if e), "")
        src = next(n for h, j, n, *_ in everyone if h == host and j == 0)
        pids = {j: n[0] for h, j, n, *_ in everyone if h == host}
        # Whether a rank of this host saves node planner snapshots (the host's ranks decide
        # alike how its plan is made: solar/schedule/nodestream.py).
        self.host_saves = any(sv for h, *_, sv in everyone if h == host)
        self.pids = [pids.get(j, -1) for j in range(len(self.group))]
        try:
            if not err and not self.publisher:
                fd, err = _memfd.open_peer(src, size, os.O_RDWR, _PEER)
                if not err and not _memfd.sealed(fd, _memfd.SIZE_SEALS):
                    err = f"node plan: /proc/{src[0]}/fd/{src[1]} is not a sealed mailbox"
            err = first_error(comm, err)  # every rank has it open (or failed) before any goes on
            if err:
                raise SolarError(err)
            self._map = mmap.mmap(fd, size)
        finally:
            if fd >= 0:
                os.close(fd)
        self.pid = src[0]
        self.box = np.ndarray((len(self.group), ENTRIES, width), np.int64, buffer=self._map)

    # -- posting (own row) ---------------------------------------------------------------------
    def publish(self, ne: NodeEpoch, contents: np.ndarray) -> int:
        """Publish this host's part of ``ne`` (local rank 0, the host planned in one);
        returns the payload's descriptor (kept open until every local rank took it, or its
        entry is recycled)."""
        assert self.publisher
        fd = pack(ne, self.host, np.asarray(contents, np.int64), self.tag)
        return self._post(WHOLE, ne.epoch, fd)

    def publish_part(self, ne: NodeEpoch, contents: np.ndarray) -> int:
        """Publish part ``local`` of this host's buffer for ``ne.epoch`` (its cells numbered
        within it)."""
        fd = pack(ne, self.host, np.asarray(contents, np.int64), self.tag, self.local)
        return self._post(PART, ne.epoch, fd)

    def publish_draws(self, epoch: int, parts: list[EpochDraws]) -> int:
        """Publish this rank's draws of ``epoch``, one section per part."""
        return self._post(DRAWS, epoch, pack_draws(parts, epoch, self.rank, self.tag))

    def _post(self, kind: int, epoch: int, fd: int) -> int:
        with self._lock:  # (a planner draws two epochs at once, on two threads)
            self._release(done_only=True)
            e = self._count % ENTRIES
            self._close(e)
            row = self.box[self.local, e]
            row[_SEQ] += 1  # odd: being written
            row[_EPOCH], row[_PID], row[_FD], row[_KIND] = epoch, os.getpid(), fd, kind
            row[_INO], row[_NBYTES] = os.fstat(fd).st_ino, os.fstat(fd).st_size
            row[_FIELDS:] = 0
            row[_SEQ] += 1
            row[_FIELDS + self.local] = row[_SEQ]  # the poster has it
            self._fds[e] = fd
            self._count += 1
        return fd

    def _release(self, done_only: bool) -> None:
        for e in list(self._fds):
            row = self.box[self.local, e]
            if not done_only or np.all(row[_FIELDS:] == row[_SEQ]):
                self._close(e)

    def _close(self, e: int) -> None:
        fd = self._fds.pop(e, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    # -- taking --------------------------------------------------------------------------------
    @property
    def era(self) -> int:
        """Interrupts so far (:meth:`interrupt`)."""
        return self._era

    def take(self, epoch: int, kind: int = WHOLE, src: int = 0,
             era: int | None = None) -> mmap.mmap:  # fmt: skip
        """The payload of ``kind`` for ``epoch`` that local rank ``src`` posts, mapped
        read-only (waits until it is posted; refused in one line if ``src`` ended first).
        ``era``: raise :class:`Interrupted` once the board is past it (default: now's)."""
        start = time.monotonic()
        alive_at = start + _WAIT_ALIVE
        pause = 0.0005
        era = self._era if era is None else era
        while True:
            if self.closed:
                raise SolarError(f"node plan: the board closed while epoch {epoch} was awaited")
            if self._era != era:
                raise Interrupted(f"node plan: the wait for epoch {epoch} was interrupted")
            for e in range(ENTRIES):
                got = self._try(src, e, epoch, kind)
                if got is not None:
                    return got
            if self.watch is not None:
                self.watch()
            now = time.monotonic()
            if now > alive_at:
                pid = self.pids[src]
                if not os.path.exists(f"/proc/{pid}"):
                    raise SolarError(
                        f"node plan: local rank {src} (pid {pid}) of host {self.host} "
                        f"ended before publishing epoch {epoch}"
                    )
                if now - start > self.wait_limit:
                    raise SolarError(
                        f"node plan: local rank {src} of host {self.host} posted no "
                        f"{_KINDS[kind]} of epoch {epoch} within {self.wait_limit:g} s (the "
                        "host's ranks must take the same epochs: did a rank seek alone?)"
                    )
                alive_at = now + _WAIT_ALIVE
            time.sleep(pause)
            pause = min(0.01, pause * 2)

    def _try(self, src: int, e: int, epoch: int, kind: int) -> mmap.mmap | None:
        row = self.box[src, e]
        seq = int(row[_SEQ])
        if seq == 0 or seq % 2 or int(row[_EPOCH]) != epoch or int(row[_KIND]) != kind:
            return None
        pid, fd, ino, nbytes = (int(v) for v in row[_PID : _NBYTES + 1])
        if int(row[_SEQ]) != seq:
            return None
        if src == self.local:
            with self._lock:  # (close may close it meanwhile)
                if self._fds.get(e, -1) != fd:
                    return None
                return mmap.mmap(fd, nbytes, prot=mmap.PROT_READ)
        got, _ = _memfd.open_peer((pid, fd, ino), nbytes, os.O_RDONLY, _PEER)
        if got < 0 or int(row[_SEQ]) != seq:  # closed, or recycled meanwhile: look again
            if got >= 0:
                os.close(got)
            return None
        if not _memfd.sealed(got, _memfd.FROZEN):  # (pack seals before naming)
            os.close(got)
            raise CorruptPlanError(f"node plan (shared epoch): epoch {epoch}'s payload "
                                   f"(/proc/{pid}/fd/{fd}) is not sealed: another process "
                                   "could change it after it was checked")  # fmt: skip
        try:
            m = mmap.mmap(got, nbytes, prot=mmap.PROT_READ)
        except (OSError, ValueError):
            return None
        finally:
            os.close(got)
        # Taken: the poster may close its descriptor (each rank writes its own mark only). The
        # mark is the payload's sequence number: one that lands as the entry is recycled is
        # not the new payload's, whose descriptor the poster keeps until this rank takes it.
        row[_FIELDS + self.local] = seq
        return m

    def interrupt(self) -> None:
        """End every wait of an earlier era, begun or to come (they raise
        :class:`Interrupted`)."""
        self._era += 1

    def epoch(self, epoch: int, num_samples: int, slots: int, tier: int = 0) -> NodeEpoch:
        """Epoch ``epoch`` of this host's node plan, from local rank 0's payload (checked)."""
        return unpack(self.take(epoch), epoch=epoch, hosts=self.hosts, host=self.host,
                      rank=self.rank, steps=self.steps, num_samples=num_samples, slots=slots,
                      tier=tier, tag=self.tag)  # fmt: skip

    def part(self, epoch: int, layout: Parts, part: int, num_samples: int, slots: int,
             tier: int, era: int | None = None) -> NodeEpoch:  # fmt: skip
        """Part ``part`` of ``layout`` of this host's buffer at ``epoch``, from the payload of
        the local rank that plans it (checked: its cells ``slots`` and ``tier``, this rank's
        rows of that part)."""
        ne = unpack(self.take(epoch, PART, part, era), epoch=epoch, hosts=self.hosts,
                    host=self.host, rank=self.rank, steps=self.steps, num_samples=num_samples,
                    slots=slots, tier=tier, tag=self.tag, part=part)  # fmt: skip
        own = ne.ranks.rank(self.rank).sample
        if own.size and np.any(layout.of(own) != part):
            raise CorruptPlanError(f"node plan (part {part}): this rank's service holds rows "
                                   "of other parts")  # fmt: skip
        return ne

    def draws(self, epoch: int, src: int, layout: Parts, part: int, num_samples: int,
              era: int | None = None) -> EpochDraws:  # fmt: skip
        """Local rank ``src``'s draws of ``epoch``, part ``part``'s section (checked)."""
        return unpack_draws(self.take(epoch, DRAWS, src, era), epoch=epoch, rank=self.group[src],
                            steps=self.steps, layout=layout, part=part,
                            num_samples=num_samples, tag=self.tag)  # fmt: skip

    def close(self) -> None:
        """Close the payloads' descriptors (their memory lives on while an epoch maps it)."""
        self.closed = True
        with self._lock:
            self._release(done_only=False)


class BoardReader:
    """A planner's stand-in on the host's other ranks: its epochs are local rank 0's, taken
    from the board (``NodeStream`` drives it as it drives a :class:`NodePlanner`)."""

    def __init__(self, board: EpochBoard, unpack: Any) -> None:
        self.board, self._unpack = board, unpack
        self.epoch = 0
        self.planner = self  # (NodeStream skips epochs and asks contents through .planner)

    def skip(self) -> None:
        """Go past an epoch without taking it (local rank 0 skips it too)."""
        self.epoch += 1

    def next(self) -> NodeEpoch:
        """The next epoch, as local rank 0 published it (waits for it)."""
        ne = self._unpack(self.epoch)
        self.epoch += 1
        return ne


def board_of(comm: Any, spec: PlanSpec, hosts: Hosts, host: int, rank: int,
             saves: bool = False) -> EpochBoard | None:  # fmt: skip
    """The host's board where several ranks share it and a communicator is given (a
    collective of ``comm``), else None: the rank plans its host itself. ``saves``: this rank
    saves node planner snapshots."""
    if comm is None or len(hosts.groups[host]) < 2:
        return None
    return EpochBoard(comm, hosts, host, rank, digest(spec.fingerprint, hosts, host),
                      int(spec.run.steps_per_epoch), saves)  # fmt: skip
