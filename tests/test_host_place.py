"""A rank's place among its host's ranks (solar/host/place.py): one split of the job's
communicator per process and grouping, by host name or by a forced grouping, each host a
communicator of its own; a communicator that cannot split stays the job's (and says so)."""

from __future__ import annotations

import pytest

from solar.errors import SolarError
from solar.host import place


class Job:
    """Rank ``rank`` of ``size`` whose hosts are ``names``; ``kind``: how it splits
    ("mpi": ``Split(color, key)``, "torch": ``split_hosts(groups)``, None: it cannot)."""

    def __init__(self, rank, names, kind=None):
        self.rank, self.names, self.kind, self.splits = rank, names, kind, []
        if kind == "mpi":
            self.Split = lambda color, key: self._sub(color, key)
        elif kind == "torch":
            self.split_hosts = lambda groups: self._sub(groups, None)

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return len(self.names)

    def allgather(self, obj):
        return list(self.names)  # (what each rank's host name is)

    def _sub(self, how, key):
        self.splits.append((how, key))
        members = how[[self.rank in g for g in how].index(True)] if key is None else \
            [r for r, n in enumerate(self.names) if n == self.names[self.rank]]  # fmt: skip
        return Sub(len(members))


class Sub:
    def __init__(self, size):
        self.size = size

    def Get_size(self):
        return self.size


@pytest.mark.parametrize("kind", ["mpi", "torch"])
def test_ranks_are_placed_by_host_name_once_per_process(monkeypatch, kind):
    monkeypatch.delenv("SOLAR_HOSTS", raising=False)
    job = Job(3, ["a", "a", "a", "b"], kind)
    got = place(job)
    assert got.groups == ((0, 1, 2), (3,)) and (got.host, got.local_rank) == (1, 0)
    assert got.local_size == 1 and got.ranks == (3,) and got.split
    assert place(job) is got and len(job.splits) == 1  # (memoised: one split per grouping)
    assert job.splits[0] == ((1, 3) if kind == "mpi" else ([[0, 1, 2], [3]], None))


def test_a_forced_grouping_splits_consecutive_ranks(monkeypatch):
    monkeypatch.setenv("SOLAR_HOSTS", "2,2")
    job = Job(2, ["x"] * 4, "torch")
    got = place(job)
    assert got.groups == ((0, 1), (2, 3)) and (got.host, got.local_rank) == (1, 0)
    assert job.splits == [([[0, 1], [2, 3]], None)] and got.comm.Get_size() == 2
    monkeypatch.setenv("SOLAR_HOSTS", "1x4")  # another grouping: placed again, no split
    one = place(job)
    assert one.groups == ((0, 1, 2, 3),) and one.comm is job and one.local_rank == 2
    monkeypatch.setenv("SOLAR_HOSTS", "3x2")
    with pytest.raises(SolarError, match="SOLAR_HOSTS 3x2: 3×2 ranks, but the job has 4"):
        place(job)


def test_a_comm_that_cannot_split_stays_the_jobs_and_says_so(monkeypatch):
    monkeypatch.setenv("SOLAR_HOSTS", "3,1")
    job = Job(0, ["x"] * 4)
    got = place(job)
    assert got.comm is job and not got.split and got.local_size == 3
    assert place(None).comm is None and place(None).local_size == 1
