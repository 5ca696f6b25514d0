from __future__ import annotations

import os
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, settings

# Property tests check what the code computes, never how fast this machine is: no per-example
# deadline, and no failure when examples are drawn slowly (Hypothesis's two timing checks). A
# test's own @settings inherits these unless it sets the same field. Derandomized: CI runs the
# same examples each time (a counterexample found by exploring goes in as a test of its own,
# as test_planner_properties.py's same-step eviction).
settings.register_profile("solar", deadline=None, suppress_health_check=[HealthCheck.too_slow],
                          derandomize=True)  # fmt: skip
settings.load_profile("solar")


@pytest.fixture
def small_h5(tmp_path: Path) -> Path:
    """A contiguous file with two keys of 103 samples (a prime: no batch divides it)."""
    path = tmp_path / "small.h5"
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        f["x"] = rng.standard_normal((103, 4, 5), np.float32)
        f["y"] = rng.integers(0, 10, (103, 2)).astype(np.int64)
    return path


@pytest.fixture
def data(tmp_path: Path) -> Path:
    """Images 12x12 float32 and labels, 103 samples (the transform tests' file; a test file's
    own ``data`` fixture overrides this one)."""
    rng = np.random.default_rng(7)
    path = tmp_path / "d.h5"
    with h5py.File(path, "w") as f:
        f["img"] = rng.random((103, 12, 12), dtype=np.float32)
        f["label"] = np.arange(103, dtype=np.int64) * 3
    return path


# Tests that launch jobs of several ranks (mpiexec, torchrun, srun) run one at a time in one
# pytest worker (`make test` runs two, --dist loadgroup): two such jobs at once put 6+ ranks on
# 2 cores, and a rank's exit then races torch's store threads at interpreter shutdown. The node
# buffer's /dev/shm checks need the same (no other job making node regions alongside). This
# group is the suite's longest path, so only what launches goes in it: a test of one process in
# these files is marked one_process; elsewhere a test's name says it (not its parameters: a
# page named launchers.md launches nothing); test_launch.py reads environments, one process.
_LAUNCHING = {"test_mpi.py", "test_node_buffer.py", "test_faults.py", "test_leftovers.py",
              "test_scan.py"}  # fmt: skip


def pytest_configure(config):
    config.addinivalue_line("markers", "one_process: in a launching file, launches no ranks")
    config.stash[_STARTED] = time.time()


# Kernels numba compiled while the tests ran, in any process (xdist workers, ranks): each one
# adds to the cache an index written then. `solar warm` (run by `make`) compiles the common
# ones ahead, so each test does not compile them again; what it leaves out is listed at the
# end of the run, to extend it (solar/precompile.py) where it is worth the time.
_STARTED = pytest.StashKey[float]()


def pytest_terminal_summary(terminalreporter, config):
    if hasattr(config, "workerinput") or _STARTED not in config.stash:
        return
    where = os.environ.get("NUMBA_CACHE_DIR")
    root = Path(where) if where else Path(__file__).resolve().parents[1] / "solar"
    since = config.stash[_STARTED]
    new = sorted(p.name.split(".py")[0] for p in root.rglob("*.nbi")
                 if p.stat().st_mtime >= since)  # fmt: skip
    if new:
        terminalreporter.write_line(f"numba compiled kernels during the tests ({len(new)} "
                                    f"cache indexes written): {', '.join(new)}")  # fmt: skip


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the marks it adds
def pytest_collection_modifyitems(items):
    for item in items:
        name = item.nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
        test = getattr(item, "originalname", item.name)
        if item.get_closest_marker("one_process"):
            continue
        if name in _LAUNCHING or any(w in test for w in ("mpiexec", "either_launcher")):
            item.add_marker(pytest.mark.xdist_group("launchers"))


@pytest.fixture(scope="session")
def bench_run(tmp_path_factory):
    """``name -> (its CompletedProcess, its directory)``: a run of tests/bench_runs.py's RUNS,
    made once in this process, however many tests read it (mark them
    ``xdist_group("bench_runs")``: one worker runs them all, the run once)."""
    from bench_runs import RUNS

    made: dict[str, tuple] = {}

    def get(name: str) -> tuple:
        if name not in made:
            tmp = tmp_path_factory.mktemp(f"bench_{name}")
            made[name] = (RUNS[name](tmp), tmp)
        return made[name]

    return get
