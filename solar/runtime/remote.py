"""A trainer's transforms shared with its preprocessing workers (solar/remote).

:class:`RemoteTransforms` stands where the transform pool stands (the transform stage calls
``submit`` and, when it serves a step, ``due``): a step its own (:func:`~solar.remote.link.owner`)
goes to the local pool; a worker's step is waited for, its rows copied into the batch when
they arrive. What is not delivered when the step is served (within ``wait_s``), and every step
of a worker that died, is transformed here: a slow or lost worker costs throughput, never a
sample. A receiver thread per worker takes its deliveries; credits (``[position, limit]``) tell
it how far ahead it may go and which steps are no longer wanted.
"""

from __future__ import annotations

import dataclasses
import hmac
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field

import numpy as np

from solar.errors import SolarError
from solar.remote.link import DONE, HEAD, TrainerLink, digest, done, mac
from solar.runtime.setup import Setup
from solar.runtime.steps import Steps
from solar.runtime.workers import TransformPool
from solar.schedule.draw.members import TRAINER, MemberTrace, Roster, owner, workers_in
from solar.schedule.plans.members import member_spec
from solar.schedule.plans.stream import RankStream
from solar.schedule.spec import PlanSpec
from solar.transform import Rows

# Consecutive steps of a worker transformed here because late before it is taken for hung
# (lost); one that has delivered nothing yet (starting: imports, kernels) is given 4 times more.
HUNG_AFTER = 4


@dataclass
class WorkerFigures:
    """One worker's part of this trainer's run, as it goes."""

    steps: int = 0  # steps delivered and used
    rows: int = 0
    bytes: int = 0
    late: int = 0  # steps of its that the trainer transformed (not delivered in time)
    read: int = 0  # rows of its steps the trainer read from storage to transform them
    refused: int = 0  # deliveries not the trainer's step (digest) or not signed (the key)
    lost: bool = False  # its pair broke (it died), or it hung: its steps are the trainer's
    behind: int = 0  # its steps late in a row


@dataclass
class _Pending:
    src: list[np.ndarray]
    dst: list[np.ndarray]
    job: Rows
    worker: int
    future: Future = field(default_factory=Future)


def _after(futures: list[Future], then: Callable[[Future], None]) -> None:
    """Call ``then`` once every one of ``futures`` is done (with the last one)."""
    left = [len(futures)]
    lock = threading.Lock()

    def one(f: Future) -> None:
        with lock:
            left[0] -= 1
            if left[0]:
                return
        then(f)

    if not futures:
        then(Future())
    for f in futures:
        f.add_done_callback(one)


def _done(futures: list[Future], target: Future) -> None:
    """Resolve ``target`` with the busy seconds of ``futures`` once all are done."""

    def then(_: Future) -> None:
        errors = [f.exception() for f in futures if f.exception() is not None]
        if errors:
            target.set_exception(errors[0])
        else:
            target.set_result(sum(f.result() for f in futures))

    _after(futures, then)


def meet(setup: Setup) -> TrainerLink | None:
    """This trainer's meeting with its workers (a collective of the trainers), before its plan
    is made: who owns which step follows from the workers that paired. None without remote."""
    spec = setup.transform
    if spec is None or spec.remote is None:
        return None
    if setup.shared or setup.holds_transformed:
        why = "a buffer per host" if setup.shared else "a deterministic transform's rows held"
        raise SolarError(f"transform remote=: not with {why} (yet): pass "
                         "MemoryConfig(share='rank') or deterministic=False")  # fmt: skip
    remote = spec.remote
    job = {
        "spec": setup.spec, "info": setup.info, "out_keys": setup.out_keys,
        "transform": dataclasses.replace(spec, remote=None),  # (never the key)
        "seed": setup.run.seed, "world": setup.world_size, "keep": remote.keep,
        "join_s": remote.join_s,
        "reader": dataclasses.replace(setup.config, direct_io=setup.reader.direct_io),
        "members": setup.given is None,  # each member plans its own buffer (not a plan given)
    }  # fmt: skip
    module = getattr(spec.fn, "__module__", None)
    return TrainerLink(remote, setup.rank, setup.world_size, setup.comm, job, module)


def trainer_spec(setup: Setup, link: TrainerLink) -> PlanSpec | None:
    """The plan of this trainer's own buffer, over the steps it keeps (over its batches as its
    whole plan decides them, where it does: two passes, solar/schedule/plans/members.py), or
    None: every step's rows read here (a plan is given, or its sampler delivers more than
    rows)."""
    if setup.given is not None:
        return None
    return member_spec(setup.spec, setup.rank, link.remote.keep,
                       ((0, tuple(sorted(link.groups))),), TRAINER)  # fmt: skip


class RemoteTransforms(TransformPool):
    """This trainer's transform pool with its workers' deliveries in front of it."""

    def __init__(self, setup: Setup, link: TrainerLink, steps: Steps) -> None:
        spec = setup.transform
        assert spec is not None and spec.remote is not None
        super().__init__(spec, setup.run.seed, setup.info.keys, setup.out_keys, setup.cores)
        self.remote, self.link, self.setup = spec.remote, link, setup
        self.spe, self.cap = steps.spe, steps.served_rows()  # cap: rows a step may have
        # Each member keeps its own steps' rows (a mode of the plan, decided at construction):
        # a worker's step is not read here, so transforming it here reads it first, outside
        # the buffer (the reader's executor: the one that reads every row of this process).
        self.reader = setup.reader if steps.member is not None else None
        self.figures = {w: WorkerFigures() for w in link.groups}
        self._lock = threading.Lock()
        # Who owns which step: this trainer's workers by epoch, as trainer rank 0 decides them
        # at each epoch's start (from 0: those that paired); a later epoch has the last's.
        self._roster: dict[int, tuple[int, ...]] = {0: tuple(sorted(link.groups))}
        self._plans: list[RankStream] = []  # this trainer's plans made since (closed with it)
        self._live = sorted(link.groups)
        self._lost: dict[int, Future] = {w: Future() for w in self._live}  # its pair broke
        self._pending: dict[int, _Pending] = {}
        self._stash: dict[int, tuple[int, bool, list[np.ndarray]]] = {}  # came before asked
        self._position = -1  # the step being served (credits count from it)
        self._outbox: dict[int, queue.SimpleQueue] = {w: queue.SimpleQueue() for w in self._live}
        self._closing = False
        self._links: list[threading.Thread] = []
        for w in self._live:
            self._start(w)

    def submit(self, src: list[np.ndarray], dst: list[np.ndarray], job: Rows) -> list[Future]:
        """Transform ``job``'s rows into ``dst``: here, or by the step's worker."""
        k = job.epoch * self.spe + job.step
        if self._position < 0:
            self._credit(k)  # the first step asked for: the workers start from it
        with self._lock:
            # A lost worker's steps are the trainer's until the next epoch divides them among
            # the workers still live.
            w = owner(k, self.remote.keep, workers_in(self._rosters(), job.epoch))
            if w is None:
                return super().submit(src, dst, job)
            if w not in self._live:
                return self._here(src, dst, job, w)
            p = _Pending(src, dst, job, w)
            assert k not in self._pending, f"step {k} submitted twice"
            got = self._stash.pop(k, None)
            if got is None:
                self._pending[k] = p
                return [p.future]
        self._copy(p, *got)
        return [p.future]

    def _rosters(self) -> Roster:
        return tuple(sorted(self._roster.items()))

    def epoch(self, e: int, before: MemberTrace | None) -> RankStream | None:
        """Epoch ``e`` starts: its workers as trainer rank 0 decided them (every trainer's
        live workers at its start: a worker lost in the epoch before is no longer one, its
        steps divided among the others). With each member keeping its own steps, a new plan
        of this trainer's buffer where they changed (None: the same plan), taking over pass 1
        of ``before``, its buffer's trace until now."""
        if e == 0:
            return None
        mine = self._join(e, self.link.members(e).get(self.link.rank, []))
        with self._lock:
            was = workers_in(self._rosters(), e)
            self._roster[e] = mine
            if was == mine or self.reader is None:
                return None
            roster = self._rosters()
        setup = self.setup
        # (its pass 1 taken over: its epochs from the one served on)
        spec = member_spec(setup.spec, setup.rank, self.remote.keep, roster, TRAINER,
                           before=before)  # fmt: skip
        assert spec is not None  # (the mode is the run's: a roster from epoch 0 with workers)
        packing = None if setup.pack is None else setup.pack.model
        self._plans.append(RankStream(spec, setup.rank, packing=packing))
        return self._plans[-1]

    def _join(self, e: int, workers: list[int]) -> tuple[int, ...]:
        """This trainer's ``workers`` of epoch ``e``: new pairs with those it does not hold
        (joined since, or another trainer's before), those it no longer has told it is done
        (their steps here); the workers it has of them."""
        gone = [w for w in self._live if w not in workers]
        for w in gone:
            self._drop(w, lost=False)
        for w in workers:
            if w in self._live or (w in self.figures and self.figures[w].lost):
                continue
            group = self.link.pair(e, w)
            if group is None:  # it never came (failed, or gone meanwhile): a lost worker,
                with self._lock:  # its steps of the epoch transformed here
                    self.figures.setdefault(w, WorkerFigures()).lost = True
                    self._lost[w] = Future()
                    self._lost[w].set_result(None)
                continue
            self.link.groups[w] = group
            with self._lock:
                self.figures.setdefault(w, WorkerFigures())
                self._lost[w], self._outbox[w] = Future(), queue.SimpleQueue()
                self._live.append(w)
                if self._position >= 0:
                    self._outbox[w].put((self._position, self._position + self.remote.window))
            self._start(w)
        self.link.live(sorted(self._live))
        # The roster as decided (the workers count the same owners): a step of one not live
        # is transformed here.
        return tuple(workers)

    def _start(self, w: int) -> None:
        """Worker ``w``'s threads: its deliveries received, its credits sent (gloo's
        operations complete in ``wait``: one blocking thread each way)."""
        for fn in (self._receive, self._send_credits):
            t = threading.Thread(target=fn, args=(w,), daemon=True, name=f"solar-remote-{w}")
            self._links.append(t)
            t.start()

    def due(self, k: int, futures: list[Future]) -> list[Future]:
        """Step ``k`` is served now: its worker's rows within ``wait_s``, else transformed
        here (the futures to wait for instead)."""
        self._credit(k)
        p = self._pending.get(k)
        if p is None:
            return futures
        wait([p.future, self._lost[p.worker]], self.remote.wait_s, return_when=FIRST_COMPLETED)
        with self._lock:
            if self._pending.pop(k, None) is None:  # delivered (or made here) meanwhile
                return futures
            fig = self.figures[p.worker]
            fig.late, fig.behind = fig.late + 1, fig.behind + 1
            hung = fig.behind >= HUNG_AFTER * (1 if fig.steps else 4)
        local = self._here(p.src, p.dst, p.job, p.worker)
        _done(local, p.future)
        if hung:
            self._lose(p.worker)
        return local

    def forget(self) -> None:
        """The steps assembled ahead are dropped (a seek): nothing waits for their workers."""
        with self._lock:
            dropped, self._pending = self._pending, {}
        for p in dropped.values():
            p.future.set_result(0.0)

    def _here(self, src: list[np.ndarray], dst: list[np.ndarray], job: Rows,
              w: int) -> list[Future]:  # fmt: skip
        """Worker ``w``'s step transformed here: with each member keeping its own steps, its
        rows read first, from storage, outside the buffer (no plan of this trainer's keeps
        them)."""
        if self.reader is None:
            return super().submit(src, dst, job)
        self.figures[w].read += int(job.rows.size)
        reads = self.reader.submit(job.samples, src, job.rows)
        target: Future = Future()

        def transform(_: Future) -> None:
            errors = [f.exception() for f in reads if f.exception() is not None]
            if errors:
                target.set_exception(errors[0])
            else:
                _done(TransformPool.submit(self, src, dst, job), target)

        _after(reads, transform)
        return [target]

    # -- credits and deliveries -------------------------------------------------------------
    def _credit(self, k: int) -> None:
        """Tell every live worker: steps from ``k`` are wanted, up to ``k + window``."""
        if k == self._position:
            return
        self._position = k
        with self._lock:  # deliveries of steps before it are no longer wanted
            for old in [j for j in self._stash if j < k]:
                del self._stash[old]
        limit = DONE if k == DONE else k + self.remote.window
        for w in self._live:
            self._outbox[w].put((k, limit))

    def _send_credits(self, w: int) -> None:
        """Worker ``w``'s credits, the latest of those queued each time (gloo's send completes
        only in ``wait``: a thread of its own), until the trainer is done or the pair breaks."""
        import torch

        box, group = self._outbox[w], self.link.groups[w]
        while True:
            credit = box.get()
            while not box.empty():
                credit = box.get()  # only the latest matters
            try:
                done(group.send([torch.tensor(credit, dtype=torch.int64)], 1, 0))
            except RuntimeError:
                if not self._closing:
                    self._lose(w)
                return
            if credit[0] == DONE:
                return

    def _receive(self, w: int) -> None:
        """Worker ``w``'s deliveries, until its pair breaks (it died, or the run is done)."""
        import torch

        group = self.link.groups[w]
        head = torch.empty(HEAD, dtype=torch.int64)
        try:
            while True:
                done(group.recv([head], 1, 1))
                k, n, dig = (int(v) for v in head[:3])
                if k == DONE:  # the worker's last word: the trainer is done
                    return
                if not self._expected(k, n):
                    break  # a worker that says nonsense is lost
                rows, raw = [], [memoryview(head[:3].numpy().tobytes())]
                for key in self.out_keys:
                    t = torch.empty(n * key.row_bytes, dtype=torch.uint8)
                    done(group.recv([t], 1, 2))
                    raw.append(t.numpy().data)
                    rows.append(t.numpy().view(key.native_dtype).reshape(n, *key.sample_shape))
                signed = hmac.compare_digest(head[3:].numpy().tobytes(), mac(self.link.key, *raw))
                self._arrived(w, k, dig, signed, rows)
        except Exception:  # whatever ends this thread (a broken pair, a bad message)
            pass
        if not self._closing:  # ... the worker is lost
            self._lose(w)

    def _expected(self, k: int, n: int) -> bool:
        """Whether ``n`` rows may be step ``k``'s (before allocating them)."""
        with self._lock:
            p = self._pending.get(k)
        return 0 <= n <= self.cap if p is None else n == p.job.rows.size

    def _arrived(self, w: int, k: int, dig: int, signed: bool, rows: list[np.ndarray]) -> None:
        with self._lock:
            p = self._pending.pop(k, None)
            if p is None:
                if k >= self._position:  # asked for later (assembled after it came)
                    self._stash[k] = (dig, signed, rows)
                return
        self._copy(p, dig, signed, rows)

    def _copy(self, p: _Pending, dig: int, signed: bool, rows: list[np.ndarray]) -> None:
        """A worker's rows go into the batch on the transform workers, where a step
        transformed here is written (never on the receiver: it only moves transport bytes)."""

        def copy() -> None:
            try:
                self._deliver(p, dig, signed, rows)
            except BaseException as exc:  # (nothing may leave the step's future unresolved)
                if not p.future.done():
                    p.future.set_exception(exc)

        try:
            self._threads().submit(copy)
        except RuntimeError:  # the pool resized (or closing) meanwhile: copied here
            copy()

    def _deliver(self, p: _Pending, dig: int, signed: bool, rows: list[np.ndarray]) -> None:
        """Copy a worker's rows of its step into the batch, if they are the step's, signed."""
        fig = self.figures[p.worker]
        n = p.job.rows.size
        mine = dig == digest(p.job.samples, p.job.repeat)
        if not (signed and mine) or any(r.shape[0] != n for r in rows):
            fig.refused += 1  # not this trainer's step, or not signed: transformed here
            _done(self._here(p.src, p.dst, p.job, p.worker), p.future)
            return
        t0 = time.perf_counter()
        for dst, got in zip(p.dst, rows, strict=True):
            dst[p.job.rows] = got
        fig.steps, fig.rows, fig.behind = fig.steps + 1, fig.rows + n, 0
        fig.bytes += sum(r.nbytes for r in rows)
        p.future.set_result(time.perf_counter() - t0)

    def _lose(self, w: int) -> None:
        """Worker ``w`` is gone: its pending steps are transformed here, and its steps from now
        on are the trainer's (until the next epoch divides them among the workers live)."""
        self._drop(w, lost=True)

    def _drop(self, w: int, lost: bool) -> None:
        """Worker ``w`` serves no more (``lost``: it died or hung; else another trainer has
        it from this epoch on): told so, its pending steps transformed here."""
        with self._lock:
            if w not in self._live:
                return
            self._live.remove(w)
            if lost:
                self.figures[w].lost = True
                self._lost[w].set_result(None)
            self._outbox[w].put((DONE, DONE))  # its credit thread ends
            mine = {k: p for k, p in self._pending.items() if p.worker == w}
            for k in mine:
                del self._pending[k]
            live = list(self._live)
        for p in mine.values():  # first: nothing after may leave a step unfinished
            _done(self._here(p.src, p.dst, p.job, p.worker), p.future)
        if lost:
            self.link.live(live)  # (rank 0 divides its steps at the next epoch's start)

    def close(self) -> None:
        """Tell the workers this trainer is done, wait for its threads, stop the pool."""
        self._closing = True
        self.link.finish()  # (rank 0: workers never given a trainer end)
        with self._lock:  # (not through _credit: DONE is also where credits start)
            self._position = DONE
            for w in self._live:
                self._outbox[w].put((DONE, DONE))
        self.forget()
        deadline = time.monotonic() + 10
        for t in self._links:  # a worker's last header ends its receiver
            t.join(max(0.0, deadline - time.monotonic()))
        self.link.close()
        for plan in self._plans:
            plan.close()
        super().close()
