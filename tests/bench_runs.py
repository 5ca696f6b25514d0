"""Two-rank `solar bench` runs that several tests read (tests/test_bench.py's checks of what
each run compares, tests/test_bench_limit.py's of its epoch time limits): each one runs once
per pytest process (the ``bench_run`` fixture, tests/conftest.py), as users run it, the console
script relaunching itself under mpiexec. A run costs an interpreter, mpiexec and two ranks
importing torch and solar: more than the checks that read it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SOLAR = str(Path(sys.executable).with_name("solar"))


def _solar(*args) -> subprocess.CompletedProcess:
    return subprocess.run([SOLAR, *map(str, args)], capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip


def _gen(data: Path, samples: int) -> None:
    """``solar gen`` of braggnn-like samples, in this process (no interpreter start)."""
    from click.testing import CliRunner

    from solar.cli import cli

    made = CliRunner().invoke(cli, ["gen", str(data), "--preset", "braggnn", "--samples",
                                    str(samples)])  # fmt: skip
    assert made.exit_code == 0, made.output


def equal(tmp: Path) -> subprocess.CompletedProcess:
    """Equal batches (solar's default), variable ones and slack 0 on 600 samples, half held;
    its JSON in ``tmp/r.json``. No tier, no compute: the limit's read and memory terms."""
    data = tmp / "d.h5"
    _gen(data, 600)
    return _solar("bench", data, "-P", "2", "-E", "3", "-B", "16", "--buffer", "50%",
                  "--loaders", "solar,solar-slack0", "--variable-batches", "--json",
                  tmp / "r.json")  # fmt: skip


def tier(tmp: Path) -> subprocess.CompletedProcess:
    """A second tier holding all 400 samples (``tmp/nvme``) behind RAM for 10 %, throttled
    storage; its JSON in ``tmp/r.json``. The limit's tier term too."""
    data, nvme = tmp / "d.h5", tmp / "nvme"
    nvme.mkdir()
    _gen(data, 400)
    return _solar("bench", data, "-P", "2", "-E", "3", "-B", "8", "--buffer", "10%", "--tier",
                  nvme, "--tier-size", "100%", "--loaders", "nopfs,solar,solar-ram", "--json",
                  tmp / "r.json", "--throttle", "200,1")  # fmt: skip


RUNS = {"equal": equal, "tier": tier}
