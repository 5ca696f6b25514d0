"""Tests that run under mpiexec (the mpich wheel's), as part of `make test`."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

HERE = Path(__file__).parent / "mpi"
MPIEXEC = Path(sys.executable).with_name("mpiexec")
N = 103

pytestmark = pytest.mark.skipif(not MPIEXEC.exists(), reason="no mpiexec beside python")


def mpirun(n: int, script: str, *args, timeout: float = 300) -> subprocess.CompletedProcess:
    cmd = [str(MPIEXEC), "-n", str(n), sys.executable, str(HERE / script), *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def write(path: Path, lo: int, hi: int, **layout) -> Path:
    rng = np.random.default_rng(lo)
    with h5py.File(path, "w") as f:
        f.create_dataset("img", data=rng.standard_normal((hi - lo, 5, 6)), **layout)
        f.create_dataset("lab", data=rng.standard_normal((hi - lo, 2)), **layout)
    return path


@pytest.mark.parametrize(("ranks", "slack", "layout"), [
    (2, 0.25, "one file"), (3, 0.0, "three files"), (3, 0.5, "chunked"), (4, 0.25, "one file"),
])  # fmt: skip
def test_ranks_serve_every_sample_once_with_h5py_bytes(tmp_path, ranks, slack, layout):
    if layout == "three files":
        data = [
            write(tmp_path / f"{i}.h5", lo, hi)
            for i, (lo, hi) in enumerate([(0, 40), (40, 77), (77, N)])
        ]
    elif layout == "chunked":
        data = [write(tmp_path / "d.h5", 0, N, chunks=True, compression="gzip")]
    else:
        data = [write(tmp_path / "d.h5", 0, N)]
    result = mpirun(ranks, "coverage.py", *data, "--slack", slack)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count(": ok") == ranks


def test_ddp_gradients_equal_a_single_process_step(tmp_path):
    data = write(tmp_path / "d.h5", 0, N)
    result = mpirun(3, "gradients.py", data)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("gradients equal") == 3


def test_a_failing_rank_ends_the_job_promptly():
    t0 = time.monotonic()
    result = mpirun(3, "fail.py", timeout=120)
    assert result.returncode != 0
    assert "boom from rank 1" in result.stderr
    assert "solar: rank 1 failed" in result.stderr
    assert "unreachable" not in result.stderr
    assert time.monotonic() - t0 < 60


def test_training_example_resumes_exactly(tmp_path):
    """An interrupted run, resumed from its checkpoint, ends with the same parameters."""
    example = HERE.parent.parent / "examples" / "train_surrogate.py"
    data = tmp_path / "p.h5"
    common = ["--data", data, "--samples", 96, "--epochs", 2, "--batch-size", 8,
              "--buffer", "30%", "--slack", 0.5]  # fmt: skip

    def train(*extra) -> str:
        cmd = [
            str(MPIEXEC),
            "-n",
            "2",
            sys.executable,
            str(example),
            *map(str, common + list(extra)),
        ]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stdout

    whole = train("--checkpoint", tmp_path / "a.pt")
    assert whole.count("epoch ") == 2 and "hit rate" in whole
    stopped = train("--checkpoint", tmp_path / "b.pt", "--stop-after", 9)
    assert "stopped after 9 steps" in stopped
    resumed = train("--checkpoint", tmp_path / "b.pt", "--resume")
    assert "resumed" in resumed
    checksum = [line for line in whole.splitlines() if "checksum" in line]
    assert checksum and checksum == [line for line in resumed.splitlines() if "checksum" in line]
