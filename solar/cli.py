"""The ``solar`` command line: plan runs, make demo data."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from solar._atomic import check_writable, write_json
from solar._units import format_bytes
from solar.config import (
    BufferConfig,
    ReaderConfig,
    RunConfig,
    Size,
    parse_size,
    share_or_size,
)
from solar.errors import SolarError
from solar.options import MemoryConfig, PlanningConfig
from solar.plan_report import PlanReport, plan_summary
from solar.schedule import POLICIES, PlanSpec
from solar.schedule.draw.samplers import make_sampler, sampler_run
from solar.schedule.keep.summary import HostTotals
from solar.schedule.plans.plan import plan_to_file, simulate
from solar.schedule.policy import TRACE_POLICIES
from solar.schedule.spec import equal_by_default
from solar.transform import load_transform

_READER = ReaderConfig()  # the defaults shown by --help
_PLANNING = PlanningConfig()

# -- option groups: the records of solar.options, each option defined once -----------------------
# A command takes the options of a group that apply to it and builds the record from them
# (ReaderConfig, MemoryConfig, PlanningConfig), as a Loader takes them.
ONE_PER_FILE = click.option("--one-per-file", is_flag=True,
                            help="Each data file is one sample (its datasets).")  # fmt: skip
THREADS = click.option("--threads", default=str(_READER.threads), show_default=True,
                       help='solar reader threads per rank, or "auto": tuned online.')  # fmt: skip
READ_AHEAD = click.option(
    "--read-ahead", type=int, default=_READER.read_ahead, show_default=True,
    help=f"Steps solar reads ahead of the one served (at least {_READER.read_ahead_samples} "
         "samples: more at small batches).",
)  # fmt: skip
TIER = click.option("--tier", type=click.Path(), help="Directory on local NVMe for a second tier.")
SLACK = click.option("--slack", type=float, default=_PLANNING.slack, show_default=True,
                     help="Extra share of B a rank may serve to keep its hits.")  # fmt: skip
FANOUTS = click.option("--fanouts", default="10,5", show_default=True, help="--sampler "
                       "neighbor: neighbours per node at each hop (-1: all).")  # fmt: skip
WEIGHTS = click.option("--weights", type=click.Path(),
                       help="Weights .npy (one per sample) of --sampler weighted.")  # fmt: skip


def tier_size_option(default: str) -> Any:
    """``--tier-size``: the second tier (with --tier on a Loader or bench), as --buffer."""
    return click.option("--tier-size", "-D", default=default, show_default=True,
                        help="Second tier (local NVMe), as --buffer.")  # fmt: skip


# A plan this long gets a progress bar (a few seconds of work).
_PROGRESS_ACCESSES = 10_000_000

log = logging.getLogger(__name__)  # solar.cli

# Progress when stderr is not a terminal (a Slurm log): log lines, the first once the work has
# taken this long (a short run says nothing), then every 10 % or this often.
_LOG_AFTER, _LOG_EVERY = 5.0, 60.0


class _Commands(click.Group):
    """solar's command group. An ``EOFError`` out of a command is data that ended early (a
    truncated file, a cut pipe), an error: click's ``main`` would take it for the user's end of
    input and report an interrupt (exit 130); its prompts turn a real one into ``Abort``
    themselves."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except EOFError as exc:
            raise SolarError(f"input ended early ({exc or 'EOFError'})") from None


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="solar")
def cli() -> None:
    """solar: clairvoyant data loading for distributed training on HDF5 datasets and GNN
    node features."""


@cli.command(short_help="Plan a run: hits, reads and batches per rank; write a plan file.")
@click.argument("data", nargs=-1, type=click.Path())
@click.option("--key", "keys", multiple=True,
              help="Dataset key (repeatable); default: all (a graph: features).")  # fmt: skip
@ONE_PER_FILE
@click.option("--samples", type=int, help="Number of samples N, when no data files are given.")
@click.option("--sample-bytes", type=int, help="Bytes per sample, when no data files are given.")
@click.option("--world-size", "-P", type=int, required=True, help="Number of ranks P.")
@click.option("--batch-size", "-B", type=int, required=True, help="Nominal local batch B.")
@click.option("--epochs", "-E", type=int, required=True, help="Epochs E.")
@click.option("--buffer", "-C", required=True,
              help="RAM buffer: samples (500) or bytes (4GiB) per rank, or a share of the "
                   "dataset over all ranks (10%).")  # fmt: skip
@tier_size_option("0")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the epochs' shuffles (and of --sampler's draws).")  # fmt: skip
@SLACK
@click.option("--drop-last", is_flag=True, help="Drop a short last global batch.")
@click.option("--equal-batches/--variable-batches", default=None,
              help="Every rank delivers exactly B, ranks over B handing their surplus rows to "
                   "ranks under it (the default with several ranks and Shuffle, as a Loader's), "
                   "or local batches that vary within --slack.")  # fmt: skip
@click.option(
    "--policy",
    type=click.Choice(sorted({*POLICIES, *TRACE_POLICIES})),
    default=_PLANNING.policy,
    show_default=True,
    help="Planning policy (static: --sampler weighted only).",
)
@click.option("--reorder-epochs", is_flag=True, help="Order epochs to chain buffers (SOLAR's TSP).")
@click.option(
    "--sampler",
    "sampler_kind",
    type=click.Choice(["shuffle", "weighted", "neighbor"]),
    default="shuffle",
    show_default=True,
    help="Who draws each step's samples: shuffle (DistributedSampler's), weighted (by "
    "--weights), neighbor (a graph file's k-hop subgraphs around -B seeds per rank, "
    "--fanouts).",
)
@FANOUTS
@WEIGHTS
@click.option("--draws", "--num-samples", "num_samples", type=int,
              help="Draws per epoch of --sampler weighted (default N).")  # fmt: skip
@click.option(
    "--no-replacement", is_flag=True, help="--sampler weighted draws without replacement."
)
@click.option(
    "--horizon",
    type=int,
    help="Epochs of look-ahead for --sampler weighted "
    "(default: the whole run if it fits in memory).",
)
@click.option("--window", type=int,
              help="Plan each epoch of --sampler neighbor in windows of this many steps (next "
                   "uses known one window ahead: memory grows with the window, not the "
                   "epoch; default: whole epochs wherever they fit).")  # fmt: skip
@click.option("--out", "-o", type=click.Path(),
              help="Plan file to write; without it, plan and report only.")  # fmt: skip
@click.option("--plot", "plot_out", type=click.Path(),
              help="Write a PNG here: the hit rate of every epoch against the bound.")  # fmt: skip
@click.option("--force", is_flag=True, help="Overwrite --out and --plot if they exist.")
@click.option("--share", "share_mode", type=click.Choice(["rank", "node"]), default="rank",
              show_default=True,
              help="rank: a buffer per rank; node: one buffer per host, shared by its ranks "
                   "(Loader(memory=MemoryConfig(share=\"node\"))): --out writes a node plan "
                   "file, which records --hosts.")  # fmt: skip
@click.option("--hosts", help="The ranks grouped by host, HOSTSxRANKS (e.g. 2x2: ranks 0-1 on "
                              "one host, 2-3 on another; 3,1: hosts of 3 and 1 ranks, reported "
                              "but not written to a file). --share node: the node plan's "
                              "grouping (default 1xP: one host of all ranks); --share rank: "
                              "also plan one buffer per host and report its reads beside the "
                              "per-rank plan's.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def plan(
    data: tuple[str, ...],
    keys: tuple[str, ...],
    one_per_file: bool,
    samples: int | None,
    sample_bytes: int | None,
    world_size: int,
    batch_size: int,
    epochs: int,
    buffer: str,
    tier_size: str,
    seed: int,
    slack: float,
    drop_last: bool,
    equal_batches: bool | None,
    policy: str,
    reorder_epochs: bool,
    sampler_kind: str,
    fanouts: str,
    weights: str | None,
    num_samples: int | None,
    no_replacement: bool,
    horizon: int | None,
    window: int | None,
    out: str | None,
    plot_out: str | None,
    force: bool,
    share_mode: str,
    hosts: str | None,
    as_json: bool,
) -> None:
    """Plan a run over DATA (HDF5 or .npy files, globs, directories) or over --samples N;
    write it to --out. A graph file (solar gen --preset graph) is planned with --sampler
    neighbor: the feature rows of every step's sampled subgraphs. With --share node, one
    buffer per host (--hosts) shared by its ranks: the plan of MemoryConfig(share="node")."""
    for path in (out, plot_out):
        _check_out(path, force)
    if share_mode == "node" and plot_out:
        raise SolarError("--share node: no --plot (yet)")
    comm = _job_comm(share_mode, hosts)  # under mpiexec: its processes plan as one host
    hosts_of = (share_mode, hosts)
    memory = MemoryConfig(tier_size=tier_size, share=share_mode)
    planning = PlanningConfig(slack=slack, policy=policy, equal_batches=equal_batches,
                              horizon=horizon, window=window)  # fmt: skip
    info = dataset = pages = None
    if sampler_kind == "neighbor":  # a graph's feature rows, as a Loader with a NeighborSampler
        from solar.graph.bench import parse_fanouts
        from solar.graph.neighbor import NeighborSampler
        from solar.io.sources import describe_source
        from solar.runtime.setup import page_layout

        key = _graph_key(data, keys, {"--one-per-file": one_per_file, "--samples": samples,
                                      "--sample-bytes": sample_bytes, "--drop-last": drop_last,
                                      "--equal-batches": equal_batches,
                                      "--reorder-epochs": reorder_epochs, "--weights": weights,
                                      "--num-samples": num_samples,
                                      "--no-replacement": no_replacement})  # fmt: skip
        # (under mpiexec the topology is read once, shared by the host's processes)
        sampler: Any = NeighborSampler(data[0], parse_fanouts(fanouts), batch_size, features=key,
                                       comm=comm)  # fmt: skip
        info = describe_source(data[0], [key])
        pages = page_layout(info)  # page mates where the rows share pages, as a Loader plans
    else:
        _refuse_graph(data, keys, "plan")
        sampler = make_sampler(sampler_kind, weights, num_samples, not no_replacement)
    if data and info is None:
        from solar.io.sources import describe_source

        info = describe_source(list(data), list(keys) or None, one_per_file=one_per_file)
        if samples is not None and samples != info.num_samples:
            raise SolarError(f"--samples {samples} disagrees with the data's {info.num_samples}")
        if sample_bytes is not None and sample_bytes != info.sample_bytes:
            raise SolarError(
                f"--sample-bytes {sample_bytes} disagrees with the data's {info.sample_bytes}"
            )
    if info is not None:
        samples, sample_bytes, dataset = info.num_samples, info.sample_bytes, info.identity
    elif keys:
        raise SolarError("--key needs data files")
    elif samples is None:
        raise SolarError("give data files or --samples N")
    if sample_bytes is not None and sample_bytes <= 0:
        raise SolarError(f"--sample-bytes must be positive, got {sample_bytes}")
    run = sampler_run(sampler, samples, world_size, batch_size, epochs, seed, drop_last)
    capacity, tier = (
        parse_size(text, sample_bytes=sample_bytes, name=name, num_samples=samples,
                   world_size=world_size)
        for text, name in ((buffer, "--buffer"), (memory.tier_size, "--tier-size"))
    )  # fmt: skip
    equal_batches = planning.equal_batches
    if equal_batches is None:  # a Loader's default, so that its plan file serves a Loader's run
        equal_batches = equal_by_default(world_size, sampler)
    spec = PlanSpec(
        run, BufferConfig(capacity, planning.slack, tier), planning.policy, reorder_epochs,
        sample_bytes, dataset, sampler, planning.horizon, equal_batches, None, planning.window,
    )  # fmt: skip
    if pages is not None and spec.plans_page_mates:
        spec = dataclasses.replace(spec, pages=pages)
    _run_plan(spec, out, plot_out, as_json, hosts_of, comm)


def _job_comm(share_mode: str, hosts: str | None) -> Any:
    """MPI's world where mpiexec started several processes of ``solar plan`` (they plan the
    run as one host, each its share of the ranks: solar/schedule/plans/together.py), else
    None. A node buffer or --hosts is refused there, in one line."""
    from solar.launch import detect_launcher

    launch = detect_launcher()
    if launch.kind != "mpi" or launch.world_size < 2:
        return None
    if share_mode == "node" or hosts:
        raise SolarError("solar plan under mpiexec plans a buffer per rank as one host: no "
                         "--share node or --hosts (run it as one process)")  # fmt: skip
    from mpi4py import MPI

    from solar.dist import install_abort_on_error, unname_mpi_segments
    from solar.host.place import place

    comm = MPI.COMM_WORLD
    install_abort_on_error(comm)  # (a process failing ends the job, never a hang)
    # An aborted job must leave nothing in /dev/shm, as a Loader's does (solar.dist).
    unname_mpi_segments(place(comm).machine_comm)
    return comm


def _planned(spec: PlanSpec, out: str | None, progress: Any, epoch_done: Callable,
             grouped: Any, comm: Any) -> Any:  # fmt: skip
    """The run planned (into ``out``) and its totals: by this process, or with the processes
    of ``comm`` as one host (None on all but the first)."""
    if comm is not None:
        from solar.dist import abort_job_on_error
        from solar.schedule.plans.together import plan_together

        with abort_job_on_error(comm):
            return plan_together(spec, comm, out, progress, epoch_done)
    if out:
        return plan_to_file(spec, out, progress, epoch_done, grouped).summary
    return simulate(spec, progress, epoch_done, grouped)


def _run_plan(spec: PlanSpec, out: str | None, plot_out: str | None, as_json: bool,
              hosts_of: tuple[str, str | None] = ("rank", None),
              comm: Any = None) -> None:  # fmt: skip
    """Plan ``spec`` (into ``out`` if given), print its summary, plot its epochs.
    ``hosts_of``: (--share, --hosts): with ``--share node`` one buffer per host of --hosts
    (HxL, default 1xP), the grouping the plan's; per rank, --hosts shows a node buffer's
    figures beside. ``comm``: the processes planning it together (the first reports)."""
    from solar.schedule.keep.grouping import Hosts

    share_mode, hosts = hosts_of
    grouped = None
    if share_mode == "node":
        if spec.buffer.tier:
            raise SolarError("--share node: a node tier is not planned yet (no --tier-size)")
        if plot_out:
            raise SolarError("--plot: per-rank plans only (not with --share node)")
        grouped = Hosts.parse(hosts or f"1x{spec.run.world_size}", spec.run.world_size,
                              "--hosts")  # fmt: skip
    warmth = _warm_planner(spec, bool(out), grouped)
    if warmth.compiled:
        log.info("compiled %d planner kernels in %.1f s (numba's cache did not hold them); "
                 "`solar warm` (run by `make`) compiles them once per install",
                 warmth.compiled, warmth.compile_seconds)  # fmt: skip
    epochs: list[tuple[int, int]] = []  # (accesses, hits) of each epoch
    run = spec.run
    root = comm is None or comm.Get_rank() == 0
    large = run.num_accesses >= _PROGRESS_ACCESSES and root
    if grouped is None and (root or comm is not None):  # what it will hold, before it holds any
        _say_memory(spec, bool(out), comm)

    def epoch_done(totals: tuple[int, int]) -> None:
        epochs.append(totals)
        if large:  # each epoch's figures as it is planned, not only the run's at its end
            log.info("epoch %d: %d accesses, hit rate %.3f", len(epochs) - 1, totals[0],
                     totals[1] / max(1, totals[0]))  # fmt: skip

    with _progress(run, enabled=large) as progress:
        # Streamed one epoch at a time (a plan file written epoch by epoch): memory does not
        # grow with the number of epochs.
        result = _planned(spec, out, progress, epoch_done, grouped, comm)
    if result is None:  # (another process of the job reports)
        return
    report = plan_summary(result, Path(out) if out else None)
    summary = report.figures
    summary.update(warm_seconds=warmth.seconds, compile_seconds=warmth.compile_seconds)
    if grouped is None:
        summary["hit_rate_per_epoch"] = [h / max(1, a) for a, h in epochs]
    if plot_out:
        from solar.bench import plot_plan

        plot_plan(summary, Path(plot_out))
        summary["plot"] = plot_out
    if hosts and grouped is None:  # one buffer per host, side by side
        totals = simulate(spec, hosts=Hosts.parse(hosts, spec.run.world_size, "--hosts")).stats
        assert isinstance(totals, HostTotals)
        node = totals.as_dict()
        node["fewer_reads"] = summary["reads"] / max(1, node["reads"])
        summary["node"] = node
    click.echo(json.dumps(summary) if as_json else report.text())
    if "node" in summary and not as_json:
        n = summary["node"]
        click.echo(f"one buffer per host ({hosts}): hit rate {n['hit_rate']:.3f} of the node's "
                   f"{n['accesses']} accesses, {n['reads_per_epoch']:.0f} reads/epoch "
                   f"({n['fewer_reads']:.2f}x fewer than per-rank buffers)")  # fmt: skip


def _say_memory(spec: PlanSpec, to_file: bool, comm: Any) -> None:
    """Print what planning will hold; with ``comm`` (a collective of its processes, each its
    share of ranks), per process and per host (the host's processes summed), from the first."""
    from solar._memory import memory_room
    from solar.schedule.plans.plan import plan_memory

    if comm is None:
        need, room = plan_memory(spec, tallied=not to_file), memory_room()
        if room is None or need.need <= room[0]:  # (else the planner refuses, in one line)
            click.echo(f"solar: {need.text(room)}", err=True)
        return
    from solar._units import format_bytes
    from solar.schedule.plans.together import host_memory, share

    host, room = host_memory(spec, comm, tallied=not to_file), memory_room()
    if comm.Get_rank() != 0 or (room is not None and host.host > room[0]):
        return  # (another process reports; or the check refuses it, in one line)
    first = share(spec, comm.Get_size(), 0)
    click.echo(f"solar: {comm.Get_size()} processes plan the {spec.run.world_size} ranks "
               f"as one host, each its share (process 0: ranks {first})", err=True)  # fmt: skip
    line = host.mine.text(whose=" per process (process 0)")
    line += f", {format_bytes(host.host)} for this host's {host.processes} processes"
    if room is not None:
        line += f" ({format_bytes(room[0])} {room[1]})"
    click.echo(f"solar: {line}", err=True)


def _check_out(path: str | None, force: bool) -> None:
    """An output path (-o, --json, --plot) is refused if it exists, unless --force."""
    if not path:
        return
    if Path(path).exists() and not Path(path).is_dir() and not force:
        raise SolarError(f"{path}: exists (use --force to overwrite)")
    check_writable(path)


def _refuse_graph(data: tuple[str, ...], keys: tuple[str, ...], command: str) -> None:
    """A graph file given to a command of samples, without --key: one line saying how."""
    if keys or len(data) != 1:
        return
    from solar.graph.describe import is_graph_file

    if is_graph_file(data[0]):
        raise SolarError(f"{data[0]}: a graph (indptr, indices, features): `solar {command} "
                         f"{data[0]} --sampler neighbor` samples subgraphs around seed nodes "
                         "and gathers their feature rows")  # fmt: skip


def _graph_key(data: tuple[str, ...], keys: tuple[str, ...], others: dict[str, Any]) -> str:
    """--sampler neighbor's arguments: one graph file, at most one --key (its features key,
    returned), none of ``others`` (the options of samples given: refused in one line)."""
    if any(others.values()):
        raise SolarError("--sampler neighbor does not take "
                         f"{', '.join(k for k, v in others.items() if v)}")  # fmt: skip
    if len(data) != 1 or len(keys) > 1:
        raise SolarError("--sampler neighbor takes one graph file (solar gen --preset graph) "
                         "and at most one --key (default: features)")  # fmt: skip
    return keys[0] if keys else "features"


def _warm_planner(spec: PlanSpec, to_file: bool, hosts: Any = None):
    """Compile the planner's kernels on a tiny copy of ``spec`` first (grouped by ``hosts``
    if given): the plan's time is planning, not compiling (solar/warm.py)."""
    import tempfile

    from solar.warm import rehearse_planning

    with tempfile.TemporaryDirectory(prefix="solar-warm-") as tmp:
        if to_file:
            return rehearse_planning(spec, lambda s: plan_to_file(s, Path(tmp) / "p.h5",
                                                                  hosts=hosts))  # fmt: skip
        return rehearse_planning(spec, lambda s: simulate(s, hosts=hosts))


@cli.command(short_help="Compile solar's kernels into numba's cache (once per install).")
@click.option("--jobs", "-j", type=int, default=1, show_default=True,
              help="Processes compiling at once (numba compiles one kernel at a time per "
                   "process).")  # fmt: skip
def warm(jobs: int) -> None:
    """Compile solar's kernels into numba's cache now (once per install), for every policy,
    with and without a tier, Shuffle and Weighted: later runs load them in milliseconds."""
    from solar.precompile import warm_ahead

    if jobs < 1:
        raise SolarError(f"--jobs must be >= 1, got {jobs}")
    where = os.environ.get("NUMBA_CACHE_DIR") or "beside solar's sources"
    click.echo(f"compiling solar's kernels into numba's cache ({where}) ...", err=True)
    w = warm_ahead(jobs, lambda name: click.echo(f"  {name}", err=True))
    click.echo(
        f"warm in {w.seconds:.1f} s (this process compiled {w.compiled} kernels in "
        f"{w.compile_seconds:.1f} s)"
    )


@cli.command(short_help="Transform trainers' steps as a preprocessing worker on another host.")
@click.argument("address")
@click.option("--threads", type=int, default=None,
              help="Transform threads (default: this process's cores).")  # fmt: skip
@click.option("--wait", "wait_s", type=float, default=600.0, show_default=True,
              help="Seconds to wait for the trainers to start.")  # fmt: skip
def worker(address: str, threads: int | None, wait_s: float) -> None:
    """Join the trainers meeting at ADDRESS (host:port of trainer rank 0, as in their
    Remote(address=...)), then read, transform and send the steps this worker owns until
    they are done. Start it as a job of its own (its death must not end the trainers'):
    `solar worker HOST:PORT` on each worker host, under any launcher or none. The trainers'
    secret comes in SOLAR_REMOTE_KEY (required: the job and the rows are signed with it)."""
    from solar.worker import serve

    if threads is not None and threads < 1:
        raise SolarError(f"--threads must be >= 1, got {threads}")
    got = serve(address, threads, wait_s)
    click.echo(f"worker {got.id}: {sum(got.sent.values())} steps, {got.rows} rows sent to "
               f"trainers {sorted(got.sent)} in {got.seconds:.1f} s; {got.hits} rows from its "
               f"buffer, {got.reads} read")  # fmt: skip


@cli.command(short_help="Make a small dataset, plan a 4-rank run, run it, compare.")
@click.option("--dir", "directory", type=click.Path(), default=".demo", show_default=True,
              help="Directory for the demo's dataset (kept for the next run) and plan "
                   "file.")  # fmt: skip
def demo(directory: str) -> None:
    """Generate a PtychoNN-like dataset (if absent), plan a 4-rank run, execute it, and
    show what solar buys: storage reads against a DataLoader's, which reads every sample
    of every epoch."""
    from solar.io.generate import generate

    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    data = root / "ptychonn.h5"
    if not data.exists():
        click.echo(f"generating {data} (1024 PtychoNN-like samples, 288 MiB) ...", err=True)
        generate(data, "ptychonn", 1024)
    plan_file = root / "plan.h5"
    # Ranks simulated one after another in one process exchange no rows: variable batches.
    args = [str(data), "-P", "4", "-B", "16", "-E", "5", "-C", "128", "--variable-batches",
            "-o", str(plan_file), "--force"]  # fmt: skip
    click.echo(f"$ solar plan {' '.join(args)}", err=True)
    plan.main(args, standalone_mode=False)
    click.echo("\nexecuting the plan: 4 ranks, one after another in this process")
    served, reads, read_bytes = _run_demo(data, plan_file, world=4, batch=16, epochs=5,
                                          buffer=128)  # fmt: skip
    # What a DataLoader does in the same run: every sample of every epoch from storage.
    with_torch = served * (read_bytes / max(1, reads)) if reads else 0.0
    click.echo(
        f"\nwhat it showed: over 5 epochs solar read {reads} of the {served} samples it served "
        f"from storage ({format_bytes(read_bytes)}); a PyTorch DataLoader reads all {served} "
        f"({format_bytes(with_torch)}), {served / max(1, reads):.1f}× as many"
    )
    click.echo("next, measured on your storage, and your own data:")
    click.echo(f"  solar bench {data} -E 3 --plot bench.png   # solar against the DataLoader")
    click.echo(f"  solar inspect {data}   # what solar does with a file, and what to change")


def _run_demo(data: Path, plan_file: Path, world: int, batch: int, epochs: int,
              buffer: int) -> tuple[int, int, int]:  # fmt: skip
    """Run the plan rank by rank; (samples served, samples read, bytes read) over the run."""
    import h5py
    import numpy as np

    from solar.loader import Loader

    loaders = [
        Loader(data, batch_size=batch, epochs=epochs, buffer=buffer, rank=r, world_size=world,
               planning=PlanningConfig(plan=plan_file))
        for r in range(world)
    ]  # fmt: skip
    click.echo(f"{'epoch':>5} {'samples':>8} {'hits':>6} {'reads':>6} {'MiB read':>9} "
               f"{'read s':>7} {'stall s':>8} {'samples/s':>10}")  # fmt: skip
    totals = [0, 0, 0]
    with h5py.File(data) as f:
        for e in range(epochs):
            t0 = time.perf_counter()
            seen = []
            for ld in loaders:
                ld.set_epoch(e)
                for i, b in enumerate(ld):
                    seen.append(b["index"].numpy().copy())
                    if i == 0:  # spot-check bytes against h5py
                        idx = np.sort(b["index"].numpy())
                        order = np.argsort(b["index"].numpy())
                        want = f["diffraction"][idx]
                        if not np.array_equal(b["diffraction"].numpy()[order], want):
                            raise SolarError(f"demo: epoch {e} served wrong bytes")
            seconds = time.perf_counter() - t0
            served = np.concatenate(seen)
            if not np.array_equal(np.sort(served), np.arange(len(served))):
                raise SolarError(f"demo: epoch {e} did not serve every sample once")
            st = [ld.stats.epochs[e] for ld in loaders]
            totals[0] += sum(s.samples for s in st)
            totals[1] += sum(s.reads for s in st)
            totals[2] += sum(s.bytes_read for s in st)
            click.echo(
                f"{e:>5} {sum(s.samples for s in st):>8} {sum(s.hits for s in st):>6} "
                f"{sum(s.reads for s in st):>6} {sum(s.bytes_read for s in st) / 2**20:>9.1f} "
                f"{sum(s.read_seconds for s in st):>7.2f} {sum(s.stall_seconds for s in st):>8.2f} "
                f"{len(served) / seconds:>10.0f}"
            )
    click.echo("every epoch served each sample once; spot-checked batches equal h5py's bytes")
    return totals[0], totals[1], totals[2]


@cli.command(short_help="Summarise files: keys, layouts, what solar does, what to convert.")
@click.argument("data", nargs=-1, required=True, type=click.Path())
@click.option("--key", "keys", multiple=True, help="Dataset key (repeatable); default: all.")
@ONE_PER_FILE
@click.option("--verbose", "-v", is_flag=True,
              help="Also each file's datasets: offsets, read path, advice.")  # fmt: skip
@click.option("--probe", type=int, default=0, show_default=True,
              help="Time this many random single-sample reads per dataset (cold).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def inspect(data: tuple[str, ...], keys: tuple[str, ...], one_per_file: bool, verbose: bool,
            probe: int, as_json: bool) -> None:  # fmt: skip
    """Summarise DATA (HDF5 files, globs, directories): files, keys, shapes and layouts,
    what solar will do with them and the one conversion to run, if any; a graph file
    (solar gen --preset graph): nodes, edges, degrees, features, how solar serves it; a plan
    file (solar plan -o): its figures (a node plan file's: its hosts and the node's)."""
    from solar.graph.describe import describe_graph, format_graph, is_graph_file
    from solar.io.inspect import format_reports, inspect_files
    from solar.io.overview import format_overview, overview
    from solar.io.sources import expand_sources

    files = expand_sources(list(data))
    # solar plan's own files: their figures (not when asked about keys of samples)
    plans = {} if keys or one_per_file else _plan_files(files)
    files = [f for f in files if f not in plans]
    graphs = [f for f in files if not keys and is_graph_file(f)]
    others = [f for f in files if f not in graphs]
    found = [describe_graph(g, probe=probe) for g in graphs]
    reports = (
        inspect_files(others, one_per_file=one_per_file, probe=probe, keys=list(keys) or None)
        if others
        else []
    )
    summary = overview(data, others, reports, one_per_file, list(keys)) if others else None
    if as_json:
        out: dict[str, Any] = {"graphs": [g.as_dict() for g in found]}
        if plans:
            out["plans"] = [p.figures for p in plans.values()]
        if summary is not None:
            out.update(summary=summary.as_dict(), datasets=[r.as_dict() for r in reports])
        click.echo(json.dumps(out))
        return
    parts = [p.text() for p in plans.values()] + [format_graph(g) for g in found]
    if summary is not None:
        parts.append(format_overview(summary, verbose))
        if verbose:
            parts.append(format_reports(reports))
    click.echo("\n\n".join(parts))


def _plan_files(files: list[Path]) -> dict[Path, PlanReport]:
    """The plan files among ``files`` (``solar plan -o``'s), each with its report."""
    from solar.schedule.plans.plan import load_plan
    from solar.schedule.plans.planfile import is_plan_file

    return {f: plan_summary(load_plan(f).summary, Path(f)) for f in files
            if is_plan_file(f)}  # fmt: skip


@cli.command(short_help="Rewrite any layout as one contiguous, aligned, verified HDF5 file.")
@click.argument("src", nargs=-1, required=True, type=click.Path())
@click.argument("dst", type=click.Path())
@click.option("--key", "keys", multiple=True, help="Dataset key to copy (repeatable); default all.")
@ONE_PER_FILE
@click.option("--align", type=int, default=4096, show_default=True,
              help="Byte boundary every dataset starts on (a power of two; 4096 = one page, "
                   "what O_DIRECT reads need).")  # fmt: skip
@click.option("--force", is_flag=True, help="Overwrite DST if it exists.")
@click.option("--features", type=click.Path(exists=True), help="graph: node features (.npy).")
@click.option("--labels", type=click.Path(exists=True), help="graph: node labels (.npy).")
@click.option(
    "--split",
    "splits",
    multiple=True,
    metavar="NAME=FILE",
    help="graph: train/valid/test node ids or mask (.npy), e.g. train=train_idx.npy.",
)
@click.option("--nodes", "--num-nodes", "num_nodes", type=int,
              help="graph: node count (default: from the rows).")  # fmt: skip
@click.option("--undirected", is_flag=True, help="graph: store each edge both ways.")
@click.option("--weight-column", "weights", type=click.Choice(["none", "ignore"]),
              default="none", show_default=True,
              help="graph: a text edge list's third column, a weight: none (two ids a line, "
                   "any other line refused) or ignore (src dst weight; the weight is checked "
                   "as a number and dropped).")  # fmt: skip
@click.option(
    "--memory",
    default="1GiB",
    show_default=True,
    help="graph: memory the conversion may use beyond 8 B per node.",
)
def convert(
    src: tuple[str, ...], dst: str, keys: tuple[str, ...], one_per_file: bool, align: int,
    force: bool, features: str | None, labels: str | None, splits: tuple[str, ...],
    num_nodes: int | None, undirected: bool, weights: str, memory: str,
) -> None:  # fmt: skip
    """Rewrite SRC (HDF5 or .npy files, globs, directories) as one contiguous, aligned DST;
    or a graph (a PyG .pt file, an OGB-style directory, an edge list .csv/.npy with
    --features/--labels/--split) as solar's graph file."""
    from solar.graph.ingest import convert_graph, is_graph_source
    from solar.io.convert import convert as run_convert

    check_writable(dst)
    graph_opts = features or labels or splits or num_nodes or undirected or weights != "none"
    given = click.get_current_context().get_parameter_source
    if len(src) == 1 and (graph_opts or is_graph_source(src[0])):
        if keys or one_per_file:
            raise SolarError(f"{src[0]}: a graph converts whole (topology, features, labels, "
                             "splits): drop --key/--one-per-file")  # fmt: skip
        if given("align") == ParameterSource.COMMANDLINE:
            raise SolarError(f"{src[0]}: --align: a graph file is always written with every "
                             "array on a 4 KiB page; drop --align")  # fmt: skip
        got = convert_graph(src[0], dst, features=features, labels=labels, splits=splits,
                            num_nodes=num_nodes, undirected=undirected, memory=memory,
                            weights=None if weights == "none" else weights, force=force,
                            progress=_counter("converting"))  # fmt: skip
        click.echo(f"{dst}: graph of {got['nodes']} nodes, {got['edges']} edges, features "
                   f"{got['features']}, splits {got['splits']}; verified")  # fmt: skip
        return
    if given("memory") == ParameterSource.COMMANDLINE:
        raise SolarError("--memory bounds a graph's conversion; samples are copied in bounded "
                         "blocks whatever their size: drop --memory")  # fmt: skip
    result = run_convert(
        list(src), dst, keys=list(keys) or None, one_per_file=one_per_file, align=align,
        force=force, progress=_counter("converting"),
    )  # fmt: skip
    click.echo(f"{dst}: {result['samples']} samples, verified")
    click.echo(format_key_table(result["keys"]))


def format_key_table(keys: dict[str, list]) -> str:
    """``{key: [sample shape, dtype]}`` as aligned columns: key, shape of a sample, dtype."""
    rows = [("key", "sample shape", "dtype")]
    rows += [(k, "×".join(map(str, s)) or "scalar", dtype) for k, (s, dtype) in keys.items()]
    width = [max(len(r[i]) for r in rows) for i in range(2)]
    return "\n".join(f"  {a:<{width[0]}}  {b:<{width[1]}}  {c}" for a, b, c in rows)


@cli.command(short_help="Write a synthetic dataset (surrogate samples or a GNN graph).")
@click.argument("out", type=click.Path())
@click.option(
    "--preset",
    type=click.Choice(["ptychonn", "braggnn", "autophasenn", "graph"]),
    required=True,
    help="ptychonn: 256×256 images → 64×64 amplitude and phase (288 KiB/sample); braggnn: "
    "11×11 patches → 2-D centres; autophasenn: 64³ volumes (1 MiB/sample); graph: a "
    "power-law graph with node features, labels and a training split.",
)
@click.option("--samples", type=int, help="Number of samples (sample presets).")
@click.option("--chunks", type=int, help="Samples per chunk (default: contiguous).")
@click.option("--compression", type=click.Choice(["gzip", "lzf"]), help="Compress (chunked).")
@click.option("--nodes", type=int, help="graph: number of nodes.")
@click.option("--avg-degree", type=float, default=20.0, show_default=True,
              help="graph: mean number of neighbours per node (edges stored both "
                   "ways).")  # fmt: skip
@click.option("--features", type=int, default=256, show_default=True,
              help="graph: float32 features per node.")  # fmt: skip
@click.option("--train-fraction", type=float, default=0.1, show_default=True,
              help="graph: share of the nodes in the training split (the seeds of an "
                   "epoch).")  # fmt: skip
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the generated values (same seed, same file).")  # fmt: skip
@click.option("--force", is_flag=True, help="Overwrite OUT if it exists.")
def gen(out, preset, samples, chunks, compression, nodes, avg_degree, features, train_fraction,
        seed, force) -> None:  # fmt: skip
    """Write a synthetic dataset shaped like a surrogate's training data, or (``--preset
    graph``) a power-law block-model graph for GNN training (labels are communities:
    a GNN must use the edges), written in bounded memory."""
    from solar.io.generate import generate

    _check_out(out, force)
    progress = _counter("generating")
    if preset == "graph":
        from solar.graph.generate import generate_graph

        if nodes is None or samples is not None or chunks or compression:
            raise SolarError("--preset graph takes --nodes (not --samples, --chunks, "
                             "--compression)")  # fmt: skip
        generate_graph(out, nodes, avg_degree, features, seed=seed,
                       train_fraction=train_fraction, progress=progress)  # fmt: skip
        click.echo(f"{out}: graph of {nodes} nodes, {features} features each")
        return
    if samples is None:
        raise SolarError(f"--preset {preset} needs --samples")
    generate(out, preset, samples, seed=seed, chunks=chunks, compression=compression,
             progress=progress)  # fmt: skip
    click.echo(f"{out}: {samples} {preset}-like samples")


@cli.command(short_help="Measure the DataLoader and solar's policies side by side, cold.")
@click.argument("data", nargs=-1, required=True, type=click.Path())
@click.option("--key", "keys", multiple=True, help="Dataset key (repeatable); default: all.")
@ONE_PER_FILE
@click.option("--world-size", "-P", type=int, default=1, show_default=True,
              help="Ranks; launches itself under mpiexec when more than 1.")  # fmt: skip
@click.option("--batch-size", "-B", type=int, default=32, show_default=True,
              help="Local batch per rank (--sampler neighbor: seed nodes per rank).")  # fmt: skip
@click.option("--epochs", "-E", type=int, default=5, show_default=True,
              help="Epochs, each from cold storage (the files' pages evicted first).")  # fmt: skip
@click.option("--buffer", default="50%", show_default=True,
              help="A share of the dataset over all ranks (50%), or samples (500) or bytes "
                   "(4GiB) per rank.")  # fmt: skip
@TIER
@tier_size_option("0%")
@SLACK
@click.option("--loaders", help="Comma-separated loaders to compare (default: torch, lru, fifo, "
              "solar-artifact, nopfs, solar; and solar-ram with --tier; on request "
              "solar-variable: varying batches, solar-slack0: slack 0).")  # fmt: skip
@click.option("--variable-batches", is_flag=True,
              help="Also compare solar-variable: solar with local batches that vary within "
                   "--slack (solar's default is equal batches, with several ranks).")  # fmt: skip
@click.option("--workers", type=click.IntRange(min=0),
              help="DataLoader workers (default: the cores this process may use).")  # fmt: skip
@THREADS
@READ_AHEAD
@click.option("--throttle", help="Emulate a remote file system: MBps,latency_ms per rank.")
@click.option("--compute-ms", type=float, default=0.0, show_default=True,
              help="Simulated training step per batch, ms (0: nothing trains, no bottleneck "
                   "is named).")  # fmt: skip
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the epochs' shuffles and the sampler's draws.")  # fmt: skip
@click.option("--sampler", "sampler_kind",
              type=click.Choice(["shuffle", "weighted", "neighbor"]),
              default="shuffle", show_default=True,
              help="weighted: every loader draws by --weights (the DataLoader with "
                   "WeightedRandomSampler); neighbor: GNN feature gathering on a graph "
                   "(solar gen --preset graph), loaders mmap, lru, static, solar "
                   "(and solar-rows: no page mates, no packing; solar-random: no "
                   "packed windows, every miss a random page read, with page mates; "
                   "solar packs where the model finds it faster, rows alone).")  # fmt: skip
@FANOUTS
@click.option("--probe-seconds", type=float, default=1.0, show_default=True,
              help="--sampler neighbor: seconds per queue depth of the storage probe reported "
                   "beside the figures (random 4 KiB reads, O_DIRECT; 0: none).")  # fmt: skip
@click.option("--pack-disk",
              help="--sampler neighbor: disk per rank for solar's packed windows (misses "
                   "packed in plan order where the cost model finds it faster; default: "
                   "GraphBenchConfig.pack_disk, solar/graph/bench.py; 0: none; solar-random: "
                   "never).")  # fmt: skip
@click.option("--pack-dir", type=click.Path(file_okay=False),
              help="--sampler neighbor: where the packed windows go (node-local; default: "
                   "the system's temporary directory, refused where it is tmpfs).")  # fmt: skip
@WEIGHTS
@click.option("--transform", metavar="MODULE:FUNC",
              help="A per-sample transform fn(sample, rng) (MODULE importable or a .py path): "
                   "the DataLoader runs it in __getitem__, solar in its pipeline, solar-inloop "
                   "in the training loop.")  # fmt: skip
@click.option("--share", "share_mode", type=click.Choice(["auto", "rank", "node"]),
              default="auto", show_default=True,
              help="node (with --sampler neighbor): also solar-host, solar with one buffer per "
                   "host shared by its ranks, side by side with solar (a buffer per rank); "
                   "auto: so where several ranks run (-P > 1), their accesses overlap "
                   "(--sampler neighbor) and no --loaders are named; rank: solar "
                   "alone.")  # fmt: skip
@click.option("--json", "json_out", type=click.Path(), help="Write the results as JSON here.")
@click.option("--plot", "plot_out", type=click.Path(),
              help="Write a PNG here: throughput per loader, hit rate per epoch and the "
                   "bound.")  # fmt: skip
@click.option("--force", is_flag=True, help="Overwrite --json and --plot if they exist.")
def bench(data, keys, one_per_file, world_size, batch_size, epochs, buffer, tier, tier_size,
          slack, loaders, variable_batches, workers, threads, read_ahead, throttle, compute_ms,
          seed, sampler_kind, fanouts, probe_seconds, pack_disk, pack_dir, weights, transform,
          share_mode, json_out, plot_out, force) -> None:  # fmt: skip
    """Compare the PyTorch DataLoader and every policy on DATA, cold storage each epoch
    (--sampler neighbor: GNN feature gathering on a graph file)."""
    from solar import bench as harness

    for path in (json_out, plot_out):
        _check_out(path, force)
    reader = ReaderConfig(one_per_file=one_per_file, threads=_threads(threads),
                          read_ahead=read_ahead)  # fmt: skip
    memory, planning = MemoryConfig(tier=tier, tier_size=tier_size), PlanningConfig(slack=slack)
    names = None if loaders is None else tuple(x for x in loaders.split(",") if x)
    cfg: Any
    run: Callable[..., dict | None]
    if sampler_kind == "neighbor":  # GNN feature gathering: its own loaders (solar/graph/bench.py)
        from solar.graph import bench as graph_bench
        from solar.graph.neighbor import NeighborSampler

        key = _graph_key(data, keys, {"--one-per-file": one_per_file, "--tier": tier,
                                      "--variable-batches": variable_batches,
                                      "--weights": weights, "--transform": transform,
                                      "--workers": workers is not None})  # fmt: skip
        # solar-host beside solar: asked, or (auto) where several ranks run and no --loaders.
        if share_mode == "node" or (share_mode == "auto" and world_size > 1 and names is None):
            names = tuple(dict.fromkeys([*(names or graph_bench.GRAPH_LOADERS), "solar",
                                         "solar-host"]))  # fmt: skip
        cfg = graph_bench.GraphBenchConfig(
            path=data[0], key=key,
            fanouts=graph_bench.parse_fanouts(fanouts), batch_size=batch_size, epochs=epochs,
            buffer=share_or_size(buffer, "--buffer"), loaders=names or graph_bench.GRAPH_LOADERS,
            reader=reader, throttle=throttle,  # the Loader's default read path: what a user gets
            compute_ms=compute_ms, seed=seed, probe_seconds=probe_seconds, pack_dir=pack_dir,
            **({} if pack_disk is None else {"pack_disk": pack_disk}),
        )  # fmt: skip
        # A bad graph, fanouts or batch fails here, before any rank starts.
        NeighborSampler(cfg.path, cfg.fanouts, cfg.batch_size, features=cfg.key)
        run, text = graph_bench.run_graph, graph_bench.format_graph_results
    else:
        if share_mode == "node":
            raise SolarError("--share node: with --sampler neighbor only (for now)")
        _refuse_graph(data, keys, "bench")
        if (memory.tier is None) != Size.parse(memory.tier_size, "--tier-size").zero:
            raise SolarError("--tier DIR and --tier-size > 0 go together")
        make_sampler(sampler_kind, weights)  # a bad --weights fails here, before any rank starts
        if transform:
            load_transform(transform)  # a bad --transform fails here, before any rank starts
        if names is None:
            names = harness.default_loaders(tier is not None, weights is not None,
                                            transform is not None)  # fmt: skip
        if variable_batches and "solar-variable" not in names:
            names += ("solar-variable",)
        cfg = harness.BenchConfig(
            paths=tuple(data), keys=tuple(keys) or None, batch_size=batch_size, epochs=epochs,
            buffer=share_or_size(buffer, "--buffer"), tier=tier,
            tier_size=share_or_size(str(memory.tier_size), "--tier-size"), slack=planning.slack,
            loaders=names, workers=workers, reader=reader, throttle=throttle,
            compute_ms=compute_ms, seed=seed, weights=weights, transform=transform,
        )  # fmt: skip
        run, text = harness.run, harness.format_results
    result = run(cfg, _bench_ranks(world_size), _epoch_done)
    if result is None:  # (a rank other than 0)
        return
    click.echo(text(result))
    if json_out:
        write_json(json_out, result)
    if plot_out:
        harness.plot(result, Path(plot_out))


def _bench_ranks(world_size: int) -> Any:
    """The job's communicator, this command relaunched under mpiexec first if it runs alone
    and ``world_size`` > 1."""
    from solar import bench as harness
    from solar import dist

    launch = dist.detect_launcher()
    if world_size > 1 and launch.kind == "none" and not os.environ.get("SOLAR_BENCH_CHILD"):
        sys.exit(harness.relaunch_under_mpi(world_size, sys.argv[1:]))
    # Before init, which would wait for ranks never started (MPI's count comes from init).
    if launch.kind != "mpi":
        _check_world(world_size, launch.kind, launch.world_size)
    comm = dist.init().comm  # an error on any rank now ends them all
    _check_world(world_size, launch.kind, comm.Get_size())
    if comm.Get_rank() != 0:  # rank 0 speaks for the job
        logging.getLogger("solar").setLevel(logging.WARNING)
    return comm


def _epoch_done(epoch: int, name: str, seconds: float) -> None:
    click.echo(f"epoch {epoch} {name}: {seconds:.2f} s", err=True)


def _threads(text: str) -> int | str:
    """--threads: a count, or "auto" (ReaderConfig checks the value)."""
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        return text


def _check_world(world_size: int, launcher: str, started: int) -> None:
    if started != world_size:
        raise SolarError(f"--world-size {world_size} but {launcher} started {started} ranks")


def _counter(label: str):
    """A progress line on stderr, ``progress(done, total)``: redrawn on a terminal, else
    (a batch job's log) :class:`_LogProgress` lines."""
    if not sys.stderr.isatty():
        return _LogProgress(label)

    def show(done: int, total: int) -> None:
        end = "\n" if done >= total else ""
        click.echo(
            f"\r{label} {done}/{total} ({100 * done // max(total, 1)} %)", nl=False, err=True
        )
        click.echo(end, nl=False, err=True)

    return show


class _LogProgress:
    """Progress as INFO log lines (``solar: planning: 40 % (4000/10000 steps), 12 s``): the
    first once the work has run ``_LOG_AFTER`` seconds, then at each further 10 % or every
    ``_LOG_EVERY`` seconds, and the end if anything was said. ``(done, total)`` or, as a
    progress bar's ``update``, ``(steps)`` with ``total`` given here."""

    def __init__(self, label: str, total: int | None = None, unit: str = "") -> None:
        self.label, self.total, self.unit = label, total, unit
        self.done, self.t0 = 0, time.perf_counter()
        self.said, self.tenth, self.last = False, 0, self.t0

    def __call__(self, done: int, total: int | None = None) -> None:
        if total is None:  # an increment, as click's bar.update
            self.done += done
        else:
            self.done, self.total = done, total
        whole = max(1, self.total or 1)
        now = time.perf_counter()
        tenth = 10 * self.done // whole
        end = self.done >= whole
        if now - self.t0 < _LOG_AFTER and not (end and self.said):
            return
        if self.said and not end and tenth <= self.tenth and now - self.last < _LOG_EVERY:
            return
        self.said, self.tenth, self.last = True, tenth, now
        log.info("%s: %d %% (%d/%d%s), %.0f s", self.label, 100 * self.done // whole,
                 self.done, whole, self.unit, now - self.t0)  # fmt: skip


@contextmanager
def _progress(run: RunConfig, enabled: bool):
    if not enabled:
        yield None
        return
    if not sys.stderr.isatty():
        yield _LogProgress("planning", run.num_steps, " steps")
        return
    with click.progressbar(length=run.num_steps, label="planning", file=sys.stderr) as bar:
        yield bar.update


class _Stderr(logging.Handler):
    """solar's log records as ``solar: message`` lines on the stderr of the moment."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            click.echo(f"solar: {self.format(record)}", err=True)
        except Exception:  # (as logging's own handlers: a log line never ends a run)
            self.handleError(record)


def _log_to_stderr() -> None:
    """The command's logging (library code sets up none): INFO and up of the ``solar``
    loggers on stderr; kept to WARNING on ranks other than 0 (``solar bench``)."""
    root = logging.getLogger("solar")
    if not any(isinstance(h, _Stderr) for h in root.handlers):
        root.addHandler(_Stderr())
    root.setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> None:
    """Entry point: errors are one line on stderr and a non-zero exit, never a traceback."""
    _log_to_stderr()
    try:
        cli.main(args=argv, prog_name="solar", standalone_mode=False)
    except SolarError as exc:
        click.echo(f"solar: error: {exc}", err=True)
        sys.exit(1)
    except click.exceptions.Abort:
        click.echo("solar: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        click.echo(f"solar: error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
