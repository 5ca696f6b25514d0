"""Nothing outlives a job, and limits are one line (issue 33, causes 5-9): transform processes
die with their rank and hold no name in /dev/shm; a dying worker, descriptor exhaustion, a
cgroup's memory limit and a run sized beyond memory each stop with one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
from test_mpi import MPIEXEC, launch
from transform_fns import exits, kills_itself

import solar._memory
from solar import Loader, SolarError, Weighted
from solar._memory import require_memory
from solar.options import ExpertConfig
from solar.transform import Transform

MPI_SCRIPT = Path(__file__).parent / "mpi" / "orphans.py"


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("leftovers") / "d.h5"
    with h5py.File(path, "w") as f:
        f["img"] = np.arange(120 * 12, dtype=np.float32).reshape(120, 12)
        f["label"] = np.arange(120)
    return path


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie has ended (its parent has not reaped it yet)


def _left_behind(out: Path, ranks: int, wait_s: float = 5.0) -> tuple[list[dict], list, list]:
    """The ranks' reports, and after up to ``wait_s``: processes alive, /dev/shm names left."""
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]
    pids = [p for r in reports for p in [r["pid"], *r["workers"], r["tracker"]] if p]
    names = [n for r in reports for n in r["shm"]]
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and (any(map(_alive, pids)) or any(map(os.path.exists,
                                                                              names))):  # fmt: skip
        time.sleep(0.1)
    return reports, [p for p in pids if _alive(p)], [n for n in names if os.path.exists(n)]


def _cleanup(pids: list[int]) -> None:
    for p in pids:  # (what the old code left: the test's own children, ended by their pid)
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_killed_rank_leaves_no_worker_and_no_shared_memory_name(data, tmp_path, ranks):
    """SIGKILL of the process owning a transform pool (alone, and as rank 1 of mpiexec -n 2):
    within seconds none of its workers, nor its resource tracker, is alive, and no /dev/shm
    name remains; while it ran, no process of the job held a named segment or semaphore."""
    if ranks == 1:
        proc = subprocess.run([sys.executable, str(MPI_SCRIPT), str(data), str(tmp_path)],
                              capture_output=True, text=True, timeout=240)  # fmt: skip
    else:
        if not MPIEXEC.exists():
            pytest.skip("no mpiexec beside python")
        proc = launch("mpiexec", 2, MPI_SCRIPT, data, tmp_path, timeout=240)
    assert proc.returncode != 0
    reports, alive, names = _left_behind(tmp_path, ranks)
    _cleanup(alive)
    assert all(len(r["workers"]) == 1 for r in reports), (reports, proc.stderr[-2000:])
    assert alive == [] and names == []
    assert [r["shm"] for r in reports] == [[]] * ranks


@pytest.mark.one_process
def test_an_abort_ends_the_transform_processes_before_it_exits():
    """dist.abort and the torch abort path end the process with os._exit or MPI_Abort (no
    finaliser runs): the hooks they run first end the workers."""
    from solar._process import run_abort_hooks
    from solar.runtime.procs import ProcessTransforms

    pool = ProcessTransforms(1, exits, 0, (), ())
    pids = [w.pid for w in pool._workers]
    assert len(pids) == 1 and _alive(pids[0])
    run_abort_hooks()
    deadline = time.monotonic() + 5
    while _alive(pids[0]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pids[0])
    pool.close()
    run_abort_hooks()  # a closed pool's hook is gone


@pytest.mark.one_process
@pytest.mark.parametrize(("fn", "how"), [(exits, "exited with status 3"),
                                         (kills_itself, r"was killed by SIGKILL")])  # fmt: skip
def test_a_dying_worker_process_is_one_line_naming_the_step(data, fn, how):
    ld = Loader(data, batch_size=10, epochs=1, buffer=0,
                transform=Transform(fn, processes=True, workers=1),
                expert=ExpertConfig(warm=False))  # fmt: skip
    with pytest.raises(SolarError, match=f"transform processes: a worker {how}.* at step "
                       r"\d+ of epoch 0 \(samples \d+") as info:  # fmt: skip
        list(ld)
    assert "\n" not in str(info.value)
    ld.close()


@pytest.mark.one_process
def test_too_few_descriptors_for_transform_processes_is_one_line(data):
    script = textwrap.dedent(f"""
        import resource, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from transform_fns import exits
        from solar import ExpertConfig, Loader, SolarError
        from solar.transform import Transform
        if __name__ == "__main__":
            resource.setrlimit(resource.RLIMIT_NOFILE, (24, 24))
            try:
                ld = Loader({str(data)!r}, batch_size=10, epochs=1, buffer=0,
                            expert=ExpertConfig(warm=False),
                            transform=Transform(exits, processes=True, workers=1))
                list(ld)
            except SolarError as exc:
                print(exc)
                sys.exit(3)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert out.returncode == 3, out.stderr[-2000:]
    assert "too many open files" in out.stdout and "ulimit -n 24" in out.stdout


# -- memory ------------------------------------------------------------------------------------
def _cgroup(tmp_path: Path, version: int, limit: str, used: int, file_pages: int,
            path: str = "/job/step") -> tuple[str, str]:  # fmt: skip
    """A fake cgroup file system and /proc/self/cgroup for ``cgroup_room``."""
    fs, proc = tmp_path / "cgroup", tmp_path / "self_cgroup"
    if version == 2:
        d = fs.joinpath(*path.strip("/").split("/"))
        d.mkdir(parents=True)
        (d / "memory.max").write_text(limit + "\n")
        (d / "memory.current").write_text(f"{used}\n")
        half = file_pages // 2
        (d / "memory.stat").write_text(
            f"anon 5\nactive_file {half}\ninactive_file {file_pages - half}\n"
        )
        proc.write_text(f"0::{path}\n")
    else:
        d = fs.joinpath("memory", *path.strip("/").split("/"))
        d.mkdir(parents=True)
        (d / "memory.limit_in_bytes").write_text(limit + "\n")
        (d / "memory.usage_in_bytes").write_text(f"{used}\n")
        (d / "memory.stat").write_text(f"cache 9\ntotal_active_file {file_pages}\n"
                                       "total_inactive_file 0\n")  # fmt: skip
        proc.write_text(f"12:pids:/x\n4:memory:{path}\n0::/\n")
    return str(fs), str(proc)


@pytest.mark.one_process
@pytest.mark.parametrize("version", [1, 2])
def test_the_memory_check_sees_the_cgroups_room(tmp_path, monkeypatch, version):
    """Room = limit - (usage - file pages it would reclaim), the smaller of it and
    MemAvailable; no limit ("max", v1's 2^63): MemAvailable alone."""
    from solar._memory import cgroup_room

    fs, proc = _cgroup(tmp_path, version, str(2**30), 600 * 2**20, 100 * 2**20)
    assert cgroup_room(fs, proc) == 2**30 - 500 * 2**20
    monkeypatch.setattr(solar._memory, "CGROUP_FS", fs)
    monkeypatch.setattr(solar._memory, "PROC_CGROUP", proc)
    monkeypatch.setattr(solar._memory, "available_memory", lambda: 20 * 2**30)
    require_memory(500 * 2**20, "fits")
    with pytest.raises(SolarError, match=r"buffer: 0\.54 GiB exceed the 0\.51 GiB of memory left "
                                         "under the cgroup's limit"):  # fmt: skip
        require_memory(550 * 2**20, "buffer")
    # Shared by the ranks of the host: two ranks of 300 MiB each do not fit in 524 MiB.
    require_memory(300 * 2**20, "one rank")
    with pytest.raises(SolarError, match=r"0\.26 GiB of memory left under the cgroup's limit "
                                         r"\(a share of 2 ranks on this host\)"):  # fmt: skip
        require_memory(300 * 2**20, "batches", ranks=2)
    unlimited = "max" if version == 2 else "9223372036854771712"
    fs, proc = _cgroup(tmp_path / "u", version, unlimited, 600 * 2**20, 0)
    assert cgroup_room(fs, proc) is None
    assert cgroup_room(fs, str(tmp_path / "missing")) is None


@pytest.mark.one_process
def test_a_buffer_beyond_the_cgroups_limit_is_refused(data, tmp_path, monkeypatch):
    """The issue's case (buffer="2GiB" in a 1 GiB cgroup, the host with more free), scaled
    down to this dataset: a cgroup of 4 KiB."""
    fs, proc = _cgroup(tmp_path, 2, "4096", 0, 0)
    monkeypatch.setattr(solar._memory, "CGROUP_FS", fs)
    monkeypatch.setattr(solar._memory, "PROC_CGROUP", proc)
    monkeypatch.setattr(solar._memory, "available_memory", lambda: 20 * 2**30)
    with pytest.raises(SolarError, match=r"buffer: .* exceed the 0\.00 GiB of memory left under "
                                         "the cgroup's limit"):  # fmt: skip
        Loader(data, batch_size=10, epochs=1, buffer="100%", expert=ExpertConfig(warm=False))


@pytest.mark.one_process
def test_a_run_or_weights_sized_beyond_memory_are_refused_before_allocating(data, monkeypatch):
    with pytest.raises(
        SolarError, match=r"sampler: an epoch of 1000000000000 draws: .* GiB exceed"
    ) as e:
        Loader(data, batch_size=10, epochs=1, buffer=10,
               sampler=Weighted(np.ones(120), num_samples=10**12),
               expert=ExpertConfig(warm=False))  # fmt: skip
    assert "\n" not in str(e.value)
    monkeypatch.setattr(solar._memory, "available_memory", lambda: 10**6)
    with pytest.raises(SolarError, match=r"weights: 100000 weights: .* GiB exceed"):
        Weighted(np.ones(100_000))
