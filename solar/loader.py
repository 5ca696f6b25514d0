"""The Loader: executes one rank's part of a Plan and yields torch batches.

Per step, the plan says which samples the rank serves (in batch order), which are hits (copied
from buffer slots) and which are reads (read from storage straight into the batch, several steps
ahead on a thread pool); reads marked ADMIT are then stored into their slots. Hits and
admissions are applied on the consuming thread in strict step order, so the buffer always
matches the plan, and a slot is overwritten only after every batch that reads it is assembled.
"""

from __future__ import annotations

import collections
import json
import os
import time
import warnings
import weakref
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from solar.cache.slots import SlotBuffer, check_budget
from solar.config import DEFAULT_SLACK, BufferConfig, RunConfig, parse_size
from solar.dist import abort_job_on_error, agree
from solar.errors import SolarError
from solar.io.hdf5 import KeyInfo, describe
from solar.io.reader import Reader, wait_all
from solar.schedule import ADMIT, HIT, Plan, PlanSpec, load_plan, make_plan
from solar.schedule.order import step_bounds


@dataclass
class EpochStats:
    """What one epoch cost this rank."""

    steps: int = 0
    samples: int = 0
    hits: int = 0
    reads: int = 0
    bytes_read: int = 0
    read_seconds: float = 0.0  # busy time of the reader threads
    stall_seconds: float = 0.0  # time the trainer waited for late reads
    rebuild_seconds: float = 0.0  # refilling the buffer after a resume or a jump


@dataclass
class LoaderStats:
    """Per-epoch totals and per-step figures (``steps``, also as JSON lines)."""

    epochs: dict[int, EpochStats] = field(default_factory=dict)
    steps: list[dict] = field(default_factory=list)

    def epoch(self, e: int) -> EpochStats:
        return self.epochs.setdefault(e, EpochStats())

    def json_lines(self) -> str:
        return "".join(json.dumps(s) + "\n" for s in self.steps)


@dataclass
class _StepIO:
    step: int
    samples: np.ndarray
    tensors: list[Any]
    batch: list[np.ndarray]
    hit_rows: np.ndarray
    hit_slots: np.ndarray
    admit_rows: np.ndarray
    admit_slots: np.ndarray
    futures: list[Future]


def torch_dtype(key: KeyInfo) -> Any:
    """The torch dtype of a key's samples, or a SolarError naming the key."""
    import torch

    try:
        return torch.from_numpy(np.empty(0, key.native_dtype)).dtype
    except TypeError:
        raise SolarError(f"key {key.name!r}: dtype {key.dtype} has no torch type") from None


class _BatchPool:
    """Batch memory, reused once no tensor or view of it is alive.

    Each step's batch is a numpy view of pooled memory wrapped by ``torch.from_numpy``, whose
    storage keeps that view alive as long as any tensor (or view of one) shares it; a dead
    weak reference to the view therefore means the memory is free. Reusing warm pages instead
    of faulting in fresh ones each step makes a pure-hit step about as cheap as a gather.
    """

    def __init__(self, keys, rows: int, pin_memory: bool) -> None:

        self._dtypes = [torch_dtype(k) for k in keys]
        self._shapes = [(rows, *k.sample_shape) for k in keys]
        self._pin = pin_memory
        self._sets: list[tuple[list[np.ndarray], list[weakref.ref]]] = []

    def take(self, n: int) -> tuple[list[Any], list[np.ndarray]]:
        import torch

        if self._pin:
            # A non_blocking copy to the device may still read pinned memory after the last
            # tensor is dropped; torch's pinned allocator tracks that, this pool could not.
            tensors = [
                torch.empty((n, *shape[1:]), dtype=dt, pin_memory=True)
                for shape, dt in zip(self._shapes, self._dtypes, strict=True)
            ]
            return tensors, [t.numpy() for t in tensors]
        free = next((i for i, (_, refs) in enumerate(self._sets) if _dead(refs)), None)
        if free is None:
            arrays = [
                torch.empty(shape, dtype=dt, pin_memory=self._pin).numpy()
                for shape, dt in zip(self._shapes, self._dtypes, strict=True)
            ]
            self._sets.append((arrays, []))
            free = len(self._sets) - 1
        arrays = self._sets[free][0]
        batch = [a[:n] for a in arrays]
        self._sets[free] = (arrays, [weakref.ref(b) for b in batch])
        return [torch.from_numpy(b) for b in batch], batch


def _dead(refs: list[weakref.ref]) -> bool:
    return all(r() is None for r in refs)


class Loader:
    """Iterate one rank's batches of a planned multi-epoch run over HDF5 data.

    Call :meth:`set_epoch` before each epoch, as with ``DistributedSampler``; iterating yields
    that epoch's steps as dicts of torch tensors, one per key, plus ``"index"`` (int64 sample
    ids in batch order). Local batches may differ in size when ``slack > 0``.
    """

    def __init__(
        self,
        paths: str | os.PathLike | list[str | os.PathLike],
        keys: list[str] | None = None,
        *,
        batch_size: int,
        epochs: int,
        buffer: int | str,
        seed: int = 0,
        slack: float = DEFAULT_SLACK,
        plan: Plan | str | os.PathLike | None = None,
        comm: Any = None,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        policy: str = "solar",
        read_ahead: int = 4,
        threads: int = 8,
        pin_memory: bool = False,
        direct_io: bool = False,
        throttle: Any = None,
    ) -> None:
        # Other ranks may be waiting in the plan agreement: a failure here takes the job down.
        with abort_job_on_error(comm):
            import torch

            paths = [paths] if isinstance(paths, str | os.PathLike) else list(paths)
            self.info = describe(paths, keys)
            self.rank, self.world_size = _rank_and_world(comm, rank, world_size)
            for k in self.info.keys:
                torch_dtype(k)
            if read_ahead < 0:
                raise SolarError(f"read_ahead must be >= 0, got {read_ahead}")
            capacity = parse_size(buffer, sample_bytes=self.info.sample_bytes)
            check_budget(min(capacity, self.info.num_samples), self.info.sample_bytes)
            run = RunConfig(
                self.info.num_samples, self.world_size, batch_size, epochs, seed, drop_last
            )
            self.plan = self._agree_on_plan(plan, run, BufferConfig(capacity, slack), policy, comm)
            self.run = run
            self.read_ahead = read_ahead
            if pin_memory and not torch.cuda.is_available():
                warnings.warn("pin_memory=True but no accelerator: not pinning", stacklevel=2)
                pin_memory = False
            self.pin_memory = pin_memory
            self.reader = Reader(self.info, threads=threads, direct_io=direct_io, throttle=throttle)
            self.stats = LoaderStats()
            self.global_batch = 0  # samples over all ranks in the step last yielded
            self._global_sizes = np.diff(step_bounds(run))
            self._epoch = 0
            self._next = 0  # global step the next iteration starts from
            self._reset_runtime()
            # Allocate (and touch) the buffer and warm the reader now, not inside the first epoch:
            # an impossible budget fails here, and epoch 0 measures loading, not set-up.
            self.buffer  # noqa: B018
            self.reader.warm_up()

    # -- plan agreement ----------------------------------------------------------------------
    def _agree_on_plan(self, plan, run, buffer, policy, comm) -> Plan:
        if plan is None:
            spec = PlanSpec(run, buffer, policy, False, self.info.sample_bytes, self.info.identity)
            made = make_plan(spec)
        else:
            made = plan if isinstance(plan, Plan) else load_plan(plan)
            # Policy and epoch order are the plan's choice; everything else must match.
            spec = PlanSpec(
                run, buffer, made.spec.policy, made.spec.reorder_epochs,
                self.info.sample_bytes, self.info.identity,
            )  # fmt: skip
            made.check(spec, source="plan" if isinstance(plan, Plan) else f"plan {plan}")
        agree(comm, made.fingerprint, "the plan")
        return made

    # -- runtime state (rebuilt in a forked or spawned process) ------------------------------
    def _reset_runtime(self) -> None:
        self._pid = os.getpid()
        self._rank_plan = None
        self._buffer: SlotBuffer | None = None
        self._buffer_at = -1  # the buffer matches the plan at the start of this step
        self._queue: collections.deque[_StepIO] = collections.deque()
        self._pool: _BatchPool | None = None

    def _ensure_process(self) -> None:
        if self._pid != os.getpid():
            # Forked: the parent's reader threads did not come along; its buffer contents did.
            self._pid = os.getpid()
            self._queue = collections.deque()

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.update(_rank_plan=None, _buffer=None, _buffer_at=-1, _queue=None, _pool=None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._queue = collections.deque()

    @property
    def rank_plan(self):
        if self._rank_plan is None:
            self._rank_plan = self.plan.rank(self.rank)
        return self._rank_plan

    @property
    def buffer(self) -> SlotBuffer:
        if self._buffer is None:
            self._buffer = SlotBuffer(self.plan.slots, self.info.keys)
            self._buffer_at = 0  # an empty buffer is the plan's state before step 0
        return self._buffer

    # -- the public iteration protocol -------------------------------------------------------
    def __len__(self) -> int:
        return self.run.steps_per_epoch

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch the next iteration serves (a resumed epoch keeps its position)."""
        if not 0 <= epoch < self.run.epochs:
            raise SolarError(f"epoch {epoch} is outside this run's {self.run.epochs} epochs")
        if epoch != self._epoch:
            self._epoch = epoch
            self._next = epoch * self.run.steps_per_epoch

    def __iter__(self):
        self._ensure_process()
        spe = self.run.steps_per_epoch
        first, end = self._epoch * spe, (self._epoch + 1) * spe
        start = self._next if first <= self._next < end else first
        self._seek(start)
        for k in range(start, end):
            batch = self._consume(k)
            self._next = k + 1
            self.global_batch = int(self._global_sizes[k - first])
            yield batch
            del batch  # let the pool reuse its memory as soon as the trainer drops it

    def state_dict(self) -> dict:
        """Where the run stands: resume with :meth:`load_state_dict` on the same plan."""
        spe = self.run.steps_per_epoch
        # After an epoch's last step the next thing to run is the next epoch.
        epoch = self._epoch + 1 if self._next == (self._epoch + 1) * spe else self._epoch
        return {
            "fingerprint": self.plan.fingerprint,
            "rank": self.rank,
            "world_size": self.world_size,
            "epoch": epoch,
            "next_step": self._next,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue exactly where ``state`` was taken: same samples, same order, same buffer."""
        if state.get("fingerprint") != self.plan.fingerprint:
            raise SolarError("loader state was saved for another plan (fingerprints differ)")
        if state.get("world_size") != self.world_size or state.get("rank") != self.rank:
            raise SolarError(
                f"loader state is rank {state.get('rank')} of {state.get('world_size')}, "
                f"this is rank {self.rank} of {self.world_size}"
            )
        try:
            epoch, step = int(state["epoch"]), int(state["next_step"])
        except (KeyError, TypeError, ValueError):
            raise SolarError("loader state lacks a whole 'epoch' and 'next_step'") from None
        spe = self.run.steps_per_epoch
        if not (0 <= step <= self.run.num_steps and epoch * spe <= step <= (epoch + 1) * spe):
            raise SolarError(f"loader state: step {step} is not within epoch {epoch} of this run")
        self._epoch = min(epoch, self.run.epochs - 1)
        self._next = step

    def close(self) -> None:
        self._drain()
        self.reader.close()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- execution ----------------------------------------------------------------------------
    def _seek(self, step: int) -> None:
        """Make the buffer match the plan at ``step``; keep prefetched steps if they follow."""
        buf = self.buffer
        if self._buffer_at == step:
            return
        self._drain()
        t0 = time.perf_counter()
        rp = self.rank_plan
        a = rp.step_offsets[step]
        slots, flags, samples = rp.slot[a:], rp.flags[a:], rp.sample[a:]
        steps = rp.steps()[a:]
        used = np.flatnonzero(slots >= 0)
        # The first use of each slot from here on; within a step hits come before admissions.
        order = np.lexsort(((flags[used] & ADMIT) != 0, steps[used], slots[used]))
        used = used[order]
        _, first = np.unique(slots[used], return_index=True)
        need = used[first][(flags[used[first]] & HIT) != 0]
        self._buffer_at = -1  # until the refill succeeds, the buffer matches no step
        nbytes = self.reader.read(samples[need].astype(np.int64), buf.arrays, slots[need])
        stats = self.stats.epoch(step // self.run.steps_per_epoch)
        stats.rebuild_seconds += time.perf_counter() - t0
        stats.bytes_read += nbytes
        self._buffer_at = step

    def _drain(self) -> None:
        for io in self._queue:
            for f in io.futures:
                f.exception()  # wait; its result is discarded
        self._queue.clear()

    def _submit(self, k: int) -> _StepIO:
        rp = self.rank_plan
        if self._pool is None:
            rows = int(rp.batch_sizes().max())
            self._pool = _BatchPool(self.info.keys, rows, self.pin_memory)
        a, b = rp.step_offsets[k], rp.step_offsets[k + 1]
        samples = rp.sample[a:b].astype(np.int64)
        flags, slots = rp.flags[a:b], rp.slot[a:b]
        hit = (flags & HIT) != 0
        reads = np.flatnonzero(~hit)
        admit = np.flatnonzero((flags & ADMIT) != 0)
        # Only reads need their batch ahead of time; a step of hits takes memory when it is
        # assembled, so that recently freed (cache-warm) batch memory is reused.
        tensors, batch, futures = [], [], []
        if reads.size:
            tensors, batch = self._pool.take(int(b - a))
            futures = self.reader.submit(samples[reads], batch, reads)
        return _StepIO(
            k, samples, tensors, batch,
            np.flatnonzero(hit), slots[hit].astype(np.int64),
            admit, slots[admit].astype(np.int64), futures,
        )  # fmt: skip

    def _consume(self, k: int) -> dict:
        import torch

        self._ensure_process()  # a forked child may continue its parent's iterator
        if self._buffer_at != k:
            self._seek(k)  # another iterator (or a failed step) moved the buffer elsewhere
        last = self.run.num_steps - 1
        if not self._queue or self._queue[0].step != k:
            self._drain()
            self._queue.append(self._submit(k))
        while self._queue[-1].step < min(k + self.read_ahead, last):
            self._queue.append(self._submit(self._queue[-1].step + 1))
        io = self._queue.popleft()
        t0 = time.perf_counter()
        nbytes, busy = wait_all(io.futures)
        stall = time.perf_counter() - t0
        if not io.batch:
            io.tensors, io.batch = self._pool.take(int(io.samples.size))
        self.buffer.gather(io.hit_slots, io.batch, io.hit_rows)
        self.buffer.store(io.batch, io.admit_rows, io.admit_slots)
        self._buffer_at = k + 1
        epoch = k // self.run.steps_per_epoch
        stats = self.stats.epoch(epoch)
        hits = int(io.hit_rows.size)
        reads = int(io.samples.size) - hits
        stats.steps += 1
        stats.samples += int(io.samples.size)
        stats.hits += hits
        stats.reads += reads
        stats.bytes_read += nbytes
        stats.read_seconds += busy
        stats.stall_seconds += stall
        self.stats.steps.append(
            {"epoch": epoch, "step": k, "batch": int(io.samples.size), "hits": hits,
             "reads": reads, "bytes_read": nbytes, "read_seconds": busy, "stall_seconds": stall}
        )  # fmt: skip
        out = {key.name: t for key, t in zip(self.info.keys, io.tensors, strict=True)}
        out["index"] = torch.from_numpy(io.samples)
        return out


def _rank_and_world(comm: Any, rank: int | None, world_size: int | None) -> tuple[int, int]:
    if comm is not None:
        r, w = comm.Get_rank(), comm.Get_size()
        if (rank is not None and rank != r) or (world_size is not None and world_size != w):
            raise SolarError(f"rank/world_size {rank}/{world_size} disagree with comm's {r}/{w}")
        return r, w
    w = 1 if world_size is None else world_size
    r = 0 if rank is None else rank
    if not (isinstance(w, int) and w > 0 and isinstance(r, int) and 0 <= r < w):
        raise SolarError(f"rank {r} is not within world_size {w}")
    return r, w
