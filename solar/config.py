"""Frozen configuration of a run and of the per-rank buffer; the one grammar of sizes.

Sizes (``Loader(buffer=)``, ``MemoryConfig(tier_size=)``, ``solar plan -C/-D``, ``solar bench
--buffer/--tier-size``, the examples' ``--buffer``) are read by :func:`parse_size` alone, in one
of three forms:

* samples, a whole number: ``500`` -- **per rank**;
* bytes, a number and a unit: ``4GiB``, ``512MB``, ``1.5KB`` (B, KB, MB, GB, TB: powers of
  1000; KiB, MiB, GiB, TiB: of 1024) -- **per rank**, rounded down to whole samples;
* a share of the dataset, a number and ``%``: ``10%`` -- **over all ranks together**: the
  ranks' buffers hold that share of the dataset between them, each ``ceil(p/100 * N / P)``
  samples (N samples, P ranks), so ``50%`` means the same on 1 rank or 64; at most 100 %.

Samples and bytes are what one rank's memory holds (a node's RAM is divided among its ranks);
a share is a statement about the dataset (the job keeps a tenth of it), which is also what
``solar bench --buffer 50%`` has always meant. Anything else is refused in one line naming
the parameter.
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass
from fractions import Fraction

from solar.errors import SolarError

_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


# Default batch slack. At N=20k, P=8, B=32, E=6, C=500 (bench/plan_bench.py) slack 0 reaches
# 94 % of the hit-rate bound and 0.25 reaches 99.6 %, while the largest local batch grows by
# at most 25 %; beyond 0.25 the gain is under 0.5 % of the bound.
DEFAULT_SLACK = 0.25


@dataclass(frozen=True)
class RunConfig:
    """The shape of a training run: everything the access order depends on.

    ``num_samples`` samples, served by ``world_size`` ranks. ``batch_size`` is the nominal
    local batch of one rank; a global step covers ``batch_size * world_size`` positions of
    the epoch's order, over ``epochs`` epochs whose orders are drawn from ``seed``; the last
    step takes the rest (split evenly over the ranks; with ``drop_last`` dropped), even when
    an epoch has fewer positions than a global batch. ``draws`` is the number of positions
    per epoch when a sampler draws other than ``num_samples`` (None: all of them).
    """

    num_samples: int
    world_size: int
    batch_size: int
    epochs: int
    seed: int = 0
    drop_last: bool = False
    draws: int | None = None

    def __post_init__(self) -> None:
        for name in ("num_samples", "world_size", "batch_size", "epochs", "draws"):
            value = getattr(self, name)
            if name == "draws" and value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise SolarError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise SolarError(f"seed must be a non-negative integer, got {self.seed!r}")
        if self.world_size > 32767:
            raise SolarError(f"world_size {self.world_size} exceeds the supported 32767 ranks")
        # Fewer draws than a global batch: one short step, split evenly over the ranks (as
        # DistributedSampler and a DataLoader serve it); drop_last would leave no step.
        if self.drop_last and self.global_batch > self.epoch_draws:
            what = "samples of the dataset" if self.draws is None else "draws of an epoch"
            raise SolarError(
                f"global batch batch_size×world_size = {self.batch_size}×{self.world_size} "
                f"= {self.global_batch} exceeds the {self.epoch_draws} {what}: with "
                "drop_last=True an epoch has no step (drop_last=False serves them in one)"
            )

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.world_size

    @property
    def epoch_draws(self) -> int:
        """Positions of an epoch's order: ``draws``, or one per sample."""
        return self.num_samples if self.draws is None else self.draws

    @property
    def steps_per_epoch(self) -> int:
        if self.drop_last:
            return self.epoch_draws // self.global_batch
        return -(-self.epoch_draws // self.global_batch)

    @property
    def samples_per_epoch(self) -> int:
        """Positions served per epoch: all of them, or whole global batches with
        ``drop_last``."""
        if self.drop_last:
            return self.steps_per_epoch * self.global_batch
        return self.epoch_draws

    @property
    def num_steps(self) -> int:
        return self.steps_per_epoch * self.epochs

    @property
    def num_accesses(self) -> int:
        return self.samples_per_epoch * self.epochs


def check_slack(slack: float) -> None:
    """Refuse, in one line, a batch slack that is not a finite number in [0, 1000]."""
    if not (isinstance(slack, int | float) and math.isfinite(slack)):
        raise SolarError(f"slack must be a finite number, got {slack!r}")
    if not 0 <= slack <= 1000:
        raise SolarError(f"slack must be between 0 and 1000, got {slack}")


@dataclass(frozen=True)
class BufferConfig:
    """The per-rank buffer: ``capacity`` samples held in RAM across steps, ``tier`` more on a
    second tier (a file on node-local NVMe), and the batch slack.

    ``slack`` lets a rank serve up to ``ceil(batch_size * (1 + slack))`` samples of a global
    batch, so that more of the samples it already holds stay with it; 0 gives equal batches.
    """

    capacity: int
    slack: float = DEFAULT_SLACK
    tier: int = 0

    def __post_init__(self) -> None:
        for name, value in (("buffer", self.capacity), ("tier_size", self.tier)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise SolarError(f"{name} must be a whole number of samples, got {value!r}")
            if value < 0:
                raise SolarError(f"{name} must be >= 0 samples, got {value}")
        check_slack(self.slack)
        # 0 and 0.0 must fingerprint alike.
        object.__setattr__(self, "slack", float(self.slack))

    def cap(self, nominal: int) -> int:
        """Largest local batch a rank may serve when its nominal share is ``nominal``."""
        # round() first so that 10 * 1.1 = 11.000000000000002 does not become 12.
        return math.ceil(round(nominal * (1.0 + self.slack), 9))


_GRAMMAR = "give samples per rank (500), bytes per rank (4GiB) or a share of the dataset (10%)"


@dataclass(frozen=True)
class Size:
    """A size as written: ``kind`` "samples", "bytes" or "share"; ``amount`` the samples, the
    bytes, or the share as a fraction of the dataset (``Fraction(1, 10)`` for ``10%``)."""

    kind: str
    amount: int | Fraction
    text: str

    @classmethod
    def parse(cls, text: str | int, name: str = "buffer") -> Size:
        """``text`` read by the grammar (module docstring); refused in one line naming ``name``."""
        if isinstance(text, numbers.Integral) and not isinstance(text, bool):
            if text < 0:
                raise SolarError(f"{name} must be >= 0 samples, got {text}")
            return cls("samples", int(text), str(text))
        if not isinstance(text, str):
            raise SolarError(f"{name}: {text!r} is not a size ({_GRAMMAR})")
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(%|[a-zA-Z]*)\s*", text)
        if not match:
            raise SolarError(f"{name}: cannot parse {text!r} ({_GRAMMAR})")
        number, unit = match.groups()
        if unit == "%":
            share = Fraction(number) / 100
            if share > 1:
                raise SolarError(
                    f"{name}: {text!r} is more than the whole dataset (a share is over all "
                    "ranks together: at most 100%)"
                )
            return cls("share", share, text)
        if unit == "":
            if "." in number:
                raise SolarError(
                    f"{name}: a count of samples must be a whole number, got {text!r} "
                    "(a share of the dataset is written 50%)"
                )
            return cls("samples", int(number), text)
        factor = _UNITS.get(unit.lower())
        if factor is None:
            raise SolarError(
                f"{name}: unknown unit {unit!r} in {text!r} (use B, KB, MB, GB, KiB, MiB, GiB, "
                "or % of the dataset)"
            )
        return cls("bytes", int(Fraction(number) * factor), text)

    @property
    def zero(self) -> bool:
        return self.amount == 0

    def per_rank(
        self, *, sample_bytes: int | None, num_samples: int | None, world_size: int, name: str
    ) -> int:
        """Samples one rank holds: samples and bytes as given (per rank); a share of the
        ``num_samples`` split over ``world_size`` ranks, rounded up."""
        if self.kind == "samples":
            return int(self.amount)
        if self.kind == "share":
            if num_samples is None:
                raise SolarError(f"{name}: {self.text!r} is a share of the dataset, which needs "
                                 "its number of samples")  # fmt: skip
            return math.ceil(self.amount * num_samples / max(1, world_size))
        if not sample_bytes:
            raise SolarError(
                f"{name}: {self.text!r} is a size in bytes, which needs the sample size: "
                "give data files or --sample-bytes"
            )
        samples = int(self.amount) // sample_bytes
        if samples == 0 and self.amount > 0:
            raise SolarError(f"{name}: {self.text!r} holds no sample of {sample_bytes} bytes")
        return samples


def parse_size(
    text: str | int,
    *,
    sample_bytes: int | None,
    name: str = "buffer",
    num_samples: int | None = None,
    world_size: int = 1,
) -> int:
    """A size in samples per rank, from samples (``500``), bytes (``4GiB``, ``512MB``) or a
    share of the dataset over all ranks (``10%``): the one grammar (module docstring)."""
    return Size.parse(text, name).per_rank(
        sample_bytes=sample_bytes, num_samples=num_samples, world_size=world_size, name=name
    )


def per_rank(
    size: float | int | str, *, num_samples: int, sample_bytes: int | None, world_size: int,
    name: str,
) -> int:  # fmt: skip
    """:func:`parse_size` of a benchmark config's size, where a float is a share of the
    dataset as a fraction (0.5: 50 %, over all ranks), as their results files record it."""
    if isinstance(size, float) and not 0 <= size <= 1:
        raise SolarError(f"{name}: a share of the dataset must be in [0, 1], got {size}")
    parsed = (Size("share", Fraction(str(size)), str(size)) if isinstance(size, float)
              else Size.parse(size, name))  # fmt: skip
    return parsed.per_rank(sample_bytes=sample_bytes, num_samples=num_samples,
                           world_size=world_size, name=name)  # fmt: skip


def share_or_size(text: str, name: str) -> float | str:
    """A command's size option for the benchmarks' configs: a share as a fraction (what their
    results files record), anything else as written (checked here, resolved with the data)."""
    size = Size.parse(text, name)
    return float(size.amount) if size.kind == "share" else text


# threads="auto" starts where a fixed setting would by default: the tuner moves from there.
AUTO_THREADS = 8


@dataclass(frozen=True)
class ReaderConfig:
    """How the runtime reads: the one owner of these defaults (Loader, ``solar bench``, CLI).

    ``threads`` read concurrently (``preadv`` releases the GIL); ``read_ahead`` steps are read
    ahead of the one being served, and at least ``read_ahead_samples`` samples (more steps at
    small batches; 0 read-ahead steps: none); ``direct_io`` reads with ``O_DIRECT`` (the page
    cache is bypassed, so the buffer is the only cache; None, the default: chosen once by the
    Loader, ``O_DIRECT`` for a neighbour sampler's feature rows where the file system takes
    it, as ``solar bench --sampler neighbor`` measures them, else the page cache, as
    ``solar bench`` measures samples with their pages evicted each epoch); ``pin_memory`` pins
    batches for fast copies to an accelerator; ``decode_chunks`` reads chunked datasets chunk by
    chunk, decoding them on the threads (else through h5py, one reader at a time);
    ``one_per_file`` reads each file whole as one sample (its datasets), else files hold
    samples along their first axis.
    ``page_gap``: with ``O_DIRECT``, rows of at most 16 KiB (a GNN's feature rows) whose pages
    are within ``page_gap`` pages of each other are read in one request, the gap discarded
    (0: only rows sharing or touching pages); fewer, longer reads pay where requests, not
    bytes, are the limit.

    ``identity``: what tells a data file changed under the run (solar/io/identity.py), besides
    its size, device and inode. ``"ctime"`` (default): its mtime and ctime, so a rewrite whose
    mtime was put back (``cp -p``, ``rsync --inplace -t``) is refused, and so is a chmod, ACL
    change, rename or hard link of the data meanwhile. ``"mtime"``: its mtime only, for file
    systems that move ctimes on their own during a long run (an HSM's archive attributes,
    ACL or chmod sweeps, a backup's hard links); such a rewrite then goes unseen.

    ``threads="auto"``: start at :data:`AUTO_THREADS` and let the Loader's tuner
    (solar/tune.py) move the reader (and decoding) threads and the read-ahead depth online,
    by the measured stage figures; ``loader.stats.tuned`` says where they settled.
    """

    threads: int | str = 8
    read_ahead: int = 4
    # Measured, cold, gzip one sample per chunk at batch size 1: 4 samples ahead 1,020/s,
    # 8 to 64 samples 1,160-1,220/s (bench/chunk_bench.py's Loader pattern).
    read_ahead_samples: int = 16
    # None: chosen by the Loader, once (solar.runtime.setup): O_DIRECT for a neighbour
    # sampler's feature rows where the file system takes it (the buffer is then the only
    # cache, as `solar bench --sampler neighbor` measures), else the page cache.
    direct_io: bool | None = None
    pin_memory: bool = False
    decode_chunks: bool = True  # False: chunked datasets are read through h5py (as before)
    # O_DIRECT reads of small rows (<= 16 KiB, e.g. a GNN's feature rows): rows whose pages are
    # within ``page_gap`` pages of each other are one read (the gap read and discarded). 0:
    # only rows sharing or touching pages. Fewer, longer reads pay where requests, not bytes,
    # are the limit (bench/gnn_bench.py gaps measures it: README, "Graphs").
    page_gap: int = 0
    one_per_file: bool = False  # each file is one sample (solar.io.sources)
    identity: str = "ctime"  # "mtime": a ctime that moves alone is not a change

    def __post_init__(self) -> None:
        for name, low in (("threads", 1), ("read_ahead", 0), ("read_ahead_samples", 0),
                          ("page_gap", 0)):  # fmt: skip
            value = getattr(self, name)
            if name == "threads" and value == "auto":
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                what = 'an integer >= 1 or "auto"' if name == "threads" else f"an integer >= {low}"
                raise SolarError(f"{name} must be {what}, got {value!r}")
        if self.direct_io is not None and not isinstance(self.direct_io, bool):
            raise SolarError(f"direct_io must be True, False or None, got {self.direct_io!r}")
        for name in ("pin_memory", "decode_chunks", "one_per_file"):
            if not isinstance(getattr(self, name), bool):
                raise SolarError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.identity not in ("ctime", "mtime"):
            raise SolarError(f'identity must be "ctime" or "mtime", got {self.identity!r}')

    @property
    def auto(self) -> bool:
        """Whether the threads (and read-ahead depth) tune themselves."""
        return self.threads == "auto"

    @property
    def thread_count(self) -> int:
        """Reader threads to start with: ``threads``, or :data:`AUTO_THREADS` when auto."""
        return AUTO_THREADS if isinstance(self.threads, str) else self.threads

    def read_ahead_steps(self, batch_size: int) -> int:
        """Steps read ahead at this local batch size."""
        if self.read_ahead == 0:
            return 0
        return max(self.read_ahead, -(-self.read_ahead_samples // max(1, batch_size)))
