"""A preprocessing worker: the steps it owns of its trainers' plan, read, transformed, sent.

``solar worker HOST:PORT`` (or :func:`serve`) joins the trainers at their store, takes the
job (plan spec, data, transform) and plans, for each served trainer, the buffer of the steps it
owns of that trainer (solar/schedule/draw/members.py: the same planner, fed the trainer's
trace masked to this worker's steps; a buffer per (worker, trainer) pair). Then, in step order
over its trainers, within each trainer's credit: its hits gathered from that buffer, its misses
read, its admissions stored (the holdings stage of a Loader's rank), the rows transformed with
the trainer's generators and sent. Where the trainer's whole plan decides its batches (Shuffle
over several ranks) the worker plans that first, as the trainer does (pass 1: the batches;
once for all the trainers it serves), then its buffer over its steps of them (pass 2). Only
where a plan is given (a file) does it read every row of its steps, unplanned. It ends when
every trainer is done or gone; a trainer that dies costs the others nothing.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import wait
from typing import Any

import numpy as np

from solar._cpu import cpu_share
from solar.cache.slots import SlotBuffer
from solar.io.reader import Reader
from solar.remote import Remote
from solar.remote.link import DONE, HEAD, WorkerLink, digest, done, mac
from solar.runtime.holdings import Alone, Holdings, RawRefill
from solar.runtime.steps import Steps
from solar.runtime.workers import TransformPool
from solar.schedule.draw.members import MemberTrace, Roster, owner, workers_in
from solar.schedule.plans.members import WholePlan, member_spec
from solar.schedule.plans.rankplan import StepPlan
from solar.schedule.plans.stream import RankStream
from solar.schedule.policy import slot_count

log = logging.getLogger(__name__)


# A trainer's plan (its rank, roster and, planned again, the member trace before: its pass 1
# taken over) -> (stream, steps, buffer).
Planned = Callable[[int, Roster, "MemberTrace | None"],
                   tuple[RankStream, Steps, "Holdings | None"]]  # fmt: skip


@dataclasses.dataclass
class Served:
    """One trainer as its worker sees it; ``credits`` (a thread: gloo's operations complete
    in ``wait``) keeps ``position`` and ``limit`` as the trainer says, under ``changed``."""

    rank: int
    group: Any  # the pair's gloo group (trainer 0, worker 1)
    # Its plan of this trainer's steps (a roster: the trainer's workers by epoch, who owns
    # which step) -> (stream, steps, buffer: None where it reads rows unplanned).
    planned: Planned
    roster: dict[int, tuple[int, ...]]  # the trainer's workers by epoch (as rank 0 decided)
    changed: threading.Condition
    position: int = -1  # steps below it are no longer wanted (-1: no credit yet)
    limit: int = 0  # steps from it on not yet
    done: bool = False  # the trainer is done, or gone
    next: int = 0  # the next step to look at
    last: int = -1  # the position last looked at (below it: the trainer went back)
    sent: int = 0  # steps sent

    def __post_init__(self) -> None:
        self.stream, self.steps, self.holdings = self.planned(self.rank, self.rosters(), None)

    def rosters(self) -> Roster:
        return tuple(sorted(self.roster.items()))

    def owner(self, k: int, keep: int) -> int | None:
        """Who owns step ``k`` of this trainer, as far as this worker knows."""
        return owner(k, keep, workers_in(self.rosters(), k // self.steps.spe))

    def learn(self, e: int, members: Callable[[int], dict[int, list[int]] | None]) -> None:
        """Epoch ``e``'s workers of this trainer, once trainer rank 0 has decided them; where
        this worker's steps change, its buffer of them is planned again (then refilled)."""
        if e == 0 or e in self.roster:
            return
        got = members(e)
        if got is None:
            return  # not yet: the last workers known meanwhile
        before = workers_in(self.rosters(), e)
        self.roster[e] = tuple(got.get(self.rank, []))
        if self.roster[e] != before:
            self.next = min(self.next, e * self.steps.spe)  # its steps there looked at again
            if self.holdings is not None:
                self.stream.close()
                self.stream, self.steps, self.holdings = self.planned(
                    self.rank, self.rosters(), self.steps.member
                )

    def release(self) -> None:
        """This trainer is no longer served: its plan stopped, its buffer let go (a worker
        keeps only the counters of the trainers it served)."""
        self.stream.close()
        self.steps.release()  # (its pass 1 kept for the trainers it still serves)
        self.holdings = None

    def credits(self) -> None:
        """Take the trainer's credits until it is done or its pair breaks."""
        import torch

        t = torch.empty(2, dtype=torch.int64)
        try:
            while True:
                done(self.group.recv([t], 0, 0))
                position, limit = int(t[0]), int(t[1])
                with self.changed:
                    if position == DONE:
                        break
                    self.position, self.limit = position, limit
                    self.changed.notify_all()
        except RuntimeError:
            pass
        with self.changed:
            self.done = True
            self.changed.notify_all()


@dataclasses.dataclass
class WorkerReport:
    """What a worker did: steps and rows sent per trainer, seconds busy."""

    id: int
    sent: dict[int, int]
    rows: int = 0
    seconds: float = 0.0
    hits: int = 0  # rows taken from its buffers
    reads: int = 0  # rows read from storage (misses; and refills)


def serve(address: str, threads: int | None = None, wait_s: float = 600.0,
          key: str | None = None) -> WorkerReport:  # fmt: skip
    """Serve the trainers meeting at ``address`` until they are done; ``threads``: transform
    threads (default: this process's cores); ``wait_s``: how long to wait for the trainers;
    ``key``: the trainers' secret (default: ``$SOLAR_REMOTE_KEY``)."""
    link = WorkerLink(Remote(address, key=key), wait_s)
    report = WorkerReport(link.id, {})
    if link.late:  # given trainers at an epoch's start, if it comes before they are done
        log.info("solar worker %d: the trainers started without it: it waits for an epoch's "
                 "start", link.id)  # fmt: skip
    job = link.job
    spec, info, out_keys = job["spec"], job["info"], job["out_keys"]
    transform = dataclasses.replace(job["transform"], processes=False, remote=None)
    reader = Reader(info, job["reader"])
    pool = TransformPool(transform, job["seed"], info.keys, out_keys,
                         threads or cpu_share(1))  # fmt: skip
    changed = threading.Condition()
    whole = WholePlan(spec)  # pass 1, one for every trainer it serves (planned if asked)

    def planned(
        r: int, roster: Roster, before: MemberTrace | None
    ) -> tuple[RankStream, Steps, Holdings | None]:
        # Its buffer in RAM (the trainer's tier is the trainer's); the trainer's batches as
        # its spec decides them (pass 1 of the trainer's whole spec, tier and all).
        mine = member_spec(spec, r, int(job["keep"]), roster, link.id, ram=True,
                           before=before, whole=whole) if job.get("members") else None  # fmt: skip
        stream = RankStream(mine or spec, r)
        steps = Steps(spec, r, stream)
        return stream, steps, None if mine is None else _holdings(steps, reader)

    served: dict[int, Served] = {}
    every: list[Served] = []  # (a trainer served again has two; those ended, released)
    for r, g in link.groups.items():
        _serving(Served(r, g, planned, {0: tuple(link.live[r])}, changed), served, every)
    t0 = time.perf_counter()
    try:
        _loop(link, served, job, reader, pool, report, every, planned, changed)
    finally:
        report.seconds = time.perf_counter() - t0
        for s in every:
            report.sent[s.rank] = report.sent.get(s.rank, 0) + s.sent
        pool.close()
        reader.close()
        for s in every:
            s.stream.close()
    return report


def _serving(s: Served, served: dict[int, Served], every: list[Served]) -> None:
    """Serve trainer ``s`` from now on: its credits taken by a thread of their own."""
    served[s.rank] = s
    every.append(s)
    threading.Thread(target=s.credits, daemon=True, name=f"solar-credits-{s.rank}").start()


def _given(link: WorkerLink, served: dict[int, Served], every: list[Served], seen: int,
           planned: Planned, changed: threading.Condition) -> int:  # fmt: skip
    """The trainers that took this worker at each epoch's start trainer rank 0 decided since
    ``seen``, in order (a pairing it was given is never skipped), paired now; returns the last
    epoch looked at."""
    for e in range(seen + 1, link.latest() + 1):
        got = link.members(e)
        if got is None:
            return e - 1
        for r, workers in sorted(got.items()):
            if link.id not in workers or r in served:
                continue
            group = link.pair(e, r)
            if group is not None:
                _serving(Served(r, group, planned, {0: (), e: tuple(workers)}, changed),
                         served, every)  # fmt: skip
        seen = e
    return seen


def _loop(link: WorkerLink, served: dict[int, Served], job: dict, reader: Reader,
          pool: TransformPool, report: WorkerReport, every: list[Served], planned: Planned,
          changed: threading.Condition) -> None:  # fmt: skip
    """Round robin over the trainers: each one's next owned step within its credit; at an
    epoch's start, the trainers that take it. Until the trainers are done."""
    me, secret = link.id, link.key
    keep, end = int(job["keep"]), int(job["spec"].run.num_steps)
    seen = 0  # (the epochs decided before it got here, too)
    while served or not link.finished():
        seen = _given(link, served, every, seen, planned, changed)
        moved = False
        for r, s in list(served.items()):
            with changed:
                if s.done:
                    del served[r]
                    _last_word(s)
                    s.release()
                    continue
                position, limit = s.position, s.limit
            if position < 0:
                continue
            if position < s.last:  # the trainer went back (a seek): its steps are wanted again
                s.next = position
            s.last = position
            k, e = max(s.next, position), -1
            while k < min(end, limit):
                if k // s.steps.spe != e:  # (a new epoch's workers, once decided)
                    e, before = k // s.steps.spe, s.next
                    s.learn(e, link.members)
                    if s.next < before:  # its steps changed: looked at again from there
                        k = max(s.next, position)
                if s.owner(k, keep) == me:
                    break
                k += 1
            s.next = k
            if k >= end or k >= limit:
                continue  # no credit (or its run's steps are all sent): wait for the trainer
            try:
                report.rows += _send(s, k, reader, pool, job, secret, report)
            except RuntimeError:  # the pair broke: the trainer died
                del served[r]
                s.release()
                continue
            s.next, s.sent, moved = k + 1, s.sent + 1, True
        if not moved:
            with changed:
                changed.wait(0.05)  # a credit, or a trainer done


def _last_word(s: Served) -> None:
    """The header that ends the trainer's receiver (it said DONE; if it is gone, no matter)."""
    import torch

    try:
        done(s.group.send([torch.full((HEAD,), DONE, dtype=torch.int64)], 0, 1))
    except RuntimeError:
        pass


def _send(s: Served, k: int, reader: Reader, pool: TransformPool, job: dict,
          secret: bytes, report: WorkerReport) -> int:  # fmt: skip
    """Read (from its buffer where it keeps them), transform and send step ``k`` of trainer
    ``s``; returns its rows."""
    import torch

    plan, raw = _assemble(s, k, reader, pool, report)
    n = plan.size
    task = s.steps.transform_job(k, plan, np.arange(n))
    out = pool.staging(job["out_keys"], len(raw[0]))
    futures = pool.submit(raw, out, task)
    wait(futures)
    for f in futures:
        f.result()  # a transform's failure ends the worker (the trainer meets it too)
    first = np.array([k, n, digest(task.samples, task.repeat)], np.int64)
    data = [np.ascontiguousarray(a[:n]).reshape(-1).view(np.uint8) for a in out]
    signature = np.frombuffer(mac(secret, first.tobytes(), *(d.data for d in data)), np.int64)
    done(s.group.send([torch.from_numpy(np.concatenate([first, signature]))], 0, 1))
    for d in data:
        done(s.group.send([torch.from_numpy(d)], 0, 2))
    return n


def _assemble(s: Served, k: int, reader: Reader, pool: TransformPool,
              report: WorkerReport) -> tuple[StepPlan, list[np.ndarray]]:  # fmt: skip
    """Step ``k``'s plan and raw rows of trainer ``s`` (the pool's staging rows): read (no
    buffer), or its hits gathered, its misses read and its updates applied, the buffer brought
    to step ``k`` first: the steps between applied (another member's: nothing), or, an epoch or
    more behind or after a seek back, refilled."""
    steps, held = s.steps, s.holdings
    if held is None:
        steps.enter(k)
        plan = steps.plan(k)
        raw = pool.staging(reader.info.keys, max(plan.size, steps.served_rows()))
        reader.read(plan.samples, raw, np.arange(plan.size))
        report.reads += plan.size
        return plan, raw
    if not 0 <= held.at <= k or k - held.at >= steps.spe:
        steps.enter(k)
        cells, _ = steps.refill_at(k)
        held.refill(k)
        report.reads += cells.size
    while True:  # the steps it skipped (another member's, or late): their updates, not sent
        j = held.at
        steps.enter(j)
        plan = steps.plan(j)
        raw = pool.staging(reader.info.keys, max(plan.rows_needed, steps.served_rows()))
        held.gather(plan, raw)
        reads, rows = plan.storage_reads()
        if reads.size:
            reader.read(reads, raw, rows)
        held.settle(j, plan, raw)
        report.hits += plan.hit_rows.size
        report.reads += reads.size
        if j == k:
            return plan, raw


def _holdings(steps: Steps, reader: Reader) -> Holdings:
    """A buffer of this worker's steps of one trainer: RAM slots as the trainer's spec gives
    them (no tier)."""
    slots = slot_count(steps.run, steps.spec.buffer)
    buffer = SlotBuffer(slots, reader.info.keys)
    alone = Alone(buffer.arrays, None)
    rows = steps.spec.buffer.cap(steps.run.batch_size)
    return Holdings(buffer, None, steps, RawRefill(reader, buffer, None, reader.info.keys, rows,
                                                   alone), alone)  # fmt: skip
