"""One grammar of sizes (solar/config.py): samples and bytes per rank, a share of the dataset
over all ranks; the same in the Loader, `solar plan`, `solar bench` and the examples."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_cli import run_cli

from solar.config import Size, parse_size, per_rank, share_or_size
from solar.errors import SolarError
from solar.loader import Loader
from solar.options import ExpertConfig, MemoryConfig

SOLAR = str(Path(sys.executable).with_name("solar"))
ROW = 4 * 5 * 4 + 2 * 8  # a sample of the small_h5 fixture (103 samples), in bytes


@pytest.mark.parametrize(
    ("text", "world", "samples"),
    [
        ("500", 1, 500), ("500", 8, 500), (500, 4, 500),  # samples: per rank
        ("1KiB", 1, 10), ("1KiB", 4, 10), ("1.5KB", 1, 15), ("1 kb", 2, 10),  # bytes: per rank
        ("10%", 1, 100), ("10%", 4, 25), ("10%", 3, 34), ("50%", 8, 63), ("12.5%", 1, 125),
        ("100%", 1, 1000), ("0%", 4, 0), (" 20 % ", 2, 100),  # shares: over all ranks
    ],
)  # fmt: skip
def test_a_size_is_samples_or_bytes_per_rank_or_a_share_over_all_ranks(text, world, samples):
    got = parse_size(text, sample_bytes=100, name="buffer", num_samples=1000, world_size=world)
    assert got == samples


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("lots", "cannot parse 'lots'"), ("-4", "cannot parse"), ("1.5", "whole number"),
        ("0.5", "a share of the dataset is written 50%"), ("3 x 4", "cannot parse"),
        ("4 furlongs", "unknown unit 'furlongs'"), ("150%", "more than the whole dataset"),
        (0.5, "is not a size"), (True, "is not a size"), (-3, "must be >= 0"),
        ("1B", "holds no sample"),
    ],
)  # fmt: skip
def test_anything_else_is_refused_in_one_line_naming_the_parameter(text, message):
    with pytest.raises(SolarError, match=message) as err:
        parse_size(text, sample_bytes=100, name="--tier-size", num_samples=1000)
    assert str(err.value).startswith("--tier-size") and "\n" not in str(err.value)


def test_bytes_need_the_sample_size_and_shares_the_dataset():
    with pytest.raises(SolarError, match="sample size"):
        parse_size("4GiB", sample_bytes=None)
    with pytest.raises(SolarError, match="number of samples"):
        parse_size("10%", sample_bytes=None)
    assert Size.parse("0%").zero and Size.parse("0B").zero and not Size.parse("1").zero


def test_the_benchmarks_configs_keep_shares_as_fractions():
    """`solar bench --buffer 50%` records 0.5, as its results files always have; a size in
    samples or bytes is kept as written and means the same as in the Loader."""
    assert share_or_size("50%", "--buffer") == 0.5
    assert share_or_size("2GiB", "--buffer") == "2GiB" and share_or_size("256", "-") == "256"
    with pytest.raises(SolarError, match="--buffer: cannot parse"):
        share_or_size("half", "--buffer")
    kw = {"num_samples": 1000, "sample_bytes": 100, "world_size": 4, "name": "--buffer"}
    assert per_rank(0.5, **kw) == per_rank("50%", **kw) == 125
    assert per_rank(0.1, **kw) == 25  # (exact: not ceil(0.1 * 1000 / 4 + ε))
    assert per_rank("256", **kw) == 256 and per_rank("2KB", **kw) == 20
    with pytest.raises(SolarError, match="in \\[0, 1\\]"):
        per_rank(2.0, **kw)


def test_the_loader_takes_every_form(small_h5):
    def capacity(**kw) -> tuple[int, int]:
        with Loader(small_h5, batch_size=4, epochs=1, **kw, expert=ExpertConfig(warm=False)) as ld:
            return ld.spec.buffer.capacity, ld.spec.buffer.tier

    assert capacity(buffer=20) == (20, 0)
    assert capacity(buffer=f"{ROW * 20}B") == (20, 0)
    assert capacity(buffer="50%") == (52, 0)  # ceil(0.5 * 103)
    assert capacity(buffer="50%", rank=1, world_size=2) == (26, 0)  # ceil(0.5 * 103 / 2)
    with pytest.raises(SolarError, match=r"^buffer: cannot parse 'half'"):
        capacity(buffer="half")


def test_the_loader_takes_a_tier_as_a_share(small_h5, tmp_path):
    with Loader(small_h5, batch_size=4, epochs=1, buffer="10%", rank=0, world_size=2,
                expert=ExpertConfig(warm=False),
                memory=MemoryConfig(tier=tmp_path, tier_size="40%")) as ld:  # fmt: skip
        assert (ld.spec.buffer.capacity, ld.spec.buffer.tier) == (6, 21)
    with pytest.raises(SolarError, match=r"^tier_size: .*more than the whole dataset"):
        Loader(small_h5, batch_size=4, epochs=1, buffer=4,
               memory=MemoryConfig(tier=tmp_path, tier_size="101%"))  # fmt: skip


def test_solar_plan_takes_every_form(capsys):
    base = ["plan", "--samples", 1000, "--sample-bytes", 100, "-P", 4, "-B", 8, "-E", 2]
    for size, samples in (("40", 40), ("4KB", 40), ("16%", 40)):
        code, out, err = run_cli([*base, "-C", size, "-D", size, "--json"], capsys)
        assert code == 0, err
        s = json.loads(out)
        assert (s["buffer"], s["tier_size"]) == (samples, samples)
    code, _, err = run_cli([*base, "-C", "0.5"], capsys)
    assert code == 1 and err.startswith("solar: error: --buffer: a count of samples")
    code, _, err = run_cli([*base, "-C", "4", "-D", "2 apples"], capsys)
    assert code == 1 and "--tier-size: unknown unit 'apples'" in err


def test_solar_bench_takes_samples_per_rank(tmp_path, capsys):
    """`--buffer 16` is 16 samples per rank (it ran with "aggregate buffer 1600 %" before)."""
    data = tmp_path / "d.h5"
    # gen and the refusals in process (main() is what the `solar` script runs): no
    # interpreter start (and import of torch) for each; the bench itself runs as users run it.
    assert run_cli(["gen", data, "--preset", "braggnn", "--samples", "64"], capsys)[0] == 0
    result = subprocess.run(
        [SOLAR, "bench", data, "-E", "1", "-B", "8", "--buffer", "16", "--loaders", "solar",
         "--json", tmp_path / "r.json"], capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    res = json.loads((tmp_path / "r.json").read_text())
    assert res["config"]["buffer"] == "16" and res["config"]["buffer_per_rank"] == 16
    assert "buffer 16 (16 samples/rank)" in result.stdout
    for args, message in [(["--buffer", "0.5"], "--buffer: a count of samples must be"),
                          (["--buffer", "150%"], "--buffer: '150%' is more than"),
                          ]:  # fmt: skip
        code, _, err = run_cli(["bench", data, "-E", "1", *args], capsys)
        assert code != 0 and message in err, err
        assert err.count("\n") == 1
