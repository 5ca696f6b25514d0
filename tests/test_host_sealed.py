"""solar/host/sealed.py in one process (a host of one rank; tests/mpi/shared_graph.py runs it
on two): bytes filled once, sealed, then read-only for good; a failure is one line and leaves
no descriptor."""

from __future__ import annotations

import os

import numpy as np
import pytest

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

    def produce(alloc):
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
    def produce(alloc):
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
