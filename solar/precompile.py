"""``solar warm``: compile the kernels of common configurations into numba's cache, ahead of
time (``make`` runs it at install), by building small Loaders over generated data, and
rehearsing node buffers (``share="node"``) in the same process, without MPI. The rehearsal a
Loader runs at construction is solar/loader.py's; the machinery both use is solar/warm.py's."""

from __future__ import annotations

import dataclasses
import os
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from solar.cache.packed import rehearse as rehearse_packing
from solar.config import BufferConfig, ReaderConfig, RunConfig
from solar.loader import Loader
from solar.options import ExpertConfig, MemoryConfig, PlanningConfig
from solar.schedule.draw.samplers import SHUFFLE, Weighted
from solar.schedule.keep.grouping import Hosts
from solar.schedule.keep.hostplan import HostPlanner
from solar.schedule.keep.planner import Planner
from solar.schedule.plans.plan import load_plan, plan_to_file
from solar.schedule.spec import PlanSpec
from solar.warm import Warmth, measured, rehearse_node, signatures, tiny_spec, unreached

# The node buffers ``solar warm`` rehearses, on a host of 2 ranks with the solar policy:
# (sampler, tier, a node plan file, equal batches). Weighted(affinity=False) stands for every
# sampler that fixes each rank's batch (a GNN's neighbour sampler, a Trace).
NODE_KINDS = (("traced", False, False, False), ("traced", True, False, False),
              ("traced", False, True, False), ("shuffle", False, False, False),
              ("shuffle", False, False, True))  # fmt: skip


# Signatures that paths none of :func:`common_configs` takes call (the test suite takes them all:
# ``make test`` listed them as compiled inside the tests, several times where each rank of a job
# compiled its own): each kernel with its arguments' types, compiled by :func:`_warm_signatures`
# (``T[C]``/``T[A]``: a contiguous or any array of T, ``T[2C]`` of 2 dimensions, ``ro``
# read-only). A signature that no longer matches its kernel's calls costs its compile here only.
SIGNATURES = (
    # A graph's conversion (its ids checked, its features' digests folded; locality order),
    # and `solar bench`'s emulated page cache (``mmap``).
    ("graph.csrwrite._bad_ids", "int64[C]ro int64[C] int64"),
    ("graph.csrwrite._fold", "uint16[C] int64 uint64[C]"),
    ("graph.reorder._bfs", "int64[C] int64[C] int64[C] int64"),
    ("graph.mmapbase._copy_rows", "uint8[2C] int64[C] int64[C] int64 int64 uint8[2C]"),
    ("graph.mmapbase._copy_rows", "uint8[2C] int64[C] int64[A] int64 int64 uint8[2C]"),
    ("graph.mmapbase._lru_pages", "int64[C] int64[C] int64[C] int64[C] int64[C] int64[C]"),
    ("graph.mmapbase._read_pages", "int64 uint8[2C] int64[C] int64[C] int64[C]"),
    # Reads: asynchronous (aio), of runs given as views, of one-sample files, bitshuffle's
    # read-only chunks.
    ("io.aio._read_spans", "int64 int64 uint8[C] int64[C] int64[A] int64[A] int64[C] int64 "
                           "uint64[2C] uint64[C] int64[2C]"),
    ("io.executor._iov_runs", "int64 uint64[2C] int64[C] int64[C] int64[C] bool int64[C] "
                            "int64[C]"),
    ("io.executor._open_read_close", "uint8[C]ro int64[C] int64[C] uint64[2C] int64[C] int64[C] "
                                     "int64 int64[2C]"),
    ("io.tasks.run_bytes", "uint64[2C] int64[C] int64[C]"),
    ("io.bitshuffle._run", "uint8[C]ro uint8[C] int64 int64 int64"),
    # Planning: a trace's epochs, keys and page mates; a tier's Belady steps; a neighbour
    # sampler's batch rows (its ids read-only where a host's buffer shares them); a plan
    # file's (read-only) replay and proof.
    ("schedule.draw.epochs._fill_first", "int64[C] int64[C] int64 int64[C]"),
    ("schedule.draw.keyspace.distinct_batches", "int64[C] int64[C] int64 int64[C] int16[C] "
                                                "int32[2C] bool"),
    ("schedule.draw.pagemates.mates_of", "int64 int64 int64 int64 int64"),
    ("schedule.draw.traces._remember", "int64[C] int64 int64 int64[C]"),
    ("schedule.keep.belady._tiered_steps", "int32[C] int64[C] int64[C] int64 int64 int64[C] "
                                           "int32[C] int32[C] int64[2C] int32[2C] int64[2C] "
                                           "int32[2C] int32[3C] int16[C] int32[C] int32[C] "
                                           "uint8[C] int32[2C]"),
    ("schedule.plans.rankplan._merged_rows", "int64[C] int64[C] int64 int64[C]"),
    ("schedule.plans.rankplan._merged_rows", "int64[C]ro int64[C] int64 int64[C]"),
    ("schedule.plans.rankplan._read_before_overwrite", "int32[C] int32[C]ro uint8[C] int64[C] "
                                                       "int64 int64 bool[C]"),
    ("schedule.plans.rankplan._read_before_overwrite", "int32[C]ro int32[C]ro uint8[C]ro "
                                                       "int64[C] int64 int64 bool[C]"),
    ("schedule.plans.rankplan._replay", "int64[C] int32[C] int32[C] uint8[C] int64 int64 int64 "
                                        "int64[C]"),
    ("schedule.plans.rankplan._replay", "int64[C]ro int32[C]ro int32[C]ro uint8[C]ro int64 "
                                        "int64 int64 int64[C]"),
    ("schedule.plans.services._check_services",
     "int32[C] int32[C] uint8[C] int64 int64[C] int64[C] int32[C] uint8[C] int16[C] int64[C] "
     "int64[C] int64[2C] int64[C] int64[C] int64 int64 bool int64 int64[C] int64[C] int64[C] "
     "int64[C] int64[C] int64[C] int64[C] int64[C] int64"),
    ("schedule.plans.services._not_batch", "int64[C] int64[C] int64 int64 int64[C] uint8[C] "
                                           "int64[C] int64[C] int64"),
)  # fmt: skip


def common_configs() -> list[dict[str, Any]]:
    """What ``solar warm`` rehearses: every policy of each sampler, with and without a tier,
    one rank and several, on float32 samples in one HDF5 file and in one-sample files; the
    solar policy served from a plan file (``solar plan -o``, then
    ``PlanningConfig(plan=FILE)``: the plan's writing and its proof, as ``solar demo`` runs);
    first (the longest), one buffer per host of :data:`NODE_KINDS`, in one process (their
    kernels compiled once), and a graph (:func:`_warm_graph`); and the stored layouts of
    :func:`layouts`. What none of them reaches, :func:`warm_ahead` names."""
    from solar.schedule.policy import POLICIES, TIERED, TRACE_POLICIES

    out: list[dict[str, Any]] = [
        dict(world=2, policy="solar", share="node", tier=False, sampler="node kinds"),
        dict(world=1, policy="solar", tier=False, sampler="signatures"),
        dict(world=2, policy="solar", tier=False, sampler="neighbor"),
    ]
    # Each stored layout's read and decode kernels (one policy: they do not depend on it).
    out += [dict(world=1, policy="solar", tier=False, sampler="shuffle", layout=name)
            for name in layouts()]  # fmt: skip
    for world in (1, 2):
        for policy in POLICIES:
            for tier in (False, True) if policy in TIERED else (False,):
                out.append(dict(world=world, policy=policy, tier=tier, sampler="shuffle"))
        for policy in TRACE_POLICIES:
            for tier in (False, True) if policy == "solar" else (False,):
                out.append(dict(world=world, policy=policy, tier=tier, sampler="weighted"))
        for sampler in ("shuffle", "weighted"):
            out.append(dict(world=world, policy="solar", tier=False, sampler=sampler,
                            plan_file=True))  # fmt: skip
    # A plan file's proof with a tier (a trace's and Shuffle's, their own kernels): its tier
    # slots an array of their own, not a view.
    out += [dict(world=2, policy="solar", tier=True, sampler=sampler, plan_file=True)
            for sampler in ("weighted", "shuffle")]  # fmt: skip
    return out


def warm_config(cfg: dict[str, Any], root: Path) -> None:
    """Rehearse one of :func:`common_configs` over small generated data in ``root``."""
    n = 40
    data = root / "data.h5"
    if not data.exists():
        _write_data(root, n)
    if cfg.get("share") == "node":
        _warm_node(data, root, n)
        return
    if cfg["sampler"] == "neighbor":
        _warm_graph(root, cfg["world"])
        return
    if cfg["sampler"] == "signatures":
        _warm_signatures()
        return
    if "layout" in cfg:
        source = _write_layout(root, cfg["layout"], n)
        with warnings.catch_warnings():  # (varying batches: these serve nobody)
            warnings.simplefilter("ignore", UserWarning)
            Loader(source, batch_size=4, epochs=2, buffer=5,
                   reader=ReaderConfig(one_per_file=source.is_dir())).close()  # fmt: skip
        for row_bytes in (8, 3):  # a packed window's copy: rows of whole words, and not
            rehearse_packing(row_bytes)
        return
    sampler = Weighted(1.0 / (1.0 + np.arange(n))) if cfg["sampler"] == "weighted" else None
    tier = root / f"tier-{os.getpid()}" if cfg["tier"] else None
    if tier is not None:
        tier.mkdir(exist_ok=True)
    for source, one in ((data, False), (root / "files", True)):
        kw = dict(batch_size=4, epochs=2, buffer=5, world_size=cfg["world"], sampler=sampler,
                  reader=ReaderConfig(one_per_file=one),
                  memory=MemoryConfig(tier=tier, tier_size=8 if tier else 0))  # fmt: skip
        planning = PlanningConfig(policy=cfg["policy"])
        with warnings.catch_warnings():  # (varying batches: these serve nobody)
            warnings.simplefilter("ignore", UserWarning)
            if cfg.get("plan_file"):
                name = f"plan-{os.getpid()}-{cfg['sampler']}-{cfg['world']}-{int(one)}.h5"
                planning = _planned(source, kw, planning, root / name)
            for rank in range(cfg["world"]):
                Loader(source, rank=rank, planning=planning, **kw).close()


def _planned(source: Path, kw: dict[str, Any], planning: PlanningConfig,
             path: Path) -> PlanningConfig:  # fmt: skip
    """The run of a Loader of ``source`` and ``kw`` planned into the plan file ``path``, as
    ``solar plan -o`` writes one: its Loaders read it (and prove it) instead of planning."""
    made = Loader(source, rank=0, planning=planning, expert=ExpertConfig(warm=False), **kw)
    made.close()
    plan_to_file(made.spec, path)
    return PlanningConfig(plan=path)


def _warm_node(data: Path, root: Path, n: int) -> None:
    """Rehearse node buffers of :data:`NODE_KINDS` over ``data`` (``n`` samples): each one's
    per-rank rehearsal, as a node Loader runs it (a Loader of the run per rank; Shuffle's is
    among :func:`common_configs` already), and its node plan's (:func:`rehearse_node`)."""
    hosts = Hosts.grid(1, 2)
    for sampler, tier, plan_file, equal in NODE_KINDS:
        traced = sampler == "traced"
        where = root / f"tier-{os.getpid()}" if tier else None
        if where is not None:
            where.mkdir(exist_ok=True)
        with warnings.catch_warnings():  # (varying batches: these serve nobody)
            warnings.simplefilter("ignore", UserWarning)
            ld = Loader(
                data, batch_size=4, epochs=3, buffer=5, rank=0, world_size=hosts.world,
                sampler=Weighted(1.0 / (1.0 + np.arange(n)), affinity=False) if traced else None,
                memory=MemoryConfig(tier=where, tier_size=8 if tier else 0, share="rank"),
                expert=ExpertConfig(warm=traced),
            )  # fmt: skip
        ld.close()
        # (Equal batches: a Loader's need a communicator, a plan's do not.)
        spec = tiny_spec(dataclasses.replace(ld.spec, equal_batches=equal))
        rehearse_node(spec, hosts, 0, plan_file)
    # An epoch of one access: its arrays (tier slots: none, a read-only -1) are views numba
    # types as contiguous, not strided: signatures of the planners' kernels of their own.
    for draws in (SHUFFLE, Weighted(np.ones(1), affinity=False)):
        one = PlanSpec(RunConfig(1, 1, 1, 2), BufferConfig(1), sampler=draws)
        HostPlanner(one, Hosts.grid(1, 1)).next()
        Planner(one).next_all()
    # ... and its plan file, proven and replayed (a resume's refill) as a Loader serving it
    # proves and replays one (a rank's window of one access, in a job of small batches).
    path = root / f"one-{os.getpid()}.plan.h5"
    plan_to_file(PlanSpec(RunConfig(1, 1, 1, 2), BufferConfig(1)), path)
    plan = load_plan(path)
    plan.validate(0)
    plan.rank(0).refill_at(1)


def _warm_signatures() -> None:
    """Compile (or load) each of :data:`SIGNATURES`."""
    from solar.io import bitshuffle, fused
    from solar.io.codeclibs import link_codec_libraries

    for symbols in (bitshuffle._SYMBOLS, fused._SYMBOLS):  # (the codecs' C functions, by name)
        link_codec_libraries(symbols)
    for name, sig in SIGNATURES:
        kernel_of(name).compile(argument_types(sig))


def kernel_of(name: str) -> Any:
    """The kernel (numba dispatcher) a :data:`SIGNATURES` entry names (``module.kernel``
    under ``solar.``)."""
    import importlib

    module, kernel = f"solar.{name}".rsplit(".", 1)
    return getattr(importlib.import_module(module), kernel)


def argument_types(sig: str) -> tuple[Any, ...]:
    """The numba types of a :data:`SIGNATURES` entry's arguments, parsed (nothing compiled)."""
    from numba import types

    argtypes = []
    for arg in sig.split():
        dtype, _, shape = arg.partition("[")
        t: Any = types.boolean if dtype == "bool" else getattr(types, dtype)
        if shape:  # "2C]ro": dimensions (default 1), layout, read-only
            inner, _, after = shape.partition("]")
            layout: Any = inner[-1]
            t = types.Array(t, int(inner[:-1] or 1), layout, readonly=after == "ro")
        argtypes.append(t)
    return tuple(argtypes)


def layouts() -> dict[str, dict[str, Any]]:
    """The stored layouts whose read and decode paths have kernels of their own, each as
    h5py's ``create_dataset`` keywords (``"npy"``: one ``.npy`` file a sample): chunks of one
    sample (the fused decode path, solar/io/fused.py) and of several (the shuffle filter's
    loop over a decompressed chunk's read-only bytes), the shuffle and bitshuffle filters'
    loops (bitshuffle where hdf5plugin writes it)."""
    out: dict[str, dict[str, Any]] = {
        "gzip+shuffle, a chunk a sample": dict(chunks=(1, 8, 8), compression="gzip",
                                               shuffle=True),
        "gzip+shuffle, chunks of 4 samples": dict(chunks=(4, 8, 8), compression="gzip",
                                                  shuffle=True),
        "npy": {},
    }  # fmt: skip
    try:
        import hdf5plugin
    except ImportError:  # (optional: only the bitshuffle filter's kernel goes unwarmed)
        return out
    out["bitshuffle(lz4), a chunk a sample"] = dict(
        chunks=(1, 8, 8), **hdf5plugin.Bitshuffle(cname="lz4")
    )
    return out


def _write_layout(root: Path, name: str, n: int) -> Path:
    """:func:`_write_data`'s samples stored as :func:`layouts` names: a file, or a directory
    of ``.npy`` files."""
    import h5py

    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, 8, 8)).astype(np.float32)
    tag = f"{os.getpid()}-{list(layouts()).index(name)}"
    if name == "npy":
        out = root / f"npy-{tag}"
        out.mkdir(exist_ok=True)
        for i in range(n):
            np.save(out / f"{i:03d}.npy", x[i])
        return out
    path = root / f"layout-{tag}.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x, **layouts()[name])
        f["y"] = rng.standard_normal((n, 2)).astype(np.float32)
    return path


def _warm_graph(root: Path, world: int) -> None:
    """A graph's kernels: generating one (``solar gen --preset graph``), converting an OGB
    directory of text files reordered for locality (``solar convert``), and Loaders of
    ``world`` ranks serving its features by neighbour sampling (the sampler's, the page mates'
    planning, the feature reads'), over its file and over its edges as PyG holds them."""
    from solar.graph import Graph, NeighborSampler, generate_graph, write_graph
    from solar.graph.reorder import reorder_nodes

    path = root / f"graph-{os.getpid()}.h5"
    generate_graph(path, 300, 6.0, 24, seed=1, train_fraction=0.5)
    g = Graph(path)
    src = np.repeat(np.arange(g.num_nodes), np.diff(g.indptr))
    # As OGB lays one out: text edges, and a node count, labels and a split of one number
    # a line (read from bytes, read-only: a signature of the parser's own).
    text = root / f"ogb-{os.getpid()}"
    (text / "split").mkdir(parents=True)
    np.savetxt(text / "edge.csv", np.stack([src, g.indices], axis=1), fmt="%d", delimiter=",")
    np.savetxt(text / "num-node-list.csv", [g.num_nodes], fmt="%d")
    labels, train = g.labels, g.train_idx
    assert labels is not None and train is not None  # (a generated graph has both)
    np.savetxt(text / "node-label.csv", labels, fmt="%d")
    np.savetxt(text / "split" / "train.csv", train, fmt="%d")
    with warnings.catch_warnings():  # (varying batches: these serve nobody)
        warnings.simplefilter("ignore", UserWarning)
        write_graph(text, root / f"text-{os.getpid()}.h5", undirected=True,
                    order=lambda h: reorder_nodes(h.indptr, h.indices), force=True)  # fmt: skip
        for rank in range(world):
            sampler = NeighborSampler(path, (3, 2), batch_size=8)
            Loader(path, keys=["features"], sampler=sampler, batch_size=8, epochs=2,
                   buffer=20, rank=rank, world_size=world).close()  # fmt: skip
        # The same graph as PyG holds it in memory (a Data's int64 edge_index, source then
        # target): its neighbours kept int64, the sampler's signature of their own.
        edges = {"edge_index": np.stack([g.indices, src]).astype(np.int64),
                 "num_nodes": g.num_nodes, "train_idx": g.train_idx}  # fmt: skip
        sampler = NeighborSampler(edges, (3, 2), batch_size=8)
        Loader(path, keys=["features"], sampler=sampler, batch_size=8, epochs=2,
               buffer=20).close()  # fmt: skip


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
    processes (each takes every ``jobs``-th configuration); then name, through ``progress``,
    the kernels of solar that none of them reached (:func:`solar.warm.unreached`)."""
    configs = common_configs()
    reached: set[str] = set()
    with measured() as w, tempfile.TemporaryDirectory(prefix="solar-warm-") as tmp:
        root = Path(tmp)
        _write_data(root, 40)
        if jobs <= 1:
            for cfg in configs:
                if progress is not None:
                    progress(_name(cfg))
                warm_config(cfg, root)
            reached = {k for k, n in signatures().items() if n}
        else:
            import multiprocessing as mp

            ctx = mp.get_context("spawn")  # a fresh interpreter each: no inherited threads
            with ctx.Pool(jobs) as pool:
                args = [(c, str(root)) for c in configs]
                for name, got in pool.imap_unordered(_warm_one, args):
                    reached |= got
                    if progress is not None:
                        progress(name)
    left = unreached(reached)
    if progress is not None and left:
        progress(f"not reached by these configurations ({len(left)}: compiled at first "
                 f"use): {', '.join(left)}")  # fmt: skip
    return w[0]


def _warm_one(arg: tuple[dict[str, Any], str]) -> tuple[str, set[str]]:
    cfg, root = arg
    warm_config(cfg, Path(root))
    return _name(cfg), {k for k, n in signatures().items() if n}


def _name(cfg: dict[str, Any]) -> str:
    if cfg.get("share") == "node":
        return f"{cfg['policy']} (node buffers of {cfg['world']} ranks: {len(NODE_KINDS)} kinds)"
    if "layout" in cfg:
        return f"{cfg['policy']} ({cfg['layout']})"
    if cfg["sampler"] == "neighbor":
        return f"a graph: generated, converted, neighbour sampling (P={cfg['world']})"
    if cfg["sampler"] == "signatures":
        return f"{len(SIGNATURES)} signatures of paths the configurations do not take"
    tier = ", tier" if cfg["tier"] else ""
    given = ", from a plan file" if cfg.get("plan_file") else ""
    return f"{cfg['policy']} ({cfg['sampler']}{tier}{given}, P={cfg['world']})"
