"""Samplers: which sample ids each rank's local batch holds at every (epoch, step).

A sampler is a pure function of (seed, epoch, step, rank), so any step can be recomputed alone
(exact resume, one rank's window, proving a plan file) and the whole run's order is known
ahead: the planner plans it. Three are built in:

* :class:`Shuffle` (the default): one permutation of the dataset per epoch, cut into global
  batches; which rank serves which sample of a global batch is the planner's choice (samples
  a rank holds stay with it, within the batch slack). Planned as solar always planned it.
* :class:`Weighted`: ``torch.utils.data.WeightedRandomSampler``'s semantics.
* :class:`Trace`: a user's own deterministic sampler, a function or a precomputed array.

A sampler with ``affinity`` (Shuffle, and Weighted by default) draws global batches and the
planner splits each over the ranks, keeping samples with the rank that holds them (within the
batch slack); rank r's batch is then the draws it was given, in draw order. Without (Trace, or
``Weighted(..., affinity=False)``) rank r's batch is what :meth:`Sampler.batch` says. Either
way repeats are allowed (read once, copied) and lengths may vary.

The contract has two sides. :class:`Sampler` is what planning needs: the draws (whole epochs,
a rank's epoch, one batch), what bounds them and what identifies them. :class:`BatchExtras` is
what delivery needs of a sampler whose batches carry more than rows (a neighbour sampler's
subgraph): the keys it needs, the entries it adds to a batch from the step's sampler output,
what a loss averages over. Each batch is drawn once per run: a rank's epoch is drawn by
``RankDraws`` (solar/schedule/draw/draws.py; for the planner, or for the runtime serving a plan
made elsewhere), and the sampler's output of each batch (``EpochDraws.outputs``) travels with
it to delivery.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from numba import njit

from solar._kept import Kept
from solar._memory import require_memory
from solar.config import RunConfig
from solar.errors import SolarError
from solar.schedule.draw import rng
from solar.schedule.draw.draws import EpochDraws, only_rank, steps_of
from solar.schedule.draw.order import nominal_batches, step_bounds

_WEIGHTED_STREAM = 1  # spawn-key tag of Weighted's draws (epoch permutations use no tag)


class Sampler:
    """What planning needs of a sampler (see the module's docstring): its draws, their
    bounds and its identity. Every hook but :meth:`epoch` and :meth:`identity` has a default."""

    kind: ClassVar[str]
    affinity: bool = False  # the planner splits global batches (see the module's docstring)
    # Its rows read with O_DIRECT where ReaderConfig(direct_io=None) leaves it to the Loader:
    # the plan's buffer is their only cache (a GNN's features); else the page cache.
    direct_by_default: bool = False
    # Epochs of look-ahead its trace's reuse needs (None: the planner's default, see traces.py).
    horizon: int | None = None
    # Each batch's ids are distinct by construction (a neighbour sampler's subgraph nodes): the
    # planner traces them as drawn, without the pass that keeps first occurrences.
    distinct: bool = False

    def draws(self, num_samples: int, global_batch: int) -> int:
        """Ids drawn per epoch over all ranks, for a dataset of ``num_samples`` and global
        batches of ``global_batch`` (steps per epoch follow from the two)."""
        return num_samples

    def check(self, num_samples: int) -> None:
        """Refuse a dataset of ``num_samples`` this sampler cannot draw from."""

    def bind(self, comm: Any) -> None:
        """The communicator of the Loader that draws from it (None: a process alone), given at
        the Loader's construction, on every rank of it (a collective): what it holds once per
        host, it reads now."""

    def check_run(self, run: RunConfig) -> None:
        """Refuse a run this sampler cannot draw (the Loader asks before planning)."""

    def epoch(self, run: RunConfig, epoch: int) -> EpochDraws:
        """Every rank's batches of ``epoch``."""
        raise NotImplementedError

    def batch(self, run: RunConfig, epoch: int, step: int, rank: int) -> np.ndarray:
        """Rank ``rank``'s batch at step ``step`` (within the epoch): int64 ids, batch order."""
        d = self.epoch(run, epoch)
        i = step * run.world_size + rank
        return d.ids[d.offsets[i] : d.offsets[i + 1]]

    def rank_epoch(self, run: RunConfig, epoch: int, rank: int) -> EpochDraws:
        """Rank ``rank``'s batches of ``epoch`` in :meth:`epoch`'s layout, every other rank's
        batch empty: all a rank planning only its own accesses needs (a sampler without
        affinity decides who serves what, so each rank's plan depends on its draws alone), and
        for a sampler with a delivery side (:func:`extras_of`) all the rank serves: with
        its output of each of the rank's batches (``EpochDraws.outputs``)."""
        return only_rank(self.epoch(run, epoch), run, rank)

    def window(self, run: RunConfig, epoch: int, t0: int, t1: int,
               rank: int | None = None) -> EpochDraws:  # fmt: skip
        """Steps ``t0 .. t1 - 1`` of ``epoch``: every rank's batches (``rank``: only its, the
        others empty) in :meth:`epoch`'s layout of ``t1 - t0`` steps, no outputs: what a plan
        in windows of steps draws (solar/schedule/draw/traces.py). By default cut from the
        epoch's draws; a sampler that draws a step alone draws only those."""
        whole = self.epoch(run, epoch) if rank is None else self.rank_epoch(run, epoch, rank)
        return steps_of(whole, run, t0, t1)

    def global_batch(self, run: RunConfig, epoch: int, step: int) -> np.ndarray:
        """Every draw of global step ``step`` (within the epoch), in draw order."""
        d = self.epoch(run, epoch)
        w = run.world_size
        return d.ids[d.offsets[step * w] : d.offsets[(step + 1) * w]]

    def max_batch(self, run: RunConfig) -> int | None:
        """The longest local batch, if known without drawing the run."""
        return run.batch_size

    def batch_bound(self, run: RunConfig) -> int:
        """At most this many distinct ids in any local batch, known without drawing the run:
        what memory checks count a batch as (its rows, and a trace's accesses per step)."""
        return self.max_batch(run) or run.batch_size

    def typical_batch(self, run: RunConfig) -> int | None:
        """About this many distinct ids in a local batch (an upper estimate from a few batches
        drawn, where :meth:`batch_bound` is far above what is drawn), or None: the bound."""
        return None

    def rehearse(self, run: RunConfig, rank: int) -> None:
        """Call every kernel of this sampler's own that the run's epochs call, once, before them
        (solar/warm.py: a rehearsal's tiny copy of the run samples another way): nothing here."""

    def identity(self) -> dict[str, Any] | None:
        """What a plan's fingerprint records of the sampler (None: the default, Shuffle)."""
        raise NotImplementedError


class BatchExtras:
    """What delivery needs of a sampler whose batches carry more than rows (a neighbour
    sampler: solar.graph.neighbor): a sampler that is one is asked by the Loader for the keys
    it needs, for each batch's entries from the step's sampler output, and for what a loss
    averages over. Any other sampler delivers rows alone (:data:`NO_EXTRAS`)."""

    # Entries of the Loader's batch that extras() replace (dropped before they are merged).
    supersedes: tuple[str, ...] = ()

    def extras(self, output: Any, batch: Mapping[str, Any]) -> dict[str, Any]:
        """More entries for a batch (``batch``: the Loader's tensors so far, one per key, and
        ``index``), merged into it by the Loader, from ``output``: what this sampler made of
        the batch when it drew it (``EpochDraws.outputs``; None if it made nothing). None by
        default."""
        return {}

    def check_keys(self, keys: Sequence[str]) -> None:
        """Refuse, in one line, batch keys ``keys`` (the Loader's output keys) that this
        sampler's extras cannot work with. Any by default."""

    def loss_count(self, run: RunConfig, step: int) -> int | None:
        """What a loss averages over at ``step`` of an epoch, over all ranks, if not the
        step's rows (None, the default): e.g. a GNN sampler's seeds."""
        return None


NO_EXTRAS = BatchExtras()


def extras_of(sampler: Any) -> BatchExtras:
    """The delivery side of ``sampler``: itself if it adds to its batches, else rows alone (a
    sampler defining delivery's names without being a BatchExtras is refused: never ignored)."""
    if isinstance(sampler, BatchExtras):
        return sampler
    stray = [n for n in ("extras", "check_keys", "loss_count", "supersedes") if hasattr(sampler, n)]
    if stray:
        raise SolarError(f"sampler {type(sampler).__name__} defines {', '.join(stray)}, which "
                         "delivery calls of a BatchExtras only: subclass BatchExtras: "
                         "extras(output, batch)")  # fmt: skip
    return NO_EXTRAS


class Shuffle(Sampler):
    """One permutation per epoch (``solar.schedule.draw.order``); the planner splits each global
    batch over the ranks. The default: plans are exactly those solar always made."""

    kind = "shuffle"
    affinity = True

    def epoch(self, run: RunConfig, epoch: int) -> EpochDraws:
        from solar.schedule.draw.order import epoch_permutation, epoch_samples

        ids = epoch_samples(run, epoch_permutation(run.seed, epoch, run.num_samples))
        return EpochDraws(ids.astype(np.int64), _split(run))

    def identity(self) -> None:
        return None


class Weighted(Sampler):
    """``WeightedRandomSampler(weights, num_samples, replacement)``: each epoch draws
    ``num_samples`` (default N) ids with probability proportional to ``weights``; global
    batches of P·B consecutive draws, split over the ranks in contiguous runs.

    The draws: with replacement, draw j of epoch e takes ``u``, position j of the
    counter-based stream (:mod:`solar.schedule.draw.rng`) keyed by (seed, 1, e), and Walker's alias
    method (table by Vose's algorithm, built once from the weights): ``i = floor(u * N)``, id
    ``i`` if ``u * N - i < prob[i]``, else ``alias[i]``; without, ids are ranked by
    ``log(u_x) / w_x`` (Efraimidis–Spirakis: sequential sampling without replacement) with
    ``u_x`` position x of that stream, and the first ``num_samples`` drawn in that order.
    Both are pure functions of (seed, epoch, position), stable across numpy versions.

    ``weights``: a 1-D array or a ``.npy`` file; finite, >= 0, not all 0, one per sample.
    ``affinity`` (default): the planner splits each global batch over the ranks (a rank's
    batch then varies within the slack, as with Shuffle); else rank r takes the r-th
    contiguous share of the draws (``WeightedRandomSampler`` under a rank split).
    """

    kind = "weighted"

    def __init__(
        self,
        weights: np.ndarray | str | os.PathLike,
        num_samples: int | None = None,
        replacement: bool = True,
        affinity: bool = True,
    ) -> None:
        where = "weights"
        if isinstance(weights, str | os.PathLike):
            where = f"weights {weights}"
            weights = _load_npy(weights, "weights", mmap=True)
        w = np.asarray(weights)
        if (
            w.ndim != 1
            or w.size == 0
            or not (np.issubdtype(w.dtype, np.floating) or np.issubdtype(w.dtype, np.integer))
        ):
            raise SolarError(f"{where}: expected a non-empty 1-D array of numbers, got "
                             f"{w.dtype} {w.shape}")  # fmt: skip
        # The weights, their scaled copy and the alias table (float64, int64) at once.
        require_memory(40 * w.size, f"{where}: {w.size} weights")
        w = w.astype(np.float64)
        if not np.all(np.isfinite(w)) or np.any(w < 0) or not np.any(w > 0):
            bad = "not finite" if not np.all(np.isfinite(w)) else "negative" if np.any(w < 0) \
                else "all zero"  # fmt: skip
            raise SolarError(f"{where}: weights must be finite, >= 0 and not all 0 ({bad})")
        if num_samples is not None and (
            not isinstance(num_samples, int | np.integer) or isinstance(num_samples, bool)
            or num_samples <= 0
        ):  # fmt: skip
            raise SolarError(f"num_samples must be a positive integer, got {num_samples!r}")
        if not replacement and num_samples is not None and num_samples > np.count_nonzero(w):
            raise SolarError(
                f"num_samples {num_samples} exceeds the {np.count_nonzero(w)} samples of "
                "non-zero weight (drawing without replacement)"
            )
        self.weights = w
        self.num_samples = None if num_samples is None else int(num_samples)
        self.replacement = bool(replacement)
        self.affinity = bool(affinity)
        w = w / w.max()  # a sum of huge weights would overflow to inf
        self._prob, self._alias = _alias_table(w / w.sum() * w.size)
        self._digest = hashlib.sha256(w.tobytes()).hexdigest()
        self._cache: Kept[EpochDraws] = Kept(3)  # planner, validator and runtime ask alike

    def draws(self, num_samples: int, global_batch: int) -> int:
        if self.num_samples is not None:
            return self.num_samples
        return num_samples if self.replacement else min(num_samples, self._nonzero)

    @property
    def _nonzero(self) -> int:
        return int(np.count_nonzero(self.weights))

    def check(self, num_samples: int) -> None:
        if self.weights.size != num_samples:
            raise SolarError(
                f"weights: {self.weights.size} weights for a dataset of {num_samples} samples"
            )

    def _draw(self, run: RunConfig, epoch: int, positions: np.ndarray) -> np.ndarray:
        key = rng.stream_key(run.seed, _WEIGHTED_STREAM, epoch)
        return _alias_draw(rng.uniform(key, positions), self._prob, self._alias)

    def _without(self, run: RunConfig, epoch: int) -> np.ndarray:
        key = rng.stream_key(run.seed, _WEIGHTED_STREAM, epoch)
        u = rng.uniform(key, np.arange(self.weights.size))
        with np.errstate(divide="ignore"):
            rank = np.log1p(-u) / self.weights  # -inf for weight 0: never drawn
        # argsort of -rank, stable: ties (probability 0) by id, reproducibly.
        return np.argsort(-rank, kind="stable")[: run.samples_per_epoch].astype(np.int64)

    def epoch(self, run: RunConfig, epoch: int) -> EpochDraws:
        def make() -> EpochDraws:
            n = run.samples_per_epoch
            ids = self._draw(run, epoch, np.arange(n)) if self.replacement else \
                self._without(run, epoch)  # fmt: skip
            return EpochDraws(ids, _split(run))

        return self._cache.get((run, epoch), make)

    def batch(self, run: RunConfig, epoch: int, step: int, rank: int) -> np.ndarray:
        if not self.replacement:
            return super().batch(run, epoch, step, rank)
        lo, hi = _span(run, step, rank)
        return self._draw(run, epoch, np.arange(lo, hi))

    def global_batch(self, run: RunConfig, epoch: int, step: int) -> np.ndarray:
        if not self.replacement:
            return super().global_batch(run, epoch, step)
        bounds = step_bounds(run)
        return self._draw(run, epoch, np.arange(bounds[step], bounds[step + 1]))

    def max_batch(self, run: RunConfig) -> int | None:
        return None if self.affinity else run.batch_size  # (the pool grows as needed)

    def identity(self) -> dict[str, Any]:
        return {"kind": self.kind, "weights": self._digest, "num_samples": self.num_samples,
                "replacement": self.replacement, "affinity": self.affinity}  # fmt: skip


class Trace(Sampler):
    """A user's deterministic sampler: ``Trace(fn)`` with ``fn(epoch, step, rank)`` returning
    the rank's batch (an int array, repeats allowed, lengths free), ``steps`` per epoch
    (default: those of a Shuffle run); or ``Trace(array)`` / ``Trace("ids.npy")``, an int
    array of shape (epochs, steps, ranks, B) whose rows may end in -1 padding.

    ``fn`` must return the same ids whenever called with the same arguments (the planner, the
    runtime and a plan's validation each call it); a batch that differs from the plan's is
    refused when served. ``name`` identifies ``fn`` in plan fingerprints (default: its
    qualified name).
    """

    kind = "trace"

    def __init__(
        self,
        source: Callable[[int, int, int], Any] | np.ndarray | str | os.PathLike,
        steps: int | None = None,
        name: str | None = None,
    ) -> None:
        self.fn: Callable[[int, int, int], Any] | None = None
        self.array: np.ndarray | None = None
        if callable(source):
            self.fn = source
            self.name = name or f"{getattr(source, '__module__', '')}." \
                f"{getattr(source, '__qualname__', repr(source))}"  # fmt: skip
            if steps is not None and (not isinstance(steps, int) or steps <= 0):
                raise SolarError(f"steps must be a positive integer, got {steps!r}")
            self.steps = steps
            self._digest = None
        else:
            where = "trace"
            if isinstance(source, str | os.PathLike):
                where = f"trace {source}"
                source = _load_npy(source, "trace", mmap=True)
            a = np.asarray(source)
            if a.ndim != 4 or not np.issubdtype(a.dtype, np.integer) or 0 in a.shape:
                raise SolarError(f"{where}: expected an int array (epochs, steps, ranks, B), "
                                 f"got {a.dtype} {a.shape}")  # fmt: skip
            self.array = a
            self.steps = int(a.shape[1])
            self.name = name or where
            self._digest = hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()
        self._cache: Kept[EpochDraws] = Kept(3)  # planner, validator and runtime ask alike

    def draws(self, num_samples: int, global_batch: int) -> int:
        # Nominal: the steps are the trace's, its batches' lengths its own.
        return num_samples if self.steps is None else self.steps * global_batch

    def check_run(self, run: RunConfig) -> None:
        """Refuse a run whose shape the array does not have."""
        if self.array is not None:
            e, s, p, _ = self.array.shape
            if (e, s, p) != (run.epochs, run.steps_per_epoch, run.world_size):
                raise SolarError(
                    f"{self.name}: shape {self.array.shape} is not (epochs {run.epochs}, steps "
                    f"{run.steps_per_epoch}, ranks {run.world_size}, B) of this run"
                )

    def batch(self, run: RunConfig, epoch: int, step: int, rank: int) -> np.ndarray:
        if self.array is not None:
            row = np.asarray(self.array[epoch, step, rank])
            pad = np.flatnonzero(row < 0)
            if pad.size and np.any(row[pad[0] :] != -1):
                raise SolarError(f"{self.name}: epoch {epoch}, step {step}, rank {rank}: "
                                 "-1 pads only the end of a batch")  # fmt: skip
            row = row[: pad[0]] if pad.size else row
        else:
            assert self.fn is not None
            row = self.fn(epoch, step, rank)
        return _checked(np.asarray(row), run.num_samples,
                        f"{self.name}: epoch {epoch}, step {step}, rank {rank}")  # fmt: skip

    def epoch(self, run: RunConfig, epoch: int) -> EpochDraws:
        def make() -> EpochDraws:
            self.check_run(run)
            rows = [self.batch(run, epoch, t, r) for t in range(run.steps_per_epoch)
                    for r in range(run.world_size)]  # fmt: skip
            offsets = np.zeros(len(rows) + 1, np.int64)
            np.cumsum([r.size for r in rows], out=offsets[1:])
            return EpochDraws(np.concatenate(rows).astype(np.int64), offsets)

        return self._cache.get((run, epoch), make)

    def max_batch(self, run: RunConfig) -> int | None:
        return int(self.array.shape[3]) if self.array is not None else None

    def identity(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "name": self.name}
        if self._digest is not None:
            out["digest"] = self._digest
        if self.steps is not None:
            out["steps"] = self.steps
        return out


class RecordedSampler(Sampler):
    """The identity a plan file records of its sampler: enough to match a spec, not to draw."""

    kind = "recorded"

    def __init__(self, record: dict[str, Any]) -> None:
        self.record = record
        self.affinity = bool(record.get("affinity", False))

    def epoch(self, run: RunConfig, epoch: int) -> EpochDraws:
        raise SolarError(
            f"this plan was made with a {self.record.get('kind')!r} sampler: pass it "
            "(load_plan(path, sampler=...), or Loader(..., sampler=...)) to use the plan"
        )

    def identity(self) -> dict[str, Any]:
        return self.record


SHUFFLE = Shuffle()


def make_sampler(
    kind: str,
    weights: str | os.PathLike | None = None,
    num_samples: int | None = None,
    replacement: bool = True,
) -> Sampler:
    """The sampler a command line names: ``shuffle``, or ``weighted`` with its weights file."""
    if kind == "shuffle":
        if weights is not None or num_samples is not None or not replacement:
            raise SolarError("--weights, --draws and --no-replacement need --sampler weighted")
        return SHUFFLE
    if kind == "weighted":
        if weights is None:
            raise SolarError("--sampler weighted needs --weights FILE.npy")
        return Weighted(weights, num_samples, replacement)
    raise SolarError(f"sampler: unknown {kind!r} (choose from shuffle, weighted)")


def sampler_from_record(record: dict[str, Any] | None) -> Sampler:
    """The sampler a spec's record names: Shuffle, or a :class:`RecordedSampler`."""
    return SHUFFLE if record is None else RecordedSampler(record)


def sampler_run(sampler: Sampler, num_samples: int, world_size: int, batch_size: int,
                epochs: int, seed: int = 0, drop_last: bool = False, *,
                check: bool = True) -> RunConfig:  # fmt: skip
    """The run a Loader makes of ``sampler`` over ``num_samples`` samples: its draws per epoch
    (None where they are the samples), the dataset and the run refused first if the sampler
    cannot draw them (``check``; the one path the Loader, the CLI and the benches take)."""
    if check:
        sampler.check(num_samples)
    draws = sampler.draws(num_samples, world_size * batch_size)
    run = RunConfig(num_samples, world_size, batch_size, epochs, seed, drop_last,
                    None if draws == num_samples else draws)  # fmt: skip
    if check:
        sampler.check_run(run)
    return run


def is_shuffle(sampler: Sampler) -> bool:
    """Whether ``sampler`` is the default, planned with rank affinity."""
    return sampler.identity() is None


def _split(run: RunConfig) -> np.ndarray:
    """Offsets of every (step, rank) batch when each global batch is split into contiguous
    nominal shares: (steps * P + 1,) int64."""
    g = np.diff(step_bounds(run))[:, None]  # (steps, 1) global batch sizes
    base, extra = g // run.world_size, g % run.world_size
    sizes = base + (np.arange(run.world_size)[None, :] < extra)  # (steps, P): nominal_batches
    offsets = np.zeros(sizes.size + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    return offsets


def _span(run: RunConfig, step: int, rank: int) -> tuple[int, int]:
    """Positions of rank ``rank``'s share of global step ``step`` (within the epoch)."""
    bounds = step_bounds(run)
    sizes = nominal_batches(int(bounds[step + 1] - bounds[step]), run.world_size)
    lo = int(bounds[step]) + int(sizes[:rank].sum())
    return lo, lo + int(sizes[rank])


@njit(cache=True)
def _alias_table(scaled):
    """Vose's alias table of weights ``scaled`` to average 1: (prob, alias), each (N,)."""
    n = scaled.shape[0]
    prob = np.ones(n, np.float64)
    alias = np.arange(n)
    small = np.empty(n, np.int64)
    large = np.empty(n, np.int64)
    ns = nl = 0
    p = scaled.copy()
    for i in range(n):
        if p[i] < 1.0:
            small[ns] = i
            ns += 1
        else:
            large[nl] = i
            nl += 1
    while ns > 0 and nl > 0:
        ns -= 1
        s = small[ns]
        g = large[nl - 1]
        prob[s] = p[s]
        alias[s] = g
        p[g] = (p[g] + p[s]) - 1.0
        if p[g] < 1.0:
            nl -= 1
            small[ns] = g
            ns += 1
    # What is left has probability 1 up to rounding: prob stays 1, alias itself.
    return prob, alias


@njit(cache=True, nogil=True)
def _alias_draw(u, prob, alias):
    """One id per uniform ``u``: ``i = floor(u * N)``, kept if the fraction is under
    ``prob[i]``, else ``alias[i]``."""
    n = prob.shape[0]
    out = np.empty(u.shape[0], np.int64)
    for j in range(u.shape[0]):
        x = u[j] * n
        i = min(int(x), n - 1)
        out[j] = i if x - i < prob[i] else alias[i]
    return out


def _checked(ids: np.ndarray, n: int, where: str) -> np.ndarray:
    if ids.ndim != 1 or not (np.issubdtype(ids.dtype, np.integer) or ids.size == 0):
        raise SolarError(f"{where}: a batch must be a 1-D int array, got {ids.dtype} {ids.shape}")
    if ids.size == 0:
        raise SolarError(f"{where}: an empty batch")
    if ids.min() < 0 or ids.max() >= n:
        raise SolarError(f"{where}: sample id outside 0..{n - 1}")
    return ids.astype(np.int64)


def _load_npy(path: str | os.PathLike, what: str, mmap: bool = False) -> np.ndarray:
    try:
        return np.load(Path(path), mmap_mode="r" if mmap else None, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise SolarError(f"{what} {path}: not a readable .npy file ({exc})") from None
