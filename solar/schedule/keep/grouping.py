"""The job's ranks grouped by host (:class:`Hosts`), the run as a host planner sees it (one
rank per host), and one epoch of a host plan (:class:`HostEpoch`): what the per-rank modules
(plan files, snapshots, the plan) need of the host plan, without its planner
(solar/schedule/keep/hostplan.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from solar.config import RunConfig
from solar.errors import SolarError
from solar.host.grouping import host_sizes
from solar.schedule.keep.planner import EpochPlan, RankEpoch
from solar.schedule.policy import HIT, THIT
from solar.schedule.spec import PlanSpec

MAX_LOCAL = 63  # local ranks per host: a row's needers are a bit mask in an int64


@dataclass(frozen=True)
class Hosts:
    """The job's ranks grouped by host: ``groups[h]`` the global ranks of host h, in local-rank
    order. Hosts may hold different numbers of ranks (:attr:`uniform` says whether they do
    not); a sampler with affinity, which splits each global batch evenly over the hosts, needs
    them equal."""

    groups: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        groups = tuple(tuple(int(r) for r in g) for g in self.groups)
        object.__setattr__(self, "groups", groups)
        flat = sorted(r for g in groups for r in g)
        if not groups or flat != list(range(len(flat))):
            raise SolarError(f"hosts: the groups must split ranks 0..P-1, got {list(groups)}")
        if max(len(g) for g in groups) > MAX_LOCAL:
            most = max(len(g) for g in groups)
            raise SolarError(f"hosts: at most {MAX_LOCAL} ranks per host, got {most}")

    @classmethod
    def parse(cls, text: str, world: int | None = None, what: str = "SOLAR_HOSTS") -> Hosts:
        """``"HxL"``: H hosts of L consecutive ranks (``SOLAR_HOSTS=2x2``), or ``"3,1"``: hosts
        of 3 and 1 consecutive ranks; with ``world``, refused unless the ranks add up to it
        (errors name ``what``): :func:`solar.host.grouping.host_sizes`."""
        ends = np.cumsum([0, *host_sizes(text, world, what)])
        return cls(tuple(tuple(range(ends[h], ends[h + 1])) for h in range(ends.size - 1)))

    @classmethod
    def grid(cls, hosts: int, per_host: int) -> Hosts:
        """``hosts`` hosts of ``per_host`` consecutive ranks each."""
        return cls(tuple(tuple(range(h * per_host, (h + 1) * per_host)) for h in range(hosts)))

    @property
    def world(self) -> int:
        return sum(len(g) for g in self.groups)

    @property
    def count(self) -> int:
        """Hosts."""
        return len(self.groups)

    @property
    def local(self) -> int:
        """Ranks per host (the most on any host)."""
        return max(len(g) for g in self.groups)

    @property
    def uniform(self) -> bool:
        """Whether every host runs as many ranks (what a sampler with affinity needs)."""
        return len({len(g) for g in self.groups}) == 1

    def size(self, host: int | None = None) -> int:
        """Ranks of host ``host`` (None: of every host, which must be equal)."""
        if host is not None:
            return len(self.groups[host])
        if not self.uniform:
            sizes = [len(g) for g in self.groups]
            raise SolarError(f"hosts: ranks per host differ ({sizes}): each host is planned "
                             "alone (only_host=)")  # fmt: skip
        return self.local

    def unequal(self) -> str:
        """The one line refusing what needs equal hosts."""
        sizes = [len(g) for g in self.groups]
        return (f"hosts: ranks per host differ ({sizes}); a sampler with affinity splits "
                "each global batch evenly over the hosts: it needs them equal "
                "(memory=MemoryConfig(share='rank'))")  # fmt: skip

    def host_of(self, rank: int) -> int:
        """The host of global rank ``rank``."""
        for h, g in enumerate(self.groups):
            if rank in g:
                return h
        raise SolarError(f"rank {rank} is on none of the {self.count} hosts")

    def table(self) -> np.ndarray:
        """``(H, L)`` int64: the global rank of each host's local rank (-1 past a host's
        ranks, L the most on any host)."""
        out = np.full((self.count, self.local), -1, np.int64)
        for h, g in enumerate(self.groups):
            out[h, : len(g)] = g
        return out

    def as_record(self) -> list[list[int]]:
        """What a plan file records (and its fingerprint covers)."""
        return [list(g) for g in self.groups]


def host_run(run: RunConfig, hosts: Hosts, host: int | None = None) -> RunConfig:
    """The run as the host planner sees it: one rank per host, ``L·B`` rows per step each
    (the same global batches and steps). Hosts of different sizes are planned one at a time:
    ``host``'s ``L``."""
    if hosts.world != run.world_size:
        raise SolarError(f"hosts: {hosts.world} ranks grouped, but the run has {run.world_size}")
    per = host_ranks(hosts, host)
    if hosts.uniform:
        return dataclasses.replace(run, world_size=hosts.count, batch_size=run.batch_size * per)
    # H·L·B positions per step are not the rank run's P·B: the steps are kept (a sampler that
    # fixes each rank's batch draws them; positions only count steps here).
    steps, batch = run.steps_per_epoch, run.batch_size * per
    return dataclasses.replace(run, world_size=hosts.count, batch_size=batch,
                               draws=steps * hosts.count * batch, drop_last=True)  # fmt: skip


def host_ranks(hosts: Hosts, host: int | None) -> int:
    """Ranks per host as the host run counts them: every host's, or ``host``'s where they
    differ (None there: refused)."""
    return hosts.local if hosts.uniform else hosts.size(host)


def stage_bound(spec: PlanSpec, hosts: Hosts) -> int:
    """Staging rows a host needs at most: a shared row is needed by two local ranks or more,
    each rank's step has at most the sampler's bound of distinct ids."""
    return max(1, hosts.local * spec.sampler.batch_bound(spec.run) // 2)


def unequal_refusal(spec: PlanSpec, hosts: Hosts) -> str:
    """Why ``spec`` cannot be planned on ``hosts`` of different sizes (its sampler splits
    global batches evenly over them, or its batches are equalised), or ""."""
    if not hosts.uniform and (spec.affinity or not spec.traced or spec.equal_batches):
        return hosts.unequal()
    return ""


@dataclass(frozen=True)
class HostEpoch:
    """One epoch of the host plan.

    ``host`` is the hosts' buffers' plan, host h as rank h (the planner's output for the host
    run). ``ranks`` is every rank's service: its accesses at each step (its batch's distinct
    ids; with affinity, its share of the host's), each with the host's decision on it —
    ``HIT``/``THIT`` and its cell; a miss read by this rank carries the host's ``ADMIT``,
    ``TADMIT``, ``DEMOTE`` and cells (the reader stores it); a miss read by another local rank
    is ``PEER`` and ``reader`` names that rank. A page mate (``SIDE``) goes to the rank that
    reads its page. ``at`` is each rank access's index into ``host``'s arrays (in a rank's
    view of an epoch planned in parts, solar/schedule/plans/hostview.py, a key of its host access,
    the same on every local rank: the parts' accesses numbered one part after another; its
    ``host`` there holds no arrays until asked for a host's decisions).
    """

    epoch: int
    hosts: Hosts
    host: EpochPlan
    ranks: EpochPlan
    reader: np.ndarray  # (rank accesses,) int16: global rank reading it; -1: a buffer hit
    at: np.ndarray  # (rank accesses,) int64 index into host.sample
    # Taken from the exchange (schedule/plans/hostpayload.py: local rank 0's payload, or in parts
    # assembled from every part's, solar/schedule/plans/hostview.py): every step's staging set
    # (offsets, sorted host indexes) and the host's buffer as the epoch starts. None: derived.
    staged: tuple[np.ndarray, np.ndarray] | None = None
    initial: np.ndarray | None = None
    # (P, steps + 1): every rank's step offsets where ``ranks`` holds this host's ranks only.
    all_steps: np.ndarray | None = None

    def rank(self, r: int) -> RankEpoch:
        """Rank ``r``'s service (flags with PEER; slots name the host buffer's cells)."""
        return self.ranks.rank(r)

    def storage_reads(self) -> int:
        """Rows the node reads from storage this epoch (page mates included)."""
        return int(np.count_nonzero((self.host.flags & (HIT | THIT)) == 0))
