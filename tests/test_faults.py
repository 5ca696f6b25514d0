"""Seeded faults at the executor's calls over whole epochs (tests/faults.py), in one process
and under ``mpiexec -n 3``: exact bytes or a one-line stop, nothing left behind; and the
messages that misled (issue 33). More seeds: bench/fault_bench.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import faults
import numpy as np
import pytest
from helpers import reference, write_h5
from ranks_apart import MPIEXEC, run_job

from solar import Loader, SolarError
from solar.config import ReaderConfig
from solar.io.hdf5 import describe
from solar.io.reader import Reader
from solar.options import ExpertConfig

HERE = Path(__file__).parent
ROOT = HERE.parent

# (mode, seed): what each does at rate 0.03 (deterministic: drawn per bytes read, not per
# thread order; the draws follow the requests, so a change in how reads are joined moves
# them: tier seed 0 became a tier slot's error when buffered rows a page apart were joined).
# Transient faults served exactly; a bad sector and a file changed in place each stop the
# run in one line.
CASES = [("buffered", 5), ("direct", 3), ("one_per_file", 3), ("tier", 8)]


@pytest.fixture(scope="module")
def originals(tmp_path_factory) -> dict[str, list[Path]]:
    base = tmp_path_factory.mktemp("faults")
    return {mode: faults.make_data(base / mode, mode) for mode in faults.MODES}


@pytest.mark.one_process
def test_seeded_faults_serve_exact_bytes_or_stop_in_one_line(originals, tmp_path):
    seen = []
    for mode, seed in CASES:
        o = faults.run(seed, mode, originals[mode], tmp_path / "run", rate=0.03)
        assert o.ok, o
        assert sum(o.injected.values()) > 0, o
        seen.append("exact" if o.stopped is None else o.stopped.split(": ", 1)[1][:12])
    # Every outcome was met: served exactly through transient faults, and both stops.
    assert set(seen) == {"exact", "read error (", "changed sinc"}, seen


@pytest.mark.one_process
def test_a_transient_eio_under_o_direct_is_read_again_not_a_short_read(originals, tmp_path):
    """It reported "short read (12288 of 12288 bytes)": the read again succeeded, and its
    bytes were then taken for a short file."""
    o = faults.run(0, "direct", originals["direct"], tmp_path / "run", rate=0.3, epochs=1,
                   kinds=("eio_once",))  # fmt: skip
    assert o.injected["eio_once"] > 0 and o.stopped is None and o.ok, o


@pytest.mark.one_process
def test_a_memory_fault_names_batch_memory_not_the_data_file(tmp_path):
    """Batch memory whose pages cannot be backed (a full /dev/shm: EFAULT) is not a read
    error of the data file. Here: a mapping of a file truncated under it."""
    path = write_h5(tmp_path / "d.h5", x=np.arange(64 * 1024, dtype=np.float32).reshape(64, -1))
    reader = Reader(describe([path]), ReaderConfig(threads=1))
    backing = tmp_path / "shm"
    backing.write_bytes(bytes(8 * 4096))
    out = np.memmap(backing, np.float32, "r+", shape=(8, 1024))
    os.truncate(backing, 0)  # its pages now fault: the kernel's copy gets EFAULT
    with pytest.raises(SolarError) as err:
        reader.read(np.arange(8), [out])
    message = str(err.value)
    assert "could not be stored in batch memory" in message and "/dev/shm" in message
    assert " free" in message and "read error" not in message and "\n" not in message
    reader.close()


@pytest.mark.one_process
def test_a_truncated_file_names_its_key_and_sample(tmp_path):
    path = write_h5(tmp_path / "d.h5", x=np.arange(96 * 256, dtype=np.float32).reshape(96, 256))
    ref = reference([path])
    loader = Loader([path], batch_size=8, epochs=1, buffer=0,
                    reader=ReaderConfig(threads=1, read_ahead=0),
                    expert=ExpertConfig(warm=False))  # fmt: skip
    loader.set_epoch(0)
    batches = iter(loader)
    first = next(batches)
    assert np.array_equal(first["x"].numpy(), ref["x"][first["index"].numpy()])
    size = os.path.getsize(path)
    os.truncate(path, size - 48 * 1024)  # the last 48 samples
    with pytest.raises(SolarError) as err:
        for _ in batches:
            pass
    message = str(err.value)
    found = re.search(r"d\.h5: .*truncated.* key 'x' of sample (\d+) ends at byte (\d+)", message)
    assert found and int(found[1]) >= 48 and int(found[2]) > size - 48 * 1024, message
    loader.close()


def test_seeded_faults_under_mpiexec(originals, tmp_path):
    """Three ranks, each with its faults, sharing the files rank 0 may change: each rank
    serves exact bytes, or the job stops with one line (solar's abort), naming the fault;
    no rank process is left, nor (in each rank that ended its runs) a descriptor, child,
    /dev/shm name or tier file."""
    if not MPIEXEC.exists():
        pytest.skip("no mpiexec beside python")
    work = tmp_path / "mpi"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [str(HERE / "mpi" / "faults.py"), str(work), "buffered", *MPI_SEEDS]
    result = run_job(MPIEXEC, 3, argv, 240, env)  # each rank's lines apart
    outcomes = [json.loads(line) for f in sorted(work.glob("outcomes-*.jsonl"))
                for line in f.read_text().splitlines()]  # fmt: skip
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    for o in outcomes:  # every rank's run that ended: exact, or stopped in one line
        assert not any(o["leftovers"].values()), o
        assert o["stopped"] is None or "\n" not in o["stopped"], o
    exact = [o for o in outcomes if o["stopped"] is None]
    assert len(exact) >= 3 and all(o["batches"] > 0 for o in exact), outcomes
    if result.returncode != 0:  # a rank stopped: its one line, then the job's abort
        errors = re.findall(r"solar: rank \d: error: (.*)", result.stderr)
        assert errors, result.stderr[-3000:]
        for e in errors:
            assert re.search(r"Input/output error|changed since it was opened", e), e
    # No rank (nor a process it started) lives on: MPI's abort kills the ranks, which may
    # take a moment to be reaped after mpiexec returns.
    deadline = time.monotonic() + 10
    while True:
        left = subprocess.run(["pgrep", "-af", str(work)], capture_output=True, text=True)
        if left.stdout == "" or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert left.stdout == "", left.stdout


MPI_SEEDS = ["0", "2"]  # 0: every rank exact; 2: rank 0 changes the file and stops
