"""What a dataset's layout means for loading speed, and what to change (``solar inspect``)."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import h5py
import numpy as np

from solar._units import format_bytes
from solar.config import ReaderConfig
from solar.errors import SolarError
from solar.io.codecs import Decoder, decoder_for, pipeline
from solar.io.filters import FILTERS, describe_filter
from solar.io.fused import fused_codec
from solar.io.hdf5 import dataset_names, open_h5, read_path
from solar.io.npy import npy_header
from solar.io.pagecache import evict
from solar.io.sources import expand_sources

# How a dataset at a byte offset is read (this report's and the overview's one wording).
OFFSET_READS = ("preadv at computed offsets; through the page cache, rows at most a page apart "
                "in one call (the bytes between into a scratch page, never served)")  # fmt: skip

_ALIGN = 4096


@dataclass
class DatasetReport:
    """One dataset of one file, as ``solar inspect`` reports it."""

    file: str
    name: str
    shape: tuple[int, ...]
    dtype: str
    layout: str  # contiguous, chunked, compact, virtual, external
    chunks: tuple[int, ...] | None
    filters: list[str]  # each as solar/io/filters.py names it, e.g. "deflate level 4"
    compressed: bool  # some filter compresses (or is not in solar's filter table)
    offset: int | None
    aligned: bool | None  # offset on a 4 KiB boundary
    sample_bytes: int
    stored_bytes: int
    logical_bytes: int
    offset_reader: bool  # solar reads it with preadv at computed offsets
    read_path: str = ""  # how the Reader reads it: "offset", "chunks" (decoded by solar), "h5py"
    read_path_why: str = ""  # one line: why that path (e.g. the filter h5py must decode)
    advice: list[str] = field(default_factory=list)
    probe_us: dict[str, float] | None = None  # measured random single-sample read cost

    def as_dict(self) -> dict:
        """The report as JSON-ready values."""
        return asdict(self)


def inspect_files(
    paths: Sequence[str | os.PathLike],
    *,
    one_per_file: bool = False,
    probe: int = 0,
    keys: list[str] | None = None,
) -> list[DatasetReport]:
    """Report every dataset (or each of ``keys``) of every file; ``probe`` > 0 times that
    many random reads."""
    reports = []
    for path in expand_sources(paths):
        if Path(path).suffix == ".npy":
            reports.append(_npy_report(Path(path), (keys or ["data"])[0], one_per_file))
            continue
        try:
            with open_h5(path) as f:
                names = dataset_names(f)
                for key in keys or ():
                    if key not in names:
                        raise SolarError(f"{path}: no dataset key {key!r}")
                for name in keys or names:
                    reports.append(_report(path, f[name], one_per_file))
        except (RuntimeError, KeyError, ValueError, TypeError) as exc:
            raise SolarError(f"{path}: corrupt HDF5 file ({exc})") from None
    if probe:
        for r in reports:
            if r.shape and not one_per_file:
                solar = r.offset_reader or r.read_path == "chunks"
                r.probe_us = _probe(Path(r.file), r.name, r.shape[0], probe, solar)
    return reports


def _report(path: Path, d: h5py.Dataset, one_per_file: bool) -> DatasetReport:
    if d.shape is None:  # an empty dataset (H5S_NULL): no array at all
        return DatasetReport(
            file=str(path), name=d.name.lstrip("/"), shape=(), dtype=str(d.dtype),
            layout="empty", chunks=None, filters=[], compressed=False, offset=None,
            aligned=None, sample_bytes=0, stored_bytes=0, logical_bytes=0, offset_reader=False,
            advice=["an empty dataset (no values): solar cannot serve it"],
        )  # fmt: skip
    plist = d.id.get_create_plist()
    layout = {h5py.h5d.CONTIGUOUS: "contiguous", h5py.h5d.CHUNKED: "chunked",
              h5py.h5d.COMPACT: "compact"}.get(plist.get_layout(), "other")  # fmt: skip
    if d.is_virtual:
        layout = "virtual"
    elif plist.get_external_count() > 0:
        layout = "external"
    filters = pipeline(d)
    offset = d.id.get_offset() if layout == "contiguous" else None
    per_sample = d.shape if one_per_file else d.shape[1:]
    sample_bytes = int(np.prod(per_sample, dtype=np.int64)) * d.dtype.itemsize
    numeric = d.dtype.kind in "biufc" and d.dtype.fields is None
    report = DatasetReport(
        file=str(path),
        name=d.name.lstrip("/"),
        shape=tuple(d.shape),
        dtype=str(d.dtype),
        layout=layout,
        chunks=tuple(d.chunks) if d.chunks else None,
        filters=[describe_filter(filter_id, cd) for filter_id, _, cd, _ in filters],
        compressed=any(
            filter_id not in FILTERS or FILTERS[filter_id].compresses
            for filter_id, _, _, _ in filters
        ),
        offset=offset,
        aligned=None if offset is None else offset % _ALIGN == 0,
        sample_bytes=sample_bytes,
        stored_bytes=int(d.id.get_storage_size()),
        logical_bytes=int(d.size) * d.dtype.itemsize,
        offset_reader=offset is not None and numeric and d.dtype.isnative and d.ndim > 0,
    )
    if d.ndim > 0 and not one_per_file:
        report.read_path, report.read_path_why = read_path(d)
        if report.read_path == "chunks" and _fast_path(d):
            report.read_path_why += ", each sample's chunk read and decoded in one compiled call"
    report.advice = _advice(report, d, numeric, one_per_file)
    return report


def _npy_report(path: Path, key: str, one_per_file: bool) -> DatasetReport:
    """A .npy file as one contiguous dataset named ``key`` (solar/io/npy.py serves it at
    byte offsets after its header)."""
    shape, dtype, offset, size = npy_header(path)  # one line if it cannot be served
    per_sample = shape if one_per_file else shape[1:]
    logical = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    r = DatasetReport(
        file=str(path), name=key, shape=shape, dtype=str(dtype), layout="contiguous",
        chunks=None, filters=[], compressed=False, offset=offset,
        aligned=offset % _ALIGN == 0, sample_bytes=int(np.prod(per_sample, dtype=np.int64))
        * dtype.itemsize, stored_bytes=size - offset, logical_bytes=logical,
        offset_reader=len(shape) > 0,
    )  # fmt: skip
    if len(shape) == 0 and not one_per_file:
        r.advice = ["a scalar: not an array of samples (use --one-per-file if each file is a "
                    "sample)"]  # fmt: skip
    else:
        r.read_path, r.read_path_why = "offset", ".npy: the array follows its header"
        r.advice = [f"served at byte offsets: {OFFSET_READS}"]
    return r


def _fast_path(d: h5py.Dataset) -> bool:
    """Whether the Reader takes solar/io/fused.py's fast path for this dataset's chunks."""
    decoder = decoder_for(d)
    return isinstance(decoder, Decoder) and fused_codec(decoder) is not None


def _advice(r: DatasetReport, d: h5py.Dataset, numeric: bool, one_per_file: bool) -> list[str]:
    out = []
    # (The conversion to run, for all the files at once, is the summary's: solar/io/overview.py.)
    convert = "`solar convert` rewrites it contiguous and uncompressed"
    if not numeric:
        return [f"dtype {r.dtype} is not an array of numbers: solar cannot serve it"]
    if d.ndim == 0:
        return ["a scalar: not an array of samples (use --one-per-file if each file is a sample)"]
    if r.layout == "contiguous" and r.offset is None:
        out.append("never written: reads return the fill value")
    elif r.offset_reader:
        out.append(f"served at byte offsets: {OFFSET_READS}")
        # Alignment changes nothing through the page cache: only O_DIRECT reads (direct_io=True)
        # take a bounce copy of an unaligned dataset, and that is a fact, not advice, here.
    if r.layout == "chunked" and r.chunks:
        rows = 1 if one_per_file else r.chunks[0]
        if rows == 1 and not one_per_file:
            out.append(f"one sample per chunk: every read pays HDF5's per-chunk cost; {convert}")
        elif rows > 1:
            out.append(
                f"{rows} samples per chunk: a random sample reads its whole chunk "
                f"({rows}× the bytes); {convert}"
            )
        if len(r.chunks) > 1 and tuple(r.chunks[1:]) != tuple(d.shape[1:]):
            out.append("chunks also cut each sample: one sample spans several chunks")
    if r.compressed:
        if r.read_path == "chunks":
            how = "decoded in parallel"
        elif r.read_path_why:
            how = f"serialised in h5py ({r.read_path_why})"
        else:
            how = "serialised in h5py"
        out.append(
            f"compressed ({', '.join(r.filters)}): every read decompresses, {how}; "
            f"{convert} (needs {format_bytes(r.logical_bytes)} uncompressed)"
        )
    if not d.dtype.isnative and r.read_path != "chunks":
        out.append("non-native byte order: read through h5py with conversion; convert fixes it")
    if r.layout in ("virtual", "external"):
        out.append(f"{r.layout} dataset: read through h5py; {convert}")
    return out


def _probe(path: Path, name: str, n: int, count: int, with_solar: bool) -> dict[str, float]:
    """Mean µs per random single-sample read, cold (the file's pages evicted first)."""
    idx = random.Random(0).sample(range(n), min(count, n))
    out: dict[str, float] = {}
    evict(path)
    with h5py.File(path, "r") as f:
        d = f[name]
        t0 = time.perf_counter()
        for i in idx:
            d[i]
        out["h5py"] = 1e6 * (time.perf_counter() - t0) / len(idx)
    if with_solar:
        from solar.io.hdf5 import describe
        from solar.io.reader import Reader

        info = describe([path], [name])
        reader = Reader(info, ReaderConfig(threads=1))
        row = np.empty((1, *info.keys[0].sample_shape), info.keys[0].native_dtype)
        reader.read(np.array([idx[0]]), [row])  # compile and start the pool outside the timing
        evict(path)
        t0 = time.perf_counter()
        for i in idx:
            reader.read(np.array([i]), [row])
        out["solar"] = 1e6 * (time.perf_counter() - t0) / len(idx)
        reader.close()
    return out


def format_reports(reports: list[DatasetReport]) -> str:
    lines = []
    current = None
    for r in reports:
        if r.file != current:
            current = r.file
            lines.append(f"{r.file}")
        chunks = f", chunks {shape_text(r.chunks)}" if r.chunks else ""
        filters = f", {', '.join(r.filters)}" if r.filters else ""
        where = ""
        if r.offset is not None:
            aligned = "4 KiB aligned" if r.aligned else "not 4 KiB aligned: O_DIRECT bounces"
            where = f", offset {r.offset} ({aligned})"
        lines.append(
            f"  {r.name}: {shape_text(r.shape)} {r.dtype}, {r.layout}{chunks}{filters}{where}; "
            f"{format_bytes(r.sample_bytes)}/sample, {format_bytes(r.logical_bytes)} "
            f"({format_bytes(r.stored_bytes)} stored)"
        )
        if r.read_path:
            why = f" ({r.read_path_why})" if r.read_path_why else ""
            lines.append(f"    read path: {r.read_path}{why}")
        if r.probe_us:
            probe = ", ".join(f"{k} {v:.0f} µs" for k, v in r.probe_us.items())
            lines.append(f"    random single-sample read, cold: {probe}")
        for a in r.advice:
            lines.append(f"    - {a}")
    return "\n".join(lines)


def shape_text(shape: tuple[int, ...] | None) -> str:
    """A shape as people write it: ``64×64``; ``scalar`` for ()."""
    return "×".join(str(x) for x in shape) if shape else "scalar"
