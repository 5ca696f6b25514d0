"""What a DistributedSampler + DataLoader user expects of a Loader: set_epoch's meaning (and one
warning when an epoch is iterated again without it), and a Loader wrapped in a DataLoader."""

from __future__ import annotations

import time
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from solar import Loader, SolarError
from solar.options import ExpertConfig


def _ids(loader) -> list[int]:
    return [int(i) for b in loader for i in b["index"]]


@pytest.fixture
def loader(small_h5):
    with Loader(small_h5, batch_size=8, epochs=3, buffer=20, expert=ExpertConfig(warm=False)) as ld:
        yield ld


def test_an_epoch_iterated_again_without_set_epoch_warns_once(loader):
    loader.set_epoch(0)
    first = _ids(loader)
    with pytest.warns(UserWarning, match="epoch 0 was iterated to its end and is iterated again"):
        again = _ids(loader)
    assert again == first  # served again, as a DistributedSampler would
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _ids(loader) == first  # once per Loader
        loader.set_epoch(1)
        assert _ids(loader) != first


def test_set_epoch_with_the_same_epoch_and_a_resume_are_not_warned(loader):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = _ids(loader)  # epoch 0 without set_epoch, as DistributedSampler's default
        loader.set_epoch(0)  # repeated on purpose
        assert _ids(loader) == first
        loader.set_epoch(1)
        it = iter(loader)
        head = [int(i) for i in next(it)["index"]]
        state = loader.state_dict()
        rest = _ids(it)
        del it
        loader.load_state_dict(state)  # a resume: the rest of epoch 1
        assert _ids(loader) == rest
        loader.load_state_dict(state)
        assert head + _ids(loader) == head + rest
        # An epoch broken off continues where it stopped (not a repeat).
        loader.set_epoch(2)
        it = iter(loader)
        part = [int(i) for i in next(it)["index"]]
        del it
        assert len(part + _ids(loader)) == 103


def test_a_loader_is_an_iterable_dataset_a_dataloader_serves(loader):
    assert isinstance(loader, IterableDataset)
    loader.set_epoch(1)
    want = [{k: v.clone() for k, v in b.items()} for b in loader]
    loader.set_epoch(1)
    dl = DataLoader(loader, batch_size=None)
    assert len(dl) == len(loader) == len(want)
    got = list(dl)
    assert [sorted(b) for b in got] == [sorted(b) for b in want]
    for g, w in zip(got, want, strict=True):
        assert all(torch.equal(g[k], w[k]) for k in w)
    assert np.array_equal(np.sort(np.concatenate([b["index"] for b in got])), np.arange(103))


@pytest.mark.parametrize("kwargs", [{}, {"batch_size": 4}])
def test_a_dataloader_batching_the_batches_is_refused(loader, kwargs):
    with pytest.raises(SolarError, match=r"wrap it as DataLoader\(loader, batch_size=None\)"):
        next(iter(DataLoader(loader, **kwargs)))


def test_a_dataloader_with_workers_is_refused_not_duplicated(loader):
    # (One worker: torch waits 5 s for each worker to exit after the refusal.)
    dl = DataLoader(loader, batch_size=None, num_workers=1)
    with pytest.raises(SolarError, match="num_workers=1: every worker would serve the whole"):
        list(dl)


def test_iterating_keeps_no_reference_to_the_loader(small_h5):
    """The DataLoader check looks into torch's frame only: the iterating frame's locals are
    not snapshotted, so a Loader dropped after an epoch is collected (and its files closed)."""
    import gc
    import weakref

    ld = Loader(small_h5, batch_size=8, epochs=1, buffer=20, expert=ExpertConfig(warm=False))
    alive = weakref.ref(ld)
    assert len(list(ld)) == len(ld)
    del ld
    for _ in range(100):
        gc.collect()
        if alive() is None:
            break
        time.sleep(0.05)
    assert alive() is None
