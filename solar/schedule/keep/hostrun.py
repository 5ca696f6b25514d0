"""The plan inputs of the hosts' buffers (:func:`host_run_spec`): the host run, the hosts'
aggregate buffer and, for a sampler that fixes each rank's batch, its draws regrouped by host
(:class:`HostSampler`); a host buffer planned in parts (:func:`part_spec`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from solar._kept import Kept
from solar.config import BufferConfig, RunConfig
from solar.errors import SolarError
from solar.schedule.draw.draws import EpochDraws, every_rank, own_draws
from solar.schedule.draw.samplers import Sampler
from solar.schedule.draw.traces import default_horizon
from solar.schedule.keep.grouping import Hosts, host_ranks, host_run, unequal_refusal
from solar.schedule.keep.hostparts import Parts
from solar.schedule.policy import tier_slot_count
from solar.schedule.spec import PlanSpec


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
        mine = self.hosts.groups[host]
        return every_rank(self.rank_run, {r: self.source(epoch, r) for r in mine})

    def own_draws(self, epoch: int, rank: int) -> EpochDraws:
        """Rank ``rank``'s batches of ``epoch``, drawn (:func:`own_draws`)."""
        return own_draws(self.inner, self.rank_run, epoch, rank)

    def max_batch(self, run: RunConfig) -> int | None:
        return None

    def identity(self) -> dict[str, Any] | None:
        inner = self.inner.identity()
        return {"kind": self.kind, "hosts": self.hosts.as_record(), "inner": inner}


class PartSampler(HostSampler):
    """``base``'s draws with only part ``part``'s rows (solar/schedule/keep/hostparts.py): part
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


def host_run_spec(spec: PlanSpec, hosts: Hosts, buffer: BufferConfig | None = None,
              host: int | None = None,
              source: Callable[[int, int], EpochDraws] | None = None) -> PlanSpec:  # fmt: skip
    """The plan inputs of the hosts' buffers: the host run, ``buffer`` (default: ``spec``'s
    per-rank buffer times the ranks per host: the host's aggregate) and the sampler regrouped
    by host where it fixes each rank's batch. Hosts of different sizes (only where the sampler
    fixes each rank's batch: every host is then planned alone) need ``host``: its inputs."""
    why = unequal_refusal(spec, hosts)
    if why:
        raise SolarError(why)
    per = host_ranks(hosts, host)
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
    """The parts the host buffer of ``host_spec`` is planned in (solar/schedule/keep/hostparts.py):
    one per local rank where the sampler fixes each rank's batch; else None (one plan)."""
    per = host_ranks(hosts, host)
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
