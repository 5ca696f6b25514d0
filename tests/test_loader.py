"""The runtime serves, for whole runs, exactly the bytes h5py reads at each index."""

from __future__ import annotations

import multiprocessing as mp
import pickle
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import every_batch, reference, skip_without_o_direct

from solar import Loader, PlanMismatchError, ReaderConfig, SolarError
from solar.loader import LoaderStats
from solar.options import ExpertConfig, LoaderConfig, MemoryConfig, PlanningConfig

N = 103  # prime: no batch size divides it


def _write(path: Path, lo: int, hi: int, **layout) -> Path:
    rng = np.random.default_rng(lo)
    with h5py.File(path, "w") as f:
        f.create_dataset("img", data=rng.standard_normal((hi - lo, 5, 6), np.float32), **layout)
        lab = np.arange(lo, hi, dtype=np.int64)[:, None] * [1, -1]
        if isinstance(layout.get("chunks"), tuple):
            layout = {**layout, "chunks": (layout["chunks"][0], 2)}
        f.create_dataset("lab", data=lab, **layout)
        if not layout:
            f.create_dataset("big", data=rng.integers(0, 99, (hi - lo, 3)).astype(">i4"))
    return path


@pytest.fixture(params=["contiguous", "chunked", "chunked-2d", "gzip", "multi-file"])
def dataset(request, tmp_path) -> list[Path]:
    kind = request.param
    if kind == "contiguous":
        return [_write(tmp_path / "d.h5", 0, N)]
    if kind == "chunked":
        return [_write(tmp_path / "d.h5", 0, N, chunks=True)]
    if kind == "chunked-2d":  # chunks that also cut the sample dimensions
        path = tmp_path / "d.h5"
        rng = np.random.default_rng(1)
        with h5py.File(path, "w") as f:
            f.create_dataset(
                "img", data=rng.standard_normal((N, 5, 6), np.float32), chunks=(7, 2, 4)
            )
            f.create_dataset("lab", data=np.arange(N), chunks=(10,))
        return [path]
    if kind == "gzip":
        return [_write(tmp_path / "d.h5", 0, N, chunks=(6, 5, 6), compression="gzip")]
    return [
        _write(tmp_path / "a.h5", 0, 40),
        _write(tmp_path / "b.h5", 40, 73),
        _write(tmp_path / "c.h5", 73, N),
    ]


def run_all(loaders: list[Loader], epochs: range, ref: dict) -> list[list[np.ndarray]]:
    """Iterate every rank through ``epochs``; check bytes and exactly-once; return indices."""
    served = []
    for e in epochs:
        seen = []
        for ld in loaders:
            ld.set_epoch(e)
            steps = 0
            for batch in ld:
                idx = batch["index"].numpy()
                for key, want in ref.items():
                    got = batch[key].numpy()
                    assert got.dtype == want.dtype.newbyteorder("=")
                    assert got.tobytes() == want[idx].astype(got.dtype).tobytes(), (key, e)
                seen.append(idx)
                steps += 1
            assert steps == len(ld)
        every = np.concatenate(seen)
        assert np.array_equal(np.sort(every), np.arange(N)), e
        served.append(seen)
    return served


@pytest.mark.parametrize("world", [1, 3])
def test_whole_run_is_byte_identical_and_matches_the_plan(dataset, world):
    ref = reference(dataset)
    loaders = [
        Loader(
            dataset,
            batch_size=4,
            epochs=3,
            buffer=12,
            rank=r,
            world_size=world,
            reader=ReaderConfig(threads=3),
        )
        for r in range(world)
    ]
    run_all(loaders, range(3), ref)
    for ld in loaders:
        planned = ld.plan.stats[ld.rank]
        served = ld.stats.epochs.values()
        assert sum(s.hits for s in served) == planned.hits > 0
        assert sum(s.reads for s in served) == planned.reads
        assert sum(s.rebuild_seconds for s in served) == 0
        ld.close()


def test_drop_last_and_no_read_ahead(tmp_path):
    paths = [_write(tmp_path / "d.h5", 0, N)]
    ref = reference(paths)
    ld = Loader(
        paths, batch_size=5, epochs=2, buffer=30, drop_last=True, reader=ReaderConfig(read_ahead=0)
    )
    for e in range(2):
        ld.set_epoch(e)
        idx = np.concatenate([b["index"].numpy() for b in ld])
        assert idx.size == 100 and np.unique(idx).size == 100
        ld.set_epoch(e)  # the same epoch again, on purpose
        for b in ld:
            assert np.array_equal(b["img"].numpy(), ref["img"][b["index"].numpy()])


def test_resume_mid_epoch_reproduces_the_rest(tmp_path):
    paths = [_write(tmp_path / "d.h5", 0, N, chunks=(4, 5, 6))]
    kw = {"batch_size": 3, "epochs": 3, "buffer": 15, "world_size": 2, "rank": 1}
    whole = Loader(paths, **kw)
    expected = every_batch(whole, range(3))

    first = Loader(paths, **kw)
    got = []
    first.set_epoch(0)
    got += list(first)
    first.set_epoch(1)
    for i, b in enumerate(first):
        got.append(b)
        if i == 6:
            break
    state = pickle.loads(pickle.dumps(first.state_dict()))
    first.close()

    resumed = Loader(paths, **kw)
    resumed.load_state_dict(state)
    for e in (1, 2):
        resumed.set_epoch(e)
        got += list(resumed)
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            assert np.array_equal(a[k].numpy(), b[k].numpy())
    # The rebuilt buffer serves exactly the hits the plan promised.
    rp = resumed.plan.rank(1)
    steps = rp.steps()
    later = steps >= state["next_step"]
    served_hits = sum(s.hits for s in resumed.stats.epochs.values())
    assert served_hits == int(rp.hit[later].sum())
    assert resumed.stats.epochs[1].rebuild_seconds > 0


def test_jumping_epochs_rebuilds_the_buffer(tmp_path):
    paths = [_write(tmp_path / "d.h5", 0, N)]
    ref = reference(paths)
    ld = Loader(paths, batch_size=4, epochs=4, buffer=40)
    run_all([ld], range(1), ref)
    run_all([ld], range(3, 4), ref)  # skip epochs 1-2
    run_all([ld], range(3, 4), ref)  # and repeat epoch 3
    epoch3 = ld.plan.rank(0).hit[ld.plan.rank(0).steps() >= 3 * len(ld)].sum()
    assert ld.stats.epochs[3].hits == 2 * epoch3


def test_direct_io_is_byte_identical(tmp_path):
    paths = [_write(tmp_path / "d.h5", 0, N)]
    with skip_without_o_direct():
        ld = Loader(paths, batch_size=4, epochs=2, buffer=20, reader=ReaderConfig(direct_io=True))
        run_all([ld], range(2), reference(paths))


def _iterate_epoch(ld: Loader, q) -> None:
    ld.set_epoch(1)
    ref = reference(list(ld.info.files))
    ok, idx = True, []
    for b in ld:
        i = b["index"].numpy()
        idx.append(i)
        ok &= bool(np.array_equal(b["img"].numpy(), ref["img"][i]))
    q.put((ok, np.concatenate(idx).tolist()))


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_loader_works_in_a_forked_or_spawned_process(tmp_path, method):
    paths = [_write(tmp_path / "d.h5", 0, N)]
    ld = Loader(paths, batch_size=4, epochs=2, buffer=20)
    ld.set_epoch(0)
    list(ld)  # the parent has run an epoch, threads and descriptors included
    check_child_serves_epoch_1(ld, method)


def check_child_serves_epoch_1(ld: Loader, method: str) -> None:
    """A child process (forked or spawned) serves epoch 1 with h5py's bytes, as the parent."""
    ctx = mp.get_context(method)
    q = ctx.Queue()
    p = ctx.Process(target=_iterate_epoch, args=(ld, q))
    p.start()
    ok, idx = q.get(timeout=120)
    p.join(timeout=60)
    assert p.exitcode == 0 and ok
    ld.set_epoch(1)
    assert idx == np.concatenate([b["index"].numpy() for b in ld]).tolist()


def test_a_plan_for_another_run_or_dataset_is_refused(tmp_path):
    a = [_write(tmp_path / "a.h5", 0, N)]
    b = [_write(tmp_path / "b.h5", 0, N + 1)]
    plan_a = Loader(a, batch_size=4, epochs=2, buffer=10).plan
    path = plan_a.save(tmp_path / "a.plan.h5")
    # Its own run: accepted.
    Loader(a, batch_size=4, epochs=2, buffer=10, planning=PlanningConfig(plan=path))
    with pytest.raises(PlanMismatchError, match="num_samples"):
        Loader(b, batch_size=4, epochs=2, buffer=10, planning=PlanningConfig(plan=path))
    with pytest.raises(PlanMismatchError, match="epochs 2 \\(expected 3\\)"):
        Loader(a, batch_size=4, epochs=3, buffer=10, planning=PlanningConfig(plan=path))
    ld = Loader(a, batch_size=4, epochs=2, buffer=10)
    with pytest.raises(SolarError, match="another dataset or run"):
        ld.load_state_dict({**ld.state_dict(), "fingerprint": "0" * 64, "order": "0" * 64})


def test_truncated_data_stops_with_a_message(tmp_path):
    path = _write(tmp_path / "d.h5", 0, N)
    ld = Loader([path], batch_size=4, epochs=1, buffer=0, keys=["img"])
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)
    with pytest.raises(SolarError, match=r"short read|truncated"):
        list(ld)


def test_a_buffer_beyond_memory_stops_with_a_message(tmp_path):
    path = tmp_path / "huge.h5"
    with h5py.File(path, "w") as f:  # 4 TiB of samples, none written: a tiny file
        f.create_dataset("img", shape=(2**20, 1024, 1024), dtype=np.float32)
    with pytest.raises(SolarError, match=r"buffer: .* GiB exceed the .* GiB of memory available"):
        Loader([path], batch_size=4, epochs=1, buffer="1TiB")
    # More than the dataset holds is not more than it needs: clamped to N slots.
    small = _write(tmp_path / "d.h5", 0, N)
    ld = Loader([small], batch_size=4, epochs=2, buffer="64TiB")
    run_all([ld], range(2), reference([small]))
    assert ld.buffer.capacity == N


def test_stats_json_lines(tmp_path):
    ld = Loader([_write(tmp_path / "d.h5", 0, N)], batch_size=4, epochs=2, buffer=10)
    for e in range(2):
        ld.set_epoch(e)
        list(ld)
    lines = ld.stats.json_lines().splitlines()
    assert len(lines) == 2 * len(ld)
    assert isinstance(ld.stats, LoaderStats)
    assert sum(s.samples for s in ld.stats.epochs.values()) == 2 * N


def test_batches_kept_by_the_trainer_are_never_overwritten(tmp_path):
    paths = [_write(tmp_path / "d.h5", 0, N)]
    ref = reference(paths)
    ld = Loader(paths, batch_size=4, epochs=3, buffer=N, reader=ReaderConfig(read_ahead=2))
    kept, views = [], []
    for e in range(3):
        ld.set_epoch(e)
        for i, b in enumerate(ld):
            if i % 3 == 0:
                kept.append(b)  # the whole batch
            elif i % 3 == 1:
                views.append((b["index"].clone(), b["img"][1:].numpy()))  # only a view
    for b in kept:
        assert np.array_equal(b["img"].numpy(), ref["img"][b["index"].numpy()])
    for idx, img in views:
        assert np.array_equal(img, ref["img"][idx.numpy()[1:]])
    # Batches the trainer drops are reused: memory stays bounded by the read-ahead.
    config = ReaderConfig(read_ahead=2)
    dropped = Loader(paths, batch_size=4, epochs=3, buffer=20, reader=config)
    for e in range(3):
        dropped.set_epoch(e)
        for _ in dropped:
            pass
    assert (
        len(dropped._pipeline.get().memory.raw) <= 4 + 3
    )  # read_ahead 2, but 16 samples at batch 4: 4 steps


# -- regressions found in review ---------------------------------------------------------------
def _check(batches, ref):
    for b in batches:
        assert np.array_equal(b["img"].numpy(), ref["img"][b["index"].numpy()])


def test_a_failed_refill_never_serves_stale_slots(tmp_path):
    # The files go away and come back with their directory: a file renamed itself moves its
    # ctime, and is then refused like a rewrite with its mtime put back (tests/test_identity.py).
    (tmp_path / "d").mkdir()
    paths = [_write(tmp_path / "d" / "a.h5", 0, 50), _write(tmp_path / "d" / "b.h5", 50, N)]
    ref = reference(paths)
    ld = Loader(paths, batch_size=4, epochs=3, buffer=90)
    ld.set_epoch(1)
    for i, _ in enumerate(ld):
        if i == 5:
            break
    state = ld.state_dict()
    ld.close()
    (tmp_path / "d").rename(tmp_path / "away")
    ld.set_epoch(2)
    with pytest.raises(SolarError):
        next(iter(ld))
    (tmp_path / "away").rename(tmp_path / "d")
    ld.load_state_dict(state)
    _check(list(ld), ref)


def test_two_live_iterators_both_serve_the_right_bytes(tmp_path):
    paths = [_write(tmp_path / "d.h5", 0, N)]
    ref = reference(paths)
    ld = Loader(paths, batch_size=4, epochs=3, buffer=40)
    ld.set_epoch(1)
    a = iter(ld)
    first = [next(a), next(a)]
    ld.set_epoch(2)
    b = iter(ld)
    _check([next(b)], ref)
    _check(first + list(a), ref)


def test_resuming_after_an_epochs_last_step_starts_the_next_epoch(tmp_path):
    paths = [_write(tmp_path / "d.h5", 0, N)]
    ld = Loader(paths, batch_size=4, epochs=3, buffer=10)
    ld.set_epoch(0)
    list(ld)
    state = ld.state_dict()
    assert state["epoch"] == 1
    resumed = Loader(paths, batch_size=4, epochs=3, buffer=10)
    resumed.load_state_dict(state)
    served = []
    for e in range(state["epoch"], 3):
        resumed.set_epoch(e)
        served += list(resumed)
    assert len(served) == 2 * len(resumed)
    for bad in ({**state, "epoch": 9}, {k: v for k, v in state.items() if k != "next_step"}):
        with pytest.raises(SolarError, match="loader state"):
            resumed.load_state_dict(bad)


def _continue_in_child(it, q) -> None:
    q.put([b["index"].numpy().tolist() for b in it])


def test_a_forked_child_can_continue_its_parents_iterator(tmp_path):
    paths = [_write(tmp_path / "d.h5", 0, N)]
    ld = Loader(paths, batch_size=4, epochs=1, buffer=10, reader=ReaderConfig(read_ahead=3))
    it = iter(ld)
    next(it)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_continue_in_child, args=(it, q))
    p.start()
    rest = q.get(timeout=60)
    p.join(timeout=30)
    assert p.exitcode == 0 and len(rest) == len(ld) - 1


def test_a_truncated_chunked_file_stops_with_a_message(tmp_path):
    path = _write(tmp_path / "d.h5", 0, N, chunks=(4, 5, 6))
    ld = Loader([path], keys=["img"], batch_size=4, epochs=1, buffer=0)
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size * 2 // 3)
    with pytest.raises(SolarError, match="truncated"):
        list(ld)


def test_loaders_dropped_without_close_release_their_files(tmp_path):
    import gc
    import os

    paths = [_write(tmp_path / "d.h5", 0, N)]
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(10):
        ld = Loader(paths, batch_size=4, epochs=1, buffer=10)
        next(iter(ld))
        del ld
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) < before + 5


OLD_KEYWORDS = {  # the Loader's keywords before the records, and where each went
    "memory=MemoryConfig": ["share", "tier", "tier_size", "page_mates"],
    "planning=PlanningConfig": ["plan", "policy", "slack", "equal_batches", "horizon",
                                "snapshots"],
    "expert=ExpertConfig": ["warm", "throttle"],
    "reader=ReaderConfig": ["one_per_file"],
}  # fmt: skip


@pytest.mark.parametrize("where, name", [(w, n) for w, ns in OLD_KEYWORDS.items() for n in ns])
def test_an_old_keyword_says_in_one_line_where_it_moved(tmp_path, where, name):
    paths = [_write(tmp_path / "d.h5", 0, N)]
    with pytest.raises(SolarError) as err:
        Loader(paths, batch_size=4, epochs=1, buffer=10, **{name: "node"})
    assert str(err.value) == f"Loader({name}=...): moved to {where}({name}=...)"


def test_an_unknown_keyword_is_a_type_error_as_python_raises(tmp_path):
    paths = [_write(tmp_path / "d.h5", 0, N)]
    with pytest.raises(TypeError, match="unexpected keyword argument 'bufer'") as err:
        Loader(paths, batch_size=4, epochs=1, buffer=10, bufer=10)
    assert not isinstance(err.value, SolarError)


@pytest.mark.parametrize("make, message", [
    (lambda: LoaderConfig(paths="d.h5", epochs=1, buffer=1, memory=PlanningConfig()),
     "memory must be a MemoryConfig, e.g. memory=MemoryConfig(...), got PlanningConfig("),
    (lambda: LoaderConfig(paths="d.h5", epochs=1, buffer=1, memory={"share": "rank"}),
     "memory must be a MemoryConfig"),
    (lambda: LoaderConfig(paths="d.h5", epochs=1, buffer=1, reader=ReaderConfig),
     "reader must be a ReaderConfig"),
    (lambda: MemoryConfig(share="nodes"), "share must be one of ('auto', 'rank', 'node')"),
    (lambda: MemoryConfig(tier_size=1.5), "tier_size must be a size"),
    (lambda: MemoryConfig(page_mates="no"), "page_mates must be True or False"),
    (lambda: PlanningConfig(policy="belady"), "policy must be one of "),
    (lambda: PlanningConfig(slack=-1), "slack must be between 0 and 1000"),
    (lambda: PlanningConfig(horizon=-1), "horizon must be a whole number of epochs"),
    (lambda: PlanningConfig(equal_batches="yes"), "equal_batches must be True, False or None"),
    (lambda: PlanningConfig(plan=3), "plan must be a Plan, a plan file or None"),
    (lambda: ExpertConfig(warm=None), "warm must be True or False"),
    (lambda: ExpertConfig(throttle=0.1), "throttle must be a Throttle or None"),
])  # fmt: skip
def test_records_are_refused_in_one_line_where_they_are_made(make, message):
    with pytest.raises(SolarError) as err:
        make()
    assert "\n" not in str(err.value) and str(err.value).startswith(message), err.value


def test_a_record_given_as_none_is_its_defaults_in_either_build(tmp_path):
    paths = [_write(tmp_path / "d.h5", 0, N)]
    config = LoaderConfig(paths=paths, batch_size=4, epochs=1, buffer=10, reader=None,
                          memory=None, planning=None, expert=None)  # fmt: skip
    assert (config.reader, config.memory) == (ReaderConfig(), MemoryConfig())
    assert (config.planning, config.expert) == (PlanningConfig(), ExpertConfig())
    ref = reference(paths)
    for ld in (Loader.from_config(config), Loader(paths, batch_size=4, epochs=1, buffer=10,
                                                  reader=None, memory=None)):  # fmt: skip
        with ld:
            assert ld.config == ReaderConfig() and ld.share == "rank"
            for b in ld:
                assert np.array_equal(b["img"].numpy(), ref["img"][b["index"].numpy()])
