from __future__ import annotations

import numpy as np
import pytest

from solar import RunConfig, SolarError
from solar.config import BufferConfig, parse_size
from solar.schedule.draw.order import (
    access_sequence,
    epoch_permutation,
    interleaved_ranks,
    nominal_batches,
    step_bounds,
)


def test_permutation_is_a_pure_function_of_seed_epoch_and_n():
    a = epoch_permutation(7, 3, 1000)
    assert np.array_equal(np.sort(a), np.arange(1000))
    assert np.array_equal(a, epoch_permutation(7, 3, 1000))
    assert not np.array_equal(a, epoch_permutation(7, 4, 1000))
    assert not np.array_equal(a, epoch_permutation(8, 3, 1000))


def test_any_epoch_alone_matches_the_run_sequence():
    run = RunConfig(50, 2, 4, 5, seed=11)
    seq = access_sequence(run)
    assert np.array_equal(seq[150:200], epoch_permutation(11, 3, 50))


@pytest.mark.parametrize(("drop_last", "steps", "served"), [(False, 13, 103), (True, 12, 96)])
def test_steps_and_last_batch(drop_last, steps, served):
    run = RunConfig(103, 2, 4, 1, drop_last=drop_last)
    assert run.steps_per_epoch == steps
    assert run.samples_per_epoch == served
    bounds = step_bounds(run)
    assert bounds[-1] == served and np.all(np.diff(bounds)[:-1] == 8)


def test_short_batch_is_split_evenly():
    assert nominal_batches(7, 3).tolist() == [3, 2, 2]
    assert nominal_batches(2, 4).tolist() == [1, 1, 0, 0]
    ranks = interleaved_ranks(RunConfig(11, 2, 3, 1))
    assert ranks.tolist() == [0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_samples": 0}, "num_samples must be a positive integer"),
        ({"batch_size": -1}, "batch_size must be a positive integer"),
        ({"epochs": 0}, "epochs"),
        ({"world_size": 0}, "world_size"),
        ({"batch_size": 30, "drop_last": True}, "exceeds the 100 samples.*no step"),
        ({"seed": -1}, "seed"),
    ],
)
def test_bad_run_shapes_are_named(kwargs, message):
    args = {"num_samples": 100, "world_size": 4, "batch_size": 8, "epochs": 2, **kwargs}
    with pytest.raises(SolarError, match=message):
        RunConfig(**args)


def test_buffer_sizes():
    assert parse_size("500", sample_bytes=None) == 500
    assert parse_size("1MiB", sample_bytes=1024) == 1024
    assert parse_size("4GiB", sample_bytes=2**20) == 4096
    assert parse_size("1.5KB", sample_bytes=100) == 15
    for bad in ("lots", "1.5", "3 parsecs", "-4"):
        with pytest.raises(SolarError, match="buffer"):
            parse_size(bad, sample_bytes=100)
    with pytest.raises(SolarError, match="sample size"):
        parse_size("4GiB", sample_bytes=None)
    with pytest.raises(SolarError, match="slack"):
        BufferConfig(5, -0.1)
    assert BufferConfig(0, 0.1).cap(10) == 11
    assert BufferConfig(0, 0.0).cap(10) == 10


def test_next_uses_of_a_repeated_sample_are_refused_not_written_past_the_end():
    from solar.schedule.draw.epochs import EpochOrder

    run = RunConfig(10, 1, 3, 3, 0, True)  # 9 served per epoch: one sample left out
    order = EpochOrder(run, np.arange(3))
    left_out = np.setdiff1d(np.arange(10), order.served(1))
    with pytest.raises(ValueError, match="repeated"):
        order.next_use(0, np.repeat(left_out, 3))
