"""Proof that every rank serves its host's part of a plan grouped by host safely: one numba pass
per host and epoch, once its host's buffer is proven as a rank of the host run
(solar/schedule/plans/validate.py's :class:`~solar.schedule.plans.validate.PlanValidator`):

* each access points (``at``) into its host's accesses of the same step and names the same
  sample; a hit carries the host's decision and reads a slot that, replaying the stores the
  ranks make (only a row's reader stores it), holds that sample as the step starts; a read is
  the host's miss, stored as the host says (or a store the plan drops: one the host overwrites
  at the same step); after each step every slot the host stores holds what the host plan says
  (a resume refills the host plan's buffer); a ``PEER`` row names a reader of the same host
  that reads that row at that step, and every rank naming one row names the same reader; every
  host access is served (with Shuffle's affinity, by exactly one rank); no slot is stored twice
  in a step; side rows follow the batch; the rows shared at a step fit the host's staging rows;
* with a sampler that fixes each rank's batch, each rank serves exactly its batch's ids;
* with equal batches, every rank's served counts (which drive the exchange across hosts) are
  the equal shares of its host's (:func:`~solar.schedule.keep.hostequal.rank_targets`).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from solar.errors import CorruptPlanError
from solar.schedule.keep.grouping import HostEpoch, Hosts, stage_bound
from solar.schedule.keep.hostequal import rank_targets
from solar.schedule.keep.hostrun import HostSampler
from solar.schedule.policy import ADMIT, DEMOTE, HIT, PEER, SIDE, TADMIT, THIT
from solar.schedule.spec import PlanSpec

# A service's refusals (_OK: none).
(_OK, _AT, _S_SAMPLE, _S_REPEATED, _S_SIDE_FIRST, _TIER, _HIT, _S_SLOT, _STALE, _READER, _READERS,
 _READ, _PEER, _UNSERVED, _TWICE, _NOT_READ, _STAGE, _STORES, _DIVERGE) = range(19)  # fmt: skip

_WHAT = {
    _AT: "its access points outside its host's accesses of the step",
    _S_SAMPLE: "its sample is not the host's access it points at",
    _S_REPEATED: "it serves one sample twice in the step",
    _S_SIDE_FIRST: "a row is served after a side row (side rows follow the batch)",
    _TIER: "a tier flag (no host tier is run)",
    _HIT: "a hit that is not the host's hit (flags, slot or reader differ)",
    _S_SLOT: "a slot outside the host buffer",
    _STALE: "a hit from a slot that does not hold its sample (its rows never stored there)",
    _READER: "a row whose reader is not a rank of its host",
    _READERS: "two ranks name different readers of one row",
    _READ: "a read that is not the host's miss as planned (flags or slot differ)",
    _PEER: "a PEER row that is not a host miss taken as planned (flags, slot or side row)",
    _UNSERVED: "a host access no rank of the host serves",
    _TWICE: "a host access served by two ranks",
    _NOT_READ: "a PEER row whose reader does not read it at that step",
    _STAGE: "more rows shared between local ranks than the host's staging rows",
    _STORES: "two stores into one slot at one step",
    _DIVERGE: "the ranks' stores leave a slot otherwise than the host plan's (a resume refills "
    "the host plan's)",
}


@njit(cache=True, nogil=True)
def _check_services(h_sample, h_slot, h_flags, h_base, h_off, r_sample, r_slot, r_flags,
                    r_reader, r_at, r_base, r_off, group, local_of, n, slots, exclusive,
                    stage_rows, state, hlast, claim, covered, readby, peer, rstamp, sstamp,
                    tag0):  # fmt: skip
    """One epoch of a host's ranks' services (see the module's docstring); ``state`` (the
    host buffer as the ranks' stores leave it) carries over epochs. Returns (code, local rank,
    access index, step)."""
    local = group.shape[0]
    world = local_of.shape[0]
    steps = h_off.shape[0] - 1
    for t in range(steps):
        a, b = h_base + h_off[t], h_base + h_off[t + 1]
        for i in range(a, b):
            claim[i - h_base] = -2
            covered[i - h_base] = 0
            readby[i - h_base] = 0
            peer[i - h_base] = 0
        for j in range(local):
            r = group[j]
            tag = tag0 + t * local + j
            sides = False
            for u in range(r_base[j] + r_off[j, t], r_base[j] + r_off[j, t + 1]):
                i = r_at[u]
                if i < a or i >= b:
                    return _AT, j, u, t
                x = r_sample[u]
                if x != h_sample[i] or x < 0 or x >= n:
                    return _S_SAMPLE, j, u, t
                if rstamp[x] == tag:
                    return _S_REPEATED, j, u, t
                rstamp[x] = tag
                f, hf, s, rd = r_flags[u], h_flags[i], r_slot[u], r_reader[u]
                if f & SIDE:
                    sides = True
                elif sides:
                    return _S_SIDE_FIRST, j, u, t
                if (f | hf) & (THIT | TADMIT | DEMOTE):
                    return _TIER, j, u, t
                if hf & HIT:
                    if f != hf or s != h_slot[i] or rd != -1:
                        return _HIT, j, u, t
                    if s < 0 or s >= slots:
                        return _S_SLOT, j, u, t
                    if state[s] != x:
                        return _STALE, j, u, t
                else:
                    if rd < 0 or rd >= world or local_of[rd] < 0:
                        return _READER, j, u, t
                    c = claim[i - h_base]
                    if c == -2:
                        claim[i - h_base] = rd
                    elif c != rd:
                        return _READERS, j, u, t
                    if rd == r:
                        kept = f == hf and s == h_slot[i]
                        dropped = hf & ADMIT and f == hf & ~ADMIT and s == -1
                        if not (kept or dropped):
                            return _READ, j, u, t
                        if f & ADMIT and (s < 0 or s >= slots):
                            return _S_SLOT, j, u, t
                        readby[i - h_base] = 1
                    else:
                        if f != PEER or s != -1 or hf & SIDE:
                            return _PEER, j, u, t
                        peer[i - h_base] = 1
                covered[i - h_base] += 1
        staged = 0
        for i in range(a, b):
            c = covered[i - h_base]
            if c == 0:
                return _UNSERVED, -1, i, t
            if c > 1 and (exclusive or h_flags[i] & SIDE):
                return _TWICE, -1, i, t
            if claim[i - h_base] != -2 and readby[i - h_base] == 0:
                return _NOT_READ, -1, i, t
            staged += peer[i - h_base]
        if staged > stage_rows:
            return _STAGE, -1, a, t
        # The step's stores, once every hit of it has read the buffer as the step starts.
        for j in range(local):
            for u in range(r_base[j] + r_off[j, t], r_base[j] + r_off[j, t + 1]):
                if r_flags[u] & ADMIT:
                    s = r_slot[u]
                    if sstamp[s] == tag0 + t:
                        return _STORES, j, u, t
                    sstamp[s] = tag0 + t
                    state[s] = r_sample[u]
        # Every slot the host stores at the step holds what its last store put there: the
        # buffer a resume refills (the host plan's) is the one the ranks' stores make.
        for i in range(a, b):
            if h_flags[i] & ADMIT:
                hlast[h_slot[i]] = h_sample[i]
        for i in range(a, b):
            if h_flags[i] & ADMIT and state[h_slot[i]] != hlast[h_slot[i]]:
                return _DIVERGE, -1, i, t
    return _OK, -1, -1, -1


@njit(cache=True, nogil=True)
def _not_batch(ids, offsets, r, world, sample, flags, step_offsets, stamp, tag0):
    """The first step at which rank ``r`` serves other than its batch's distinct ids (its
    accesses' samples are in range and distinct within a step: proven first), or -1."""
    for t in range(step_offsets.shape[0] - 1):
        g = t * world + r
        tag = tag0 + t
        distinct = 0
        for u in range(offsets[g], offsets[g + 1]):
            x = ids[u]
            if stamp[x] != tag:
                stamp[x] = tag
                distinct += 1
        served = 0
        for u in range(step_offsets[t], step_offsets[t + 1]):
            if flags[u] & SIDE:
                continue
            if stamp[sample[u]] != tag:
                return t
            served += 1
        if served != distinct:
            return t
    return -1


class Services:
    """The proof of every rank's service of its host's part (the module's docstring), for the
    hosts ``proven``; each one's buffer as the ranks' stores leave it carries over epochs."""

    def __init__(self, spec: PlanSpec, hosts: Hosts, host_spec: PlanSpec, proven: list[int],
                 stage_rows: int | None) -> None:  # fmt: skip
        self.spec, self.hosts, self.host_spec, self.slots = spec, hosts, host_spec, host_spec.slots
        self.stage_rows = stage_bound(spec, hosts) if stage_rows is None else stage_rows
        n, cells = spec.run.num_samples, max(1, self.slots)
        self.state = {h: np.full(cells, -1, np.int64) for h in proven}
        self.rstamp, self.bstamp = np.full(n, -1, np.int64), np.full(n, -1, np.int64)
        self.sstamp, self.hlast = np.full(cells, -1, np.int64), np.full(cells, -1, np.int64)
        self.exclusive = not (spec.traced and not spec.affinity)  # else a rank's batch is fixed
        self.table = hosts.table()

    def shares(self, ne: HostEpoch, first_step: int) -> None:
        """Every rank's served counts are its equal share of its host's (every rank's: the
        exchange needs them all, and every rank computes it from them alike)."""
        host = np.diff(ne.host.step_offsets, axis=1).T  # (steps, H)
        ranks = np.diff(ne.ranks.step_offsets, axis=1).T  # (steps, P)
        try:
            want = rank_targets(host, self.hosts.groups)
        except AssertionError:  # host counts no dealing can meet (proven hosts never give)
            want = None
        bad = np.arange(ranks.shape[0]) if want is None else \
            np.flatnonzero(np.any(ranks != want, axis=1))  # fmt: skip
        if bad.size:
            t = int(bad[0])
            r = 0 if want is None else int(np.flatnonzero(ranks[t] != want[t])[0])
            raise CorruptPlanError(f"host plan: rank {r}, step {first_step + t}: its served "
                                   "rows are not its equal share of its host's (equal "
                                   "batches)")  # fmt: skip

    def check(self, ne: HostEpoch, h: int) -> None:
        host, ranks = ne.host, ne.ranks
        k, spe = ne.epoch, self.spec.run.steps_per_epoch
        group = self.table[h]
        local_of = np.full(self.hosts.world, -1, np.int64)
        local_of[group] = np.arange(group.size)
        part = int(host.rank_offsets[h + 1] - host.rank_offsets[h])
        claim, covered, readby, peer = (np.zeros(max(1, part), np.int64) for _ in range(4))
        code, j, _, t = _check_services(
            host.sample, host.slot, host.flags, int(host.rank_offsets[h]), host.step_offsets[h],
            ranks.sample, ranks.slot, ranks.flags, ne.reader, ne.at,
            ranks.rank_offsets[group], ranks.step_offsets[group], group, local_of,
            self.spec.run.num_samples, self.slots, self.exclusive, self.stage_rows,
            self.state[h], self.hlast, claim, covered, readby, peer, self.rstamp, self.sstamp,
            np.int64((k * self.hosts.count + h) * spe * group.size),
        )  # fmt: skip
        if code != _OK:
            who = f"rank {int(group[j])}" if j >= 0 else f"host {h}"
            raise CorruptPlanError(f"host plan: {who}, step {k * spe + t}: {_WHAT[code]}")
        if isinstance(self.host_spec.sampler, HostSampler):
            self._batches(ne, h, k)

    def _batches(self, ne: HostEpoch, h: int, k: int) -> None:
        """Each rank of host ``h`` serves exactly the distinct ids of its batch at each step."""
        sampler = self.host_spec.sampler
        assert isinstance(sampler, HostSampler)
        run = self.spec.run
        draws = sampler.rank_draws(k)  # every rank's, as the host validator drew them
        ranks = ne.ranks
        for r in self.table[h]:
            a, b = int(ranks.rank_offsets[r]), int(ranks.rank_offsets[r + 1])
            t = _not_batch(draws.ids, draws.offsets, int(r), run.world_size, ranks.sample[a:b],
                           ranks.flags[a:b], ranks.step_offsets[r], self.bstamp,
                           np.int64((k * run.world_size + r) * run.steps_per_epoch))  # fmt: skip
            if t >= 0:
                raise CorruptPlanError(f"host plan: rank {int(r)}, step "
                                       f"{k * run.steps_per_epoch + t}: the accesses are not "
                                       "the sampler's batch")  # fmt: skip
