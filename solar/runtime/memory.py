"""Batch memory and the per-step record that carries it through the stages."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from solar.cache.batches import Allocator, BatchPool
from solar.io.info import KeyInfo
from solar.schedule.plans.rankplan import StepPlan


class ReadFigures(NamedTuple):  # NamedTuples: one is made per step, cheaper than a dataclass
    """What a step's reads cost (written by the read stage; StepStats' names)."""

    bytes_read: int = 0
    read_seconds: float = 0.0  # busy time of the reader threads (tier reads included)
    stall_seconds: float = 0.0  # the consumer waiting for them
    tier_bytes: int = 0
    decode_seconds: float = 0.0
    read_latency: float = 0.0  # the longest read job
    read_ahead: int = 0  # the read-ahead depth when the step was taken
    ready_ahead: int = 0  # steps queued after it whose reads had all ended


class TransformFigures(NamedTuple):
    """What a step's transforms cost (written by the transform stage)."""

    transform_seconds: float = 0.0  # the workers' busy time on its rows
    transformed: int = 0  # rows transformed
    transform_workers: int = 0
    waited: float = 0.0  # the consumer waiting for them (part of the step's stall)


_NO_READS, _NO_TRANSFORMS = ReadFigures(), TransformFigures()


@dataclass
class InFlight:
    """One step on its way through the stages. Each field has one writer: ``plan``,
    ``futures``, ``storage``, ``provisional`` and ``read`` the read stage (solar.runtime.reads);
    ``tensors``, ``batch`` and ``out`` the batch memory (:class:`BatchMemory`); ``transforms``
    and ``shaped`` the transform stage (solar.runtime.transforms)."""

    plan: StepPlan
    futures: list[Future] = field(default_factory=list)  # storage reads first, then the tier's
    storage: int = 0  # futures[:storage] read from storage
    provisional: bool = False  # read before its plan was made: ``plan`` names only its reads
    read: ReadFigures = _NO_READS
    tensors: list[Any] = field(default_factory=list)  # torch tensors sharing ``batch``
    batch: list[np.ndarray] = field(default_factory=list)  # raw rows (rows, *shape) per key
    out: tuple[list[Any], list[np.ndarray]] | None = None  # transformed rows, if transformed
    transforms: list[Future] = field(default_factory=list)
    shaped: TransformFigures = _NO_TRANSFORMS

    @property
    def delivered(self) -> tuple[list[Any], list[np.ndarray]]:
        """The rows delivered: transformed, if there is a transform, else as read."""
        return self.out if self.out is not None else (self.tensors, self.batch)


class BatchMemory:
    """This process's batch memory: raw rows (a batch, then its side rows) and, with a
    transform, transformed rows (the batch only). Pools are made on first use and reused once
    no tensor of a batch is alive (solar.cache.batches)."""

    def __init__(
        self,
        keys: tuple[KeyInfo, ...],
        raw_rows: int,
        out_keys: tuple[KeyInfo, ...] | None,
        out_rows: int,
        pin_memory: bool,
        allocate: Allocator | None,
    ) -> None:
        self._make = (keys, raw_rows, out_keys, out_rows, pin_memory, allocate)
        self.raw: BatchPool | None = None
        self.out: BatchPool | None = None

    def provide(self, io: InFlight, rows: int, out_rows: int) -> None:
        """Give ``io`` memory for ``rows`` raw rows (and ``out_rows`` transformed ones, with
        a transform)."""
        keys, raw_rows, out_keys, out_pool_rows, pin, allocate = self._make
        if self.raw is None:
            self.raw = BatchPool(keys, raw_rows, pin, allocate)
        io.tensors, io.batch = self.raw.take(rows)
        if out_keys is not None:
            if self.out is None:
                self.out = BatchPool(out_keys, out_pool_rows, pin, allocate)
            io.out = self.out.take(out_rows)
