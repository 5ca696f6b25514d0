"""What a graph file holds and how solar serves it (``solar inspect G.h5``).

A graph file is an HDF5 file with the CSR datasets ``indptr`` and ``indices`` (as ``solar gen
--preset graph`` writes it, :mod:`solar.graph.csr`), node ``features`` and optionally
``labels`` and ``train_idx``. Its degrees are counted in blocks of ``indptr`` (bounded
memory whatever the graph's size); nothing else of the topology is read.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

from solar._units import format_bytes
from solar.errors import SolarError
from solar.io.inspect import DatasetReport, inspect_files

_BLOCK = 1 << 22  # indptr entries read at a time
_PAGE = 4096


def is_graph_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` is an HDF5 file holding a CSR topology (1-D ``indptr`` and
    ``indices``). False for anything else, unreadable files included: the command that
    reads it then names the problem."""
    try:
        if not Path(path).is_file() or not h5py.is_hdf5(path):
            return False
        with h5py.File(path, "r") as f:
            return all(
                isinstance(f.get(k), h5py.Dataset) and f[k].ndim == 1 for k in ("indptr", "indices")
            )
    except (OSError, RuntimeError, KeyError, ValueError, TypeError):
        return False


@dataclass
class GraphReport:
    """A graph file at a glance: its size, degrees, features and what solar does with it."""

    file: str
    nodes: int
    edges: int  # entries of ``indices``: a symmetric graph stores each edge both ways
    degree_min: int
    degree_mean: float
    degree_max: int
    isolated: int  # nodes without neighbours
    features: DatasetReport | None
    classes: int | None  # labels 0..classes-1
    train: int | None  # nodes of the training split (the seeds)
    notes: list[str] = field(default_factory=list)  # what to change, if anything

    def as_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["features"] = None if self.features is None else self.features.as_dict()
        return out


def describe_graph(path: str | os.PathLike, *, probe: int = 0) -> GraphReport:
    """Describe the graph file ``path`` (see the module's docstring)."""
    path = Path(path)
    with h5py.File(path, "r") as f:
        indptr, indices = f["indptr"], f["indices"]
        nodes, edges = indptr.shape[0] - 1, indices.shape[0]
        if nodes < 0:
            raise SolarError(f"{path}: indptr is empty (a CSR of N nodes has N + 1 entries)")
        lo_deg, hi_deg, isolated = np.iinfo(np.int64).max, 0, 0
        for lo in range(0, nodes, _BLOCK):
            deg = np.diff(indptr[lo : min(lo + _BLOCK, nodes) + 1].astype(np.int64))
            lo_deg, hi_deg = min(lo_deg, int(deg.min())), max(hi_deg, int(deg.max()))
            isolated += int(np.count_nonzero(deg == 0))
        classes = None
        if isinstance(f.get("labels"), h5py.Dataset) and f["labels"].size:
            labels = f["labels"]
            top = (int(labels[lo : lo + _BLOCK].max()) for lo in range(0, labels.shape[0], _BLOCK))
            classes = 1 + max(top)
        train = f["train_idx"].shape[0] if isinstance(f.get("train_idx"), h5py.Dataset) else None
        has_features = isinstance(f.get("features"), h5py.Dataset)
    features = None
    if has_features:
        (features,) = inspect_files([path], keys=["features"], probe=probe)
    report = GraphReport(
        file=str(path), nodes=nodes, edges=edges, degree_min=lo_deg if nodes else 0,
        degree_mean=edges / max(1, nodes), degree_max=hi_deg, isolated=isolated,
        features=features, classes=classes, train=train,
    )  # fmt: skip
    report.notes = _notes(report)
    return report


def _notes(g: GraphReport) -> list[str]:
    x = g.features
    if x is None:
        return ["no 'features' dataset: solar gathers node feature rows; pass the key that "
                "holds them (--key, NeighborSampler(features=...))"]  # fmt: skip
    out = []
    if x.shape[:1] != (g.nodes,):
        out.append(f"features have {x.shape[0] if x.shape else 0} rows for {g.nodes} nodes: "
                   "NeighborSampler refuses them")  # fmt: skip
    if not x.offset_reader:
        out.append(f"features are {x.layout}"
                   + (f" ({', '.join(x.filters)})" if x.filters else "")
                   + ": every gathered row reads its whole chunk; write them contiguous and "
                   "uncompressed for row-sized reads")  # fmt: skip
    elif not x.aligned:
        out.append(f"features start at offset {x.offset}, not on a 4 KiB page: O_DIRECT "
                   "gathers (a neighbour sampler's default) take a bounce "
                   "copy; write them page-aligned")  # fmt: skip
    if g.classes is None:
        out.append("no 'labels': batches carry no y")
    if g.train is None:
        out.append("no 'train_idx': every node is a seed each epoch")
    return out


def format_graph(g: GraphReport) -> str:
    """The report as a few lines of text."""
    lines = [
        f"{g.file}: a graph of {g.nodes:,} nodes and {g.edges:,} edges (CSR: indptr, indices)",
        f"  degree: min {g.degree_min}, mean {g.degree_mean:.1f}, max {g.degree_max:,}"
        + (f"; {g.isolated:,} nodes without neighbours" if g.isolated else ""),
    ]
    x = g.features
    if x is not None:
        per_page = _PAGE // x.sample_bytes if x.sample_bytes else 0
        where = (
            "contiguous, page-aligned"
            if x.offset_reader and x.aligned
            else "contiguous, not page-aligned"
            if x.offset_reader
            else x.layout + (f", {', '.join(x.filters)}" if x.filters else "")
        )
        shape = "×".join(map(str, x.shape[1:])) or "1"
        lines.append(
            f"  features: {shape} {x.dtype} per node, {format_bytes(x.sample_bytes)} rows "
            f"({format_bytes(x.logical_bytes)}), {where}"
            + (f"; {per_page} rows per 4 KiB page" if per_page > 1 else "")
        )
        if x.probe_us:
            probe = ", ".join(f"{k} {v:.0f} µs" for k, v in x.probe_us.items())
            lines.append(f"  random single-row read, cold: {probe}")
    split = []
    if g.classes is not None:
        split.append(f"labels: {g.classes} classes")
    if g.train is not None:
        share = 100 * g.train / max(1, g.nodes)
        split.append(f"training split: {g.train:,} seed nodes ({share:.1f} %)")
    if split:
        lines.append("  " + "; ".join(split))
    mates = x is not None and x.offset_reader and 0 < x.sample_bytes <= _PAGE // 2
    lines.append(
        "solar serves it with NeighborSampler: each step samples k-hop subgraphs around B seed "
        "nodes per rank and gathers their feature rows, planned ahead"
        + (" (page mates: rows sharing a page kept when read)" if mates else "")
    )
    run = "--sampler neighbor --fanouts 10,5 -B 1024 -E 3"
    lines.append(f"  solar plan {g.file} {run} -P 1 -C 10%")
    lines.append(f"  solar bench {g.file} {run}")
    lines.append(f'  Loader("{g.file}", ["features"], sampler=NeighborSampler("{g.file}", '
                 '(10, 5), 1024), epochs=3, buffer="10%")')  # fmt: skip
    lines.extend(f"- {n}" for n in g.notes)
    return "\n".join(lines)
