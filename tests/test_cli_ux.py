"""The commands read at a glance: help on every option, `solar inspect`'s one summary (one-sample
files, graphs, solar's own files), graph files in the sample commands, `plan --plot`, `-o`
never overwriting silently, no Python reprs in what is printed."""

from __future__ import annotations

import json
import re

import click
import h5py
import numpy as np
import pytest
from click.testing import CliRunner
from test_cli import run_cli

from solar.cli import cli
from solar.graph import generate_graph
from solar.options import PlanningConfig

# A Python repr in text meant for people: a tuple, list or dict literal, or empty parentheses.
REPR = re.compile(r"\(\)|\(\d+, \d*|\[\d+, \d+|\['|\{'")


def _commands() -> list[tuple[str, click.Command]]:
    group = cli
    assert isinstance(group, click.Group)
    return sorted(group.commands.items())


def test_every_option_has_help_and_every_summary_is_whole():
    for name, command in _commands():
        for p in command.params:
            if isinstance(p, click.Option):
                assert p.help, f"solar {name} {p.opts[0]}: no help text"
        assert command.short_help and len(command.short_help) <= 72, name
    res = CliRunner().invoke(cli, ["--help"], terminal_width=80)
    assert res.exit_code == 0 and "..." not in res.output.split("Commands:")[1], res.output
    for _, command in _commands():  # every summary in full, on its own line(s)
        assert " ".join(command.short_help.split()[:3]) in " ".join(res.output.split())
    plan = CliRunner().invoke(cli, ["plan", "--help"], terminal_width=100).output
    assert "neighbor" in plan and "--fanouts" in plan and "--plot" in plan
    convert = CliRunner().invoke(cli, ["convert", "--help"], terminal_width=100).output
    assert "Byte boundary" in " ".join(convert.split())
    gen = " ".join(CliRunner().invoke(cli, ["gen", "--help"], terminal_width=100).output.split())
    assert "mean number of neighbours per node" in gen and "share of the nodes" in gen


def _one_sample_files(root, n: int) -> None:
    root.mkdir()
    rng = np.random.default_rng(0)
    for i in range(n):
        with h5py.File(root / f"s{i:04d}.h5", "w") as f:
            f["x"] = rng.random((64, 64), np.float32)
            f["y"] = rng.random(3, np.float32)


def test_inspect_summarises_600_one_sample_files_in_a_few_lines(tmp_path, capsys):
    root = tmp_path / "one"
    _one_sample_files(root, 600)
    code, out, err = run_cli(["inspect", root], capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) <= 10, out  # was 5,400: nine lines per file, no summary
    assert "600 HDF5 files" in lines[0] and "each file looks like one sample" in out
    (run,) = [line for line in lines if line.startswith("to run:")]
    assert run == f"to run: solar convert {root} OUT.h5 --one-per-file"
    assert not REPR.search(out), out
    code, out, _ = run_cli(["inspect", root, "--one-per-file", "--key", "x", "--verbose"], capsys)
    assert code == 0 and "600 samples of 16.0 KiB (one per file)" in out
    assert out.count("  x: 64×64 float32") == 600 and "  y:" not in out  # per file, its key
    assert not REPR.search(out)
    code, _, err = run_cli(["inspect", root, "--key", "nope"], capsys)
    assert code == 1 and "no dataset key 'nope'" in err and err.count("\n") == 1


def test_inspect_reads_npy_headers_as_the_loader_does(tmp_path, capsys):
    arr = np.arange(5 * 3 * 4, dtype=np.float32).reshape(5, 3, 4)
    np.save(tmp_path / "a.npy", arr)
    code, out, err = run_cli(["inspect", tmp_path / "a.npy", "--verbose"], capsys)
    assert code == 0, err
    assert out.splitlines()[0].endswith("1 .npy file, 5 samples of 48 B"), out
    assert "data: 5×3×4 float32, contiguous, offset 128" in out and "nothing to convert" in out
    (tmp_path / "bad.npy").write_bytes(b"\x93NUMPY nonsense")
    code, _, err = run_cli(["inspect", tmp_path / "bad.npy"], capsys)
    assert code == 1 and "bad.npy: not a readable .npy file" in err and err.count("\n") == 1


def test_inspect_advises_one_conversion_and_none_that_would_fail(tmp_path, capsys):
    chunked = tmp_path / "c.h5"
    with h5py.File(chunked, "w") as f:
        f.create_dataset("img", data=np.ones((20, 4, 6), np.float32), chunks=(1, 4, 6),
                         compression="gzip")  # fmt: skip
        f["lab"] = np.arange(20)
    code, out, _ = run_cli(["inspect", chunked], capsys)
    assert code == 0 and f"to run: solar convert {chunked} OUT.h5\n" in out
    assert "img compressed with deflate level 4" in out and out.count("solar convert") == 1
    other = tmp_path / "d.h5"
    with h5py.File(other, "w") as f:
        f["img"] = np.ones((5, 4, 7), np.float32)  # another sample shape: convert would fail
        f["lab"] = np.arange(5)
    code, out, _ = run_cli(["inspect", chunked, other], capsys)
    assert code == 0 and "solar convert" not in out and "no conversion runs" in out
    assert "key 'img' holds samples of different shapes" in out and not REPR.search(out)


@pytest.mark.parametrize("preset", ["ptychonn", "braggnn", "autophasenn", "graph"])
def test_the_generated_presets_pass_their_own_inspection(preset, tmp_path, capsys):
    out = tmp_path / "d.h5"
    size = ["--nodes", 500, "--features", 8] if preset == "graph" else ["--samples", 3]
    code, _, err = run_cli(["gen", out, "--preset", preset, *size], capsys)
    assert code == 0, err
    code, text, _ = run_cli(["inspect", out], capsys)
    assert code == 0 and "to run:" not in text and "\n- " not in text, text
    with h5py.File(out) as f:  # every dataset starts on a page
        assert all(f[k].id.get_offset() % 4096 == 0 for k in f)
    if preset != "graph":
        assert "nothing to convert" in text


def test_a_graph_file_is_recognised_and_sample_commands_say_how_to_use_it(tmp_path, capsys):
    g = generate_graph(tmp_path / "g.h5", 800, 6.0, 8, train_fraction=0.25)
    code, out, _ = run_cli(["inspect", g], capsys)
    assert code == 0 and f"{g}: a graph of 800 nodes and " in out
    assert "degree: min" in out and "NeighborSampler" in out and "--sampler neighbor" in out
    assert "training split: 200 seed nodes (25.0 %)" in out and "8 classes" in out
    assert "solar convert" not in out
    # (The Loader line is code to copy, a tuple of fanouts in it.)
    assert not REPR.search("\n".join(x for x in out.splitlines() if "Loader(" not in x))
    code, out, _ = run_cli(["inspect", g, "--json"], capsys)
    (report,) = json.loads(out)["graphs"]
    with h5py.File(g) as f:
        assert report["edges"] == f["indices"].shape[0]
        assert report["degree_max"] == int(np.diff(f["indptr"][()]).max())
    for command in (["plan", g, "-P", 1, "-B", 8, "-E", 2, "-C", 10],
                    ["bench", g, "-E", 1]):  # fmt: skip
        code, stdout, err = run_cli(command, capsys)
        assert code == 1 and stdout == "" and err.count("\n") == 1, err
        assert f"{g}: a graph" in err and "--sampler neighbor" in err


def test_plan_neighbor_writes_a_plan_the_loader_takes_and_a_plot(tmp_path, capsys):
    from solar import Loader
    from solar.graph import NeighborSampler

    g = generate_graph(tmp_path / "g.h5", 800, 6.0, 8, train_fraction=0.25)
    plan, png = tmp_path / "p.h5", tmp_path / "p.png"
    args = ["plan", g, "--sampler", "neighbor", "--fanouts", "4,3", "-P", 1, "-B", 16, "-E", 2,
            "-C", "10%", "-o", plan, "--plot", png]  # fmt: skip
    code, out, err = run_cli(args, capsys)
    assert code == 0, err
    assert "hit rate per epoch: " in out and "(neighbor sampler)" in out
    assert png.stat().st_size > 5_000
    # The Loader takes the plan as its own (it refuses one made for other inputs).
    sampler = NeighborSampler(g, (4, 3), 16)
    ld = Loader(
        g, ["features"], sampler=sampler, epochs=2, buffer="10%", planning=PlanningConfig(plan=plan)
    )
    assert ld.spec.pages is not None  # page mates planned, as the Loader plans them
    for e in range(2):
        ld.set_epoch(e)
        assert sum(b["batch_size"] for b in ld) == 200  # every seed once
    ld.close()
    code, _, err = run_cli(args, capsys)  # both exist
    assert code == 1 and f"{plan}: exists (use --force to overwrite)" in err
    code, _, err = run_cli([*args[:-4], "--sampler", "neighbor", "--weights", "w.npy"], capsys)
    assert code == 1 and "does not take --weights" in err


def test_plan_plot_of_the_hit_rate_per_epoch(tmp_path, capsys):
    png = tmp_path / "p.png"
    args = ["plan", "--samples", 500, "-P", 2, "-B", 8, "-E", 3, "-C", 50, "--plot", png]
    code, out, err = run_cli([*args, "--json"], capsys)
    assert code == 0, err
    s = json.loads(out)
    assert len(s["hit_rate_per_epoch"]) == 3 and s["hit_rate_per_epoch"][0] == 0
    # The epochs add up to the run; none passes the bound of an epoch after the first.
    assert sum(s["hit_rate_per_epoch"]) / 3 == pytest.approx(s["hit_rate"])
    assert max(s["hit_rate_per_epoch"]) <= s["bound"] * 3 / 2 + 1e-9
    assert png.stat().st_size > 5_000 and s["plot"] == str(png)
    png.write_bytes(b"")
    code, _, err = run_cli(args, capsys)
    assert code == 1 and f"{png}: exists (use --force to overwrite)" in err and not png.read_bytes()
    code, _, err = run_cli([*args, "--force"], capsys)
    assert code == 0 and png.stat().st_size > 5_000, err


def test_convert_prints_its_keys_as_a_table(tmp_path, capsys):
    src = tmp_path / "a.h5"
    with h5py.File(src, "w") as f:
        f["img"] = np.ones((7, 4, 6), np.float32)
        f["grp/lab"] = np.arange(7)
    code, out, _ = run_cli(["convert", src, tmp_path / "b.h5"], capsys)
    assert code == 0 and not REPR.search(out) and "{" not in out, out
    assert out.splitlines()[1:] == [
        "  key      sample shape  dtype",
        "  grp/lab  scalar        int64",
        "  img      4×6           float32",
    ] or out.splitlines()[1:] == [
        "  key      sample shape  dtype",
        "  img      4×6           float32",
        "  grp/lab  scalar        int64",
    ]


def test_convert_refuses_an_option_it_would_ignore(tmp_path, capsys):
    src = tmp_path / "a.h5"
    with h5py.File(src, "w") as f:
        f["img"] = np.ones((3, 4), np.float32)
    code, _, err = run_cli(["convert", src, tmp_path / "b.h5", "--memory", "1GiB"], capsys)
    assert code == 1 and "--memory bounds a graph's conversion" in err and err.count("\n") == 1
    edges = tmp_path / "e.npy"
    np.save(edges, np.array([[0, 1], [1, 2]]))
    out = tmp_path / "g.h5"
    code, _, err = run_cli(["convert", edges, out, "--nodes", "3", "--align", "512"], capsys)
    assert code == 1 and "--align" in err and err.count("\n") == 1
    assert not (tmp_path / "b.h5").exists() and not out.exists()


def _result(compute_ms: float) -> dict:
    """A `solar bench` result as `solar.bench.run` returns it (two loaders, two epochs)."""
    loader = {"epoch_seconds": [1.0, 0.5], "samples_per_second": 200.0, "bytes_read": [400, 100],
              "logical_bytes_read": [800, 200], "stall_seconds": [0.1, 0.0],
              "cpu_seconds_per_sample": 0.001, "speedup": 1.5, "hit_rate_per_epoch": [0.0, 0.5],
              "hit_rate": 0.25, "ram_hits": [0, 50], "tier_hits": [0, 0],
              "bottleneck": ["bottleneck: trainer (waited 1 % of 1.5 s)"],
              "bottleneck_stage": ["trainer"]}  # fmt: skip
    torch = {"epoch_seconds": [1.5, 1.5], "samples_per_second": 133.0,
             "bytes_read": [800, 800], "logical_bytes_read": [800, 800], "stall_seconds": [],
             "cpu_seconds_per_sample": 0.002, "speedup": 1.0}  # fmt: skip
    config = {"num_samples": 100, "sample_bytes": 8, "world_size": 1, "batch_size": 10,
              "epochs": 2, "buffer": 0.5, "buffer_per_rank": 50, "tier_per_rank": 0,
              "compute_ms": compute_ms, "throttle": None}  # fmt: skip
    return {"config": config, "limits": {"read_bytes_per_s": 1e9, "mem_bytes_per_s": 1e10},
            "loaders": {"torch": torch, "solar": loader}, "bound": 0.25}  # fmt: skip


def test_bench_labels_its_bound_and_bytes_and_names_no_bottleneck_where_nothing_trains(tmp_path):
    from solar.bench import format_results, plot

    text = format_results(_result(0.0))
    assert "| bound (run) |" in text and "GB read (logical)" in text
    assert "= 25.0 %; from epoch 1 on, per epoch: 50.0 % (the plot's dashed line)" in text
    assert "bottleneck: trainer" not in text and "solar: no bottleneck (nothing trains" in text
    assert "solar: bottleneck: trainer" in format_results(_result(5.0))
    plot(_result(0.0), tmp_path / "b.png")
    assert (tmp_path / "b.png").stat().st_size > 5_000
