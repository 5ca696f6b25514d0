"""One buffer per node: the ranks of a host share one RAM buffer (and tier), planned by Belady
over the host's union of accesses (design.md §22).

The node plan reuses the planner unchanged: the host becomes the planner's "rank". For a
sampler that fixes each rank's batch (a GNN's neighbour sampler, ``Trace``, ``Weighted(...,
affinity=False)``) :class:`HostSampler` gives each host, at every step, the concatenation of
its ranks' batches, whose distinct ids (traces.py) are the host's union: Belady with bypass,
page mates and the tier run over it with the host's aggregate capacity, and a row several
local ranks need at a step is one access, read once. For a sampler with affinity (Shuffle,
``Weighted``) the host run has ``H`` ranks of ``L·B`` rows each: the planner splits every
global batch over the hosts, and a host's share is split evenly over its local ranks, reads
dealt round-robin (no row moves between ranks of a host: any of them can serve any row the
node holds).

:func:`plan_node_epoch` then says, for every rank and step, how each of its accesses is
served: a hit in the node buffer (``HIT``/``THIT``, its cell), read from storage by this rank
(its ``ADMIT``/``TADMIT``/``DEMOTE`` with it: the reader stores it), or read at the same step
by another local rank (``PEER``, :attr:`NodeEpoch.reader` names it) and copied from shared
memory. A miss several local ranks need is read by the one with the fewest reads of the step
so far (ties: the lowest local rank); a page mate by the rank reading its page.

With one rank per host the node plan is today's per-rank plan, decision for decision.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import njit

from solar._kept import Kept
from solar.config import BufferConfig, RunConfig
from solar.errors import SolarError
from solar.host.grouping import host_sizes
from solar.schedule._common import (
    ADMIT,
    DEMOTE,
    HIT,
    PEER,
    SIDE,
    TADMIT,
    THIT,
    EpochSchedule,
    tier_slot_count,
)  # fmt: skip
from solar.schedule.nodeequal import deal_equal, rank_targets
from solar.schedule.nodeparts import Parts, merge
from solar.schedule.planner import EpochPlan, Planner, RankEpoch
from solar.schedule.samplers import EpochDraws, Sampler, rank_steps
from solar.schedule.spec import PlanSpec
from solar.schedule.traces import default_horizon
from solar.schedule.transfer import moved_rows

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

    @classmethod
    def of_names(cls, names: list[str]) -> Hosts:
        """The grouping of ranks whose hosts are named ``names[r]`` (hosts in order of their
        first rank)."""
        seen: dict[str, list[int]] = {}
        for r, n in enumerate(names):
            seen.setdefault(n, []).append(r)
        return cls(tuple(tuple(g) for g in seen.values()))

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


class HostSampler(Sampler):
    """``sampler``'s draws regrouped by host: in the host run (``H`` ranks), host h's batch at
    a step is the concatenation of its ranks' batches in the rank run (whose distinct ids are
    the host's union). Only for samplers that fix each rank's batch (no affinity)."""

    kind = "hosts"
    affinity = False

    def __init__(self, sampler: Sampler, run: RunConfig, hosts: Hosts, host: int | None = None,
                 source: Callable[[int, int], EpochDraws] | None = None) -> None:  # fmt: skip
        if sampler.affinity:
            raise SolarError("HostSampler: a sampler with affinity is split by the planner")
        self.inner, self.rank_run, self.hosts, self.host = sampler, run, hosts, host
        # ``source(epoch, rank)``: that rank's batches of the epoch, (steps + 1) offsets
        # (default: drawn here; a host's ranks may each draw their own and share them).
        self.source = source or self.own_draws
        self.horizon = sampler.horizon
        # Epochs kept (drawn, and cut into parts): the planner's look-ahead and the one
        # planned (and one drawn ahead): else parts planned one after another would draw an
        # epoch again and again.
        keep = 2 * (default_horizon(host_run(run, hosts, host), sampler) + 3)
        self._kept: Kept[Any] = Kept(keep)

    def _check(self, run: RunConfig) -> None:
        if run != host_run(self.rank_run, self.hosts, self.host):
            raise SolarError("HostSampler: asked for another run than its host run")

    def epoch(self, run: RunConfig, epoch: int) -> EpochDraws:
        self._check(run)
        return regroup(self.rank_draws(epoch), self.rank_run, self.hosts)

    def rank_epoch(self, run: RunConfig, epoch: int, rank: int) -> EpochDraws:
        """Host ``rank``'s union alone: only its ranks' batches are drawn."""
        self._check(run)
        return regroup(self.rank_draws(epoch, rank), self.rank_run, self.hosts)

    def rank_draws(self, epoch: int, host: int | None = None) -> EpochDraws:
        """The rank run's draws of ``epoch`` (rank layout); with ``host``, only its ranks'
        batches (the others empty). The last few are kept: the planner draws an epoch, the
        split of its decisions over the ranks draws it again."""
        return self._kept.get((epoch, host, None), lambda: self._rank_draws(epoch, host))

    def part_draws(self, epoch: int, host: int | None, parts: Parts) -> list[EpochDraws]:
        """:meth:`rank_draws` cut into every part's of ``parts`` (one sort for all; kept
        alike: the parts' planners each ask for theirs)."""
        return self._kept.get((epoch, host, parts),
                              lambda: parts.split(self.rank_draws(epoch, host)))  # fmt: skip

    def _rank_draws(self, epoch: int, host: int | None) -> EpochDraws:
        if host is None:
            return self.inner.epoch(self.rank_run, epoch)
        world = self.rank_run.world_size
        mine = sorted(self.hosts.groups[host])
        parts = {r: self.source(epoch, r) for r in mine}
        sizes = np.zeros(self.rank_run.steps_per_epoch * world, np.int64)
        batches = []
        for t in range(self.rank_run.steps_per_epoch):
            for r in mine:
                d, g = parts[r], t * world + r
                batches.append(d.ids[d.offsets[t] : d.offsets[t + 1]])
                sizes[g] = batches[-1].size
        offsets = np.zeros(sizes.size + 1, np.int64)
        np.cumsum(sizes, out=offsets[1:])
        ids = np.concatenate(batches) if batches else np.zeros(0, np.int64)
        return EpochDraws(ids, offsets)

    def own_draws(self, epoch: int, rank: int) -> EpochDraws:
        """Rank ``rank``'s batches of ``epoch``, drawn (:func:`own_draws`)."""
        return own_draws(self.inner, self.rank_run, epoch, rank)

    def max_batch(self, run: RunConfig) -> int | None:
        return None

    def identity(self) -> dict[str, Any] | None:
        inner = self.inner.identity()
        return {"kind": self.kind, "hosts": self.hosts.as_record(), "inner": inner}


class PartSampler(HostSampler):
    """``base``'s draws with only part ``part``'s rows (solar/schedule/nodeparts.py): part
    ``part`` of the host buffer is planned over them."""

    kind = "part"

    def __init__(self, base: HostSampler, parts: Parts, part: int, sourced: bool = False) -> None:
        super().__init__(base.inner, base.rank_run, base.hosts, base.host, base.source)
        self.base, self.parts, self.part = base, parts, part
        # ``sourced``: base's source gives this part's rows alone (a host's ranks post each
        # part's draws apart): nothing to cut.
        self.sourced = sourced

    def rank_draws(self, epoch: int, host: int | None = None) -> EpochDraws:
        """This part's rows of the base's draws (kept by the base, not again here)."""
        if self.sourced:
            return self.base.rank_draws(epoch, host)
        return self.base.part_draws(epoch, host, self.parts)[self.part]

    def identity(self) -> dict[str, Any] | None:
        return {"kind": self.kind, "part": self.part, "of": self.parts.count,
                "inner": self.base.identity()}  # fmt: skip


def own_draws(sampler: Sampler, run: RunConfig, epoch: int, rank: int) -> EpochDraws:
    """Rank ``rank``'s batches of ``epoch`` as ``sampler`` draws them: (steps + 1) offsets, one
    batch per step."""
    return rank_steps(sampler.rank_epoch(run, epoch, rank), run, rank)


def regroup(draws: EpochDraws, run: RunConfig, hosts: Hosts) -> EpochDraws:
    """``draws`` of the rank run as the host run's: host h's batch at step t is its ranks'
    batches at step t, in local-rank order."""
    world, steps = run.world_size, run.steps_per_epoch
    lo, hi = draws.offsets[:-1], draws.offsets[1:]
    flat = np.array([r for g in hosts.groups for r in g], np.int64)  # ranks in host order
    # Batch g = t·P + r of the rank run, in host order: t, then h, then local rank.
    order = (np.arange(steps)[:, None] * world + flat[None, :]).reshape(-1)
    sizes = (hi - lo)[order]
    idx = np.repeat(lo[order] - np.concatenate([[0], np.cumsum(sizes)[:-1]]), sizes)
    idx += np.arange(idx.size)
    starts = np.cumsum([0] + [len(g) for g in hosts.groups[:-1]])
    grouped = np.add.reduceat(sizes.reshape(steps, world), starts, axis=1).reshape(-1)
    offsets = np.zeros(grouped.size + 1, np.int64)
    np.cumsum(grouped, out=offsets[1:])
    return EpochDraws(draws.ids[idx], offsets)


def host_run(run: RunConfig, hosts: Hosts, host: int | None = None) -> RunConfig:
    """The run as the node planner sees it: one rank per host, ``L·B`` rows per step each
    (the same global batches and steps). Hosts of different sizes are planned one at a time:
    ``host``'s ``L``."""
    if hosts.world != run.world_size:
        raise SolarError(f"hosts: {hosts.world} ranks grouped, but the run has {run.world_size}")
    per = _per(hosts, host)
    if hosts.uniform:
        return dataclasses.replace(run, world_size=hosts.count, batch_size=run.batch_size * per)
    # H·L·B positions per step are not the rank run's P·B: the steps are kept (a sampler that
    # fixes each rank's batch draws them; positions only count steps here).
    steps, batch = run.steps_per_epoch, run.batch_size * per
    return dataclasses.replace(run, world_size=hosts.count, batch_size=batch,
                               draws=steps * hosts.count * batch, drop_last=True)  # fmt: skip


def _per(hosts: Hosts, host: int | None) -> int:
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


def node_spec(spec: PlanSpec, hosts: Hosts, buffer: BufferConfig | None = None,
              host: int | None = None,
              source: Callable[[int, int], EpochDraws] | None = None) -> PlanSpec:  # fmt: skip
    """The plan inputs of the hosts' buffers: the host run, ``buffer`` (default: ``spec``'s
    per-rank buffer times the ranks per host: the host's aggregate) and the sampler regrouped
    by host where it fixes each rank's batch. Hosts of different sizes (only where the sampler
    fixes each rank's batch: every host is then planned alone) need ``host``: its inputs."""
    why = unequal_refusal(spec, hosts)
    if why:
        raise SolarError(why)
    per = _per(hosts, host)
    run = host_run(spec.run, hosts, host)
    if buffer is None:
        b = spec.buffer
        buffer = BufferConfig(b.capacity * per, b.slack, b.tier * per)
    sampler = spec.sampler
    if spec.traced and not spec.affinity:
        sampler = HostSampler(spec.sampler, spec.run, hosts, None if hosts.uniform else host,
                              source)  # fmt: skip
    return dataclasses.replace(spec, run=run, buffer=buffer, sampler=sampler)


def host_parts(host_spec: PlanSpec, hosts: Hosts, host: int | None = None) -> Parts | None:
    """The parts the host buffer of ``host_spec`` is planned in (solar/schedule/nodeparts.py):
    one per local rank where the sampler fixes each rank's batch; else None (one plan)."""
    per = _per(hosts, host)
    if not isinstance(host_spec.sampler, HostSampler) or per < 2:
        return None
    return Parts(per, host_spec.pages)


def part_spec(host_spec: PlanSpec, parts: Parts, j: int, sourced: bool = False) -> PlanSpec:
    """The plan inputs of part ``j`` of ``host_spec``'s buffer: its cells, its rows
    (``sourced``: the host sampler's source gives them alone)."""
    assert isinstance(host_spec.sampler, HostSampler)
    tier = tier_slot_count(host_spec.run, host_spec.buffer)
    buffer = parts.buffer(host_spec.slots, tier, host_spec.buffer.slack, j)
    sampler = PartSampler(host_spec.sampler, parts, j, sourced)
    return dataclasses.replace(host_spec, buffer=buffer, sampler=sampler)


@dataclass(frozen=True)
class NodeEpoch:
    """One epoch of the node plan.

    ``host`` is the hosts' buffers' plan, host h as rank h (the planner's output for the host
    run). ``ranks`` is every rank's service: its accesses at each step (its batch's distinct
    ids; with affinity, its share of the host's), each with the host's decision on it —
    ``HIT``/``THIT`` and its cell; a miss read by this rank carries the host's ``ADMIT``,
    ``TADMIT``, ``DEMOTE`` and cells (the reader stores it); a miss read by another local rank
    is ``PEER`` and ``reader`` names that rank. A page mate (``SIDE``) goes to the rank that
    reads its page. ``at`` is each rank access's index into ``host``'s arrays (in a rank's
    view of an epoch planned in parts, solar/schedule/nodeview.py, a key of its host access,
    the same on every local rank: the parts' accesses numbered one part after another; its
    ``host`` there holds no arrays until asked for a host's decisions).
    """

    epoch: int
    hosts: Hosts
    host: EpochPlan
    ranks: EpochPlan
    reader: np.ndarray  # (rank accesses,) int16: global rank reading it; -1: a buffer hit
    at: np.ndarray  # (rank accesses,) int64 index into host.sample
    # Taken from the board (solar/schedule/nodeboard.py): every step's staging set
    # (offsets, sorted host indexes) and the host's buffer as the epoch starts. None: derived.
    staged: tuple[np.ndarray, np.ndarray] | None = None
    initial: np.ndarray | None = None
    # (P, steps + 1): every rank's step offsets where ``ranks`` holds this host's ranks only.
    all_steps: np.ndarray | None = None

    def rank(self, r: int) -> RankEpoch:
        """Rank ``r``'s service (flags with PEER; slots name the node buffer's cells)."""
        return self.ranks.rank(r)

    def storage_reads(self) -> int:
        """Rows the node reads from storage this epoch (page mates included)."""
        return int(np.count_nonzero((self.host.flags & (HIT | THIT)) == 0))


class PartPlanners:
    """The planners of a host buffer's parts, driven as one (:class:`NodePlanner`'s
    ``planner``: its epoch, skips, contents and snapshots)."""

    def __init__(self, spec: PlanSpec, specs: list[PlanSpec], parts: Parts | None,
                 only_rank: int | None) -> None:  # fmt: skip
        self.spec, self.specs, self.parts = spec, specs, parts
        self.planners = [Planner(s, only_rank=only_rank) for s in specs]
        self.only_rank = self.planners[0].only_rank

    @property
    def epoch(self) -> int:
        return self.planners[0].epoch

    def skip(self) -> None:
        """Plan the next epoch and keep nothing of it."""
        for p in self.planners:
            p.skip()

    def contents(self, r: int) -> np.ndarray:
        """What host ``r``'s cells hold before the next epoch (RAM slots, then tier slots):
        the parts' RAM, then the parts' tiers."""
        if self.parts is None or len(self.planners) == 1:
            return self.planners[0].contents(r)
        return self.parts.cells([p.contents(r) for p in self.planners], self.spec.slots)

    def snapshot(self) -> dict[str, np.ndarray] | None:
        """Every part's state (:meth:`Planner.snapshot`), keys prefixed by part."""
        out: dict[str, np.ndarray] = {}
        for j, p in enumerate(self.planners):
            state = p.snapshot()
            if state is None:
                return None
            out.update({f"part{j}.{k}": v for k, v in state.items()})
        return out

    def restore(self, epoch: int, state: dict[str, np.ndarray]) -> None:
        """Every part's state before ``epoch`` (ValueError: not this run's)."""
        for j, p in enumerate(self.planners):
            pre = f"part{j}."
            p.restore(epoch, {k[len(pre) :]: v for k, v in state.items() if k.startswith(pre)})


class NodePlanner:
    """Plans ``spec``'s run with one buffer per host of ``hosts``; call :meth:`next` once per
    epoch, in order. ``only_host``: plan that host alone where its plan depends on its own
    accesses (a sampler that fixes each rank's batch). A host buffer in parts
    (:func:`host_parts`) is planned part by part and merged; ``part``: only that part (its own
    epoch, cells numbered within it: solar/schedule/nodeparts.py). ``source``: where a
    host's ranks' draws come from (:class:`HostSampler`; with ``part``, that part's rows of
    them only)."""

    def __init__(self, spec: PlanSpec, hosts: Hosts, buffer: BufferConfig | None = None,
                 only_host: int | None = None, part: int | None = None,
                 source: Callable[[int, int], EpochDraws] | None = None) -> None:  # fmt: skip
        self.spec, self.hosts = spec, hosts
        self.host_spec = node_spec(spec, hosts, buffer, only_host, source)
        self.parts = host_parts(self.host_spec, hosts, only_host)
        self.part = part
        count = 1 if self.parts is None else self.parts.count
        if part is not None and not 0 <= part < count:
            raise SolarError(f"node plan: part {part} of a buffer planned in {count}")
        if self.parts is None:
            specs = [self.host_spec]
        else:
            which = range(self.parts.count) if part is None else [part]
            specs = [part_spec(self.host_spec, self.parts, j, part is not None and
                               source is not None) for j in which]  # fmt: skip
        self.planner = PartPlanners(self.host_spec, specs, self.parts, only_host)
        self.only_host = self.planner.only_rank
        self.rank_run = spec.run

    @property
    def epoch(self) -> int:
        return self.planner.epoch

    def next(self) -> NodeEpoch:
        """Plan the next epoch."""
        k = self.planner.epoch
        eps = []
        for s, p in zip(self.planner.specs, self.planner.planners, strict=True):
            seq, sched = p.next_schedule()
            eps.append(plan_node_epoch(s, self.rank_run, self.hosts, k, seq, sched,
                                       p.group(seq, sched), p.order))  # fmt: skip
        if len(eps) == 1:
            return eps[0]
        assert self.parts is not None
        tier = tier_slot_count(self.host_spec.run, self.host_spec.buffer)
        host, ranks, reader, at = merge(
            [e.host for e in eps], [e.ranks for e in eps], [e.reader for e in eps],
            [e.at for e in eps], self.parts.bases(self.host_spec.slots), self.parts.bases(tier),
        )  # fmt: skip
        return NodeEpoch(k, self.hosts, host, ranks, reader, at)


def plan_node_epoch(
    host_spec: PlanSpec,
    rank_run: RunConfig,
    hosts: Hosts,
    k: int,
    seq: np.ndarray,
    sched: EpochSchedule,
    host: EpochPlan,
    order: Any,
) -> NodeEpoch:
    """Split the host plan of epoch ``k`` (``seq``/``sched`` step-major, ``host`` grouped)
    into every rank's service (see :class:`NodeEpoch`)."""
    world, steps = rank_run.world_size, rank_run.steps_per_epoch
    table = hosts.table()
    flags = np.ascontiguousarray(sched.flags)
    n = seq.size
    # Index of every step-major access in ``host``'s host-major arrays.
    to_host = np.empty(n, np.int64)
    _host_index(np.asarray(sched.rank), host.rank_offsets[:-1].copy(), to_host)
    samples = np.asarray(seq, np.int64)
    counts = np.zeros((steps, world), np.int64)
    reader = np.full(n, -1, np.int16)
    bounds = np.zeros(steps + 1, np.int64)
    np.cumsum(sched.access_counts.sum(axis=1), out=bounds[1:])
    if isinstance(host_spec.sampler, HostSampler):  # each rank's batch fixed by the sampler
        draws = host_spec.sampler.rank_draws(k, order.only_rank)
        pages = host_spec.pages
        layout = np.zeros(0, np.int64) if pages is None else np.array(
            [pages.offset, pages.row_bytes, pages.page], np.int64)  # fmt: skip
        n_pages = 1 if pages is None else \
            (pages.offset + rank_run.num_samples * pages.row_bytes) // pages.page + 1  # fmt: skip
        cap = draws.ids.size + int(np.count_nonzero(flags & SIDE))
        out_rank = np.empty(cap, np.int64)
        out_at = np.empty(cap, np.int64)
        bad = _split_traced(
            draws.ids, draws.offsets, table, samples, flags, sched.access_counts.astype(np.int64),
            rank_run.num_samples, layout, n_pages, reader, out_rank, out_at, counts,
        )  # fmt: skip
        if bad >= 0:
            raise SolarError(f"node plan: epoch {k}: a rank's access {bad} is not in its host's")
        m = int(counts.sum())
        out_rank, out_at = out_rank[:m], out_at[:m]
    else:
        out_rank = np.empty(n, np.int64)
        out_at = np.empty(n, np.int64)
        host_of = np.asarray(sched.rank, np.int64)
        if host_spec.equal_batches:  # every rank serves its share ± the host's surplus
            targets = rank_targets(sched.counts, hosts.groups)
            deal_equal(bounds, host_of, flags, hosts.groups, targets, reader, out_rank, out_at,
                       counts)  # fmt: skip
        else:
            _split_affinity(bounds, host_of, flags, table, reader, out_rank, out_at, counts)
    # A slot stored twice at a step: only the last store counts (hits read the step's start),
    # and local ranks store side by side, in no order: the earlier stores are dropped.
    ram = max(1, host_spec.slots)
    cells = ram + max(0, host_spec.buffer.tier)
    dead = np.zeros(n, np.uint8)
    _dead_stores(bounds, np.asarray(sched.rank, np.int64), flags, np.asarray(sched.slot),
                 np.asarray(sched.tslot), ram, cells, hosts.count, dead)  # fmt: skip
    rank_offsets = np.zeros(world + 1, np.int64)
    np.cumsum(counts.sum(axis=0), out=rank_offsets[1:])
    step_offsets = np.zeros((world, steps + 1), np.int64)
    np.cumsum(counts.T, axis=1, out=step_offsets[:, 1:])
    m = out_rank.size
    r_sample = np.empty(m, np.int64)
    r_slot = np.empty(m, np.int32)
    r_tslot = np.empty(m, np.int32)
    r_flags = np.empty(m, np.uint8)
    r_reader = np.empty(m, np.int16)
    r_at = np.empty(m, np.int64)
    _rank_major(out_rank, out_at, rank_offsets[:-1].copy(), samples, flags, np.asarray(sched.slot),
                np.asarray(sched.tslot), reader, dead, to_host, r_sample, r_slot, r_tslot,
                r_flags, r_reader, r_at)  # fmt: skip
    ranks = EpochPlan(k, rank_offsets, step_offsets, r_sample, r_slot, r_flags, r_tslot)
    return NodeEpoch(k, hosts, host, ranks, r_reader, r_at)


@njit(cache=True, nogil=True)
def _rank_major(out_rank, out_at, fill, samples, flags, slot, tslot, reader, dead, to_host,
                r_sample, r_slot, r_tslot, r_flags, r_reader, r_at):  # fmt: skip
    """Every rank's accesses (step-major ``out_rank``/``out_at``) in rank-major order (a
    stable counting sort), with the host's decision on each: a miss another local rank reads
    is PEER (no store, no cell), a store or tier write overwritten later in its step is
    dropped (``dead``), and a hit several local ranks take (a tier hit promoted to RAM) is
    stored by the first of them."""
    claimed = np.zeros(flags.shape[0], np.bool_)
    for j in range(out_rank.shape[0]):
        r = out_rank[j]
        i = out_at[j]
        d = fill[r]
        fill[r] += 1
        f = flags[i]
        s, ts = slot[i], tslot[i]
        rd = reader[i]
        if not f & (HIT | THIT) and rd != r:
            f = (f & ~(ADMIT | TADMIT | DEMOTE)) | PEER
            s, ts = -1, -1
        else:
            if dead[i] & 1:
                f = f & ~ADMIT
                s = -1
            if dead[i] & 2:
                f = f & ~(TADMIT | DEMOTE)
            if f & (ADMIT | TADMIT | DEMOTE):
                if claimed[i]:
                    f = f & ~(ADMIT | TADMIT | DEMOTE)
                claimed[i] = True
        r_sample[d] = samples[i]
        r_slot[d] = s
        r_tslot[d] = ts
        r_flags[d] = f
        r_reader[d] = rd
        r_at[d] = to_host[i]


@njit(cache=True, nogil=True)
def _host_index(rank, fill, out):
    """``out[i]``: where access i lands in the host-major order (planner._group's)."""
    for i in range(rank.shape[0]):
        out[i] = fill[rank[i]]
        fill[rank[i]] += 1


@njit(cache=True, nogil=True)
def _dead_stores(bounds, host_of, flags, slot, tslot, ram, cells, hosts, dead):
    """``dead[i] & 2``: access i's tier write (TADMIT, or DEMOTE's) is overwritten later in
    its step by another of its host to the same tier slot (no tier slot is read within a step:
    tier hits read the tier as the step starts); ``dead[i] & 1``: its RAM store (ADMIT, no
    live demotion, no tier hit) is overwritten later in its step by another store of its host
    to the same slot, with no live demotion reading it in between."""
    stamp = np.full(hosts * cells, -1, np.int64)
    for t in range(bounds.shape[0] - 1):
        for i in range(bounds[t + 1] - 1, bounds[t] - 1, -1):
            if flags[i] & (TADMIT | DEMOTE):
                key = host_of[i] * cells + ram + tslot[i]
                if stamp[key] == t:
                    dead[i] |= 2
                stamp[key] = t
        for i in range(bounds[t + 1] - 1, bounds[t] - 1, -1):
            demotes = flags[i] & DEMOTE and not dead[i] & 2
            if flags[i] & ADMIT and not demotes and not flags[i] & THIT:
                key = host_of[i] * cells + slot[i]
                if stamp[key] == t:
                    dead[i] |= 1
                stamp[key] = t
            elif demotes:  # reads the slot first: the stores before it count
                stamp[host_of[i] * cells + slot[i]] = -1


@njit(cache=True, inline="always")
def _least(mask, loads, local):
    """The local rank of ``mask`` with the fewest reads (ties: the lowest)."""
    best = -1
    for j in range(local):
        if mask & (np.int64(1) << j) and (best < 0 or loads[j] < loads[best]):
            best = j
    return best


@njit(cache=True, nogil=True)
def _split_traced(ids, offsets, table, samples, flags, seg_counts, n, layout, n_pages, reader,
                  out_rank, out_at, counts):  # fmt: skip
    """Each rank's distinct ids at each step, matched to its host's access (``out_at``), and
    the reader of each host miss (``reader``, a global rank). Returns -1, or the first rank
    access its host's step lacks."""
    hosts, local = table.shape
    world = int((table >= 0).sum())  # (hosts may run different numbers of ranks)
    steps = seg_counts.shape[0]
    # pos[x]: x's access in the host's step, valid only where it points into the step at x
    # (one array touched at random, not three: the split costs about as much as Belady).
    pos = np.empty(n, np.int64)
    pstamp = np.full(n_pages, -1, np.int64)
    preader = np.zeros(n_pages, np.int64)
    mask = np.zeros(samples.shape[0], np.int64)
    loads = np.zeros(local, np.int64)
    m = 0
    p = 0
    for t in range(steps):
        for h in range(hosts):
            q = p + seg_counts[t, h]
            tag = t * hosts + h
            for i in range(p, q):
                pos[samples[i]] = i
                mask[i] = 0
            for j in range(local):
                r = table[h, j]
                if r < 0:
                    continue  # (a host with fewer ranks)
                g = t * world + r
                bit = np.int64(1) << j
                c = 0
                for u in range(offsets[g], offsets[g + 1]):
                    x = ids[u]
                    if x < 0 or x >= n:
                        return u
                    i = pos[x]
                    if i < p or i >= q or samples[i] != x or flags[i] & SIDE:
                        return u
                    if mask[i] & bit:
                        continue  # a repeat within the batch: a copy
                    mask[i] |= bit
                    out_rank[m] = r
                    out_at[m] = i
                    m += 1
                    c += 1
                counts[t, r] = c
            loads[:] = 0
            everyone = np.int64(0)
            for j in range(local):
                if table[h, j] >= 0:
                    everyone |= np.int64(1) << j
            # Reads one rank needs are its own; then the shared ones, to the least loaded.
            for i in range(p, q):
                if flags[i] & (HIT | THIT | SIDE):
                    continue
                b = mask[i]
                if b & (b - 1) == 0:
                    j = _least(b, loads, local)
                    loads[j] += 1
                    reader[i] = table[h, j]
            for i in range(p, q):
                if flags[i] & (HIT | THIT | SIDE):
                    continue
                b = mask[i]
                if b & (b - 1) != 0:
                    j = _least(b, loads, local)
                    loads[j] += 1
                    reader[i] = table[h, j]
            if layout.shape[0]:
                off, rb, pg = layout[0], layout[1], layout[2]
                for i in range(p, q):
                    if flags[i] & (HIT | THIT | SIDE):
                        continue
                    x = samples[i]
                    for page in range((off + x * rb) // pg, (off + x * rb + rb - 1) // pg + 1):
                        pstamp[page] = tag
                        preader[page] = reader[i]
                for i in range(p, q):
                    if not flags[i] & SIDE:
                        continue
                    page = (off + samples[i] * rb) // pg
                    if pstamp[page] == tag:
                        r = preader[page]
                    else:
                        r = table[h, _least(everyone, loads, local)]
                    reader[i] = r
                    out_rank[m] = r
                    out_at[m] = i
                    m += 1
                    counts[t, r] += 1
            p = q
    return -1


@njit(cache=True, nogil=True)
def _split_affinity(bounds, host_of, flags, table, reader, out_rank, out_at, counts):
    """A host's share of each global step dealt to its local ranks: its reads round-robin
    first, then its hits, so local batches differ by at most one row and reads too; each rank
    reads its own misses."""
    hosts, local = table.shape
    nreads = np.zeros(hosts, np.int64)
    dealt = np.zeros(hosts, np.int64)
    dealt_hits = np.zeros(hosts, np.int64)
    m = 0
    for t in range(bounds.shape[0] - 1):
        a, b = bounds[t], bounds[t + 1]
        nreads[:] = 0
        dealt[:] = 0
        dealt_hits[:] = 0
        for i in range(a, b):
            if not flags[i] & (HIT | THIT):
                nreads[host_of[i]] += 1
        for i in range(a, b):
            h = host_of[i]
            if flags[i] & (HIT | THIT):
                j = (nreads[h] + dealt_hits[h]) % local
                dealt_hits[h] += 1
            else:
                j = dealt[h] % local
                dealt[h] += 1
            r = table[h, j]
            if not flags[i] & (HIT | THIT):
                reader[i] = r
            out_rank[m] = r
            out_at[m] = i
            m += 1
            counts[t, r] += 1


def host_phases(local: np.ndarray, flags: np.ndarray, slot: np.ndarray,
                tslot: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The host's updates of a step, in its access order (the local rank applying each,
    ``flags``, RAM ``slot``, tier ``tslot``), cut into phases applied in turn where a RAM slot
    would be stored, or a tier slot written, a second time: each update's phase, and for each
    phase whether the host's ranks wait for each other before it. They wait only where the
    cell was updated by another local rank since they last did: within those waits every cell
    is one rank's, updated in its phases' order (a demotion reads the slot its own access
    stores), so the ranks apply a phase side by side, in any order."""
    f = np.asarray(flags, np.int64)
    stores = np.where(f & ADMIT, slot, -1)
    writes = np.where(f & (TADMIT | DEMOTE), tslot, -1)
    # Cells named 0..m-1 (the stamps below are as long as the step's updates, not the buffer).
    _, ram = np.unique(stores, return_inverse=True)
    _, tier = np.unique(writes, return_inverse=True)
    phase = np.empty(f.size, np.int64)
    waits = np.zeros(f.size + 1, np.bool_)
    count = _phases(ram.ravel(), stores >= 0, tier.ravel(), writes >= 0,
                    np.asarray(local, np.int64), phase, waits)  # fmt: skip
    return phase, waits[:count]


@njit(cache=True, nogil=True)
def _phases(ram, stores, tier, writes, local, phase, waits):
    m = ram.size + 1
    ram_seg, ram_who, ram_ph = np.full(m, -1), np.full(m, -1), np.full(m, -1)
    tier_seg, tier_who, tier_ph = np.full(m, -1), np.full(m, -1), np.full(m, -1)
    seg = 0  # since the ranks last waited
    ph = 0
    for i in range(phase.size):
        r, w, q = ram[i], tier[i], local[i]
        if (stores[i] and ram_seg[r] == seg and ram_who[r] != q) or (
            writes[i] and tier_seg[w] == seg and tier_who[w] != q
        ):
            seg += 1
            ph += 1
            waits[ph] = True
        elif (stores[i] and ram_seg[r] == seg and ram_ph[r] == ph) or (
            writes[i] and tier_seg[w] == seg and tier_ph[w] == ph
        ):
            ph += 1
        if stores[i]:
            ram_seg[r], ram_who[r], ram_ph[r] = seg, q, ph
        if writes[i]:
            tier_seg[w], tier_who[w], tier_ph[w] = seg, q, ph
        phase[i] = ph
    return ph + 1


def node_totals(spec: PlanSpec, hosts: Hosts, buffer: BufferConfig | None = None,
                sink: Callable[[NodeEpoch], None] | None = None) -> dict:  # fmt: skip
    """The node plan's figures over the run (what ``solar plan --hosts`` reports): the
    node's accesses (its ranks' union), hits, storage reads (page mates apart), rows a rank
    takes from another's read, and the reads per epoch. Planned epoch by epoch, each handed
    to ``sink`` (a node plan file's writer) if given."""
    # Hosts of different sizes: each planned alone (its decisions depend on its ranks alone).
    alone = [None] if hosts.uniform else list(range(hosts.count))
    if sink is not None and not hosts.uniform:
        raise SolarError(f"hosts {hosts.as_record()}: a node plan file needs as many ranks on "
                         "every host")  # fmt: skip
    planners = [NodePlanner(spec, hosts, buffer, only_host=h) for h in alone]
    acc = hits = reads = side = shared = moved = 0
    for p in [q for _ in range(spec.run.epochs) for q in planners]:  # epoch by epoch
        ne = p.next()
        if sink is not None:
            sink(ne)
        if spec.equal_batches and hosts.count > 1:  # a host's surplus crosses hosts
            moved += int(moved_rows(np.diff(ne.ranks.step_offsets, axis=1).T)[0].sum())
        f = ne.host.flags
        served = (f & SIDE) == 0
        hit = (f & (HIT | THIT)) != 0
        acc += int(served.sum())
        hits += int((hit & served).sum())
        reads += int((~hit & served).sum())
        side += int((~served).sum())
        shared += int(np.count_nonzero(ne.ranks.flags & PEER))
    out = {"hosts": hosts.as_record(),
           "buffer_per_host": [q.host_spec.slots for q in planners] if len(planners) > 1
           else planners[0].host_spec.slots,
           "accesses": acc, "hits": hits, "reads": reads, "side_reads": side,
           "peer_rows": shared, "hit_rate": hits / max(1, acc),
           "reads_per_epoch": reads / spec.run.epochs}  # fmt: skip
    if spec.equal_batches:  # rows the exchange moves between hosts over the run
        out["moved_rows"] = moved
    return out
