"""Set-up: everything a run decides before its first batch, and refuses if it must.

:func:`configure` turns a Loader's arguments into a frozen :class:`Setup`: the data described,
the ranks, the run, the plan's inputs agreed by every rank (a plan file validated), the memory
checked, the keys delivered and held. It starts no thread; the pipeline is built from it
(solar.runtime.pipeline).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from solar._cpu import cpu_share
from solar._memory import require_memory
from solar._units import format_bytes
from solar.cache.batches import torch_dtype
from solar.cache.slots import check_budget
from solar.cache.tier import check_directory, in_memory, remove_stale, sanitise
from solar.config import BufferConfig, ReaderConfig, RunConfig, parse_size
from solar.dist import MAX, agree, allreduce
from solar.errors import SolarError, first_error
from solar.host import Place, host_comm, place
from solar.host.exchange import threads_unsupported
from solar.io.handles import open_descriptor
from solar.io.info import DatasetInfo, KeyInfo
from solar.io.reader import Reader
from solar.io.sources import describe_source
from solar.launch import detect_launcher
from solar.options import LoaderConfig, MemoryConfig
from solar.runtime.packing import PackSetup
from solar.schedule import Plan, PlanSpec, load_plan
from solar.schedule.draw.pagemates import PageLayout
from solar.schedule.draw.samplers import SHUFFLE, Sampler, extras_of, is_shuffle, sampler_run
from solar.schedule.draw.traces import step_accesses
from solar.schedule.keep.grouping import Hosts, unequal_refusal
from solar.schedule.plans.packing import DeviceRates, PackModel, RowsAt
from solar.schedule.spec import equal_by_default
from solar.transform import Transform, as_transform, first_outputs, output_keys

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Setup:
    """A rank's run as decided at construction."""

    info: DatasetInfo
    rank: int
    world_size: int
    cores: int  # this rank's share of the host's cores
    config: ReaderConfig
    run: RunConfig
    spec: PlanSpec
    given: Plan | None  # a plan given (proven safe), or None: streamed
    sampler: Sampler
    reader: Reader
    transform: Transform | None
    batch_transform: Callable[[dict], dict] | None
    out_keys: tuple[KeyInfo, ...]  # the keys batches hold
    held_keys: tuple[KeyInfo, ...]  # the keys the buffer and tier hold
    tier_dir: str | os.PathLike | None
    comm: Any
    # The job's ranks grouped by the buffer they share: by host, with this rank's host
    # communicator (share="node": the shared region's construction is its collective; the
    # steps' barriers are the region's own, solar/host/barrier.py), or a host of one rank per
    # rank (a buffer per rank: Hosts.grid(P, 1)). No default: any one is wrong for some world.
    hosts: Hosts
    batch_format: str = "dict"  # or "pyg": batches as torch_geometric Data
    host_comm: Any = None
    # Whether a host's ranks share one buffer; else each rank, a host of one rank, keeps a
    # private one: no region, staging or barrier (decided here, once, for every stage).
    shared: bool = False
    # Misses read from packed windows where the model chooses (None: always as random pages).
    pack: PackSetup | None = None

    @property
    def share(self) -> str:
        """``"node"`` (one buffer per host) or ``"rank"`` (a host of one rank per rank)."""
        return "node" if self.shared else "rank"

    @property
    def plan_hosts(self) -> Hosts | None:
        """The grouping the plan is made for (None: a buffer per rank)."""
        return self.hosts if self.shared else None

    @property
    def holds_transformed(self) -> bool:
        """Whether the buffer holds a deterministic transform's outputs."""
        return self.transform is not None and self.transform.deterministic


def configure(args: LoaderConfig) -> Setup:
    """A Loader's record (solar.options) checked and decided, in the order a user's mistakes
    are best reported; every rank agrees on the plan and the keys."""
    comm, memory, planning = args.comm, args.memory, args.planning
    share, plan = memory.share, planning.plan
    info = describe_source(args.paths, args.keys, one_per_file=args.reader.one_per_file,
                           comm=comm)  # fmt: skip
    r, w = rank_and_world(comm, args.rank, args.world_size)
    local = place(comm).machine_size  # they share the machine's cores and memory
    cores = cpu_share(local)  # this rank's share: transform workers, CPU budget
    config = _reader_config(info, args.reader)
    buf = _buffer(info, w, args.buffer, memory.tier, memory.tier_size, planning.slack, local)
    sampler = args.sampler
    chosen = SHUFFLE if sampler is None else sampler
    chosen.bind(comm)  # (a graph's topology: once per host of the job, by default)
    run = _run(info, chosen, w, args.batch_size, args.epochs, args.seed, args.drop_last)
    made = open_given(plan, share)  # of the grouping share runs: per rank or per host
    if share == "auto" and made is not None:  # a plan's grouping is the share it was made for
        share = "rank" if made.hosts is None else "node"
    policy = planning.policy
    equal_batches = _equal_batches(planning.equal_batches, made, chosen, buf, policy, w, comm)
    fn = as_transform(args.transform)
    holds = fn is not None and fn.deterministic
    # Policy, epoch order, horizon, page mates and windows are a given plan's choice.
    chose = None if made is None else made.spec
    spec = PlanSpec(
        run, buf, policy if chose is None else chose.policy,
        False if chose is None else chose.reorder_epochs, info.sample_bytes, info.identity,
        chosen, planning.horizon if chose is None else chose.horizon, equal_batches,
        None if chose is None else chose.pages,
        planning.window if chose is None else chose.window,
    )  # fmt: skip
    source = f"plan {plan}" if isinstance(plan, (str, os.PathLike)) else "plan"
    _check_batch_format(args.batch_format)  # (cheap refusals before packing's probe)
    batch_transform = args.batch_transform
    if batch_transform is not None and not callable(batch_transform):
        raise SolarError(f"batch_transform must be callable, got {batch_transform!r}")
    pack, pays = _packing_pays(memory, info, r, holds, local, run, chosen, comm)
    spec, given = agree_on_plan(spec, made, source, page_layout(info),
                                memory.page_mates and not pays, holds, comm)  # fmt: skip
    # The buffer with the batches in flight, counted as the sampler's largest batch.
    check_batch_memory(spec, config, info.sample_bytes, ranks=local)
    # An epoch's draws (ids and their places), which every rank holds: sized by the user.
    require_memory(16 * run.samples_per_epoch,
                   f"sampler: an epoch of {run.samples_per_epoch} draws", local)  # fmt: skip
    if given is not None and given.hosts is None:
        given.validate(r, comm)  # a file is proven safe before any byte moves, by all ranks
    # The read path, decided here once (direct_io None: the Loader's choice); ``config`` keeps
    # what was asked, the reader says what was chosen (``loader.reader.direct_io``).
    chosen_io = config
    if config.direct_io is None:
        chosen_io = dataclasses.replace(config, direct_io=_direct_by_default(info, args.sampler))
    io = Reader(info, chosen_io, args.expert.throttle)
    if fn is not None and fn.processes and config.pin_memory:
        raise SolarError("transform processes write batches in shared memory, not "
                         "pinned: pass pin_memory=False or use thread workers")  # fmt: skip
    out = info.keys if fn is None else _output_keys(fn, info, io, args.seed)
    if sampler is not None:
        extras_of(sampler).check_keys([k.name for k in out])
    held = out if holds else info.keys
    if fn is not None:  # again, with its rows and steps ahead
        check_batch_memory(spec, config, info.sample_bytes, fn, sum(k.row_bytes for k in out),
                           sum(k.row_bytes for k in held), local)  # fmt: skip
    agree(comm, [(k.name, k.sample_shape, k.dtype.str) for k in out],
          "the transform's output keys, shapes and dtypes")  # fmt: skip
    remote = fn is not None and fn.remote is not None
    hosts, hc = _share(share, spec, holds, w, comm, planning.snapshots is not None, remote)
    if given is not None and given.hosts is not None and hosts is not None:
        given.check_hosts(hosts)  # the job's grouping is the file's
        given.validate(r, comm)  # then proven safe, as any plan file
    return Setup(info, r, w, cores, config, run, spec, given, chosen,
                 io, fn, batch_transform, out, held, memory.tier, comm,
                 Hosts.grid(w, 1) if hosts is None else hosts, batch_format=args.batch_format,
                 host_comm=hc, shared=hosts is not None, pack=pack)  # fmt: skip


def _packing(memory: MemoryConfig, info: DatasetInfo, rank: int, holds: bool,
             local: int) -> PackSetup | None:  # fmt: skip
    """Packing as ``memory.pack`` asks, decided here once: where, how much disk (per rank: the
    machine's ``local`` ranks each pack their own reads, whichever buffer they plan), the
    rows' place and the device's rates (given, or probed on the source now); None if not
    asked."""
    pc = memory.pack
    if not pc.on:
        return None
    offset = -1 if info.stored is None else int(info.stored.offsets[0, 0])
    why = None
    if len(info.all_files) != 1 or len(info.keys) != 1 or info.one_per_file or offset < 0:
        why = "one file with one contiguous key"
    elif memory.tier is not None or holds:
        why = "a buffer without a tier or a deterministic transform"
    if why is not None:
        raise SolarError(f"pack: packing misses needs {why} for now "
                         "(PackingConfig(disk=0) reads misses as pages)")  # fmt: skip
    row_bytes = info.keys[0].row_bytes
    disk = parse_size(pc.disk, sample_bytes=row_bytes, name="pack disk") * row_bytes
    directory = _pack_directory(pc.directory, disk, local)
    rates = None
    if pc.random_pages_per_second is not None and pc.sequential_bytes_per_second is not None:
        rates = DeviceRates(pc.random_pages_per_second, pc.sequential_bytes_per_second)
    else:
        from solar.io.probe import probe  # (only where packing is asked for without rates)

        got = probe(info.all_files[0], depths=(32, 64), seconds=pc.probe_seconds,
                    offset=offset, length=info.num_samples * row_bytes)  # fmt: skip
        rates = DeviceRates(pc.random_pages_per_second or got.best,
                            pc.sequential_bytes_per_second or got.sequential)  # fmt: skip
    chunk_rows = max(1, pc.chunk_bytes // row_bytes)
    at = RowsAt(offset, row_bytes, info.num_samples, chunk_rows)
    model = PackModel(at, rates, disk // 2, pc.margin)  # two windows live: one read, one built
    return PackSetup(directory, disk, model, f"r{rank}")


def _packing_pays(
    memory: MemoryConfig, info: DatasetInfo, rank: int, holds: bool, local: int, run: RunConfig,
    sampler: Sampler, comm: Any,
) -> tuple[PackSetup | None, bool]:  # fmt: skip
    """Packing (:func:`_packing`) and whether it can pay on any rank's device
    (PackModel.packs): then the plan reads rows alone (docs/concepts/buffer.md); else nothing
    is packed (None). One collective that every rank calls, whatever it was asked: the plan
    is one while rates are given or probed per rank, and a rank's own refusal (its directory,
    its disk) is every rank's. Logged with the rates: probed rates near the line may decide
    otherwise on a restart."""
    try:
        pack, why = _packing(memory, info, rank, holds, local), ""
    except SolarError as exc:
        pack, why = None, str(exc)
    mine = False
    if pack is not None:
        # A window holds at most an epoch of the rank's reads: at most its accesses (their
        # bound, no subgraph drawn: a run samples each batch once).
        step = -(-step_accesses(run, sampler, typical=False) // run.world_size)
        mine = pack.model.packs(run.steps_per_epoch * step)
    agreed = allreduce(comm, 2 if why else int(mine), MAX)
    if agreed == 2:
        raise SolarError(why or "pack: refused on another rank (its error names why)")
    pays = agreed == 1
    if pack is not None:
        rates = pack.model.rates
        log.info("pack: %s (%.0f random pages/s, %.3g sequential B/s%s)",
                 "rows alone, windows packed where the model finds it faster" if pays else
                 "no window can pay: misses read as random pages, as without packing",
                 rates.random_pages_per_second, rates.sequential_bytes_per_second,
                 "" if pays == mine else "; another rank's device packs")  # fmt: skip
    return (pack if pays else None), pays


def _pack_directory(given: str | os.PathLike | None, disk: int, local: int = 1) -> Path:
    """The packed layouts' directory, checked (one line naming the parameter): writable, with
    ``disk`` bytes free for each of the machine's ``local`` ranks once this host's crashed
    runs' layouts are removed, and on disk (the default, the system's temporary directory,
    refused where it is tmpfs: memory)."""
    directory = Path(tempfile.gettempdir() if given is None else given)
    check_directory(directory, "pack directory")
    if given is None and in_memory(directory):
        raise SolarError(f"pack directory: the default {directory} is tmpfs (memory, "
                         "not disk): name one on a node-local disk")  # fmt: skip
    remove_stale(directory, sanitise(socket.gethostname()), "solar-pack-")
    vfs = os.statvfs(directory)
    free = vfs.f_bavail * vfs.f_frsize
    if disk * local > free:
        each = "" if local == 1 else f" for each of {local} ranks on this machine"
        raise SolarError(f"pack disk: {format_bytes(disk)} asked{each}, {format_bytes(free)} "
                         f"free in {directory}")  # fmt: skip
    return directory


def _check_batch_format(batch_format: str) -> None:
    if batch_format not in ("dict", "pyg"):
        raise SolarError(f"batch_format must be 'dict' or 'pyg', got {batch_format!r}")
    if batch_format == "pyg":
        try:
            import torch_geometric.data  # noqa: F401
        except ImportError:
            raise SolarError("batch_format='pyg' needs torch_geometric "
                             "(pip install 'solar[pyg]')") from None  # fmt: skip


def _share(share: str, spec: PlanSpec, holds_transformed: bool, world: int, comm: Any,
           snapshots: bool = False, remote: bool = False) -> tuple[Hosts | None, Any]:  # fmt: skip
    """The ranks grouped by host (``SOLAR_HOSTS=HxL`` forces a grouping) and this rank's host
    communicator, for a node buffer; (None, None): a buffer per rank. ``"node"``: refused,
    in one line naming the parameter, where the node buffer does not run the configuration;
    ``"auto"``: a node buffer where it pays and runs (:func:`_auto_share`)."""
    # Every rank takes the same branch, and refuses alike: a rank with a buffer of its own
    # (or gone) would never join the host collectives the others' node buffer runs.
    agree(comm, share, "share")  # (one of SHARES: MemoryConfig checked it)
    if share == "rank":
        return None, None
    why = node_unsupported(spec, holds_transformed, world, comm, remote)
    if share == "auto":
        return _auto_share(spec, why, world, comm, snapshots)
    why = first_error(comm, why)  # (a rank's own arguments, e.g. its transform, may differ)
    if why:
        raise SolarError(f'share="node": {why}')
    where = place(comm)
    hosts = Hosts(where.groups)
    why = grouping_unsupported(spec, hosts, where, comm, snapshots)
    if why:
        raise SolarError(f'share="node": {why}')
    return hosts, host_comm(comm)  # (made here: every rank has agreed on a host buffer)


def grouping_unsupported(spec: PlanSpec, hosts: Hosts, where: Place, comm: Any,
                         snapshots: bool) -> str:  # fmt: skip
    """Why a node buffer does not run on hosts of different sizes, or "": the same on every
    rank (a collective there), whose ``snapshots`` may differ (rank 0 alone saves them)."""
    if hosts.uniform:  # (a function of the grouping: the same on every rank)
        return ""
    why = unequal_refusal(spec, hosts)  # the planner's own condition
    if not why and spec.buffer.tier:
        why = f"tier: hosts of different sizes ({hosts.as_record()}) run no node tier yet"
    if not why and snapshots:
        why = (f"snapshots: hosts of different sizes ({hosts.as_record()}) are not "
               "snapshotted yet")  # fmt: skip
    # A communicator per host (solar.host.place), not the job's (a comm that cannot split):
    # a host of one rank would skip the collectives the others' host communicators run.
    every = comm.allgather((why, where.split))
    why = next((w for w, _ in every if w), "")
    if not why and not all(s for _, s in every):
        why = ("comm: hosts of different sizes need a communicator per host (an mpi4py "
               "communicator or solar.dist.TorchComm)")  # fmt: skip
    return why


def node_unsupported(spec: PlanSpec, holds_transformed: bool, world: int, comm: Any,
                     remote: bool = False) -> str:  # fmt: skip
    """Why a node buffer does not run this configuration yet (the parameter first), or "":
    the one list of it (``share="node"`` refuses with it, ``"auto"`` falls back per rank).
    (A plan file decides before: its kind is the share: open_given.) ``remote``: the
    transform's preprocessing workers (solar/remote) share a rank's steps, not a host's."""
    if remote:
        return ("transform remote=: not with a buffer per host yet: pass "
                "MemoryConfig(share='rank') or no remote")  # fmt: skip
    if holds_transformed:
        return ("transform: a deterministic transform's rows held transformed are not shared "
                "yet (Transform(deterministic=False) holds raw rows)")  # fmt: skip
    if world > 1 and comm is None:
        return "comm: the ranks of a host synchronise every step (pass comm=)"
    if world > 1:
        why = threads_unsupported(comm)  # (its planning thread's exchange: solar.host.exchange)
        if why:
            return f"comm: {why}"
    return ""


def _auto_share(spec: PlanSpec, why: str, world: int, comm: Any,
                snapshots: bool = False) -> tuple[Hosts | None, Any]:  # fmt: skip
    """``share="auto"``: a node buffer where more than one rank of the job runs on a host,
    the ranks' accesses can overlap (a sampler that fixes each rank's batch: a GNN's
    ``NeighborSampler``, ``Trace``, ``Weighted(affinity=False)``; Shuffle's do not, whatever
    the buffer), planned by the solar policy (a baseline policy stays what it is compared
    as) and every rank's configuration runs in one (``why`` this rank's reason not); decided
    alike on every rank. Else a buffer per rank, as with ``share="rank"``."""
    overlap = spec.traced and not spec.affinity and spec.policy == "solar"
    if world <= 1 or comm is None or not overlap:
        return None, None
    where = place(comm)  # (memoised: configure placed the rank first)
    if len(where.groups) == world:  # one rank per host
        return None, None
    try:
        hosts = Hosts(where.groups)
    except SolarError:  # a grouping the node planner does not take (the same on every rank)
        return None, None
    if any(comm.allgather(why)):  # a rank's own arguments may differ: all fall back alike
        return None, None
    if grouping_unsupported(spec, hosts, where, comm, snapshots):
        return None, None
    return hosts, host_comm(comm)  # (made here: every rank has agreed on a host buffer)


def _reader_config(info: DatasetInfo, config: ReaderConfig) -> ReaderConfig:
    import torch

    for k in info.keys:
        torch_dtype(k)
    if config.pin_memory and not torch.cuda.is_available():
        warnings.warn("pin_memory=True but no accelerator: not pinning", stacklevel=5)
        config = dataclasses.replace(config, pin_memory=False)
    return config


def _direct_by_default(info: DatasetInfo, sampler: Any) -> bool:
    """O_DIRECT where the sampler's ``direct_by_default`` asks it (a neighbour sampler's
    feature rows: the plan's buffer is their only cache, as every GNN figure of
    docs/performance.md is measured) and the file system takes it; else the page cache
    (samples: ``solar bench`` evicts their pages each epoch)."""
    if not getattr(sampler, "direct_by_default", False) or info.one_per_file:
        return False
    try:
        os.close(open_descriptor(info.all_files[0], os.O_RDONLY, o_direct=True))
    except SolarError:  # NoDirectIO (tmpfs, some overlays), or the file cannot be opened
        return False
    return True


def _buffer(info: DatasetInfo, world: int, buffer: int | str, tier: str | os.PathLike | None,
            tier_size: int | str, slack: float, local: int = 1) -> BufferConfig:  # fmt: skip
    """Per-rank capacities from sizes in the one grammar (solar/config.py): samples and bytes
    per rank, a share of the dataset over the ``world`` ranks (``local`` of them here)."""
    n, each = info.num_samples, info.sample_bytes
    capacity = parse_size(buffer, sample_bytes=each, num_samples=n, world_size=world)
    check_budget(min(capacity, n), each, local)
    tier_capacity = parse_size(
        tier_size, sample_bytes=each, name="tier_size", num_samples=n, world_size=world
    )
    if (tier is None) != (tier_capacity == 0):
        raise SolarError(
            "a second tier needs both tier=<directory> and tier_size > 0 "
            f"(got tier={tier!r}, tier_size={tier_size!r})"
        )
    return BufferConfig(capacity, slack, tier_capacity)


def open_given(plan: Any, share: str) -> Plan | None:
    """The plan a Loader is given (None, a plan, or a file opened) of the grouping its
    ``share`` runs: per rank, or per host (``"node"``); one line refusing the other
    (``"auto"`` takes either: the plan's grouping decides)."""
    in_file = isinstance(plan, (str, os.PathLike))
    got = load_plan(plan) if in_file else plan
    where = f"plan {plan}" if in_file else "plan"
    if share == "node" and got is not None and got.hosts is None:
        raise SolarError(f'{where}: a per-rank plan (a buffer per rank); share="node" runs a '
                         "node plan file (`solar plan --share node -o FILE`)")  # fmt: skip
    if share == "rank" and got is not None and got.hosts is not None:
        raise SolarError(
            f"{where}: {'a node plan file' if in_file else 'grouped by host'} (one buffer "
            'per host): pass memory=MemoryConfig(share="node"), '
            "or plan the run per rank (`solar plan` without --share node)"
        )
    return got


def _equal_batches(equal: bool | None, made: Plan | None, sampler: Sampler,
                   buf: BufferConfig, policy: str, world: int, comm: Any) -> bool:  # fmt: skip
    """Whether every rank's batch is ``batch_size`` rows each step: as asked; a given plan's
    choice; by default (None), as a DataLoader's, wherever ranks can exchange rows (several
    ranks, a communicator, the Shuffle sampler). A sampler whose batches the planner splits
    unevenly (slack > 0) is said so here, once."""
    if equal is None and made is not None:
        equal = made.spec.equal_batches
    if equal is None:
        equal = comm is not None and equal_by_default(world, sampler)
        traced = not is_shuffle(sampler)
        uneven = world > 1 and traced and sampler.affinity and policy == "solar" and buf.slack > 0
        if uneven:
            warnings.warn(
                f"{type(sampler).__name__}(affinity=True): local batches vary in size "
                f"(slack {buf.slack}); weigh the loss with solar.dist.scale_loss(loss_sum, "
                "loader), or pass PlanningConfig(slack=0) for equal ones", stacklevel=5,
            )  # fmt: skip
        elif not equal and equal_by_default(world, sampler) and detect_launcher().world_size > 1:
            warnings.warn(
                f"rank/world_size given without comm in a job of several ranks: local batches "
                f"vary in size (slack {buf.slack}); pass comm= for equal ones, or weigh the "
                "loss with solar.dist.scale_loss(loss_sum, loader)", stacklevel=5,
            )  # fmt: skip
    if equal and world > 1 and comm is None:
        raise SolarError("equal_batches: the ranks exchange rows, pass comm=")
    return bool(equal)


def _run(info: DatasetInfo, sampler: Sampler, world: int, batch_size: int | None, epochs: int,
         seed: int, drop_last: bool) -> RunConfig:  # fmt: skip
    if batch_size is None:  # a sampler that knows its batch (NeighborSampler) gives it
        batch_size = getattr(sampler, "batch_size", None)
        if batch_size is None:
            raise SolarError("Loader needs batch_size (this sampler has none)")
    return sampler_run(sampler, info.num_samples, world, batch_size, epochs, seed, drop_last)


def check_snapshots(snapshots: str | os.PathLike | None) -> None:
    """Refuse a snapshots argument that is not a directory."""
    if snapshots is not None and not Path(snapshots).is_dir():
        raise SolarError(f"snapshots: {snapshots} is not a directory")


def rank_and_world(comm: Any, rank: int | None, world_size: int | None) -> tuple[int, int]:
    """This rank and the world size: ``comm``'s, or as given (default one rank)."""
    if comm is not None:
        r, w = comm.Get_rank(), comm.Get_size()
        if (rank is not None and rank != r) or (world_size is not None and world_size != w):
            raise SolarError(f"rank/world_size {rank}/{world_size} disagree with comm's {r}/{w}")
        return r, w
    w = 1 if world_size is None else world_size
    r = 0 if rank is None else rank
    if not (isinstance(w, int) and w > 0 and isinstance(r, int) and 0 <= r < w):
        raise SolarError(f"rank {r} is not within world_size {w}")
    return r, w


def page_layout(info: DatasetInfo) -> PageLayout | None:
    """Where the rows lie, if a page read brings other rows along (solar.schedule.draw.pagemates):
    one file and one contiguous key of rows at most half a page. Else None."""
    if len(info.all_files) != 1 or len(info.keys) != 1 or info.one_per_file:
        return None
    offset = -1 if info.stored is None else int(info.stored.offsets[0, 0])
    row_bytes = info.keys[0].row_bytes
    if offset < 0 or not PageLayout.worth_it(row_bytes):
        return None
    return PageLayout(offset, row_bytes)


def agree_on_plan(
    spec: PlanSpec,
    made: Plan | None,
    source: str,
    pages: PageLayout | None,
    page_mates: bool,
    holds_transformed: bool,
    comm: Any,
) -> tuple[PlanSpec, Plan | None]:
    """The plan's inputs and the plan given (``made``, from ``source``), bound to them; the
    same on every rank, or none goes on. ``pages``: the data's page layout (None: rows share
    no pages worth keeping)."""
    if made is None:
        # Side rows are stored raw: not where the buffer holds transformed rows.
        if page_mates and pages is not None and not holds_transformed and spec.plans_page_mates:
            spec = dataclasses.replace(spec, pages=pages)
    else:
        made.check(spec, source=source)  # everything but the plan's choices must match
        # Page mates too are the plan's choice, if they are this data's and stored raw.
        kept = made.spec.pages
        if kept is not None and holds_transformed:
            raise SolarError(f"{source}: it keeps page mates, stored raw; this loader's "
                             "deterministic transform holds transformed rows")  # fmt: skip
        if kept is not None and kept != pages:
            where = "share no pages" if pages is None else f"lie at {pages.as_record()}"
            raise SolarError(f"{source}: it keeps page mates of rows at "
                             f"{kept.as_record()} (offset, row bytes, page); this data's "
                             f"rows {where}")  # fmt: skip
        made = made.bound_to(spec)  # a file's plan, proven against this loader's sampler
    # The same inputs and the same plan file (its header) on every rank, or none goes on.
    agree(comm, (spec.fingerprint, made.header if made is not None else None), "the plan")
    return spec, made


def _output_keys(fn: Transform, info: DatasetInfo, reader: Reader,
                 seed: int) -> tuple[KeyInfo, ...]:  # fmt: skip
    """The transform's output keys: declared, or those of its call on sample 0."""
    if fn.out is not None:
        keys = output_keys(fn.out, "transform out=", declared=True)
    else:
        first = np.zeros(1, np.int64)
        raw = [np.empty((1, *k.sample_shape), k.native_dtype) for k in info.keys]
        reader.read(first, raw, first)
        keys = first_outputs(fn.fn, seed, info.keys, raw)
    for k in keys:
        torch_dtype(k)
    return keys


def check_batch_memory(
    spec: PlanSpec,
    config: ReaderConfig,
    sample_bytes: int,
    transform: Transform | None = None,
    out_bytes: int = 0,
    held_bytes: int | None = None,
    ranks: int = 1,
) -> None:
    """Refuse a run whose buffer and batch memory exceed the memory available now. Batches in
    memory at once: those read ahead, the one served and the one the trainer holds, each as
    long as the sampler's largest (a neighbour sampler's subgraph, not its seeds); with a
    ``transform``, also those transformed ahead, each with its transformed rows
    (``out_bytes`` a row), and the buffer holding ``held_bytes`` rows; with transform
    processes the batches live in /dev/shm, whose free space is checked too."""
    run = spec.run
    rows = spec.buffer.cap(run.batch_size)
    if spec.traced:
        rows = max(rows, spec.sampler.batch_bound(run))
    sets = config.read_ahead_steps(run.batch_size) + 2
    if transform is not None:
        sets += transform.ahead
    held = sample_bytes if held_bytes is None else held_bytes
    # Raw rows with room for a step's side rows (page mates); transformed rows without.
    batches = sets * (spec.batch_rows(rows) * sample_bytes + rows * out_bytes)
    require_memory(
        spec.slots * held + batches,
        f"buffer and batches: {spec.slots} buffer rows + {sets} batches of up to "
        f"{spec.batch_rows(rows)} rows, {sample_bytes} B each"
        + (f", and {rows} transformed rows of {out_bytes} B" if out_bytes else "")
        + (f" (buffer rows {held} B)" if held_bytes else ""),
        ranks,
    )
