"""The transform workers of one process: threads, or processes (solar.runtime.procs), as one
parameter of a :class:`~solar.transform.Transform`."""

from __future__ import annotations

import itertools
from concurrent.futures import Executor, Future, ThreadPoolExecutor

import numpy as np

from solar.cache.batches import Allocator
from solar.errors import SolarError
from solar.io.info import KeyInfo
from solar.runtime.procs import ProcessTransforms
from solar.transform import Rows, Transform, transform_rows


class TransformPool:
    """The workers of one process: ``submit`` splits a step's rows into a few tasks."""

    def __init__(self, spec: Transform, seed: int, keys: tuple[KeyInfo, ...],
                 out_keys: tuple[KeyInfo, ...], cores: int) -> None:  # fmt: skip
        self.spec = spec
        self.workers = spec.worker_count(cores)
        self.seed, self.keys, self.out_keys = seed, keys, out_keys
        self._pool: Executor | None = None
        self._staging: dict[tuple[tuple[KeyInfo, ...], int], list[np.ndarray]] = {}
        self._procs = None
        if spec.processes:
            self._procs = ProcessTransforms(self.workers, spec.fn, seed, keys, out_keys)

    def allocate(self) -> Allocator | None:
        """How batches the workers touch are allocated: in shared memory for processes."""
        return None if self._procs is None else self._procs.arena.allocate

    def resize(self, workers: int) -> None:
        """Transform on ``workers`` threads from the next task on (tasks under way finish
        where they are). Worker processes keep their number."""
        if self._procs is not None or workers == self.workers:
            return
        if workers < 1:
            raise SolarError(f"transform workers must be >= 1, got {workers}")
        old, self._pool, self.workers = self._pool, None, workers
        if old is not None:
            old.shutdown(wait=False)

    def staging(self, keys: tuple[KeyInfo, ...], n: int) -> list[np.ndarray]:
        """``n`` rows of each key, where the workers can reach them: made once per (keys,
        n) and reused (each refill would otherwise leave shared memory behind)."""
        got = self._staging.get((keys, n))
        if got is None:
            shapes = [(n, *k.sample_shape) for k in keys]
            dtypes = [k.native_dtype for k in keys]
            if self._procs is not None:
                got = self._procs.arena.allocate(shapes, dtypes)
            else:
                got = [np.empty(shape, dt) for shape, dt in zip(shapes, dtypes, strict=True)]
            self._staging[(keys, n)] = got
        return got

    def _threads(self) -> Executor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="solar-transform")
        return self._pool

    def submit(self, src: list[np.ndarray], dst: list[np.ndarray], job: Rows) -> list[Future]:
        """Start transforming ``job``'s rows; the futures' results are busy seconds."""
        n = job.rows.size
        if n == 0:
            return []
        parts = min(n, 2 * self.workers)  # two tasks per worker: the slowest one ends sooner
        cuts = np.linspace(0, n, parts + 1).astype(np.int64)
        jobs = [
            Rows(job.epoch, job.step, job.samples[a:b], job.repeat[a:b], job.rows[a:b])
            for a, b in itertools.pairwise(cuts)
        ]
        if self._procs is not None:
            return self._procs.submit(src, dst, jobs)
        pool, fn = self._threads(), self.spec.fn
        args = (self.seed, self.keys, src, self.out_keys, dst)
        return [pool.submit(transform_rows, fn, *args, part) for part in jobs]

    def due(self, k: int, futures: list[Future]) -> list[Future]:
        """Step ``k`` is served now: what to wait for (its own futures: every step is this
        pool's; solar.runtime.remote's may transform here what a worker did not deliver)."""
        return futures

    def forget(self) -> None:
        """The steps assembled ahead are dropped (nothing to forget: every step is here)."""

    def close(self) -> None:
        """Stop the workers (after the tasks under way)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self._procs is not None:
            self._procs.close()
