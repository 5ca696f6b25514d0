"""Per-sample transforms inside the pipeline, off the trainer's thread.

A :class:`Transform` runs a user function on each row of a step's batch once the row's bytes
are in memory (a RAM hit, a tier read or a storage read), on a pool of worker threads (numpy,
torch and numba release the GIL in their loops), or of worker processes for functions that
hold it. Its outputs are written straight into preallocated batch rows: the trainer gets
them as they are. The buffer and the tier keep raw bytes, so a transform runs anew at every
access, as a ``DataLoader``'s ``__getitem__`` does (unless it is declared deterministic:
then they keep its outputs).

Each call gets a ``numpy.random.Generator`` of its own, a pure function of (seed, epoch, sample
id, occurrence), so augmentation is reproducible whatever worker (and, but with a Trace
sampler's per-rank batches, whatever rank) runs it, and an exact resume replays it bit for
bit. The occurrence is the draw's step within the epoch and its repeat within that step
(with samplers that draw a sample more than once; a Trace's ranks count apart).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from solar.errors import SolarError
from solar.io.info import KeyInfo
from solar.remote import Remote

SampleFn = Callable[[dict[str, np.ndarray], np.random.Generator], Mapping[str, np.ndarray]]


@dataclass(frozen=True)
class Transform:
    """How the Loader transforms each sample: the one owner of these defaults.

    ``fn(sample, rng) -> sample``: ``sample`` maps each key to its row (a read-only view:
    return new arrays); the result maps output keys to arrays whose shapes and dtypes are the
    same for every sample: ``out`` declares them (``{key: (shape, dtype)}``), else they are
    taken from a first call on sample 0. ``workers``: threads (or processes) transforming at
    once; ``"auto"``: this rank's share of the cores (:func:`solar._cpu.cpu_share`), and for
    threads tuned online with ``ReaderConfig(threads="auto")`` (processes keep their number).
    ``processes``: run ``fn`` in worker processes (it must pickle, as with a ``DataLoader``
    under spawn); rows travel through shared memory, never pickled. ``ahead``: steps
    transformed ahead of the one the trainer takes (steps whose reads have landed: none with
    ``ReaderConfig(read_ahead=0)``). ``deterministic``: ``fn``'s result depends on the sample
    alone (not on ``rng``), so the buffer and the tier may keep transformed samples: a hit is
    then served as held, only storage reads are transformed (one step ahead, since a step's
    admissions are its transformed rows). Their slots hold transformed rows, but ``buffer``
    and ``tier_size`` given in bytes are converted with the raw sample's size. ``remote``:
    preprocessing workers that transform some steps for the trainers (:class:`solar.remote.Remote`;
    ``fn`` must pickle: the workers import it).
    """

    fn: SampleFn
    workers: int | Literal["auto"] = "auto"
    processes: bool = False
    out: Mapping[str, tuple[Sequence[int], Any]] | None = None
    ahead: int = 2
    deterministic: bool = False
    remote: Remote | None = None

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise SolarError(f"transform must be callable, got {self.fn!r}")
        w = self.workers
        if w != "auto" and (not isinstance(w, int) or isinstance(w, bool) or w < 1):
            raise SolarError(f"transform workers must be 'auto' or an integer >= 1, got {w!r}")
        if not isinstance(self.ahead, int) or isinstance(self.ahead, bool) or self.ahead < 0:
            raise SolarError(f"transform ahead must be an integer >= 0, got {self.ahead!r}")
        if self.remote is not None and not isinstance(self.remote, Remote):
            raise SolarError(f"transform remote must be a solar.remote.Remote, got {self.remote!r}")
        if self.remote is not None:
            _picklable(self.fn)
        for name in ("processes", "deterministic"):
            if not isinstance(getattr(self, name), bool):
                raise SolarError(f"transform {name} must be True or False, "
                                 f"got {getattr(self, name)!r}")  # fmt: skip

    def worker_count(self, cores: int) -> int:
        """Workers to start with, given this rank's share of the cores."""
        return cores if self.workers == "auto" else int(self.workers)


def _picklable(fn: SampleFn) -> None:
    """The workers import ``fn`` by its pickle: say now, in one line, if it has none."""
    import pickle

    try:
        pickle.dumps(fn)
    except Exception:  # (pickle raises several kinds)
        name = getattr(fn, "__qualname__", repr(fn))
        raise SolarError(f"transform remote=: fn {name} cannot be pickled for the workers "
                         "(define it at a module's top level)") from None  # fmt: skip


def as_transform(value: SampleFn | Transform | None) -> Transform | None:
    """``Loader(transform=)``'s argument as a :class:`Transform` (a bare function: defaults)."""
    if value is None or isinstance(value, Transform):
        return value
    return Transform(value)


def load_transform(text: str) -> SampleFn:
    """The function ``MODULE:FUNC`` names (``MODULE`` importable, or a ``.py`` file's path)."""
    import importlib
    import importlib.util
    import sys
    from pathlib import Path

    module_name, sep, name = text.rpartition(":")
    if not sep or not module_name or not name:
        raise SolarError(f"--transform: expected MODULE:FUNC or FILE.py:FUNC, got {text!r}")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name)
            spec = importlib.util.spec_from_file_location(path.stem, path)
            if spec is None or spec.loader is None or not path.is_file():
                raise FileNotFoundError(f"no file {path}")
            known = sys.modules.get(path.stem)
            if known is not None and getattr(known, "__file__", None) != str(path):
                raise ImportError(f"a module named {path.stem!r} is already imported "
                                  "(rename the file)")  # fmt: skip
            module = importlib.util.module_from_spec(spec)
            # Importable by name here and in spawned workers (which take this sys.path), so
            # that the function pickles for Transform(processes=True).
            sys.modules[path.stem] = module
            if str(path.resolve().parent) not in sys.path:
                sys.path.insert(0, str(path.resolve().parent))
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except Exception as exc:
        raise SolarError(f"--transform {text}: cannot import {module_name}: "
                         f"{type(exc).__name__}: {exc}") from exc  # fmt: skip
    fn = getattr(module, name, None)
    if not callable(fn):
        raise SolarError(f"--transform {text}: {module_name} has no function {name!r}")
    return fn


def sample_rng(seed: int, epoch: int, sample: int, step: int, repeat: int) -> np.random.Generator:
    """The generator of one draw: Philox keyed by (seed, epoch), its counter starting at
    (repeat, step, sample) in the high words, so no two draws' streams overlap within 2^64
    numbers each."""
    key = np.array([seed, epoch], np.uint64)
    counter = np.array([0, repeat, step, sample], np.uint64)
    return np.random.Generator(np.random.Philox(counter=counter, key=key))


def repeats(ids: np.ndarray) -> np.ndarray:
    """For each position of ``ids``, how many times its id occurred before it: (n,) int64."""
    order = np.argsort(ids, kind="stable")
    srt = ids[order]
    starts = np.flatnonzero(np.r_[True, srt[1:] != srt[:-1]]) if ids.size else ids[:0]
    first = np.repeat(starts, np.diff(np.r_[starts, ids.size]))
    out = np.empty(ids.size, np.int64)
    out[order] = np.arange(ids.size) - first
    return out


def output_keys(out: Mapping[str, Any], where: str, declared: bool = False) -> tuple[KeyInfo, ...]:
    """Output keys from a transform's result ``{key: array}`` or, ``declared``, from
    ``{key: (shape, dtype)}``; ``where`` names the source in errors."""
    keys = []
    if not isinstance(out, Mapping) or not out:
        raise SolarError(f"{where}: a transform must return a non-empty dict of arrays")
    for name, v in out.items():
        if not isinstance(name, str) or name == "index":
            raise SolarError(f"{where}: output key {name!r} (keys are strings, not 'index')")
        try:
            if declared:
                shape, dtype = tuple(int(s) for s in v[0]), np.dtype(v[1])
            else:
                a = np.asarray(v)
                shape, dtype = a.shape, a.dtype
        except (TypeError, ValueError, IndexError):
            what = "(shape, dtype)" if declared else "an array"
            raise SolarError(f"{where}: key {name!r}: expected {what}, got {v!r}") from None
        if dtype.hasobject or any(s < 0 for s in shape):
            raise SolarError(f"{where}: key {name!r}: {shape} {dtype} is not a sample's shape")
        keys.append(KeyInfo(name, tuple(shape), dtype.newbyteorder("=")))
    return tuple(keys)


@dataclass(frozen=True)
class Rows:
    """One step's rows to transform: batch rows ``rows`` hold draws of ``samples`` at
    ``step`` of ``epoch`` (their repeats in ``repeat``)."""

    epoch: int
    step: int  # within the epoch
    samples: np.ndarray  # (n,) int64
    repeat: np.ndarray  # (n,) int64
    rows: np.ndarray  # (n,) int64


def _call(fn: SampleFn, seed: int, keys: tuple[KeyInfo, ...], src: Sequence[np.ndarray],
          row: int, sample: int, epoch: int, step: int, repeat: int) -> Any:  # fmt: skip
    """``fn`` on row ``row`` of ``src`` (read-only views), with its draw's generator."""
    views = {}
    for k, a in zip(keys, src, strict=True):
        v = a[row, ...]  # a view, 0-d for scalar samples
        v.flags.writeable = False  # the raw row may be on its way to the buffer or tier
        views[k.name] = v
    try:
        return fn(views, sample_rng(seed, epoch, sample, step, repeat))
    except Exception as exc:
        raise SolarError(f"transform of sample {sample} (epoch {epoch}) failed: "
                         f"{type(exc).__name__}: {exc}") from exc  # fmt: skip


def first_outputs(fn: SampleFn, seed: int, keys: tuple[KeyInfo, ...],
                  src: Sequence[np.ndarray]) -> tuple[KeyInfo, ...]:  # fmt: skip
    """The output keys of ``fn`` on sample 0 (row 0 of ``src``), as at step 0 of epoch 0."""
    got = _call(fn, seed, keys, src, 0, 0, 0, 0, 0)
    return output_keys(got, "transform of sample 0 (epoch 0)")


def transform_rows(
    fn: SampleFn,
    seed: int,
    keys: tuple[KeyInfo, ...],
    src: Sequence[np.ndarray],
    out_keys: tuple[KeyInfo, ...],
    dst: Sequence[np.ndarray],
    job: Rows,
) -> float:
    """Transform ``job``'s rows of ``src`` (raw, per key) into the same rows of ``dst`` (per
    output key); returns the seconds it took. Errors name the sample and epoch."""
    t0 = time.perf_counter()
    for j in range(job.rows.size):
        row, sample = int(job.rows[j]), int(job.samples[j])
        got = _call(fn, seed, keys, src, row, sample, job.epoch, job.step, int(job.repeat[j]))
        where = f"transform of sample {sample} (epoch {job.epoch})"
        if not isinstance(got, Mapping) or len(got) != len(out_keys):
            names = sorted(got) if isinstance(got, Mapping) else type(got).__name__
            raise SolarError(f"{where} returned {names}, expected keys "
                             f"{[k.name for k in out_keys]}")  # fmt: skip
        for k, a in zip(out_keys, dst, strict=True):
            v = got.get(k.name)
            v = np.asarray(v) if v is not None else None
            if v is None or v.shape != k.sample_shape or v.dtype != k.dtype:
                what = "nothing" if v is None else f"{v.shape} {v.dtype}"
                raise SolarError(f"{where} returned {what} for key {k.name!r}, expected "
                                 f"{k.sample_shape} {k.dtype} (as first seen)")  # fmt: skip
            a[row] = v
    return time.perf_counter() - t0
