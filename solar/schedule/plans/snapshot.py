"""Planner snapshots: the planner's state at an epoch boundary in a small file, so that a resume
replans from the last boundary saved instead of from epoch 0.

A snapshot keeps what the order cannot give back: the sample in each of every rank's cells and
the layout of the heaps, O(P·(C + D)) (8 MB where the run has 10^9 accesses). The keys are next
uses and who holds what is in the cells, so both are recomputed. A snapshot is untrusted: it is
used only if its checksum, names, shapes, ranges, the uniqueness of its samples and the heap
order under the recomputed keys all hold (else a warning, and the planner replans from epoch 0),
so a planner restored from one makes exactly the decisions of the run that saved it.

A host planner's (one buffer per host, solar/schedule/keep/hostplan.py) is the same file of its host
planner's state, named for the run (the per-rank spec's fingerprint) and carrying the grouping
of the ranks by host it was planned for: a snapshot of another grouping is refused in one
warning line (and the planner replans from epoch 0), whatever the sampler (a grouping changes a
host's union of accesses).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from solar._atomic import atomic_path
from solar.errors import SolarError
from solar.schedule.keep.grouping import Hosts
from solar.schedule.keep.planner import Planner
from solar.schedule.spec import PlanSpec

if TYPE_CHECKING:  # the host planner is passed in: per-rank snapshots need none of it
    from solar.schedule.keep.hostplan import HostPlanner


class Restorable(Protocol):
    """What a snapshot is taken of and restored into: a :class:`Planner`, or the planners of
    a host buffer's parts (solar/schedule/keep/hostplan.py)."""

    spec: PlanSpec

    @property
    def epoch(self) -> int: ...

    def snapshot(self) -> dict[str, np.ndarray] | None: ...

    def restore(self, epoch: int, state: dict[str, np.ndarray]) -> None: ...


FORMAT = "solar-planner-snapshot"
VERSION = 1
KEEP = 3  # the newest snapshots kept (the planner runs an epoch ahead of the trainer) ...
EVERY = 10  # ... and those of every 10th epoch: a resume from an older state replays < 10


def _name(fingerprint: str, epoch: int, kind: str = "planner") -> str:
    return f"solar-{kind}-{fingerprint[:16]}-e{epoch}.npz"


def _epochs(directory: Path, fingerprint: str, kind: str = "planner") -> list[int]:
    """Epochs of this plan's snapshots in ``directory``, newest first."""
    pattern = re.compile(rf"solar-{kind}-{re.escape(fingerprint[:16])}-e(\d+)\.npz")
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    found = (pattern.fullmatch(n) for n in names)
    return sorted((int(m.group(1)) for m in found if m), reverse=True)


def _digest(meta: str, arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256(meta.encode())
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}:{a.dtype.str}:{a.shape}".encode())
        h.update(a.data)
    return h.hexdigest()


def save_or_warn(save: Callable[[], object], what: str) -> None:
    """Run ``save`` (a snapshot's, in the planning thread); a failure is one warning naming
    ``what``: a resume then replans from further back, that's all."""
    try:
        save()
    except (OSError, SolarError) as exc:
        warnings.warn(f"{what} not saved: {exc}", stacklevel=2)


def _identity(spec: PlanSpec, hosts: Hosts | None) -> tuple[str, str, dict]:
    """The key and kind naming a snapshot file of ``spec``'s run (grouped by ``hosts``), and
    what its header adds: a host planner's run and grouping."""
    if hosts is None:
        return spec.fingerprint, "planner", {}
    return spec.fingerprint, "nodeplanner", {"hosts": hosts.as_record(), "run": spec.fingerprint}


def save(directory: str | os.PathLike, planner: Planner | HostPlanner) -> Path | None:
    """Write ``planner``'s state before its next epoch into ``directory`` (atomically) and drop
    this plan's older snapshots; None if its policy keeps no state worth saving. A planner
    must plan every rank (a node planner every host): a snapshot holds all their state."""
    state_of: Restorable
    if not isinstance(planner, Planner):
        if planner.only_host is not None:
            raise ValueError("a host snapshot holds every host's state: plan them all")
        key, kind, extra = _identity(planner.spec, planner.hosts)
        state_of = planner.planner
    else:
        if planner.only_rank is not None:  # (its policy keeps that rank's cells alone)
            raise ValueError("a snapshot holds every rank's state: plan them all")
        key, kind, extra = _identity(planner.spec, None)
        state_of = planner
    state = state_of.snapshot()
    if state is None or not 0 < state_of.epoch < state_of.spec.run.epochs:
        return None  # nothing is replanned from before epoch 0 or after the last
    directory, fp = Path(directory), state_of.spec.fingerprint
    meta = json.dumps({"format": FORMAT, "version": VERSION, "fingerprint": fp,
                       "epoch": state_of.epoch, **extra}, sort_keys=True)  # fmt: skip
    path = directory / _name(key, state_of.epoch, kind)
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        arrays: dict[str, Any] = {"meta": np.array(meta), "digest": np.array(_digest(meta, state))}
        arrays.update(state)
        np.savez(f, **arrays)
    for old in _epochs(directory, key, kind)[KEEP:]:
        if old % EVERY == 0:
            continue
        with contextlib.suppress(FileNotFoundError):  # another process was first
            os.unlink(directory / _name(key, old, kind))
    return path


def load(directory: str | os.PathLike, spec: PlanSpec, epoch: int, after: int = -1,
         hosts: Hosts | None = None,
         node: Callable[[], HostPlanner] | None = None) -> Any:  # fmt: skip
    """A planner for ``spec`` (with ``hosts``: the host planner ``node()`` makes of its run
    over them, planning every host) restored from its newest valid snapshot in ``directory``
    taken at an epoch at or before ``epoch`` and after ``after`` (a planner already there
    needs none older); None if there is none. A snapshot refused is named in a warning and
    skipped."""
    made: Any = None
    key, kind, extra = _identity(spec, hosts)
    for e in _epochs(Path(directory), key, kind):
        if e > epoch or e <= after:
            continue
        # A refused restore leaves it as it was.
        if hosts is not None and node is None:
            raise ValueError("a host snapshot is restored into a host planner: give node=")
        made = made or (Planner(spec) if node is None else node())
        into: Restorable = made if hosts is None else made.planner
        state = into.snapshot()
        if state is None:
            return None
        # What the file may hold, uncompressed: the arrays a snapshot has, and a header.
        limit = sum(a.nbytes for a in state.values()) + 2**16
        path = Path(directory) / _name(key, e, kind)
        try:
            into.restore(e, _read(path, into.spec.fingerprint, e, limit, extra))
            return made
        except Exception as exc:  # untrusted bytes: any failure means "not this one"
            warnings.warn(f"{path}: planner snapshot refused ({exc})", stacklevel=2)
    return None


def _read(path: Path, fingerprint: str, epoch: int, limit: int,
          extra: dict) -> dict[str, np.ndarray]:  # fmt: skip
    with np.load(path, allow_pickle=False) as z:
        size = sum(info.file_size for info in z.zip.infolist())
        if size > limit:  # refused before anything is inflated into memory
            raise ValueError(f"{size} bytes uncompressed, more than a snapshot's {limit}")
        arrays = {name: z[name] for name in z.files}
    meta, digest = str(arrays.pop("meta", "")), str(arrays.pop("digest", ""))
    if _digest(meta, arrays) != digest:
        raise ValueError("checksum mismatch")
    info = json.loads(meta)
    for name, value in extra.items():  # what the reader needs named first (the grouping)
        if isinstance(info, dict) and info.get(name) != value:
            raise ValueError(f"saved with {name} {info.get(name)}, this run has {value}")
    want = {"format": FORMAT, "version": VERSION, "fingerprint": fingerprint, "epoch": epoch,
            **extra}  # fmt: skip
    if info != want:
        raise ValueError(f"header {info} is not {want}")
    return arrays
