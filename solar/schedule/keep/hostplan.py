"""One buffer per node: the ranks of a host share one RAM buffer (and tier), planned by Belady
over the host's union of accesses (design.md §22).

The host plan reuses the planner unchanged: the host becomes the planner's "rank". For a
sampler that fixes each rank's batch (a GNN's neighbour sampler, ``Trace``, ``Weighted(...,
affinity=False)``) :class:`HostSampler` gives each host, at every step, the concatenation of
its ranks' batches, whose distinct ids (traces.py) are the host's union: Belady with bypass,
page mates and the tier run over it with the host's aggregate capacity, and a row several
local ranks need at a step is one access, read once. For a sampler with affinity (Shuffle,
``Weighted``) the host run has ``H`` ranks of ``L·B`` rows each: the planner splits every
global batch over the hosts, and a host's share is split evenly over its local ranks, reads
dealt round-robin (no row moves between ranks of a host: any of them can serve any row the
node holds).

:func:`plan_host_epoch` then says, for every rank and step, how each of its accesses is
served: a hit in the host buffer (``HIT``/``THIT``, its cell), read from storage by this rank
(its ``ADMIT``/``TADMIT``/``DEMOTE`` with it: the reader stores it), or read at the same step
by another local rank (``PEER``, :attr:`HostEpoch.reader` names it) and copied from shared
memory. A miss several local ranks need is read by the one with the fewest reads of the step
so far (ties: the lowest local rank); a page mate by the rank reading its page.

With one rank per host the host plan is today's per-rank plan, decision for decision.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numba import njit

from solar.config import BufferConfig, RunConfig
from solar.errors import SolarError
from solar.schedule.draw.draws import EpochDraws
from solar.schedule.keep.grouping import HostEpoch, Hosts
from solar.schedule.keep.hostequal import deal_equal, rank_targets
from solar.schedule.keep.hostparts import Parts, merge
from solar.schedule.keep.hostrun import HostSampler, host_parts, host_run_spec, part_spec
from solar.schedule.keep.planner import EpochPlan, Planner
from solar.schedule.keep.summary import HostTotals
from solar.schedule.keep.transfer import moved_rows
from solar.schedule.policy import (
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
from solar.schedule.spec import PlanSpec


class PartPlanners:
    """The planners of a host buffer's parts, driven as one (:class:`HostPlanner`'s
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


class HostPlanner:
    """Plans ``spec``'s run with one buffer per host of ``hosts``; call :meth:`next` once per
    epoch, in order. ``only_host``: plan that host alone where its plan depends on its own
    accesses (a sampler that fixes each rank's batch). A host buffer in parts
    (:func:`host_parts`) is planned part by part and merged; ``part``: only that part (its own
    epoch, cells numbered within it: solar/schedule/keep/hostparts.py). ``source``: where a
    host's ranks' draws come from (:class:`HostSampler`; with ``part``, that part's rows of
    them only)."""

    def __init__(self, spec: PlanSpec, hosts: Hosts, buffer: BufferConfig | None = None,
                 only_host: int | None = None, part: int | None = None,
                 source: Callable[[int, int], EpochDraws] | None = None) -> None:  # fmt: skip
        self.spec, self.hosts = spec, hosts
        self.host_spec = host_run_spec(spec, hosts, buffer, only_host, source)
        self.parts = host_parts(self.host_spec, hosts, only_host)
        self.part = part
        count = 1 if self.parts is None else self.parts.count
        if part is not None and not 0 <= part < count:
            raise SolarError(f"host plan: part {part} of a buffer planned in {count}")
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

    def next(self) -> HostEpoch:
        """Plan the next epoch."""
        k = self.planner.epoch
        eps = []
        for s, p in zip(self.planner.specs, self.planner.planners, strict=True):
            seq, sched = p.next_schedule()
            eps.append(plan_host_epoch(s, self.rank_run, self.hosts, k, seq, sched,
                                       p.group(seq, sched), p.order))  # fmt: skip
        if len(eps) == 1:
            return eps[0]
        assert self.parts is not None
        tier = tier_slot_count(self.host_spec.run, self.host_spec.buffer)
        host, ranks, reader, at = merge(
            [e.host for e in eps], [e.ranks for e in eps], [e.reader for e in eps],
            [e.at for e in eps], self.parts.bases(self.host_spec.slots), self.parts.bases(tier),
        )  # fmt: skip
        return HostEpoch(k, self.hosts, host, ranks, reader, at)


def plan_host_epoch(
    host_spec: PlanSpec,
    rank_run: RunConfig,
    hosts: Hosts,
    k: int,
    seq: np.ndarray,
    sched: EpochSchedule,
    host: EpochPlan,
    order: Any,
) -> HostEpoch:
    """Split the host plan of epoch ``k`` (``seq``/``sched`` step-major, ``host`` grouped)
    into every rank's service (see :class:`HostEpoch`)."""
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
            raise SolarError(f"host plan: epoch {k}: a rank's access {bad} is not in its host's")
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
    return HostEpoch(k, hosts, host, ranks, r_reader, r_at)


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
    # (Contiguous: a column of the updates is strided unless it holds one row, and the
    # kernel's signature should not depend on how many there are.)
    count = _phases(ram.ravel(), stores >= 0, tier.ravel(), writes >= 0,
                    np.ascontiguousarray(local, np.int64), phase, waits)  # fmt: skip
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


def host_totals(spec: PlanSpec, hosts: Hosts, buffer: BufferConfig | None = None,
                sink: Callable[[HostEpoch], None] | None = None) -> HostTotals:  # fmt: skip
    """The host plan's figures over the run (what ``solar plan --hosts`` reports): the
    node's accesses (its ranks' union), hits (tier hits among them), storage reads (page mates
    apart), rows a rank takes from another's read, and the reads per epoch. Planned epoch by
    epoch, each handed to ``sink`` (a host plan file's writer) if given."""
    # Hosts of different sizes: each planned alone (its decisions depend on its ranks alone).
    alone = [None] if hosts.uniform else list(range(hosts.count))
    if sink is not None and not hosts.uniform:
        raise SolarError(f"hosts {hosts.as_record()}: a host plan file needs as many ranks on "
                         "every host")  # fmt: skip
    planners = [HostPlanner(spec, hosts, buffer, only_host=h) for h in alone]
    acc = hits = tier_hits = reads = side = shared = moved = 0
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
        tier_hits += int((((f & THIT) != 0) & served).sum())
        reads += int((~hit & served).sum())
        side += int((~served).sum())
        shared += int(np.count_nonzero(ne.ranks.flags & PEER))
    sizes = [q.host_spec.slots for q in planners]
    return HostTotals(hosts.as_record(), sizes if len(sizes) > 1 else sizes[0], acc, hits,
                      tier_hits, reads, side, shared, hits / max(1, acc),
                      reads / spec.run.epochs,
                      moved if spec.equal_batches else None)  # fmt: skip
