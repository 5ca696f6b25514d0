"""The node buffer under mpiexec: byte-identical rows on one host and on 2 × 2 emulated hosts
(and after an exact resume), and a killed rank that ends the job and leaves nothing in
/dev/shm; the same through ``Loader(share="node")``, and what it refuses."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import write_h5
from ranks_apart import MPIEXEC, TORCHRUN, run_job

from solar.errors import SolarError
from solar.host.memfd import fits
from solar.host.region import PREFIX, NodeRegion
from solar.options import ExpertConfig, MemoryConfig, PlanningConfig

SHM_DIR = "/dev/shm"  # where no node region or tier may leave a name

# The node buffer's /dev/shm names are watched here: no other test making them runs alongside
# (make test runs two workers; tests/test_bench.py's --share node run is in the group).
pytestmark = pytest.mark.xdist_group("launchers")

HERE = Path(__file__).parent / "mpi"
FOREIGN_PREFIXES = ("SLURM_", "PMI_", "OMPI_", "TORCHELASTIC_", "MPI_")


def _mpiexec(n: int, *args, timeout: float, script: str = "node_buffer.py",
             launcher: Path = MPIEXEC):  # fmt: skip
    """``script`` on ``n`` ranks under mpiexec (or ``launcher=TORCHRUN``)."""
    if not launcher.exists():
        pytest.skip(f"no {launcher.name} beside python")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(FOREIGN_PREFIXES) and k != "SOLAR_HOSTS"}  # fmt: skip
    return run_job(launcher, n, [str(HERE / script), *map(str, args)], timeout, env)


def _left_by(result) -> list[str]:
    """What the job's processes left: any of them still running, and any /dev/shm name of
    solar's carrying one of their pids (its ranks print them; a node region is a nameless
    memfd whose memory goes with its last process, so there must be neither). Other jobs'
    names, e.g. other test runs', carry other pids and are not counted."""
    pids = {line.split()[1] for line in result.stdout.splitlines() if line.startswith("pid ")}
    assert pids, result.stdout[-2000:]
    # (mpiexec may return while an aborted job's ranks are still being killed: a moment.)
    deadline = time.monotonic() + 10
    while (alive := [f"pid {p}" for p in pids if _running(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive + [p for p in os.listdir(SHM_DIR) if p.startswith(PREFIX) and
                    any(q in p for q in pids)]  # fmt: skip


def _running(pid: str) -> bool:
    """Whether process ``pid`` runs (a zombie, dead and waiting for its parent, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    x = np.random.default_rng(0).integers(0, 2**31, (600, 24), dtype=np.int64)
    return write_h5(tmp_path_factory.mktemp("node") / "d.h5", x=x)


@pytest.fixture(scope="module")
def buffer_job(data):
    """node_buffer.py's one job: whole runs on one host and on 2 × 2, then rank 1 killed
    (starting 4 ranks costs more than a case)."""
    return _mpiexec(4, data, "run", "1x4", "2x2", "kill", "2x2", timeout=300)


def _ran(result, ranks: int = 4) -> None:
    """Every rank passed the checks of the job's runs (a failed one aborts the job first), the
    case that ended the job came after them."""
    for r in range(ranks):
        assert f"rank {r}: runs done" in result.stdout, result.stderr[-3000:]


def test_node_buffer_serves_h5py_bytes_on_one_host_and_on_two(buffer_job):
    result = buffer_job
    _ran(result)
    assert "node buffer 1x4: " in result.stdout and "node buffer 2x2: " in result.stdout
    assert _left_by(result) == []


def test_a_killed_rank_ends_the_job_and_leaves_no_segment(buffer_job):
    result = buffer_job
    _ran(result)  # every rank reached the kill
    assert result.returncode != 0
    assert "unreachable" not in result.stderr
    assert _left_by(result) == []


def test_a_region_too_large_is_refused_in_one_line():
    assert fits(1, "node buffer") == ""
    msg = fits(2**62, "node buffer")
    assert msg.startswith("node buffer: ") and "\n" not in msg
    before = set(os.listdir(SHM_DIR))
    with pytest.raises(SolarError, match=r"node buffer: .* exceed"):
        NodeRegion(2**62, None, 0, 0)
    r = NodeRegion(3 * 4096, None, 0, 0)
    a = r.carve((10,), np.int64)
    a[:] = 7
    at = a.ctypes.data - r.array.ctypes.data  # after the host barrier's page
    assert at == 4096 and r.array[at : at + 80].view(np.int64).tolist() == [7] * 10
    # A memfd: mapped, never named in /dev/shm (nothing a killed job could leave there).
    with open("/proc/self/maps") as f:
        assert any(f"/memfd:{PREFIX}region" in line for line in f)
    assert not {p for p in set(os.listdir(SHM_DIR)) - before if p.startswith(PREFIX)}


# -- Loader(share="node") ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    from solar.graph import generate_graph

    path = tmp_path_factory.mktemp("nodegraph") / "g.h5"
    generate_graph(path, 997, 6.0, 5, seed=3, train_fraction=0.3)
    return path


@pytest.fixture(scope="module")
def loader_job(data, graph):
    """node_loader.py's mpiexec job of whole runs (1x4, 2x2, hosts of 3 and 1), then rank 1
    killed on 2 × 2 with a node tier."""
    return _mpiexec(4, data, graph, "run", "1x4", "2x2", "3,1", "kill", "2x2", timeout=360,
                    script="node_loader.py")  # fmt: skip


@pytest.fixture(scope="module")
def torchrun_job(data, graph):
    """node_loader.py under torchrun on hosts of 3 and 1: whole epochs, then rank 1 serving
    another epoch than its host's."""
    return _mpiexec(4, data, graph, "serve", "3,1", "mismatch", "3,1", timeout=270,
                    script="node_loader.py", launcher=TORCHRUN)  # fmt: skip


def test_a_node_loader_serves_each_rank_its_batches_as_planned(loader_job):
    result = loader_job
    _ran(result)
    assert "node loader 1x4: " in result.stdout and "node loader 2x2: " in result.stdout
    assert "node loader 3,1: " in result.stdout
    assert _left_by(result) == []


def test_hosts_of_different_sizes_run_the_host_buffer_under_torchrun(torchrun_job):
    """Hosts of 3 ranks and 1 under torch.distributed: each host a gloo group of its own
    (solar/host/place.py), whole epochs of each rank's batches with h5py's bytes, read as
    the hosts' plans say."""
    result = torchrun_job
    _ran(result)
    assert "node loader 3,1: " in result.stdout
    assert _left_by(result) == []


def test_a_node_loader_killed_ends_the_job_and_leaves_no_segment(data, loader_job):
    result = loader_job
    _ran(result)  # every rank reached the kill
    assert result.returncode != 0 and "unreachable" not in result.stderr
    assert _left_by(result) == []
    assert os.listdir(data.parent / "killtier") == []  # nor the node's tier file


def test_a_rank_leaving_an_epoch_early_ends_the_job_in_one_line(data, graph):
    """Rank 1 breaks out of epoch 0 at step 2 and starts epoch 1: its host's barriers fail
    (no rank waits forever for a step the others will not run), naming both ranks' steps.
    (One host of 2 ranks: the host barrier's check is the same on more.)"""
    result = _mpiexec(2, data, graph, "break", "1x2", timeout=90, script="node_loader.py")
    assert result.returncode != 0 and "unreachable" not in result.stderr
    line = next((x for x in result.stderr.splitlines() if "host barrier: " in x), "")
    assert "error: host barrier: rank " in line and " but rank " in line, result.stderr[-3000:]
    assert "epoch 1 step 0 (a refill's start)" in line and "epoch 0 step 3" in line, line
    assert _left_by(result) == []


def test_a_rank_raising_inside_its_loader_ends_the_job_in_one_line(data, graph):
    """Rank 1 raises inside ``with Loader(...)`` while the others wait in a collective: its
    close is its own (not the host's collective stop, which would wait for ranks that never
    close): the job ends promptly with its one line. (The timeout is a hang guard.)"""
    result = _mpiexec(2, data, graph, "raise", "1x2", timeout=90, script="node_loader.py")
    assert result.returncode != 0 and "unreachable" not in result.stderr
    lines = [x for x in result.stderr.splitlines() if "boom from rank 1" in x]
    assert lines == ["solar: rank 1: error: boom from rank 1's training step"], \
        result.stderr[-3000:]  # fmt: skip
    assert "Traceback" not in result.stderr
    assert _left_by(result) == []


@pytest.mark.parametrize("launcher, grouping", [(MPIEXEC, "1x2"), (TORCHRUN, "3,1")])
def test_a_rank_serving_another_epoch_than_its_host_is_named_at_once(
    request, data, graph, launcher, grouping
):
    """Rank 1 calls set_epoch(2), its host's other ranks set_epoch(0): it waits for the plan
    of a step its host's ranks do not run (and they for it): named in one line at once on
    both sides (the host barrier's check), not after the 30 minutes of a wait's timeout.
    (The timeout is a hang guard.) Under mpiexec one host of 2 ranks; under torchrun hosts of
    3 and 1, after the whole epochs of the job it shares."""
    if launcher == TORCHRUN:
        result = request.getfixturevalue("torchrun_job")
        _ran(result)
    else:
        result = _mpiexec(2, data, graph, "mismatch", grouping, timeout=90,
                          script="node_loader.py")  # fmt: skip
    assert result.returncode != 0 and "unreachable" not in result.stderr
    line = next((x for x in result.stderr.splitlines() if "host barrier: " in x), "")
    assert "error: host barrier: rank " in line, result.stderr[-3000:]
    assert "its plan of epoch 2 step 0" in line and "epoch 0 step 0" in line, line
    assert "rank 1 " in line
    assert _left_by(result) == []


def test_ranks_given_different_arguments_decide_alike_or_are_refused_in_one_line(data, graph):
    """On hosts of 2 and 1 ranks, snapshots given to rank 0 alone: every rank falls back to
    a buffer of its own (rank 0 alone did, the others waited in a collective). Then rank 1
    asks share="rank", the others "node": every rank stops at construction (no rank waits in
    a host collective the other never joins), leaving nothing behind."""
    result = _mpiexec(3, data, graph, "disagree", "2,1", timeout=60, script="node_loader.py")
    assert result.returncode != 0 and "unreachable" not in result.stderr
    assert "error: ranks disagree on share: ranks [1] differ from rank 0" in result.stderr, \
        result.stderr[-3000:]  # fmt: skip
    assert _left_by(result) == []


@pytest.mark.parametrize(
    "kwargs, word",
    [
        ({"share": "host"}, "share must be"),
        ({"share": "node", "plan": "x.h5"}, "plan: a per-rank plan"),
        ({"share": "node", "transform": "held"}, "transform: "),
    ],
)
def test_a_node_loader_refuses_what_it_does_not_run_in_one_line(data, tmp_path, kwargs, word):
    from solar import Loader, Transform, Weighted
    from solar.schedule.plans.plan import plan_to_file

    kwargs = {k: str(tmp_path) if v == "TMP" else v for k, v in kwargs.items()}
    sampler = Weighted(np.ones(600), affinity=False)
    if kwargs.get("share") == "node":
        kwargs.setdefault("sampler", sampler)
    if "plan" in kwargs:
        ld = Loader(data, ["x"], batch_size=12, epochs=1, buffer=20, sampler=sampler,
                    expert=ExpertConfig(warm=False))  # fmt: skip
        kwargs["plan"] = plan_to_file(ld.spec, tmp_path / "plan.h5")
        ld.close()
    if kwargs.get("transform") == "held":
        kwargs["transform"] = Transform(lambda s, rng: s, deterministic=True)
    share, planning = kwargs.pop("share"), PlanningConfig(plan=kwargs.pop("plan", None))
    with pytest.raises(SolarError) as err:  # (an unknown share: where its record is made)
        Loader(data, ["x"], batch_size=12, epochs=1, buffer=20, **kwargs,
               memory=MemoryConfig(share=share), planning=planning,
               expert=ExpertConfig(warm=False))  # fmt: skip
    msg = str(err.value)
    assert "\n" not in msg and word in msg, msg


def test_a_closed_node_loader_refuses_to_serve_in_one_line(data):
    """Its host's buffer and plan exchange are released at close: serving again would rebuild
    them, a collective of its host's ranks that a rank iterating alone waits in forever (the
    others gone on to their own collectives). Refused instead: the job ends."""
    from solar import Loader, Weighted

    sampler = Weighted(np.ones(600), affinity=False)
    ld = Loader(data, ["x"], batch_size=12, epochs=2, buffer=20, sampler=sampler,
                memory=MemoryConfig(share="node"), expert=ExpertConfig(warm=False))  # fmt: skip
    assert ld.share == "node" and len(list(ld)) == ld.run.steps_per_epoch
    ld.set_epoch(1)
    it = iter(ld)
    next(it)
    ld.close()
    # Every way back to its buffer: an iterator made before close, a new one, its buffer.
    for serve in (lambda: next(it), lambda: next(iter(ld)), lambda: ld.buffer):
        with pytest.raises(SolarError, match=r'share="node": this Loader is closed') as err:
            serve()
        assert "\n" not in str(err.value)
    ld.close()  # (twice: nothing more)


def test_shared_memory_is_opened_by_its_inode_and_cannot_shrink_under_its_mappings():
    from solar.host import memfd as _memfd

    fd = _memfd.create(PREFIX + "test", 8192, reserve=True)
    try:
        _memfd.seal(fd, _memfd.SIZE_SEALS)
        peer, err = _memfd.open_peer(_memfd.ident(fd), 8192, os.O_RDWR, "node buffer")
        assert err == "" and _memfd.sealed(peer, _memfd.SIZE_SEALS)
        with pytest.raises(PermissionError):  # a mapping past a shrunk end would SIGBUS
            os.ftruncate(peer, 4096)
        os.close(peer)
        pid, n, ino = _memfd.ident(fd)
        assert _memfd.open_peer((pid, n, ino + 1), 8192, os.O_RDWR, "node buffer")[1] == (
            f"node buffer: /proc/{pid}/fd/{n} is no longer the file its creator shared"
        )
        assert "cannot open" in _memfd.open_peer((pid, 10**6, ino), 1, os.O_RDWR, "x")[1]
    finally:
        os.close(fd)
