"""Delivery: a step's assembled rows become the batch the trainer gets.

:meth:`Delivery.fit` trims the rows to the batch served (side rows and spare rows stay
behind) or, with equal batches, exchanges rows with the other ranks (solar.exchange);
:meth:`Delivery.batch` makes the dict of tensors, its ``index``, the sampler's extras (its
output of the step, drawn with the plan's draws, joined to the rows here: e.g. a subgraph) and
the user's ``batch_transform``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np

from solar.dist import abort_job_on_error
from solar.errors import SolarError
from solar.exchange import Exchange
from solar.io.info import KeyInfo
from solar.runtime.memory import InFlight
from solar.runtime.steps import Steps
from solar.schedule.draw.samplers import extras_of


class Delivered(NamedTuple):
    """A step's rows as delivered, and what moving them cost."""

    tensors: list[Any]  # per key, the delivered rows
    ids: np.ndarray  # (rows,) their sample ids
    sent: int = 0  # equal batches: rows served here, delivered by another rank
    received: int = 0  # ... and rows another rank served, delivered here
    exchange_seconds: float = 0.0


class Delivery:
    """Delivers one rank's steps: rows trimmed or exchanged, then made a dict."""

    def __init__(
        self,
        steps: Steps,
        keys: tuple[KeyInfo, ...],
        exchange: Exchange | None,
        batch_transform: Callable[[dict], dict] | None,
        comm: Any,
        batch_format: str = "dict",
    ) -> None:
        self.steps = steps
        self.keys = keys  # the delivered keys: the dataset's, or the transform's outputs
        self.exchange = exchange  # None: trim only, or a copy in another process
        self.batch_transform = batch_transform
        self.comm = comm  # a failed batch_transform ends the job
        self.batch_format = batch_format  # "pyg": the batch as a torch_geometric Data
        self.extras = extras_of(steps.sampler)  # the sampler's delivery side

    def fit(self, k: int, io: InFlight) -> Delivered:
        """With equal batches, make step ``k``'s served rows the batch this rank delivers:
        its first rows, and rows from other ranks after them."""
        tensors, arrays = io.delivered
        size = io.plan.size
        tr = self.steps.transfer(k)
        if tr is None:  # side rows (stored, not served) and spare rows stay behind
            return Delivered([t[:size] for t in tensors], io.plan.samples)
        index = np.empty(max(size, tr.size), np.int64)
        index[:size] = io.plan.samples
        t0 = time.perf_counter()
        if tr.collective:  # some rank moves rows: every rank takes part, in step order
            if self.exchange is None:
                raise SolarError("equal_batches: this Loader was copied into another process; "
                                 "iterate it where it was made")  # fmt: skip
            self.exchange.run(tr, arrays, index)
        seconds = time.perf_counter() - t0
        return Delivered([t[: tr.size] for t in tensors], index[: tr.size],
                         int(tr.send.sum()), int(tr.recv.sum()), seconds)  # fmt: skip

    def batch(self, k: int, rows: Delivered) -> Any:
        """Step ``k``'s batch: a tensor per key, ``index``, the sampler's extras (which may
        supersede ``index`` and a key), then the user's ``batch_transform``; a PyG ``Data`` of
        it with ``batch_format="pyg"``."""
        got = self._dict(k, rows)
        if self.batch_format == "pyg":
            from torch_geometric.data import Data

            return Data(**got)
        return got

    def _dict(self, k: int, rows: Delivered) -> dict:
        import torch

        out = {key.name: t for key, t in zip(self.keys, rows.tensors, strict=True)}
        out["index"] = torch.from_numpy(rows.ids)
        e = k // self.steps.spe
        extras = self.extras.extras(self.steps.output(k), out)  # e.g. the step's subgraph
        for name in self.extras.supersedes:  # e.g. n_id for index, x for the features' key
            out.pop(name, None)
        out.update(extras)
        if self.batch_transform is None:
            return out
        try:
            got = self.batch_transform(out)
        except Exception as exc:
            with abort_job_on_error(self.comm):  # a user's transform failed: the job ends
                raise SolarError(f"batch_transform of step {k} (epoch {e}) failed: "
                                 f"{type(exc).__name__}: {exc}") from exc  # fmt: skip
        if not isinstance(got, Mapping):
            raise SolarError(f"batch_transform of step {k} (epoch {e}) returned "
                             f"{type(got).__name__}, not a dict")  # fmt: skip
        return dict(got)
