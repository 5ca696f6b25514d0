"""The Loader with a second tier: h5py's bytes from RAM, tier and storage alike, each sample
once per epoch, exact resume, and no tier file left behind."""

from __future__ import annotations

import gc
import os
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import every_batch, reference, skip_without_o_direct
from test_loader import N, _write, check_child_serves_epoch_1, run_all

from solar import Loader, ReaderConfig, SolarError
from solar.io.executor import wait_all
from solar.options import MemoryConfig, PlanningConfig


@pytest.fixture(params=["contiguous", "chunked gzip"])
def data(request, tmp_path) -> list[Path]:
    layout = {"chunks": (3, 5, 6), "compression": "gzip", "shuffle": True}
    return [_write(tmp_path / "d.h5", 0, N, **(layout if request.param != "contiguous" else {}))]


def open_tiers(directory: Path) -> int:
    """This process's descriptors of (unnamed) files in ``directory``: its tier files."""
    links = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue
    return sum(link.startswith(f"{directory}/") for link in links)


@pytest.fixture
def nvme(tmp_path) -> Path:
    (tmp_path / "nvme").mkdir()
    return tmp_path / "nvme"


@pytest.mark.parametrize("world", [1, 3])
def test_whole_runs_with_a_tier_are_byte_identical(data, nvme, world):
    ref = reference(data)
    kw = {
        "batch_size": 4,
        "epochs": 4,
        "buffer": 5,
        "memory": MemoryConfig(tier=nvme, tier_size=40),
    }
    loaders = [
        Loader(data, **kw, rank=r, world_size=world, reader=ReaderConfig(threads=3))
        for r in range(world)
    ]
    assert open_tiers(nvme) == world and os.listdir(nvme) == []  # one file per rank, unnamed
    run_all(loaders, range(4), ref)
    for ld in loaders:
        planned = ld.plan.stats[ld.rank]
        served = ld.stats.epochs.values()
        assert sum(s.tier_hits for s in served) == planned.tier_hits > 0
        assert sum(s.hits + s.tier_hits for s in served) == planned.hits
        assert sum(s.reads for s in served) == planned.reads
        assert sum(s.tier_bytes for s in served) > 0 and sum(s.tier_writes for s in served) > 0
        ld.close()
    assert os.listdir(nvme) == [] and open_tiers(nvme) == 0


def test_with_room_for_everything_later_epochs_read_nothing_from_storage(data, nvme):
    ref = reference(data)
    ld = Loader(
        data, batch_size=4, epochs=3, buffer=10, memory=MemoryConfig(tier=nvme, tier_size=N)
    )
    run_all([ld], range(3), ref)
    epochs = ld.stats.epochs
    assert epochs[0].reads == N
    assert epochs[1].reads == epochs[2].reads == 0
    assert epochs[1].hits == 10 and epochs[1].tier_hits == N - 10
    ld.close()


def test_resume_mid_epoch_rebuilds_both_tiers(data, nvme):
    kw = {
        "batch_size": 3,
        "epochs": 3,
        "buffer": 6,
        "memory": MemoryConfig(tier=nvme, tier_size=30),
        "world_size": 2,
        "rank": 1,
    }
    whole = Loader(data, **kw)
    expected = every_batch(whole, range(3))
    first = Loader(data, **kw)
    first.set_epoch(0)
    cut = len(first) + 5
    first.set_epoch(1)
    for i, _ in enumerate(first):
        if i + 1 == 5:
            break
    state = first.state_dict()
    first.close()
    resumed = Loader(data, **kw)
    resumed.load_state_dict(state)
    got = []
    for e in (1, 2):
        resumed.set_epoch(e)
        got += list(resumed)
    assert len(got) == len(expected) - cut
    for a, b in zip(got, expected[cut:], strict=True):
        for key in b:
            assert a[key].numpy().tobytes() == b[key].numpy().tobytes()
    assert resumed.stats.epochs[1].rebuild_seconds > 0
    for ld in (whole, resumed):
        ld.close()
    assert os.listdir(nvme) == []


def test_direct_io_reader_with_a_tier(nvme, tmp_path):
    data = [_write(tmp_path / "d.h5", 0, N)]
    with skip_without_o_direct():
        ld = Loader(data, batch_size=4, epochs=3, buffer=4, reader=ReaderConfig(direct_io=True),
                    memory=MemoryConfig(tier=nvme, tier_size=30))  # fmt: skip
        assert ld.tier is not None and ld.tier.direct_io
        run_all([ld], range(3), reference(data))
        ld.close()


def test_a_loader_dropped_without_close_removes_its_tier_file(data, nvme):
    ld = Loader(
        data, batch_size=4, epochs=2, buffer=5, memory=MemoryConfig(tier=nvme, tier_size=20)
    )
    ld.set_epoch(0)
    list(ld)
    assert open_tiers(nvme) == 1
    del ld
    deadline = time.monotonic() + 60  # a hang guard, not a speed: the writes are a few KiB
    while open_tiers(nvme) and time.monotonic() < deadline:
        gc.collect()  # once the tier's writes in flight end, nothing holds it
        time.sleep(0.05)
    assert open_tiers(nvme) == 0 and os.listdir(nvme) == []


def test_a_full_disk_is_refused_up_front(data, nvme, monkeypatch):
    real = os.statvfs

    class Full:
        def __init__(self, st):
            self.f_frsize, self.f_bavail = st.f_frsize, 2

    monkeypatch.setattr(os, "statvfs", lambda p: Full(real(p)))
    with pytest.raises(SolarError, match=rf"tier {nvme}: needs .* free") as info:
        Loader(data, batch_size=4, epochs=2, buffer=5, memory=MemoryConfig(tier=nvme, tier_size=50))
    assert "\n" not in str(info.value)
    assert os.listdir(nvme) == []


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"tier_size": 10}, "needs both tier=<directory> and tier_size > 0"),
        ({"tier": "NVME"}, "needs both tier=<directory> and tier_size > 0"),
        ({"tier": "NVME", "tier_size": 10, "policy": "lru"}, "policy 'lru' has no second tier"),
        ({"tier": "NVME", "tier_size": "1 parsec"}, "tier_size: unknown unit"),
        ({"tier": "missing", "tier_size": 10}, "directory does not exist"),
    ],
)
def test_bad_tier_arguments_are_refused(data, nvme, kw, message):
    kw = {k: (nvme if v == "NVME" else nvme / v if k == "tier" else v) for k, v in kw.items()}
    planning = PlanningConfig(policy=kw.pop("policy", "solar"))
    with pytest.raises(SolarError, match=message):
        Loader(data, batch_size=4, epochs=2, buffer=5, memory=MemoryConfig(**kw),
               planning=planning)  # fmt: skip


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_child_process_fills_a_tier_of_its_own(nvme, tmp_path, method):
    data = [_write(tmp_path / "d.h5", 0, N)]
    ld = Loader(
        data, batch_size=4, epochs=2, buffer=5, memory=MemoryConfig(tier=nvme, tier_size=40)
    )
    ld.set_epoch(0)
    list(ld)
    check_child_serves_epoch_1(ld, method)
    ld.close()
    assert os.listdir(nvme) == []


@pytest.mark.timeout(120)
def test_a_step_that_failed_is_served_again_with_the_right_bytes(data, nvme, monkeypatch):
    """A step's storage read fails while tier reads and writes are under way (the step, or a
    step read ahead, reads tier slots the failed step writes): the error reaches the trainer,
    nothing hangs, and iterating again serves the rest of the epoch, failed step included,
    with h5py's bytes, every sample once."""
    from concurrent.futures import Future

    ref = reference(data)
    ld = Loader(data, batch_size=8, epochs=3, buffer=5, reader=ReaderConfig(threads=2),
                memory=MemoryConfig(tier=nvme, tier_size=20))  # fmt: skip
    assert ld.tier is not None and ld.tier.executor is ld.reader.executor  # one executor
    run_all([ld], range(1), ref)
    # An epoch's last steps write tier slots that the next epoch's first steps, read ahead,
    # read: fail such a step of epoch 1.
    spe = ld.run.steps_per_epoch
    steps = {k: ld._stream.window(k, trim=False).step(k) for k in range(spe, 3 * spe)}
    target = next(
        (k for k in range(spe, 2 * spe)
         if steps[k].read_rows.size and np.intersect1d(
             steps[k].tier_writes, np.concatenate([steps[j].tier_slots for j in range(k, k + 5)])
         ).size),
        None,
    )  # fmt: skip
    assert target is not None, "no step of epoch 1 writes slots read just after: change the run"
    reads = ld._pipeline.get().queue.reads
    real = reads.start

    def failing(k):
        io = real(k)
        if k == target and not failing.done:
            failing.done = True
            wait_all(io.futures[:1])  # the read replaced (a held tier read may wait for later)
            bad: Future = Future()
            bad.set_exception(SolarError("injected read error"))
            io.futures[0] = bad
        return io

    failing.done = False
    monkeypatch.setattr(reads, "start", failing)  # the read stage's entry
    ld.set_epoch(1)
    seen = []
    with pytest.raises(SolarError, match="injected read error"):
        for batch in ld:
            seen.append(batch["index"].numpy())
    assert ld.state_dict()["next_step"] == target
    for batch in ld:  # resumes at the step that failed
        idx = batch["index"].numpy()
        for key, want in ref.items():
            assert batch[key].numpy().tobytes() == want[idx].tobytes()
        seen.append(idx)
    assert sorted(np.concatenate(seen).tolist()) == list(range(N))
    run_all([ld], range(2, 3), ref)
    ld.close()
