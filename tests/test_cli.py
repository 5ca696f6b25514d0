from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import write_h5

from solar import load_plan
from solar.cli import main


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_json_reports_the_figures(tmp_path, capsys):
    out = tmp_path / "p.h5"
    args = ["plan", "--samples", 500, "-P", 4, "-B", 8, "-E", 4, "-C", 40, "-o", out, "--json"]
    code, stdout, _ = run_cli(args, capsys)
    assert code == 0
    s = json.loads(stdout)
    for key in ("accesses", "hits", "hit_rate", "bound", "steps_per_epoch", "plan_seconds"):
        assert key in s
    assert s["accesses"] == 2000 and s["steps_per_epoch"] == 16
    assert 0 < s["hit_rate"] <= s["bound"] == pytest.approx(160 * 3 / 2000)
    assert load_plan(out).hits == s["hits"]
    assert s["bytes_per_access"] < 40  # tiny plan: HDF5 headers dominate


def test_plan_prints_its_memory_first_and_streams_a_run_larger_than_memory(tmp_path, capsys,
                                                                          monkeypatch):  # fmt: skip
    """`solar plan` says what it will hold before planning; written to a file (or simulated) a
    run is planned one epoch at a time, so a run whose decisions exceed the memory is planned
    where the same run kept in memory (make_plan) is refused."""
    import solar._memory
    from solar import BufferConfig, PlanSpec, RunConfig, make_plan
    from solar.errors import SolarError
    from solar.schedule.plans.plan import plan_memory

    spec = PlanSpec(RunConfig(20_000, 4, 8, 40, 0), BufferConfig(500))
    streamed, kept = plan_memory(spec), plan_memory(spec, keep_all=True)
    assert streamed.accesses == 800_000 and streamed.per_epoch == 20_000
    assert kept.need - streamed.need == 10 * 800_000
    room = streamed.need + 1_000_000  # the run's decisions (~8 MB) do not fit
    monkeypatch.setattr(solar._memory, "available_memory", lambda: room)
    monkeypatch.setattr(solar._memory, "cgroup_room", lambda: None)
    with pytest.raises(SolarError, match="planning 800000 accesses"):
        make_plan(spec)
    out = tmp_path / "p.h5"
    args = ["plan", "--samples", 20_000, "-P", 4, "-B", 8, "-E", 40, "-C", 500, "-o", out, "--json"]
    code, stdout, err = run_cli(args, capsys)
    assert code == 0, err
    assert "planning: at most 800000 accesses (20000 per epoch): about" in err
    assert json.loads(stdout)["accesses"] == 800_000 == load_plan(out).accesses


def test_plan_with_a_second_tier_reports_ram_and_tier_hits(tmp_path, capsys):
    args = ["plan", "--samples", 1000, "-P", 2, "-B", 8, "-E", 3, "-C", 50, "--tier-size", 300]
    code, out, _ = run_cli([*args, "--json"], capsys)
    s = json.loads(out)
    assert code == 0 and s["tier_size"] == 300 and s["tier_hits"] > s["ram_hits"] > 0
    assert s["ram_hits"] + s["tier_hits"] == s["hits"]
    assert s["bound"] == pytest.approx(700 * 2 / (1000 * 3))
    code, out, _ = run_cli(args, capsys)
    assert code == 0 and "from the tier" in out and "P·(C+D)" in out
    code, _, err = run_cli([*args, "--policy", "lru"], capsys)
    assert code == 1 and "policy 'lru' has no second tier" in err and err.count("\n") == 1


def test_plan_without_out_simulates_and_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["plan", "--samples", 500, "-P", 4, "-B", 8, "-E", 4, "-C", 40, "--json"]
    code, stdout, _ = run_cli(args, capsys)
    assert code == 0
    s = json.loads(stdout)
    code, saved, _ = run_cli([*args, "-o", tmp_path / "p.h5"], capsys)
    assert code == 0 and s["hits"] == json.loads(saved)["hits"] > 0
    assert "out" not in s and list(tmp_path.iterdir()) == [tmp_path / "p.h5"]


def test_plan_from_data_files_with_a_byte_buffer(small_h5, tmp_path, capsys):
    out = tmp_path / "p.h5"
    row = 4 * 5 * 4 + 2 * 8
    args = [small_h5, "--key", "x", "--key", "y", "-P", 2, "-B", 5, "-E", 3, "-C", f"{row * 10}B"]
    code, stdout, _ = run_cli(["plan", *args, "-o", out], capsys)
    assert code == 0, stdout
    plan = load_plan(out)
    assert plan.spec.buffer.capacity == 10
    assert plan.spec.sample_bytes == row and plan.spec.dataset
    assert "rank" in stdout and "hit rate" in stdout and "bound" in stdout
    assert f"({row} B each)" in stdout


def test_glob_and_default_keys(tmp_path, capsys):
    for i in range(3):
        write_h5(tmp_path / f"part{i}.h5", a=np.zeros((10 + i, 3), np.float32))
    out = tmp_path / "p.h5"
    code, _, err = run_cli(
        ["plan", tmp_path / "part*.h5", "-P", 2, "-B", 3, "-E", 2, "-C", 5, "-o", out], capsys
    )
    assert code == 0, err
    assert load_plan(out).run.num_samples == 33


def _bad_inputs(tmp_path: Path, small_h5: Path) -> dict[str, tuple[list, str]]:
    text = tmp_path / "notes.h5"
    text.write_text("hello, not hdf5\n")
    truncated = tmp_path / "trunc.h5"
    write_h5(truncated, a=np.ones((1000, 100), np.float32))
    truncated.write_bytes(truncated.read_bytes()[:200_000])
    uneven = write_h5(tmp_path / "uneven.h5", a=np.zeros((10, 2)), b=np.zeros((11, 2)))
    shape = ["-P", 2, "-B", 4, "-E", 2, "-C", 5]
    return {
        "missing file": ([tmp_path / "absent.h5", *shape], "absent.h5: no such file"),
        "not hdf5": ([text, *shape], "notes.h5: not an HDF5 file"),
        "truncated": ([truncated, *shape], "trunc.h5: truncated"),
        "unknown key": ([small_h5, "--key", "nope", *shape], "no dataset key 'nope'"),
        "uneven keys": ([uneven, *shape], "key 'b' has 11 samples but 'a' has 10"),
        "zero batch": ([small_h5, "-P", 2, "-B", 0, "-E", 2, "-C", 5], "batch_size must be"),
        "negative epochs": ([small_h5, "-P", 2, "-B", 4, "-E", -1, "-C", 5], "epochs must be"),
        "negative buffer": ([small_h5, "-P", 2, "-B", 4, "-E", 2, "-C", "-5"], "buffer"),
        "batch over data": (
            [small_h5, "-P", 4, "-B", 30, "-E", 2, "-C", 5, "--drop-last"],
            "exceeds the 103",
        ),
        "bytes unknown": (
            ["--samples", 100, "-P", 2, "-B", 4, "-E", 2, "-C", "1GiB"],
            "sample size",
        ),
        "no data": (["-P", 2, "-B", 4, "-E", 2, "-C", 5], "--samples"),
        "missing option": ([small_h5, "-P", 2, "-B", 4, "-E", 2], "--buffer"),
        "bad policy": ([small_h5, *shape, "--policy", "magic"], "magic"),
        "huge slack": ([small_h5, *shape, "--slack", "1e19"], "slack must be between"),
        "too big to plan": (["--samples", 10**11, "-P", 2, "-B", 4, "-E", 2, "-C", 5], "GiB"),
        "tiny byte buffer": ([small_h5, "-P", 2, "-B", 4, "-E", 2, "-C", "5B"], "holds no sample"),
    }


@pytest.mark.parametrize(
    "case",
    ["missing file", "not hdf5", "truncated", "unknown key", "uneven keys", "zero batch",
     "negative epochs", "negative buffer", "batch over data", "bytes unknown", "no data",
     "missing option", "bad policy", "huge slack", "too big to plan", "tiny byte buffer"],
)  # fmt: skip
def test_bad_input_is_one_line_and_leaves_nothing(case, small_h5, tmp_path, capsys):
    args, message = _bad_inputs(tmp_path, small_h5)[case]
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    code, stdout, err = run_cli(["plan", *args, "-o", out_dir / "p.h5"], capsys)
    assert code != 0
    assert stdout == ""
    assert err.count("\n") == 1 and err.startswith("solar: error:"), err
    assert message in err, err
    assert list(out_dir.iterdir()) == []


def test_console_script_exits_non_zero_without_traceback(tmp_path):
    exe = Path(sys.executable).with_name("solar")
    env = {**os.environ, "PYTHONPATH": ""}
    result = subprocess.run(
        [exe, "plan", tmp_path / "absent.h5", "-P", "2", "-B", "4", "-E", "2", "-C", "5",
         "-o", tmp_path / "p.h5"],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.strip() == f"solar: error: {tmp_path / 'absent.h5'}: no such file"
    assert "Traceback" not in result.stderr


def test_demo_plans_its_generated_dataset(tmp_path, capsys):
    code, stdout, _ = run_cli(["demo", "--dir", tmp_path / "demo"], capsys)
    assert code == 0
    assert "hit rate" in stdout
    # It ends saying what it showed, solar against a DataLoader, and what to try next.
    assert "a PyTorch DataLoader reads all 5120" in stdout
    assert stdout.rstrip().splitlines()[-2].startswith("  solar bench ")
    assert stdout.rstrip().splitlines()[-1].startswith("  solar inspect ")
    with h5py.File(tmp_path / "demo" / "ptychonn.h5") as f:
        assert f["diffraction"].shape == (1024, 256, 256)
    assert load_plan(tmp_path / "demo" / "plan.h5").world_size == 4


def test_output_path_problems_are_caught_before_planning(tmp_path, capsys):
    shape = ["--samples", 100, "-P", 2, "-B", 4, "-E", 2, "-C", 5]
    for out, message in [
        (tmp_path, "is a directory"),
        (tmp_path / "no" / "p.h5", "does not exist"),
    ]:
        code, _, err = run_cli(["plan", *shape, "-o", out], capsys)
        assert code == 1 and message in err and err.count("\n") == 1, err
