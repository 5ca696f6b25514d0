"""`solar gen` and `solar bench` (runs as the console script, as users do; refusals of bad
arguments through the same entry point, solar.cli.main, in this process: no interpreter start)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import pytest
from test_cli import run_cli

SOLAR = str(Path(sys.executable).with_name("solar"))


def test_gen_writes_presets_and_refuses_to_overwrite(tmp_path, capsys):
    out = tmp_path / "b.h5"
    code, stdout, _ = run_cli(["gen", out, "--preset", "braggnn", "--samples", 50], capsys)
    assert code == 0 and "50 braggnn-like samples" in stdout
    with h5py.File(out) as f:
        assert f["patch"].shape == (50, 11, 11) and f["center"].shape == (50, 2)
    code, _, err = run_cli(["gen", out, "--preset", "braggnn", "--samples", 50], capsys)
    assert code == 1 and "exists" in err
    code, _, _ = run_cli(["gen", out, "--preset", "autophasenn", "--samples", 3, "--chunks", 2,
                          "--compression", "gzip", "--force"], capsys)  # fmt: skip
    with h5py.File(out) as f:
        assert f["volume"].chunks == (2, 64, 64, 64) and f["volume"].compression == "gzip"


def gen(args: list) -> None:
    """``solar gen ARGS``, in this process (an interpreter start less than a subprocess)."""
    from click.testing import CliRunner

    from solar.cli import cli

    result = CliRunner().invoke(cli, ["gen", *map(str, args)])
    assert result.exit_code == 0, result.output


def res_logical(tmp_path: Path, loader: str) -> list[int]:
    return json.loads((tmp_path / "r.json").read_text())["loaders"][loader]["logical_bytes_read"]


def res_hits(tmp_path: Path) -> list[list[int]]:
    solar = json.loads((tmp_path / "r.json").read_text())["loaders"]["solar"]
    return [solar["ram_hits"], solar["tier_hits"]]


@pytest.mark.parametrize("world", [1, 2])
def test_bench_compares_loaders_with_json_and_plot(tmp_path, world):
    data = tmp_path / "d.h5"
    gen([data, "--preset", "braggnn", "--samples", "600"])
    result = subprocess.run(
        [SOLAR, "bench", data, "-P", str(world), "-E", "2", "-B", "16", "--buffer", "100%",
         "--loaders", "torch,lru,solar", "--workers", "1", "--json", tmp_path / "r.json",
         "--plot", tmp_path / "r.png", "--compute-ms", "1",
         *(["--threads", "auto"] if world == 2 else [])],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| solar |" in result.stdout and "time limit" in result.stdout
    assert "| bound (run) |" in result.stdout and "GB read (logical)" in result.stdout
    # Bytes counted alike, samples read × their size: epoch 0 reads everything, as torch.
    logical, row = res_logical(tmp_path, "solar"), 11 * 11 * 4 + 2 * 4
    assert logical[0] == res_logical(tmp_path, "torch")[0] == 600 * row
    assert logical[1] == 600 * row - sum(e[1] for e in res_hits(tmp_path)) * row
    # A bottleneck line per solar loader; the stage figures of every rank in the JSON.
    assert "\nsolar: bottleneck: " in result.stdout and "\nlru: bottleneck: " in result.stdout
    res = json.loads((tmp_path / "r.json").read_text())
    assert set(res["loaders"]) == {"torch", "lru", "solar"}
    assert res["config"]["world_size"] == world
    solar = res["loaders"]["solar"]
    assert len(solar["epoch_seconds"]) == 2
    # A buffer holding the whole dataset: every reuse hits on one rank; on two, a rank at its
    # batch cap (slack 0.25) hands a few held samples to the other.
    first, second = solar["hit_rate_per_epoch"]
    assert first == 0.0 and (second == 1.0 if world == 1 else 0.95 <= second < 1.0)
    assert res["loaders"]["torch"]["speedup"] == 1.0
    assert (tmp_path / "r.png").stat().st_size > 10_000
    assert len(solar["stages"]) == len(solar["bottleneck"]) == world
    read = solar["stages"][0]["read"]
    assert read["items"] > 0 and 0 <= read["utilisation"] <= 1
    assert sum(s["trainer"]["items"] for s in solar["stages"]) == 2 * 600  # every sample served
    assert ("tuned" in solar) == (world == 2)  # --threads auto
    if world == 2:
        assert "tuned read_threads" in result.stdout
        assert {"read_threads", "decode_threads", "read_ahead"} <= set(solar["tuned"][0])


@pytest.mark.xdist_group("bench_runs")
def test_bench_compares_equal_batches_with_variable_ones_and_slack_0(bench_run):
    result, tmp_path = bench_run("equal")  # (tests/bench_runs.py: 600 samples, P 2, E 3, B 16)
    assert result.returncode == 0, result.stderr[-3000:]
    res = json.loads((tmp_path / "r.json").read_text())
    assert list(res["loaders"]) == ["solar", "solar-slack0", "solar-variable"]
    solar, slack0, variable = (
        res["loaders"][k] for k in ("solar", "solar-slack0", "solar-variable")
    )
    # solar's default, equal batches: the same reads and hits as variable batches (the planner
    # is unchanged), more than slack 0, and rows moved between the ranks.
    assert variable["ram_hits"] == solar["ram_hits"]
    assert variable["bytes_read"] == solar["bytes_read"]
    assert sum(slack0["ram_hits"]) < sum(solar["ram_hits"])
    assert sum(solar["rows_moved"]) > 0 and "rows_moved" not in variable
    assert "solar: moved between ranks" in result.stdout


@pytest.mark.xdist_group("bench_runs")
def test_bench_with_a_second_tier(bench_run):
    result, tmp_path = bench_run("tier")  # (tests/bench_runs.py: 400 samples, P 2, E 3, B 8)
    nvme = tmp_path / "nvme"
    assert result.returncode == 0, result.stderr[-3000:]
    assert "tier hits" in result.stdout and "tier read" in result.stdout
    res = json.loads((tmp_path / "r.json").read_text())
    solar, ram, nopfs = (res["loaders"][k] for k in ("solar", "solar-ram", "nopfs"))
    assert sum(solar["tier_hits"]) > 0 and sum(nopfs["tier_hits"]) > 0
    assert ram["tier_hits"] == [0, 0, 0]
    assert res["bound"] == pytest.approx(2 / 3)  # P·(C+D) = 2·(20+200) holds all 400
    # Nearly everything after epoch 0 comes from RAM or the tier, not storage.
    assert solar["hit_rate_per_epoch"][0] == 0 and min(solar["hit_rate_per_epoch"][1:]) > 0.9
    assert res["limits"]["tier_bytes_per_s"] > 0 and solar["epoch_limit_seconds"]
    assert list(nvme.iterdir()) == []


def test_bench_bad_input_is_one_line(tmp_path, capsys):
    data = tmp_path / "d.h5"
    assert run_cli(["gen", data, "--preset", "braggnn", "--samples", "100"], capsys)[0] == 0
    for args, message in [(["--loaders", "torch,magic"], "unknown magic (choose"),
                          (["--buffer", "lots"], "--buffer"),
                          (["--throttle", "fast"], "--throttle"),
                          (["--threads", "0"], "threads must be an integer >= 1"),
                          (["--read-ahead", "-1"], "read_ahead must be"),
                          (["--tier-size", "50%"], "--tier DIR and --tier-size > 0 go together"),
                          (["--tier", tmp_path, "--tier-size", "x"], "--tier-size: cannot parse"),
                          ]:  # fmt: skip
        # In process (main() is what the `solar` script runs): each refusal comes before a
        # byte is read, so no interpreter start per case.
        code, _, err = run_cli(["bench", data, "-E", "1", *args], capsys)
        assert code != 0 and message in err, err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_bench_with_a_weighted_sampler(tmp_path, capsys):
    import numpy as np

    data = tmp_path / "d.h5"
    gen([data, "--preset", "braggnn", "--samples", "300"])
    np.save(tmp_path / "w.npy", (1.0 + np.arange(300)) ** -1.0)
    result = subprocess.run(
        [SOLAR, "bench", data, "-P", "2", "-E", "2", "-B", "8", "--buffer", "20%", "--workers",
         "1", "--sampler", "weighted", "--weights", tmp_path / "w.npy", "--json",
         tmp_path / "r.json"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    res = json.loads((tmp_path / "r.json").read_text())
    assert set(res["loaders"]) == {"torch", "lru", "static", "nopfs", "solar"}
    hits = {k: v["hit_rate"] for k, v in res["loaders"].items() if "hit_rate" in v}
    assert hits["solar"] >= max(hits["lru"], hits["static"]) and hits["solar"] > 0
    assert "bound" not in res  # the permutation bound does not apply
    code, _, err = run_cli(["bench", data, "--sampler", "weighted"], capsys)
    assert code != 0 and "--weights" in err


def test_bench_applies_one_transform_in_every_loader(tmp_path, capsys):
    """--transform: the DataLoader in __getitem__, solar in its pipeline, solar-inloop in the
    training loop; CPU seconds per sample reported for each; a bad one refused up front."""
    data, mod = tmp_path / "d.h5", tmp_path / "aug.py"
    gen([data, "--preset", "braggnn", "--samples", "300"])
    mod.write_text("def halve(sample, rng):\n    return {k: v / 2 for k, v in sample.items()}\n")
    result = subprocess.run(
        [SOLAR, "bench", data, "-E", "2", "-B", "16", "--buffer", "25%", "--workers", "1",
         "--transform", f"{mod}:halve", "--json", tmp_path / "r.json"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    res = json.loads((tmp_path / "r.json").read_text())
    assert list(res["loaders"]) == ["torch", "solar-inloop", "solar", "solar-procs"]
    # Reported for each (>= 0, not > 0: /proc/stat counts in 10 ms ticks, and a fast machine's
    # two short epochs may see none).
    assert all(e["cpu_seconds_per_sample"] >= 0 for e in res["loaders"].values())
    assert res["config"]["transform"] == f"{mod}:halve"
    code, _, err = run_cli(["bench", data, "--transform", f"{mod}:nothing"], capsys)
    assert code != 0
    assert f"--transform {mod}:nothing: {mod} has no function 'nothing'" in err


# Two ranks make node buffers (solar-host): in the launching jobs' group (tests/conftest.py).
@pytest.mark.parametrize("world", [1, pytest.param(2, marks=pytest.mark.xdist_group("launchers"))])
def test_bench_gathers_gnn_features_with_every_loader(tmp_path, world, capsys):
    """--sampler neighbor: mmap (emulated), lru, static and solar gather the same subgraphs'
    rows under one budget; steps/s, nodes/s, hit rate and read amplification per loader (two
    ranks: also solar-host, by default: --share auto)."""
    graph = tmp_path / "g.h5"
    gen([graph, "--preset", "graph", "--nodes", "3000", "--avg-degree", "6", "--features", "16"])
    result = subprocess.run(
        [SOLAR, "bench", graph, "--sampler", "neighbor", "--fanouts", "4,3", "-P", str(world),
         "-E", "2", "-B", "32", "--buffer", "20%", "--json", tmp_path / "r.json",
         "--plot", tmp_path / "r.png", "--probe-seconds", "0.02"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    res = json.loads((tmp_path / "r.json").read_text())
    node = ["solar-host"] if world > 1 else []
    assert list(res["loaders"]) == ["mmap", "lru", "static", "solar", *node]
    assert res["config"]["world_size"] == world and res["config"]["fanouts"] == [4, 3]
    loaders = res["loaders"].values()
    # The same subgraphs: every loader gathers the same rows each epoch.
    assert len({tuple(e["rows"]) for e in loaders}) == 1
    assert all(e["steps_per_second"] > 0 and e["nodes_per_second"] > 0 for e in loaders)
    assert all(e["read_amplification"] >= 1 for e in loaders)  # whole pages (O_DIRECT)
    hits = {k: e["hit_rate"] for k, e in res["loaders"].items()}
    assert hits["solar"] >= max(hits["lru"], hits["static"]) and hits["solar"] > 0
    assert res["loaders"]["static"]["vs_static"] == 1.0
    assert "| solar |" in result.stdout and "emulated page cache" in result.stdout
    assert (tmp_path / "r.png").stat().st_size > 10_000  # nodes/s and hit rate per epoch
    # The storage probe beside the figures: page reads per second at each queue depth.
    probe = res["probe"]["random_pages_per_second"]
    assert list(probe) == ["1", "8", "32", "64"] and all(r > 0 for r in probe.values())
    assert "storage probe" in result.stdout and "at queue depth 1/8/32/64" in result.stdout
    assert all(e["pages_per_second"] > 0 for e in loaders)
    if world > 1:
        return
    # Refusals, in this process (solar.cli.main, the console script's entry: a traceback
    # would be an exception here, not an exit).
    code, _, err = run_cli(["bench", graph, "--sampler", "neighbor", "--loaders", "torch"], capsys)
    assert code != 0 and "unknown torch with --sampler neighbor" in err
    code, _, err = run_cli(["bench", graph, "--sampler", "neighbor", "--fanouts", "4,x"], capsys)
    assert code != 0 and "--fanouts: expected integers" in err
    assert "Traceback" not in err
    code, _, err = run_cli(["bench", graph, "--share", "node"], capsys)
    assert code != 0 and "--share node: with --sampler neighbor only" in err


def test_the_relaunch_imports_this_solar_whatever_the_working_directory_holds(tmp_path):
    """`solar bench -P 4` from a folder holding a clone named solar/ ran the clone (issue 47)."""
    import solar
    from solar import bench

    decoy = tmp_path / "solar"
    decoy.mkdir()
    (decoy / "__init__.py").write_text("raise ImportError('the decoy was imported')\n")
    (decoy / "cli.py").write_text("raise ImportError('the decoy was imported')\n")
    cmd, env = bench.relaunch_command(2, ["--version"])
    python_onwards = cmd[cmd.index(sys.executable) :]  # the rank's command, without mpiexec
    probe = [*python_onwards[:-3], "-c", "import solar, sys; print(solar.__file__)"]
    out = subprocess.run(probe, cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert os.path.samefile(out.stdout.strip(), solar.__file__)
    assert python_onwards[1:4] == ["-P", "-m", "solar.cli"]
