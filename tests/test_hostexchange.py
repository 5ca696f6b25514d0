"""Planning once per host: local rank 0 publishes each epoch of its host's node plan in a
sealed memfd (solar/schedule/plans/hostpayload.py's bytes; solar/host/memfd.py), named to the
others in a round of the planning thread's communicator (solar/host/exchange.py); what they
receive is what they would have planned, and a payload that is not is refused in one line.
Hosts of unequal sizes (solar/schedule/keep/hostplan.py) are planned one host at a time. (Under
mpiexec and torchrun, with restarts and closes while planning is ahead:
tests/mpi/host_exchange.py.)"""

from __future__ import annotations

import errno
import mmap
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from helpers import kept_part
from plan_checks import _replay

from solar import BufferConfig, PlanSpec, RunConfig
from solar.errors import CorruptPlanError, SolarError
from solar.host.exchange import FD, HostExchange, Interrupted, Payload
from solar.host.memfd import frozen
from solar.schedule.draw.draws import own_draws
from solar.schedule.draw.samplers import SHUFFLE, Weighted
from solar.schedule.keep.grouping import Hosts, stage_bound
from solar.schedule.keep.hostplan import HostPlanner, host_totals
from solar.schedule.keep.hostrun import host_parts, host_run_spec
from solar.schedule.plans.hostpayload import (
    DRAWS,
    KINDS,
    PART,
    WHOLE,
    _layout,
    _offsets,
    digest,
    pack,
    pack_draws,
    unpack,
    unpack_draws,
    unpack_part,
)  # fmt: skip
from solar.schedule.plans.hostview import assemble
from solar.schedule.plans.rankplan import RankPlan
from solar.schedule.plans.stream import RankStream
from solar.schedule.policy import HIT, PEER, SIDE


class _Pair:
    """The host communicator of two ranks in one process, on two threads (``dup``: the
    planning thread's, another pair)."""

    def __init__(self) -> None:
        self.slots: list = [None, None]
        self.gate = threading.Barrier(2, timeout=60)  # (a hang guard: a deadlock raises)
        self.lock = threading.Lock()
        self.child: _Pair | None = None

    def of(self, local: int):
        pair = self

        class Comm:
            def Get_size(self):
                return 2

            def allgather(self, obj):
                pair.slots[local] = obj
                pair.gate.wait()
                got = list(pair.slots)
                pair.gate.wait()
                return got

            def dup(self):
                with pair.lock:
                    if pair.child is None:
                        pair.child = _Pair()
                return pair.child.of(local)

        return Comm()


def _spec(world=2, n=600, batch=10, epochs=3, cap=15):
    run = RunConfig(n, world, batch, epochs, seed=4)
    w = ((1.0 + np.arange(n)) ** -0.8)[np.random.default_rng(2).permutation(n)]
    return PlanSpec(run, BufferConfig(cap), sampler=Weighted(w, affinity=False))


def _exchanges():
    """The exchanges of a host's two local ranks, made together (on two threads)."""
    pair = _Pair()
    with ThreadPoolExecutor(2) as pool:
        made = [pool.submit(HostExchange, pair.of(j), 0, j, 2, j, KINDS) for j in (0, 1)]
        lead, other = made[0].result(), made[1].result()
    assert lead.extras == other.extras == [0, 1] and lead.pcomm is not None
    return lead, other


def _round(ex, *args):
    """Round ``args`` on both exchanges at once (their planning threads); both results."""
    with ThreadPoolExecutor(2) as pool:
        made = [pool.submit(e.round, *a) for e, a in zip(ex, args, strict=True)]
        return [f.result(timeout=60) for f in made]


def _stop(ex):
    with ThreadPoolExecutor(2) as pool:
        for f in [pool.submit(e.stop, lambda: None) for e in ex]:
            f.result(timeout=60)


def _epoch(ex, rec, spec, hosts, k, cells, rank=1):
    return unpack(ex.open(rec), epoch=k, hosts=hosts, host=0, rank=rank,
                  steps=spec.run.steps_per_epoch, num_samples=spec.run.num_samples, slots=cells,
                  tier=0, tag=digest(spec.fingerprint, hosts, 0))  # fmt: skip


def test_each_rank_receives_the_epochs_it_would_have_planned():
    spec, hosts = _spec(), Hosts.grid(1, 2)
    lead, other = _exchanges()
    tag = digest(spec.fingerprint, hosts, 0)
    cells = host_run_spec(spec, hosts).slots
    p, q = HostPlanner(spec, hosts, only_host=0), HostPlanner(spec, hosts, only_host=0)
    for k in range(spec.run.epochs):
        contents = p.planner.contents(0)
        fd = frozen(*pack(p.next(), 0, contents, tag))
        mine, theirs = _round((lead, other), (WHOLE, k, fd), (WHOLE, k))
        assert theirs[1] is None and int(theirs[0][FD]) == fd
        assert mine[1] is None and np.array_equal(mine[0], theirs[0])
        want = q.next()
        got = _epoch(other, theirs[0], spec, hosts, k, cells)
        for r in (0, 1):
            a, b = got.rank(r), want.rank(r)
            for name in ("sample", "slot", "flags", "step_offsets", "tslot"):
                assert getattr(a, name).tobytes() == getattr(b, name).tobytes(), (k, r, name)
        h, wh = got.host.rank(0), want.host.rank(0)
        for name in ("sample", "slot", "flags", "step_offsets", "tslot"):
            assert np.array_equal(getattr(h, name), getattr(wh, name)), (k, name)
        assert np.array_equal(got.initial, contents)
        # The staging sets: every step's rows a local rank takes from another's read.
        ro, so = want.ranks.rank_offsets, want.ranks.step_offsets
        offsets, values = got.staged
        for t in range(spec.run.steps_per_epoch):
            taken = [want.at[ro[r] + so[r, t] : ro[r] + so[r, t + 1]][
                (want.ranks.flags[ro[r] + so[r, t] : ro[r] + so[r, t + 1]] & PEER) != 0]
                for r in (0, 1)]  # fmt: skip
            assert np.array_equal(values[offsets[t] : offsets[t + 1]],
                                  np.unique(np.concatenate(taken)))  # fmt: skip
        assert np.any(got.ranks.flags & PEER)  # (the case shares rows)
        last = fd
    # A descriptor is closed once every rank mapped its payload (at the next round), the last
    # one as the exchange stops; the reader's mappings live on.
    assert lead._held == [last]
    _stop((lead, other))
    assert not lead._held
    with pytest.raises(OSError):
        os.fstat(last)
    assert np.array_equal(got.ranks.sample, want.ranks.sample)


def _payload(spec, hosts):
    p = HostPlanner(spec, hosts, only_host=0)
    contents = p.planner.contents(0)
    fd = frozen(*pack(p.next(), 0, contents, digest(spec.fingerprint, hosts, 0)))
    size = os.fstat(fd).st_size
    return fd, bytearray(os.pread(fd, size, 0))


def _unpack(buf, spec, hosts, **kw):
    m = mmap.mmap(-1, len(buf))
    m[:] = bytes(buf)
    args = dict(epoch=0, hosts=hosts, host=0, rank=1, steps=spec.run.steps_per_epoch,
                num_samples=spec.run.num_samples, slots=host_run_spec(spec, hosts).slots, tier=0,
                tag=digest(spec.fingerprint, hosts, 0))  # fmt: skip
    args.update(kw)
    return unpack(m, **args)


def test_a_corrupted_shared_epoch_is_refused_in_one_line():
    spec, hosts = _spec(), Hosts.grid(1, 2)
    fd, buf = _payload(spec, hosts)
    os.close(fd)
    ne = _unpack(buf, spec, hosts)  # as published: accepted
    n_host, n_ranks = ne.host.sample.size, ne.ranks.sample.size
    with pytest.raises(CorruptPlanError, match="another run, host or epoch"):
        _unpack(buf, spec, hosts, epoch=1)
    with pytest.raises(CorruptPlanError, match="another run"):
        _unpack(buf, spec, hosts, tag=(1, 2))
    with pytest.raises(CorruptPlanError, match="bytes"):
        _unpack(buf[:-8], spec, hosts)
    # Bytes of this rank's service, changed where they stand: a slot, a sample, an index.
    head = np.frombuffer(bytes(buf[: 16 * 8]), np.int64)
    steps = spec.run.steps_per_epoch
    where, _ = _offsets(_layout(steps, 2, n_host, n_ranks, int(head[10]), int(head[11])))
    mine = ne.ranks.rank_offsets[1]  # rank 1's first access
    for name, dt, bad, word in (("r_slot", np.int32, 10**6, "slots"),
                                ("r_sample", np.int64, -3, "samples"),
                                ("r_at", np.int64, n_host + 5, "host indexes"),
                                ("h_steps", np.int64, 10**9, "host step offsets"),
                                ("contents", np.int64, spec.run.num_samples,
                                 "contents")):  # fmt: skip
        b = bytearray(buf)
        at = where[name] + (mine if name.startswith("r_") else 1) * np.dtype(dt).itemsize
        b[at : at + np.dtype(dt).itemsize] = np.array([bad], dt).tobytes()
        with pytest.raises(CorruptPlanError, match=word):
            _unpack(b, spec, hosts)
    # The host's decisions: checked when first used (a resume's replay).
    b = bytearray(buf)
    at = where["h_slot"]
    b[at : at + 4] = np.array([10**6], np.int32).tobytes()
    ne = _unpack(b, spec, hosts)
    with pytest.raises(CorruptPlanError, match="host slots"):
        ne.host.rank(0)


def test_a_published_epoch_cannot_change_after_it_was_checked():
    """A payload is checked once, then used in place: a same-user process that opens local
    rank 0's descriptor (a round names it) can neither rewrite it (a slot out of range for a
    kernel) nor truncate it (SIGBUS in every rank mapping it), and a record naming a payload
    that could change, or another file than it names, is refused in one line."""
    spec, hosts = _spec(), Hosts.grid(1, 2)
    lead, other = _exchanges()
    cells = host_run_spec(spec, hosts).slots
    fd, _ = _payload(spec, hosts)
    _, got = _round((lead, other), (WHOLE, 0, fd), (WHOLE, 0))
    ne = _epoch(other, got[0], spec, hosts, 0, cells)
    slots = ne.ranks.slot.copy()
    w = os.open(f"/proc/{os.getpid()}/fd/{fd}", os.O_RDWR)
    try:
        with pytest.raises(PermissionError):
            os.pwrite(w, np.full(64, 10**6, np.int32).tobytes(), os.fstat(w).st_size - 256)
        with pytest.raises(PermissionError):
            os.ftruncate(w, 0)
        with pytest.raises(PermissionError):
            mmap.mmap(w, 4096)
    finally:
        os.close(w)
    assert np.array_equal(ne.ranks.slot, slots)
    # The same bytes in a memfd anyone may write, named in a record (a peer's payload is
    # opened through /proc, its inode and seals checked).
    size = os.fstat(fd).st_size
    fake = os.memfd_create("fake")
    os.pwrite(fake, os.pread(fd, size, 0), 0)
    rec = got[0].copy()
    rec[4:8] = (os.getpid(), fake, os.fstat(fake).st_ino, size)
    other.pid = -1  # (opened as another process's, through /proc)
    with pytest.raises(CorruptPlanError, match="not sealed"):
        other.open(rec)
    rec[6] += 1  # another file than the record names: refused
    with pytest.raises(SolarError, match="no longer the file"):
        other.open(rec)
    rec[4] = 2**22 + 7  # (no such process)
    with pytest.raises(SolarError, match="cannot open"):
        other.open(rec)
    os.close(fake)
    _stop((lead, other))


def test_a_round_after_close_or_while_stopping_is_interrupted():
    lead, other = _exchanges()
    _stop((lead, other))  # (nothing begun: agreed at 0 rounds)
    with ThreadPoolExecutor(2) as pool:
        for f in [pool.submit(e.close, lambda: None) for e in (lead, other)]:
            f.result(timeout=60)
    fd = os.memfd_create("x")
    with pytest.raises(Interrupted, match="part of epoch 3 interrupted"):
        other.round(PART, 3, fd)
    with pytest.raises(OSError):
        os.fstat(fd)  # (the exchange owned it: closed)


def _read(part, t):
    """The rows ``part`` reads from storage at step ``t``."""
    s = slice(part.step_offsets[t], part.step_offsets[t + 1])
    return part.sample[s][(part.flags[s] & (HIT | PEER)) == 0]


def test_hosts_of_unequal_sizes_where_the_sampler_fixes_each_rank_batch():
    assert Hosts.parse("3,1", 4).groups == ((0, 1, 2), (3,))
    assert not Hosts.parse("3,1").uniform and Hosts.parse("2x2").uniform
    with pytest.raises(SolarError, match="5 ranks, but the job has 4"):
        Hosts.parse("3,2", 4)
    spec, hosts = _spec(world=4, n=900, batch=8, cap=10), Hosts.parse("3,1")
    draws = spec.sampler
    reads = 0
    for h, group in enumerate(hosts.groups):
        hspec = host_run_spec(spec, hosts, host=h)
        assert hspec.buffer.capacity == 10 * len(group)
        p = HostPlanner(spec, hosts, only_host=h)
        epochs = [p.next() for _ in range(spec.run.epochs)]
        for k, ne in enumerate(epochs):
            for r in group:
                part = ne.rank(r)
                for t in range(spec.run.steps_per_epoch):
                    s = slice(part.step_offsets[t], part.step_offsets[t + 1])
                    served = part.sample[s][(part.flags[s] & SIDE) == 0]
                    want = np.unique(draws.batch(spec.run, k, t, r))
                    assert np.array_equal(np.sort(served), want), (h, k, t, r)
                    # A miss read by another local rank: that rank reads it at this step.
                    for x, f in zip(part.sample[s], part.flags[s], strict=True):
                        if f & PEER:
                            assert any(x in _read(ne.rank(q), t) for q in group if q != r)
        # The host's buffer replays: each hit finds its sample where the plan says.
        rp = RankPlan.from_parts(h, [ne.host.rank(h) for ne in epochs], hspec.slots)
        _replay(rp, hspec.slots, 0)
        reads += sum(ne.storage_reads() for ne in epochs)
    # `solar plan --hosts 3,1`'s figures: every host's, each planned alone.
    got = host_totals(spec, hosts)
    assert got.buffer_per_host == [30, 10] and got.reads + got.side_reads == reads
    # A sampler with affinity splits each global batch evenly over the hosts: refused.
    shuffle = PlanSpec(RunConfig(900, 4, 8, 2), BufferConfig(10), sampler=SHUFFLE)
    with pytest.raises(SolarError, match=r"ranks per host differ \(\[3, 1\]\)"):
        HostPlanner(shuffle, hosts, only_host=0)
    with pytest.raises(SolarError, match="ranks per host differ"):
        host_run_spec(spec, hosts)  # (every host at once: which size?)


def test_each_rank_plans_its_part_and_sees_the_host_plan_merged():
    """A host's buffer in parts (solar/schedule/keep/hostparts.py): each local rank plans and posts
    one part; every rank's view, put together from the parts it takes (plans/hostview.py), is its
    service in the plan one process makes of every part, merged: the same rows, decisions,
    cells, readers, staging sets, initial cells and (asked on a resume) host decisions."""
    spec, hosts = _spec(), Hosts.grid(1, 2)
    ex = _exchanges()
    tag = digest(spec.fingerprint, hosts, 0)
    hspec = host_run_spec(spec, hosts)
    parts = host_parts(hspec, hosts, 0)
    assert parts is not None and parts.count == 2
    cells = [(parts.size(hspec.slots, j), 0) for j in (0, 1)]
    mine = [HostPlanner(spec, hosts, only_host=0, part=j) for j in (0, 1)]
    whole = HostPlanner(spec, hosts, only_host=0)
    n = spec.run.num_samples
    for k in range(spec.run.epochs):
        contents = whole.planner.contents(0)
        want = whole.next()
        fds = []
        for j in (0, 1):
            c = mine[j].planner.contents(0)
            fds.append(frozen(*pack(mine[j].next(), 0, c, tag, j)))
        recs = _round(ex, (PART, k, fds[0]), (PART, k, fds[1]))
        for r, b in enumerate(ex):
            got = assemble([unpack_part(b.open(recs[r][j]), epoch=k, hosts=hosts, host=0, rank=r,
                                        steps=spec.run.steps_per_epoch, num_samples=n,
                                        layout=parts, part=j, slots=cells[j][0], tier=0,
                                        tag=tag) for j in (0, 1)],
                           r, [0, 1], parts, hspec.slots, 0)  # fmt: skip
            a, w = got.rank(r), want.rank(r)
            for name in ("sample", "slot", "flags", "step_offsets", "tslot"):
                assert getattr(a, name).tobytes() == getattr(w, name).tobytes(), (k, r, name)
            lo, hi = want.ranks.rank_offsets[r], want.ranks.rank_offsets[r + 1]
            assert np.array_equal(got.reader, want.reader[lo:hi])
            assert np.array_equal(got.initial, contents)
            # Host indexes number the parts one after another: the same accesses as ``at``.
            h = got.host.rank(0)
            wh = want.host.rank(0)
            for name in ("sample", "slot", "flags", "step_offsets", "tslot"):
                assert np.array_equal(getattr(h, name), getattr(wh, name)), (k, name)
            offsets, values = got.staged
            so = got.ranks.step_offsets[r]
            for t in range(spec.run.steps_per_epoch):
                peer = (a.flags[so[t] : so[t + 1]] & PEER) != 0
                staged = values[offsets[t] : offsets[t + 1]]
                assert np.all(np.isin(got.at[so[t] : so[t + 1]][peer], staged))
    _stop(ex)


def test_a_ranks_posted_draws_are_taken_part_by_part_and_checked():
    spec, hosts = _spec(), Hosts.grid(1, 2)
    lead, other = _exchanges()
    tag = digest(spec.fingerprint, hosts, 0)
    parts = host_parts(host_run_spec(spec, hosts), hosts, 0)
    assert parts is not None
    own = own_draws(spec.sampler, spec.run, 0, 1)
    split = parts.split(own)  # (every part's at once, each batch in its order)
    for j in (0, 1):
        assert np.array_equal(split[j].ids, kept_part(parts, own, j).ids)
        assert np.array_equal(split[j].offsets, kept_part(parts, own, j).offsets)
    assert sum(d.ids.size for d in split) == own.ids.size
    fd = frozen(*pack_draws(split, 0, 1, tag))
    got0, _ = _round((lead, other), (DRAWS, 0), (DRAWS, 0, fd))
    n = spec.run.num_samples
    steps = spec.run.steps_per_epoch
    for j in (0, 1):
        got = unpack_draws(lead.open(got0[1]), epoch=0, rank=1, steps=steps, layout=parts,
                           part=j, num_samples=n, tag=tag)  # fmt: skip
        want = kept_part(parts, own, j)
        assert np.array_equal(got.ids, want.ids) and np.array_equal(got.offsets, want.offsets)
    # Untrusted: an id out of range, or offsets that are not, refused in one line.
    buf = bytearray(os.pread(fd, os.fstat(fd).st_size, 0))

    def refused(edit, match):
        b = bytearray(buf)
        edit(np.frombuffer(b, np.int64))
        m = mmap.mmap(-1, len(b))
        m[:] = bytes(b)
        with pytest.raises(CorruptPlanError, match=match):
            unpack_draws(m, epoch=0, rank=1, steps=steps, layout=parts, part=0,
                         num_samples=n, tag=digest(spec.fingerprint, hosts, 0))  # fmt: skip

    head, k = 16, 2 * (steps + 1)

    def far_id(a):
        a[head + k] = n

    def back(a):
        a[head + 1] = -1

    def other_epoch(a):
        a[2] = 1

    def other_part(a):
        a[head + k] = 1 if parts.of(np.array([0]))[0] == 0 else 0  # (a row of part 1)

    refused(far_id, "drawn ids outside")
    refused(other_part, "rows of other parts")
    refused(back, "offsets")
    refused(other_epoch, "another run, rank or epoch")
    _stop((lead, other))


def test_ranks_exchanging_other_epochs_or_kinds_are_named_in_one_line():
    """A round's records disagree (a rank plans another epoch, or posts its part where its
    host's ranks post their draws): every rank refuses it in one line naming both."""
    lead, other = _exchanges()
    for theirs, what in (((PART, 5), "part of epoch 5"), ((DRAWS, 6), "draws of epoch 6")):
        with ThreadPoolExecutor(2) as pool:
            made = [pool.submit(lead.round, PART, 4), pool.submit(other.round, *theirs)]
            for f in made:
                with pytest.raises(SolarError, match="must plan the same epochs") as exc:
                    f.result(timeout=60)
                assert "part of epoch 4" in str(exc.value) and what in str(exc.value)
    _stop((lead, other))


def test_a_rank_that_cannot_make_its_payload_fails_every_rank_of_the_round(monkeypatch):
    """Local rank 1's memfd cannot be made (no room): it still enters the round, saying so, and
    every rank raises the same line instead of its peers waiting for it."""
    import solar.host.exchange as exchange

    def frozen_or_full(label, nbytes, pieces):
        if label == "full":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return frozen(label, nbytes, pieces)

    monkeypatch.setattr(exchange._memfd, "frozen", frozen_or_full)
    lead, other = _exchanges()
    piece = [(0, np.arange(4, dtype=np.int64))]
    with ThreadPoolExecutor(2) as pool:
        made = [pool.submit(lead.post, PART, 2, Payload("ok", 32, piece)),
                pool.submit(other.post, PART, 2, Payload("full", 32, piece))]  # fmt: skip
        for f in made:
            with pytest.raises(SolarError) as exc:
                f.result(timeout=60)
            assert str(exc.value) == ("host exchange: local rank 1 cannot post its part of "
                                      "epoch 2: No space left on device")  # fmt: skip
    _stop((lead, other))


def test_a_stop_completes_the_rounds_a_rank_began_alone():
    """Rank 0's planning thread is ahead: it waits in a round rank 1's never begins. A stop
    (restart, close) completes it with a stop record, the thread's round is interrupted, no
    round begins after, and the payloads go."""
    lead, other = _exchanges()
    fd = os.memfd_create("x")
    with ThreadPoolExecutor(1) as pool:
        ahead = pool.submit(lead.round, PART, 0, fd)
        with ThreadPoolExecutor(2) as stops:
            done = [stops.submit(lead.stop, lambda: ahead.exception(timeout=60)),
                    stops.submit(other.stop, lambda: None)]  # fmt: skip
            for f in done:
                f.result(timeout=60)
        with pytest.raises(Interrupted):
            ahead.result()
    assert lead.rounds == other.rounds == 1 and not lead._held
    with pytest.raises(OSError):
        os.fstat(fd)
    # Rounds begin again after a stop, in step.
    a, b = _round((lead, other), (DRAWS, 0), (DRAWS, 0))
    assert a == [None, None] and b == [None, None]
    _stop((lead, other))


def test_a_stop_round_releases_no_payload_a_thread_may_still_map():
    """Rank 1's planning thread took round 1's payloads and maps them after its round
    returns; meanwhile rank 0's foreground stops, completing rank 0's thread's round 2 with
    a stop record: rank 0 must not release round 1's payload then (rank 1 would fail to map
    it: an error, not the Interrupted a stop makes). It goes at the stop's end."""
    lead, other = _exchanges()
    first = [os.memfd_create("a"), os.memfd_create("b")]
    for fd in first:
        os.write(fd, b"payload")
    got = _round((lead, other), (DRAWS, 0, first[0]), (DRAWS, 0, first[1]))
    later = os.memfd_create("c")
    with ThreadPoolExecutor(1) as pool:
        ahead = pool.submit(lead.round, DRAWS, 1, later)
        while lead.rounds < 2:  # (its round begun: the stop completes it)
            time.sleep(0.001)

        def mapped_after_the_stop_round():  # (rank 1's thread, late: rank 0's round is done)
            assert isinstance(ahead.exception(timeout=60), Interrupted)
            other.open(got[1][0]).close()

        with ThreadPoolExecutor(2) as stops:
            done = [stops.submit(lead.stop, lambda: ahead.exception(timeout=60)),
                    stops.submit(other.stop, mapped_after_the_stop_round)]  # fmt: skip
            for f in done:
                f.result(timeout=60)
    assert not lead._held and not other._held
    for fd in (*first, later):
        with pytest.raises(OSError):
            os.fstat(fd)  # (released at the stop's end)


def test_a_wait_for_a_rank_alive_that_never_begins_a_round_gives_up_in_one_line():
    """Rank 0 waits for its thread's round, which rank 1 (alive: seeked alone) never begins:
    after the limit (the host barrier's, 30 min; here 0.3 s) one line names the wait."""
    lead, other = _exchanges()
    lead.limit_s = 0.3
    with ThreadPoolExecutor(2) as pool:
        ahead = pool.submit(lead.round, DRAWS, 0)
        with pytest.raises(SolarError) as err:
            lead.wait(ahead)
        assert "host exchange: local rank 0 of host 0 waited more than 0.3 s for " in \
            str(err.value) and "local ranks [1] run" in str(err.value)  # fmt: skip
        assert "\n" not in str(err.value)
        late = pool.submit(other.round, DRAWS, 0)  # (then it comes: the round completes)
        assert ahead.result(timeout=60) == late.result(timeout=60) == [None, None]
    _stop((lead, other))


def _streams(spec, hosts, snapshots=None):
    """Two ranks of one host, each a RankStream of its host's share planning its part (on two
    threads); with ``snapshots`` (rank 0 saves them), rank 0 plans and rank 1 takes its epochs."""
    pair = _Pair()
    with ThreadPoolExecutor(2) as pool:
        made = [pool.submit(RankStream, spec, r, None, snapshots if r == 0 else None,
                            hosts=hosts, stage_rows=stage_bound(spec, hosts), comm=pair.of(r))
                for r in (0, 1)]  # fmt: skip
        streams = [f.result() for f in made]
    assert all(s.parted == (snapshots is None) for s in streams)
    return streams


def _both(streams, run):
    """``run(stream)`` on both ranks at once; their results (an error raised)."""
    with ThreadPoolExecutor(2) as pool:
        return [f.result(timeout=60) for f in [pool.submit(run, s) for s in streams]]


def _served_by_plan(epochs, spe, r, steps):
    """Rank ``r``'s batches at ``steps`` as the whole host's plan (``epochs``) gives them."""
    out = []
    for k in steps:
        ranks = epochs[k // spe].ranks
        lo, so = ranks.rank_offsets[r], ranks.step_offsets[r]
        sl = slice(int(lo + so[k % spe]), int(lo + so[k % spe + 1]))
        side = (ranks.flags[sl] & SIDE) != 0
        out.append(ranks.sample[sl][~side].astype(np.int64).tobytes())
    return out


def _services(s, steps):
    return [s.window(k).step(k).samples.tobytes() for k in steps]


def test_ranks_planning_parts_serve_every_step_in_order_and_after_jumps():
    """Every local rank plans its part (E = 6: the planner looks 5 epochs ahead and asks an
    epoch's draws again as it plans it; the next epoch is planned as soon as the last is
    collected, so ranks plan ahead unevenly); in order, then after a jump forward and one
    back, each serves the steps the whole plan gives it (the parts' planners are dropped and
    replanned: no rank waits for a part its host's ranks will not plan)."""
    spec, hosts = _spec(epochs=6), Hosts.grid(1, 2)
    whole = HostPlanner(spec, hosts, only_host=0)
    epochs = [whole.next() for _ in range(spec.run.epochs)]
    spe = spec.run.steps_per_epoch

    def want(r, steps):
        return _served_by_plan(epochs, spe, r, steps)

    every = range(6 * spe)
    for trial in range(12):  # (the ranks' threads interleave differently each time)
        streams = _streams(spec, hosts)
        for s in streams:
            s.start()
        got = _both(streams, lambda s: _services(s, every))
        assert got == [want(0, every), want(1, every)], trial
        _both(streams, lambda s: s.close())  # (a collective of the host's ranks)
    streams = _streams(spec, hosts)
    for s in streams:
        s.start()
    _both(streams, lambda s: s.window(0))
    streams[0]._bg.get().future.result()
    assert streams[0].planned_end == 2 * spe  # rank 0 collects epoch 1, plans 2; rank 1 not
    ahead, back = range(3 * spe, 4 * spe), range(spe, 2 * spe)
    assert _both(streams, lambda s: _services(s, ahead)) == [want(0, ahead), want(1, ahead)]
    assert _both(streams, lambda s: _services(s, back)) == [want(0, back), want(1, back)]
    # Rank 0 plans ahead again (epoch 2 collected, 3 planned); rank 1 not: both close.
    streams[0].window(2 * spe)
    assert streams[0].planned_end >= 3 * spe
    _both(streams, lambda s: s.close())
    assert all(s.exchange.closed and not s.exchange._held for s in streams)


def test_a_part_posted_as_another_or_holding_its_rows_is_refused_in_one_line():
    spec, hosts = _spec(), Hosts.grid(1, 2)
    hspec = host_run_spec(spec, hosts)
    parts = host_parts(hspec, hosts, 0)
    assert parts is not None
    n, tag = spec.run.num_samples, digest(spec.fingerprint, hosts, 0)
    p1 = HostPlanner(spec, hosts, only_host=0, part=1)
    contents = p1.planner.contents(0)
    ne = p1.next()
    cells = (parts.size(hspec.slots, 1), 0)
    kw = dict(epoch=0, hosts=hosts, host=0, rank=1, steps=spec.run.steps_per_epoch,
              num_samples=n, layout=parts, slots=cells[0], tier=0, tag=tag)  # fmt: skip
    # Part 1's epoch posted as part 1, taken as part 0: its header names another part.
    fd = frozen(*pack(ne, 0, contents, tag, 1))
    m = mmap.mmap(fd, os.fstat(fd).st_size, prot=mmap.PROT_READ)
    with pytest.raises(CorruptPlanError, match="another run, host or epoch"):
        unpack(m, epoch=0, hosts=hosts, host=0, rank=1, steps=spec.run.steps_per_epoch,
               num_samples=n, slots=cells[0], tier=0, tag=tag, part=0)  # fmt: skip
    # Part 1's rows posted as part 0 (cells in range): refused, its rows are not part 0's.
    fd0 = frozen(*pack(ne, 0, contents, tag, 0))
    m0 = mmap.mmap(fd0, os.fstat(fd0).st_size, prot=mmap.PROT_READ)
    with pytest.raises(CorruptPlanError, match="rows of other parts"):
        unpack_part(m0, part=0, **kw)
    assert unpack_part(m, part=1, **kw).ranks.sample.size  # (as posted: accepted)
    os.close(fd)
    os.close(fd0)


@pytest.mark.parametrize(("launcher", "n", "grouping"), [
    ("mpiexec", 4, "2x2"), ("torchrun", 4, "3,1"),
])  # fmt: skip
def test_host_ranks_exchange_restart_and_close_under_a_launcher(launcher, n, grouping):
    """tests/mpi/host_exchange.py: over MPI's duplicated host communicator and torch's second
    gloo group per host (hosts of 3 and 1 ranks), every rank serves its host's plan in order,
    after a jump forward and a restart, and every rank closes while local rank 0's planning
    thread waits in a round ahead of the others."""
    from test_mpi import launch

    result = launch(launcher, n, "host_exchange.py", grouping, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"host exchange {grouping}: ok" in result.stdout


def test_ranks_restarting_at_other_epochs_are_named_in_one_line():
    """A restart's stop agrees on the epoch too: a local rank that restarts at another epoch
    than its host's (or closes while they restart) is named, on both sides, in one line."""
    lead, other = _exchanges()
    with ThreadPoolExecutor(2) as pool:
        made = [pool.submit(lead.stop, lambda: None, 0), pool.submit(other.stop, lambda: None, 2)]
        for f in made:
            with pytest.raises(SolarError, match="must take the same epochs") as exc:
                f.result(timeout=60)
            assert "restarts at epoch 0" in str(exc.value)
            assert "restarts at epoch 2" in str(exc.value)


def test_ranks_collected_unevenly_restart_alike_on_a_jump_past_the_next_epoch(tmp_path):
    """With snapshots (rank 0 plans, rank 1 takes its epochs), a jump from epoch 0 to 2 is a
    restart on every local rank, decided from the epoch served, not from how far each rank
    collected: rank 0 holds epoch 1 (its window ends at 2), rank 1 does not (at 1). Deciding
    from the window's end, rank 0 waited for epoch 2 and rank 1 stopped: a deadlock."""
    spec, hosts = _spec(epochs=4), Hosts.grid(1, 2)
    whole = HostPlanner(spec, hosts, only_host=0)
    epochs = [whole.next() for _ in range(spec.run.epochs)]
    spe = spec.run.steps_per_epoch
    streams = _streams(spec, hosts, tmp_path)
    assert all(s.host_saves for s in streams)
    for s in streams:
        s.start()
    _both(streams, lambda s: s.window(0))
    streams[0]._bg.get().future.result()
    assert streams[0].planned_end == 2 * spe  # rank 0 collects epoch 1; rank 1 does not
    jump = range(2 * spe, 3 * spe)
    got = _both(streams, lambda s: _services(s, jump))
    for r in (0, 1):
        assert got[r] == _served_by_plan(epochs, spe, r, jump), r
    _both(streams, lambda s: s.close())
    assert all(s.exchange.closed and not s.exchange._held for s in streams)
