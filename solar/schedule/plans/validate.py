"""Proof that an untrusted plan, of any grouping, is safe to execute for a run.

A plan file's checksums are unkeyed: they catch accidents, not edits. Before the runtime moves
a byte, :func:`validate_rank` proves, in one numba pass over the rank's accesses (plus one
permutation per epoch):

* sample ids, slots and flags are within range, and step offsets are consistent with the run;
* every sample the rank serves at global step k is in step k of that epoch's permutation for
  the run's seed, and none is served twice in an epoch;
* every HIT (THIT) reads a RAM (tier) slot that, replaying the plan's own admissions and
  demotions in order, holds that sample at the start of the step (so nothing is read from a
  slot never written).

Across ranks, exactly-once coverage is proven with a keyed multiset digest per epoch: each rank
sums ``mix(sample, key)`` over what it serves, and the ranks' sums must add up to the digest of
the epoch's samples. The key is drawn at run time, so an edited file cannot be crafted to match.

With equal batches, each rank's part also carries every rank's served counts, from which the
ranks compute the exchange of rows (:mod:`solar.schedule.keep.transfer`). The validator proves them
non-negative, adding up to each step's global batch, and equal to the rank's own in its column;
``peers_digest`` lets the ranks prove they all hold the same counts. Then every rank's column is
what that rank serves, every row served is delivered exactly once (the exchange is a bijection
from the surplus rows onto the missing ones), and served exactly once means delivered exactly once.

A plan grouped by host (solar/schedule/keep/hostplan.py) is proven the same way, each host's buffer
as a rank of the host run (a buffer per rank is a plan of hosts of one rank), and then every
rank's service of its host's part (solar/schedule/plans/services.py, one numba pass).

Every index is checked before a kernel uses it: an edited file is refused in one line, it
never reaches memory it does not name.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np
from numba import njit

from solar.config import RunConfig
from solar.errors import CorruptPlanError, first_line
from solar.schedule.draw.epochs import EpochOrder, _positions
from solar.schedule.draw.order import step_bounds
from solar.schedule.draw.rng import GOLDEN, mix64
from solar.schedule.draw.traces import TraceOrder
from solar.schedule.keep.grouping import HostEpoch, Hosts
from solar.schedule.keep.hostrun import host_run_spec
from solar.schedule.keep.planner import EpochPlan, RankEpoch
from solar.schedule.keep.transfer import check_counts
from solar.schedule.plans.rankplan import RankPlan, _replay
from solar.schedule.plans.services import Services
from solar.schedule.policy import (
    ADMIT,
    DEMOTE,
    HIT,
    RELEASE,
    SIDE,
    TADMIT,
    THIT,
    tier_slot_count,
)
from solar.schedule.spec import PlanSpec

_OK, _SAMPLE, _FLAGS, _SLOT, _NOT_IN_STEP, _REPEATED, _STALE_HIT, _SIDE_FIRST = range(8)

# The flag sets an access may carry, and the cells each names: bit 0 a RAM slot, bit 1 a tier
# slot, bit 2 "valid". Anything else is refused.
_NEEDS = np.zeros(2 * SIDE, np.int8)
for _f, _needs in (
    (0, 0), (HIT, 1), (HIT | RELEASE, 1), (ADMIT, 1),  # RAM only
    (THIT, 2), (THIT | RELEASE, 2), (TADMIT, 2),  # the tier only
    (THIT | ADMIT, 3), (THIT | ADMIT | DEMOTE, 3), (ADMIT | DEMOTE, 3),  # promotions, demotions
):  # fmt: skip
    _NEEDS[_f] = 4 | _needs
# A sampler's trace in a RAM buffer may also store side rows (pagemates.py), after the batch.
_NEEDS_SIDES = _NEEDS.copy()
_NEEDS_SIDES[SIDE | ADMIT] = 4 | 1


@njit(cache=True, inline="always")
def _mix(x, key):
    """splitmix64 of ``x ^ key``: a well-spread 64-bit hash."""
    z = np.uint64(x) ^ key
    z += GOLDEN
    return mix64(z)


@njit(cache=True, nogil=True)
def _digest(samples, key):
    """The keyed multiset digest of ``samples``: the sum of their mixes (wrapping)."""
    digest = np.uint64(0)
    for j in range(samples.shape[0]):
        digest += _mix(samples[j], key)
    return digest


@njit(cache=True, inline="always")
def _check_cells(x, f, s, ts, n, c, cells, needs, state):
    """An access's sample, flags and cells in range, and a hit reading its sample."""
    if x < 0 or x >= n:
        return _SAMPLE
    need = needs[f] if f < needs.shape[0] else 0
    if need == 0:
        return _FLAGS
    if (s != -1 and not need & 1) or (need & 1 and not 0 <= s < c):
        return _SLOT
    if (ts != -1 and not need & 2) or (need & 2 and not 0 <= ts < cells - c):
        return _SLOT
    if (f & HIT and state[s] != x) or (f & THIT and state[c + ts] != x):
        return _STALE_HIT
    return _OK


@njit(cache=True, nogil=True)
def _check_epoch(sample, slot, tslot, flags, offsets, k0, bounds, pos, seen, stamp, c, state,
                 key, needs):  # fmt: skip
    """Check one epoch's steps of a rank; returns (code, access index, digest of its samples).

    ``state`` (the replay of the buffer's cells: ``c`` RAM slots, then the tier's) and
    ``seen`` (stamp of the epoch a sample was last served in) carry over from epoch to epoch.
    """
    n = pos.shape[0]
    cells = state.shape[0]
    digest = np.uint64(0)
    for t in range(bounds.shape[0] - 1):
        a, b = offsets[k0 + t], offsets[k0 + t + 1]
        lo, hi = bounds[t], bounds[t + 1]
        for i in range(a, b):  # checks, and hits against the buffer as the step starts
            x = sample[i]
            code = _check_cells(x, flags[i], slot[i], tslot[i], n, c, cells, needs, state)
            if code == _STALE_HIT or code == _OK:  # (in step first: the likelier edit)
                p = pos[x]
                if p < lo or p >= hi:
                    return _NOT_IN_STEP, i, digest
                if seen[x] == stamp:
                    return _REPEATED, i, digest
                seen[x] = stamp
            if code != _OK:
                return code, i, digest
            digest += _mix(x, key)
        _replay(sample, slot, tslot, flags, a, b, c, state)  # then the updates, in order
    return _OK, -1, digest


@njit(cache=True, nogil=True)
def _check_trace_epoch(sample, slot, tslot, flags, offsets, n, c, state, key, needs, stride):
    """:func:`_check_epoch` for a sampler's trace, whose accesses were compared with the
    sampler's already: ranges, flags and hits by replay. The digest mixes ``t * stride + x``
    for access x at the epoch's step t (``stride`` N: each draw bound to its step)."""
    cells = state.shape[0]
    digest = np.uint64(0)
    for t in range(offsets.shape[0] - 1):
        a, b = offsets[t], offsets[t + 1]
        sides = False
        for i in range(a, b):
            code = _check_cells(sample[i], flags[i], slot[i], tslot[i], n, c, cells, needs,
                                state)  # fmt: skip
            if code == _OK and sides and not flags[i] & SIDE:
                code = _SIDE_FIRST  # the runtime serves a step's first rows, sides after them
            if code != _OK:
                return code, i, digest
            if flags[i] & SIDE:
                sides = True  # stored, not served: not in the digest
            else:
                digest += _mix(t * stride + sample[i], key)
        _replay(sample, slot, tslot, flags, a, b, c, state)
    return _OK, -1, digest


class RankValidator:
    """Validates one rank's parts of a plan epoch by epoch, in order, carrying the replay of its
    buffer and the samples it has served; memory O(N + slots), whatever the number of epochs.

    ``mine`` and ``expected`` (E,) uint64 hold the keyed digests of the epochs checked so far:
    of the samples this rank serves, and of all samples each epoch serves.
    """

    permuted = True  # accesses checked against the epoch's permutation (by ``pos``, ``seen``)

    def __init__(
        self,
        run: RunConfig,
        epoch_order: np.ndarray,
        slots: int,
        rank: int,
        key: int,
        tier_slots: int = 0,
        equal_batches: bool = False,
    ) -> None:
        self.run, self.epoch_order, self.slots, self.rank = run, epoch_order, slots, rank
        self.tier_slots = tier_slots
        self.equal_batches = equal_batches
        self._peers = hashlib.blake2b(digest_size=16)  # every rank's counts, epoch by epoch
        self.key = np.uint64(key)
        self.bounds = step_bounds(run)
        # Each sample's position in the epoch's permutation, and the epoch it was last served
        # in: O(N), none where a sampler's trace is compared with its draws instead (0.8 GB of
        # ``seen`` at 10^8 nodes, issue 48).
        n = run.num_samples if self.permuted else 0
        self.pos = np.empty(n, np.int64)
        self.seen = np.full(n, -1, np.int64)
        self.state = np.full(slots + tier_slots, -1, np.int64)  # cells as the next epoch starts
        self.mine = np.zeros(run.epochs, np.uint64)
        self.expected = np.zeros(run.epochs, np.uint64)
        self.next_epoch = 0
        self.order = EpochOrder(run, epoch_order, keep=2)

    def check(self, part: RankEpoch) -> None:
        """Prove the next epoch's part safe, or raise a one-line CorruptPlanError naming the
        rank and step."""
        run, k, rp = self.run, part.epoch, self._next(part)
        _check_shapes(rp, run)
        served = self.order.served(k)
        self.order.prefetch(k + 1)  # drawn while the checks below run
        _positions(served, 0, self.pos)
        self.expected[k] = _digest(served, self.key)
        code, i, self.mine[k] = _check_epoch(
            rp.sample, rp.slot, rp.tslot, rp.flags, rp.step_offsets, 0, self.bounds, self.pos,
            self.seen, k, self.slots, self.state, self.key, _NEEDS,
        )  # fmt: skip
        if code != _OK:
            raise CorruptPlanError(_describe(code, i, rp, self.state))
        if self.equal_batches:
            self._check_peers(part, np.diff(self.bounds))
        self.next_epoch += 1

    def _next(self, part: RankEpoch) -> RankPlan:
        """The next epoch's part as a :class:`RankPlan` (one out of order is refused)."""
        k = part.epoch
        if k != self.next_epoch:
            raise CorruptPlanError(f"rank {self.rank}: epoch {k} checked before {self.next_epoch}")
        return RankPlan.from_parts(self.rank, [part], self.slots,
                                   first_step=k * self.run.steps_per_epoch,
                                   tier_slots=self.tier_slots)  # fmt: skip

    def _check_peers(self, part: RankEpoch, global_sizes: np.ndarray) -> None:
        k0 = part.epoch * self.run.steps_per_epoch
        if part.peers is None:
            raise CorruptPlanError(f"rank {self.rank}, step {k0}: no peer counts (equal batches)")
        error = check_counts(part.peers, global_sizes, self.rank, np.diff(part.step_offsets))
        if error is not None:
            raise CorruptPlanError(f"rank {self.rank}, epoch {part.epoch}: {error}")
        self._peers.update(np.ascontiguousarray(part.peers, dtype=np.int64).data)

    @property
    def peers_digest(self) -> str | None:
        """Digest of every rank's counts in the epochs checked (equal batches; else None):
        the same on every rank, or the ranks would exchange rows inconsistently."""
        return self._peers.hexdigest() if self.equal_batches else None


class TraceValidator(RankValidator):
    """:class:`RankValidator` for a general sampler's plan. Without affinity every step's
    accesses are the distinct ids of the rank's batch as the sampler draws it (in any order);
    with, they are distinct ids of the step's global batch (and the ranks' digests prove each
    served exactly once). Every hit is held (a replay), as with Shuffle. Memory O(slots + an
    epoch's trace): no table of N."""

    permuted = False

    def __init__(self, spec: PlanSpec, slots: int, rank: int, key: int, tier_slots: int = 0):
        run = spec.run
        super().__init__(run, np.arange(run.epochs), slots, rank, key, tier_slots)
        self.affinity = spec.affinity
        # Side rows only where the spec plans page mates, at most a batch's length a step.
        self.needs = _NEEDS if spec.pages is None else _NEEDS_SIDES
        self.trace = TraceOrder(run, spec.sampler, horizon=0, affinity=spec.affinity)

    def check(self, part: RankEpoch) -> None:
        run, k, r, rp = self.run, part.epoch, self.rank, self._next(part)
        _check_shapes(rp, run, limit=None)
        t = self.trace.epoch(k)
        counts = np.diff(rp.step_offsets)
        steps = np.repeat(np.arange(counts.size), counts)
        side = (rp.flags & SIDE) != 0  # stored, not served (their flags are checked below)
        sides = np.bincount(steps[side], minlength=counts.size)
        over = np.flatnonzero(2 * sides > counts)  # more side rows than the batch has
        if over.size:
            raise CorruptPlanError(f"rank {r}, step {rp.first_step + int(over[0])}: "
                                   "more side rows than the batch has rows")  # fmt: skip
        bad = self._not_drawn(rp, steps, ~side, counts - sides, t)
        if bad is not None:
            raise CorruptPlanError(f"rank {r}, step {rp.first_step + bad}: the accesses "
                                   "are not the sampler's batch")  # fmt: skip
        # With affinity the ranks' digests must add up per (step, sample): a draw moved to
        # another step on another rank would leave the epoch's multiset of samples intact.
        stride = np.int64(run.num_samples) if self.affinity else np.int64(0)
        steps = np.repeat(np.arange(t.counts.shape[0], dtype=np.int64), t.counts.sum(axis=1))
        self.expected[k] = _digest(steps * stride + t.sample, self.key)
        code, i, self.mine[k] = _check_trace_epoch(
            rp.sample, rp.slot, rp.tslot, rp.flags, rp.step_offsets, run.num_samples,
            self.slots, self.state, self.key, self.needs, stride,
        )  # fmt: skip
        if code != _OK:
            raise CorruptPlanError(_describe(code, i, rp, self.state))
        self.next_epoch += 1

    def _not_drawn(self, rp: RankPlan, steps: np.ndarray, served: np.ndarray,
                   counts: np.ndarray, t) -> int | None:  # fmt: skip
        """The first step (within the epoch) whose served accesses (``served``, ``counts`` per
        step; ``steps``: each access's step) the sampler did not draw, or None."""
        n = np.int64(self.run.num_samples)
        if not np.all((rp.sample >= 0) & (rp.sample < n)):
            return int(steps[np.argmax((rp.sample < 0) | (rp.sample >= n))])
        steps = steps[served]
        keys = steps * n + rp.sample[served]  # (step, sample): unique within the epoch
        if self.affinity:
            drawn = np.repeat(np.arange(t.counts.shape[0]), t.counts[:, 0]) * n + t.sample
            ok = np.isin(keys, drawn)
            _, first = np.unique(keys, return_index=True)
            ok[np.setdiff1d(np.arange(keys.size), first)] = False  # served twice in a step
        else:
            if not np.array_equal(counts, t.counts[:, self.rank]):
                return int(np.argmax(counts != t.counts[:, self.rank]))
            want = steps * n + t.sample[t.rank == self.rank]
            ok = np.sort(keys) == np.sort(want)
            keys = np.sort(keys)
        if np.all(ok):
            return None
        return int(keys[np.argmax(~ok)] // n)


class PlanValidator:
    """Validates parts of a plan of any grouping epoch by epoch, in order: each buffer's part
    ``parts`` (default every one: a rank's, or grouped by ``hosts`` a host's, the host as a rank
    of the host run) by :class:`RankValidator` (a sampler's trace: :class:`TraceValidator`),
    then, grouped, every rank's service of it (solar/schedule/plans/services.py). A buffer per
    rank is a plan of hosts of one rank whose service is its buffer's part: nothing more to
    prove.
    ``mine``/``expected``: the keyed digests of the parts proven and of every epoch (their sum
    over all parts must equal it)."""

    def __init__(self, spec: PlanSpec, hosts: Hosts | None, epoch_order: np.ndarray, key: int,
                 parts: list[int] | None = None,
                 stage_rows: int | None = None) -> None:  # fmt: skip
        self.spec, self.hosts = spec, hosts
        bs = spec if hosts is None else host_run_spec(spec, hosts)  # the buffers' inputs
        count = spec.run.world_size if hosts is None else hosts.count
        self.parts = list(range(count)) if parts is None else parts
        slots, tier = bs.slots, tier_slot_count(bs.run, bs.buffer)
        equal = hosts is None and spec.equal_batches  # (grouped: the ranks' shares instead)
        self.buffers: dict[int, RankValidator] = {
            q: TraceValidator(bs, slots, q, key, tier) if bs.traced else
            RankValidator(bs.run, epoch_order, slots, q, key, tier, equal) for q in self.parts
        }  # fmt: skip
        self.services = None if hosts is None else Services(spec, hosts, bs, self.parts,
                                                             stage_rows)  # fmt: skip

    @property
    def mine(self) -> np.ndarray:
        return np.asarray(np.sum([v.mine for v in self.buffers.values()], axis=0,
                                 dtype=np.uint64))  # fmt: skip

    @property
    def expected(self) -> np.ndarray:
        return self.buffers[self.parts[0]].expected

    @property
    def peers_digest(self) -> str | None:
        """The part's digest of every rank's counts (one part of equal batches; else None)."""
        return self.buffers[self.parts[0]].peers_digest if len(self.parts) == 1 else None

    def check(self, ep: RankEpoch | EpochPlan | HostEpoch) -> None:
        """Prove the next epoch of the parts proven safe (``ep``: the epoch, or the one part
        proven of it), or raise a one-line CorruptPlanError naming the rank or host and step."""
        for q in self.parts:
            if not isinstance(ep, HostEpoch):
                self.buffers[q].check(ep.rank(q) if isinstance(ep, EpochPlan) else ep)
                continue
            assert self.services is not None
            try:
                self.buffers[q].check(ep.host.rank(q))
            except CorruptPlanError as exc:
                msg = str(exc)
                raise CorruptPlanError("host plan: host " + msg[5:] if msg.startswith("rank ")
                                       else f"host plan: {msg}") from None  # fmt: skip
            self.services.check(ep, q)
        if self.services is not None and self.spec.equal_batches:
            assert isinstance(ep, HostEpoch)
            self.services.shares(ep, ep.epoch * self.spec.run.steps_per_epoch)


def validate_rank(
    rp: RankPlan, run: RunConfig, epoch_order: np.ndarray, key: int
) -> tuple[np.ndarray, np.ndarray]:
    """Prove a whole-run ``rp`` safe for ``run``, or raise a one-line CorruptPlanError naming
    rank and step. Returns the digests ``(mine, expected)`` of :class:`RankValidator`."""
    spe = run.steps_per_epoch
    if rp.first_step != 0 or rp.initial is not None or rp.num_steps != run.num_steps:
        raise CorruptPlanError(f"rank {rp.rank}: {rp.num_steps} steps, the run has {run.num_steps}")
    v = RankValidator(run, epoch_order, rp.slots, rp.rank, key, rp.tier_slots,
                      rp.peers is not None)  # fmt: skip
    off = rp.step_offsets
    bad = np.flatnonzero(np.diff(off) < 0)
    if off[0] != 0 or off[-1] != rp.sample.size or bad.size:
        k = int(bad[0]) if bad.size else 0
        raise CorruptPlanError(f"rank {rp.rank}, step {k}: step offsets are not monotone")
    for e in range(run.epochs):
        lo, hi = int(off[e * spe]), int(off[(e + 1) * spe])
        peers = None if rp.peers is None else rp.peers[e * spe : (e + 1) * spe]
        v.check(RankEpoch(e, rp.sample[lo:hi], rp.slot[lo:hi], rp.flags[lo:hi],
                          off[e * spe : (e + 1) * spe + 1] - lo, rp.tslot[lo:hi],
                          peers))  # fmt: skip
    return v.mine, v.expected


def coverage_error(mine: list[np.ndarray], expected: np.ndarray) -> str | None:
    """Why the ranks' digests ``mine`` (summed, wrapping) differ from the epochs' own, or None."""
    total = np.sum(mine, axis=0, dtype=np.uint64)
    bad = np.flatnonzero(total != expected)
    if bad.size:
        return f"epoch {int(bad[0])} does not serve each of its samples exactly once across ranks"
    return None


def peers_error(digests: list[str | None]) -> str | None:
    """Why the ranks' digests of every rank's counts (equal batches) differ, or None."""
    if any(d != digests[0] for d in digests):
        return "ranks hold different counts of each other's batches (equal batches)"
    return None


# What proving a plan's part gives: the keyed digests of what it serves and of every epoch's
# samples (RankValidator.mine, .expected), and its digest of every rank's counts (or None).
Proof = tuple[np.ndarray, np.ndarray, str | None]


def prove(path: Any, comm: Any, check: Callable[[bool], Proof], speaks: bool = True) -> None:
    """Prove an untrusted plan (the file at ``path``) safe, or raise one CorruptPlanError line
    naming it, on every rank at once. ``check(alone)`` proves this process's part (a rank's, a
    host's): with ``alone`` (no communicator of more than one process) every part, its digests
    summed; it raises CorruptPlanError naming what is wrong (any other exception is the
    rank's verdict alike, its type named: what a file holds may fail anything). With ``comm``
    (every rank calls this collectively) every rank learns every rank's verdict, so all raise
    together (none is left waiting in a collective for a rank that gave up), and the parts'
    digests (each part's once: ``speaks``) prove every epoch's samples served exactly once."""
    together = comm is not None and comm.Get_size() > 1
    mine = expected = peers = error = None
    cause: Exception | None = None
    try:
        mine, expected, peers = check(not together)
    except CorruptPlanError as exc:
        error = str(exc)
    except Exception as exc:  # (an untrusted file may fail anything: the peers wait below)
        who = f"rank {comm.Get_rank()}: " if together else ""
        error, cause = f"{who}{type(exc).__name__}: {first_line(exc)}", exc
    if together:
        verdicts = comm.allgather((mine if speaks else None, error, peers))
        error = next((e for _, e, _ in verdicts if e is not None), None)
        if error is None and expected is not None:
            error = coverage_error([m for m, _, _ in verdicts if m is not None], expected)
        if error is None:
            error = peers_error([p for _, _, p in verdicts])
    elif error is None and mine is not None and expected is not None:
        error = coverage_error([mine], expected)
    if error is not None:
        where = "" if error.startswith("plan ") else f"plan {path}: "
        raise CorruptPlanError(where + error) from cause


def check_coverage(total: np.ndarray, expected: np.ndarray) -> None:
    """Refuse a plan whose ranks' summed digests differ from the epochs' own."""
    error = coverage_error([total], expected)
    if error is not None:
        raise CorruptPlanError(error)


def _check_shapes(rp: RankPlan, run: RunConfig, limit: int | None = -1) -> None:
    """One epoch's part: its arrays' types and shapes, and step offsets from 0 to its length,
    no step longer than ``limit`` (-1: the global batch; None: no limit)."""
    where, k0 = f"rank {rp.rank}", rp.first_step
    off = rp.step_offsets
    if off.shape != (run.steps_per_epoch + 1,):
        raise CorruptPlanError(
            f"{where}, step {k0}: {off.size - 1} steps in an epoch of {run.steps_per_epoch}"
        )
    arrays = (off, rp.sample, rp.slot, rp.flags, rp.tslot)
    if not all(np.issubdtype(a.dtype, np.integer) for a in arrays):
        raise CorruptPlanError(f"{where}, step {k0}: plan arrays must hold integers")
    if not rp.sample.shape == rp.slot.shape == rp.flags.shape == rp.tslot.shape:
        raise CorruptPlanError(f"{where}, step {k0}: plan arrays differ in length")
    steps = np.diff(off)
    if off[0] != 0 or off[-1] != rp.sample.size or np.any(steps < 0):
        k = int(np.argmax(steps < 0)) if np.any(steps < 0) else 0
        raise CorruptPlanError(f"{where}, step {k0 + k}: step offsets are not monotone from 0 to A")
    if limit is not None and np.any(steps > run.global_batch):
        k = int(np.argmax(steps > run.global_batch))
        raise CorruptPlanError(
            f"{where}, step {k0 + k}: {steps[k]} samples exceed the global batch"
        )


def _describe(code: int, i: int, rp: RankPlan, state: np.ndarray) -> str:
    k = rp.first_step + int(np.searchsorted(rp.step_offsets, i, side="right") - 1)
    x, s, f, ts = int(rp.sample[i]), int(rp.slot[i]), int(rp.flags[i]), int(rp.tslot[i])
    need = int(_NEEDS_SIDES[f]) if f < _NEEDS_SIDES.size else 0
    if code == _SAMPLE:
        what = f"sample id {x} is out of range"
    elif code == _FLAGS:
        what = f"sample {x} has invalid flags {f:#x}"
    elif code == _SLOT and need & 1 and not 0 <= s < rp.slots:
        what = f"sample {x} names slot {s}, outside 0..{rp.slots - 1}"
    elif code == _SLOT and need & 2 and not 0 <= ts < rp.tier_slots:
        what = f"sample {x} names tier slot {ts}, outside 0..{rp.tier_slots - 1}"
    elif code == _SLOT:
        what = f"sample {x} names slot {s} / tier slot {ts} its flags {f:#x} do not use"
    elif code == _NOT_IN_STEP:
        what = f"sample {x} is not in this step of the epoch's permutation for the seed"
    elif code == _REPEATED:
        what = f"sample {x} is served twice in one epoch"
    elif code == _SIDE_FIRST:
        what = f"sample {x} is served after a side row (side rows follow the batch)"
    else:
        cell, name = (s, f"slot {s}") if f & HIT else (rp.slots + ts, f"tier slot {ts}")
        held = f"sample {int(state[cell])}" if state[cell] >= 0 else "nothing written"
        what = f"hit for sample {x} from {name}, which holds {held}"
    return f"rank {rp.rank}, step {k}: {what}"
