"""share="auto" (the default): a node buffer where more than one rank of the job runs on a host
and the ranks' accesses can overlap, in a configuration the node buffer runs; else a buffer per
rank (solar/runtime/setup.py). Decided alike on every rank (here: a fake communicator whose
ranks all answer alike, or one that differs)."""

from __future__ import annotations

import numpy as np
import pytest

from solar import BufferConfig, MemoryConfig, PlanSpec, RunConfig, Weighted
from solar.errors import SolarError
from solar.host import place
from solar.runtime.setup import _share
from solar.schedule.draw.samplers import SHUFFLE


class FakeComm:
    """``size`` ranks that all hold what this one holds (or ``others`` for the other ranks,
    after the first ``alike`` gathers)."""

    def __init__(self, size: int, others=None, alike: int = 0) -> None:
        self.size, self.others, self.gathered, self.alike = size, others, 0, alike

    def Get_rank(self) -> int:
        return 0

    def Get_size(self) -> int:
        return self.size

    def allgather(self, obj):
        self.gathered += 1
        same = self.others is None or self.gathered <= self.alike
        return [obj] + [obj if same else self.others] * (self.size - 1)


def spec(sampler, world=4):
    return PlanSpec(RunConfig(400, world, 8, 2), BufferConfig(10), sampler=sampler)


SPLIT = Weighted(np.ones(400), affinity=False)


def decide(share, s, comm, world=4, **kw):
    return _share(share, s, kw.get("holds_transformed", False), world, comm)


def test_auto_shares_a_buffer_where_ranks_share_a_host_and_accesses_overlap(monkeypatch):
    monkeypatch.setenv("SOLAR_HOSTS", "2x2")
    hosts, hc = decide("auto", spec(SPLIT), FakeComm(4))
    assert hosts is not None and hosts.as_record() == [[0, 1], [2, 3]] and hc is not None
    # Accesses that do not overlap (Shuffle, affinity), one rank per host, one rank, no comm:
    # a buffer per rank, as "rank" always gives.
    assert decide("auto", spec(SHUFFLE), FakeComm(4)) == (None, None)
    assert decide("auto", spec(Weighted(np.ones(400))), FakeComm(4)) == (None, None)
    assert decide("rank", spec(SPLIT), FakeComm(4)) == (None, None)
    lru = PlanSpec(RunConfig(400, 4, 8, 2), BufferConfig(10), policy="lru", sampler=SPLIT)
    assert decide("auto", lru, FakeComm(4)) == (None, None)  # a baseline stays per rank
    assert decide("auto", spec(SPLIT, 1), None, world=1) == (None, None)
    assert decide("auto", spec(SPLIT), None) == (None, None)
    monkeypatch.setenv("SOLAR_HOSTS", "4x1")
    assert decide("auto", spec(SPLIT), FakeComm(4)) == (None, None)


@pytest.mark.parametrize("kw, word", [
    ({"holds_transformed": True}, "transform: "),
])  # fmt: skip
def test_auto_falls_back_where_node_refuses_in_one_line(monkeypatch, kw, word):
    monkeypatch.setenv("SOLAR_HOSTS", "1x4")
    assert decide("auto", spec(SPLIT), FakeComm(4), **kw) == (None, None)
    with pytest.raises(SolarError) as err:
        decide("node", spec(SPLIT), FakeComm(4), **kw)
    assert str(err.value).startswith(f'share="node": {word}') and "\n" not in str(err.value)


class FakeMPIComm(FakeComm):
    """An mpi4py communicator's look (its planning thread's is a ``Dup``)."""

    def Dup(self):
        raise AssertionError("no communicator is made for a node buffer that does not run")


@pytest.mark.parametrize("level", ["SERIALIZED", "FUNNELED"])
def test_mpi_without_concurrent_threads_falls_back_or_refuses_in_setup(monkeypatch, level):
    """A node buffer's planning thread exchanges over MPI beside the foreground: below
    THREAD_MULTIPLE "auto" falls back to a buffer per rank and "node" refuses in setup, on
    every rank alike (not in the stream, after "auto" chose it)."""
    from solar.host import exchange

    monkeypatch.setenv("SOLAR_HOSTS", "1x4")
    monkeypatch.setattr(exchange, "_mpi_threads", lambda: (False, level))
    assert decide("auto", spec(SPLIT), FakeMPIComm(4)) == (None, None)
    with pytest.raises(SolarError) as err:
        decide("node", spec(SPLIT), FakeMPIComm(4))
    assert str(err.value).startswith(f'share="node": comm: MPI runs threads at level '
                                     f"THREAD_{level}") and "\n" not in str(err.value)  # fmt: skip
    monkeypatch.setattr(exchange, "_mpi_threads", lambda: (True, "MULTIPLE"))
    assert exchange.threads_unsupported(FakeMPIComm(4)) == ""
    assert exchange.threads_unsupported(FakeComm(4)) == ""  # (torch's groups: no level)


def test_every_rank_falls_back_if_one_ranks_configuration_is_not_run(monkeypatch):
    monkeypatch.setenv("SOLAR_HOSTS", "1x4")
    # (the host names and share itself agreed: configure places the rank first, one gather)
    comm = FakeComm(4, others="transform: not shared yet", alike=2)
    place(comm)
    assert decide("auto", spec(SPLIT), comm) == (None, None) and comm.gathered == 3
    with pytest.raises(SolarError, match=r"ranks disagree on share: ranks \[1, 2, 3\]"):
        decide("node", spec(SPLIT), FakeComm(4, others="rank"))
    with pytest.raises(SolarError, match="share must be one of"):  # refused where it is made
        decide(MemoryConfig(share="host").share, spec(SPLIT), FakeComm(4))


@pytest.mark.parametrize("buffer, snapshots, word", [
    (BufferConfig(10, 0.25, 5), False, "tier: hosts of different sizes"),
    (BufferConfig(10), True, "snapshots: hosts of different sizes"),
    (BufferConfig(10), False, "comm: hosts of different sizes need a communicator per host"),
])  # fmt: skip
def test_hosts_of_different_sizes_refuse_what_they_do_not_run(monkeypatch, buffer, snapshots,
                                                              word):  # fmt: skip
    """3 ranks and 1: no node tier, no snapshots, and a communicator per host (an MPI split;
    the fake, as torch.distributed's, spans the job: a lone rank would skip its host's
    collectives); "auto" keeps a buffer per rank instead."""
    monkeypatch.setenv("SOLAR_HOSTS", "3,1")
    s = PlanSpec(RunConfig(400, 4, 8, 2), buffer, sampler=SPLIT)
    assert _share("auto", s, False, 4, FakeComm(4), snapshots) == (None, None)
    with pytest.raises(SolarError) as err:
        _share("node", s, False, 4, FakeComm(4), snapshots)
    assert str(err.value).startswith(f'share="node": {word}') and "\n" not in str(err.value)


class SplitComm(FakeComm):
    """A job whose host communicators are gloo groups (a TorchComm's ``split_hosts``)."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.splits: list = []

    def split_hosts(self, groups):
        self.splits.append(groups)
        return ("host of", groups)


def test_only_a_host_buffer_chosen_makes_host_communicators(monkeypatch):
    """Placing a rank (configure, every Loader) and a buffer per rank (asked, or "auto"
    falling back) create no per-host group; a host buffer does, once every rank agreed."""
    monkeypatch.setenv("SOLAR_HOSTS", "2x2")
    for share, s in (("rank", spec(SPLIT)), ("auto", spec(SHUFFLE))):
        comm = SplitComm(4)
        place(comm)
        assert decide(share, s, comm) == (None, None) and comm.splits == []
    comm = SplitComm(4)
    place(comm)
    hosts, hc = decide("auto", spec(SPLIT), comm)
    assert hosts is not None and hc == ("host of", [[0, 1], [2, 3]])
    assert comm.splits == [[[0, 1], [2, 3]]]
