"""The access order: one permutation per epoch and the global steps that cut it.

Everything here is a pure function of (seed, epoch, shape), so any epoch or step can be
produced alone, on any rank, without producing the ones before it.
"""

from __future__ import annotations

import numpy as np

from solar.config import RunConfig


def epoch_permutation(seed: int, epoch: int, num_samples: int) -> np.ndarray:
    """The order in which epoch ``epoch`` visits samples ``0..num_samples-1``.

    Each epoch draws from its own child of ``SeedSequence(seed)`` (spawn key ``(epoch,)``), so
    epochs are independent streams and epoch 7 does not require drawing epochs 0..6.
    """
    ss = np.random.SeedSequence(seed, spawn_key=(epoch,))
    # Generator.permutation(n) shuffles arange(n) as int64; shuffling it in the narrower type
    # swaps the same positions (the same permutation) with half the memory traffic.
    perm = np.arange(num_samples, dtype=sample_dtype(num_samples))
    np.random.Generator(np.random.PCG64(ss)).shuffle(perm)
    return perm


def sample_dtype(num_samples: int) -> np.dtype:
    """Narrowest signed integer type that holds every sample id."""
    return np.dtype(np.int32 if num_samples < 2**31 else np.int64)


def epoch_samples(run: RunConfig, epoch_perm: np.ndarray) -> np.ndarray:
    """The part of an epoch's permutation that is served (whole global batches with drop_last)."""
    return epoch_perm[: run.samples_per_epoch]


def access_sequence(run: RunConfig, epoch_order: np.ndarray | None = None) -> np.ndarray:
    """All epochs' served samples, concatenated in run order.

    ``epoch_order[k]`` names the permutation used by the run's k-th epoch (identity by default;
    see :mod:`solar.schedule.draw.reorder`).
    """
    if epoch_order is None:
        epoch_order = np.arange(run.epochs)
    per_epoch = run.samples_per_epoch
    seq = np.empty(per_epoch * run.epochs, dtype=sample_dtype(run.num_samples))
    for k, e in enumerate(epoch_order):
        seq[k * per_epoch : (k + 1) * per_epoch] = epoch_samples(
            run, epoch_permutation(run.seed, int(e), run.num_samples)
        )
    return seq


def step_bounds(run: RunConfig) -> np.ndarray:
    """Start position of every global step within an epoch, plus the end: shape (steps + 1,)."""
    starts = np.arange(run.steps_per_epoch + 1, dtype=np.int64) * run.global_batch
    starts[-1] = run.samples_per_epoch
    return starts


def nominal_batches(global_size: int, world_size: int) -> np.ndarray:
    """Split a global batch of ``global_size`` as evenly as possible over the ranks."""
    base, extra = divmod(global_size, world_size)
    return base + (np.arange(world_size) < extra).astype(np.int64)


def interleaved_ranks(run: RunConfig) -> np.ndarray:
    """Rank of each position of an epoch under DistributedSampler's interleaved split.

    Within a global step, position ``j`` goes to rank ``j % world_size``; a short last step is
    thus split as evenly as possible.
    """
    bounds = step_bounds(run)
    pos = np.arange(run.samples_per_epoch, dtype=np.int64)
    step = np.searchsorted(bounds, pos, side="right") - 1
    return ((pos - bounds[step]) % run.world_size).astype(np.int32)
