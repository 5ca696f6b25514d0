"""Many files at a glance (``solar inspect DIR``): their keys and layouts grouped, what solar
will do with them, and the one conversion worth running, if any.

Built from :func:`solar.io.inspect.inspect_files`' per-dataset reports. One-sample files are
recognised as such without ``--one-per-file`` when each file's keys disagree in their first
dimension (an image of 64 rows beside a label of 3 values), when a key is a scalar, or when
many files hold at most a few rows each (the loader's own warning): the advice is then the
conversion with ``--one-per-file``. No conversion is advised that would fail (keys missing
from some files, a key's shape or dtype differing between files) or that changes nothing
solar does (alignment matters only to O_DIRECT reads, which are opt-in for sample files).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from solar._units import format_bytes
from solar.io.inspect import OFFSET_READS, DatasetReport, shape_text

# Many files of at most this many rows each look like one sample per file (as
# solar.io.hdf5.describe warns).
_FEW_ROWS, _MANY_FILES = 4, 8


@dataclass
class KeyGroup:
    """The datasets of one key that share a sample shape, dtype, layout and read path."""

    key: str
    shape: tuple[int, ...]  # of a sample (one file's whole dataset, one sample per file)
    dtype: str
    layout: str  # "contiguous", "chunked, 1 sample/chunk, deflate level 4", ...
    read_path: str  # "offset", "chunks", "h5py", or "" (one sample per file)
    files: int
    samples: int
    logical_bytes: int
    stored_bytes: int


@dataclass
class Overview:
    """What ``solar inspect`` prints first: see the module's docstring."""

    sources: list[str]  # the paths as given
    files: int
    kind: str  # what the files are: "HDF5", ".npy" or "HDF5 and .npy"
    keys: list[str]
    one_per_file: bool  # given
    looks_one_per_file: bool  # recognised, not given
    samples: int | None  # None where the keys disagree
    sample_bytes: int
    groups: list[KeyGroup]
    will: list[str] = field(default_factory=list)  # what solar does with them
    problems: list[str] = field(default_factory=list)  # what stops or slows it
    convert: str | None = None  # the one command worth running
    convert_why: str = ""
    blocked: str = ""  # why no conversion can run as they are

    def as_dict(self) -> dict:
        """The overview as JSON-ready values."""
        return asdict(self)


def overview(
    sources: Sequence[str],
    files: Sequence[Path],
    reports: list[DatasetReport],
    one_per_file: bool,
    keys: list[str],
) -> Overview:
    """Summarise ``reports`` of ``files`` (from ``sources`` as given on the command line)."""
    names = list(dict.fromkeys(r.name for r in reports))
    by_file: dict[str, list[DatasetReport]] = {}
    for r in reports:
        by_file.setdefault(r.file, []).append(r)
    looks = not one_per_file and _looks_one_per_file(by_file)
    per_file = one_per_file or looks
    groups = _groups(reports, per_file)
    o = Overview(
        sources=list(sources), files=len(files), kind=_kind(files), keys=names,
        one_per_file=one_per_file, looks_one_per_file=looks, samples=None, sample_bytes=0,
        groups=groups,
    )  # fmt: skip
    _problems(o, by_file, per_file)
    totals = {g.key: 0 for g in groups if _servable(g)}
    for g in groups:
        if _servable(g):
            totals[g.key] += g.samples
    if len(set(totals.values())) == 1 and not o.blocked:
        o.samples = next(iter(totals.values()))
    o.sample_bytes = sum(
        {g.key: _nbytes(g) for g in groups if _servable(g)}.values()
    )  # one shape per key where nothing is blocked
    _will(o, per_file)
    _conversion(o, reports, per_file, keys)
    return o


def _kind(files: Sequence[Path]) -> str:
    npy = sum(Path(f).suffix == ".npy" for f in files)
    return "HDF5" if npy == 0 else ".npy" if npy == len(files) else "HDF5 and .npy"


def _nbytes(g: KeyGroup) -> int:
    import numpy as np

    return int(np.prod(g.shape, dtype=np.int64)) * np.dtype(g.dtype).itemsize


def _servable(g: KeyGroup | DatasetReport) -> bool:
    """An array of numbers with values: what solar can serve."""
    return _numeric(g.dtype) and g.layout != "empty"


def _numeric(dtype: str) -> bool:
    import numpy as np

    try:
        d = np.dtype(dtype)
    except TypeError:
        return False
    return d.kind in "biufc" and d.fields is None


def _looks_one_per_file(by_file: dict[str, list[DatasetReport]]) -> bool:
    """Whether the files look like one sample each (see the module's docstring)."""
    if not by_file:
        return False
    by_file = {f: [r for r in rs if _servable(r)] for f, rs in by_file.items()}
    if any(not r.shape for rs in by_file.values() for r in rs):  # a scalar: no axis of samples
        return True
    firsts = [[r.shape[0] for r in rs] for rs in by_file.values() if rs]
    if not firsts:
        return False
    if all(len(set(f)) > 1 for f in firsts):  # every file's keys disagree
        return True
    return len(by_file) > _MANY_FILES and max(max(f) for f in firsts) <= _FEW_ROWS


def _layout(r: DatasetReport, per_file: bool) -> str:
    text = r.layout
    if r.layout == "chunked" and r.chunks and not per_file:
        rows = r.chunks[0]
        text += f", {rows} sample{'s' if rows != 1 else ''}/chunk"
        if len(r.chunks) > 1 and tuple(r.chunks[1:]) != tuple(r.shape[1:]):
            text += " (a sample spans chunks)"
    if r.filters:
        text += ", " + ", ".join(r.filters)
    if r.layout == "contiguous" and r.offset is None:
        text += " (never written)"
    return text


def _groups(reports: list[DatasetReport], per_file: bool) -> list[KeyGroup]:
    groups: dict[tuple, KeyGroup] = {}
    for r in reports:
        shape = r.shape if per_file else r.shape[1:]
        layout = _layout(r, per_file)
        k = (r.name, shape, r.dtype, layout, r.read_path)
        g = groups.get(k)
        if g is None:
            g = groups[k] = KeyGroup(r.name, shape, r.dtype, layout, r.read_path, 0, 0, 0, 0)
        g.files += 1
        g.samples += 1 if per_file else (r.shape[0] if r.shape else 0)
        g.logical_bytes += r.logical_bytes
        g.stored_bytes += r.stored_bytes
    return list(groups.values())


def _problems(o: Overview, by_file: dict[str, list[DatasetReport]], per_file: bool) -> None:
    """What stops solar serving the files together (``blocked``) or slows it."""
    for key in o.keys:
        mine = [g for g in o.groups if g.key == key]
        have = sum(g.files for g in mine)
        if have < o.files:
            o.problems.append(f"key {key!r} is in {have} of {o.files} files: solar needs every "
                              "key in every file (choose keys with --key)")  # fmt: skip
            o.blocked = o.blocked or f"key {key!r} is missing from some files"
        kinds = sorted({(g.shape, g.dtype) for g in mine})
        if len(kinds) > 1:
            count = {k: sum(g.files for g in mine if (g.shape, g.dtype) == k) for k in kinds}
            seen = ", ".join(f"{shape_text(s)} {d} in {count[s, d]}" for s, d in kinds)
            o.problems.append(f"key {key!r} holds samples of different shapes or dtypes ({seen} "
                              "files): solar serves one shape and dtype per key")  # fmt: skip
            o.blocked = o.blocked or f"key {key!r} differs between files"
        for g in mine:
            if not _servable(g):
                what = "an empty dataset" if g.layout == "empty" else f"{g.dtype}, not numbers"
                o.problems.append(f"key {key!r} is {what}: solar cannot serve it (leave it out "
                                  "with --key)")  # fmt: skip
                break
    if not per_file and not o.blocked:  # (a missing key already says why)
        totals: dict[str, int] = {}
        for g in o.groups:
            if _servable(g):
                totals[g.key] = totals.get(g.key, 0) + g.samples
        if len(set(totals.values())) > 1:
            seen = ", ".join(f"{k} {n}" for k, n in totals.items())
            o.problems.append(f"the keys hold different numbers of samples ({seen})")
            o.blocked = o.blocked or "the keys hold different numbers of samples"


def _will(o: Overview, per_file: bool) -> None:
    """What solar does with the files, by read path."""
    numeric = [g for g in o.groups if _servable(g)]
    if o.looks_one_per_file:
        firsts = ", ".join(
            f"{g.key} {g.shape[0] if g.shape else 'scalar'}"
            for g in {g.key: g for g in numeric}.values()
        )
        why = (
            "a scalar has no axis of samples"
            if any(not g.shape for g in numeric)
            else "the keys' sample counts disagree"
        )
        o.will.append(f"each file looks like one sample (first dimensions: {firsts}): as they "
                      f"are, solar refuses them ({why}); with --one-per-file it serves "
                      "them")  # fmt: skip
    if per_file:
        slow = sorted({g.key for g in numeric if g.layout != "contiguous"})
        o.will.append(
            f"with one sample per file: {o.files} sample{'s' if o.files != 1 else ''} of "
            f"{format_bytes(o.sample_bytes)}, "
            "each opening its file and reading every key (no read spans two samples)"
            + (f"; {', '.join(slow)} through h5py ({numeric[0].layout})" if slow else "")
        )
        return
    by_path: dict[str, list[str]] = {}
    for g in numeric:
        keys = by_path.setdefault(g.read_path, [])
        if g.key not in keys:
            keys.append(g.key)
    text = {
        "offset": f"at byte offsets: {OFFSET_READS}",
        "chunks": "by chunks, decoded by solar in parallel (a random sample reads its chunk)",
        "h5py": "through h5py, one call at a time",
    }
    for path, keys in by_path.items():
        o.will.append(f"read {', '.join(keys)} {text.get(path, path)}")


def _conversion(o: Overview, reports: list[DatasetReport], per_file: bool,
                keys: list[str]) -> None:  # fmt: skip
    """The one ``solar convert`` worth running, if any (none that would fail)."""
    if o.blocked:
        return
    numeric = list(dict.fromkeys(g.key for g in o.groups if _servable(g)))
    if not numeric:
        o.blocked = "no key is an array of numbers"
        return
    slow = [
        r
        for r in reports
        if r.name in numeric and (r.read_path in ("chunks", "h5py") or r.compressed)
    ]
    why = []
    if per_file and o.files > 1:
        why.append(f"one file of {o.files} samples: a batch's samples read in coalesced "
                   "spans, not one open and read per key per sample")  # fmt: skip
    elif slow:
        reasons = sorted({_why_slow(r) for r in slow})
        why.append(
            "contiguous and uncompressed, every sample read at its offset; now "
            + "; ".join(reasons)
        )
    if not why:
        return
    cmd = ["solar", "convert", *o.sources, "OUT.h5"]
    chosen = keys or (numeric if len(numeric) < len(o.keys) else [])
    for k in chosen:
        cmd += ["--key", k]
    if per_file:
        cmd.append("--one-per-file")
    o.convert = " ".join(shlex.quote(c) for c in cmd)
    o.convert_why = why[0]


def _why_slow(r: DatasetReport) -> str:
    if r.compressed:
        return f"{r.name} compressed with {', '.join(r.filters)}"
    if r.read_path == "h5py":
        return f"{r.name} read through h5py"
    if r.chunks and r.chunks[0] > 1:
        return f"{r.name}: {r.chunks[0]} samples per chunk"
    return f"{r.name} chunked"


def format_overview(o: Overview, verbose: bool = False) -> str:
    """The overview as a few lines of text: a table of keys, then what solar does."""
    per_file = o.one_per_file or o.looks_one_per_file
    where = " ".join(o.sources)
    head = f"{where}: {o.files} {o.kind} file{'s' if o.files != 1 else ''}"
    if o.samples is not None and not o.looks_one_per_file:
        head += f", {o.samples:,} samples of {format_bytes(o.sample_bytes)}"
        head += " (one per file)" if o.one_per_file else ""
    lines = [head]
    shape_head = "shape in each file" if per_file else "sample shape"
    rows: list[tuple[str, ...]] = [
        ("key", "samples", shape_head, "dtype", "layout", "files", "size")
    ]
    for g in o.groups:
        size = format_bytes(g.logical_bytes)
        if g.stored_bytes != g.logical_bytes:
            size += f" ({format_bytes(g.stored_bytes)} stored)"
        rows.append((g.key, f"{g.samples:,}", shape_text(g.shape), g.dtype, g.layout,
                     f"{g.files:,}", size))  # fmt: skip
    drop = {1} if per_file else set()  # samples = files
    drop |= {5} if o.files == 1 else set()
    rows = [tuple(c for i, c in enumerate(r) if i not in drop) for r in rows]
    width = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(r, width, strict=True)).rstrip())
    for w in o.will:
        lines.append(f"solar will {w}" if w.startswith("read ") else w)
    lines.extend(f"- {p}" for p in o.problems)
    if o.convert:
        lines.append(f"to run: {o.convert}")
        lines.append(f"  ({o.convert_why})")
    elif o.blocked:
        lines.append(f"no conversion runs on these as they are: {o.blocked}")
    else:
        lines.append("nothing to convert")
    if not verbose:
        lines.append("per-file detail: --verbose")
    return "\n".join(lines)
