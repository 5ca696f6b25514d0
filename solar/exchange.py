"""Equal local batches at run time: a step's surplus rows move between ranks.

:mod:`solar.schedule.keep.transfer` says, from every rank's served counts, which rows each rank
sends to which: a rank over its share sends the rows after its first ``keep``, a rank under it
receives rows into its batch after its own. :class:`Exchange` moves them through the job's own
communicator, with one all-to-all per step (the keys' rows and the sample ids packed per
peer): ``MPI_Ialltoallv`` over an mpi4py communicator (shared memory within a node under
MPICH), else torch.distributed's ``all_to_all_single`` (gloo: batches are CPU memory; a gloo
group is made beside NCCL's). The moved rows are copied twice (packed, unpacked) by
:func:`~solar.cache.slots.copy_rows`: a few per cent of an epoch's bytes.

Every rank calls :meth:`Exchange.run` at the same steps (those where any rank moves rows:
the counts are known to all), so the collectives match. A rank that fails before its
exchange ends the job (the Loader serves such steps under ``abort_job_on_error``), so no rank
waits in a collective for rows that never come.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from solar._held_tensors import hold
from solar.cache.slots import copy_rows
from solar.errors import SolarError
from solar.io.info import KeyInfo
from solar.schedule.keep.transfer import Transfer


def _bytes2d(a: np.ndarray) -> np.ndarray:
    """Rows of ``a`` as bytes: (rows, row bytes) uint8, a view."""
    return a.reshape(a.shape[0], -1).view(np.uint8)


class Exchange:
    """Moves rows between the ranks of ``comm`` (an mpi4py communicator or a
    :class:`~solar.dist.TorchComm`); made by every rank together (with torch.distributed on
    another backend than gloo it makes a gloo group, a collective)."""

    def __init__(self, comm: Any, keys: tuple[KeyInfo, ...]) -> None:
        self.comm = comm
        self.world = comm.Get_size()
        self.mpi = type(comm).__module__.startswith("mpi4py")
        # A moved row: every key's bytes, then its sample id.
        self.row_bytes = sum(k.row_bytes for k in keys) + 8
        self._send = np.empty(0, np.uint8)  # staging, grown as needed
        self._recv = np.empty(0, np.uint8)
        self._group: Any = None
        self._type: Any = None
        if self.mpi:
            from mpi4py import MPI

            # One element per moved row (a peer's block is its rows' bytes, whatever the
            # layout inside): counts stay small however large the samples.
            self._type = MPI.BYTE.Create_contiguous(self.row_bytes)
            self._type.Commit()
        else:
            import torch.distributed as td

            if not td.is_initialized():
                raise SolarError("equal_batches: torch.distributed is not initialised")
            if td.get_backend() != "gloo":  # batches are CPU memory: NCCL cannot move them
                self._group = td.new_group(backend="gloo")

    def run(self, tr: Transfer, batch: list[np.ndarray], ids: np.ndarray) -> None:
        """Move the step's rows: rows ``tr.keep..`` of ``batch`` (per key) and of ``ids`` go
        to the ranks ``tr.send`` names; rows arrive from ``tr.recv``'s ranks into the same
        place, in rank order. ``batch`` and ``ids`` hold room for ``max(served, share)`` rows.

        One all-to-all per step: the rows bound for each rank are packed (each key's, then
        the ids) into one staging buffer, and unpacked likewise."""
        rows = [_bytes2d(b) for b in batch] + [ids.reshape(-1, 1).view(np.uint8)]
        sent, got = int(tr.send.sum()), int(tr.recv.sum())
        if self._send.size < sent * self.row_bytes:
            self._send = np.empty(sent * self.row_bytes, np.uint8)
        if self._recv.size < got * self.row_bytes:
            self._recv = np.empty(got * self.row_bytes, np.uint8)
        send, recv = self._send[: sent * self.row_bytes], self._recv[: got * self.row_bytes]
        _pack(rows, tr.keep, tr.send, send, into_rows=False)
        if self.mpi:
            req = self.comm.Ialltoallv(
                [send, (tr.send, np.cumsum(tr.send) - tr.send), self._type],
                [recv, (tr.recv, np.cumsum(tr.recv) - tr.recv), self._type],
            )
            # MPI waits by spinning: a waiting rank would take a core from the ranks it waits
            # for (ranks may outnumber cores). Test, and sleep a little between tests.
            while not req.Test():
                time.sleep(_POLL_S)
        else:
            import torch
            import torch.distributed as td

            split_in = (tr.send * self.row_bytes).tolist()
            split_out = (tr.recv * self.row_bytes).tolist()
            into, out = torch.from_numpy(recv), torch.from_numpy(send)
            td.all_to_all_single(into, out, split_out, split_in, group=self._group)
            hold(into, out)  # until gloo's threads let go (a release at exit would abort)
        _pack(rows, tr.keep, tr.recv, recv, into_rows=True)

    def close(self) -> None:
        """Free the MPI type (the communicator is the job's)."""
        if self._type is not None:
            self._type.Free()
            self._type = None


_POLL_S = 50e-6


def _pack(
    rows: list[np.ndarray], lo: int, counts: np.ndarray, staging: np.ndarray, into_rows: bool
) -> None:
    """Copy rows ``lo..`` of each of ``rows`` (2-D byte views) to ``staging`` (or back, with
    ``into_rows``): peer by peer, each key's rows then the next key's."""
    at = 0
    first = lo
    for n in counts.tolist():
        if not n:
            continue
        block = np.arange(first, first + n)
        for v in rows:
            width = v.shape[1]
            part = staging[at : at + n * width].reshape(n, width)
            order = np.arange(n)
            if into_rows:
                copy_rows(part, order, v, block)
            else:
                copy_rows(v, block, part, order)
            at += n * width
        first += n
