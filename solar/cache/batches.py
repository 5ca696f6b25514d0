"""Batch memory: where each step's batch lives until the trainer drops it."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from solar.errors import SolarError
from solar.io.info import KeyInfo

# Allocates batch memory: (shapes, dtypes) -> one array each (e.g. in shared memory).
Allocator = Callable[[list[tuple[int, ...]], list[np.dtype]], list[np.ndarray]]


def torch_dtype(key: KeyInfo) -> Any:
    """The torch dtype of a key's samples, or a SolarError naming the key."""
    import torch

    try:
        return torch.from_numpy(np.empty(0, key.native_dtype)).dtype
    except TypeError:
        raise SolarError(f"key {key.name!r}: dtype {key.dtype} has no torch type") from None


class BatchPool:
    """Batch memory, reused once no tensor or view of it is alive.

    Each step's batch is a numpy view of pooled memory wrapped by ``torch.from_numpy``, whose
    storage keeps that view alive as long as any tensor (or view of one) shares it; a dead
    weak reference to the view therefore means the memory is free. Reusing warm pages instead
    of faulting in fresh ones each step makes a pure-hit step about as cheap as a gather.
    """

    def __init__(
        self,
        keys: tuple[KeyInfo, ...],
        rows: int,
        pin_memory: bool,
        allocate: Allocator | None = None,
    ) -> None:
        self._dtypes = [torch_dtype(k) for k in keys]
        self._np_dtypes = [k.native_dtype for k in keys]
        self._shapes = [(rows, *k.sample_shape) for k in keys]
        self._pin = pin_memory
        self._allocate = allocate  # e.g. in shared memory (transform processes); None: torch's
        self._sets: list[tuple[list[np.ndarray], list[weakref.ref]]] = []

    @property
    def rows(self) -> int:
        """Rows of each set."""
        return self._shapes[0][0]

    def __len__(self) -> int:
        """Sets of batch memory allocated so far."""
        return len(self._sets)

    def take(self, n: int) -> tuple[list[Any], list[np.ndarray]]:
        """Memory for a batch of ``n`` rows: (torch tensors, the numpy views they share)."""
        import torch

        if n > self._shapes[0][0]:  # a longer batch than any so far: larger sets from now on
            self._shapes = [(n, *shape[1:]) for shape in self._shapes]
            self._sets = []  # sets still in use are freed with their last tensor
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
            if self._allocate is not None:
                arrays = self._allocate(self._shapes, self._np_dtypes)
            else:
                arrays = [
                    torch.empty(shape, dtype=dt).numpy()
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
