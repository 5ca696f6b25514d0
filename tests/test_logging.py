"""A loader that talks: standard logging under the ``solar`` logger, one INFO line when a
Loader's construction compiled kernels, progress as log lines when stderr is no terminal, no
handler set up by library code, and nothing said on a warm, normal run."""

from __future__ import annotations

import ast
import contextlib
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from test_cli import run_cli

import solar.cli
import solar.loader
from solar import Loader
from solar.warm import Warmth

PACKAGE = Path(solar.cli.__file__).parent


def _fake_measured(compiled: int, seconds: float):
    @contextlib.contextmanager
    def measured():
        out: list[Warmth] = []
        yield out
        out.append(Warmth(seconds + 1.0, seconds, compiled))

    return measured


def test_a_cold_construction_says_so_in_one_info_line(small_h5, caplog, monkeypatch):
    monkeypatch.setattr(solar.loader, "measured", _fake_measured(7, 2.5))
    with caplog.at_level(logging.DEBUG, logger="solar"):
        Loader(small_h5, batch_size=4, epochs=2, buffer=10).close()
    said = [r for r in caplog.records if r.name.startswith("solar")]
    assert len(said) == 1 and said[0].name == "solar.loader" and said[0].levelno == logging.INFO
    line = said[0].getMessage()
    assert "compiled 7 numba kernels in 2.5 s" in line and "`solar warm`" in line
    assert "\n" not in line


def test_a_warm_normal_run_says_nothing(small_h5, caplog, monkeypatch):
    monkeypatch.setattr(solar.loader, "measured", _fake_measured(0, 0.0))
    with caplog.at_level(logging.DEBUG, logger="solar"):
        with Loader(small_h5, batch_size=4, epochs=2, buffer=10) as ld:
            for e in range(2):
                ld.set_epoch(e)
                for _ in ld:
                    pass
    assert [r for r in caplog.records if r.name.startswith("solar")] == []


def test_library_code_sets_up_no_logging_handler():
    """Only the command (solar/cli.py) may: no addHandler, basicConfig, dictConfig,
    setLevel of a logger elsewhere; and importing solar leaves logging as it was."""
    for path in PACKAGE.rglob("*.py"):
        if path.name == "cli.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute):
                assert node.attr not in ("addHandler", "basicConfig", "dictConfig",
                                         "fileConfig"), (path, node.attr)  # fmt: skip
    code = ("import logging, solar, solar.loader, solar.bench, solar.graph.bench; "
            "print(logging.getLogger('solar').handlers, logging.getLogger().handlers)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    assert out.strip() == "[] []"


def test_the_command_logs_progress_lines_when_stderr_is_no_terminal(tmp_path, capsys,
                                                                     monkeypatch):  # fmt: skip
    out = tmp_path / "d.h5"
    args = ["gen", out, "--preset", "braggnn", "--samples", 3000]
    code, _, err = run_cli(args, capsys)  # a short run: nothing but its result
    assert code == 0 and err == ""
    monkeypatch.setattr(solar.cli, "_LOG_AFTER", 0.0)  # as if each piece took long
    code, _, err = run_cli([*args, "--force"], capsys)
    assert code == 0 and err.splitlines()[-1] == err.splitlines()[-1].strip()
    lines = err.splitlines()
    assert lines and all(line.startswith("solar: generating: ") for line in lines)
    assert lines[-1].startswith("solar: generating: 100 % (3000/3000)") and "\r" not in err
    code, _, err = run_cli(["convert", out, tmp_path / "c.h5"], capsys)
    assert code == 0 and "solar: converting: 100 % (3000/3000)" in err


def test_solar_plan_logs_planning_progress(capsys, monkeypatch, caplog):
    monkeypatch.setattr(solar.cli, "_LOG_AFTER", 0.0)
    monkeypatch.setattr(solar.cli, "_PROGRESS_ACCESSES", 0)
    with caplog.at_level(logging.INFO, logger="solar"):
        code, out, err = run_cli(
            ["plan", "--samples", 1000, "-P", 2, "-B", 10, "-E", 3, "-C", "10%"], capsys
        )
    assert code == 0 and "hit rate" in out
    lines = [r.getMessage() for r in caplog.records if r.name == "solar.cli"]
    assert lines[-1].startswith("planning: 100 % (150/150 steps)")
    assert "solar: planning: 100 % (150/150 steps)" in err


@pytest.mark.parametrize("every", [False, True])
def test_progress_lines_are_every_tenth_or_minute(monkeypatch, caplog, every):
    step = 7.0 if every else 0.1  # seconds a call takes
    clock = iter(k * step for k in range(2000))
    monkeypatch.setattr(solar.cli.time, "perf_counter", lambda: next(clock))
    with caplog.at_level(logging.INFO, logger="solar"):
        progress = solar.cli._LogProgress("working", 1000, " items")
        for _ in range(1000):
            progress(1)
    said = [r.getMessage() for r in caplog.records]
    assert said[-1].startswith("working: 100 % (1000/1000 items), ")
    if every:  # 7 s a call: after the first 5 s, each tenth and at least once a minute
        assert len(said) >= 7000 // 60
    else:  # 0.1 s a call: a first line after 5 s, then one per tenth
        assert [s.split(" %")[0] for s in said] == [
            f"working: {p}" for p in (5, *range(10, 101, 10))
        ]
