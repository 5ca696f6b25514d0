"""Preprocessing workers on other hosts (solar/remote, solar/runtime/remote.py): a trainer
served by workers of another job yields the bytes it would transform itself, whole epochs, and
a worker killed mid-epoch costs no sample."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from helpers import planned_reads
from ranks_apart import MPIEXEC, TORCHRUN, run_job
from transform_fns import crop_flip_noise, shrink

from solar import Loader, SolarError
from solar.remote import Remote
from solar.remote.link import pairs
from solar.schedule.draw.members import owner
from solar.transform import Transform
from solar.worker import serve

N = 103  # a prime: no batch divides it
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def key(monkeypatch):
    """The trainers' and workers' shared secret (the workers inherit the environment)."""
    monkeypatch.setenv("SOLAR_REMOTE_KEY", "test-secret")


@pytest.fixture
def made(monkeypatch) -> list:
    """Pass 1's planners made (solar/schedule/plans/members.py), one entry each."""
    from solar.schedule.plans import members

    made: list = []

    class Counted(members.Planner):
        def __init__(self, *a, **k):
            made.append(1)
            super().__init__(*a, **k)

    monkeypatch.setattr(members, "Planner", Counted)
    return made


def free_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def served_store(address: str, job: threading.Thread, done: list, seconds: float = 120.0):
    """A client of the store ``job`` (an mpiexec job's thread; its result lands in ``done``)
    serves at ``address`` (the workers' own: solar/remote/link.py), probed a second at a time
    while the job runs: a job that ended first fails the test with its ranks' output, never a
    client retrying against nobody (torch's store client may retry for good)."""
    import time

    from solar.remote.link import _reachable, _store

    remote = Remote(address)
    deadline = time.monotonic() + seconds
    while True:
        try:
            _reachable(*remote.host_port, 1.0)
            return _store(remote, False, seconds)
        except SolarError:
            if not job.is_alive():
                got = done[0] if done else None
                raise AssertionError(f"the job ended before it served {address}: "
                                     f"{got.ranks if got else 'no result'}") from None  # fmt: skip
            assert time.monotonic() < deadline, f"nothing served {address} in {seconds} s"


def start_worker(address: str, wait_s: int = 120) -> subprocess.Popen:
    """``solar worker ADDRESS``: a process of its own, as on another host, waiting ``wait_s``
    for its trainers."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
    return subprocess.Popen([sys.executable, "-m", "solar.cli", "worker", address, "--threads",
                             "1", "--wait", str(wait_s)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


def test_steps_are_owned_in_turn_and_pairs_cover_every_trainer_and_worker():
    assert pairs(2, 1) == [(0, 0), (1, 0)]
    assert pairs(2, 4) == [(0, 0), (0, 2), (1, 1), (1, 3)]
    assert pairs(3, 2) == [(0, 0), (1, 1), (2, 0)]
    assert [owner(k, 1, [3]) for k in range(4)] == [None, 3, None, 3]
    assert [owner(k, 0, [1, 5]) for k in range(4)] == [1, 5, 1, 5]
    assert [owner(k, 2, []) for k in range(3)] == [None] * 3


def test_bad_remote_settings_are_refused_in_one_line():
    for bad, word in [(dict(address="nohost"), "host:port"), (dict(workers=0), "workers"),
                      (dict(window=0), "window"), (dict(wait_s=-1), "wait_s")]:  # fmt: skip
        with pytest.raises(SolarError, match=word):
            Remote(**{"address": "127.0.0.1:1", **bad})
    with pytest.raises(SolarError, match="remote"):
        Transform(crop_flip_noise, remote="127.0.0.1:1")  # type: ignore[arg-type]


def test_what_remote_cannot_serve_yet_is_refused_in_one_line(data):
    """Held transformed rows (deterministic) are refused before any meeting is attempted."""
    t = Transform(shrink, deterministic=True, remote=Remote(free_address(), join_s=1))
    with pytest.raises(SolarError, match="remote=: not with a deterministic"):
        Loader(data, batch_size=10, epochs=1, buffer=20, rank=0, world_size=1, transform=t)


def test_no_worker_coming_the_trainer_transforms_every_step_itself(data):
    """No worker joins within join_s: the trainer starts without one and yields the bytes of
    local transforms."""
    args = dict(batch_size=10, epochs=1, buffer=20, seed=5, rank=0, world_size=1)
    r = Remote(free_address(), join_s=1)
    ld = Loader(data, transform=Transform(crop_flip_noise, workers=1, remote=r), **args)
    ref = Loader(data, transform=Transform(crop_flip_noise, workers=1), **args)
    try:
        assert ld.stats.remote == {}
        _same_epoch(ld, ref)
    finally:
        ld.close()
        ref.close()


def _pair(data: Path, address: str, epochs: int, **remote):
    args = dict(batch_size=10, epochs=epochs, buffer=20, seed=5, rank=0, world_size=1)
    r = Remote(address, **{"join_s": 60, **remote})
    ld = Loader(data, transform=Transform(crop_flip_noise, workers=1, remote=r), **args)
    ref = Loader(data, transform=Transform(crop_flip_noise, workers=1), **args)
    return ld, ref


def test_a_trainer_with_a_worker_yields_the_bytes_it_would_transform_itself(data):
    """Whole epochs, N = 103 over batches of 10: every batch byte-identical to a Loader that
    transforms locally; the worker's steps were delivered (half of them: keep=1); the worker
    ends when the trainer closes."""
    address = free_address()
    worker = start_worker(address)
    ld, ref = _pair(data, address, 2)
    try:
        for e in range(2):
            _same_epoch(ld, ref, e)
        (fig,) = ld.stats.remote.values()
        assert fig.steps + fig.late == 11  # its steps: 11 of the run's 22 (keep=1)
        assert fig.steps > 0 and fig.refused == 0 and not fig.lost
        assert fig.bytes == fig.rows * (8 * 8 * 4 + 8)  # an 8x8 float32 crop and a label
    finally:
        ld.close()
        ref.close()
    out, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    assert "steps" in out
    assert not [t for t in threading.enumerate() if t.name.startswith("solar-remote")]


def _kill(worker: subprocess.Popen) -> None:
    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=30)


def _same_epoch(ld, ref, e: int | None = None, before=lambda t: None) -> None:
    """One epoch of ``ld`` against ``ref`` (transforming locally), epoch ``e`` set on both first
    (None: as they stand): every batch byte-identical, every sample once; ``before(t)`` is
    called before step t is compared."""
    if e is not None:
        ld.set_epoch(e)
        ref.set_epoch(e)
    seen = []
    for t, (a, b) in enumerate(zip(ld, ref, strict=True)):
        before(t)
        assert a.keys() == b.keys()
        for k in b:
            assert np.array_equal(a[k].numpy(), b[k].numpy()), (e, t, k)
        seen.append(a["index"].numpy())
    assert np.array_equal(np.sort(np.concatenate(seen)), np.arange(N)), e


def _compared(ld, ref, epochs: int, before) -> None:
    """``epochs`` of ``ld`` against ``ref`` (:func:`_same_epoch`); ``before(e, t)`` is called
    before step t of epoch e is compared."""
    for e in range(epochs):
        _same_epoch(ld, ref, e, lambda t, e=e: before(e, t))


def test_a_worker_killed_mid_epoch_costs_no_sample(data):
    """kill -9 of the worker in epoch 1 of 3: the run completes, every batch byte-identical to
    local transforms, every sample once per epoch; the trainer takes the worker's steps (read
    outside its buffer in epoch 1, in its own plan from epoch 2)."""
    address = free_address()
    worker = start_worker(address)
    ld, ref = _pair(data, address, 3, keep=0)  # every step the worker's while it lives
    stats = ld.stats
    try:
        _compared(ld, ref, 3, lambda e, t: e == 1 and t == 4 and _kill(worker))
        (fig,) = stats.remote.values()
        assert fig.lost and fig.steps >= 5  # epoch 0 and the start of epoch 1 delivered
        # Every step the worker's (keep=0): the trainer plans no buffer, reads nothing of
        # its own; what the worker did not deliver in epoch 1 it read from storage, outside
        # any buffer; from epoch 2 on (no worker left) the steps are its own, planned (but
        # the few assembled ahead of epoch 2's start, read before its workers were decided).
        assert stats.totals(0).reads == stats.totals(1).reads == 0 < stats.totals(2).reads
        assert 2 * N <= fig.read + fig.rows < 2 * N + 40 and fig.read > 0
    finally:
        ld.close()
        ref.close()
    assert worker.returncode == -signal.SIGKILL
    assert not [t for t in threading.enumerate() if t.name.startswith("solar-remote")]


TRAINER = """
import sys, time
sys.path.insert(0, {tests!r})
from transform_fns import crop_flip_noise
from solar import Loader, Remote, Transform
r = Remote({address!r}, join_s=60)
ld = Loader({data!r}, batch_size=10, epochs=3, buffer=20, rank=0, world_size=1,
            transform=Transform(crop_flip_noise, workers=1, remote=r))
for b in ld:
    print("served", flush=True)
    time.sleep(600)
"""


def test_a_trainer_killed_leaves_no_worker_behind(data):
    """kill -9 of the trainer mid-epoch: its worker sees the pair broken and ends."""
    address = free_address()
    worker = start_worker(address)
    code = TRAINER.format(tests=str(ROOT / "tests"), address=address, data=str(data))
    trainer = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                               env=dict(os.environ, PYTHONPATH=str(ROOT)))  # fmt: skip
    try:
        assert trainer.stdout is not None and trainer.stdout.readline() == "served\n"
        trainer.kill()
        worker.wait(timeout=60)  # (the test fails here if the worker lingers)
    finally:
        trainer.kill()
        worker.kill()
        trainer.wait()
    assert trainer.returncode == -signal.SIGKILL


def test_a_worker_whose_trainers_never_come_says_so_in_one_line(capsys):
    from solar.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["worker", free_address(), "--wait", "1"])
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("solar: error: ") and len(err.splitlines()) == 1, err
    assert "nothing serves the workers' store" in err


@pytest.mark.parametrize(("launcher", "n_workers"), [("mpiexec", 2), ("torchrun", 1)])
def test_two_trainers_and_their_workers_either_launcher(data, launcher, n_workers):
    """2 trainers (mpiexec or torchrun), 2 or 1 workers started apart (one each, or one
    serving both trainers): batches byte-identical to local transforms (N = 103 over batches
    of 10, whole epochs), each sample once per epoch over the ranks, every trainer's worker
    delivering. Each member keeps a buffer of its own steps, whatever decides the batches:
    each rank's own (``split``), or Shuffle's (the default: the whole job's plan splits each
    global batch with affinity, equal batches; pass 1 decides them, each member's buffer is
    planned over them): each trainer reads fewer rows than alone, exactly its own plan's
    misses (checked in the job), and each worker's buffer hits and reads are its plans'. Both
    samplers' runs in one job, one after the other, each with workers of its own (at an
    address of its own)."""
    exe = MPIEXEC if launcher == "mpiexec" else TORCHRUN
    if not exe.exists():
        pytest.skip(f"no {exe.name} beside python")
    samplers = ("shuffle", "split")
    addresses: list[str] = []
    while len(addresses) < len(samplers):
        addresses += [a for a in [free_address()] if a not in addresses]
    workers: dict[str, list[subprocess.Popen]] = {s: [] for s in samplers}
    try:
        # (A later run's workers wait for their trainers while the runs before it go.)
        for i, (s, a) in enumerate(zip(samplers, addresses, strict=True)):
            workers[s] += [start_worker(a, 120 * (i + 1)) for _ in range(n_workers)]
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        job = run_job(exe, 2, [str(ROOT / "tests" / "mpi" / "remote.py"), str(data),
                               ",".join(addresses), str(n_workers), "2", ",".join(samplers)],
                      240 * len(samplers), env)  # fmt: skip
        if job.returncode != 0:  # (workers whose trainers never came would wait on)
            for w in (w for ws in workers.values() for w in ws):
                w.kill()
        outs = {s: [w.communicate(timeout=60) for w in ws] for s, ws in workers.items()}
    finally:  # (a job that timed out, or a worker that would not end: none left waiting)
        for w in (w for ws in workers.values() for w in ws):
            if w.poll() is None:
                w.kill()
                w.communicate()
    assert job.returncode == 0, job.stderr
    for s in samplers:
        planned = np.zeros((n_workers, 2), np.int64)  # each worker's hits and reads, planned
        for r in range(2):
            got = re.search(rf"rank {r}: {s}: ok, workers \[(\d)\], delivered (\d+), read",
                            job.ranks[r][0])  # fmt: skip
            assert got is not None, job.ranks[r]
            assert int(got[1]) == r % n_workers and int(got[2]) > 0
            for w, hits, reads in re.findall(rf"rank {r}: {s}: worker (\d) planned (\d+) hits "
                                             r"(\d+) reads", job.ranks[r][0]):  # fmt: skip
                planned[int(w)] += (int(hits), int(reads))
        for w, (out, err) in zip(workers[s], outs[s], strict=True):
            assert w.returncode == 0, err
            said = re.search(r"worker (\d): .* (\d+) rows from its buffer, (\d+) read", out)
            assert said is not None, out
            assert (int(said[2]), int(said[3])) == tuple(planned[int(said[1])]), (s, out, planned)
        assert planned[:, 1].all(), s  # each worker read its own plan's misses


class _Boom:
    def __reduce__(self):
        return (os.abort, ())  # unpickled: the process ends


def test_a_job_is_unpickled_only_when_signed_with_the_key_by_the_same_code(monkeypatch):
    """The worker checks the job's HMAC and the trainers' versions before pickle.loads: a job
    that would run anything when unpickled is refused unread under another key."""
    from solar.remote.link import open_job, sign_job

    signed = sign_job(b"k1", {"x": 1}, "transform_fns")
    assert open_job(b"k1", signed, "w") == {"x": 1}
    with pytest.raises(SolarError, match="signature does not match"):
        open_job(b"k2", sign_job(b"k1", {"x": _Boom()}, None), "w")
    with pytest.raises(SolarError, match="signature does not match"):
        open_job(b"k1", signed[:-2] + b"2.", "w")  # altered in the store
    from solar import _version

    with monkeypatch.context() as m:  # a trainer on another version
        m.setattr(_version, "__version__", "9.9")
        other = sign_job(b"k1", {"x": _Boom()}, "transform_fns")
    with pytest.raises(SolarError, match=r"other code \(solar 9.9 there"):
        open_job(b"k1", other, "w")


def test_remote_without_a_key_or_with_an_unpicklable_fn_is_refused_in_one_line(data, monkeypatch):
    monkeypatch.delenv("SOLAR_REMOTE_KEY")
    t = Transform(crop_flip_noise, remote=Remote(free_address(), join_s=1))
    with pytest.raises(SolarError, match=r"no key: pass Remote\(key=...\) or set SOLAR_REMOTE_KEY"):
        Loader(data, batch_size=10, epochs=1, buffer=20, rank=0, world_size=1, transform=t)
    with pytest.raises(SolarError, match="<lambda> cannot be pickled"):
        Transform(lambda s, rng: s, remote=Remote(free_address(), key="k"))
    with pytest.raises(SolarError, match=r"worker at .*: no key"):
        serve(free_address(), wait_s=1)


def test_a_loader_closed_before_its_first_batch_ends_its_worker_and_frees_the_port(data):
    """close() before any step: the worker is told DONE and exits; no thread is left; the
    store's port is free for the next Loader of the same Remote."""
    address = free_address()
    worker = start_worker(address)
    ld, ref = _pair(data, address, 1)
    ref.close()
    ld.close()
    _, err = worker.communicate(timeout=30)
    assert worker.returncode == 0, err
    assert not [t for t in threading.enumerate() if t.name.startswith("solar-remote")]
    again, ref = _pair(data, address, 1, join_s=1)  # no worker: the trainer alone
    again.close()
    ref.close()


def _huge(s, k, *_):
    """A delivery header claiming 10**12 rows (a trainer must not allocate them)."""
    import torch

    s.group.send([torch.tensor([k, 10**12, 0, 0, 0, 0, 0])], 0, 1).wait()
    return 0


@pytest.mark.parametrize("wrong", ["signature", "rows"])
def test_a_delivery_not_signed_or_not_the_steps_size_is_refused(data, monkeypatch, wrong):
    """A worker in this process sends rows signed with another key (refused, transformed
    here) or a header of 10**12 rows (the worker is lost): the bytes are the local ones."""
    import solar.worker

    if wrong == "signature":
        monkeypatch.setattr(solar.worker, "mac", lambda secret, *parts: bytes(32))
    else:
        monkeypatch.setattr(solar.worker, "_send", _huge)
    address = free_address()
    worker = threading.Thread(target=solar.worker.serve, args=(address, 1, 60), daemon=True)
    worker.start()
    ld, ref = _pair(data, address, 1, wait_s=0.5)
    try:
        _same_epoch(ld, ref)
        (fig,) = ld.stats.remote.values()
        assert fig.steps == 0
        assert fig.refused > 0 if wrong == "signature" else fig.lost
    finally:
        ld.close()
        ref.close()
    worker.join(30)
    assert not worker.is_alive()


def test_a_worker_follows_its_trainer_back_after_load_state_dict(data):
    """Epoch 0 served, then the state of its start loaded: the worker sends epoch 0's steps
    again (they are wanted again), and the bytes are the local ones."""
    address = free_address()
    worker = start_worker(address)
    ld, ref = _pair(data, address, 2, keep=0, wait_s=1)
    start = ld.state_dict()

    def epoch_0() -> int:
        ld.load_state_dict(start)
        ref.load_state_dict(start)
        _same_epoch(ld, ref)
        return sum(f.steps for f in ld.stats.remote.values())

    try:
        first = epoch_0()
        assert epoch_0() - first >= 6  # of the 11 steps served again (a few may be late)
    finally:
        ld.close()
        ref.close()
    worker.communicate(timeout=60)


def test_a_worker_that_hangs_is_taken_for_lost(data, monkeypatch):
    """A worker (in this process) that delivers once, then hangs: after a few late steps in a
    row the trainer takes it for lost and transforms its steps; the bytes are the local ones."""
    import solar.worker

    real, hang, calls = solar.worker._send, threading.Event(), []

    def send_once(*args):
        calls.append(1)
        if len(calls) > 1:
            hang.wait(60)
        return real(*args)

    monkeypatch.setattr(solar.worker, "_send", send_once)
    address = free_address()
    worker = threading.Thread(target=solar.worker.serve, args=(address, 1, 60), daemon=True)
    worker.start()
    ld, ref = _pair(data, address, 2, keep=0, wait_s=0.3)
    try:
        for e in range(2):
            _same_epoch(ld, ref, e)
        (fig,) = ld.stats.remote.values()
        assert fig.lost and fig.steps <= 1 and fig.late < 22
    finally:
        hang.set()
        ld.close()
        ref.close()
    worker.join(30)
    assert not worker.is_alive()


def test_each_member_reads_only_its_own_steps_planned_misses_and_keeps_its_rows(data):
    """1 trainer, 1 worker, 3 epochs (keep=1: every other step the worker's): the bytes are
    the local ones; the trainer reads from storage exactly the planned misses of its own
    steps (the worker's steps' rows are neither read nor kept here), fewer than alone; the
    worker serves its steps from its own buffer (hits > 0) and reads its planned misses."""
    from solar.schedule.draw.members import TRAINER

    address = free_address()
    worker = start_worker(address)
    ld, ref = _pair(data, address, 3, wait_s=60)
    try:
        _compared(ld, ref, 3, lambda e, t: None)
        (fig,) = ld.stats.remote.values()
        assert fig.steps == 16 and fig.late == 0 and fig.read == 0  # 16 of 33 steps
        mine, _ = planned_reads(ld.spec, 0, ((0, (0,)),), TRAINER)
        assert ld.stats.totals().reads == mine
        assert 0 < mine < ref.stats.totals().reads  # alone it reads every step's misses
        theirs, hits = planned_reads(ld.spec, 0, ((0, (0,)),), 0)
        assert hits > 0
    finally:
        ld.close()
        ref.close()
    out, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    got = re.search(r"(\d+) rows from its buffer, (\d+) read", out)
    assert got is not None, out
    assert (int(got[1]), int(got[2])) == (hits, theirs)


def test_a_lost_workers_steps_go_to_the_workers_still_live_from_the_next_epoch(data):
    """1 trainer, 2 workers (keep=0: every step a worker's, in turn); kill -9 of worker 0 in
    epoch 1 of 3: the rest of its epoch-1 steps are the trainer's (read and transformed
    here), and from epoch 2, as trainer rank 0 decided at its start, every step is worker
    1's (planned again, its buffer refilled); the bytes are the local ones, every sample once
    per epoch."""
    address = free_address()
    workers = [start_worker(address) for _ in range(2)]
    ld, ref = _pair(data, address, 3, workers=2, keep=0, wait_s=30)
    try:
        _compared(ld, ref, 3, lambda e, t: e == 1 and t == 4 and _kill(workers[0]))
        (lost,), (live,) = ([f for f in ld.stats.remote.values() if f.lost is x]
                            for x in (True, False))  # fmt: skip
        assert lost.read > 0
        # The live worker's steps: every other step of epochs 0 and 1 (11), then all 11 of
        # epoch 2 (16 or 17 without the division).
        assert live.steps + live.late >= 22 and live.refused == 0
        assert ld.stats.totals().reads == 0  # the trainer kept no step
    finally:
        ld.close()
        ref.close()
    _, err = workers[1].communicate(timeout=60)
    assert workers[1].returncode == 0, err
    assert workers[0].returncode == -signal.SIGKILL


def test_a_worker_joining_after_the_trainers_began_is_used_from_an_epoch_start(data):
    """1 trainer with 1 worker (keep=0); a second worker started after epoch 0, registered
    before epoch 1 starts: from epoch 1 the two share the steps (a pair made at its start),
    the bytes are the local ones, every sample once per epoch."""
    import torch.distributed as td

    from solar.remote.link import COUNT

    address = free_address()
    first = start_worker(address)
    ld, ref = _pair(data, address, 3, keep=0, wait_s=30)
    later = None
    try:
        for e in range(3):
            _same_epoch(ld, ref, e)
            if e == 0:  # it registers with the trainers' store before epoch 1 starts
                later = start_worker(address)
                host, port = address.rsplit(":", 1)
                store = td.TCPStore(host, int(port), None, False, wait_for_workers=False)
                while int(store.add(COUNT, 0)) < 2:
                    assert later.poll() is None, later.communicate()
        assert sorted(ld.stats.remote) == [0, 1]
        old, new = ld.stats.remote[0], ld.stats.remote[1]
        assert new.steps > 0 and not new.lost and not old.lost
        assert old.steps + old.late < 3 * 11  # it no longer has every step
    finally:
        ld.close()
        ref.close()
    assert later is not None
    for w in (first, later):
        out, err = w.communicate(timeout=60)
        assert w.returncode == 0, err
    assert "rows sent to trainers [0]" in out


def test_a_lost_workers_trainer_is_served_by_another_trainers_worker_from_the_next_epoch(data):
    """2 trainers (mpiexec), a worker each; rank 0 kills its own worker (-9) in epoch 0 of 3:
    once it is taken for lost (its steps late 4 in a row), from the next epoch's start the
    worker still live serves both trainers (a pair made then), the bytes are the local ones,
    every sample once per epoch over the ranks."""
    from solar.remote.link import COUNT

    if not MPIEXEC.exists():
        pytest.skip("no mpiexec beside python")
    address = free_address()
    first = start_worker(address)  # worker 0, rank 0's: registered before the second starts
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    argv = [str(ROOT / "tests" / "mpi" / "remote.py"), str(data), address, "2", "3", "split",
            str(first.pid)]  # fmt: skip
    done: list = []
    job = threading.Thread(target=lambda: done.append(run_job(MPIEXEC, 2, argv, 240, env)))
    job.start()
    second = None
    try:
        store = served_store(address, job, done)  # rank 0's
        while int(store.add(COUNT, 0)) < 1:
            assert first.poll() is None, first.communicate()
        second = start_worker(address)
        job.join(300)
        (ran,) = done
        said, err = second.communicate(timeout=60)
        first.wait(timeout=30)
    finally:  # (a failure above leaves no worker waiting for trainers)
        for w in (first, second):
            if w is not None and w.poll() is None:
                w.kill()
                w.wait()
    assert ran.returncode == 0, ran.stderr
    assert second.returncode == 0, err
    assert first.returncode == -signal.SIGKILL
    # Rank 0: its worker 0 lost, worker 1 (rank 1's) serving it too from epoch 2.
    got = re.search(r"rank 0: split: ok, workers \[0, 1\], delivered (\d+)", ran.ranks[0][0])
    assert got is not None, ran.ranks[0]
    assert re.search(r"rank 1: split: ok, workers \[1\], delivered [1-9]", ran.ranks[1][0])
    assert "rows sent to trainers [0, 1]" in said, said  # (worker 1: both, from epoch 2)


@pytest.mark.timeout(120)
def test_a_worker_that_registered_and_failed_is_never_waited_for_past_join_s(data):
    """After epoch 0 (no worker), number 0 is taken by a process that never opens the job
    (no ``ready``) and number 1 by one that says it is ready and never pairs: epoch 1 gives
    the trainer number 1 only, whose pair is not made within join_s: a lost worker, its steps
    transformed here (the bytes the local ones); epoch 2 gives it none."""
    import json

    import torch.distributed as td

    from solar.remote.link import COUNT, EPOCH, READY

    address = free_address()
    ld, ref = _pair(data, address, 3, join_s=2, keep=0)
    host, port = address.rsplit(":", 1)
    store = None
    try:
        for e in range(3):
            _same_epoch(ld, ref, e)
            if e == 0:
                store = td.TCPStore(host, int(port), None, False, wait_for_workers=False)
                assert int(store.add(COUNT, 1)) == 1  # failed before opening the job
                assert int(store.add(COUNT, 1)) == 2
                store.set(f"{READY}1", "1")  # ready, then never pairs
        assert store is not None
        assert json.loads(store.get(f"{EPOCH}1")) == {"0": [1]}
        assert json.loads(store.get(f"{EPOCH}2")) == {"0": []}
        assert list(ld.stats.remote) == [1] and ld.stats.remote[1].lost
        assert ld.stats.remote[1].steps == 0
    finally:
        ld.close()
        ref.close()


def test_what_the_store_says_of_workers_is_checked_in_one_line():
    """The store is untrusted: worker lists and epochs' members are refused unless sound."""
    from solar.remote.link import MAX_WORKERS, parse_ids, parse_members

    assert parse_ids(b"[3, 1]", "x") == [1, 3]
    assert parse_members(b'{"0": [2], "1": [2]}', 2, "x") == {0: [2], 1: [2]}
    for bad in [b"{", b'"a"', b"[1, 1]", b"[-1]", f"[{MAX_WORKERS}]".encode(), b"[true]",
                b"[1.5]"]:  # fmt: skip
        with pytest.raises(SolarError, match="refused"):
            parse_ids(bad, "x")
    for bad in [b"[]", b'{"2": []}', b'{"a": []}', b'{"0": [1, 1]}', b'{"0": "1"}']:
        with pytest.raises(SolarError, match="refused"):
            parse_members(bad, 2, "x")


class _StoreGone:
    """The trainers' store, as if gone for what a trainer says of its live workers."""

    def __init__(self, real) -> None:
        self.real = real

    def set(self, k: str, v) -> None:
        from solar.remote.link import LIVE

        if k.startswith(LIVE):
            raise RuntimeError("Connection reset by peer")
        self.real.set(k, v)

    def __getattr__(self, name: str):
        return getattr(self.real, name)


@pytest.mark.timeout(120)
def test_a_worker_lost_while_the_store_is_gone_leaves_no_step_unfinished(data):
    """kill -9 of the worker with steps of its pending, the store refusing what the trainer
    says of its workers: its pending steps are transformed here all the same (the bytes the
    local ones, every sample once)."""
    address = free_address()
    worker = start_worker(address)
    ld, ref = _pair(data, address, 1, keep=0, wait_s=30)
    try:

        def before(e: int, t: int) -> None:
            if t == 4:
                ld._link.store = _StoreGone(ld._link.store)
                _kill(worker)

        _compared(ld, ref, 1, before)
        (fig,) = ld.stats.remote.values()
        assert fig.lost and fig.read > 0
    finally:
        ld.close()
        ref.close()


def test_a_copy_of_a_remote_loader_is_refused_in_one_line(data):
    """A pickled copy has no pairs of its own (its workers' steps would be read by no one):
    iterating it is refused; the original serves."""
    import pickle

    r = Remote(free_address(), join_s=1)
    ld = Loader(data, batch_size=10, epochs=1, buffer=20, seed=5, rank=0, world_size=1,
                transform=Transform(crop_flip_noise, workers=1, remote=r))  # fmt: skip
    try:
        copy = pickle.loads(pickle.dumps(ld))
        with pytest.raises(SolarError, match="remote=: this Loader is a copy"):
            next(iter(copy))
        assert sum(len(b["index"]) for b in ld) == N
    finally:
        ld.close()


@pytest.mark.parametrize("case", ["equal", "unequal", "weighted", "tier", "reorder"])
def test_each_members_batches_are_those_the_whole_plan_decides(case, made):
    """Two passes (solar/schedule/plans/members.py), 2 trainers, a worker each (keep=1), 3
    epochs, N = 103 over batches of 10: Shuffle with equal batches (the default), with
    batches that vary within the slack, or a sampler with affinity; equal batches with a
    tier of 10 (the worker's buffer in RAM alone, as a worker plans it: ``ram``); or Shuffle
    for one trainer with ``reorder_epochs`` (its planner picks the epochs' order). Step for
    step, every member's plan (pass 2) serves the batch and exchange of the trainer's run
    without workers (pass 1), in its order; the member reads and keeps the rows of its own
    steps only, and the trainer reads fewer rows than alone; a seek back (epoch 0 after epoch
    2) plans pass 1 again alike (from epoch 0, once); planned again for another roster (its
    worker lost), the trainer's buffer takes over pass 1 (the same one: no more planners)."""
    from solar.config import BufferConfig, RunConfig
    from solar.runtime.steps import Steps
    from solar.schedule.draw.members import TRAINER
    from solar.schedule.draw.samplers import Weighted
    from solar.schedule.plans import members
    from solar.schedule.plans.members import member_spec
    from solar.schedule.plans.stream import RankStream
    from solar.schedule.spec import PlanSpec

    run = RunConfig(N, 1 if case == "reorder" else 2, 10, 3, seed=3)
    extra = {"weighted": dict(sampler=Weighted(np.ones(N))),
             "reorder": dict(reorder_epochs=True)}.get(case, {})  # fmt: skip
    equal = case in ("equal", "tier")
    buffer = BufferConfig(20, 0.1, 10 if case == "tier" else 0)
    spec = PlanSpec(run, buffer, equal_batches=equal, **extra)
    for r in range(run.world_size):
        alone = RankStream(spec, r)
        streams, every = [alone], {}
        try:
            steps = Steps(spec, r, alone)
            for m in (TRAINER, r, "lost"):
                if m == "lost":  # the trainer's again, its worker lost from epoch 2 on
                    before = every[TRAINER].member
                    mine = member_spec(spec, r, 1, ((0, (r,)), (2, ())), TRAINER, before=before)
                    assert mine is not None and before is not None
                    assert mine.sampler.base is before.base  # (pass 1 taken over)
                else:
                    mine = member_spec(spec, r, 1, ((0, (r,)),), m, ram=m == r)  # (a worker's)
                    assert mine is not None
                    assert mine.buffer.tier == (0 if m == r else buffer.tier)
                assert mine is not None and mine.traced and not mine.equal_batches
                assert isinstance(mine.sampler.base, members.Decided)  # (two passes)
                streams.append(RankStream(mine, r))
                every[m] = Steps(spec, r, streams[-1])
            reads = dict.fromkeys([TRAINER, r, "lost", "alone"], 0)
            for k in [*range(run.num_steps), 0]:  # (then back to step 0)
                steps.enter(k)
                want, tr = steps.plan(k), steps.transfer(k)
                reads["alone"] += want.read_rows.size
                for m, member in every.items():
                    member.enter(k)
                    got = member.plan(k)
                    assert np.array_equal(got.samples, want.samples), (r, m, k)
                    assert repr(member.transfer(k)) == repr(tr), (r, m, k)
                    taken = got.read_rows.size + got.hit_rows.size + got.tier_rows.size
                    rows = np.unique(got.samples)
                    assert taken == (rows.size if member.owns(k) else 0), (r, m, k)
                    reads[m] += got.read_rows.size
            assert (tr is not None) == equal
            # Two pass 1s (the trainer's buffer's, taken over for the lost roster; the
            # worker's), each planned from epoch 0 twice: the run (3 epochs, once each), then
            # the seek back (epoch 0, and 1 if pass 2 plans on before it is closed).
            decided = {id(s.spec.sampler.base): s.spec.sampler.base for s in streams[1:]}
            assert len(made) == 4 * (r + 1) and len(decided) == 2, (r, len(made))
            assert all(d.planned in (4, 5) for d in decided.values()), r
            assert 0 < reads[TRAINER] < reads["alone"] and reads[r] > 0, reads
            assert reads[TRAINER] < reads["lost"]  # (it keeps every step of epoch 2)
        finally:
            for s in streams:
                s.close()


def test_pass_one_is_planned_once_per_epoch_however_far_pass_two_runs_ahead(made):
    """Pass 1 (solar/schedule/plans/members.py ``Decided``) over 7 epochs, equal batches, the
    runtime reading how far its plan runs (``last_planned``) every step, so pass 2 plans ahead
    as far as it can: pass 1 keeps its epochs from the consumer's on (not the last few it
    planned), each planned once by one planner. A roster change (its worker lost from epoch 4
    on) plans pass 2 again from epoch 0, and with it pass 1 by one more planner, each epoch
    once; a seek back past 4 epochs (6 to 1) by one more, to epoch 5 (6 still kept). Batches
    and exchanges are the run's without workers throughout."""
    import dataclasses
    import time

    from solar.config import BufferConfig, RunConfig
    from solar.runtime.steps import Steps
    from solar.schedule.draw.members import TRAINER
    from solar.schedule.plans.members import member_spec
    from solar.schedule.plans.stream import RankStream
    from solar.schedule.spec import PlanSpec

    E = 7
    run = RunConfig(N, 2, 10, E, seed=3)
    spec = PlanSpec(run, BufferConfig(20, 0.1), equal_batches=True)
    spe = run.steps_per_epoch
    mine = member_spec(spec, 0, 1, ((0, (0,)),), TRAINER)
    assert mine is not None
    decided = mine.sampler.base
    stream, alone = RankStream(mine, 0), RankStream(spec, 0)
    streams = [stream, alone]
    steps, ref = Steps(spec, 0, stream), Steps(spec, 0, alone)

    def serve(ks) -> None:
        for k in ks:
            steps.enter(k)
            ref.enter(k)
            assert steps.last_planned >= k - 1  # (read every step: pass 2 plans on)
            if k % spe == 0:
                time.sleep(0.05)  # (pass 2 runs ahead meanwhile)
            assert np.array_equal(steps.plan(k).samples, ref.plan(k).samples), k
            assert repr(steps.transfer(k)) == repr(ref.transfer(k)), k

    try:
        stream.start()
        serve(range(4 * spe))
        deadline = time.monotonic() + 60  # serving epoch 3, the stream plans up to epoch 4
        while stream.planned_end < 5 * spe and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(made) == 1 and decided.planned == 6  # (0 .. 5: pass 2's look-ahead)
        again = member_spec(spec, 0, 1, ((0, (0,)), (4, ())), TRAINER, before=steps.member)
        assert again is not None and again.sampler.base is decided  # (the same pass 1)
        stream.close()
        streams.append(stream := RankStream(again, 0))
        steps.retrace(stream)
        serve(range(4 * spe, run.num_steps))
        # A new planner from epoch 0: the kept epochs (3 .. 5) are stepped through again to
        # reach epoch 6, each planned once (6 + 7).
        assert (len(made), decided.planned) == (2, 13)
        serve(range(1 * spe, run.num_steps))  # back from epoch 6 to epoch 1
        assert (len(made), decided.planned) == (3, 19)  # (0 .. 5 again; 6 still kept)
        # Pass 2 looks one epoch ahead, or less if the user's horizon says so.
        assert mine.horizon == 1
        for h, want in ((0, 0), (3, 1)):
            got = member_spec(dataclasses.replace(spec, horizon=h), 0, 1, ((0, (0,)),), TRAINER)
            assert got is not None and got.horizon == want
    finally:
        for s in streams:
            s.close()


def test_a_workers_trainers_share_one_pass_one(made):
    """A worker serving 2 trainers (equal batches, 4 epochs) plans pass 1 once for both
    (``WholePlan``: one planner, each epoch planned once), each trainer's batches and
    exchanges its run's without workers; a trainer released (no longer served) leaves the
    other's pass 1 as it was, nothing kept for it."""
    from solar.config import BufferConfig, RunConfig
    from solar.runtime.steps import Steps
    from solar.schedule.plans.members import WholePlan, member_spec
    from solar.schedule.plans.stream import RankStream
    from solar.schedule.spec import PlanSpec

    run = RunConfig(N, 2, 10, 4, seed=3)
    spec = PlanSpec(run, BufferConfig(20, 0.1), equal_batches=True)
    whole, streams, pairs = WholePlan(spec), [], []
    try:
        for r in range(2):
            mine = member_spec(spec, r, 1, ((0, (0,)),), 0, ram=True, whole=whole)
            assert mine is not None and mine.sampler.base.whole is whole
            streams += [RankStream(mine, r), RankStream(spec, r)]
            pairs.append((Steps(spec, r, streams[-2]), Steps(spec, r, streams[-1])))
        for k in range(run.num_steps):
            for r, (steps, ref) in enumerate(pairs):
                if r == 1 and k == 2 * run.steps_per_epoch:
                    steps.release()  # (trainer 1 no longer served from epoch 2)
                if r == 1 and k >= 2 * run.steps_per_epoch:
                    continue
                steps.enter(k)
                ref.enter(k)
                got, want = steps.plan(k), ref.plan(k)
                assert np.array_equal(got.samples, want.samples), (r, k)
                assert repr(steps.transfer(k)) == repr(ref.transfer(k)), (r, k)
        assert (len(made), whole.planned) == (1, run.epochs)
        assert all(r == 0 for r, _ in whole._kept)  # (none kept for trainer 1)
    finally:
        for s in streams:
            s.close()


def test_pass_one_whose_planner_fails_mid_epoch_is_planned_again_from_epoch_0(made, monkeypatch):
    """A planner that raised mid-epoch is not used again (its state is half an epoch's): the
    next ask plans from epoch 0 with a new one, the same batches as a pass 1 that never
    failed."""
    from solar.config import BufferConfig, RunConfig
    from solar.schedule.plans import members
    from solar.schedule.plans.members import WholePlan
    from solar.schedule.spec import PlanSpec

    spec = PlanSpec(RunConfig(N, 2, 10, 3, seed=3), BufferConfig(20, 0.1), equal_batches=True)
    whole = WholePlan(spec)
    whole.decided(0, 0)
    plan = members.Planner.next_schedule
    failed: list = []

    def once(self):
        if not failed:
            failed.append(1)
            raise RuntimeError("boom")
        return plan(self)

    monkeypatch.setattr(members.Planner, "next_schedule", once)
    with pytest.raises(RuntimeError, match="boom"):
        whole.decided(0, 1)
    got, peers = whole.decided(0, 1)
    assert len(made) == 2 and whole.planned == 1 + 2  # (epoch 0, then 0 and 1 again)
    want, theirs = WholePlan(spec).decided(0, 1)
    assert np.array_equal(got.ids, want.ids) and np.array_equal(got.offsets, want.offsets)
    assert np.array_equal(peers, theirs)
