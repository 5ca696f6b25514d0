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

from solar.config import ReaderConfig
from solar.loader import Loader
from solar.options import ExpertConfig, MemoryConfig, PlanningConfig
from solar.schedule.draw.samplers import Weighted
from solar.schedule.keep.grouping import Hosts
from solar.schedule.plans.plan import plan_to_file
from solar.warm import Warmth, measured, rehearse_node, tiny_spec

# The node buffers ``solar warm`` rehearses, on a host of 2 ranks with the solar policy:
# (sampler, tier, a node plan file, equal batches). Weighted(affinity=False) stands for every
# sampler that fixes each rank's batch (a GNN's neighbour sampler, a Trace).
NODE_KINDS = (("traced", False, False, False), ("traced", True, False, False),
              ("traced", False, True, False), ("shuffle", False, False, False),
              ("shuffle", False, False, True))  # fmt: skip


def common_configs() -> list[dict[str, Any]]:
    """What ``solar warm`` rehearses: every policy of each sampler, with and without a tier,
    one rank and several, on float32 samples in one HDF5 file and in one-sample files; the
    solar policy served from a plan file (``solar plan -o``, then
    ``PlanningConfig(plan=FILE)``: the plan's writing and its proof, as ``solar demo`` runs);
    and, first (the longest), one buffer per host of :data:`NODE_KINDS`, in one process
    (their kernels compiled once)."""
    from solar.schedule.policy import POLICIES, TIERED, TRACE_POLICIES

    out: list[dict[str, Any]] = [dict(world=2, policy="solar", share="node", tier=False,
                                      sampler="node kinds")]  # fmt: skip
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
    if cfg.get("share") == "node":
        return f"{cfg['policy']} (node buffers of {cfg['world']} ranks: {len(NODE_KINDS)} kinds)"
    tier = ", tier" if cfg["tier"] else ""
    given = ", from a plan file" if cfg.get("plan_file") else ""
    return f"{cfg['policy']} ({cfg['sampler']}{tier}{given}, P={cfg['world']})"
