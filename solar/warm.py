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

A node buffer's own kernels (``share="node"``: its planning, plan file proof and host barrier)
are rehearsed in the same process, with no communicator (:func:`rehearse_node`): a host is
planned alone by any of its ranks, and the plan is a pure function of the inputs.

``solar warm`` compiles ahead of time, into the cache, the kernels of common configurations
(every policy, with and without a tier, Shuffle and Weighted, a buffer per rank and per node);
``make`` runs it at install.

numba compiles under one process-wide lock, so threads cannot compile in parallel; processes
can (``solar warm --jobs``): see the README's "First run" section for what each costs here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import importlib
import math
import pkgutil
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from numba.core import event
from numba.core.dispatcher import Dispatcher

from solar.cache.packed import rehearse as rehearse_packing
from solar.config import BufferConfig
from solar.host import barrier as hostbarrier
from solar.io.info import DatasetInfo, StoredLayout
from solar.options import ExpertConfig, LoaderConfig, MemoryConfig, PlanningConfig
from solar.runtime.setup import Setup
from solar.runtime.steps import Steps
from solar.schedule.draw.samplers import (
    SHUFFLE,
    Sampler,
    Trace,
    Weighted,
    is_shuffle,
    sampler_run,
)
from solar.schedule.keep.grouping import Hosts, stage_bound
from solar.schedule.plans.plan import load_plan, make_plan, plan_to_file
from solar.schedule.plans.rankplan import rehearse_phases
from solar.schedule.plans.stream import RankStream
from solar.schedule.spec import PlanSpec

# A rehearsal's size: steps per epoch, local batch and epochs (epoch 0 reads everything; 1 and
# 2 hit, admit, evict and demote), and the bytes one rank may read for it.
STEPS, BATCH, EPOCHS = 3, 4, 3
READ_BUDGET = 64 << 20


class _CompileTally(event.Listener):
    """Counts numba's compilations in this process (not loads from its cache) and their time;
    a compilation nested in another (a callee) counts within its caller's. ``names``: the
    kernels compiled, in order (``module.qualname``)."""

    def __init__(self) -> None:
        self.count = 0
        self.seconds = 0.0
        self.names: list[str] = []
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
                f = ev.data["dispatcher"].py_func
                self.names.append(f"{f.__module__}.{f.__qualname__}")


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
    out: dict[str, Dispatcher] = {}
    # The package's directory, not ``import solar``: its __init__ (lazily) reaches the Loader,
    # a layer above this module.
    for m in pkgutil.walk_packages([str(Path(__file__).parent)], "solar."):
        if m.name in ("solar.cli", "solar.loader", "solar.bench", "solar.precompile"):
            continue  # (no kernels; torch and click are slow to import)
        module = importlib.import_module(m.name)
        for name, obj in vars(module).items():
            if isinstance(obj, Dispatcher) and obj.__module__ == m.name:
                out[f"{m.name}.{name}"] = obj
    return out


def signatures() -> dict[str, int]:
    """How many signatures each kernel has compiled (or loaded) in this process."""
    return {name: len(d.signatures) for name, d in dispatchers().items()}


def unreached(reached: set[str]) -> list[str]:
    """solar's kernels called from Python (not only inlined into other kernels) that are not
    in ``reached``: what a warm-up that compiled (or loaded) ``reached`` left to the first run
    that calls them, found by walking the package, so a new kernel shows up without a list."""
    return sorted(name for name, d in dispatchers().items()
                  if name not in reached and d.targetoptions.get("inline") != "always")  # fmt: skip


# -- rehearsals --------------------------------------------------------------------------------
def tiny_spec(
    spec: PlanSpec, num_samples: int | None = None, dataset: str | None = None
) -> PlanSpec:
    """A run of a few steps with ``spec``'s shape of choices: its world size, policy, sampler
    kind, tier or not, slack, equal batches or not, seed, drop_last and epoch order; at most
    ``num_samples`` samples (of the data ``dataset``, default ``spec``'s).
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
    # Unchecked: a sampler of a kind tiny_sampler keeps is rehearsed over samples it was not
    # made for (its real run was checked; the rehearsal only calls its kernels).
    small = sampler_run(sampler, n, p, b, epochs, run.seed, run.drop_last, check=False)
    horizon = None if spec.horizon is None else min(spec.horizon, epochs)
    window = None if spec.steps_window is None else 1  # (the windowed planner's kernels)
    return PlanSpec(
        small, BufferConfig(scaled(buf.capacity), buf.slack, scaled(buf.tier)), spec.policy,
        spec.reorder_epochs, spec.sample_bytes, dataset or spec.dataset, sampler, horizon,
        spec.equal_batches, spec.pages, window,
    )  # fmt: skip


class _DistinctTrace(Trace):
    """A Trace of distinct batches that says so: a distinct sampler's rehearsal."""

    distinct = True


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
        # serves through the same kernels as a small Trace with repeats; one of distinct
        # batches (Sampler.distinct), as a small Trace of distinct batches saying so.
        steps = max(1, n // (world * batch))
        rng = np.random.default_rng(0)
        if sampler.distinct:
            shape = (epochs, steps, world)
            ids = np.stack([rng.permutation(n)[:batch] for _ in range(math.prod(shape))])
            return _DistinctTrace(ids.reshape(*shape, batch), name="rehearsal")
        ids = rng.integers(0, n, (epochs, steps, world, batch))
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
            None if st.times is None else st.times[:nfiles],
        )  # fmt: skip
    return dataclasses.replace(
        info, files=info.files[:nfiles], lengths=tuple(lengths),
        key_files=tuple(fs[:nfiles] for fs in info.key_files), stored=stored,
    )  # fmt: skip


def settle_compiler_garbage() -> None:
    """Collect, then freeze, what compiling left: numba's compiler leaves hundreds of thousands
    of live objects (types, IR, caches) that every later full collection of the garbage
    collector would walk again, inside the epochs (one-sample gzip chunks, 1,024 samples: epoch
    0 1.8x a warm-cache run's; 0.64x with them frozen). Frozen objects are never collected;
    only what is alive now is, and it lives on anyway."""
    gc.collect()
    gc.freeze()


def rehearse_node(spec: PlanSpec, hosts: Hosts, rank: int, plan_file: bool = False) -> None:
    """The node buffer's own kernels, here, with no communicator or shared memory: rank
    ``rank``'s steps of ``spec``'s node plan over ``hosts`` (its host planned whole by this
    process: the kernels a local rank's part of it runs), taken in order as the runtime takes
    them, then a jump back (a resume's refill); with ``plan_file``, from a node plan file proven
    first, as ``Loader(planning=PlanningConfig(plan=FILE), memory=MemoryConfig(share="node"))``
    reads one; and the host barrier's. ``spec``: a tiny run (:func:`tiny_spec`)."""
    hostbarrier.warm_up()
    stage = stage_bound(spec, hosts)
    with contextlib.ExitStack() as stack:
        stream: RankStream
        if plan_file:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="solar-warm-"))
            plan_to_file(spec, Path(tmp) / "node-plan.h5", hosts=hosts)
            plan = load_plan(Path(tmp) / "node-plan.h5", spec.sampler)
            plan.validate(rank)  # (without a communicator: every host's part)
            stream = RankStream(plan.spec, rank, plan, stage_rows=stage)
        else:
            stream = RankStream(spec, rank, hosts=hosts, stage_rows=stage)
        stack.callback(stream.close)
        stream.start()
        steps = Steps(spec, rank, stream)
        for k in range(spec.run.num_steps):
            steps.enter(k)
            steps.rows(k, steps.plan(k))  # (its exchange too, with equal batches)
        steps.refill_at(min(spec.run.steps_per_epoch, spec.run.num_steps - 1))


def rehearse_loader(args: LoaderConfig, setup: Setup,
                    make: Callable[[LoaderConfig], Any]) -> Warmth:  # fmt: skip
    """Run a tiny copy of a Loader's run (``args`` as ``setup`` decided them) over its own
    files to its end, then drop it: every kernel the Loader's epochs call is compiled (or
    loaded from the cache) by then (a node buffer's own kernels by :func:`rehearse_node`),
    its plan coming as the real one's: from a file, made in memory, or streamed. ``make``: a
    Loader of a record (``Loader.from_config``); the tiny one is placed as the real one, on
    its communicator (a collective, as the real construction), and exchanges no rows."""
    info, given = setup.info, setup.given  # (a node plan given: rehearse_node's)
    given = given if given is not None and given.hosts is None else None
    plan = None if given is None else "memory" if given.file is None else "file"
    with measured() as w:
        fit = max(1, READ_BUDGET // max(1, info.sample_bytes)) * setup.world_size
        first = head(info, tiny_spec(setup.spec, min(info.num_samples, fit)).run.num_samples)
        spec = tiny_spec(setup.spec, first.num_samples, first.identity)
        run = spec.run
        with contextlib.ExitStack() as stack:
            made: Any = None
            # (The tiny Loader's ranks exchange no rows: each plans and serves its own.)
            alone = dataclasses.replace(spec, equal_batches=False)
            if plan == "file":  # the same path as the real run's: read from a file, proven
                tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="solar-warm-"))
                made = plan_to_file(alone, Path(tmp) / "plan.h5")
            elif plan == "memory":
                made = make_plan(alone)
            # The real run's reader and place, on its first files, with the tiny run's
            # decisions alone: no exchange, transform, host buffer, snapshots or warm-up.
            tiny_args = dataclasses.replace(
                args, paths=first, keys=[k.name for k in info.keys], batch_size=run.batch_size,
                epochs=run.epochs, buffer=spec.buffer.capacity, seed=run.seed,
                sampler=spec.sampler, transform=None, batch_transform=None,
                batch_format="dict", drop_last=run.drop_last, comm=setup.comm, rank=setup.rank,
                world_size=run.world_size, reader=setup.config,
                memory=MemoryConfig(tier=setup.tier_dir if spec.buffer.tier else None,
                                    tier_size=spec.buffer.tier, share="rank",
                                    page_mates=spec.pages is not None),
                planning=PlanningConfig(plan=made, policy=spec.policy, slack=spec.buffer.slack,
                                        horizon=spec.horizon, window=spec.window,
                                        equal_batches=False),
                expert=ExpertConfig(warm=False),
            )  # fmt: skip
            with warnings.catch_warnings():  # the real run said what its tiny copy would
                warnings.simplefilter("ignore", UserWarning)
                tiny = make(tiny_args)
            with tiny:
                for epoch in range(run.epochs):
                    tiny.set_epoch(epoch)
                    for _ in tiny:
                        pass
                # A resume's path too: a jump back replays the buffer (and refills it).
                tiny.set_epoch(run.epochs - 1)
                for _ in zip(tiny, range(1), strict=False):
                    pass
            setup.sampler.rehearse(setup.run, setup.rank)  # its own kernels, if any
            if setup.pack is not None:  # (the tiny Loader packs nothing: no disk given)
                rehearse_packing(setup.pack.at.row_bytes)
            if spec.buffer.tier:  # (a tiny run's steps may never store a slot twice)
                rehearse_phases()
        if setup.shared:  # a node buffer: the tiny Loader ran per rank; the node's own
            rehearse_node(spec, setup.hosts, setup.rank, setup.given is not None)
    if w[0].compiled:
        settle_compiler_garbage()
    return w[0]


def rehearse_planning(spec: PlanSpec, plan: Callable[[PlanSpec], Any]) -> Warmth:
    """``plan`` (what ``solar plan`` will do with ``spec``) run on a tiny copy of ``spec``."""
    with measured() as w:
        plan(tiny_spec(spec))
    return w[0]
