"""`solar bench`'s limit is a lower bound on the epoch time it is set against, in the shape
of every scenario of bench/scenarios.py (preset × aggregate buffer; one rank in process, two
under mpiexec), run small.

How this stays a test of structure, not a race between timings: the limit's read bandwidth is
measured by the loaders' own reader (the same threads, read paths and files, every batch in
flight at once, evicted alike) and the best of three runs is kept; memory's the best of five
copies; and the limit is the largest of the overlapping terms, not their sum. An epoch reads
the same kind of bytes with the same threads and besides plans, copies and builds batches, so
it takes at least the limit, up to noise: cold reads of the same bytes on this virtual disk
vary by up to ±15 % from run to run (0.79-1.05 GB/s over 8 identical runs), so the run's
total is compared with a margin of 1.25 (the old single-stream limit stood 1.4-2.6 times
above the measured epochs, share 0.39-0.73).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from solar import bench as harness
from solar.io.generate import generate

spec = importlib.util.spec_from_file_location(
    "scenarios", Path(__file__).parent.parent / "bench" / "scenarios.py"
)
scenarios = importlib.util.module_from_spec(spec)
spec.loader.exec_module(scenarios)
SOLAR = str(Path(sys.executable).with_name("solar"))
SMALL = {"ptychonn": 96, "braggnn": 1500, "autophasenn": 40}  # a few tens of MB at most


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


MARGIN = 1.25  # see the module's docstring


def _check(res: dict) -> None:
    solar = res["loaders"]["solar"]
    limits, seconds = solar["epoch_limit_seconds"], solar["epoch_seconds"]
    assert all(x > 0 for x in limits)
    # The run's total: reads started ahead into the next epoch land in the window before it.
    assert sum(limits) <= MARGIN * sum(seconds), (limits, seconds, res["limits"])
    assert solar["share_of_limit"] >= 1 / MARGIN


@pytest.mark.parametrize("preset", list(scenarios.SAMPLES))
def test_the_limit_is_below_every_epoch(tmp_path, preset):
    data = generate(tmp_path / "d.h5", preset, SMALL[preset])
    buffers = sorted({b for p, _, b in scenarios.scenarios(True) if p == preset})
    assert buffers == [25, 50, 100]
    for buffer in buffers:
        cfg = harness.BenchConfig(paths=(str(data),), batch_size=16, epochs=2,
                                  buffer=buffer / 100, loaders=("solar",), workers=0)  # fmt: skip
        _check(harness.run(cfg, _Solo()))


@pytest.mark.parametrize("tier", [False, True])
def test_the_limit_is_below_every_epoch_on_two_ranks(tmp_path, tier):
    data = generate(tmp_path / "d.h5", "ptychonn", SMALL["ptychonn"])
    out = tmp_path / "r.json"
    (tmp_path / "tier").mkdir()
    tiered = ["--tier", tmp_path / "tier", "--tier-size", "50%"]
    result = subprocess.run(
        [SOLAR, "bench", data, "-P", "2", "-E", "2", "-B", "8", "--buffer",
         "25%" if tier else "50%", "--loaders", "solar", "--json", out,
         *(tiered if tier else [])],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["limits"]["read_threads"] == 2 * 8 and res["config"]["world_size"] == 2
    if tier:  # both ranks' tiers read at once (a collective), and the tier served
        assert res["limits"]["tier_bytes_per_s"] > 0
        assert sum(res["loaders"]["solar"]["tier_hits"]) > 0
    _check(res)
    assert "kernels compiled before the first timed epoch" in result.stdout


def test_the_limit_is_below_every_epoch_with_a_tier(tmp_path):
    """A tier scenario (`solar bench --tier DIR --tier-size X`): the tier's read bandwidth is
    measured as the loaders read their tiers (threads, random batches of slots), not by one
    stream, so the limit stays below the epochs when the tier's term is the largest."""
    data = generate(tmp_path / "d.h5", "ptychonn", SMALL["ptychonn"])
    (tmp_path / "tier").mkdir()
    cfg = harness.BenchConfig(paths=(str(data),), batch_size=16, epochs=2, buffer=0.25,
                              tier=str(tmp_path / "tier"), tier_size=0.5, loaders=("solar",),
                              workers=0)  # fmt: skip
    res = harness.run(cfg, _Solo())
    assert res["limits"]["tier_bytes_per_s"] > 0
    assert sum(res["loaders"]["solar"]["tier_hits"]) > 0  # the tier served: its term counts
    _check(res)
    assert not list((tmp_path / "tier").iterdir())  # the measurement's tier files are gone
