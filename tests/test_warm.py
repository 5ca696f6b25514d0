"""No kernel compiles inside an epoch: a Loader compiles (or loads) every numba kernel its
epochs call when it is constructed (solar/warm.py). Proven without timing, by numba's own
records: each kernel's signatures and numba's compile events, before and after whole runs,
each case in a fresh process (one where nothing has been compiled or loaded yet): forked from
one that has imported what the cases import and loaded no kernel (tests/fresh.py), so that
each case does not import torch again."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator

import h5py
import numpy as np
import pytest
from fresh import Run, zygote

from solar.options import ExpertConfig, LoaderConfig, PlanningConfig
from solar.warm import dispatchers, head, tiny_spec

# Each case: Loader keyword arguments, a record's as a dict (``data``: the case's data).
# than a rehearsal's, sizes that do not divide, two ranks of one job, several epochs.
CASES = {
    "one file, solar, rank 1 of 2": dict(data="one", world_size=2, rank=1),
    "gzip chunks, a second tier": dict(data="gzip", memory={"tier": "TIER", "tier_size": 40}),
    "one-sample files, nopfs and lru": dict(
        data="files", reader={"one_per_file": True}, planning={"policy": "nopfs"}
    ),
    # The control: without warming, kernels do compile (or load) inside the epochs.
    "control: warm=False": dict(data="one", expert={"warm": False}),
    ".npy files, weighted, a plan file": dict(
        data="npy", reader={"one_per_file": True}, sampler="weighted", plan_file=True
    ),
    # Small feature rows: the planner keeps their page mates (solar.schedule.draw.pagemates).
    "a graph's features, neighbour sampling": dict(data="graph", sampler="neighbor"),
    # One buffer per host (a host of one rank here): the node planner's kernels, and a tier's.
    "a node buffer, weighted without affinity, a tier": dict(
        data="one", memory={"share": "node", "tier": "TIER", "tier_size": 40}, sampler="traced"
    ),
}

CHILD = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from solar import (ExpertConfig, Loader, MemoryConfig, NeighborSampler, PlanningConfig,
                       ReaderConfig, Weighted)
    from solar.schedule.plans.plan import plan_to_file
    from solar.warm import TALLY, signatures

    kw = json.loads(sys.argv[1])
    records = {"reader": ReaderConfig, "memory": MemoryConfig, "planning": PlanningConfig,
               "expert": ExpertConfig}
    kw.update({k: make(**kw[k]) for k, make in records.items() if k in kw})
    sampler = kw.pop("sampler", None)
    if sampler in ("weighted", "traced"):
        kw["sampler"] = Weighted(1.0 / (1.0 + np.arange(kw.pop("n"))),
                                 affinity=sampler == "weighted")
    if sampler == "neighbor":
        kw.update(sampler=NeighborSampler(kw["paths"], (3, 2), batch_size=kw["batch_size"]),
                  keys=["features"], n=0)
    kw.pop("n", None)
    if kw.pop("plan_file", False):
        made = Loader(**kw, expert=ExpertConfig(warm=False))
        kw["planning"] = PlanningConfig(plan=plan_to_file(made.spec, sys.argv[2]))
        made.close()
    loaders = [Loader(**kw)]
    if "planning" in kw and kw["planning"].policy == "nopfs":  # a second policy, one process
        loaders.append(Loader(**{**kw, "planning": PlanningConfig(policy="lru"),
                                 "memory": MemoryConfig()}))
    before, compiles = signatures(), TALLY.count
    served = 0
    for ld in loaders:
        for e in range(ld.run.epochs):
            ld.set_epoch(e)
            for b in ld:
                served += len(b["n_id"] if "n_id" in b else b["index"])  # a graph's: n_id
    after = signatures()
    print(json.dumps({
        "new": {k: after[k] - before[k] for k in after if after[k] != before[k]},
        "compiled": TALLY.count - compiles,
        "warm": [ld.stats.warm_seconds for ld in loaders],
        "served": served,
        "pages": [ld.spec.pages is not None for ld in loaders],
    }))
    """
)


# Imported once: each case runs in a child forked from the process that imported these and
# loaded no kernel (checked), so it starts with nothing compiled or loaded.
PRELOAD = textwrap.dedent(
    """
    import numpy as np
    from solar import (ExpertConfig, Loader, MemoryConfig, NeighborSampler, PlanningConfig,
                       ReaderConfig, Shuffle, Weighted)
    from solar.precompile import common_configs, warm_config
    from solar.schedule.plans.plan import plan_to_file
    from solar.warm import TALLY, signatures

    loaded = {k: v for k, v in signatures().items() if v}
    assert not loaded and TALLY.count == 0, f"kernels loaded at import: {loaded}"
    """
)


@pytest.fixture(scope="module")
def fresh() -> Iterator[Run]:
    with zygote(PRELOAD) as run:
        yield run


def _data(tmp_path, kind: str, n: int) -> str:
    if kind == "graph":  # 96 B feature rows, 42 to a page
        from solar.graph import generate_graph

        generate_graph(tmp_path / "g.h5", n, 6.0, 24, seed=1, train_fraction=0.5)
        return str(tmp_path / "g.h5")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((n, 6, 5)).astype(np.float32)
    y = rng.integers(0, 9, (n, 3)).astype(np.int16)
    if kind in ("one", "gzip"):
        path = tmp_path / "d.h5"
        opts = dict(chunks=True, compression="gzip", shuffle=True) if kind == "gzip" else {}
        with h5py.File(path, "w") as f:
            f.create_dataset("x", data=x, **opts)
            f.create_dataset("y", data=y, **opts)
        return str(path)
    root = tmp_path / "d"
    for i in range(n):
        sub = root / f"{i % 3:03d}"
        sub.mkdir(parents=True, exist_ok=True)
        if kind == "npy":
            np.save(sub / f"{i:04d}.npy", x[i])
        else:
            with h5py.File(sub / f"{i:04d}.h5", "w") as f:
                f["x"], f["y"] = x[i], y[i]
    return str(root)


@pytest.mark.parametrize("case", CASES)
def test_no_kernel_compiles_inside_an_epoch(tmp_path, case, fresh):
    kw = dict(CASES[case])
    n = 157
    kw.update(paths=_data(tmp_path, kw.pop("data"), n), batch_size=12, epochs=3, buffer=30, n=n)
    if kw.get("memory", {}).get("tier") == "TIER":
        (tmp_path / "nvme").mkdir()
        kw["memory"] = {**kw["memory"], "tier": str(tmp_path / "nvme")}
    result = fresh(CHILD, json.dumps(kw), str(tmp_path / "plan.h5"), out=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["served"] >= 3 * n // kw.get("world_size", 1) - 3 * 12  # the epochs ran
    assert all(out["pages"]) == (kw.get("sampler") == "neighbor")  # page mates planned
    if kw.get("expert", {}).get("warm") is False:
        assert "solar.cache.slots._copy_rows" in out["new"], out
        return
    assert out["new"] == {} and out["compiled"] == 0, out
    assert all(w > 0 for w in out["warm"])


# What a script run by _after_warm may call: serve a Loader's epochs, report what changed.
AFTER_WARM = textwrap.dedent(
    """
    import json
    from solar.warm import TALLY, signatures

    def serve(ld):
        for e in range(ld.run.epochs):
            ld.set_epoch(e)
            for _ in ld:
                pass
        ld.close()

    def report(before, compiles):
        after = signatures()
        print(json.dumps({"new": {k: after[k] - before[k] for k in after
                                  if after[k] != before[k]},
                          "compiled": TALLY.count - compiles}))
    """
)

NODE_AFTER_WARM = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import numpy as np
    from solar import ExpertConfig, Loader, MemoryConfig, Shuffle, Weighted
    from solar.precompile import common_configs, warm_config
    from solar.warm import TALLY, signatures

    root = Path(sys.argv[1])
    for cfg in common_configs():
        if cfg.get("share") == "node":
            warm_config(cfg, root)
    before, compiles = signatures(), TALLY.count
    weights = 1.0 / (1.0 + np.arange(40))
    for sampler, memory in ((Weighted(weights, affinity=False),
                             MemoryConfig(share="node", tier=str(root), tier_size=9)),
                            (Shuffle(), MemoryConfig(share="node"))):
        ld = Loader(root / "data.h5", batch_size=6, epochs=4, buffer=11, sampler=sampler,
                    memory=memory, expert=ExpertConfig(warm=False))
        serve(ld)
    report(before, compiles)
    """
)


def test_solar_warm_rehearses_a_node_buffers_kernels(tmp_path, fresh):
    """``solar warm`` rehearses node buffers in one process, without MPI: after its node
    configurations, a node job of other sizes (unwarmed: a host of one rank here, planning,
    its tier and serving) calls no kernel signature they did not compile or load. (Without
    their node rehearsal it would: the node planner's and the host barrier's kernels.)"""
    out = _after_warm(fresh, NODE_AFTER_WARM, tmp_path)
    assert out["new"] == {} and out["compiled"] == 0, out


def _after_warm(fresh: Run, script: str, root) -> dict:
    """``script``'s report (kernel signatures new after its warm-up, kernels compiled), run
    in a fresh process over ``solar warm``'s generated data in ``root``."""
    from solar.precompile import _write_data

    _write_data(root, 40)
    result = fresh(AFTER_WARM + script, str(root), out=root)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


GRAPH_AFTER_WARM = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    import numpy as np
    from solar import ExpertConfig, Loader, NeighborSampler
    from solar.graph import Graph, generate_graph
    from solar.graph.csr import check_csr
    from solar.precompile import common_configs, warm_config
    from solar.warm import TALLY, signatures

    root = Path(sys.argv[1])
    for cfg in common_configs():
        if cfg["sampler"] == "neighbor":
            warm_config(cfg, root)
    before, compiles = signatures(), TALLY.count
    path = root / "other.h5"
    generate_graph(path, 157, 5.0, 16, seed=3, train_fraction=0.4)
    g = Graph(path)
    target = np.repeat(np.arange(g.num_nodes), np.diff(g.indptr))
    edges = {"edge_index": np.stack([g.indices, target]).astype(np.int64),
             "num_nodes": g.num_nodes, "train_idx": g.train_idx}
    for graph in (path, edges):  # int32 neighbours, and PyG's int64 ones
        sampler = NeighborSampler(graph, (2, 2), batch_size=6)
        serve(Loader(path, keys=["features"], sampler=sampler, batch_size=6, epochs=2,
                     buffer=30, expert=ExpertConfig(warm=False)))
    # A host's sealed copy (Graph.hold with a communicator): its parts checked as read-only
    # views of mapped bytes.
    for indices in (g.indices, edges["edge_index"][0]):
        check_csr(*(np.frombuffer(a.tobytes(), a.dtype) for a in (g.indptr, indices)), "sealed")
    report(before, compiles)
    """
)


def test_solar_warm_rehearses_a_graphs_read_only_topologies(tmp_path, fresh):
    """A graph's topology is read-only wherever it is held (a rank's private copy, a host's
    sealed one) and int32 or int64 (PyG's edge_index): after ``solar warm``'s graph
    configuration, sampling and serving another graph of either kind, and checking a sealed
    copy's read-only views, call no kernel signature it did not compile or load (numba
    specialises on the read-only flag and the dtype: before, the test suite compiled both)."""
    out = _after_warm(fresh, GRAPH_AFTER_WARM, tmp_path)
    assert out["new"] == {} and out["compiled"] == 0, out


DEMO_AFTER_WARM = textwrap.dedent(
    """
    import json, sys, warnings
    from pathlib import Path
    from solar import Loader, PlanningConfig
    from solar.cli import cli
    from solar.precompile import common_configs, warm_config
    from solar.warm import TALLY, signatures

    root = Path(sys.argv[1])
    for cfg in common_configs():  # (of solar warm's, those the demo's kind of run needs)
        if cfg.get("plan_file") and cfg["sampler"] == "shuffle":
            warm_config(cfg, root)
    before, compiles = signatures(), TALLY.count
    # solar demo's job, smaller: `solar plan -o`, then each rank's Loader serving the file.
    plan = root / "demo.plan.h5"
    cli.main(["plan", str(root / "data.h5"), "-P", "4", "-B", "3", "-E", "3", "-C", "7",
              "--variable-batches", "-o", str(plan)], "solar", standalone_mode=False)
    for rank in range(4):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            ld = Loader(root / "data.h5", batch_size=3, epochs=3, buffer=7, rank=rank,
                        world_size=4, planning=PlanningConfig(plan=plan))
        serve(ld)
    report(before, compiles)
    """
)


def test_solar_warm_covers_the_demos_job(tmp_path, fresh):
    """``make demo`` after ``solar warm`` compiles nothing: after the configurations ``solar
    warm`` serves from a plan file with Shuffle (a subset of its own), the demo's job
    (``solar plan -o`` of 4 ranks, then each rank's Loader serving that file, of other sizes)
    calls no kernel signature they did not compile or load. (Before they were warmed, the
    demo compiled the plan summary's and the plan proof's kernels: bench/demo_first_run.py
    counts it on a fresh cache.)"""
    out = _after_warm(fresh, DEMO_AFTER_WARM, tmp_path)
    assert out["new"] == {} and out["compiled"] == 0, out


def test_a_rehearsal_keeps_the_runs_choices(small_h5):
    from solar import Loader, Weighted

    with Loader(small_h5, batch_size=8, epochs=9, buffer=20, world_size=3, rank=2,
                sampler=Weighted(np.ones(103), num_samples=90), planning=PlanningConfig(slack=0.5),
                expert=ExpertConfig(warm=False)) as ld:  # fmt: skip
        tiny = tiny_spec(ld.spec)
    run = tiny.run
    assert (run.world_size, run.epochs, run.seed, tiny.policy) == (3, 3, 0, "solar")
    assert tiny.buffer.slack == 0.5 and 0 < tiny.buffer.capacity < 20
    assert isinstance(tiny.sampler, Weighted) and run.draws is not None
    assert run.num_samples < 103 and run.batch_size <= 4
    first = head(ld.info, 40)
    assert first.num_samples == 40 and first.files == ld.info.files


def test_the_rehearsal_is_placed_on_the_real_loaders_communicator(small_h5):
    """The warm-up's tiny Loader is built as any Loader, on the real one's communicator and
    place (a Loader of a sub-communicator rehearses on it; nothing checks its place against
    the job's group), its rows not exchanged (equal_batches False)."""
    import dataclasses

    from solar import Loader
    from solar.warm import rehearse_loader

    seen = []

    def make(config):  # the record the tiny Loader is built of; run here without the comm
        seen.append(config)
        return Loader.from_config(dataclasses.replace(config, comm=None))

    with Loader(small_h5, batch_size=4, epochs=2, buffer=8, rank=1, world_size=2,
                expert=ExpertConfig(warm=False)) as ld:  # fmt: skip
        comm = object()  # (the real Loader's, as its setup holds it)
        args = LoaderConfig(paths=ld.info, batch_size=4, epochs=2, buffer=8, rank=1, world_size=2)
        rehearse_loader(args, dataclasses.replace(ld._setup, comm=comm), make)
    (tiny,) = seen
    assert tiny.comm is comm and (tiny.rank, tiny.world_size) == (1, 2)
    assert tiny.planning.equal_batches is False and not tiny.expert.warm


def test_every_kernel_is_found():
    found = dispatchers()
    for name in ("solar.cache.slots._copy_rows", "solar.schedule.keep.belady._solar_steps",
                 "solar.schedule.plans.rankplan._replay",
                 "solar.io.executor._iov_runs"):  # fmt: skip
        assert name in found


def test_each_warm_signature_names_a_kernel_and_its_arguments():
    """solar/precompile.py's SIGNATURES are typed by hand: each names a numba kernel, parses
    (nothing compiled here), and gives as many arguments as the kernel has parameters (a
    signature left behind by a kernel's change would only cost ``solar warm`` a compile)."""
    import inspect

    from numba.core.dispatcher import Dispatcher
    from numba.core.types import Type

    from solar.precompile import SIGNATURES, argument_types, kernel_of

    assert SIGNATURES
    for name, sig in SIGNATURES:
        kernel = kernel_of(name)
        assert isinstance(kernel, Dispatcher), name
        argtypes = argument_types(sig)
        assert all(isinstance(t, Type) for t in argtypes), name
        assert len(argtypes) == len(inspect.signature(kernel.py_func).parameters), name
    with pytest.raises(AttributeError):  # (a misspelt type is not taken for another)
        argument_types("int64[C] int46")


def test_what_compiling_left_is_frozen_after_a_rehearsal_that_compiled(small_h5, monkeypatch):
    """A warm-up that compiled collects and freezes what numba left (so the epochs' garbage
    collections do not walk it again); one that only loaded kernels leaves the collector be."""
    import gc

    import solar.warm as warm
    from solar import Loader

    class Tally:  # numba's tally: each look finds ``step`` more kernels compiled
        seconds = 0.0

        def __init__(self, step: int) -> None:
            self._count, self._step = 0, step

        @property
        def count(self) -> int:
            self._count += self._step
            return self._count

    settled = []
    # (The Loader's rehearsal, solar.warm.rehearse_loader, settles what it compiled.)
    monkeypatch.setattr(warm, "settle_compiler_garbage", lambda: settled.append(1))
    monkeypatch.setattr(warm, "TALLY", Tally(0))
    Loader(small_h5, batch_size=4, epochs=2, buffer=8).close()
    assert settled == []  # every kernel came from the cache
    monkeypatch.setattr(warm, "TALLY", Tally(1))
    Loader(small_h5, batch_size=4, epochs=2, buffer=8).close()
    assert settled == [1]
    monkeypatch.undo()
    try:
        warm.settle_compiler_garbage()
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
