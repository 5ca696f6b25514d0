"""Property tests of the node plan (solar/schedule/keep/hostplan.py): one buffer per host."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from plan_checks import _replay

from solar import BufferConfig, PlanSpec, RunConfig
from solar.errors import SolarError
from solar.host.place import _by_name
from solar.schedule.draw.order import nominal_batches
from solar.schedule.draw.pagemates import PageLayout
from solar.schedule.draw.samplers import SHUFFLE, Weighted
from solar.schedule.keep.grouping import Hosts
from solar.schedule.keep.hostequal import host_transfer
from solar.schedule.keep.hostplan import HostPlanner
from solar.schedule.keep.hostrun import host_parts, host_run_spec
from solar.schedule.keep.planner import Planner
from solar.schedule.keep.transfer import delivered, transfer_matrix
from solar.schedule.plans.rankplan import RankPlan
from solar.schedule.policy import ADMIT, DEMOTE, HIT, PEER, SIDE, TADMIT, THIT, tier_slot_count

STORE = ADMIT | TADMIT | DEMOTE


@st.composite
def node_cases(draw):
    """A run, its spec and a grouping of its ranks into hosts."""
    hosts_n = draw(st.integers(1, 3))
    local = draw(st.integers(1, 3))
    world = hosts_n * local
    batch = draw(st.integers(1, 6))
    n = draw(st.integers(world * batch, world * batch * 4 + 9))
    run = RunConfig(n, world, batch, draw(st.integers(1, 3)), seed=draw(st.integers(0, 2**20)),
                    drop_last=draw(st.booleans()))  # fmt: skip
    kind = draw(st.sampled_from(["shuffle", "weighted", "fixed", "fixed-pages", "fixed-tier"]))
    cap = draw(st.integers(0, n // world + 2))
    tier = draw(st.integers(1, 4)) if kind == "fixed-tier" else 0
    slack = draw(st.sampled_from([0.0, 0.5])) if kind in ("shuffle", "weighted") else 0.0
    buffer = BufferConfig(cap, slack, tier)
    weights = np.random.default_rng(run.seed).zipf(1.6, n).astype(float)
    sampler = SHUFFLE if kind == "shuffle" else Weighted(weights, affinity=kind == "weighted")
    pages = PageLayout(draw(st.integers(0, 64)), draw(st.integers(8, 40)), 64) \
        if kind == "fixed-pages" else None  # fmt: skip
    spec = PlanSpec(run, buffer, sampler=sampler, pages=pages)
    return spec, Hosts.grid(hosts_n, local)


def plan_all(spec, hosts):
    p = HostPlanner(spec, hosts)
    return [p.next() for _ in range(spec.run.epochs)]


def check_node_plan(spec, hosts, epochs) -> None:
    """Every access of every rank is served: a hit of its host's buffer (which a replay of
    that buffer, of the aggregate capacity, proves), or read at that step by exactly one local
    rank that needs it; the hosts' buffers replay."""
    run = spec.run
    hspec = host_run_spec(spec, hosts)
    traced_fixed = spec.traced and not spec.affinity
    for ne in epochs:
        host, ranks = ne.host, ne.ranks
        for t in range(run.steps_per_epoch):
            step_ids = []
            for h, group in enumerate(hosts.groups):
                reads: dict[int, int] = {}
                served: list[np.ndarray] = []
                for r in group:
                    lo = ranks.rank_offsets[r]
                    a, b = lo + ranks.step_offsets[r, t], lo + ranks.step_offsets[r, t + 1]
                    f, x, at = ranks.flags[a:b], ranks.sample[a:b], ne.at[a:b]
                    rd = ne.reader[a:b]
                    side = (f & SIDE) != 0
                    hf = host.flags[at]
                    # Its host's access is the same sample, with the same decision.
                    np.testing.assert_array_equal(host.sample[at], x)
                    assert np.all((hf & (HIT | THIT)) == (f & (HIT | THIT)))
                    assert np.all(host.rank_offsets[h] <= at)
                    assert np.all(at < host.rank_offsets[h + 1])
                    hit = (f & (HIT | THIT)) != 0
                    assert np.all(rd[hit] == -1)
                    np.testing.assert_array_equal(ranks.slot[a:b][hit], host.slot[at][hit])
                    miss = ~hit
                    assert np.all(np.isin(rd[miss], group))
                    own = miss & (rd == r)
                    assert np.all((f[own] & PEER) == 0) and np.all((f[miss & ~own] & PEER) != 0)
                    assert np.all((f[miss & ~own] & STORE) == 0)
                    np.testing.assert_array_equal(f[own] & (TADMIT | DEMOTE),
                                                  hf[own] & (TADMIT | DEMOTE))  # fmt: skip
                    assert np.all((f[own] & ADMIT) <= (hf[own] & ADMIT))
                    for i in at[own].tolist():
                        assert i not in reads, "a row read twice by the host at one step"
                        reads[i] = r
                    served.append(x[~side])
                    if traced_fixed:
                        want = np.unique(spec.sampler.batch(run, ne.epoch, t, r))
                        np.testing.assert_array_equal(np.sort(x[~side]), want)
                # Local ranks store side by side: never two stores into one slot at a step.
                stores = np.concatenate([
                    ranks.slot[ranks.rank_offsets[r] + ranks.step_offsets[r, t]:
                               ranks.rank_offsets[r] + ranks.step_offsets[r, t + 1]][
                        (ranks.flags[ranks.rank_offsets[r] + ranks.step_offsets[r, t]:
                                     ranks.rank_offsets[r] + ranks.step_offsets[r, t + 1]]
                         & ADMIT) != 0] for r in group])  # fmt: skip
                if not spec.buffer.tier:  # (a tier's demotions chain stores: not run yet)
                    assert np.unique(stores).size == stores.size
                # Every miss some local rank is served is read by one of them.
                mine = np.concatenate(served)
                hlo = host.rank_offsets[h]
                ha = hlo + host.step_offsets[h, t]
                hb = hlo + host.step_offsets[h, t + 1]
                hmiss = np.flatnonzero((host.flags[ha:hb] & (HIT | THIT)) == 0) + ha
                assert set(hmiss.tolist()) == set(reads), (t, h)
                assert np.array_equal(np.unique(mine), np.unique(host.sample[ha:hb][
                    (host.flags[ha:hb] & SIDE) == 0]))  # fmt: skip
                if not traced_fixed:
                    sizes = [ranks.step_offsets[r, t + 1] - ranks.step_offsets[r, t]
                             for r in group]  # fmt: skip
                    assert max(sizes) - min(sizes) <= 1
                step_ids.append(mine)
            if not traced_fixed:  # the hosts' shares are the global batch, once each
                got = np.concatenate(step_ids)
                assert np.unique(got).size == got.size
    # The hosts' buffers replay: each hit finds its sample where the plan says.
    for h in range(hosts.count):
        rp = RankPlan.from_parts(h, [ne.host.rank(h) for ne in epochs], hspec.slots,
                                 tier_slots=hspec.buffer.tier)  # fmt: skip
        _replay(rp, hspec.slots, min(hspec.buffer.tier, run.num_samples - hspec.slots))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(node_cases())
def test_node_plan_serves_every_access_once(case):
    spec, hosts = case
    check_node_plan(spec, hosts, plan_all(spec, hosts))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(node_cases())
def test_a_host_buffer_in_parts_keeps_each_row_in_its_parts_cells(case):
    """Where a sampler fixes each rank's batch, a host's buffer is planned in one part per
    local rank (solar/schedule/keep/hostparts.py): every RAM and tier cell the plan names for a row
    is one of its part's, so the parts, planned apart, never collide; part sizes add up."""
    spec, hosts = case
    hspec = host_run_spec(spec, hosts)
    parts = host_parts(hspec, hosts)
    if parts is None:
        assert not (spec.traced and not spec.affinity) or hosts.local == 1
        return
    tier = tier_slot_count(hspec.run, hspec.buffer)
    for total in (hspec.slots, tier):
        sizes = [parts.size(total, j) for j in range(parts.count)]
        assert sum(sizes) == total and max(sizes) - min(sizes) <= 1
        bases = [parts.base(total, j) for j in range(parts.count)]
        assert bases == list(np.cumsum([0, *sizes[:-1]]))
    for ne in plan_all(spec, hosts):
        f, part = ne.host.flags, parts.of(ne.host.sample)
        for cells, total in ((ne.host.slot, hspec.slots), (ne.host.tslot, tier)):
            named = cells >= 0
            lo = np.array([parts.base(total, j) for j in range(parts.count)])[part]
            hi = lo + np.array([parts.size(total, j) for j in range(parts.count)])[part]
            assert np.all((lo <= cells) & (cells < hi) | ~named), ne.epoch
        assert np.all(f[ne.host.slot < 0] & (HIT | ADMIT) == 0)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(node_cases())
def test_one_rank_per_host_is_todays_plan_and_deterministic(case):
    spec, hosts = case
    alone = Hosts.grid(spec.run.world_size, 1)
    ours = plan_all(spec, alone)
    today = Planner(spec)
    for ne in ours:
        ep = today.next_all()
        for name in ("sample", "slot", "flags", "tslot", "rank_offsets", "step_offsets"):
            np.testing.assert_array_equal(getattr(ne.host, name), getattr(ep, name), name)
        assert not np.any(ne.ranks.flags & PEER)
    again, twice = plan_all(spec, hosts), plan_all(spec, hosts)
    for a, b in zip(again, twice, strict=True):
        for name in ("sample", "slot", "flags", "tslot", "step_offsets"):
            assert getattr(a.ranks, name).tobytes() == getattr(b.ranks, name).tobytes()
            assert getattr(a.host, name).tobytes() == getattr(b.host, name).tobytes()
        assert a.reader.tobytes() == b.reader.tobytes() and a.at.tobytes() == b.at.tobytes()


@st.composite
def equal_cases(draw):
    """Shuffle with equal batches, slack 0 or 0.5, over a grouping of its ranks into hosts."""
    hosts_n, local = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    world, batch = hosts_n * local, draw(st.integers(1, 6))
    n = draw(st.integers(world * batch, world * batch * 4 + 9))
    run = RunConfig(n, world, batch, draw(st.integers(1, 3)), seed=draw(st.integers(0, 2**20)),
                    drop_last=draw(st.booleans()))  # fmt: skip
    buffer = BufferConfig(draw(st.integers(0, n // world + 2)), draw(st.sampled_from([0, 0.5])))
    return PlanSpec(run, buffer, equal_batches=True), Hosts.grid(hosts_n, local)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(equal_cases())
def test_equal_node_batches_give_every_rank_its_share_moving_only_the_hosts_surplus(case):
    """Every rank delivers its nominal share (per-rank mode's, a short last batch split
    evenly), the global batch once; no row moves between ranks of a host, and the rows that
    cross hosts are the hosts' surplus over their ranks' shares; the host plan is the one
    without equal batches, decision for decision."""
    spec, hosts = case
    run, world = spec.run, spec.run.world_size
    epochs = plan_all(spec, hosts)
    check_node_plan(spec, hosts, epochs)
    for a, b in zip(epochs, plan_all(spec, hosts), strict=True):  # a pure function of its inputs
        for name in ("rank_offsets", "step_offsets", "sample", "slot", "flags"):
            assert getattr(a.ranks, name).tobytes() == getattr(b.ranks, name).tobytes(), name
            assert getattr(a.host, name).tobytes() == getattr(b.host, name).tobytes(), name
        assert a.reader.tobytes() == b.reader.tobytes() and a.at.tobytes() == b.at.tobytes()
    free = plan_all(dataclasses.replace(spec, equal_batches=False), hosts)
    for ne, other in zip(epochs, free, strict=True):
        for name in ("sample", "slot", "flags", "step_offsets"):
            np.testing.assert_array_equal(getattr(ne.host, name), getattr(other.host, name))
        parts = [ne.rank(r) for r in range(world)]
        got = delivered([p.sample for p in parts], [p.step_offsets for p in parts])
        counts = np.diff(ne.ranks.step_offsets, axis=1)  # (P, steps)
        assert counts.max(initial=0) <= spec.buffer.cap(run.batch_size)
        for t in range(run.steps_per_epoch):
            c = counts[:, t]
            share = nominal_batches(int(c.sum()), world)
            assert [got[r][t].size for r in range(world)] == share.tolist()
            every = np.concatenate([got[r][t] for r in range(world)])
            np.testing.assert_array_equal(np.sort(every), np.sort(np.concatenate(
                [parts[r].sample[parts[r].step_offsets[t]:parts[r].step_offsets[t + 1]]
                 for r in range(world)])))  # fmt: skip
            m = transfer_matrix(c)
            surplus = 0
            for g in hosts.groups:
                assert not m[np.ix_(g, g)].any(), "a row moved between ranks of a host"
                surplus += max(0, int(c[list(g)].sum() - share[list(g)].sum()))
            assert int(m.sum()) == surplus
            for r in range(world):
                moved = host_transfer(ne.ranks.step_offsets, t, r, hosts.count)
                if hosts.count == 1:
                    assert moved is None and c[r] == share[r]
                else:
                    np.testing.assert_array_equal(moved.send, m[r])


def test_a_shared_row_is_read_once_and_the_reads_balanced():
    run = RunConfig(400, 4, 40, 2, seed=3)
    w = Weighted(np.arange(1, 401, dtype=float) ** -1.2, affinity=False)
    spec = PlanSpec(run, BufferConfig(0), sampler=w)
    (ne, _) = plan_all(spec, Hosts.grid(1, 4))
    # No buffer: every rank access is a miss, and a row several ranks need is read once.
    assert ne.storage_reads() < 0.8 * ne.ranks.sample.size
    reads = [int(np.count_nonzero((ne.rank(r).flags & (PEER | HIT)) == 0)) for r in range(4)]
    assert max(reads) - min(reads) <= 0.2 * max(reads)


def test_hosts_grammar_and_refusals():
    assert Hosts.parse("2x2", 4).groups == ((0, 1), (2, 3))
    assert Hosts(_by_name(["a", "b", "a", "b"])).groups == ((0, 2), (1, 3))
    with pytest.raises(SolarError, match="SOLAR_HOSTS"):
        Hosts.parse("2x3", 4)
    with pytest.raises(SolarError, match="SOLAR_HOSTS"):
        Hosts.parse("two", 4)
    assert not Hosts(((0, 1), (2,))).uniform  # (tests/test_hostexchange.py: unequal hosts)
    with pytest.raises(SolarError, match=r"ranks 0\.\.P-1"):
        Hosts(((0, 1), (1, 2)))


def test_solar_plan_reports_one_buffer_per_host_beside_per_rank(tmp_path):
    import json

    from click.testing import CliRunner

    from solar.cli import cli

    w = tmp_path / "w.npy"
    np.save(w, np.arange(1, 3001, dtype=float) ** -1.0)
    args = ["plan", "--samples", "3000", "-P", "4", "-B", "16", "-E", "2", "-C", "40",
            "--sampler", "weighted", "--weights", str(w), "--hosts", "1x4", "--json"]  # fmt: skip
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    got = json.loads(res.output.strip().splitlines()[-1])
    assert got["node"]["hosts"] == [[0, 1, 2, 3]] and got["node"]["buffer_per_host"] == 160
    assert got["node"]["reads"] < got["reads"]  # a shared row read once, one buffer of 4·C
    bad = CliRunner().invoke(cli, [*args[:-3], "--hosts", "3x2"])
    assert bad.exit_code != 0 and "--hosts 3x2: 3×2 ranks" in str(bad.exception)
