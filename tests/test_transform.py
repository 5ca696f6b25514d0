"""Transforms in the pipeline (solar.transform): the rows a Loader yields are the transform of
h5py's bytes, with the draws of each sample's own generator, off the trainer's thread."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import every_batch
from transform_fns import crop_flip_noise, fails_on_50, shrink

from solar import Loader, MemoryConfig, SolarError, Weighted
from solar.transform import Transform, repeats, sample_rng

N = 103


def expected(ref: dict, fn, seed: int, epoch: int, step: int, ids: np.ndarray) -> dict:
    """``fn`` applied to h5py's rows with each draw's generator."""
    again = repeats(ids)
    outs = [
        fn({k: v[i] for k, v in ref.items()}, sample_rng(seed, epoch, int(i), step, int(r)))
        for i, r in zip(ids, again, strict=True)
    ]
    return {k: np.stack([o[k] for o in outs]) for k in outs[0]}


def read_all(path: Path) -> dict:
    with h5py.File(path) as f:
        return {k: f[k][()] for k in f}


@pytest.mark.parametrize(("workers", "processes"), [(1, False), (3, False), (2, True)])
def test_every_row_is_the_transform_of_h5pys_bytes_with_its_own_draws(data, workers, processes):
    """Two ranks, three epochs, N = 103 over batches of 10: each sample once per epoch, each
    row bit-identical to the transform of h5py's row under (seed, epoch, sample, step), on
    threads or in processes."""
    ref = read_all(data)
    t = Transform(crop_flip_noise, workers=workers, processes=processes)
    loaders = [Loader(data, batch_size=10, epochs=3, buffer=20, seed=5, rank=r, world_size=2,
                      transform=t) for r in range(2)]  # fmt: skip
    for e in range(3):
        seen = []
        for ld in loaders:
            ld.set_epoch(e)
            for step, b in enumerate(ld):
                ids = b["index"].numpy()
                want = expected(ref, crop_flip_noise, 5, e, step, ids)
                assert b["img"].shape[1:] == (8, 8)
                for k in ("img", "label"):
                    assert b[k].numpy().tobytes() == want[k].tobytes(), (e, step, k)
                seen.append(ids)
        assert np.array_equal(np.sort(np.concatenate(seen)), np.arange(N)), e
    assert loaders[0].stats.epochs[2].transformed == loaders[0].stats.epochs[2].samples
    assert loaders[0].stats.epochs[2].hits > 0  # hits are transformed too
    for ld in loaders:
        ld.close()


def test_an_exact_resume_replays_the_augmentation_bit_for_bit(data):
    kw = dict(batch_size=8, epochs=2, buffer=30, transform=crop_flip_noise)
    whole = Loader(data, **kw)
    batches = every_batch(whole, range(2))
    first = Loader(data, **kw)
    first.set_epoch(0)
    for i, _ in enumerate(first):
        if i == 4:
            break
    first.set_epoch(1)
    for i, _ in enumerate(first):
        if i == 2:
            break
    resumed = Loader(data, **kw)
    resumed.load_state_dict(first.state_dict())
    rest = []
    for e in (1,):
        resumed.set_epoch(e)
        rest += list(resumed)
    cut = len(whole) + 3
    assert len(rest) == len(batches) - cut
    for got, want in zip(rest, batches[cut:], strict=True):
        for k in want:
            assert got[k].numpy().tobytes() == want[k].numpy().tobytes()
    for ld in (whole, first, resumed):
        ld.close()


def test_a_sample_drawn_twice_in_a_batch_draws_its_own_numbers_each_time(data):
    w = np.zeros(N)
    w[:4] = 1.0  # 4 samples, batches of 8: repeats in every batch
    ref = read_all(data)
    ld = Loader(data, batch_size=8, epochs=2, buffer=10, sampler=Weighted(w, num_samples=40),
                transform=crop_flip_noise)  # fmt: skip
    repeated = 0
    for e in range(2):
        ld.set_epoch(e)
        for step, b in enumerate(ld):
            ids = b["index"].numpy()
            want = expected(ref, crop_flip_noise, 0, e, step, ids)
            assert b["img"].numpy().tobytes() == want["img"].tobytes()
            for i in np.unique(ids):
                rows = b["img"].numpy()[ids == i]
                repeated += rows.shape[0] > 1
                assert all(not np.array_equal(rows[0], r) for r in rows[1:])
    assert repeated > 0
    ld.close()


def test_transforms_run_ahead_on_worker_threads(data):
    """While the trainer holds a batch, the next steps are transformed on other threads."""
    from concurrent.futures import wait

    names: list[str] = []

    def record(sample, rng):
        names.append(threading.current_thread().name)
        return {"img": sample["img"] * 2}

    ld = Loader(data, batch_size=10, epochs=1, buffer=0, transform=record)
    names.clear()  # the call on sample 0 for the output shapes
    submit = ld.reader.submit

    def landed(*args, **kw):
        # Steps are transformed ahead once their reads have landed: reads that land before
        # submit returns make that so at any speed (else a read slower than step 0's
        # transforms would leave its step for the trainer's next call, and the test to race).
        futures = submit(*args, **kw)
        wait(futures, timeout=60)
        return futures

    ld.reader.submit = landed  # type: ignore[method-assign]
    it = iter(ld)
    next(it)
    deadline = time.monotonic() + 60  # a hang guard: the transforms are queued by now
    while len(names) < 30 and time.monotonic() < deadline:
        time.sleep(0.01)  # the trainer computing
    assert len(names) >= 30  # this step and the two ahead of it
    assert all(n.startswith("solar-transform") for n in names)
    rest = list(it)
    assert sum(b["img"].shape[0] for b in rest) == N - 10
    ld.close()


def test_declared_outputs_and_a_batch_transform(data):
    ref = read_all(data)
    t = Transform(lambda s, rng: {"mean": s["img"].mean().reshape(1)},
                  out={"mean": ((1,), "float32")})  # fmt: skip
    ld = Loader(data, batch_size=10, epochs=1, buffer=0, transform=t,
                batch_transform=lambda b: {**b, "twice": b["mean"] * 2})  # fmt: skip
    for b in ld:
        idx = b["index"].numpy()
        assert np.array_equal(b["mean"].numpy()[:, 0], [ref["img"][i].mean() for i in idx])
        assert np.array_equal(b["twice"].numpy(), 2 * b["mean"].numpy())
    ld.close()


@pytest.mark.parametrize("processes", [False, True])
def test_a_failing_transform_names_the_sample_and_epoch(data, processes):
    t = Transform(fails_on_50, processes=processes, workers=2)
    ld = Loader(data, batch_size=10, epochs=1, buffer=0, transform=t)
    with pytest.raises(SolarError, match=r"transform of sample 50 \(epoch 0\) failed: "
                       r"ValueError: no 50s here"):  # fmt: skip
        list(ld)
    ld.close()


@pytest.mark.parametrize(("fn", "out", "message"), [
    (lambda s, r: {"img": s["img"][: 1 + int(s["label"]) % 2]}, None,
     r"transform of sample \d+ \(epoch 0\) returned \(2, 12\) float32 for key 'img', expected "
     r"\(1, 12\) float32"),
    (lambda s, r: {"img": s["img"]}, {"img": ((12, 12), "float64")},
     r"expected \(12, 12\) float64"),
    (lambda s, r: s["img"], None, r"transform of sample 0 \(epoch 0\): a transform must return a "
     r"non-empty dict"),
    (lambda s, r: {"index": s["img"]}, None, r"output key 'index'"),
    (lambda s, r: {"img": s["img"]}, {"img": "float32"}, r"transform out=: key 'img': expected "
     r"\(shape, dtype\)"),
])  # fmt: skip
def test_outputs_that_do_not_match_are_refused(data, fn, out, message):
    with pytest.raises(SolarError, match=message):
        ld = Loader(data, batch_size=10, epochs=1, buffer=0, transform=Transform(fn, out=out))
        try:
            list(ld)
        finally:
            ld.close()


def test_a_transform_may_not_write_into_the_raw_rows(data):
    def in_place(sample, rng):
        sample["img"] *= 2
        return sample

    with pytest.raises(SolarError, match="read-only"):
        Loader(data, batch_size=10, epochs=1, buffer=0, transform=in_place)


@pytest.mark.parametrize(("kw", "message"), [
    (dict(workers=0), "transform workers must be 'auto' or an integer >= 1, got 0"),
    (dict(ahead=-1), "transform ahead must be an integer >= 0"),
    (dict(processes="yes"), "transform processes must be True or False"),
])  # fmt: skip
def test_bad_transform_settings_are_refused(kw, message):
    with pytest.raises(SolarError, match=message):
        Transform(crop_flip_noise, **kw)


def test_a_batch_transform_that_fails_names_the_step(data):
    def bad(batch):
        raise KeyError("nope")

    ld = Loader(data, batch_size=10, epochs=1, buffer=0, batch_transform=bad)
    with pytest.raises(SolarError, match=r"batch_transform of step 0 \(epoch 0\) failed: KeyError"):
        next(iter(ld))
    ld.close()


def test_repeats_count_earlier_occurrences():
    assert repeats(np.array([5, 3, 5, 5, 3, 9])).tolist() == [0, 0, 1, 2, 1, 0]
    assert repeats(np.array([], np.int64)).tolist() == []


def check_shrunk(ref: dict, batch: dict) -> None:
    idx = batch["index"].numpy()
    want = ref["img"][idx][:, 2:10, 2:10].astype(np.float64) * 2
    assert batch["centre"].numpy().tobytes() == want.tobytes()
    assert np.array_equal(batch["label"].numpy(), ref["label"][idx])


@pytest.mark.parametrize(("tier", "processes"), [(False, False), (True, False), (True, True)])
def test_a_deterministic_transform_is_held_transformed(data, tmp_path, tier, processes):
    """Buffer (and tier) hold transformed rows: hits are served as held, only storage reads
    are transformed; bytes are the transform's of h5py's, also after a resume (the refill
    transforms what it reads)."""
    ref = read_all(data)
    t = Transform(shrink, deterministic=True, processes=processes, workers=2)
    kw: dict = dict(batch_size=10, epochs=3, buffer=20, seed=3, transform=t)
    if tier:
        (tmp_path / "nvme").mkdir()
        kw.update(memory=MemoryConfig(tier=tmp_path / "nvme", tier_size=40))
    ld = Loader(data, **kw)
    for e in range(3):
        ld.set_epoch(e)
        for b in ld:
            check_shrunk(ref, b)
    for e, st in ld.stats.epochs.items():
        assert st.transformed == st.reads, e  # hits (RAM and tier) need no transform
    assert sum(st.hits for st in ld.stats.epochs.values()) > 0
    if tier:
        assert sum(st.tier_hits for st in ld.stats.epochs.values()) > 0
    ld.set_epoch(1)
    it = iter(ld)
    for _ in range(3):
        next(it)
    state = ld.state_dict()
    ld.close()
    resumed = Loader(data, **kw)
    resumed.load_state_dict(state)
    resumed.set_epoch(1)
    for b in resumed:
        check_shrunk(ref, b)
    assert resumed.stats.epochs[1].rebuild_seconds > 0  # refilled, transformed
    resumed.close()


def test_a_deterministic_transform_with_repeats_in_a_batch(data):
    w = np.zeros(N)
    w[:5] = 1.0
    ref = read_all(data)
    ld = Loader(data, batch_size=8, epochs=2, buffer=3, sampler=Weighted(w, num_samples=40),
                transform=Transform(shrink, deterministic=True))  # fmt: skip
    for e in range(2):
        ld.set_epoch(e)
        for b in ld:
            check_shrunk(ref, b)
    ld.close()


def test_transform_threads_resize_between_steps(data):
    """The tuner's knob: a pool resized mid-epoch serves the same bytes."""
    ref = read_all(data)
    ld = Loader(data, batch_size=10, epochs=1, buffer=20, transform=Transform(shrink, workers=1))
    for i, b in enumerate(ld):
        check_shrunk(ref, b)
        ld._pipeline.get().pool.resize(1 + i % 3)
    assert {s.transform_workers for s in ld.stats.steps} == {1, 2, 3}
    ld.close()


def test_transform_processes_need_a_function_that_pickles(data):
    with pytest.raises(SolarError, match=r"transform processes did not start \(does the "
                       r"transform pickle\?"):  # fmt: skip
        Loader(data, batch_size=10, epochs=1, buffer=0,
               transform=Transform(lambda s, r: s, processes=True, workers=1))  # fmt: skip


def test_a_ranks_share_of_the_cores(monkeypatch):
    """Ranks that may each use the whole host split its cores; ranks bound to cores keep
    theirs."""
    from solar import _cpu

    monkeypatch.setattr(_cpu.os, "cpu_count", lambda: 8)
    monkeypatch.setattr(_cpu.os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    assert (_cpu.cpu_share(1), _cpu.cpu_share(2), _cpu.cpu_share(3), _cpu.cpu_share(16)) == (
        8, 4, 2, 1)  # fmt: skip
    monkeypatch.setattr(_cpu.os, "sched_getaffinity", lambda pid: {2, 3}, raising=False)
    assert _cpu.cpu_share(4) == 2  # bound by the launcher: its own cores


def test_the_memory_check_counts_transformed_rows(data):
    """Declared outputs of 4 GiB a row: the batches in flight could never fit."""
    t = Transform(shrink, out={"centre": ((1 << 20, 1 << 10), "float32")})
    with pytest.raises(SolarError, match="buffer and batches"):
        Loader(data, batch_size=10, epochs=1, buffer=0, transform=t)
