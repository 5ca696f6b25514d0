"""Bytes read once per host and frozen: one sealed ``memfd`` that every local rank maps read-only.

Local rank 0 creates the memfd (its pages reserved: memory that runs out fails here with one
line), fills it through a writable mapping, drops that mapping and seals the file against any
write, shrink or growth (solar/host/memfd.py ``FROZEN``); only then does it check the bytes,
through a read-only mapping. The other local ranks open it through ``/proc`` (its inode and
seals checked), map it read-only, and trust the check: the bytes checked are the bytes they
map, and no process can change them any more. Descriptors are closed once every local rank has
mapped it; nothing is ever named (nothing in ``/dev/shm``); the memory goes with the last
mapping. What solar/graph/csr.py holds a graph's topology in (issue 48): one copy per host.

The construction is a collective of the job's communicator (the bytes travel within each host's,
:func:`solar.host.host_comm`); every rank of the job fails alike, so that no host goes on into
the job's next collective while another has failed.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from solar.errors import SolarError, first_error
from solar.host import memfd as _memfd
from solar.host.place import host_comm, place
from solar.host.region import host_creators

LABEL = "solar-sealed"  # (the memfd's label, seen in /proc/PID/maps)


class SealedBytes:
    """A read-only mapping of a sealed memfd (``inode``: the file's, the same on every local
    rank), carved into arrays by byte offset (:meth:`array`)."""

    def __init__(self, mapped: mmap.mmap, inode: int) -> None:
        self._map = mapped
        self.inode = inode
        self.nbytes = len(mapped)

    def close(self) -> None:
        """Unmap (and let go the mapping's descriptor) unless arrays of it are alive."""
        try:
            self._map.close()
        except BufferError:
            pass  # (unmapped with the last of them)

    def array(self, offset: int, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """The read-only array of ``shape`` and ``dtype`` at byte ``offset``."""
        return np.ndarray(shape, np.dtype(dtype), buffer=self._map, offset=offset)


def host_shares(comm: Any) -> bool:
    """Whether ``comm``'s job runs several ranks on a host (a collective the first time,
    :func:`solar.host.place`): where it does, :func:`host_sealed` saves memory; the same
    answer on every rank, so that all of them call it or none."""
    return comm is not None and comm.Get_size() > 1 and max(map(len, place(comm).groups)) > 1


# Given alloc(nbytes) and written(view): a record (see host_sealed).
Produce = Callable[[Callable[[int], np.ndarray], Callable[[np.ndarray], None]], Any]


def host_sealed(comm: Any, produce: Produce, check: Callable[[SealedBytes, Any], Any],
                what: str) -> tuple[SealedBytes, Any]:  # fmt: skip
    """Bytes made once per host of ``comm`` and mapped read-only by each of its ranks.

    On local rank 0, ``produce(alloc, written)`` calls ``alloc(nbytes)`` once for writable
    bytes (uint8), fills them -- calling ``written(view)`` with each part of them once it is
    final, whose pages then leave the process (they stay in the memfd: its writer holds no more
    of the copy than it is filling, however large the host's copy) -- and returns a small
    picklable record; the bytes are then sealed and
    ``check(sealed, record)`` (raising SolarError if they will not do) returns the record every
    local rank gets. Returns this rank's read-only :class:`SealedBytes` and that record. A
    collective of ``comm`` (every rank of the job): every rank fails alike; errors name
    ``what``."""
    where = place(comm)
    hc = host_comm(comm)
    local = where.local_rank
    fd, err, made = -1, "", None
    sealed: SealedBytes | None = None
    try:
        if local == 0:
            fd, err, record = _made(produce, what)
            if not err:
                try:
                    sealed = _mapped(fd)
                    made = (_memfd.ident(fd), sealed.nbytes, check(sealed, record))
                except SolarError as exc:
                    err = str(exc)
                except Exception as exc:  # (the peers wait in the collective below: fail alike)
                    err = f"{what}: {type(exc).__name__}: {exc}"
        err, made = host_creators(hc, where.host, local, err, made)
        if not err and local != 0:
            fd, err = _memfd.open_peer(made[0], made[1], os.O_RDONLY, what)
            if not err and not _memfd.sealed(fd, _memfd.FROZEN):
                err = f"{what}: /proc/{made[0][0]}/fd/{made[0][1]} is not sealed against writes"
            if not err:
                try:
                    sealed = _mapped(fd)
                except OSError as exc:
                    err = f"{what}: cannot map {made[1] / 2**30:.2f} GiB read-only: {exc}"
        # Every local rank has it mapped (or failed) before local rank 0 lets its descriptor go;
        # over the job's communicator, so that a host that failed fails every host alike.
        err = first_error(comm, err)
    finally:
        if fd >= 0:
            os.close(fd)
    if err:
        if sealed is not None:
            sealed.close()  # (Python's mmap holds a descriptor of its own)
        raise SolarError(err)
    assert sealed is not None and made is not None
    return sealed, made[2]


def _made(produce: Produce, what: str) -> tuple[int, str, Any]:
    """A memfd ``produce`` filled, sealed against any change: (its descriptor, "", produce's
    record), or (-1, a line naming ``what``, None)."""
    held: list = []  # (fd, writable mapping, its bytes) once allocated

    def alloc(nbytes: int) -> np.ndarray:
        nbytes = max(int(nbytes), 1)
        if held:
            raise SolarError(f"{what}: allocated twice")
        held.append(_memfd.reserved(LABEL, nbytes, what))
        held.append(mmap.mmap(held[0], nbytes, mmap.MAP_SHARED))
        held.append(np.frombuffer(held[1], np.uint8))
        return held[2]

    def written(view: np.ndarray) -> None:
        # The mapping's pages under ``view`` dropped (a shared mapping's bytes stay in the
        # memfd; a page shared with the next part faults back in when that part is written).
        start = view.ctypes.data - held[2].ctypes.data
        end = start + view.nbytes
        if not (0 <= start <= end <= len(held[1])):
            raise SolarError(f"{what}: written() given bytes outside its allocation")
        start -= start % mmap.PAGESIZE
        if end > start:
            held[1].madvise(mmap.MADV_DONTNEED, start, end - start)

    try:
        record = produce(alloc, written)
        if not held:
            alloc(0)
        del held[2:]  # (its bytes: the mapping closes only without views)
        held[1].close()  # no writable mapping left: F_SEAL_WRITE fails (EBUSY) with one
        _memfd.seal(held[0], _memfd.FROZEN)
        return held[0], "", record
    except SolarError as exc:
        _release(held)
        return -1, str(exc), None
    except Exception as exc:  # (the peers wait in a collective: they fail alike)
        _release(held)
        return -1, f"{what}: {type(exc).__name__}: {exc}", None
    except BaseException:
        _release(held)
        raise


def _release(held: list) -> None:
    del held[2:]
    if len(held) > 1 and not held[1].closed:
        try:
            held[1].close()
        except BufferError:
            pass
    if held:
        os.close(held[0])


def _mapped(fd: int) -> SealedBytes:
    size = os.fstat(fd).st_size
    return SealedBytes(mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ), os.fstat(fd).st_ino)
