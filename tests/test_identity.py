"""Files that change under a run (issue 33, cause 3): refused in one line, never served.

A contiguous HDF5 file rewritten in place (the same inode) and a one-sample file replaced
(another inode) while more files than the descriptor cache holds are read: each run stops
with "changed since it was opened", and no batch served holds other bytes than h5py's copy of
the original.
"""

from __future__ import annotations

import os
import time

import h5py
import numpy as np
import pytest
from helpers import reference, write_h5

from solar import Loader, SolarError
from solar.config import ReaderConfig
from solar.io import handles
from solar.io.executor import _same_files
from solar.io.identity import (
    CTIME,
    DEV,
    IGNORED,
    INO,
    MTIME,
    SIZE,
    FileChanged,
    Identities,
    stamp,
)
from solar.options import ExpertConfig

N = 96


def _serve(loader: Loader, ref: dict, change, after: int, refused: bool = True) -> tuple[int, str]:
    """Iterate epochs 0-1, calling ``change()`` after ``after`` batches; every batch served
    must be h5py's copy of the original. Returns (batches served, the error's message; with
    ``refused`` False, both epochs served to their end and "")."""
    served = 0

    def run() -> None:
        nonlocal served
        for e in range(2):
            loader.set_epoch(e)
            for batch in loader:
                ids = batch["index"].numpy()
                assert np.array_equal(batch["x"].numpy(), ref["x"][ids]), served
                served += 1
                if served == after:
                    time.sleep(0.02)  # past the file system's timestamp granularity
                    change()

    if not refused:
        run()
        return served, ""
    with pytest.raises(SolarError) as err:
        run()
    return served, str(err.value)


def test_hdf5_file_rewritten_in_place_stops_the_run(tmp_path):
    path = write_h5(tmp_path / "d.h5", x=np.arange(N * 16, dtype=np.float32).reshape(N, 16))
    ref = reference([path])
    ino = os.stat(path).st_ino
    loader = Loader([path], batch_size=8, epochs=2, buffer=16,
                    reader=ReaderConfig(threads=2, read_ahead=1),
                    expert=ExpertConfig(warm=False))  # fmt: skip

    def rewrite() -> None:
        with h5py.File(path, "w") as f:  # the same inode, the same layout, other values
            f["x"] = -np.arange(N * 16, dtype=np.float32).reshape(N, 16)
        assert os.stat(path).st_ino == ino

    served, message = _serve(loader, ref, rewrite, after=3)
    assert served < 2 * N // 8
    assert "d.h5: changed since it was opened" in message and "\n" not in message
    loader.close()


def test_rewrite_in_place_with_its_times_put_back_stops_the_run(tmp_path):
    # What `cp -p` or `rsync --inplace -t` onto the file do: the same inode and size, other
    # bytes, the atime and mtime put back. Only the ctime tells (a user cannot set it).
    x = np.arange(N * 16, dtype=np.float32).reshape(N, 16)
    path = write_h5(tmp_path / "d.h5", x=x)
    ref = reference([path])
    loader = Loader([path], batch_size=8, epochs=2, buffer=16,
                    reader=ReaderConfig(threads=2, read_ahead=1),
                    expert=ExpertConfig(warm=False))  # fmt: skip
    data = path.read_bytes()
    offset = data.index(x.tobytes())  # contiguous: x's bytes as they are on disk

    def rewrite() -> None:
        was = os.stat(path)
        with open(path, "r+b") as f:
            f.seek(offset)
            f.write((-x).tobytes())
        os.utime(path, ns=(was.st_atime_ns, was.st_mtime_ns))
        now = os.stat(path)
        assert (now.st_ino, now.st_size, now.st_mtime_ns) == (was.st_ino, was.st_size,
                                                              was.st_mtime_ns)  # fmt: skip

    served, message = _serve(loader, ref, rewrite, after=3)
    assert served < 2 * N // 8
    assert "d.h5: changed since it was opened (its ctime moved" in message
    assert "\n" not in message
    loader.close()


def test_replaced_one_sample_file_stops_the_run_beyond_the_descriptor_cache(tmp_path, monkeypatch):
    # A small descriptor cache (as under `ulimit -n 64`): files are opened per read.
    monkeypatch.setattr(handles, "fd_capacity", lambda: 16)
    paths = [write_h5(tmp_path / f"s{i:03d}.h5", x=np.full(16, i, np.float32)) for i in range(N)]
    ref = {"x": np.stack([np.full(16, i, np.float32) for i in range(N)])}
    loader = Loader(paths, batch_size=8, epochs=2, buffer=0,
                    reader=ReaderConfig(threads=2, read_ahead=0, one_per_file=True),
                    expert=ExpertConfig(warm=False))  # fmt: skip
    assert loader.reader.files.streams

    def replace() -> None:
        for i in range(N):  # every file: whichever the next batches read
            new = write_h5(tmp_path / "new.h5", x=np.full(16, -1, np.float32))
            os.replace(new, paths[i])

    served, message = _serve(loader, ref, replace, after=2)
    assert served == 2
    assert "changed since it was opened (modified or replaced)" in message
    assert "\n" not in message
    loader.close()


def test_identities_name_what_changed(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"a" * 100)
    ids = Identities([path])
    ids.check_paths()  # pins it
    was = os.stat(path)
    pinned = ids.table[0]
    assert (pinned[DEV], pinned[INO], pinned[SIZE], pinned[MTIME], pinned[CTIME]) == (
        was.st_dev,
        was.st_ino,
        was.st_size,
        was.st_mtime_ns,
        was.st_ctime_ns,
    )
    with open(path, "r+b") as f:
        f.truncate(10)
    with pytest.raises(FileChanged, match=r"f\.bin: changed since it was opened \(truncated: 100"):
        ids.check_paths()
    os.unlink(path)
    with pytest.raises(FileChanged, match="removed"):
        ids.check_paths()


def _move_ctime(path) -> None:
    """chmod ``path`` (alternating modes, both readable) until its ctime moves: only it does.
    Bounded, without sleeps: where the ctime's resolution is coarse, a chmod may keep it."""
    was = os.stat(path).st_ctime_ns
    for k in range(200_000):
        os.chmod(path, 0o600 if k % 2 == 0 else 0o644)
        if os.stat(path).st_ctime_ns != was:
            return
    pytest.fail(f"{path}: its ctime did not move in 200,000 chmods")


def test_the_compiled_check_reads_the_identity_stamp_does(tmp_path):
    # The open-read-close loop's statx (solar/io/executor.py) must pin and compare what
    # solar.io.identity.stamp says, the ctime too; a mismatch would only fall back to Python.
    path = tmp_path / "f.bin"
    path.write_bytes(b"a" * 100)
    ids = Identities([path])
    fd = os.open(path, os.O_RDONLY)
    try:
        one, first = np.array([fd], np.int64), np.zeros(1, np.int64)
        assert _same_files(one, first, ids.table) == -1  # pinned by the compiled check
        assert tuple(ids.table[0].tolist()) == stamp(os.stat(path))
        _move_ctime(path)  # only the ctime moves (however coarse its resolution)
        assert _same_files(one, first, ids.table) == 0
        with pytest.raises(FileChanged, match=r"f\.bin: changed since it was opened \(its ctime"):
            ids.check_fd(0, fd)
    finally:
        os.close(fd)


def test_identity_mtime_leaves_the_ctime_out_of_both_checks(tmp_path):
    # ReaderConfig(identity="mtime"): the ctime neither pinned nor compared, by the compiled
    # check (one-sample files read beyond the descriptor cache) and by Python's alike.
    path = tmp_path / "f.bin"
    path.write_bytes(b"a" * 100)
    ids = Identities([path], identity="mtime")
    fd = os.open(path, os.O_RDONLY)
    try:
        one, first = np.array([fd], np.int64), np.zeros(1, np.int64)
        assert _same_files(one, first, ids.table) == -1
        assert ids.table[0, CTIME] == IGNORED and ids.table[0, INO] == os.stat(path).st_ino
        _move_ctime(path)
        assert _same_files(one, first, ids.table) == -1 and ids.table[0, CTIME] == IGNORED
        ids.check_fd(0, fd)
        ids.check_paths()
        with open(path, "r+b") as f:  # the mtime still tells a rewrite
            f.write(b"b")
        assert _same_files(one, first, ids.table) == 0
        with pytest.raises(FileChanged, match="modified in place"):
            ids.check_fd(0, fd)
    finally:
        os.close(fd)
    with pytest.raises(SolarError, match='identity must be "ctime" or "mtime", got \'atime\''):
        ReaderConfig(identity="atime")


@pytest.mark.parametrize("identity", ["ctime", "mtime"])
def test_a_chmod_mid_run_is_refused_unless_identity_is_mtime(tmp_path, identity):
    # An HSM's attributes, an ACL sweep, a backup's hard link: only the ctime moves. Refused
    # by default, naming the opt-out; with identity="mtime" the run goes on, h5py's bytes.
    x = np.arange(N * 16, dtype=np.float32).reshape(N, 16)
    path = write_h5(tmp_path / "d.h5", x=x)
    ref = reference([path])
    loader = Loader([path], batch_size=8, epochs=2, buffer=16,
                    reader=ReaderConfig(threads=2, read_ahead=1, identity=identity),
                    expert=ExpertConfig(warm=False))  # fmt: skip
    strict = identity == "ctime"
    served, message = _serve(loader, ref, lambda: _move_ctime(path), after=3, refused=strict)
    loader.close()
    if strict:
        assert "d.h5: changed since it was opened (its ctime moved" in message, message
        assert 'ReaderConfig(identity="mtime")' in message and "\n" not in message
        assert served < 2 * N // 8
    else:
        assert served == 2 * N // 8
