"""Node plan files (solar/schedule/plans/planfile.py grouped by host): ``solar plan --share node``
writes the node plan with its grouping; ``Loader(plan=FILE, share="node")`` serves it, refusing
another grouping or kind; an edited file (checksums recomputed) or a damaged one is refused in one
line before any byte moves (solar/schedule/plans/validate.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest
from click.testing import CliRunner
from helpers import skewed_weighted, write_h5
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ranks_apart import MPIEXEC, run_job

from solar import BufferConfig, CorruptPlanError, Loader, PlanSpec, RunConfig, Shuffle, Weighted
from solar.cli import cli
from solar.errors import PlanMismatchError, SolarError
from solar.options import ExpertConfig, MemoryConfig, PlanningConfig
from solar.schedule import ADMIT, HIT, PEER, SIDE, THIT, load_plan
from solar.schedule.keep.grouping import HostEpoch, Hosts
from solar.schedule.keep.hostplan import HostPlanner, host_totals
from solar.schedule.keep.planner import EpochPlan
from solar.schedule.keep.summary import HostTotals
from solar.schedule.plans.plan import Plan, make_plan, plan_to_file, simulate
from solar.schedule.plans.planfile import PlanWriter
from solar.schedule.plans.planfile import fingerprint as node_fingerprint
from solar.schedule.plans.validate import PlanValidator

N = 240
RUN = RunConfig(N, 4, 6, 3, seed=5)
WEIGHTS = (1.0 + np.arange(N)) ** -0.8


def _spec(sampler=None) -> PlanSpec:
    s = Weighted(WEIGHTS[np.random.default_rng(1).permutation(N)], affinity=False)
    return PlanSpec(RUN, BufferConfig(8, 0.25), sampler=s if sampler is None else sampler)


def _epochs(spec: PlanSpec, hosts: Hosts) -> list[HostEpoch]:
    p = HostPlanner(spec, hosts)
    return [p.next() for _ in range(spec.run.epochs)]


def _write(spec: PlanSpec, hosts: Hosts, epochs: list[HostEpoch], path: Path) -> Path:
    """A node plan file of ``epochs`` with every checksum computed (as a tool editing it
    would)."""
    with PlanWriter(path, spec, hosts=hosts) as w:
        for ne in epochs:
            w.add(ne)
        w.finish(HostTotals(hosts.as_record(), 0, 0, 0, 0, 0, 0, 0, 0.0, 0.0), 0.0)
    return path


def _edited(path: Path, edit: Callable[[HostEpoch], HostEpoch], hosts: Hosts | None = None,
            epoch: int = 0, spec: PlanSpec | None = None) -> Path:  # fmt: skip
    spec, hosts = spec or _spec(), hosts or Hosts.grid(1, 4)
    epochs = _epochs(spec, hosts)
    ranks = {k: (v.copy() if isinstance(v, np.ndarray) else v)
             for k, v in vars(epochs[epoch].ranks).items()}  # fmt: skip
    e = epochs[epoch]
    host = dataclasses.replace(e.host, slot=e.host.slot.copy())
    ne = dataclasses.replace(e, host=host, ranks=EpochPlan(**ranks), reader=e.reader.copy(),
                             at=e.at.copy())  # fmt: skip
    epochs[epoch] = edit(ne)
    return _write(spec, hosts, epochs, path)


def _validate(path: Path) -> None:
    plan = load_plan(path)
    sampler = None if plan.spec.equal_batches else _spec().sampler  # (Shuffle: recorded whole)
    load_plan(path, sampler).validate(0)  # no comm: every host proven here


# Shuffle with equal batches: 250 rows, a short last batch of 10 (2 or 3 rows a rank).
EQUAL = PlanSpec(RunConfig(250, 4, 6, 3, seed=5), BufferConfig(8, 0.25), equal_batches=True)


def _assert_holds_the_planners_epochs(made, spec, hosts) -> None:
    """Every epoch the file holds is the node planner's, host plan and services alike."""
    for k, want in enumerate(_epochs(spec, hosts)):
        got = made.epoch(k)
        for name in ("rank_offsets", "step_offsets", "sample", "slot", "flags"):
            assert np.array_equal(getattr(got.host, name), getattr(want.host, name)), name
            assert np.array_equal(getattr(got.ranks, name), getattr(want.ranks, name)), name
        assert np.array_equal(got.reader, want.reader) and np.array_equal(got.at, want.at)


def test_a_grouped_plan_sizes_a_host_buffer_and_refuses_a_rank_plan_in_memory_too():
    """A grouped plan's ``slots``/``tier_slots`` are a host's buffer (its ranks'), not a
    rank's; a per-rank query of one made in memory is refused in one line that does not call it
    a file."""
    spec = dataclasses.replace(_spec(), buffer=BufferConfig(8, 0.25, tier=24))
    hosts = Hosts.grid(2, 2)
    plan = make_plan(spec, hosts=hosts)
    host = HostPlanner(spec, hosts).host_spec
    assert (plan.slots, plan.tier_slots) == (host.slots, 2 * 24) != (spec.slots, 24)
    assert host.slots == 2 * spec.slots  # (well below N)
    per_rank = make_plan(spec)
    assert (per_rank.slots, per_rank.tier_slots) == (spec.slots, 24)
    with pytest.raises(SolarError, match=r"^plan: grouped by host \(one buffer per host\)") as e:
        plan.rank(0)
    assert "\n" not in str(e.value) and "file" not in str(e.value)
    got = plan.rank_epoch(1, 0)  # the service of a rank: as planned
    assert np.array_equal(got.sample, plan.epoch(0).rank(1).sample)


def _tier_hits(plan: Plan) -> tuple[int, int]:
    """A grouped plan's (tier hits, RAM hits) counted from its hosts' decisions."""
    flags = np.concatenate([plan.epoch(k).host.flags for k in range(plan.run.epochs)])
    served = (flags & SIDE) == 0
    return (int(np.count_nonzero((flags & THIT != 0) & served)),
            int(np.count_nonzero((flags & HIT != 0) & served)))  # fmt: skip


@pytest.mark.parametrize("grouping", ["4x1", "2x2"])
def test_a_node_plan_counts_its_tier_hits(grouping):
    """A grouped plan's tier hits are its hosts' THIT accesses (they were 0, every hit from
    RAM), in memory and simulated (a node plan file has no tier yet); with one rank per host
    it is the per-rank plan, decision for decision, and so are its totals."""
    spec, hosts = dataclasses.replace(_spec(), buffer=BufferConfig(8, 0.25, tier=24)), \
        Hosts.parse(grouping)  # fmt: skip
    plan = make_plan(spec, hosts=hosts)
    tier_hits, ram_hits = _tier_hits(plan)
    assert tier_hits > 0 and (plan.tier_hits, plan.ram_hits) == (tier_hits, ram_hits)
    assert simulate(spec, hosts=hosts).tier_hits == tier_hits
    if hosts.local > 1:
        return
    per_rank = make_plan(spec)
    for k in range(RUN.epochs):
        got, want = plan.epoch(k).host, per_rank.epoch(k)
        for name in ("rank_offsets", "step_offsets", "sample", "slot", "flags", "tslot"):
            assert np.array_equal(getattr(got, name), getattr(want, name)), (k, name)
    assert (plan.tier_hits, plan.hits, plan.accesses) == \
        (per_rank.tier_hits, per_rank.hits, per_rank.accesses)  # fmt: skip


@pytest.mark.parametrize("grouping", ["1x4", "2x2"])
def test_a_node_plan_file_holds_the_node_plan_with_its_grouping(tmp_path, grouping):
    spec, hosts = _spec(), Hosts.parse(grouping)
    made = plan_to_file(spec, hosts=hosts, path=tmp_path / "n.h5").bound_to(spec)
    assert made.hosts == hosts and made.fingerprint == node_fingerprint(spec, hosts)
    assert made.file.stats == host_totals(spec, hosts)
    assert made.file.stats.peer_rows > 0  # local ranks share rows: PEER services held
    _assert_holds_the_planners_epochs(made, spec, hosts)
    made.validate(0)
    other = Hosts.parse("2x2" if grouping == "1x4" else "1x4")
    assert node_fingerprint(spec, other) != made.fingerprint  # the grouping is an input
    with pytest.raises(PlanMismatchError, match=rf"made for hosts {grouping} .* grouped "):
        made.check_hosts(other)


def test_a_shuffle_node_plan_file_proves_safe(tmp_path):
    spec = dataclasses.replace(_spec(Shuffle()), sampler=Shuffle())
    plan_to_file(spec, hosts=Hosts.grid(2, 2), path=tmp_path / "n.h5").validate(1)


def test_solar_plan_writes_the_same_node_plan_file_of_equal_batches_in_a_fresh_process(tmp_path):
    """The node plan is a pure function of its inputs (the hosts of a job each plan every
    host, and must agree): ``solar plan`` in another process writes this process's file, all
    but its timing."""
    out = tmp_path / "cli.h5"
    args = ["plan", "--samples", "250", "-P", "4", "-B", "6", "-E", "3", "-C", "8", "--slack",
            "0.25", "--seed", "5", "--share", "node", "--hosts", "2x2", "--equal-batches", "-o",
            str(out)]  # fmt: skip
    r = subprocess.run([sys.executable, "-m", "solar.cli", *args], capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    here = plan_to_file(EQUAL, hosts=Hosts.grid(2, 2), path=tmp_path / "here.h5")
    with h5py.File(out) as a, h5py.File(here.file.path) as b:
        names: list[str] = []
        a.visit(names.append)
        b_names: list[str] = []
        b.visit(b_names.append)
        assert names == b_names
        for name in names:
            if isinstance(a[name], h5py.Dataset):
                assert a[name][()].tobytes() == b[name][()].tobytes(), name
        assert {k: v for k, v in a.attrs.items() if k != "plan_seconds"} == \
            {k: v for k, v in b.attrs.items() if k != "plan_seconds"}  # fmt: skip


@pytest.mark.parametrize("grouping", ["1x4", "2x2"])
def test_a_node_plan_file_holds_equal_batches_and_proves_every_rank_its_share(tmp_path, grouping):
    """The file's checksums are those of what it holds: the planner's host plan carries the
    hosts' peer counts, which the file does not (a file of equal batches once failed its own
    checksum); every rank's step offsets come back, whose counts drive the exchange."""
    hosts = Hosts.parse(grouping)
    made = plan_to_file(EQUAL, hosts=hosts, path=tmp_path / "n.h5")
    assert made.spec.equal_batches
    _assert_holds_the_planners_epochs(made, EQUAL, hosts)
    made.validate(0)
    counts = np.diff(made.epoch(0).ranks.step_offsets, axis=1)  # (P, steps)
    if hosts.count == 1:  # no exchange: every rank serves its share
        assert counts[:, 0].tolist() == [6] * 4 and counts[:, -1].tolist() == [3, 3, 2, 2]
    else:  # a host's surplus crosses hosts
        assert np.any(counts != 6)


def test_solar_plan_share_node_writes_a_node_plan_file(tmp_path):
    out = tmp_path / "n.h5"
    args = ["plan", "--samples", "300", "--sample-bytes", "64", "-P", "4", "-B", "6", "-E", "2",
            "-C", "10%", "--share", "node", "--hosts", "2x2", "-o", str(out)]  # fmt: skip
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    assert "hosts 2x2 [[0, 1], [2, 3]]" in r.output and f"-> {out}" in r.output
    plan = load_plan(out)
    assert plan.hosts == Hosts.grid(2, 2) and plan.spec.equal_batches  # a Loader's default
    assert "--variable-batches" not in args and plan.file.stats.moved_rows > 0
    again = CliRunner().invoke(cli, args)
    assert again.exit_code != 0 and "exists (use --force" in str(again.exception)
    shown = CliRunner().invoke(cli, ["inspect", str(out)])
    assert shown.exit_code == 0 and "hosts 2x2 [[0, 1], [2, 3]]" in shown.output, shown.output
    s = json.loads(CliRunner().invoke(cli, [*args[:-4], "--json"]).output)  # default: 1x4
    assert s["share"] == "node" and s["hosts"] == [[0, 1, 2, 3]]
    with pytest.raises(SolarError, match="a host plan file") as err:
        load_plan(out).rank(0)  # a per-rank query refuses it in one line
    assert "\n" not in str(err.value)


def test_a_loader_serves_a_node_plan_file_and_refuses_the_other_kind(tmp_path):
    x = np.random.default_rng(0).integers(0, 2**31, (90, 5), dtype=np.int64)
    data = write_h5(tmp_path / "d.h5", x=x)
    kw = dict(batch_size=8, epochs=2, buffer=20, expert=ExpertConfig(warm=False), seed=3)
    ld = Loader(data, ["x"], **kw)
    node = plan_to_file(ld.spec, hosts=Hosts.grid(1, 1), path=tmp_path / "n.h5")
    ld.close()
    served, state = [], None
    with Loader(data, ["x"], **kw, planning=PlanningConfig(plan=node.file.path),
                memory=MemoryConfig(share="node")) as got:  # fmt: skip
        for e in range(2):
            got.set_epoch(e)
            seen = []
            for t, b in enumerate(got):
                ids = b["index"].numpy()
                assert b["x"].numpy().tobytes() == x[ids].tobytes()
                seen.append(ids)
                served.append(ids)
                if (e, t) == (1, 3):
                    state = got.state_dict()
            assert np.array_equal(np.sort(np.concatenate(seen)), np.arange(90))
        assert got.stats.totals().reads == node.file.stats.reads
    # An exact resume inside epoch 1: the buffer refilled from the file's plan, same batches.
    with Loader(data, ["x"], **kw, planning=PlanningConfig(plan=node.file.path),
                memory=MemoryConfig(share="node")) as again:  # fmt: skip
        again.load_state_dict(state)
        k = state["next_step"]
        for b in again:
            ids = b["index"].numpy()
            assert np.array_equal(ids, served[k]) and b["x"].numpy().tobytes() == x[ids].tobytes()
            k += 1
        assert k == len(served)
    with pytest.raises(PlanMismatchError, match=r"made for another dataset or run: seed 3 "):
        Loader(data, ["x"], **{**kw, "seed": 4}, planning=PlanningConfig(plan=node.file.path),
               memory=MemoryConfig(share="node"))  # fmt: skip
    pass_node = r'a node plan file .*pass memory=MemoryConfig\(share="node"\)'
    with pytest.raises(SolarError, match=pass_node) as err:
        Loader(data, ["x"], **kw, planning=PlanningConfig(plan=node.file.path),
               memory=MemoryConfig(share="rank"))  # fmt: skip
    assert "\n" not in str(err.value) and str(node.file.path) in str(err.value)
    with Loader(
        data, ["x"], **kw, planning=PlanningConfig(plan=node.file.path)
    ) as auto:  # "auto": the file's kind
        assert auto.share == "node"


def test_a_loaders_plan_is_its_node_plan_made_in_memory_saved_as_the_file_would_be(tmp_path):
    """``Loader.plan`` for every grouping: with ``share="node"`` the node plan, made on first
    use, whose reads are the loader's; saved, it is the file ``solar plan --share node``
    writes; given back, the same batches."""
    x = np.random.default_rng(0).integers(0, 2**31, (90, 5), dtype=np.int64)
    data = write_h5(tmp_path / "d.h5", x=x)
    kw = dict(batch_size=8, epochs=2, buffer=20, expert=ExpertConfig(warm=False), seed=3,
              memory=MemoryConfig(share="node"))  # fmt: skip
    served = []
    with Loader(data, ["x"], **kw) as ld:
        plan = ld.plan
        assert isinstance(plan, Plan) and ld.plan is plan and plan.hosts == Hosts.grid(1, 1)
        assert plan.stats == host_totals(ld.spec, plan.hosts) and plan.header is None
        for e in range(2):
            ld.set_epoch(e)
            served += [b["index"].numpy() for b in ld]
        assert ld.stats.totals().reads == plan.stats.reads
        saved = load_plan(plan.save(tmp_path / "n.h5"))
        _assert_holds_the_planners_epochs(saved, ld.spec, plan.hosts)
        saved.validate(0)
        assert saved.stats == plan.stats and saved.fingerprint == plan.fingerprint
    with Loader(data, ["x"], planning=PlanningConfig(plan=plan), **kw) as again:
        got = []
        for e in range(2):
            again.set_epoch(e)
            got += [b["index"].numpy() for b in again]
        assert all(np.array_equal(a, b) for a, b in zip(got, served, strict=True))


def test_a_whole_node_plan_of_unequal_hosts_is_refused_in_one_line():
    """Hosts of 3 and 1 ranks are planned each alone as the loader runs; a whole plan in
    memory (what ``Loader.plan`` makes) is refused naming them, as is its file."""
    hosts = Hosts(((0, 1, 2), (3,)))
    with pytest.raises(SolarError, match=r"hosts \[\[0, 1, 2\], \[3\]\]: ranks per host differ"):
        make_plan(_spec(), hosts=hosts)
    with pytest.raises(SolarError, match="as many ranks on every host"):
        host_totals(_spec(), hosts, sink=lambda ne: None)
    assert host_totals(_spec(), hosts).hosts == [[0, 1, 2], [3]]  # planned, host by host


# -- untrusted input ----------------------------------------------------------------------------
def _first(ne: HostEpoch, flag: int, rank: int | None = None) -> int:
    f = ne.ranks.flags
    lo, hi = (0, f.size) if rank is None else (ne.ranks.rank_offsets[rank],
                                               ne.ranks.rank_offsets[rank + 1])  # fmt: skip
    return int(lo + np.flatnonzero(f[lo:hi] & flag)[0])


def _peer_reader_elsewhere(ne):  # (2x2) a PEER row read by a rank of the other host
    u = _first(ne, PEER)
    ne.reader[u] = (int(ne.reader[u]) + 2) % 4
    return ne


def _peer_reader_not_reading(ne):  # every taker names a local rank without the row
    u = _first(ne, PEER)
    i = ne.at[u]
    holders = {int(np.searchsorted(ne.ranks.rank_offsets, v, side="right") - 1)
               for v in np.flatnonzero(ne.at == i)}  # fmt: skip
    idle = min(set(range(4)) - holders)
    for v in np.flatnonzero(ne.at == i):
        ne.ranks.flags[v], ne.ranks.slot[v], ne.reader[v] = PEER, -1, idle
    return ne


def _hit_moved(ne):  # host and rank agree on a hit from a slot its row was never stored in
    u = _first(ne, HIT)
    s = (int(ne.ranks.slot[u]) + 1) % 16
    ne.ranks.slot[ne.at == ne.at[u]] = s
    ne.host.slot[ne.at[u]] = s
    return ne


def _stores_dropped(ne):  # no rank stores what it reads
    f = ne.ranks.flags
    mine = (f & ADMIT) != 0
    f[mine] &= ~np.uint8(ADMIT)
    ne.ranks.slot[mine] = -1
    return ne


def _one_store_dropped(ne):  # the host's store is not made: the buffer is not the host plan's
    u = _first(ne, ADMIT)
    ne.ranks.flags[u] &= ~np.uint8(ADMIT)
    ne.ranks.slot[u] = -1
    return ne


def _hit_moved_to(dst: int):
    """A hit of rank 0 served by rank ``dst`` instead, at the same step: still a safe service
    (any local rank serves any row the node holds), but not the equal shares."""

    def edit(ne):
        r = ne.ranks
        u = _first(ne, HIT, 0)
        t = int(np.searchsorted(r.step_offsets[0], u, side="right") - 1)
        v = int(r.rank_offsets[dst] + r.step_offsets[dst, t + 1]) - 1  # after the deletion
        moved = {}
        for name, arr in (("sample", r.sample), ("slot", r.slot), ("flags", r.flags),
                          ("tslot", r.tslot), ("reader", ne.reader), ("at", ne.at)):  # fmt: skip
            moved[name] = np.insert(np.delete(arr, u), v, arr[u])
        ro, so = r.rank_offsets.copy(), r.step_offsets.copy()
        ro[1 : dst + 1] -= 1
        so[0, t + 1 :] -= 1
        so[dst, t + 1 :] += 1
        ranks = dataclasses.replace(r, rank_offsets=ro, step_offsets=so, sample=moved["sample"],
                                    slot=moved["slot"], flags=moved["flags"],
                                    tslot=moved["tslot"])  # fmt: skip
        return dataclasses.replace(ne, ranks=ranks, reader=moved["reader"], at=moved["at"])

    return edit


def _set(name: str, value: int, flag: int = HIT):
    def edit(ne):
        arr = ne.reader if name == "reader" else ne.at if name == "at" else getattr(ne.ranks, name)
        arr[_first(ne, flag)] = value
        return ne

    return edit


@pytest.mark.parametrize(
    "edit, hosts, words",
    [
        (_set("sample", N + 5), "1x4", "its sample is not the host's access"),
        (_set("slot", 10**6), "1x4", "not the host's hit"),
        (_set("at", 10**9), "1x4", "points outside its host's accesses"),
        (_set("at", -3), "1x4", "points outside its host's accesses"),
        (_set("reader", 3000, PEER), "1x4", "reader is not a rank of its host"),
        (_peer_reader_elsewhere, "2x2", "reader is not a rank of its host"),
        (_peer_reader_not_reading, "1x4", "whose reader does not read it at that step"),
        (_stores_dropped, "1x4", "leave a slot otherwise than the host plan's"),
        (_hit_moved, "1x4", "host plan: host 0, step "),
        (_one_store_dropped, "1x4", "leave a slot otherwise than the host plan's"),
        (_set("flags", PEER | HIT), "1x4", "not the host's hit"),
    ],
    ids=["sample", "slot", "at-high", "at-negative", "reader-out-of-range", "reader-other-host",
         "reader-not-reading", "stores-dropped", "hit-moved", "one-store-dropped", "flags"],
)  # fmt: skip
def test_an_edited_node_plan_is_refused_in_one_line(tmp_path, edit, hosts, words):
    path = _edited(tmp_path / "n.h5", edit, Hosts.parse(hosts))
    with pytest.raises(CorruptPlanError) as err:
        _validate(path)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"plan {path}: ") and words in msg, msg


@pytest.mark.parametrize(
    "hosts, dst, words",
    [
        ("1x4", 1, "its served rows are not its equal share of its host's"),
        ("2x2", 1, "its served rows are not its equal share of its host's"),
        ("2x2", 3, "a host access no rank of the host serves"),
    ],
)
def test_an_edit_off_the_equal_shares_is_refused_in_one_line(tmp_path, hosts, dst, words):
    """A hit moved from rank 0 to another rank of its host at its step: served safely (the
    services prove it), but not the equal shares (on one host no exchange evens them out); to
    a rank of another host: host 0 leaves the access unserved."""
    good = _edited(tmp_path / "good.h5", lambda ne: ne, Hosts.parse(hosts), spec=EQUAL)
    _validate(good)
    path = _edited(tmp_path / "n.h5", _hit_moved_to(dst), Hosts.parse(hosts), 1, EQUAL)
    with pytest.raises(CorruptPlanError) as err:
        _validate(path)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"plan {path}: ") and words in msg, msg


def test_rows_shared_beyond_the_staging_rows_are_refused():
    spec, hosts = _spec(), Hosts.grid(1, 4)
    ne = _epochs(spec, hosts)[0]
    assert np.any(ne.ranks.flags & PEER)
    v = PlanValidator(dataclasses.replace(spec), hosts, np.arange(3), 7, stage_rows=0)
    with pytest.raises(CorruptPlanError, match="more rows shared between local ranks"):
        v.check(ne)


def test_a_rank_proving_its_host_keeps_the_state_of_that_host_only():
    """Under a communicator each rank proves its own host's part (Plan._prove): the services
    proof holds the buffer state of the hosts proven only, the same as a proof of every host."""
    spec, hosts = _spec(), Hosts.grid(2, 2)
    mine = PlanValidator(spec, hosts, np.arange(3), 7, parts=[1])
    every = PlanValidator(spec, hosts, np.arange(3), 7)
    for ne in _epochs(spec, hosts):
        mine.check(ne)
        every.check(ne)
    assert mine.services is not None and every.services is not None
    assert list(mine.services.state) == [1] and list(every.services.state) == [0, 1]
    np.testing.assert_array_equal(mine.services.state[1], every.services.state[1])
    assert np.any(mine.services.state[1] >= 0)  # (the buffer was filled)


def _damage(path: Path, how: str) -> None:
    with h5py.File(path, "r+") as f:
        g = f["epochs/1/ranks"]
        if how == "truncated":
            short = g["sample"][:-3]
            del g["sample"]
            g["sample"] = short
        elif how == "byte":
            a = g["flags"][()]
            a[5] ^= 1
            g["flags"][...] = a
        elif how == "grouping":
            f.attrs["hosts"] = json.dumps([[0, 2], [1, 3]])
        elif how == "kind":  # a grouped file claiming a buffer per rank
            f.attrs["hosts"] = json.dumps(None)
        elif how == "old":  # a node plan file of the format before the grouping joined it
            f.attrs["format_version"] = 2


@pytest.mark.parametrize(
    "how, words",
    [
        ("truncated", "rank offsets are not monotone"),
        ("byte", "rank 0's service fails its checksum"),
        ("grouping", "fingerprint does not match its recorded inputs and hosts"),
        ("kind", "fingerprint does not match"),
        ("old", "format version 2, this solar reads 5 (grouped by host)"),
    ],
)
def test_a_damaged_node_plan_file_is_refused_in_one_line(tmp_path, how, words):
    path = _write(_spec(), Hosts.grid(2, 2), _epochs(_spec(), Hosts.grid(2, 2)), tmp_path / "n.h5")
    _damage(path, how)
    with pytest.raises(SolarError) as err:
        _validate(path) if how != "kind" else load_plan(path)
    msg = str(err.value)
    assert "\n" not in msg and str(path) in msg and words in msg, msg


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    field=st.sampled_from(["sample", "slot", "flags", "reader", "at"]),
    where=st.integers(0, 10**6),
    value=st.sampled_from([-1, 0, 1, 2, 3, 7, 128, 129, N, 10**6]),
    equal=st.booleans(),
)
def test_any_edit_of_a_service_is_refused_or_harmless(tmp_path_factory, field, where, value,
                                                      equal):  # fmt: skip
    """Never a crash: a refusal in one line, or an edit that changes nothing served (the same
    value, or a store the plan may drop); of Weighted's plan or Shuffle's of equal batches."""
    path = tmp_path_factory.mktemp("edit") / "n.h5"

    def edit(ne):
        arr = (
            ne.reader if field == "reader" else ne.at if field == "at" else getattr(ne.ranks, field)
        )
        arr[where % arr.size] = np.array(value).astype(arr.dtype)
        return ne

    _edited(path, edit, Hosts.grid(2, 2) if equal else None, spec=EQUAL if equal else None)
    try:
        _validate(path)
    except CorruptPlanError as exc:
        assert "\n" not in str(exc)


# -- under mpiexec ------------------------------------------------------------------------------
FOREIGN = ("SLURM_", "PMI_", "OMPI_", "TORCHELASTIC_", "MPI_")


@pytest.mark.xdist_group("launchers")
@pytest.mark.skipif(not MPIEXEC.exists(), reason="no mpiexec beside python")
def test_a_node_plan_file_serves_h5py_bytes_on_two_hosts_and_refuses_another_grouping(tmp_path):
    """(With equal batches too: every rank its nominal share, the rows the file's counts move.)"""
    x = np.random.default_rng(0).integers(0, 2**31, (600, 24), dtype=np.int64)
    data = write_h5(tmp_path / "d.h5", x=x)
    sampler = skewed_weighted(600)  # (the script's own)
    ld = Loader(data, ["x"], batch_size=12, epochs=3, buffer="10%", sampler=sampler, seed=5, rank=0,
                world_size=4, expert=ExpertConfig(warm=False),
                planning=PlanningConfig(equal_batches=False))  # fmt: skip
    good = plan_to_file(ld.spec, hosts=Hosts.grid(2, 2), path=tmp_path / "p22.h5").file.path
    other = plan_to_file(ld.spec, hosts=Hosts.grid(1, 4), path=tmp_path / "p14.h5").file.path
    ld.close()
    ld = Loader(data, ["x"], batch_size=12, epochs=3, buffer="10%", seed=5, rank=0, world_size=4,
                expert=ExpertConfig(warm=False),
                planning=PlanningConfig(equal_batches=False))  # fmt: skip
    spec = dataclasses.replace(ld.spec, equal_batches=True)  # Shuffle's, as a job's
    equal = plan_to_file(spec, hosts=Hosts.grid(2, 2), path=tmp_path / "eq22.h5").file.path
    ld.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith(FOREIGN)}
    env["SOLAR_HOSTS"] = "2x2"
    script = Path(__file__).parent / "mpi" / "node_plan_file.py"
    r = run_job(MPIEXEC, 4, [str(script), str(data), str(good), str(other), str(equal)], 180, env)
    assert "rows read as the file says" in r.stdout, r.stderr[-3000:]
    assert "equal batches: every rank its share" in r.stdout, r.stderr[-3000:]
    assert r.returncode != 0 and "unreachable" not in r.stderr
    assert (f"plan {other}: made for hosts 1x4 [[0, 1, 2, 3]], but this job's ranks are "
            "grouped 2x2 [[0, 1], [2, 3]]") in r.stderr  # fmt: skip


@pytest.mark.parametrize("hosts", [None, Hosts.grid(1, 4)], ids=["per-rank", "1x4"])
def test_a_plan_file_of_either_grouping_resumes_as_planned(tmp_path, hosts):
    """One stream reads a plan file of any grouping as it plans one: jumped into the last
    epoch (a resume: the file's epochs before it replayed), a rank's step and the buffer (and
    per rank, tier) it must hold are the planned stream's."""
    from solar.schedule.plans.stream import RankStream

    tier = 6 if hosts is None else 0  # (a node tier is not planned into a file)
    spec = dataclasses.replace(_spec(), buffer=BufferConfig(8, 0.25, tier=tier))
    plan = plan_to_file(spec, tmp_path / "p.h5", hosts=hosts)
    plan = load_plan(plan.file.path, spec.sampler)
    planned = RankStream(spec, 1, hosts=hosts)
    read = RankStream(plan.spec, 1, plan)
    tier_held = 0
    try:
        for k in range(2 * spec.run.steps_per_epoch, spec.run.num_steps):
            want, got = planned.window(k), read.window(k)
            cells, samples = want.refill_at(k)
            assert [a.tolist() for a in got.refill_at(k)] == [cells.tolist(), samples.tolist()]
            tier_held += int(np.count_nonzero(cells >= planned.slots))
            a, b = want.step(k), got.step(k)
            assert a.samples.tolist() == b.samples.tolist()
            assert a.tier_slots.tolist() == b.tier_slots.tolist()
            assert a.admit_slots.tolist() == b.admit_slots.tolist()
    finally:
        planned.close()
        read.close()
    assert tier_held or not tier  # (the tier holds rows a later step reads)
