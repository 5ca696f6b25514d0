"""What a host's ranks exchange as they plan their host's buffer (schedule/plans/rankplan.py),
as bytes: each rank's draws of an epoch, one section per part of the buffer (:func:`pack_draws`),
each rank's part of the epoch (:func:`pack`, cells numbered within the part), or local rank 0's
plan of the host's epoch: pure values (a :class:`~solar.host.exchange.Payload`); the exchange
(solar/host/exchange.py) puts each in shared memory of its own, sealed once written (its checks
hold while it is used in place), and names it to the host's ranks over the planning thread's
communicator.

An epoch's payload holds this host's part only: the buffer decisions, the host's ranks'
service, every step's staging set (the rows of the host some local rank takes from another's
read, sorted) and the buffer as the epoch starts. A payload is untrusted input: :func:`unpack`
and :func:`unpack_draws` refuse it in one line unless its header names this run, host, epoch
(and rank or part) and every offset, slot, sample and index is in range (a part's draws: every
row that part's). A rank touches only its own service (with a tier, its host's updates too:
the phases order them), the staging sets, its part's draws and, on a resume, the host's
decisions (checked when first used): the pages of the others' services stay out of its memory.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from solar.errors import CorruptPlanError, SolarError
from solar.host.exchange import Payload
from solar.schedule.draw.draws import EpochDraws
from solar.schedule.keep.grouping import HostEpoch, Hosts
from solar.schedule.keep.hostparts import Parts
from solar.schedule.keep.planner import EpochPlan, RankEpoch
from solar.schedule.policy import PEER

MAGIC = 0x534F4C41524E4F44  # "SOLARNOD"
VERSION = 3  # 2: every rank's step offsets (w_steps); 3: parts, draws, one row per poster
_HEAD = 16  # int64 fields of a payload's header
# What a payload is: local rank 0's epoch of the host (the host planned in one), a rank's
# draws of an epoch, or a part's epoch (schedule/keep/hostparts.py: each local rank plans one).
WHOLE, DRAWS, PART = 0, 1, 2
KINDS = {WHOLE: "epoch", DRAWS: "draws", PART: "part"}
DRAWS_MAGIC = 0x534F4C4152445257  # "SOLARDRW"


def digest(fingerprint: str, hosts: Hosts, host: int) -> tuple[int, int]:
    """Two int64 naming the run, the grouping and the host (a payload's header carries them)."""
    h = hashlib.blake2b(repr((fingerprint, hosts.as_record(), host)).encode(), digest_size=16)
    a, b = np.frombuffer(h.digest(), np.int64)
    return int(a), int(b)


def _layout(steps: int, world: int, n_host: int, n_ranks: int, n_shared: int,
            n_contents: int) -> list[tuple[str, Any, int]]:  # fmt: skip
    """The payload's arrays after its header: (name, dtype, length), in order."""
    return [
        ("h_steps", np.int64, steps + 1), ("h_sample", np.int64, n_host),
        ("h_slot", np.int32, n_host), ("h_tslot", np.int32, n_host),
        ("w_steps", np.int64, world * (steps + 1)), ("r_sample", np.int64, n_ranks),
        ("r_slot", np.int32, n_ranks), ("r_tslot", np.int32, n_ranks),
        ("r_at", np.int64, n_ranks), ("r_reader", np.int16, n_ranks),
        ("s_offsets", np.int64, steps + 1), ("s_values", np.int64, n_shared),
        ("contents", np.int64, n_contents),
        ("h_flags", np.uint8, n_host), ("r_flags", np.uint8, n_ranks),
    ]  # fmt: skip


def _offsets(layout: list[tuple[str, Any, int]]) -> tuple[dict[str, int], int]:
    at, out = _HEAD * 8, {}
    for name, dt, n in layout:
        out[name] = at
        at += -(-(n * np.dtype(dt).itemsize) // 8) * 8
    return out, at


def staging_sets(h_steps: np.ndarray, at: np.ndarray, flags: np.ndarray,
                 n_host: int) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Every step's staging set: the host accesses (``at``) some local rank takes as ``PEER``,
    sorted and distinct per step, as (offsets, values). A rank's access at step t is one of
    its host's accesses of step t, ``h_steps[t]..h_steps[t + 1]``: marking them in one pass
    sorts them by step (no sort: an epoch's rows are millions)."""
    mark = np.zeros(n_host, np.bool_)
    mark[at[(flags & PEER) != 0]] = True
    values = np.flatnonzero(mark).astype(np.int64)
    return np.searchsorted(values, h_steps).astype(np.int64), values


def pack(ne: HostEpoch, host: int, contents: np.ndarray, tag: tuple[int, int],
         part: int = -1) -> Payload:  # fmt: skip
    """Host ``host``'s part of ``ne`` and its buffer ``contents`` as the epoch starts, as
    bytes to post. ``part``: ``ne`` is that part of the host's buffer."""
    group = sorted(ne.hosts.groups[host])
    h = ne.host.rank(host)
    steps = h.step_offsets.size - 1
    ro, so = ne.ranks.rank_offsets, ne.ranks.step_offsets
    lo, hi = int(ro[group[0]]), int(ro[group[-1] + 1])  # the group's ranks are consecutive
    if group != list(range(group[0], group[-1] + 1)):
        raise SolarError(f"host plan: host {host}'s ranks {group} are not consecutive")
    r_at = ne.at[lo:hi] - ne.host.rank_offsets[host]  # (indexes into the host's own part)
    s_off, s_val = staging_sets(h.step_offsets, r_at, ne.ranks.flags[lo:hi], h.sample.size)
    arrays = {
        "h_steps": h.step_offsets, "h_sample": h.sample, "h_slot": h.slot, "h_tslot": h.tslot,
        "h_flags": h.flags, "w_steps": so.reshape(-1),
        "r_sample": ne.ranks.sample[lo:hi], "r_slot": ne.ranks.slot[lo:hi],
        "r_tslot": ne.ranks.tslot[lo:hi], "r_at": r_at, "r_reader": ne.reader[lo:hi],
        "r_flags": ne.ranks.flags[lo:hi], "s_offsets": s_off, "s_values": s_val,
        "contents": contents,
    }  # fmt: skip
    layout = _layout(steps, ne.hosts.world, h.sample.size, hi - lo, s_val.size, contents.size)
    where, nbytes = _offsets(layout)
    head = np.array([MAGIC, VERSION, ne.epoch, host, ne.hosts.world, steps, ne.hosts.count,
                     len(group), h.sample.size, r_at.size, s_val.size, contents.size, nbytes,
                     tag[0], tag[1], part + 1], np.int64)  # fmt: skip
    pieces = [(0, head)]
    for name, dt, n in layout:
        a = np.ascontiguousarray(arrays[name], dtype=dt)
        if a.size != n:
            raise SolarError(f"host plan: {name} has {a.size} entries, not {n}")
        pieces.append((where[name], a))
    return Payload("solar-nodeplan", nbytes, pieces)


def pack_draws(parts: list[EpochDraws], epoch: int, rank: int, tag: tuple[int, int]) -> Payload:
    """Rank ``rank``'s draws of ``epoch``, one section per part of its host's buffer (each
    part's planner reads only its own)."""
    steps = parts[0].offsets.size - 1
    sizes = [d.ids.size for d in parts]
    starts = np.concatenate([[0], np.cumsum(sizes)])
    offsets = np.concatenate([d.offsets + starts[j] for j, d in enumerate(parts)])
    n = int(starts[-1])
    nbytes = (_HEAD + offsets.size + n) * 8
    head = np.array([DRAWS_MAGIC, VERSION, epoch, rank, steps, len(parts), n, nbytes,
                     tag[0], tag[1], 0, 0, 0, 0, 0, 0], np.int64)  # fmt: skip
    pieces = [(0, head), (_HEAD * 8, offsets.astype(np.int64))]
    for j, d in enumerate(parts):
        pieces.append(((_HEAD + offsets.size + int(starts[j])) * 8, np.asarray(d.ids, np.int64)))
    return Payload("solar-nodedraws", nbytes, pieces)


# ``m`` below: a payload's bytes as the exchange maps them, read-only (any buffer numpy reads).
def unpack_draws(m: Any, *, epoch: int, rank: int, steps: int, layout: Parts, part: int,
                 num_samples: int, tag: tuple[int, int]) -> EpochDraws:  # fmt: skip
    """Part ``part``'s section of rank ``rank``'s draws of ``epoch`` (views of the mapping),
    checked: header, offsets, every id in range and of that part of ``layout``."""
    parts = layout.count
    bad = f"host plan (rank {rank}'s shared draws)"
    if len(m) < _HEAD * 8:
        raise CorruptPlanError(f"{bad}: {len(m)} bytes, shorter than its header")
    head = [int(v) for v in np.ndarray(_HEAD, np.int64, buffer=m)]
    if head[:6] != [DRAWS_MAGIC, VERSION, epoch, rank, steps, parts] or \
            (head[8], head[9]) != tag:  # fmt: skip
        raise CorruptPlanError(f"{bad}: its header names another run, rank or epoch")
    n, nbytes = head[6], head[7]
    k = parts * (steps + 1)
    if n < 0 or nbytes != (_HEAD + k + n) * 8 or len(m) < nbytes:
        raise CorruptPlanError(f"{bad}: impossible sizes in its header")
    offsets = np.ndarray(steps + 1, np.int64, buffer=m, offset=(_HEAD + part * (steps + 1)) * 8)
    lo, hi = int(offsets[0]), int(offsets[-1])
    if lo < 0 or hi > n or np.any(np.diff(offsets) < 0):
        raise CorruptPlanError(f"{bad}: its offsets are not offsets into its {n} ids")
    ids = np.ndarray(hi - lo, np.int64, buffer=m, offset=(_HEAD + k + lo) * 8)
    _in("drawn ids", ids, 0, num_samples, bad)
    if ids.size and np.any(layout.of(ids) != part):
        raise CorruptPlanError(f"{bad}: part {part}'s section holds rows of other parts")
    out = offsets - lo
    ids.flags.writeable = False
    return EpochDraws(ids, out)


class _Host(EpochPlan):
    """The host's decisions of a published epoch, checked when first used (a resume's replay,
    an epoch's first step): until then a rank never touches their pages."""

    _limits: tuple[int, int, int]

    def rank(self, r: int) -> RankEpoch:
        if not getattr(self, "_checked", False):  # (all of it: the payload's host's alone)
            n, slots, tier = self._limits
            _in("host samples", self.sample, 0, n)
            _in("host slots", self.slot, -1, slots)
            _in("host tier slots", self.tslot, -1, tier)
            object.__setattr__(self, "_checked", True)
        return super().rank(r)


def _in(what: str, a: np.ndarray, lo: int, hi: int,
        bad: str = "host plan (shared epoch)") -> None:  # fmt: skip
    if a.size and (int(a.min()) < lo or int(a.max()) >= hi):
        raise CorruptPlanError(f"{bad}: {what} outside [{lo}, {hi})")


def _offsets_ok(what: str, o: np.ndarray, end: int) -> None:
    if o.size == 0 or o[0] != 0 or o[-1] != end or np.any(np.diff(o) < 0):
        raise CorruptPlanError(f"host plan (shared epoch): {what} are not offsets 0..{end}")


def unpack(m: Any, *, epoch: int, hosts: Hosts, host: int, rank: int, steps: int,
           num_samples: int, slots: int, tier: int, tag: tuple[int, int],
           part: int = -1) -> HostEpoch:  # fmt: skip
    """The HostEpoch a payload holds (``part``: that part of the host's buffer, its cells
    ``slots`` and ``tier``), seen by global rank ``rank``: its views of the mapping, after
    checking the header and everything this rank uses (see the module's docstring)."""
    bad = "host plan (shared epoch)"
    if len(m) < _HEAD * 8:
        raise CorruptPlanError(f"{bad}: {len(m)} bytes, shorter than its header")
    head = [int(v) for v in np.ndarray(_HEAD, np.int64, buffer=m)]
    group = sorted(hosts.groups[host])
    want = [MAGIC, VERSION, epoch, host, hosts.world, steps, hosts.count, len(group)]
    if head[:8] != want or (head[13], head[14]) != tag or head[15] != part + 1:
        raise CorruptPlanError(
            f"{bad}: its header names another run, host or epoch "
            f"(epoch {head[2]}, host {head[3]}; wanted {epoch}, {host})"
        )
    n_host, n_ranks, n_shared, n_contents, nbytes = head[8:13]
    if min(n_host, n_ranks, n_shared, n_contents) < 0 or n_contents != slots + tier:
        raise CorruptPlanError(f"{bad}: impossible sizes in its header")
    layout = _layout(steps, hosts.world, n_host, n_ranks, n_shared, n_contents)
    where, size = _offsets(layout)
    if nbytes != size or len(m) < size:
        raise CorruptPlanError(f"{bad}: {len(m)} bytes, its header says {nbytes}, sizes {size}")
    a = {name: np.ndarray(n, dt, buffer=m, offset=where[name]) for name, dt, n in layout}
    for v in a.values():
        v.flags.writeable = False
    _offsets_ok("host step offsets", a["h_steps"], n_host)
    # Every rank's step offsets (the exchange of equal batches counts other hosts' ranks too);
    # this host's ranks' services follow.
    w_steps = a["w_steps"].reshape(hosts.world, steps + 1)
    if np.any(w_steps[:, 0] != 0) or np.any(np.diff(w_steps, axis=1) < 0):
        raise CorruptPlanError(f"{bad}: a rank's step offsets are not offsets")
    r_steps = w_steps[group]
    counts = r_steps[:, -1]
    if int(counts.sum()) != n_ranks:
        raise CorruptPlanError(f"{bad}: the ranks' accesses do not add up to {n_ranks}")
    _offsets_ok("staging offsets", a["s_offsets"], n_shared)
    _in("staged accesses", a["s_values"], 0, max(1, n_host))
    _in("buffer contents", a["contents"], -1, num_samples)
    # This rank's own service: everything the step plans it makes read.
    j = group.index(rank)
    lo = int(counts[:j].sum())
    hi = lo + int(counts[j])
    _in("samples", a["r_sample"][lo:hi], 0, num_samples)
    _in("slots", a["r_slot"][lo:hi], -1, slots)
    _in("tier slots", a["r_tslot"][lo:hi], -1, tier)
    _in("host indexes", a["r_at"][lo:hi], 0, max(1, n_host))
    world = hosts.world
    rank_offsets = np.zeros(world + 1, np.int64)
    step_offsets = np.zeros((world, steps + 1), np.int64)
    for i, q in enumerate(group):
        rank_offsets[q + 1] = counts[i]
        step_offsets[q] = r_steps[i]
    np.cumsum(rank_offsets, out=rank_offsets)
    h_offsets = np.zeros(hosts.count + 1, np.int64)
    h_offsets[host + 1 :] = n_host
    h_steps = np.zeros((hosts.count, steps + 1), np.int64)
    h_steps[host] = a["h_steps"]
    host_plan = _Host(epoch, h_offsets, h_steps, a["h_sample"], a["h_slot"], a["h_flags"],
                      a["h_tslot"])  # fmt: skip
    object.__setattr__(host_plan, "_limits", (num_samples, slots, tier))
    ranks = EpochPlan(epoch, rank_offsets, step_offsets, a["r_sample"], a["r_slot"],
                      a["r_flags"], a["r_tslot"])  # fmt: skip
    return HostEpoch(epoch, hosts, host_plan, ranks, a["r_reader"], a["r_at"],
                     staged=(a["s_offsets"], a["s_values"]), initial=a["contents"],
                     all_steps=w_steps)  # fmt: skip


def unpack_part(m: Any, *, epoch: int, hosts: Hosts, host: int, rank: int, steps: int,
                num_samples: int, layout: Parts, part: int, slots: int, tier: int,
                tag: tuple[int, int]) -> HostEpoch:  # fmt: skip
    """Part ``part`` of ``layout`` of host ``host``'s buffer at ``epoch`` (:func:`unpack`,
    its cells ``slots`` and ``tier``), checked also for this rank's rows: that part's only."""
    ne = unpack(m, epoch=epoch, hosts=hosts, host=host, rank=rank, steps=steps,
                num_samples=num_samples, slots=slots, tier=tier, tag=tag, part=part)  # fmt: skip
    own = ne.ranks.rank(rank).sample
    if own.size and np.any(layout.of(own) != part):
        raise CorruptPlanError(f"host plan (part {part}): this rank's service holds rows "
                               "of other parts")  # fmt: skip
    return ne
