"""The runtime's stages (solar/runtime), each alone with fakes, and one generic checker applied
to every stage that keeps state: seek to any step, serve the rest, equal to a straight run."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import write_h5

from solar import (
    LoaderConfig,
    MemoryConfig,
    PlanningConfig,
    ReaderConfig,
    SolarError,
    Transform,
    Weighted,
)
from solar.cache.slots import SlotBuffer
from solar.io.info import KeyInfo
from solar.runtime import pipeline
from solar.runtime.delivery import Delivery
from solar.runtime.holdings import Alone, Holdings
from solar.runtime.memory import BatchMemory, InFlight
from solar.runtime.reads import ReadAhead
from solar.runtime.setup import configure
from solar.schedule.draw.samplers import BatchExtras
from solar.schedule.plans.rankplan import StepPlan
from solar.schedule.plans.stream import RankStream
from solar.stats import LoaderStats

KEYS = (KeyInfo("x", (3,), np.dtype(np.float32)),)
NONE = np.zeros(0, np.int64)


def _step(k: int, samples: Sequence[int], hits: Sequence[int] = (), slots: Sequence[int] = (),
          admits: Sequence[int] = (), to: Sequence[int] = ()) -> StepPlan:  # fmt: skip
    """A step of ``samples``: rows ``hits`` from RAM ``slots``, the rest read; rows
    ``admits`` stored into slots ``to``."""
    ids = np.asarray(samples, np.int64)
    hit = np.asarray(hits, np.int64)
    return StepPlan(k, ids, np.setdiff1d(np.arange(ids.size), hit), hit,
                    np.asarray(slots, np.int64), np.asarray(admits, np.int64),
                    np.asarray(to, np.int64))  # fmt: skip


def _in_batch_by_sorting(step: StepPlan, ids: np.ndarray) -> StepPlan | None:
    """StepPlan.in_batch as it was (np.unique): the reference its hash must equal."""
    uniq, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    at = np.searchsorted(uniq, step.samples)
    if uniq.size != step.size or not np.array_equal(uniq[np.minimum(at, uniq.size - 1)],
                                                    step.samples):  # fmt: skip
        return None
    rows, src = first[at], first[inverse]
    dst = np.flatnonzero(src != np.arange(ids.size))
    return step._replace(samples=ids, read_rows=rows[step.read_rows], hit_rows=rows[step.hit_rows],
                         admit_rows=rows[step.admit_rows], copy_src=src[dst],
                         copy_dst=dst)  # fmt: skip


@pytest.mark.parametrize("seed", range(6))
def test_a_step_put_in_its_batch_order_is_what_sorting_gives(seed):
    """in_batch (a hash of the batch's ids) maps accesses to rows as np.unique did, repeats
    copied; a batch that is not the step's accesses, each once, is refused."""
    rng = np.random.default_rng(seed)
    distinct = rng.choice(1 << 40, 200, replace=False) if seed % 2 else rng.permutation(300)[:200]
    ids = rng.choice(distinct, 260) if seed < 3 else rng.permutation(distinct)  # with repeats
    samples = rng.permutation(np.unique(ids))  # the plan's order (hits first, say)
    hit = np.sort(rng.choice(samples.size, samples.size // 3, replace=False))
    step = _step(3, samples.tolist(), hit.tolist(), list(range(hit.size)), [0, 1], [5, 6])
    got, want = step.in_batch(ids), _in_batch_by_sorting(step, ids)
    assert want is not None
    # (every access is a read or a hit: their rows map each access to its batch row)
    for name in ("samples", "read_rows", "hit_rows", "admit_rows", "copy_src", "copy_dst"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
    ordered = _step(3, np.unique(ids).tolist())
    assert ordered.in_batch(np.unique(ids)) is ordered  # already the batch: itself
    for bad in (
        np.append(samples[1:], samples[0]).tolist(),  # (the same: accepted)
        [*samples[1:].tolist(), int(distinct.max()) + 1],  # one the batch lacks
        [*samples[1:].tolist(), int(samples[1])],  # one twice, one missing
        samples[1:].tolist(),  # one fewer
    ):
        s = _step(3, bad)
        if sorted(bad) == sorted(samples.tolist()):
            s.in_batch(ids)
            continue
        with pytest.raises(ValueError, match="differs from the plan"):
            s.in_batch(ids)


@pytest.mark.parametrize("seed", range(6))
def test_a_distinct_batch_is_put_in_its_order_by_a_merge_as_by_the_hash(seed):
    """A distinct sampler's batch (``in_batch(ids, distinct=True)``): a plan that put its hits
    first, keeping the batch's order otherwise (a trace's), is merged; any other order (the
    merge refuses it) is hashed; both give what the hash gives, and a batch that is not the
    step's accesses is refused alike."""
    rng = np.random.default_rng(seed)
    ids = rng.choice(1 << 40, 120, replace=False) if seed % 2 else rng.permutation(500)[:120]
    hit = rng.random(ids.size) < 0.4
    orders = [np.concatenate([ids[hit], ids[~hit]]), rng.permutation(ids), ids]
    for n, samples in enumerate(orders):
        h = int(hit.sum()) if n == 0 else ids.size // 3
        step = _step(3, samples.tolist(), list(range(h)), list(range(h)), [h], [7])
        got, want = step.in_batch(ids, distinct=True), step.in_batch(ids)
        for name in ("samples", "read_rows", "hit_rows", "admit_rows", "copy_src", "copy_dst"):
            np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
    for bad in ([*ids[1:].tolist(), int(ids[0]) + 1], ids[1:].tolist()):
        with pytest.raises(ValueError, match="differs from the plan"):
            _step(3, bad, [0], [0]).in_batch(ids, distinct=True)


# -- the generic checker ------------------------------------------------------------------------
def check_seek(
    make: Callable[[], Any],
    seek: Callable[[Any, int], None],
    serve: Callable[[Any, int], Any],
    steps: int,
    starts: Sequence[int],
) -> None:
    """A stage that keeps state, made fresh by ``make``: moved to step ``s`` by ``seek`` and
    served to the end, it gives what a straight run from step 0 gives at those steps."""
    stage = make()
    straight = [serve(stage, k) for k in range(steps)]
    for s in starts:
        stage = make()
        seek(stage, s)
        assert [serve(stage, k) for k in range(s, steps)] == straight[s:], f"seek to {s}"


# -- the read stage -----------------------------------------------------------------------------
class _Steps:
    """What the fakes ask of Steps."""

    planned_any = False

    def __init__(self, plans: dict[int, StepPlan]) -> None:
        self.plans = plans

    def plan(self, k: int) -> StepPlan:
        return self.plans[k]


class _Reads:
    """A recording read stage: each start a done future, recorded."""

    def __init__(self, steps: _Steps) -> None:
        self.steps = steps
        self.started: list[int] = []
        self.first: InFlight | None = None

    def start(self, k: int) -> InFlight:
        self.started.append(k)
        done: Future = Future()
        done.set_result((0, 0.0))
        return InFlight(self.steps.plan(k), futures=[done])

    def start_first(self) -> InFlight | None:
        self.first = InFlight(_step(0, [9]), provisional=True)
        return self.first

    def confirm(self, k: int, io: InFlight) -> InFlight:
        io.plan, io.provisional = self.steps.plan(k), False
        return io


def test_read_ahead_keeps_depth_steps_started_in_order():
    reads = _Reads(_Steps({k: _step(k, [k]) for k in range(10)}))
    queue = ReadAhead(reads, depth=3)  # type: ignore[arg-type]
    assert queue.take(0, last=9).plan.step == 0
    assert reads.started == [0, 1, 2, 3]
    assert queue.take(1, last=9).plan.step == 1 and reads.started[-1] == 4
    assert queue.take(2, last=4).plan.step == 2 and reads.started[-1] == 4  # not past last
    assert queue.ready(3) and not queue.ready(4) and queue.pending(3) == []
    queue.take(7, last=9)  # a jump: the queue drained, restarted at 7
    assert reads.started[-3:] == [7, 8, 9]
    queue.depth = 0
    assert queue.take(8, last=9).plan.step == 8
    with pytest.raises(ValueError, match="depth"):
        queue.depth = -1


def test_read_ahead_confirms_a_first_step_read_before_its_plan():
    reads = _Reads(_Steps({k: _step(k, [k + 9]) for k in range(3)}))
    queue = ReadAhead(reads, depth=1, first_ahead=True)  # type: ignore[arg-type]
    queue.start_first()
    assert reads.first is not None and reads.started == []
    io = queue.take(0, last=2)
    assert io is reads.first and not io.provisional and reads.started == [1]
    off = ReadAhead(_Reads(reads.steps), depth=1)  # type: ignore[arg-type]
    off.start_first()  # not this run's mode: nothing
    assert off.reads.first is None  # type: ignore[attr-defined]


def test_the_read_queue_seeks_as_it_runs_straight():
    plans = {k: _step(k, [k, k + 20]) for k in range(12)}

    def make() -> tuple[ReadAhead, _Reads]:
        reads = _Reads(_Steps(plans))
        return ReadAhead(reads, depth=2), reads  # type: ignore[arg-type]

    def serve(q: tuple[ReadAhead, _Reads], k: int) -> list[int]:
        return q[0].take(k, last=11).plan.samples.tolist()

    check_seek(make, lambda q, s: q[0].drain(), serve, 12, [0, 3, 11])


# -- the holdings stage -------------------------------------------------------------------------
class _Refill:
    def __init__(self, data: np.ndarray, buffer: SlotBuffer) -> None:
        self.data, self.buffer = data, buffer
        self.filled: list[int] = []

    def fill(self, k: int, cells: np.ndarray, samples: np.ndarray) -> int:
        self.filled.append(k)
        self.buffer.arrays[0][cells] = self.data[samples]
        return int(samples.size)


class _PlanSteps:
    """Steps of a toy plan over 4 slots and 16 samples: step k reads sample k % 16 (its row 1)
    and admits it into slot k % 4; from step 4 on, its row 0 is a hit of what that slot holds
    (sample k - 4), before then a read of sample k + 8."""

    def plan(self, k: int) -> StepPlan:
        if k < 4:
            return _step(k, [k + 8, k], admits=[1], to=[k % 4])
        return _step(k, [(k - 4) % 16, k % 16], [0], [k % 4], [1], [k % 4])

    def refill_at(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        # Slot j holds what the last step before k that wrote it (j' % 4 == j) admitted.
        cells = [j for j in range(4) if j < k]
        last = {j: max(s for s in range(k) if s % 4 == j) for j in cells}
        return np.array(cells, np.int64), np.array([last[j] % 16 for j in cells], np.int64)


def _holdings(data: np.ndarray) -> tuple[Holdings, _Refill]:
    buffer = SlotBuffer(4, KEYS)
    refill = _Refill(data, buffer)
    alone = Alone(buffer.arrays, None)
    return Holdings(buffer, None, _PlanSteps(), refill, alone), refill  # type: ignore[arg-type]


def test_holdings_gather_settle_and_own_their_step():
    data = np.arange(48, dtype=np.float32).reshape(16, 3)
    h, refill = _holdings(data)
    assert h.at == 0
    steps = _PlanSteps()
    for k in range(6):
        step = steps.plan(k)
        batch = [np.full((2, 3), -1, np.float32)]
        batch[0][step.read_rows] = data[step.samples[step.read_rows]]
        h.lose()
        assert h.at == -1
        h.gather(step, batch)
        h.settle(k, step, batch)
        assert h.at == k + 1
        np.testing.assert_array_equal(batch[0], data[step.samples])  # hits as held
    assert refill.filled == []
    assert h.refill(6) == 4 and h.at == 6 and refill.filled == [6]


def test_holdings_seek_as_they_run_straight():
    data = np.arange(48, dtype=np.float32).reshape(16, 3)
    steps = _PlanSteps()

    def serve(h: Holdings, k: int) -> list:
        step = steps.plan(k)
        batch = [np.zeros((2, 3), np.float32)]
        batch[0][step.read_rows] = data[step.samples[step.read_rows]]
        h.gather(step, batch)
        h.settle(k, step, batch)
        return batch[0].tolist()

    check_seek(lambda: _holdings(data)[0], Holdings.refill, serve, 10, [1, 4, 7, 9])


# -- delivery -----------------------------------------------------------------------------------
class _StepExtras(BatchExtras):
    def extras(self, output, batch):
        return {"step": output}


class _DeliverySteps:
    spe, rank, run = 4, 0, None
    sampler = _StepExtras()

    def output(self, k: int) -> tuple[int, int]:
        return divmod(k, self.spe)  # what the sampler made of step k

    def transfer(self, k: int) -> None:
        return None


def test_delivery_trims_side_rows_and_names_a_failing_batch_transform():
    import torch

    rows = np.arange(12, dtype=np.float32).reshape(4, 3)
    io = InFlight(_step(5, [7, 8]), tensors=[torch.from_numpy(rows)], batch=[rows])
    d = Delivery(_DeliverySteps(), KEYS, None, None, None)  # type: ignore[arg-type]
    got = d.fit(5, io)
    assert got.ids.tolist() == [7, 8] and got.tensors[0].shape == (2, 3)
    batch = d.batch(5, got)
    assert batch["index"].tolist() == [7, 8] and batch["step"] == (1, 1)

    def broken(b: dict) -> dict:
        raise KeyError("nope")

    bad = Delivery(_DeliverySteps(), KEYS, None, broken, None)  # type: ignore[arg-type]
    with pytest.raises(SolarError, match=r"batch_transform of step 5 \(epoch 1\) failed"):
        bad.batch(5, got)


def test_batch_memory_is_reused_once_a_batch_is_dropped():
    memory = BatchMemory(KEYS, 4, None, 4, False, None)
    io = InFlight(_step(0, [1, 2]))
    memory.provide(io, 3, 3)
    assert io.out is None and io.batch[0].shape == (3, 3)
    del io
    again = InFlight(_step(1, [3]))
    memory.provide(again, 2, 2)
    assert memory.raw is not None and len(memory.raw) == 1  # the freed set, reused


# -- the whole pipeline in each mode, under the same checker ------------------------------------
def _args(path: Path, tier: Any = None, tier_size: int = 0, **over: Any) -> LoaderConfig:
    args: dict[str, Any] = dict(
        paths=path, batch_size=4, epochs=3, buffer=6, seed=3, rank=0, world_size=1,
        reader=ReaderConfig(threads=2), memory=MemoryConfig(tier=tier, tier_size=tier_size),
        planning=PlanningConfig(equal_batches=False),
    )  # fmt: skip
    args.update(over)
    return LoaderConfig(**args)


def _plus(sample: dict, rng: Any) -> dict:
    return {"x": sample["x"] + 1}


MODES = {
    "rows as read": {},
    "tier": {"tier_size": 6, "buffer": 3},
    "transform": {"transform": Transform(_plus, workers=2)},
    "held transform": {"transform": Transform(_plus, workers=1, deterministic=True)},
    "weighted": {"sampler": Weighted(np.linspace(1, 2, 27)), "world_size": 2},
}


@pytest.mark.parametrize("mode", list(MODES))
def test_the_pipeline_seeks_as_it_runs_straight(tmp_path, mode):
    data = np.random.default_rng(0).standard_normal((27, 3)).astype(np.float32)
    path = write_h5(tmp_path / "d.h5", x=data)
    over = dict(MODES[mode])
    if "tier_size" in over:
        (tmp_path / "tier").mkdir()
        over["tier"] = tmp_path / "tier"
    setup = configure(_args(path, **over))
    made: list = []

    def make() -> pipeline.Pipeline:
        stream = RankStream(setup.spec, setup.rank)
        made.append((stream, p := pipeline.build(setup, stream, LoaderStats(), None)))
        return p

    plus = 1 if "transform" in over else 0

    def serve(p: pipeline.Pipeline, k: int) -> tuple:
        b = p.serve(k)
        ids = b["index"].numpy()
        np.testing.assert_array_equal(b["x"].numpy(), data[ids] + plus)  # h5py's (transformed)
        return ids.tolist(), b["x"].numpy().tobytes()

    spe = setup.run.steps_per_epoch
    try:
        check_seek(make, pipeline.Pipeline.seek, serve, setup.run.num_steps,
                   [1, spe, spe + 2, 2 * spe + 1])  # fmt: skip
    finally:
        for stream, p in made:
            p.close()
            stream.close()
        setup.reader.close()


# -- steps --------------------------------------------------------------------------------------
def test_steps_give_the_samplers_batch_order_rows_and_transform_draws():
    from solar import BufferConfig, PlanSpec, RunConfig, Trace
    from solar.runtime.steps import Steps

    ids = np.array([[[[5, 3, 5, 1]], [[2, 2, 7, 0]]]], np.int64)  # (epochs, steps, ranks, B)
    run = RunConfig(8, 1, 4, 1, 0, False, 8)
    spec = PlanSpec(run, BufferConfig(2, 0.0, 0), "solar", False, 12, "d", Trace(ids), None)
    stream = RankStream(spec, 0)
    try:
        steps = Steps(spec, 0, stream)
        assert steps.own_batches and steps.first_batch().tolist() == [5, 3, 5, 1]
        for k in range(2):
            steps.enter(k)
            step = steps.plan(k)
            assert step.samples.tolist() == ids[0, k, 0].tolist()  # the sampler's order
            assert (
                steps.rows(k, step) == (step.rows_needed, step.size) and steps.transfer(k) is None
            )
            job = steps.transform_job(k, step, np.arange(step.size))
            # A repeat is a second draw: its own generator input.
            assert job.repeat.tolist() == ([0, 0, 1, 0] if k == 0 else [0, 1, 0, 0])
        assert steps.global_rows(0).tolist() == [4, 4] and steps.last_planned == 1
    finally:
        stream.close()
