"""The tier file: layout, round trips on both read paths, ordering, lifetime and errors."""

from __future__ import annotations

import errno
import mmap
import os
import re
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from solar.cache import tier as tier_mod
from solar.cache.tier import TierFile, tier_stride
from solar.errors import SolarError
from solar.io import executor as executor_mod
from solar.io.executor import Executor
from solar.io.info import KeyInfo

TINY = (KeyInfo("x", (11, 11), np.dtype(np.float32)), KeyInfo("y", (), np.dtype(np.int64)))
PAGES = (
    KeyInfo("img", (256, 256), np.dtype(np.float32)),
    KeyInfo("mask", (64, 64), np.dtype(np.float32)),
)
ODD = (
    KeyInfo("a", (3,), np.dtype(">i2")),  # stored big-endian, native in memory
    KeyInfo("b", (5, 7), np.dtype(np.complex64)),
    KeyInfo("c", (0,), np.dtype(np.uint8)),  # an empty key
    KeyInfo("d", (2,), np.dtype(np.bool_)),
)


EXECUTOR = Executor(2)  # the tiers' of this module, as a Loader's reader lends its own


@pytest.fixture(autouse=True, scope="module")
def _close_executor():
    yield
    EXECUTOR.close()


def tier_file(directory, **kw) -> TierFile:
    return TierFile(directory, executor=kw.pop("executor", EXECUTOR), **kw)


def samples(keys, n, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for k in keys:
        raw = rng.integers(0, 256, n * k.row_bytes, np.uint8)
        out.append(raw.view(k.native_dtype).reshape(n, *k.sample_shape))
    return out


def empty(keys, n, aligned=False):
    """Destination arrays; ``aligned``: page-aligned memory (mmap), else deliberately not."""
    out = []
    for k in keys:
        nbytes = n * k.row_bytes
        if aligned:
            buf = np.frombuffer(mmap.mmap(-1, max(nbytes, 1)), np.uint8)[:nbytes]
        else:
            buf = np.zeros(nbytes + 8, np.uint8)[8:] if nbytes else np.zeros(0, np.uint8)
        out.append(buf.view(k.native_dtype).reshape(n, *k.sample_shape))
    return out


def wait(futures):
    # (bytes, busy seconds), as reader futures; a hang fails the test in seconds, not minutes
    return sum(f.result(timeout=30)[0] for f in futures)


def python_io(monkeypatch) -> None:
    """Runs of tier reads and writes skip the compiled kernel (it reports a failed call), so
    each goes through the executor's retry with os.preadv / os.pwritev, where a test injects
    its fault."""

    def fail(fd, iov, starts, counts, offsets, write, got, cached):
        got[:] = -1

    monkeypatch.setattr(executor_mod, "_iov_runs", fail)


def tier_files(d: Path) -> list[Path]:
    return sorted(d.glob("solar-tier-*.bin"))


def test_stride():
    assert tier_stride(TINY) == 4096  # 484 + 8 bytes
    assert tier_stride(PAGES) == 256 * 256 * 4 + 64 * 64 * 4
    assert tier_stride((KeyInfo("z", (0,), np.dtype(np.uint8)),)) == 4096


@pytest.mark.parametrize("keys", [TINY, PAGES, ODD], ids=["tiny", "pages", "odd"])
@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "unaligned"])
@pytest.mark.parametrize("direct_io", [True, False], ids=["direct", "buffered"])
def test_round_trip(tmp_path, keys, aligned, direct_io):
    n = 24
    src = samples(keys, n)
    with tier_file(tmp_path, slots=40, keys=keys, name="rt-r0", direct_io=direct_io) as tier:
        assert tier.direct_io == direct_io
        assert tier.nbytes == os.fstat(tier._fd).st_size == 40 * tier.stride
        assert os.fstat(tier._fd).st_blocks * 512 >= tier.nbytes  # allocated, not sparse
        # Slots: a run of adjacent ones, scattered ones, the last one.
        tslots = np.r_[np.arange(3, 15), [39, 0, 20, 22, 21, 30, 31, 25, 26, 27, 1, 33]]
        wait(tier.submit_write(tslots, src, np.arange(n)))
        tier.wait_writes()
        out = empty(keys, n + 3, aligned)
        rows = np.random.default_rng(1).permutation(n + 3)[:n]
        order = np.random.default_rng(2).permutation(n)
        got = wait(tier.submit_read(tslots[order], out, rows))
        assert got > 0 and tier.bytes_read == got
        assert tier.bytes_written == n * tier.stride
        into_rows = tier._into_rows(out)
        assert into_rows == (not direct_io or (aligned and keys is PAGES))
        for s, o in zip(src, out, strict=True):
            np.testing.assert_array_equal(o[rows], s[order])
        path = tier.path
    assert not path.exists()


def test_duplicate_write_last_wins(tmp_path):
    src = samples(TINY, 3)
    with tier_file(tmp_path, slots=4, keys=TINY, name="dup") as tier:
        wait(tier.submit_write(np.array([2, 2, 2]), src, np.arange(3)))
        out = empty(TINY, 1)
        wait(tier.submit_read(np.array([2]), out, np.array([0])))
        for s, o in zip(src, out, strict=True):
            np.testing.assert_array_equal(o[0], s[2])


ops = st.lists(
    st.tuples(st.booleans(), st.lists(st.integers(0, 7), min_size=1, max_size=6)),
    min_size=1,
    max_size=40,
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=ops, threads=st.sampled_from([1, 4]))
def test_write_then_read_ordering(tmp_path, ops, threads):
    """Random writes and reads, never waiting for either: each read sees the latest write
    submitted before it, and never a write submitted after it (the tier orders both ways)."""
    keys = TINY
    pool = samples(keys, 50, seed=3)
    model: dict[int, int] = {}
    reads: list = []  # (futures, out, tier slots, the sample each slot held)

    def check(done):
        futures, out, t, seen = done
        wait(futures)
        for j, s in enumerate(t.tolist()):
            for p, o in zip(pool, out, strict=True):
                assert o[j].tobytes() == p[seen[s]].tobytes()

    executor = Executor(threads)  # one thread: the tightest case for jobs that wait
    tier = TierFile(tmp_path, slots=8, keys=keys, name="ord", executor=executor, staging_slots=4)
    try:
        counter = 0
        for is_write, slots in ops:
            t = np.array(slots, np.int64)
            if is_write:
                ids = (np.arange(len(slots)) + counter) % 50
                counter += len(slots)
                tier.submit_write(t, pool, ids)
                for s, i in zip(slots, ids.tolist(), strict=True):
                    model[s] = i
            else:
                t = np.array([s for s in slots if s in model], np.int64)
                out = empty(keys, t.size)
                reads.append((tier.submit_read(t, out, np.arange(t.size)), out, t, dict(model)))
        for done in reads:
            check(done)
    finally:
        tier.close()
        executor.close()


def test_ordering_with_a_slow_write(tmp_path, monkeypatch):
    """A delayed write of a slot: a later write of it lands after, a read waits for both."""
    real_pwritev = os.pwritev
    calls = []

    def slow(fd, buffers, offset):
        calls.append(offset)
        if len(calls) == 1:
            time.sleep(0.3)  # lands late, so a wrong order would show; the right one holds anyway
        return real_pwritev(fd, buffers, offset)

    python_io(monkeypatch)
    monkeypatch.setattr(executor_mod.os, "pwritev", slow)
    src = samples(TINY, 2)
    with tier_file(tmp_path, slots=2, keys=TINY, name="slow") as tier:
        tier.submit_write(np.array([1]), src, np.array([0]))
        tier.submit_write(np.array([1]), src, np.array([1]))
        for _ in range(2):  # at once, then with every write done
            out = empty(TINY, 1)
            wait(tier.submit_read(np.array([1]), out, np.array([0])))
            for s, o in zip(src, out, strict=True):
                assert o[0].tobytes() == s[1].tobytes()
            tier.wait_writes()


def test_staging_bounded(tmp_path):
    """More rows than staging slots in one call: written in turns, all correct."""
    src = samples(PAGES, 40)
    with tier_file(tmp_path, slots=64, keys=PAGES, name="stage", staging_slots=3) as tier:
        futures = tier.submit_write(np.arange(40)[::-1].copy(), src, np.arange(40))
        assert len(futures) >= 14
        tier.wait_writes()
        out = empty(PAGES, 40, aligned=True)
        wait(tier.submit_read(np.arange(40), out, np.arange(40)))
        for s, o in zip(src, out, strict=True):
            np.testing.assert_array_equal(o, s[::-1])
        assert tier.write_wait_seconds >= 0


def test_gone_after_gc(tmp_path):
    import gc

    tier = tier_file(tmp_path, slots=2, keys=TINY, name="gc")
    wait(tier.submit_write(np.array([0]), samples(TINY, 1), np.array([0])))
    fd = tier._fd
    assert os.fstat(fd).st_nlink == 0  # no name: nothing to remove
    del tier
    gc.collect()
    with pytest.raises(OSError):
        os.fstat(fd)  # closed: the kernel frees the file
    assert list(tmp_path.iterdir()) == []


def test_gone_at_exit(tmp_path):
    code = (
        "import sys, numpy as np\n"
        "from solar.cache.tier import TierFile\n"
        "from solar.io.executor import Executor\n"
        "from solar.io.info import KeyInfo\n"
        "k = (KeyInfo('x', (3,), np.dtype(np.float32)),)\n"
        "t = TierFile(sys.argv[1], slots=4, keys=k, name='exit', executor=Executor(1))\n"
        "t.submit_write(np.array([1]), [np.ones((1, 3), np.float32)], np.array([0]))\n"
        "sys._tier = t  # still referenced at exit: only the exit hook can remove it\n"
        "print(t.path)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(tier_mod.__file__).parents[2])}
    res = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        capture_output=True,
        env=env,
        text=True,
        check=True,
    )
    assert "solar-tier-exit." in res.stdout
    assert not Path(res.stdout.strip()).exists()
    assert tier_files(tmp_path) == []


def test_a_forked_child_is_refused_and_leaves_the_parents_file(tmp_path):
    """The file and its ordering belong to the process that made it: a forked child's use is
    refused (it makes a tier of its own), and its close() does not remove the file."""
    src = samples(TINY, 2)
    with tier_file(tmp_path, slots=4, keys=TINY, name="fork") as tier:
        wait(tier.submit_write(np.array([0]), src, np.array([0])))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads
            pid = os.fork()
        if pid == 0:
            ok = 1
            try:
                with pytest.raises(SolarError, match="belongs to process"):
                    tier.submit_read(np.array([0]), empty(TINY, 1), np.array([0]))
                tier.close()
                ok = 0
            finally:
                os._exit(ok)
        assert os.waitpid(pid, 0)[1] == 0
        os.fstat(tier._fd)  # the parent's descriptor is still open
        out = empty(TINY, 1)
        wait(tier.submit_read(np.array([0]), out, np.array([0])))
        for o, s in zip(out, src, strict=True):
            np.testing.assert_array_equal(o[0], s[0])


def test_stale_files(tmp_path):
    host = tier_mod.sanitise(socket.gethostname())
    proc = subprocess.Popen(["true"])
    proc.wait()
    dead = tmp_path / f"solar-tier-abc-r3-{host}-{proc.pid}.bin"
    live = tmp_path / f"solar-tier-abc-r1-{host}-{os.getppid()}.bin"
    other = tmp_path / f"solar-tier-abc-r3-otherhost-{proc.pid}.bin"
    for p in (dead, live, other):
        p.write_bytes(b"old")
    with pytest.warns(UserWarning, match="removed a tier file left by a crashed run: .*abc-r3"):
        tier = tier_file(tmp_path, slots=1, keys=TINY, name="new-r0")
    assert not dead.exists() and live.exists() and other.exists()
    tier.close()


def test_no_space(tmp_path, monkeypatch):
    class Vfs:
        f_bavail, f_frsize = 10, 4096

    monkeypatch.setattr(tier_mod.os, "statvfs", lambda d: Vfs())
    message = f"tier {tmp_path}: needs 1.6 MiB for 100 slots of 16.0 KiB, 40.0 KiB free"
    with pytest.raises(SolarError, match=re.escape(message)):
        tier_file(
            tmp_path, slots=100, keys=(KeyInfo("x", (4000,), np.dtype(np.float32)),), name="big"
        )
    assert list(tmp_path.iterdir()) == []


def test_bad_arguments(tmp_path):
    with pytest.raises(SolarError, match="does not exist"):
        tier_file(tmp_path / "nope", slots=1, keys=TINY, name="x")
    (tmp_path / "f").write_bytes(b"")
    with pytest.raises(SolarError, match="not a directory"):
        tier_file(tmp_path / "f", slots=1, keys=TINY, name="x")
    with pytest.raises(SolarError, match="must be >= 1"):
        tier_file(tmp_path, slots=0, keys=TINY, name="x")
    assert tier_files(tmp_path) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_read_only_directory(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    with pytest.raises(SolarError, match="not writable"):
        tier_file(ro, slots=1, keys=TINY, name="x")


def test_out_of_range(tmp_path):
    src = samples(TINY, 2)
    with tier_file(tmp_path, slots=4, keys=TINY, name="rng/r0 weird") as tier:
        assert tier.path.name.startswith("solar-tier-rng_r0_weird.")
        with pytest.raises(SolarError, match=r"slot 4 outside 0\.\.3"):
            tier.submit_write(np.array([0, 4]), src, np.arange(2))
        with pytest.raises(SolarError, match="slot -1 outside"):
            tier.submit_read(np.array([-1]), empty(TINY, 1), np.array([0]))
        with pytest.raises(SolarError, match=r"row 2 outside 0\.\.1"):
            tier.submit_read(np.array([0]), empty(TINY, 2), np.array([2]))
        assert tier.bytes_written == tier.bytes_read == 0
    with pytest.raises(SolarError, match="after close"):
        tier.submit_read(np.array([0]), empty(TINY, 1), np.array([0]))
    tier.close()  # idempotent


def test_o_direct_refused(tmp_path, monkeypatch):
    real_open = os.open
    advised = []

    def no_direct(path, flags, *args):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(tier_mod.os, "open", no_direct)
    real_fadvise = os.posix_fadvise
    monkeypatch.setattr(
        tier_mod.os, "posix_fadvise", lambda *a: advised.append(a) or real_fadvise(*a)
    )
    src = samples(ODD, 5)
    with pytest.warns(UserWarning, match="no O_DIRECT here"):
        tier = tier_file(tmp_path, slots=5, keys=ODD, name="fb")
    with tier:
        assert not tier.direct_io
        wait(tier.submit_write(np.arange(5), src, np.arange(5)))
        assert advised and advised[0][3] == os.POSIX_FADV_DONTNEED
        out = empty(ODD, 5)
        wait(tier.submit_read(np.arange(5), out, np.arange(5)))
        for s, o in zip(src, out, strict=True):
            np.testing.assert_array_equal(o, s)


def test_io_error_is_one_line(tmp_path, monkeypatch):
    def eio(*a):
        raise OSError(errno.EIO, "Input/output error")

    python_io(monkeypatch)
    with tier_file(tmp_path, slots=4, keys=TINY, name="eio") as tier:
        monkeypatch.setattr(executor_mod.os, "pwritev", eio)
        futures = tier.submit_write(np.array([2]), samples(TINY, 1), np.array([0]))
        with pytest.raises(SolarError, match=r"slot 2: Input/output error"):
            wait(futures)
        with pytest.raises(SolarError, match="Input/output error"):
            tier.wait_writes()
        with pytest.raises(SolarError, match="Input/output error"):  # the tier is unusable now
            tier.submit_read(np.array([2]), empty(TINY, 1), np.array([0]))
    monkeypatch.undo()
    python_io(monkeypatch)
    with tier_file(tmp_path, slots=4, keys=TINY, name="eio-read") as tier:
        wait(tier.submit_write(np.array([1]), samples(TINY, 1), np.array([0])))
        monkeypatch.setattr(executor_mod.os, "preadv", eio)
        with pytest.raises(SolarError, match=r"eio-read\..*: slot 1: Input/output error"):
            wait(tier.submit_read(np.array([1]), empty(TINY, 1), np.array([0])))


def test_reads_of_a_slot_a_pending_step_writes_are_held_until_it_writes(tmp_path):
    """The tier owns the read-ahead hazard: step 3's read of slot 1, started while step 2
    (which writes slot 1 when served) is pending, sees step 2's sample, not the old one."""
    src = samples(TINY, 2)
    with tier_file(tmp_path, slots=2, keys=TINY, name="held") as tier:
        wait(tier.submit_write(np.array([1]), src, np.array([0])))  # the old content
        tier.reset(2)
        tier.expect_writes(2, np.array([1]))
        out = empty(TINY, 2)
        early = tier.read_step(3, np.array([0, 1]), out, np.array([0, 1]))
        assert not early[-1].done()  # held: step 2 has not written
        tier.submit_write(np.array([1]), src, np.array([1]))  # step 2 served: its write
        tier.done_writing(2)
        assert wait(early) == 2 * tier.stride
        for s, o in zip(src, out, strict=True):
            assert o[1].tobytes() == s[1].tobytes()
        # A new run of steps drops reads still held.
        tier.expect_writes(4, np.array([0]))
        held = tier.read_step(5, np.array([0]), empty(TINY, 1), np.array([0]))
        tier.reset(0)
        assert held[-1].cancelled()
    assert tier_files(tmp_path) == []


def test_held_reads_fail_rather_than_hang_when_the_tier_has_failed(tmp_path, monkeypatch):
    """A write fails while a read waits for a later step's write: done_writing fails the held
    read (one line) instead of leaving its future pending, and close() returns."""

    def eio(*a):
        raise OSError(errno.EIO, "Input/output error")

    python_io(monkeypatch)
    src = samples(TINY, 1)
    with tier_file(tmp_path, slots=2, keys=TINY, name="held-eio") as tier:
        tier.reset(0)
        tier.expect_writes(0, np.array([1]))
        held = tier.read_step(1, np.array([1]), empty(TINY, 1), np.array([0]))
        monkeypatch.setattr(executor_mod.os, "pwritev", eio)
        with pytest.raises(SolarError, match="Input/output error"):
            wait(tier.submit_write(np.array([1]), src, np.array([0])))  # step 0's write
        with pytest.raises(SolarError, match="Input/output error"):
            tier.wait_writes()  # the tier knows it failed
        tier.done_writing(0)
        with pytest.raises(SolarError, match="Input/output error"):
            wait(held)


def test_a_read_of_a_step_never_waits_for_its_own_or_later_writes(tmp_path):
    """Step 2 announced its writes, then fails and is served again: its reads (and an earlier
    step's) start at once, they do not wait for step 2's writes."""
    with tier_file(tmp_path, slots=2, keys=TINY, name="own") as tier:
        tier.reset(1)
        tier.expect_writes(2, np.array([0, 1]))
        assert wait(tier.read_step(2, np.array([0, 1]), empty(TINY, 2), np.arange(2))) > 0
        assert wait(tier.read_step(1, np.array([1]), empty(TINY, 1), np.arange(1))) > 0


def test_a_write_waits_for_the_reads_of_the_old_content(tmp_path, monkeypatch):
    """A slow read of a slot, then a write of it: the read still sees the old sample."""
    real_preadv = os.preadv
    python_io(monkeypatch)

    def slow(fd, buffers, offset):
        time.sleep(0.3)  # as above: widens the window a wrong order would need, at any speed
        return real_preadv(fd, buffers, offset)

    src = samples(TINY, 2)
    with tier_file(tmp_path, slots=2, keys=TINY, name="war") as tier:
        wait(tier.submit_write(np.array([1]), src, np.array([0])))
        monkeypatch.setattr(executor_mod.os, "preadv", slow)
        out = empty(TINY, 1)
        read = tier.submit_read(np.array([1]), out, np.array([0]))
        wait(tier.submit_write(np.array([1]), src, np.array([1])))  # the new sample
        wait(read)
        for s, o in zip(src, out, strict=True):
            assert o[0].tobytes() == s[0].tobytes()


def test_the_tier_file_has_no_name_and_nothing_is_left_after_a_kill(tmp_path):
    """Issue 33, cause 4: no other process can truncate or overwrite the tier by name, and a
    rank killed by SIGKILL (no finalizer runs) leaves no file behind."""
    with tier_file(tmp_path, slots=4, keys=TINY, name="anon") as tier:
        wait(tier.submit_write(np.arange(4), samples(TINY, 4), np.arange(4)))
        assert os.fstat(tier._fd).st_nlink == 0
        assert list(tmp_path.iterdir()) == []
    read, write = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads
        pid = os.fork()
    if pid == 0:  # a rank: makes its tier, writes a slot, then is killed
        try:
            os.close(read)
            t = TierFile(tmp_path, slots=64, keys=TINY, name="kill", executor=Executor(1))
            t.submit_write(np.array([1]), samples(TINY, 1), np.array([0]))
            t.wait_writes()
            os.write(write, b"ready")
            time.sleep(60)
        finally:
            os._exit(1)
    os.close(write)
    try:
        assert os.read(read, 5) == b"ready"
        assert list(tmp_path.iterdir()) == []  # alive, written: still no name
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(read)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("direct_io", [False, True])
def test_a_truncated_tier_never_yields_a_slot(tmp_path, direct_io):
    """Issue 33, cause 4: the tier file truncated under the run (through /proc/PID/fd, the
    one way left) and re-extended by later writes: every read fails in one line and leaves
    its rows untouched, never full-length zeros."""
    src = samples(TINY, 8)
    with tier_file(tmp_path, slots=8, keys=TINY, name="trunc", direct_io=direct_io) as tier:
        wait(tier.submit_write(np.arange(8), src, np.arange(8)))
        tier.wait_writes()
        os.truncate(f"/proc/self/fd/{tier._fd}", 0)
        with pytest.raises(SolarError) as err:
            wait(tier.submit_write(np.array([7]), src, np.array([7])))  # a later demotion
        message = str(err.value)
        assert "trunc." in message and "the file is 0 bytes" in message
        assert "\n" not in message
        out = empty(TINY, 4)
        for o in out:
            o.view(np.uint8)[...] = 0xAB
        with pytest.raises(SolarError, match="truncated or grown"):
            wait(tier.submit_read(np.arange(4), out, np.arange(4)))
        for o in out:
            assert (o.view(np.uint8) == 0xAB).all()  # nothing served, no zeros
