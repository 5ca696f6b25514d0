"""`solar bench`'s epoch time limit: what the harness computes, never how fast this machine is.

The limit is ``max(bytes_read / read_bw, hits · sample_bytes / P / mem_bw, tier_hits ·
sample_bytes / tier_bw, steps · compute)`` (:func:`solar.bench.limit_terms`). Here it is
checked on handed-in numbers (each term, which one wins, the tier's only with tier hits,
memory's per rank, every term positive), then in the shape of every scenario of
bench/scenarios.py (preset × aggregate buffer; one rank in process, two under mpiexec in the
runs tests/test_bench.py checks too; a tier) for structure: the result's limits are the
function applied to the result's own recorded inputs (bytes read, hits, steps, config, the
bandwidths measured in the run), with the terms the epoch has. Whether the limit stays below
the measured epochs is a comparison of two noisy wall-clock measurements:
bench/limit_bench.py reports it, with its spread over runs.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solar import bench as harness
from solar.io.generate import generate

spec = importlib.util.spec_from_file_location(
    "scenarios", Path(__file__).parent.parent / "bench" / "scenarios.py"
)
scenarios = importlib.util.module_from_spec(spec)
spec.loader.exec_module(scenarios)
SMALL = {"ptychonn": 96, "braggnn": 1500, "autophasenn": 40}  # a few tens of MB at most

# Bandwidths in bytes/s, handed in: storage 1 GB/s and the tiers 2 GB/s (all ranks'), memory
# 10 GB/s (one rank's copy).
BW = {"read_bytes_per_s": 1e9, "mem_bytes_per_s": 1e10, "tier_bytes_per_s": 2e9}


def _terms(**kw) -> dict[str, float]:
    inputs = dict(bytes_read=0, hits=0, tier_hits=0, steps=10, compute_ms=0.0,
                  sample_bytes=1000, world=1, limits=BW)  # fmt: skip
    return harness.limit_terms(**{**inputs, **kw})


# -- the formula, on handed-in numbers -------------------------------------------------------


def test_each_term_is_its_amount_over_its_bandwidth() -> None:
    terms = _terms(bytes_read=2_000_000, hits=500, tier_hits=300, compute_ms=5.0, world=2)
    want = {"read": 2e6 / 1e9, "memory": 500 * 1000 / 2 / 1e10, "tier": 300 * 1000 / 2e9,
            "compute": 10 * 5.0 / 1e3}  # fmt: skip
    assert terms == pytest.approx(want)
    assert harness.epoch_limit(terms) == pytest.approx(0.05)  # compute: the largest


@pytest.mark.parametrize(
    ("kw", "wins", "seconds"),
    [
        ({"bytes_read": 3 * 10**9, "hits": 10**6, "compute_ms": 100.0}, "read", 3.0),
        ({"bytes_read": 10**9, "hits": 10**6, "compute_ms": 300.0}, "compute", 3.0),
        ({"bytes_read": 10**9, "hits": 3 * 10**7, "compute_ms": 100.0}, "memory", 3.0),
        ({"bytes_read": 10**9, "tier_hits": 6 * 10**6, "compute_ms": 100.0}, "tier", 3.0),
    ],
)
def test_the_limit_is_the_largest_term_not_their_sum(kw, wins, seconds) -> None:
    terms = _terms(**kw)
    assert max(terms, key=terms.__getitem__) == wins
    assert harness.epoch_limit(terms) == pytest.approx(seconds)
    assert harness.epoch_limit(terms) < sum(terms.values())  # they overlap


def test_the_tier_term_only_with_tier_hits() -> None:
    no_tier = {k: v for k, v in BW.items() if k != "tier_bytes_per_s"}
    assert "tier" not in _terms(bytes_read=10**6, hits=10, limits=no_tier)  # no tier measured
    assert "tier" not in _terms(bytes_read=10**6, hits=10)  # measured, but it served nothing
    assert _terms(tier_hits=4)["tier"] == pytest.approx(4 * 1000 / 2e9)
    with pytest.raises(ValueError, match="tier term needs tier_bytes_per_s > 0"):
        _terms(tier_hits=4, limits=no_tier)


def test_the_memory_term_is_one_ranks_share() -> None:
    """Memory's bandwidth is one rank's copy, storage's and the tiers' all ranks' together: P
    ranks copy their hits in parallel, so only the memory term divides by P."""
    one, four = (_terms(bytes_read=10**6, hits=800, tier_hits=8, world=p) for p in (1, 4))
    assert four["memory"] == pytest.approx(one["memory"] / 4)
    assert (four["read"], four["tier"]) == (one["read"], one["tier"])


def test_only_the_parts_an_epoch_has_are_terms() -> None:
    assert set(_terms(bytes_read=10**6)) == {"read"}  # a cold epoch without compute
    assert set(_terms(hits=100, compute_ms=1.0)) == {"memory", "compute"}  # all hits
    assert _terms() == {} and harness.epoch_limit({}) == 0.0  # nothing to do
    assert _terms(compute_ms=1.0, steps=0) == {}


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"bytes_read": -1}, "amounts must be >= 0"),
        ({"world": 0}, "world >= 1"),
        ({"bytes_read": 1, "limits": {**BW, "read_bytes_per_s": 0.0}}, "read term needs"),
        ({"hits": 1, "limits": {**BW, "mem_bytes_per_s": float("nan")}}, "memory term needs"),
    ],
)
def test_bad_inputs_are_refused(kw, message) -> None:
    with pytest.raises(ValueError, match=message):
        _terms(**kw)


amounts = st.integers(0, 10**12)
bandwidths = st.floats(1e3, 1e12)


@settings(max_examples=200, deadline=None)
@given(amounts, amounts, amounts, st.integers(0, 10**5), st.just(0.0) | st.floats(1e-3, 1e4),
       st.integers(1, 10**8), st.integers(1, 4096), bandwidths, bandwidths, bandwidths)  # fmt: skip
def test_every_term_is_positive_and_the_limit_bounds_each(
    nbytes, hits, tier, steps, compute, sample, world, read_bw, mem_bw, tier_bw
) -> None:
    limits = {"read_bytes_per_s": read_bw, "mem_bytes_per_s": mem_bw, "tier_bytes_per_s": tier_bw}
    terms = harness.limit_terms(bytes_read=nbytes, hits=hits, tier_hits=tier, steps=steps,
                                compute_ms=compute, sample_bytes=sample, world=world,
                                limits=limits)  # fmt: skip
    assert all(t > 0 for t in terms.values())
    assert ("read" in terms) == (nbytes > 0) and ("memory" in terms) == (hits > 0)
    assert ("tier" in terms) == (tier > 0) and ("compute" in terms) == (steps * compute > 0)
    limit = harness.epoch_limit(terms)
    assert all(t <= limit for t in terms.values()) and (limit in terms.values() or not terms)


def test_the_summary_records_each_epochs_limit_and_its_inputs() -> None:
    """``_summarise`` on handed-in figures (two epochs, one rank of two, a tier): the terms are
    :func:`limit_terms` of each epoch's recorded figures, the limit their max, the share the
    epoch seconds over the limits, and the report names each epoch's largest term."""
    cfg = harness.BenchConfig(paths=("d.h5",), compute_ms=2.0, loaders=("solar",), tier="t",
                              tier_size=0.5)  # fmt: skip
    r = harness.LoaderResult(
        "solar", epoch_seconds=[0.5, 0.25], samples=[100, 100], hits=[0, 60],
        tier_hits=[0, 30], bytes_read=[100 * 4000, 10 * 4000], stall_seconds=[0.1, 0.0],
        rows_moved=[0, 0], exchange_seconds=[0.0, 0.0], cpu_seconds=[0.2, 0.1],
    )  # fmt: skip
    run = SimpleNamespace(traced=True, run=SimpleNamespace(steps_per_epoch=7))
    res = harness._summarise(cfg, 2, 100, 4000, (50, 25), BW, {"solar": r}, run, None)
    solar = res["loaders"]["solar"]
    both = {"steps": 7, "compute_ms": 2.0, "sample_bytes": 4000, "world": 2}
    want = [_terms(bytes_read=400_000, **both),
            _terms(bytes_read=40_000, hits=60, tier_hits=30, **both)]  # fmt: skip
    assert solar["epoch_limit_terms"] == want and solar["steps_per_epoch"] == 7
    assert set(want[0]) == {"read", "compute"} and set(want[1]) == set(want[0]) | {"memory", "tier"}
    assert solar["epoch_limit_seconds"] == [max(t.values()) for t in want]
    assert solar["share_of_limit"] == pytest.approx(0.75 / sum(max(t.values()) for t in want))
    text = harness.format_results(res)
    assert "solar epoch time / time limit:" in text
    assert text.count("(compute)") == 2 and "(read)" not in text  # 14 ms of compute a time


# -- the harness's results, in every scenario's shape ----------------------------------------


class _Solo:
    """One rank's communicator."""

    def Get_rank(self):
        return 0

    def Get_size(self):
        return 1

    def bcast(self, obj, root=0):
        return obj

    def allreduce(self, value, op="sum"):
        return value

    def Barrier(self):
        pass


def _check(res: dict) -> None:
    """The result's limits are :func:`limit_terms` of its own recorded figures; no timing is
    compared with another."""
    solar, cfg, bw = res["loaders"]["solar"], res["config"], res["limits"]
    assert bw["read_bytes_per_s"] > 0 and bw["mem_bytes_per_s"] > 0
    epochs = len(solar["epoch_seconds"])
    assert len(solar["epoch_limit_terms"]) == len(solar["epoch_limit_seconds"]) == epochs
    for e, terms in enumerate(solar["epoch_limit_terms"]):
        hits, tier = solar["ram_hits"][e], solar["tier_hits"][e]
        inputs = dict(bytes_read=solar["bytes_read"][e], hits=hits, tier_hits=tier,
                      steps=solar["steps_per_epoch"], compute_ms=cfg["compute_ms"],
                      sample_bytes=cfg["sample_bytes"], world=cfg["world_size"],
                      limits=bw)  # fmt: skip
        assert terms == harness.limit_terms(**inputs), (e, terms, inputs)
        assert solar["epoch_limit_seconds"][e] == harness.epoch_limit(terms) > 0
        assert all(t > 0 for t in terms.values())
        # The terms the epoch has: memory with RAM hits, the tier's with tier hits, no compute.
        assert ("memory" in terms) == (hits > 0) and ("tier" in terms) == (tier > 0)
        assert ("read" in terms) == (solar["bytes_read"][e] > 0) and "compute" not in terms
    # Epoch 0 is cold (the buffer starts empty): everything read, nothing hit.
    assert set(solar["epoch_limit_terms"][0]) == {"read"} and solar["ram_hits"][0] == 0
    share = sum(solar["epoch_seconds"]) / sum(solar["epoch_limit_seconds"])
    assert solar["share_of_limit"] == pytest.approx(share)


@pytest.mark.parametrize("preset", list(scenarios.SAMPLES))
def test_every_buffer_scenarios_limit_is_the_formula_of_its_figures(tmp_path, preset):
    data = generate(tmp_path / "d.h5", preset, SMALL[preset])
    buffers = sorted({b for p, _, b in scenarios.scenarios(True) if p == preset})
    assert buffers == [25, 50, 100]
    for buffer in buffers:
        cfg = harness.BenchConfig(paths=(str(data),), batch_size=16, epochs=2,
                                  buffer=buffer / 100, loaders=("solar",), workers=0)  # fmt: skip
        res = harness.run(cfg, _Solo())
        _check(res)
        if buffer == 100:  # one rank holding everything: epoch 1 is all RAM hits, no reads
            assert set(res["loaders"]["solar"]["epoch_limit_terms"][1]) == {"memory"}


# Two ranks: the runs tests/test_bench.py checks too (tests/bench_runs.py, one each, shared):
# equal batches without a tier (half the data held), and a tier behind RAM.
@pytest.mark.xdist_group("bench_runs")
@pytest.mark.parametrize("tier", [False, True])
def test_the_limit_on_two_ranks_is_the_formula_of_its_figures(bench_run, tier):
    result, tmp_path = bench_run("tier" if tier else "equal")
    out = tmp_path / "r.json"
    assert result.returncode == 0, result.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["limits"]["read_threads"] == 2 * 8 and res["config"]["world_size"] == 2
    if tier:  # both ranks' tiers read at once (a collective), and the tier served
        assert res["limits"]["tier_bytes_per_s"] > 0
        assert sum(res["loaders"]["solar"]["tier_hits"]) > 0
        assert "tier" in res["loaders"]["solar"]["epoch_limit_terms"][1]
    _check(res)
    assert "kernels compiled before the first timed epoch" in result.stdout
    assert "solar epoch time / time limit:" in result.stdout


def test_the_limit_with_a_tier_takes_the_tiers_term(tmp_path):
    """A tier scenario (`solar bench --tier DIR --tier-size X`): the tier's read bandwidth is
    measured as the loaders read their tiers (threads, random batches of slots), and the epochs
    the tier served have its term."""
    data = generate(tmp_path / "d.h5", "ptychonn", SMALL["ptychonn"])
    (tmp_path / "tier").mkdir()
    cfg = harness.BenchConfig(paths=(str(data),), batch_size=16, epochs=2, buffer=0.25,
                              tier=str(tmp_path / "tier"), tier_size=0.5, loaders=("solar",),
                              workers=0)  # fmt: skip
    res = harness.run(cfg, _Solo())
    solar = res["loaders"]["solar"]
    assert res["limits"]["tier_bytes_per_s"] > 0
    assert solar["tier_hits"][0] == 0 and solar["tier_hits"][1] > 0  # the tier served
    assert "tier" in solar["epoch_limit_terms"][1]
    _check(res)
    assert not list((tmp_path / "tier").iterdir())  # the measurement's tier files are gone
