"""Per-stage figures add up from the steps, and the bottleneck line names the stage that limits
(on synthetic figures); on real tiny pipelines (throttled storage, gzip chunks, a slow
transform on one worker) each stage's figures account for the work that ran in it. Which stage
a real pipeline names is a matter of speed: bench/stages_bench.py."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from solar import Loader, ReaderConfig
from solar.io.throttle import Throttle
from solar.options import ExpertConfig
from solar.stats import (
    TRAINER_WAIT,
    EpochStats,
    LoaderStats,
    StageFigures,
    StepStats,
    bottleneck,
    stage_figures,
)
from solar.transform import Transform


def _step(epoch: int, step: int, **kw) -> StepStats:
    base = dict(epoch=epoch, step=step, batch=8, hits=2, reads=6, bytes_read=600,
                read_seconds=0.5, stall_seconds=0.1)  # fmt: skip
    return StepStats(**{**base, **kw})


def test_stage_figures_add_up_from_steps() -> None:
    stats = LoaderStats()
    steps = [
        _step(0, 0, decode_seconds=0.2, wall_seconds=1.0, read_threads=4, decode_threads=2,
              read_ahead=4, ready_ahead=1, transform_seconds=0.3, transformed=8,
              transform_workers=2),
        _step(0, 1, decode_seconds=0.1, wall_seconds=0.5, read_threads=8, decode_threads=2,
              read_ahead=4, ready_ahead=3, stall_seconds=0.25),
        _step(1, 2, decode_seconds=0.0, wall_seconds=2.0, read_threads=8, decode_threads=2,
              read_ahead=2, ready_ahead=2, tier_hits=1),
    ]  # fmt: skip
    for s in steps:
        stats.record(s)
    e0 = stats.stages(0)
    wall = 1.5
    assert e0["read"].wall_seconds == pytest.approx(wall)
    assert e0["read"].busy_seconds == pytest.approx(1.0 - 0.3)  # decoding taken out
    assert e0["read"].items == 12
    assert e0["read"].workers == pytest.approx((4 * 1.0 + 8 * 0.5) / wall)
    assert e0["read"].utilisation == pytest.approx(0.7 / (4 * 1.0 + 8 * 0.5))
    assert e0["read"].occupancy == pytest.approx(4 / 8)
    assert e0["decode"].busy_seconds == pytest.approx(0.3)
    assert e0["decode"].utilisation == pytest.approx(0.3 / (2 * wall))
    assert e0["transform"].items == 8 and e0["transform"].busy_seconds == pytest.approx(0.3)
    assert e0["transform"].utilisation == pytest.approx(0.3 / (2 * 1.0))
    trainer = e0["trainer"]
    assert trainer.blocked_seconds == pytest.approx(0.1 + 0.2 + 0.05)
    assert trainer.busy_seconds == pytest.approx(wall - 0.35)
    assert trainer.items == 16 and trainer.items_per_second == pytest.approx(16 / wall)
    # All epochs: the sums of both.
    run = stats.stages()
    assert run["read"].items == 12 + 7
    assert run["read"].wall_seconds == pytest.approx(3.5)
    assert run["decode"].busy_seconds == pytest.approx(0.3)
    assert stats.totals().steps == 3
    every = stats.totals(0).merge(stats.totals(1))
    assert dataclasses.asdict(every) == pytest.approx(dataclasses.asdict(stats.totals()))


def _stage(name: str, busy: float, workers: float, wall: float = 10.0, **kw) -> StageFigures:
    return StageFigures(name, busy, 100, wall, workers * wall, **kw)


def _figures(read: float, decode: float, transform: float, waited: float) -> dict:
    wall = 10.0
    return {
        "read": _stage("read", read * 8 * wall, 8),
        "decode": _stage("decode", decode * 2 * wall, 2),
        "transform": _stage("transform", transform * 2 * wall, 2 if transform else 0),
        "trainer": _stage("trainer", (1 - waited) * wall, 1, blocked_seconds=waited * wall),
    }


@pytest.mark.parametrize(
    "figures, expected",
    [
        (_figures(0.97, 0.12, 0.0, 0.61), "read"),
        (_figures(0.20, 0.95, 0.0, 0.50), "decode"),
        (_figures(0.30, 0.40, 0.90, 0.40), "transform"),
        (_figures(0.97, 0.90, 0.90, TRAINER_WAIT / 2), "trainer"),  # it rarely waits
        (_figures(0.0, 0.0, 0.0, 0.9), "trainer"),  # nothing else did anything
    ],
)
def test_bottleneck_names_the_limit(figures: dict, expected: str) -> None:
    name, line = bottleneck(figures)
    assert name == expected
    assert line.startswith(f"bottleneck: {expected} (")
    if expected == "read":
        assert line == (
            "bottleneck: read (97 % busy on 8 threads); decode 12 % on 2; "
            "trainer waited 61 % of 10.0 s"
        )


def test_the_bottleneck_prints_as_its_line_and_unpacks_as_before() -> None:
    b = bottleneck(_figures(0.97, 0.12, 0.0, 0.61))
    stage, line = b
    assert (b.stage, b.line) == (stage, line) == ("read", str(b)) and b[0] == "read"
    assert f"{b}".startswith("bottleneck: read (97 % busy") and "\n" not in str(b)
    stats = LoaderStats()
    for k in range(4):
        stats.record(_step(0, k, wall_seconds=1.0, stall_seconds=0.9, read_threads=8,
                           read_seconds=7.5))  # fmt: skip
    assert str(stats.bottleneck(0)) == stats.bottleneck(0).line == stats.bottleneck()[1]


def test_epoch_stats_print_as_one_readable_line() -> None:
    stats = LoaderStats()
    for k in range(4):
        stats.record(_step(0, k, wall_seconds=0.5, stall_seconds=0.1, bytes_read=75_000_000))
    e = stats.epochs[0]
    assert str(e) == (
        "32 samples in 4 steps, hit rate 25.0 %, read 0.3 GB (24 samples), 2.00 s, stall 0.40 s"
    )
    assert repr(e) == f"<EpochStats: {e}>" and e.hit_rate == 0.25
    e.tier_hits, e.rebuild_seconds, e.sent, e.received = 8, 1.5, 3, 2
    assert str(e) == (
        "32 samples in 4 steps, hit rate 50.0 % (8 from the tier), read 0.3 GB (24 samples), "
        "2.00 s, stall 0.40 s, rebuild 1.50 s, rows sent 3 received 2"
    )
    assert str(EpochStats()).startswith("0 samples in 0 steps, hit rate 0.0 %")


def test_no_steps_no_bottleneck() -> None:
    assert bottleneck(stage_figures(EpochStats()))[0] == "none"
    assert LoaderStats().bottleneck()[0] == "none"


# -- real tiny pipelines ----------------------------------------------------------------------
# Which stage a real pipeline names depends on how fast this machine reads, inflates and runs
# Python against each other: bench/stages_bench.py reports it, with its spread over runs. Here
# only what holds at any speed: each stage counts the items that went through it, the stages
# that did work are active (their busy time is at least the sleeps that ran in them: a sleep
# never ends early), and the line is the rule's on the recorded figures, naming one of them.


def _run(loader: Loader, epochs: int) -> None:
    for e in range(epochs):
        loader.set_epoch(e)
        for _ in loader:
            pass


def _active(stages: dict[str, StageFigures]) -> set[str]:
    return {n for n, s in stages.items() if n != "trainer" and s.active}


def _check_line(loader: Loader, stages: dict[str, StageFigures]) -> tuple[str, str]:
    """The loader's bottleneck is the rule's on its own figures: a stage that did work, or the
    trainer, and every active stage in the line."""
    name, line = loader.stats.bottleneck()
    assert (name, line) == bottleneck(stages)
    assert name in _active(stages) | {"trainer"}, line
    assert all(n in line for n in _active(stages)), line
    return name, line


def test_throttled_reads_are_the_read_stages(tmp_path: Path) -> None:
    path = tmp_path / "plain.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.random.default_rng(0).standard_normal((96, 32, 32), np.float32)
    # 4 KiB samples behind 4 ms requests: every read sleeps at least 4 ms per request.
    with Loader(path, batch_size=8, epochs=1, buffer=0, reader=ReaderConfig(threads=4),
                expert=ExpertConfig(throttle=Throttle(20, 4))) as loader:  # fmt: skip
        _run(loader, 1)
        stages = loader.stats.stages()
        _check_line(loader, stages)
    assert _active(stages) == {"read"}  # nothing decoded, nothing transformed
    assert stages["read"].items == 96 and stages["decode"].items == 0
    assert stages["decode"].busy_seconds == 0
    assert stages["read"].busy_seconds >= 12 * 0.004  # 12 steps, each at least one request
    # Each step waited for its reads (a positive wait, however short, at any speed).
    assert stages["trainer"].items == 96 and stages["trainer"].blocked_seconds > 0


def test_gzip_chunks_are_decoded_in_the_decode_stage(tmp_path: Path) -> None:
    path = tmp_path / "gz.h5"
    rng = np.random.default_rng(0)
    # (Two samples a chunk: one a chunk takes the fused kernel, compiled in each process.)
    data = rng.integers(0, 16, (96, 128, 128)).astype(np.float32)
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=data, chunks=(2, 128, 128), compression="gzip")
    cfg = ReaderConfig(threads=8)
    with Loader(path, batch_size=8, epochs=2, buffer=0, reader=cfg) as loader:
        loader.reader.executor.resize(decode_threads=1)
        _run(loader, 2)
        stages = loader.stats.stages()
        _check_line(loader, stages)
        batches = [b["x"].numpy().copy() for b in loader]
    assert _active(stages) == {"read", "decode"}  # both did work: both in the line
    assert stages["decode"].items == 2 * 96 and stages["decode"].busy_seconds > 0
    assert stages["decode"].workers == pytest.approx(1)  # the resized executor's one thread
    assert len(batches) == 12  # (last epoch again: the resized executor still reads)


def _slow_identity(sample, rng):
    time.sleep(0.002)  # 2 ms a sample: the transform stage's busy time is at least that
    return {"x": sample["x"] * 1}


def test_a_transforms_time_is_the_transform_stages(tmp_path: Path) -> None:
    path = tmp_path / "plain.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.random.default_rng(0).standard_normal((64, 16, 16), np.float32)
    with Loader(path, batch_size=8, epochs=1, buffer=0,
                transform=Transform(_slow_identity, workers=1)) as loader:  # fmt: skip
        _run(loader, 1)
        stages = loader.stats.stages()
        _check_line(loader, stages)
    assert _active(stages) == {"read", "transform"}
    assert stages["transform"].items == 64 and stages["transform"].workers == pytest.approx(1)
    assert stages["transform"].busy_seconds >= 64 * 0.002


def test_epoch_add_covers_every_figure() -> None:
    """Every EpochStats figure is counted by ``add`` (or, ``rebuild_seconds``, by the Loader):
    a new StepStats figure gets summed by adding an EpochStats field of its name."""
    from solar.stats import _OFFERED, _SUMMED

    counted = {"steps", "samples", "rebuild_seconds", *_SUMMED, *(n for n, _ in _OFFERED)}
    assert {f.name for f in dataclasses.fields(EpochStats)} == counted
    step = _step(0, 0, wall_seconds=2.0, read_threads=3, decode_threads=1, transform_workers=4)
    e = EpochStats()
    e.add(step)
    e.add(step)
    assert (e.steps, e.samples, e.hits, e.bytes_read) == (2, 16, 4, 1200)
    assert (e.read_thread_seconds, e.decode_thread_seconds, e.transform_worker_seconds) == (
        12.0,
        4.0,
        16.0,
    )
