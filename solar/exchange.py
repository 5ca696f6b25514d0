"""Equal local batches at run time: a step's surplus rows move between ranks.

:mod:`solar.schedule.transfer` says, from every rank's served counts, which rows each rank
sends to which: a rank over its share sends the rows after its first ``keep``, a rank under it
receives rows into its batch after its own. :class:`Exchange` moves them through the job's own
communicator, with one all-to-all per key plus one for the sample ids: ``MPI_Alltoallv`` over
an mpi4py communicator (shared memory within a node under MPICH), else torch.distributed's
``all_to_all_single`` (gloo: batches are CPU memory; a gloo group is made beside NCCL's).
Rows go straight from one rank's batch memory into the other's: no copy on either side.

Every rank calls :meth:`Exchange.run` at the same steps (those where any rank moves rows:
the counts are known to all), so the collectives match. A rank that fails before its
exchange ends the job (the Loader serves such steps under ``abort_job_on_error``), so no rank
waits in a collective for rows that never come.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from solar.errors import SolarError
from solar.io.hdf5 import KeyInfo
from solar.schedule.transfer import Transfer


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
        self._types: list[Any] = []
        self._group: Any = None
        if self.mpi:
            from mpi4py import MPI

            # A row is one element of a contiguous type: counts stay small whatever the rows.
            for nbytes in [k.row_bytes for k in keys] + [8]:  # the keys' rows, then the ids
                t = MPI.BYTE.Create_contiguous(nbytes)
                t.Commit()
                self._types.append(t)
        else:
            import torch.distributed as td

            if not td.is_initialized():
                raise SolarError("equal_batches: torch.distributed is not initialised")
            if td.get_backend() != "gloo":  # batches are CPU memory: NCCL cannot move them
                self._group = td.new_group(backend="gloo")

    def run(self, tr: Transfer, batch: list[np.ndarray], ids: np.ndarray) -> None:
        """Move the step's rows: rows ``tr.keep..`` of ``batch`` (per key) and of ``ids`` go
        to the ranks ``tr.send`` names; rows arrive from ``tr.recv``'s ranks into the same
        place, in rank order. ``batch`` and ``ids`` hold room for ``max(served, share)`` rows."""
        sent, got = int(tr.send.sum()), int(tr.recv.sum())
        lo = tr.keep
        # Every key's rows as bytes, then the ids (8 bytes a row): sliced, never copied.
        rows = [_bytes2d(b) for b in batch] + [ids.reshape(-1, 1).view(np.uint8)]
        if self.mpi:
            s_counts = (tr.send, np.cumsum(tr.send) - tr.send)
            r_counts = (tr.recv, np.cumsum(tr.recv) - tr.recv)
            for v, t in zip(rows, self._types, strict=True):
                self.comm.Alltoallv([v[lo : lo + sent], s_counts, t],
                                    [v[lo : lo + got], r_counts, t])  # fmt: skip
            return
        import torch
        import torch.distributed as td

        send, recv = tr.send.tolist(), tr.recv.tolist()
        for v in rows:
            td.all_to_all_single(torch.from_numpy(v[lo : lo + got]),
                                 torch.from_numpy(v[lo : lo + sent]), recv, send,
                                 group=self._group)  # fmt: skip

    def close(self) -> None:
        """Free the MPI types (the communicator is the job's)."""
        for t in self._types:
            t.Free()
        self._types = []
