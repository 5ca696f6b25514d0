"""The host barrier (solar/host/barrier.py) between forked processes over shared memory:
no rank leaves before every rank arrived; a dead, closed or elsewhere-waiting peer, or no
release within the timeout, raises one line naming the ranks and steps, promptly."""

from __future__ import annotations

import mmap
import multiprocessing as mp
import os
import time

import numpy as np
import pytest

from solar.host import barrier as hb

RANKS = (4, 5, 6)  # the host's global ranks (local 0, 1, 2): messages name these


hb.warm_up()  # in this process, before any fork: no child waits for numba


def _area(size: int) -> np.ndarray:
    return np.frombuffer(mmap.mmap(-1, hb.nbytes(size)), np.int64)


def _run(size: int, body, timeout_s: float = 60.0) -> list[str]:
    """Run ``body(barrier, local)`` in ``size`` forked processes over one area; each one's
    outcome ("ok" or its error's message), in local order. The barrier's timeout, where the
    test is not of it, is long: on a loaded machine a descheduled process is only late."""
    area = _area(size)
    ctx = mp.get_context("fork")
    q = ctx.Queue()

    def child(local: int) -> None:
        hb.register(area, local)
        while any(area[hb.LINE * (1 + r) + hb.PID] == 0 for r in range(size)):
            time.sleep(0.001)  # every peer registered, as a region's construction ensures
        b = hb.HostBarrier(area, local, RANKS[:size], per_epoch=10, timeout_s=timeout_s)
        try:
            body(b, local)
            q.put((local, "ok"))
        except Exception as exc:
            q.put((local, str(exc)))

    procs = [ctx.Process(target=child, args=(r,)) for r in range(size)]
    for p in procs:
        p.start()
    got = {}
    # A bound on a hang, not a speed: the machine may be loaded (other jobs' ranks) and every
    # crossing needs all ``size`` processes scheduled. Longer than any barrier's timeout, by
    # a margin (not a multiple: a hang costs 90 s, not 240 s, at the 60 s default).
    deadline = time.monotonic() + max(60.0, timeout_s + 30)
    while len(got) < size and time.monotonic() < deadline:
        try:
            local, msg = q.get(timeout=0.2)
            got[local] = msg
        except Exception:
            if all(not p.is_alive() for p in procs):
                break
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.kill()
    return [got.get(r, "no word") for r in range(size)]


def test_no_rank_leaves_a_barrier_before_every_rank_arrived():
    size, n = 3, 300
    seen = np.frombuffer(mmap.mmap(-1, 8 * size), np.int64)

    def body(b, local):
        rng = np.random.default_rng(local)
        for k in range(n):
            if rng.random() < 0.05:
                time.sleep(0.002)  # a late arrival now and then: the others must wait
            seen[local] = k
            b(k, hb.STAGED)
            assert (seen >= k).all(), (local, k, seen.tolist())
            b(k, hb.STORED)

    # What is under test is the order (every peer's mark before anyone leaves), not the
    # timeout: one long enough that a process descheduled on a loaded machine is only late.
    assert _run(size, body, timeout_s=120.0) == ["ok"] * size


def test_a_dead_peer_fails_the_barrier_promptly_naming_it():
    def body(b, local):
        if local == 2:
            os._exit(0)  # gone without a word (a zombie until the parent reaps it)
        t0 = time.monotonic()
        try:
            b(0, hb.STAGED)
        finally:  # at a tick (50 ms), not at the timeout (30 s), even on a loaded machine
            assert time.monotonic() - t0 < 15.0

    got = _run(3, body, timeout_s=30.0)
    for msg in got[:2]:
        assert msg.startswith("host barrier: rank ") and "rank 6 is gone (pid " in msg, got
        assert "epoch 0 step 0 (its rows staged)" in msg and "\n" not in msg


def test_a_peer_at_another_step_fails_the_barrier_naming_both():
    def body(b, local):
        b(2, hb.STAGED)
        if local == 1:
            b(10, hb.REFILL)  # left epoch 0 early: a refill at epoch 1's start
        else:
            b(2, hb.STORED)

    got = _run(3, body)
    want = ("rank 5 waits at epoch 1 step 0 (a refill's start)",
            "epoch 0 step 2 (its stores done)")  # fmt: skip
    assert all(w in got[1] for w in want), got
    for msg in (got[0], got[2]):  # each names itself and a peer elsewhere
        assert "epoch 0 step 2 (its stores done) but rank " in msg and "\n" not in msg, got
        assert "leave an epoch early with break" in msg


def _plan_wait(b, k, seconds=60.0):
    """Wait for step ``k``'s plan (never made: a peer's payload never posted), checking as
    a node plan's wait does (solar/host/exchange.py's ``watch``)."""
    b.planning(k)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        b.check_planning()
        time.sleep(0.01)
    raise AssertionError("no mismatch seen")


def test_a_rank_waiting_for_another_steps_plan_is_named_at_once_on_both_sides():
    """Local rank 1 seeks alone to epoch 2 and waits for its plan; its peers wait at step 3's
    barrier (for it), or for step 3's plan: every one names the other's step in one line,
    at a tick, well before the barrier's timeout (60 s: half of it bounds "at once" on a
    loaded machine; a quiet one takes well under a second)."""

    def body(b, local):
        b(2, hb.STAGED)
        if local == 1:
            _plan_wait(b, 20)
        elif local == 0:
            b(3, hb.REFILL)
        else:
            _plan_wait(b, 3)

    t0 = time.monotonic()
    got = _run(3, body)
    assert time.monotonic() - t0 < 30.0, got
    assert "rank 5 waits for its plan of epoch 2 step 0 but rank " in got[1], got
    assert "rank 4 waits at epoch 0 step 3 (a refill's start) but rank 5 waits for its plan "\
           "of epoch 2 step 0" in got[0], got  # fmt: skip
    assert "rank 6 waits for its plan of epoch 0 step 3 but rank 5 waits for its plan of "\
           "epoch 2 step 0" in got[2], got  # fmt: skip
    assert all("\n" not in m and "must run the same steps" in m for m in got), got


def test_ranks_waiting_for_the_same_steps_plan_are_not_refused():
    """A peer at the barrier of the step this rank waits the plan of (or waiting for it
    too) is where it will be: no refusal."""

    def body(b, local):
        b(2, hb.STAGED)
        if local == 1:
            b.planning(3)
            for _ in range(30):
                b.check_planning()
                time.sleep(0.01)
            b.planning(None)
        elif local == 2:
            b.planning(3)
            time.sleep(0.1)
            b.planning(None)
        b(3, hb.REFILL)

    assert _run(3, body) == ["ok"] * 3


def test_a_closed_peer_and_the_timeout_fail_the_barrier():
    def closed(b, local):
        if local == 1:
            b.close()  # its loader closed, rank 4 still at the steps
            time.sleep(1.0)
            return
        b(0, hb.STAGED)

    got = _run(2, closed)
    assert got[0] == ("host barrier: rank 4 waits at epoch 0 step 0 (its rows staged): rank 5 "
                      "closed its loader"), got  # fmt: skip

    def late(b, local):
        if local == 1:
            b(0, hb.STAGED)
            time.sleep(1.5)  # alive, and late: rank 4 gives up at the timeout
            return
        b(0, hb.STAGED)
        b(0, hb.STORED)

    got = _run(2, late, timeout_s=0.3)
    assert got[0] == (
        "host barrier: rank 4 waits at epoch 0 step 0 (its stores done): no "
        "release within 0.3 s (rank 5 last at epoch 0 step 0 (its rows staged))"
    ), got


@pytest.mark.parametrize("size", [1, 2])
def test_the_area_is_checked(size):
    with pytest.raises(Exception, match="host barrier: local rank 2 of"):
        hb.HostBarrier(_area(size), 2, range(size))
