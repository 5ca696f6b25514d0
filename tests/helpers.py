"""Helpers shared by the tests (and by tests/mpi/'s scripts, which put tests/ on their path):
writing HDF5 files, reading reference bytes, the node buffer's skewed sampler."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import h5py
import numpy as np
import pytest

from solar import SolarError, Weighted
from solar.schedule.draw.draws import EpochDraws
from solar.schedule.draw.samplers import Trace


def proc_status(field: str) -> int:
    """This process's ``field`` of /proc/self/status (VmRSS, VmHWM, RssShmem, ...), bytes."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith(field + ":"))


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS (VmHWM) to its RSS now; False where Linux does not let."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def write_h5(path: Path, **datasets: np.ndarray) -> Path:
    """A file with one contiguous dataset per keyword."""
    with h5py.File(path, "w") as f:
        for name, data in datasets.items():
            f[name] = data
    return path


def skewed_weighted(n: int) -> Weighted:
    """``Weighted(affinity=False)`` over ``n`` samples, weights ``(1 + i) ** -0.8`` in a fixed
    shuffled order: draws repeat within and across ranks' batches (what a node buffer shares).
    A node plan file made for tests/mpi/node_plan_file.py must be made with this one."""
    weights = (1.0 + np.arange(n)) ** -0.8
    return Weighted(weights[np.random.default_rng(1).permutation(n)], affinity=False)


def checked_ids(
    batch: dict, ref: np.ndarray, want: np.ndarray | None = None, tag: object = None
) -> np.ndarray:
    """A batch's sample ids, after checking its rows ``x`` are h5py's bytes at them (``ref``:
    the dataset read whole) and, given ``want``, that they are those ids; ``tag`` names the
    step in a failure."""
    ids = batch["index"].numpy()
    if want is not None:
        assert np.array_equal(ids, want), tag
    assert batch["x"].numpy().tobytes() == ref[ids].tobytes(), tag
    return ids


def reference(paths: list[Path]) -> dict[str, np.ndarray]:
    """What h5py reads: every top-level dataset of ``paths``, concatenated along axis 0."""
    out: dict[str, list] = {}
    for p in paths:
        with h5py.File(p) as f:
            for k in f:
                out.setdefault(k, []).append(f[k][()])
    return {k: np.concatenate(v) for k, v in out.items()}


def every_batch(loader, epochs: range | list[int]) -> list[dict]:
    """Copies of every batch ``loader`` yields over ``epochs`` (its memory is reused after)."""
    out = []
    for e in epochs:
        loader.set_epoch(e)
        out += [{k: v.clone() if hasattr(v, "clone") else v for k, v in b.items()}
                for b in loader]  # fmt: skip
    return out


def resumed_batches(make, epoch: int, served: int, epochs: list[int]) -> list[dict]:
    """Copies of the batches of a Loader ``make()`` resumed (``load_state_dict``) from the
    state another one saved after serving ``served`` batches of ``epoch``: the rest of
    ``epochs`` (from ``epoch``)."""
    with make() as ld:
        ld.set_epoch(epoch)
        it = iter(ld)
        for _ in range(served):
            next(it)
        state = ld.state_dict()
    with make() as ld:
        ld.load_state_dict(state)
        return every_batch(ld, epochs)


@contextlib.contextmanager
def skip_without_o_direct() -> Iterator[None]:
    """Skip the test where the file system refuses O_DIRECT (tmpfs, some overlays)."""
    try:
        yield
    except SolarError as exc:
        if "O_DIRECT" in str(exc):
            pytest.skip(str(exc))
        raise


def kept_part(parts, draws, j):
    """``draws`` with only part ``j``'s ids of ``parts`` (each batch in its order): the
    oracle of ``Parts.split``, one part at a time."""
    mine = parts.of(draws.ids) == j
    kept = np.zeros(mine.size + 1, np.int64)
    np.cumsum(mine, out=kept[1:])
    return EpochDraws(draws.ids[mine], kept[draws.offsets])


def paged_graph(folder: Path) -> tuple[Path, object, np.ndarray]:
    """A graph of 1999 nodes (a prime) of 24 floats (96 B: 42 rows a page, the last straddling
    two), 30 % of them seeds, in ``folder``: its path, its features' page layout, the features."""
    from solar.graph import generate_graph
    from solar.schedule.draw.pagemates import PageLayout

    path = folder / "g.h5"
    generate_graph(path, 1999, 6.0, 24, seed=5, train_fraction=0.3)
    with h5py.File(path) as f:
        offset = f["features"].id.get_offset()
        feats = f["features"][()]
    return path, PageLayout(int(offset), feats[0].nbytes), feats


def planned_reads(spec, rank: int, roster, member: int, keep: int = 1) -> tuple[int, int]:
    """Rows ``member`` of trainer ``rank``'s plan (``spec``: the trainer's; ``roster``: its
    workers by epoch) reads and hits over the run, by its own plan (a member's buffer:
    solar/schedule/plans/members.py); its batches checked, step for step, against the
    trainer's alone (the run without workers), and another member's steps to read and keep
    nothing here."""
    from solar.runtime.steps import Steps, planned_rows
    from solar.schedule.plans.members import member_spec
    from solar.schedule.plans.stream import RankStream

    alone_stream = RankStream(spec, rank)
    alone = Steps(spec, rank, alone_stream)

    def check(k: int, steps, plan) -> None:
        alone.enter(k)
        assert np.array_equal(plan.samples, alone.plan(k).samples), (rank, member, k)
        if not steps.owns(k):  # another member's: nothing read or kept here
            assert plan.read_rows.size == plan.hit_rows.size == plan.admit_rows.size == 0

    try:
        mine = member_spec(spec, rank, keep, roster, member)
        reads, hits, _ = planned_rows(spec, rank, mine, each=check)
    finally:
        alone_stream.close()
    return reads, hits


class EveryRanksTrace(Trace):
    """A Trace whose rank_epoch gives every rank's batches (it should leave the others'
    empty): what a rank planned alone must refuse."""

    def rank_epoch(self, run, epoch, rank):
        return self.epoch(run, epoch)
