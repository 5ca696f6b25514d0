"""solar/host/sealed.py in one process (a host of one rank; tests/mpi/shared_graph.py runs it
on two): bytes filled once, sealed, then read-only for good; a failure is one line and leaves
no descriptor."""

from __future__ import annotations

import os

import numpy as np
import pytest
from helpers import proc_status

from solar.errors import SolarError
from solar.host.region import layout
from solar.host.sealed import LABEL, host_sealed, host_shares


def _ours() -> list[str]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if LABEL in os.readlink(f"/proc/self/fd/{fd}"):
                out.append(fd)
        except OSError:
            continue
    return out


def test_sealed_bytes_are_checked_once_and_no_process_can_change_them():
    data = np.arange(1000, dtype=np.int64)
    offsets, total = layout({"a": ((1000,), np.int64), "b": ((3,), np.int32)})
    assert offsets == {"a": 0, "b": 8192} and total == 2 * 4096 + 4096
    checked = []

    def produce(alloc, written):
        buf = alloc(total)
        np.ndarray((1000,), np.int64, buffer=buf)[:] = data
        return {"n": 1000}

    def check(sealed, record):
        checked.append(int(sealed.array(0, (record["n"],), np.int64).sum()))
        return record

    sealed, record = host_sealed(None, produce, check, "test")
    assert record == {"n": 1000} and checked == [int(data.sum())]
    a = sealed.array(0, (1000,), np.int64)
    assert np.array_equal(a, data) and not a.flags.writeable
    with pytest.raises(ValueError):
        a[0] = 5
    # Its one descriptor is the mapping's own; through it, no write reaches the bytes.
    (fd,) = _ours()
    with pytest.raises(PermissionError):
        w = os.open(f"/proc/self/fd/{fd}", os.O_RDWR)
        try:
            os.pwrite(w, b"x", 0)
        finally:
            os.close(w)
    assert np.array_equal(a, data)
    assert not host_shares(None)


@pytest.mark.parametrize("where", ["produce", "check", "type"])
def test_a_failure_is_one_line_and_leaves_no_descriptor(where):
    def produce(alloc, written):
        buf = alloc(100)
        if where == "produce":
            raise SolarError("graph g.h5: indices cannot be read")
        if where == "type":
            buf[0] = 1
            raise KeyError("boom")
        return None

    def check(sealed, record):
        raise SolarError("graph g.h5: indptr decreases")

    with pytest.raises(SolarError) as info:
        host_sealed(None, produce, check, "graph g.h5: its topology")
    assert "\n" not in str(info.value) and str(info.value).startswith("graph g.h5")
    assert not _ours()


def test_the_writer_holds_only_the_part_it_fills_and_the_bytes_stay():
    """A host's copy larger than its writer may hold at once (issue 48: 7 GiB at 10^8 nodes):
    each part told written() leaves the writer's memory, not the memfd's."""
    part, parts = 8 << 20, 8
    held = []

    def produce(alloc, written):
        buf = alloc(part * parts + 100)
        for i in range(parts):
            window = buf[i * part + 50 : (i + 1) * part + 50]  # (not page-aligned)
            window[:] = i + 1
            written(window)
            held.append(proc_status("RssShmem"))
        buf[:50] = 7  # (a page written() dropped faults back in, its bytes there)
        with pytest.raises(SolarError, match="outside its allocation"):
            written(np.zeros(4, np.uint8))
        return None

    before = proc_status("RssShmem")
    sealed, _ = host_sealed(None, produce, lambda s, r: r, "test")
    assert max(held) - before < 2 * part, (before, held)  # (a page or two, not 64 MiB)
    got = sealed.array(0, (part * parts + 100,), np.uint8)
    assert (got[:50] == 7).all() and (got[-50:] == 0).all()
    for i in range(parts):
        assert (got[i * part + 50 : (i + 1) * part + 50] == i + 1).all()
    del got
    sealed.close()
    assert not _ours()
