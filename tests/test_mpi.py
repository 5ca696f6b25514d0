"""The scripts in tests/mpi run unchanged under mpiexec (the mpich wheel's), torchrun and srun.

srun is simulated: plain processes with the variables srun sets (SLURM_PROCID, SLURM_NTASKS,
SLURM_LOCALID, SLURM_JOB_ID, SLURM_STEP_ID, SLURM_STEP_NODELIST).
"""

from __future__ import annotations

import json
import os
import random
import re
import runpy
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from ranks_apart import MPIEXEC, TORCHRUN, Job, joined, run_job

from solar.launch import srun_port

HERE = Path(__file__).parent / "mpi"
EXAMPLE = HERE.parent.parent / "examples" / "train_surrogate.py"
N = 103
# "Promptly", for a job one of whose ranks failed: it ends within this, or the test fails (the
# launch raises TimeoutExpired). A hang guard, not a speed: without solar's abort the other
# ranks would wait in a collective (whose timeout the failing scripts set to 900 s) or in
# fail.py's 600 s sleep; with it, the job ends seconds after the failure (1.6-1.8 s here,
# README). Generous, so that a loaded machine starting three Pythons with torch cannot fail it.
HANG_GUARD = 240
# Variables of an outer launcher that would mislead the ones started here.
FOREIGN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SOLAR_LAUNCHER")
FOREIGN_PREFIXES = ("SLURM_", "PMI_", "OMPI_", "TORCHELASTIC_")


def launch(launcher: str, n: int, script: str | Path, *args, timeout: float = 300) -> Job:
    """Run ``script`` (in tests/mpi, or a path) on ``n`` ranks under ``launcher``; each rank's
    output is read apart (tests/ranks_apart.py)."""
    argv = [str(HERE / script if isinstance(script, str) else script), *map(str, args)]
    env = {k: v for k, v in os.environ.items()
           if k not in FOREIGN and not k.startswith(FOREIGN_PREFIXES)}  # fmt: skip
    if launcher == "srun":
        return simulated_srun(n, argv, env, timeout)
    exe = MPIEXEC if launcher == "mpiexec" else TORCHRUN
    if not exe.exists():
        pytest.skip(f"no {exe.name} beside python")
    return run_job(exe, n, argv, timeout, env)


def simulated_srun(n: int, argv: list[str], env: dict, timeout: float) -> Job:
    """Start ``n`` processes as ``srun -n n`` would on one node: one job step, tasks 0..n-1."""
    job = free_job_id()
    with tempfile.TemporaryDirectory() as tmp:
        procs, outs = [], []
        for r in range(n):
            out, err = open(f"{tmp}/{r}.out", "w+"), open(f"{tmp}/{r}.err", "w+")
            outs.append((out, err))
            task = {"SLURM_PROCID": str(r), "SLURM_NTASKS": str(n), "SLURM_LOCALID": str(r),
                    "SLURM_JOB_ID": str(job), "SLURM_STEP_ID": "0",
                    "SLURM_STEP_NODELIST": "localhost", "OMP_NUM_THREADS": "1"}  # fmt: skip
            procs.append(subprocess.Popen([sys.executable, *argv], stdout=out, stderr=err,
                                          env={**env, **task}, text=True))  # fmt: skip
        deadline = time.monotonic() + timeout
        try:
            codes = [p.wait(max(deadline - time.monotonic(), 0)) for p in procs]
        finally:
            for p in procs:
                p.kill()
        texts = []
        for out, err in outs:
            out.seek(0)
            err.seek(0)
            texts.append((out.read(), err.read()))
            out.close()
            err.close()
    return joined(argv, next((c for c in codes if c != 0), 0), texts)


def free_job_id() -> int:
    """A job ID whose derived rendezvous port is free here now (other test runs share the host)."""
    for _ in range(100):
        job = random.randrange(1, 10**7)
        with socket.socket() as s:
            try:
                s.bind(("", srun_port(job, 0)))
            except OSError:
                continue
        return job
    raise RuntimeError("no free port for a simulated srun job")


def write(path: Path, lo: int, hi: int, one_row: bool = False, **layout) -> Path:
    """``one_row``: one sample per chunk (solar's fast path for gzip and zstd)."""
    rng = np.random.default_rng(lo)
    with h5py.File(path, "w") as f:
        for name, shape in (("img", (5, 6)), ("lab", (2,))):
            options = dict(layout, chunks=(1, *shape)) if one_row else layout
            f.create_dataset(name, data=rng.standard_normal((hi - lo, *shape)), **options)
    return path


SERVE = [
    ("mpiexec", 2, 0.25, "one file"), ("mpiexec", 3, 0.0, "three files"),
    ("mpiexec", 3, 0.5, "chunked"), ("mpiexec", 4, 0.25, "one file"),
    ("torchrun", 3, 0.25, "three files"), ("srun", 2, 0.5, "one file"),
    ("mpiexec", 3, 0.25, "one file, tier"), ("mpiexec", 3, 0.25, "chunked, tier"),
    ("mpiexec", 3, 0.25, "chunked, one sample a chunk"), ("mpiexec", 3, 0.25, "one file, short"),
]  # fmt: skip
WEIGHTED = [(2, "affinity", False, False), (3, "split", True, False), (3, "affinity", True, True)]
EQUAL = [
    ("mpiexec", 2, 0.25, "one file"), ("mpiexec", 3, 0.5, "three files"),
    ("mpiexec", 3, 0.25, "one file, tier"), ("mpiexec", 3, 0.25, "one file, plan file"),
    ("torchrun", 3, 0.5, "one file, tier"), ("mpiexec", 3, 0.25, "one file, transform"),
    ("mpiexec", 2, 0.25, "one file, short"),
]  # fmt: skip


def serve_args(tmp_path: Path, launcher: str, ranks: int, slack: float, layout: str) -> list:
    """coverage.py's arguments for a case of SERVE (its files written in ``tmp_path``)."""
    if layout == "three files":
        data = [
            write(tmp_path / f"{i}.h5", lo, hi)
            for i, (lo, hi) in enumerate([(0, 40), (40, 77), (77, N)])
        ]
    elif layout.startswith("chunked"):
        one_row = layout.endswith("one sample a chunk")
        data = [write(tmp_path / "d.h5", 0, N, one_row, chunks=True, compression="gzip",
                      shuffle=True)]  # fmt: skip
    else:
        data = [write(tmp_path / "d.h5", 0, N)]
    tier = []
    if layout.endswith("tier"):
        (tmp_path / "nvme").mkdir()
        tier = ["--tier", tmp_path / "nvme", "--tier-size", 20]
    return [*data, "--slack", slack, *tier, *_short(layout, ranks)]


def solar_plan(*args) -> None:
    """``solar plan ARGS``, in this process: it plans alone (no communicator, nothing
    initialised), and an interpreter start costs more than the plan."""
    from click.testing import CliRunner

    from solar.cli import cli

    made = CliRunner().invoke(cli, ["plan", *map(str, args)])
    assert made.exit_code == 0, (made.output, made.exception)


def weighted_args(tmp_path: Path, ranks: int, mode: str, tier: bool, plan: bool) -> list:
    """coverage.py's arguments for a case of WEIGHTED (under mpiexec)."""
    data = write(tmp_path / "d.h5", 0, N)
    args = ["--weighted", mode, "--slack", 0.25]
    if tier:
        (tmp_path / "nvme").mkdir()
        # A rank's tier: a node buffer's RAM (share="auto" with split draws) would hold all
        # these skewed draws reuse (tests/test_node_tier.py runs the node's tier).
        args += ["--tier", tmp_path / "nvme", "--tier-size", 20, "--share", "rank"]
    if plan:
        w = (1.0 + np.arange(N)) ** -1.1
        w[::17] = 0
        np.save(tmp_path / "w.npy", w)
        solar_plan(data, "-P", ranks, "-B", 4, "-E", 3, "-C", 12, "-D", 20, "--sampler",
                   "weighted", "--weights", tmp_path / "w.npy", "-o",
                   tmp_path / "p.h5")  # fmt: skip
        args += ["--plan", tmp_path / "p.h5"]
    return [data, *args]


def equal_args(tmp_path: Path, launcher: str, ranks: int, slack: float, layout: str) -> list:
    """coverage.py's arguments for a case of EQUAL."""
    if layout.startswith("three files"):
        data = [write(tmp_path / f"{i}.h5", lo, hi)
                for i, (lo, hi) in enumerate([(0, 40), (40, 77), (77, N)])]  # fmt: skip
    else:
        data = [write(tmp_path / "d.h5", 0, N)]
    args = ["--slack", slack, "--equal-batches"]
    if layout.endswith("tier"):
        (tmp_path / "nvme").mkdir()
        args += ["--tier", tmp_path / "nvme", "--tier-size", 20]
    if layout.endswith("transform"):  # rows move transformed, their draws their own
        args += ["--transform"]
    if layout.endswith("plan file"):
        solar_plan(*data, "-P", ranks, "-B", 4, "-E", 3, "-C", 12, "--slack", slack,
                   "--equal-batches", "-o", tmp_path / "p.h5")  # fmt: skip
        args += ["--plan", tmp_path / "p.h5"]
    return [*data, *args, *_short(layout, ranks)]


def _short(layout: str, ranks: int) -> list:
    """A short epoch: a global batch beyond the N samples, one step split evenly (issue 46)."""
    return ["--batch-size", N // ranks + 5] if layout.endswith("short") else []


# Every coverage.py case: (test, launcher, ranks, the case's parameters, its arguments' maker).
CASES = (
    [("serve", c[0], c[1], c, serve_args) for c in SERVE]
    + [("weighted", "mpiexec", c[0], c, weighted_args) for c in WEIGHTED]
    + [("equal", c[0], c[1], c, equal_args) for c in EQUAL]
)


@pytest.fixture(scope="module")
def coverage_job(tmp_path_factory):
    """``(test, case) -> (the job's CompletedProcess, the case's prefix "case I: ")``. The cases
    of one launcher and size run in one job, once, one after the other (coverage.py --cases):
    starting the ranks (torch, solar) costs more than a case does."""
    jobs: dict[tuple[str, int], tuple] = {}

    def get(test: str, case: tuple) -> tuple[subprocess.CompletedProcess, str]:
        launcher, ranks = next((c[1], c[2]) for c in CASES if c[0] == test and c[3] == case)
        if (launcher, ranks) not in jobs:
            mine = [c for c in CASES if c[1:3] == (launcher, ranks)]
            try:
                argvs = [[str(a) for a in make(tmp_path_factory.mktemp(name), *params)]
                         for name, _, _, params, make in mine]  # fmt: skip
                cases = tmp_path_factory.mktemp("cases") / "cases.json"
                cases.write_text(json.dumps(argvs))
                result: Any = launch(launcher, ranks, "coverage.py", "--cases", cases)
            except Exception as exc:  # (kept: the job's other tests fail alike, not rerun it)
                result = exc
            jobs[launcher, ranks] = (result, [(c[0], c[3]) for c in mine])
        result, order = jobs[launcher, ranks]
        if isinstance(result, Exception):
            raise result
        return result, f"case {order.index((test, case))}: "

    return get


def check_case(result: subprocess.CompletedProcess, tag: str, ranks: int) -> None:
    """The case's every rank said ok; and if it was the last case its job ran, the job ended
    well (a later case's failure is that case's, not this one's)."""
    for r in range(ranks):
        assert f"{tag}rank {r} of {ranks}: ok" in result.stdout, (
            result.stdout[-3000:] + result.stderr[-3000:]
        )
    ran = [int(i) for i in re.findall(r"^case (\d+): ", result.stdout, re.M)]
    if int(tag.split()[1].rstrip(":")) == max(ran):
        assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.parametrize(("launcher", "ranks", "slack", "layout"), SERVE)
def test_ranks_serve_every_sample_once_with_h5py_bytes(coverage_job, launcher, ranks, slack,
                                                       layout):  # fmt: skip
    """Whole runs, a mid-epoch resume, each sample once per epoch; with a second tier too."""
    result, tag = coverage_job("serve", (launcher, ranks, slack, layout))
    # One job of `ranks` ranks, not `ranks` jobs of one.
    check_case(result, tag, ranks)
    for r in range(ranks):
        if layout.startswith("chunked"):  # decoded chunk by chunk by solar, not through h5py
            out = result.ranks[r][0]
            assert re.search(rf"^{tag}rank {r} of {ranks}: read paths chunks$", out, re.M), out


@pytest.mark.parametrize(("ranks", "mode", "tier", "plan"), WEIGHTED)
def test_a_weighted_sampler_serves_every_draw_once(coverage_job, ranks, mode, tier, plan):
    """Weighted draws under mpiexec: h5py's bytes, each draw of every global batch once, an
    exact resume; with a tier; from a `solar plan` file proven against the sampler."""
    result, tag = coverage_job("weighted", (ranks, mode, tier, plan))
    check_case(result, tag, ranks)


@pytest.mark.parametrize(("launcher", "ranks", "slack", "layout"), EQUAL)
def test_equal_batches_deliver_every_sample_once_with_h5py_bytes(
    coverage_job, launcher, ranks, slack, layout
):
    """Whole runs with equal batches: every batch its rank's share, the samples the plan's
    exchange delivers, h5py's bytes, each sample once per epoch, rows moved as planned, an
    exact resume; N = 103 does not divide; with a tier; from a `solar plan` file."""
    result, tag = coverage_job("equal", (launcher, ranks, slack, layout))
    check_case(result, tag, ranks)


def test_a_compiled_model_on_equal_batches_compiles_once_with_exact_gradients(gradients_job):
    """torch.compile (dynamo, a backend counting the graphs it is handed; inductor itself in
    bench/compile_bench.py) under DDP for 2 epochs: no compilation after the first step, and
    each step's gradients equal one process's over the same global batch, the loss a plain
    mean (no re-weighting). (compiled.py, in the job of gradients.py's checks on 2 ranks.)"""
    result, _ = gradients_job("mpiexec", 2)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("none after the first step, gradients equal") == 2, result.stdout


@pytest.mark.parametrize("launcher", ["mpiexec", "torchrun"])
def test_a_rank_failing_before_its_exchange_ends_the_job_promptly(tmp_path, launcher):
    """With equal batches the others wait for rank 1's rows: its failed read ends them all."""
    data = write(tmp_path / "d.h5", 0, N)
    result = launch(launcher, 2, "equal_fail.py", data, timeout=HANG_GUARD)
    assert result.returncode != 0
    assert "boom from rank 1's read" in result.stderr, result.stderr[-3000:]
    assert "solar: rank 1" in result.stderr
    assert "unreachable" not in result.stderr


@pytest.mark.parametrize("launcher", ["mpiexec", "torchrun"])
def test_a_transform_failing_on_one_rank_ends_the_job_promptly(tmp_path, launcher):
    """The others wait in a training step's collective: rank 1's failed transform, named by
    sample and epoch, ends them all."""
    data = write(tmp_path / "d.h5", 0, N)
    result = launch(launcher, 2, "transform_fail.py", data, timeout=HANG_GUARD)
    assert result.returncode != 0
    assert re.search(r"transform of sample \d+ \(epoch \d\) failed: ValueError: boom from "
                     "rank 1's transform", result.stderr), result.stderr[-3000:]  # fmt: skip
    assert "unreachable" not in result.stderr


# gradients.py's jobs, (launcher, ranks) -> the modes it checks, one after the other in one job
# (a launch costs more than a check); both DDP tests read each, the compiled model's test
# the first ("compiled": tests/mpi/compiled.py, each rank's line saying "gradients equal" too).
GRADIENT_JOBS = {("mpiexec", 2): ("variable", "default", "compiled"),
                 ("torchrun", 3): ("variable", "default")}  # fmt: skip


@pytest.fixture(scope="module")
def gradients_job(tmp_path_factory):
    """``(launcher, ranks) -> (CompletedProcess, modes)`` of gradients.py checking the modes of
    GRADIENT_JOBS in one job (N = 103 for "variable" and "compiled", 102 for "default"): a
    mode failing fails every test that shares the job."""
    jobs: dict[tuple, subprocess.CompletedProcess] = {}

    def get(launcher: str, ranks: int) -> tuple[subprocess.CompletedProcess, tuple[str, ...]]:
        modes = GRADIENT_JOBS[launcher, ranks]
        if (launcher, ranks) not in jobs:
            tmp = tmp_path_factory.mktemp("gradients")
            args = []
            for mode in modes:
                n = 102 if mode == "default" else N
                args += [write(tmp / f"{mode}.h5", 0, n), mode]
            jobs[launcher, ranks] = launch(launcher, ranks, "gradients.py", *args)
        return jobs[launcher, ranks], modes

    return get


@pytest.mark.parametrize(("launcher", "ranks"), list(GRADIENT_JOBS),
                         ids=[f"{la}-{r}" for la, r in GRADIENT_JOBS])  # fmt: skip
def test_ddp_gradients_equal_a_single_process_step(gradients_job, launcher, ranks):
    result, modes = gradients_job(launcher, ranks)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("gradients equal") == ranks * len(modes)
    assert re.search(r"rank 0: gradients equal, \d+ steps, [1-9]\d* uneven", result.stdout)


@pytest.mark.parametrize(("launcher", "ranks"), list(GRADIENT_JOBS),
                         ids=[f"{la}-{r}" for la, r in GRADIENT_JOBS])  # fmt: skip
def test_ddp_with_the_default_loader_and_a_mean_loss_equals_one_process(gradients_job, launcher,
                                                                        ranks):  # fmt: skip
    """Equal batches by default: a ported loop's ``loss.mean()`` gives the global mean's
    gradient (N = 102: not a multiple of the global batch; its last step splits evenly)."""
    result, modes = gradients_job(launcher, ranks)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("gradients equal") == ranks * len(modes)
    assert re.search(r"rank 0: gradients equal, \d+ steps, 0 uneven", result.stdout)


@pytest.mark.parametrize(("launcher", "wait"), [
    ("mpiexec", "allreduce"), ("torchrun", "allreduce"),
    # No launcher here to stop the others, nor a collective to notice: only solar's abort can.
    ("srun", "sleep"),
])  # fmt: skip
def test_a_failing_rank_ends_the_job_promptly(launcher, wait):
    result = launch(launcher, 3, "fail.py", wait, timeout=HANG_GUARD)
    assert result.returncode != 0
    assert "boom from rank 1" in result.stderr
    assert "solar: rank 1 failed" in result.stderr
    assert "unreachable" not in result.stderr
    if launcher != "mpiexec":  # MPI_Abort ends the others without a word
        for r in (0, 2):
            assert f"solar: rank {r}: ending: rank 1 failed" in result.stderr, result.stderr


@pytest.mark.one_process
def test_training_example_help_lists_its_options(monkeypatch, capsys):
    """``python EXAMPLE --help``, in this process: its options are parsed before anything is
    made or initialised (no interpreter start, no import of torch again for it)."""
    monkeypatch.setattr(sys, "argv", [str(EXAMPLE), "--help"])
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(str(EXAMPLE), run_name="__main__")
    out, err = capsys.readouterr()
    assert exited.value.code == 0, err[-3000:]
    for option in ("--data", "--buffer", "% of data", "--resume", "--keep-checkpoints"):
        assert option in out


def test_training_example_resumes_exactly_under_either_launcher(tmp_path):
    """A run, and a run resumed from the mid-epoch checkpoint it kept, end with the same
    parameters, whichever launcher runs each part."""
    data = tmp_path / "p.h5"
    common = ["--data", data, "--samples", 96, "--epochs", 2, "--batch-size", 8,
              "--buffer", "30%", "--slack", 0.5]  # fmt: skip

    def train(launcher: str, *extra) -> str:
        result = launch(launcher, 2, EXAMPLE, *common, *extra)
        assert result.returncode == 0, result.stderr[-3000:]
        kind = {"mpiexec": "mpi", "torchrun": "torchrun"}[launcher]
        assert f"training on 2 ranks ({kind})" in result.stdout
        return result.stdout

    # The whole run keeps its mid-epoch checkpoint (step 9 of 2 epochs of 6); a run resumed
    # from it under the other launcher must end where the whole run ended.
    whole = train("mpiexec", "--checkpoint", tmp_path / "a.pt", "--checkpoint-every", 9,
                  "--keep-checkpoints")  # fmt: skip
    assert whole.count("epoch ") == 2 and "hit rate" in whole
    resumed = train("torchrun", "--checkpoint", tmp_path / "a.pt.step9", "--resume")
    assert "resumed from" in resumed and "at global step 9" in resumed
    checksum = [line for line in whole.splitlines() if "checksum" in line]
    assert checksum and checksum == [line for line in resumed.splitlines() if "checksum" in line]


# default_world.py's jobs: (launcher, ranks) -> its modes, one after the other in one job (a
# launch costs more than a mode): a refusal with nothing initialised, then the same job's
# ranks initialised, where both tests ask for the same launcher and size.
WORLD_MODES = {("torchrun", 2): ("none", "torch"), ("torchrun", 3): ("init",),
               ("mpiexec", 3): ("none",), ("srun", 2): ("none", "init")}  # fmt: skip


@pytest.fixture(scope="module")
def world_job(tmp_path_factory):
    """``(launcher, ranks, mode) -> (job, [rank r's stdout of that mode])``: default_world.py
    run once per launcher and size, over N rows (N = 103: no size divides it)."""
    jobs: dict[tuple[str, int], Job] = {}

    def get(launcher: str, ranks: int, mode: str) -> tuple[Job, list[str]]:
        modes = WORLD_MODES[launcher, ranks]
        if (launcher, ranks) not in jobs:
            path = tmp_path_factory.mktemp("world") / "d.h5"
            with h5py.File(path, "w") as f:
                f["x"] = np.random.default_rng(0).standard_normal((N, 3))
            jobs[launcher, ranks] = launch(launcher, ranks, "default_world.py", path,
                                           ",".join(modes))  # fmt: skip
        job = jobs[launcher, ranks]
        outs = []
        for out, _ in job.ranks:  # each rank's own output, then the part of it of `mode`
            parts = re.split(r"^== mode (\w+) ==\n", out, flags=re.M)
            assert parts[0] == "", out
            outs.append(dict(zip(parts[1::2], parts[2::2], strict=True)).get(mode, ""))
        return job, outs

    return get


@pytest.mark.parametrize(("launcher", "mode", "ranks"), [
    ("torchrun", "torch", 2), ("torchrun", "init", 3), ("mpiexec", "none", 3),
    ("srun", "init", 2),
])  # fmt: skip
def test_a_loader_without_distributed_arguments_uses_the_jobs_world(world_job, launcher, mode,
                                                                    ranks):  # fmt: skip
    """As DistributedSampler finds its group: each sample once per epoch over the job's ranks,
    equal local batches, h5py's bytes (N = 103: no size divides it)."""
    result, outs = world_job(launcher, ranks, mode)
    stdout = "".join(outs)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert sorted(re.findall(r"rank (\d) world (\d)", stdout)) == [
        (str(r), str(ranks)) for r in range(ranks)
    ]
    assert "OK" in stdout
    # rank=/world_size= given with the job's group: checked against it (issue 45, 5).
    group = "MPI's world" if launcher == "mpiexec" else "the process group"
    for r, out in enumerate(outs):
        places = dict(re.findall(r"^place (\{.*?\}): (.*)$", out, re.M))
        say = f"but {group} says rank {r} of {ranks}: pass neither (or comm=)"
        # The way out for a part of the job (a model-parallel job's data-parallel ranks).
        out_of = ("to use it, rank=0, world_size=1 for this process alone, or a part's "
                  "communicator for a part of the job (the data-parallel ranks of a "
                  "model-parallel job: comm=solar.dist.TorchComm(group=dp_group), or an MPI "
                  "sub-communicator, comm.Split(...))")  # fmt: skip
        assert places == {
            f"{{'world_size': {ranks + 1}}}": f"refused: world_size={ranks + 1} (rank 0 by "
            f"default) {say} {out_of}",
            f"{{'rank': 0, 'world_size': {ranks}}}": "accepted"
            if r == 0
            else f"refused: rank=0, world_size={ranks} {say} {out_of}",
            f"{{'rank': {r}, 'world_size': {ranks}}}": "accepted",
            "{'rank': 0, 'world_size': 1}": "accepted",
        }, out


@pytest.mark.parametrize("launcher", ["torchrun", "srun"])
def test_a_loader_refuses_a_job_it_cannot_reach(world_job, launcher):
    """Several ranks and no process group: one line saying what to do, never world 1."""
    result, outs = world_job(launcher, 2, "none")
    for r, out in enumerate(outs):  # each rank's own output, not their interleaving
        assert out.startswith("refused: ") and out.count("\n") == 1, result.ranks
        assert f"launched by {launcher} as rank {r}" in out
        assert "torch.distributed is not initialised: call solar.dist.init()" in out
    assert "world 1" not in "".join(outs)
