"""Compile numba kernels before any timed or trained epoch, and say what it cost.

solar's hot loops are numba kernels, all cached (``cache=True``: compiled once per install
into numba's cache, then loaded in a few ms each; libc's and the codec libraries' C functions
are linked by name, solar/io/libc.py and solar/io/codeclibs.py). A
kernel is compiled (or loaded) for each new combination of argument types at its first call,
and which combinations a run needs depends on its data (dtypes, layout), policy, sampler and
tier. So rather than list signatures, solar *rehearses*: a Loader, ``solar plan`` and
``solar bench`` first run a tiny copy of the real run (the same data files, keys, policy,
sampler kind, tier and world size; a few dozen samples, up to 3 epochs) through the very code
of the real one, and only then start. Every kernel the real epochs call has then been
compiled, and the time it took is reported (``loader.stats.warm_seconds``, ``solar bench``,
``solar plan --json``) instead of landing in epoch 0.

``solar warm`` compiles ahead of time, into the cache, the kernels of common configurations
(every policy, with and without a tier, Shuffle and Weighted); ``make`` runs it at install.

numba compiles under one process-wide lock, so threads cannot compile in parallel; processes
can (``solar warm --jobs``): see the README's "First run" section for what each costs here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import importlib
import math
import os
import pkgutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from numba.core import event
from numba.core.dispatcher import Dispatcher

from solar.config import BufferConfig, RunConfig
from solar.io.hdf5 import DatasetInfo, StoredLayout
from solar.schedule.samplers import SHUFFLE, Sampler, Trace, Weighted, is_shuffle
from solar.schedule.spec import PlanSpec

# A rehearsal's size: steps per epoch, local batch and epochs (epoch 0 reads everything; 1 and
# 2 hit, admit, evict and demote), and the bytes one rank may read for it.
STEPS, BATCH, EPOCHS = 3, 4, 3
READ_BUDGET = 64 << 20


class _CompileTally(event.Listener):
    """Counts numba's compilations in this process (not loads from its cache) and their time;
    a compilation nested in another (a callee) counts within its caller's."""

    def __init__(self) -> None:
        self.count = 0
        self.seconds = 0.0
        self._depth = 0
        self._t0 = 0.0
        self._lock = threading.Lock()  # (numba compiles under its own lock: one at a time)

    def on_start(self, ev: event.Event) -> None:
        with self._lock:
            if self._depth == 0:
                self._t0 = time.perf_counter()
            self._depth += 1

    def on_end(self, ev: event.Event) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0:
                self.count += 1
                self.seconds += time.perf_counter() - self._t0


TALLY = _CompileTally()
event.register("numba:compile", TALLY)


@dataclasses.dataclass(frozen=True)
class Warmth:
    """What warming cost: wall seconds of the rehearsal (compiling, loading cached kernels and
    the rehearsal's own work), of which ``compile_seconds`` compiling ``compiled`` kernels."""

    seconds: float
    compile_seconds: float
    compiled: int


@contextlib.contextmanager
def measured() -> Iterator[list[Warmth]]:
    """``with measured() as w:`` ... ``w[0]`` is the block's :class:`Warmth`."""
    out: list[Warmth] = []
    count, seconds, t0 = TALLY.count, TALLY.seconds, time.perf_counter()
    yield out
    out.append(Warmth(time.perf_counter() - t0, TALLY.seconds - seconds, TALLY.count - count))


def dispatchers() -> dict[str, Dispatcher]:
    """Every numba kernel of solar, by qualified name."""
    import solar

    out: dict[str, Dispatcher] = {}
    for m in pkgutil.walk_packages(solar.__path__, "solar."):
        if m.name in ("solar.cli", "solar.loader", "solar.bench"):
            continue  # (no kernels; torch and click are slow to import)
        module = importlib.import_module(m.name)
        for name, obj in vars(module).items():
            if isinstance(obj, Dispatcher) and obj.__module__ == m.name:
                out[f"{m.name}.{name}"] = obj
    return out


def signatures() -> dict[str, int]:
    """How many signatures each kernel has compiled (or loaded) in this process."""
    return {name: len(d.signatures) for name, d in dispatchers().items()}


# -- rehearsals --------------------------------------------------------------------------------
def tiny_spec(
    spec: PlanSpec, num_samples: int | None = None, dataset: str | None = None
) -> PlanSpec:
    """A run of a few steps with ``spec``'s shape of choices: its world size, policy, sampler
    kind, tier or not, slack, seed, drop_last and epoch order; at most ``num_samples`` samples
    (of the data ``dataset``, default ``spec``'s).
    """
    run, buf = spec.run, spec.buffer
    p = run.world_size
    limit = run.num_samples if num_samples is None else min(num_samples, run.num_samples)
    b = max(1, min(run.batch_size, BATCH, limit // (p * STEPS) or 1))
    n = min(limit, p * b * STEPS + (0 if run.drop_last else max(1, p * b // 2)))
    b = min(b, n // p)
    share = n / run.num_samples

    def scaled(c: int) -> int:
        return 0 if c == 0 else max(1, min(math.ceil(c * share), n))

    epochs = min(run.epochs, EPOCHS)
    sampler = tiny_sampler(spec.sampler, n, epochs, p, b)
    draws = sampler.draws(n, p * b)
    small = RunConfig(n, p, b, epochs, run.seed, run.drop_last, None if draws == n else draws)
    horizon = None if spec.horizon is None else min(spec.horizon, epochs)
    return PlanSpec(
        small, BufferConfig(scaled(buf.capacity), buf.slack, scaled(buf.tier)), spec.policy,
        spec.reorder_epochs, spec.sample_bytes, dataset or spec.dataset, sampler, horizon,
        pages=spec.pages,
    )  # fmt: skip


def tiny_sampler(sampler: Sampler, n: int, epochs: int, world: int, batch: int) -> Sampler:
    """A sampler of ``sampler``'s kind over ``n`` samples."""
    if is_shuffle(sampler):
        return SHUFFLE
    if isinstance(sampler, Weighted):
        # Uneven weights: draws repeat, as real weighted draws do.
        w = 1.0 / (1.0 + np.arange(n))
        draws = None if sampler.num_samples is None else max(world * batch, n // 2)
        return Weighted(w, draws, sampler.replacement, sampler.affinity)
    if isinstance(sampler, Trace) or not sampler.affinity:
        # Any sampler that splits its own batches (a Trace, a NeighborSampler) plans and
        # serves through the same kernels as a small Trace with repeats.
        steps = max(1, n // (world * batch))
        ids = np.random.default_rng(0).integers(0, n, (epochs, steps, world, batch))
        ids[..., -1] = ids[..., 0]  # a repeat within a batch: read once, copied
        return Trace(ids, name="rehearsal")
    return sampler  # (a sampler with affinity of another kind: rehearsed as it is)


def head(info: DatasetInfo, n: int) -> DatasetInfo:
    """The first ``n`` samples of ``info``'s files: its first files (the last one cut short)."""
    ends = np.cumsum(info.lengths)
    nfiles = int(np.searchsorted(ends, n)) + 1 if n < ends[-1] else len(info.lengths)
    lengths = list(info.lengths[:nfiles])
    lengths[-1] -= int(ends[nfiles - 1]) - n if n < ends[-1] else 0
    st = info.stored
    stored = None
    if st is not None:
        stored = StoredLayout(
            st.offsets[:nfiles], st.chunk_rows[:nfiles], st.decodable[:nfiles],
            None if st.sizes is None else st.sizes[:nfiles],
        )  # fmt: skip
    return dataclasses.replace(
        info, files=info.files[:nfiles], lengths=tuple(lengths),
        key_files=tuple(fs[:nfiles] for fs in info.key_files), stored=stored,
    )  # fmt: skip


def rehearse_loader(loader: Any, plan: str | None) -> Warmth:
    """Run a tiny copy of ``loader``'s run over its own files to its end, then drop it: every
    kernel ``loader``'s epochs call is compiled (or loaded from the cache) by then. ``plan``:
    how the real run's plan came, ``"file"`` or ``"memory"`` (None: streamed)."""
    from solar.loader import Loader
    from solar.schedule.plan import make_plan, plan_to_file

    info: DatasetInfo = loader.info
    compiled_before = TALLY.count
    with measured() as w:
        fit = max(1, READ_BUDGET // max(1, info.sample_bytes)) * loader.world_size
        first = head(info, tiny_spec(loader.spec, min(info.num_samples, fit)).run.num_samples)
        spec = tiny_spec(loader.spec, first.num_samples, first.identity)
        run = spec.run
        with contextlib.ExitStack() as stack:
            made: Any = None
            if plan == "file":  # the same path as the real run's: read from a file, proven
                tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="solar-warm-"))
                made = plan_to_file(spec, Path(tmp) / "plan.h5")
            elif plan == "memory":
                made = make_plan(spec)
            tiny = Loader(
                first, [k.name for k in info.keys],
                batch_size=run.batch_size, epochs=run.epochs, buffer=spec.buffer.capacity,
                seed=run.seed, slack=spec.buffer.slack, plan=made, rank=loader.rank,
                world_size=run.world_size, drop_last=run.drop_last, policy=spec.policy,
                reader=loader.config, one_per_file=info.one_per_file,
                tier=loader._tier_dir if spec.buffer.tier else None,
                tier_size=spec.buffer.tier, sampler=spec.sampler, horizon=spec.horizon,
                warm=False, page_mates=spec.pages is not None,
            )  # fmt: skip
            with tiny:
                for epoch in range(run.epochs):
                    tiny.set_epoch(epoch)
                    for _ in tiny:
                        pass
                # A resume's path too: a jump back replays the buffer (and refills it).
                tiny.set_epoch(run.epochs - 1)
                for _ in zip(tiny, range(1), strict=False):
                    pass
            loader.sampler.rehearse(loader.run, loader.rank)  # its own kernels, if any
        if TALLY.count > compiled_before:
            settle_compiler_garbage()
    return w[0]


def settle_compiler_garbage() -> None:
    """Collect, then freeze, what compiling left: numba's compiler leaves hundreds of thousands
    of live objects (types, IR, caches) that every later full collection of the garbage
    collector would walk again, inside the epochs (one-sample gzip chunks, 1,024 samples: epoch
    0 1.8x a warm-cache run's; 0.64x with them frozen). Frozen objects are never collected;
    only what is alive now is, and it lives on anyway."""
    gc.collect()
    gc.freeze()


def rehearse_planning(spec: PlanSpec, plan: Callable[[PlanSpec], Any]) -> Warmth:
    """``plan`` (what ``solar plan`` will do with ``spec``) run on a tiny copy of ``spec``."""
    with measured() as w:
        plan(tiny_spec(spec))
    return w[0]


# -- ahead of time -----------------------------------------------------------------------------
def common_configs() -> list[dict[str, Any]]:
    """What ``solar warm`` rehearses: every policy of each sampler, with and without a tier,
    one rank and several, on float32 samples in one HDF5 file and in one-sample files."""
    from solar.schedule.policies import POLICIES, TIERED, TRACE_POLICIES

    out: list[dict[str, Any]] = []
    for world in (1, 2):
        for policy in POLICIES:
            for tier in (False, True) if policy in TIERED else (False,):
                out.append(dict(world=world, policy=policy, tier=tier, sampler="shuffle"))
        for policy in TRACE_POLICIES:
            for tier in (False, True) if policy == "solar" else (False,):
                out.append(dict(world=world, policy=policy, tier=tier, sampler="weighted"))
    return out


def warm_config(cfg: dict[str, Any], root: Path) -> None:
    """Rehearse one of :func:`common_configs` over small generated data in ``root``."""
    from solar.loader import Loader

    n = 40
    data = root / "data.h5"
    if not data.exists():
        _write_data(root, n)
    sampler = Weighted(1.0 / (1.0 + np.arange(n))) if cfg["sampler"] == "weighted" else None
    tier = root / f"tier-{os.getpid()}" if cfg["tier"] else None
    if tier is not None:
        tier.mkdir(exist_ok=True)
    for source, one in ((data, False), (root / "files", True)):
        for rank in range(cfg["world"]):
            ld = Loader(
                source, batch_size=4, epochs=2, buffer=5, rank=rank, world_size=cfg["world"],
                policy=cfg["policy"], one_per_file=one, tier=tier, tier_size=8 if tier else 0,
                sampler=sampler,
            )  # fmt: skip
            ld.close()


def _write_data(root: Path, n: int) -> None:
    import h5py

    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, 8, 8)).astype(np.float32)
    y = rng.standard_normal((n, 2)).astype(np.float32)
    tmp = root / "data.tmp.h5"
    with h5py.File(tmp, "w") as f:
        f["x"], f["y"] = x, y
    files = root / "files"
    files.mkdir(exist_ok=True)
    for i in range(n):
        with h5py.File(files / f"{i:03d}.h5", "w") as f:
            f["x"], f["y"] = x[i], y[i]
    os.replace(tmp, root / "data.h5")


def warm_ahead(jobs: int = 1, progress: Callable[[str], None] | None = None) -> Warmth:
    """Compile the kernels of :func:`common_configs` into numba's cache, in ``jobs``
    processes (each takes every ``jobs``-th configuration)."""
    configs = common_configs()
    with measured() as w, tempfile.TemporaryDirectory(prefix="solar-warm-") as tmp:
        root = Path(tmp)
        _write_data(root, 40)
        if jobs <= 1:
            for cfg in configs:
                if progress is not None:
                    progress(_name(cfg))
                warm_config(cfg, root)
        else:
            import multiprocessing as mp

            ctx = mp.get_context("spawn")  # a fresh interpreter each: no inherited threads
            with ctx.Pool(jobs) as pool:
                for name in pool.imap_unordered(_warm_one, [(c, str(root)) for c in configs]):
                    if progress is not None:
                        progress(name)
    return w[0]


def _warm_one(arg: tuple[dict[str, Any], str]) -> str:
    cfg, root = arg
    warm_config(cfg, Path(root))
    return _name(cfg)


def _name(cfg: dict[str, Any]) -> str:
    tier = ", tier" if cfg["tier"] else ""
    return f"{cfg['policy']} ({cfg['sampler']}{tier}, P={cfg['world']})"
