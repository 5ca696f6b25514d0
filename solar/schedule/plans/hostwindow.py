"""A rank's share of its host's plan, as the runtime is handed it (``MemoryConfig(share="node")``):
a :class:`HostWindow` over consecutive epochs of the host's node plan (schedule/keep/hostplan.py:
Belady over the union of the host's ranks' accesses), made by the one plan stream
(:class:`~solar.schedule.plans.stream.RankStream`, which plans or reads them). Its
:meth:`~HostWindow.step` is this rank's :class:`~solar.schedule.plans.rankplan.StepPlan`: its
hits in the node's slots, its own storage reads, the admissions it stores (only a row's reader
stores it), and its ``PEER`` rows, read at the same step by another local rank and taken from the
host's staging rows (``stage_rows``/``stage_at``, ``peer_rows``/``peer_at``).
:meth:`~HostWindow.refill_at` is the host's buffer state (every local rank fills its share).
With equal batches on several hosts, :meth:`~HostWindow.transfer` is the rank's exchange of the
host's surplus rows with other hosts' ranks (solar/schedule/keep/hostequal.py). With a tier, the
step's tier hits and tier writes too, its updates cut into the host's phases where the host
updates a cell twice (:func:`~solar.schedule.keep.hostplan.host_phases`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solar.errors import CorruptPlanError, SolarError
from solar.schedule.keep.grouping import HostEpoch
from solar.schedule.keep.hostequal import host_transfer
from solar.schedule.keep.hostplan import host_phases
from solar.schedule.keep.transfer import Transfer
from solar.schedule.plans.rankplan import RankPlan, StepPlan
from solar.schedule.policy import ADMIT, DEMOTE, HIT, PEER, SIDE, TADMIT, THIT


@dataclass(frozen=True)
class Share:
    """Rank ``rank``'s place in its host's buffer: local rank ``local`` of host ``host``
    (global ranks ``group``), the host's ``slots`` and ``tier_slots``, its ``stage_rows``
    (rows one local rank reads for others at a step, at most), the run's steps per epoch
    ``spe`` and whether its batches are equalised (``equal``)."""

    rank: int
    host: int
    local: int
    group: tuple[int, ...]
    slots: int
    tier_slots: int
    stage_rows: int
    spe: int
    equal: bool


class HostWindow:
    """Consecutive epochs of the node plan, from epoch ``first``, seen by a rank (``share``);
    ``initial``: the host's buffer (sample per slot) as they start (None: empty)."""

    def __init__(self, share: Share, parts: list[HostEpoch], first: int,
                 initial: np.ndarray | None, complete: bool) -> None:  # fmt: skip
        self.share, self.parts, self.initial, self.complete = share, parts, initial, complete
        self.spe = share.spe
        self.first_step = first * self.spe
        self.end_step = self.first_step + len(parts) * self.spe
        self._host: RankPlan | None = None

    def host_plan(self) -> RankPlan:
        """The host's buffer plan over the window (its decisions, the host as one rank)."""
        if self._host is None:
            s = self.share
            self._host = RankPlan.from_parts(
                s.host, [ne.host.rank(s.host) for ne in self.parts], s.slots,
                first_step=self.first_step, initial=self.initial, complete=self.complete,
                tier_slots=s.tier_slots,
            )  # fmt: skip
        return self._host

    def step(self, k: int) -> StepPlan:
        """Rank's step ``k``: its accesses in service order, then its side rows."""
        if not self.first_step <= k < self.end_step:
            raise IndexError(f"step {k} is outside steps {self.first_step}..{self.end_step - 1}")
        s = self.share
        e, t = divmod(k - self.first_step, self.spe)
        ne = self.parts[e]
        ranks, so = ne.ranks, ne.ranks.step_offsets

        def span(q: int) -> slice:
            lo = ranks.rank_offsets[q]
            return slice(int(lo + so[q, t]), int(lo + so[q, t + 1]))

        # The host's staging rows of the step: its accesses some local rank takes as PEER, in
        # sample order (every local rank computes the same, or takes the published ones).
        if ne.staged is not None:
            shared = ne.staged[1][ne.staged[0][t] : ne.staged[0][t + 1]]
        else:
            taken = [ne.at[span(q)][(ranks.flags[span(q)] & PEER) != 0] for q in s.group]
            shared = np.unique(np.concatenate(taken))
        if shared.size > s.stage_rows:
            raise SolarError(f"node buffer: step {k} shares {shared.size} rows between local "
                             f"ranks, more than the {s.stage_rows} staging rows made for a "
                             "batch of at most the sampler's bound")  # fmt: skip
        mine = span(s.rank)
        f, at = ranks.flags[mine], ne.at[mine]
        x, slot = ranks.sample[mine].astype(np.int64), ranks.slot[mine].astype(np.int64)
        if np.any(f & (THIT | TADMIT | DEMOTE)) and not s.tier_slots:
            raise CorruptPlanError(f"node plan: step {k} uses a tier the node does not have")
        side = (f & SIDE) != 0
        served = int(np.count_nonzero(~side))
        if np.any(side[:served]):
            raise CorruptPlanError(f"node plan: step {k}'s side rows do not follow its batch")
        hit, peer, admit = (f & HIT) != 0, (f & PEER) != 0, (f & ADMIT) != 0
        thit = (f & THIT) != 0
        own = ~(hit | thit | peer)
        rows = np.arange(f.size, dtype=np.int64)
        stage = own & np.isin(at, shared)
        tier: dict = {}
        if s.tier_slots:
            tslot = ranks.tslot[mine].astype(np.int64)
            demote, tadmit = (f & DEMOTE) != 0, (f & TADMIT) != 0
            tier = dict(tier_rows=rows[thit], tier_slots=tslot[thit], demote_slots=slot[demote],
                        demote_tslots=tslot[demote], tadmit_rows=rows[tadmit],
                        tadmit_tslots=tslot[tadmit])  # fmt: skip
            # The host's phases: where it updates a cell twice, in turn.
            u = self._host_updates(t, ne)
            phase, waits = host_phases(u[:, 1], u[:, 3], u[:, 4], u[:, 5])
            if waits.size > 1:
                of = np.full(f.size, -1, np.int64)
                me = u[:, 1] == s.local
                of[u[me, 2]] = phase[me]
                tier.update(phase_waits=waits, demote_phase=of[demote], admit_phase=of[admit],
                            tadmit_phase=of[tadmit])  # fmt: skip
        peer_at = np.searchsorted(shared, at[peer]).astype(np.int64)
        stage_at = np.searchsorted(shared, at[stage]).astype(np.int64)
        if ne.staged is not None and not (_found(shared, peer_at, at[peer])
                                          and _found(shared, stage_at, at[stage])):  # fmt: skip
            raise CorruptPlanError(f"node plan (shared epoch): step {k}'s staging set does not "
                                   "hold the rows its ranks stage and take")  # fmt: skip
        return StepPlan(
            k, x[:served], rows[own & ~side], rows[hit], slot[hit], rows[admit], slot[admit],
            side_samples=x[side], stage_rows=rows[stage], stage_at=stage_at,
            peer_rows=rows[peer], peer_at=peer_at, **tier,
        )  # fmt: skip

    def _host_updates(self, t: int, ne: HostEpoch) -> np.ndarray:
        """The host's buffer and tier updates at local step ``t`` of ``ne``, in the host's
        access order: rows ``(at, local rank, access, flags, slot, tslot)`` (access: its
        index in that rank's step), int64."""
        ranks, so = ne.ranks, ne.ranks.step_offsets
        parts = []
        for q, r in enumerate(self.share.group):
            lo = ranks.rank_offsets[r]
            a, b = int(lo + so[r, t]), int(lo + so[r, t + 1])
            j = np.flatnonzero(ranks.flags[a:b] & (ADMIT | TADMIT | DEMOTE))
            parts.append(np.stack([ne.at[a + j], np.full(j.size, q), j, ranks.flags[a + j],
                                   ranks.slot[a + j], ranks.tslot[a + j]], axis=1))  # fmt: skip
        out = np.concatenate(parts).astype(np.int64)
        return out[np.argsort(out[:, 0], kind="stable")]

    def transfer(self, k: int) -> Transfer | None:
        """With equal batches on several hosts, step ``k``'s exchange: the rows this rank
        serves over its share go to ranks of other hosts (solar/schedule/keep/hostequal.py); else
        None."""
        if not self.share.equal:
            return None
        if not self.first_step <= k < self.end_step:
            raise IndexError(f"step {k} is outside steps {self.first_step}..{self.end_step - 1}")
        e, t = divmod(k - self.first_step, self.spe)
        ne = self.parts[e]
        so = ne.ranks.step_offsets if ne.all_steps is None else ne.all_steps
        return host_transfer(so, t, self.share.rank, ne.hosts.count)

    def step_actions(self, k: int) -> list[tuple[int, int, int]]:
        """(Never asked: a node step is never ``in_order``; where its host updates a cell
        twice, its phases order the updates.)"""
        raise SolarError("node buffer: no step is applied access by access")

    def contents_at(self, k: int) -> np.ndarray:
        """The host's buffer at the start of step ``k`` (sample per slot, -1: empty)."""
        return self.host_plan().contents_at(k)

    def refill_at(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``(slots, samples)`` the host's buffer must hold to start at step ``k``."""
        return self.host_plan().refill_at(k)


def _found(shared: np.ndarray, where: np.ndarray, rows: np.ndarray) -> bool:
    """Whether ``shared[where]`` is ``rows`` (a staging set received is untrusted)."""
    return not where.size or (int(where.max()) < shared.size
                              and bool(np.all(shared[where] == rows)))  # fmt: skip
