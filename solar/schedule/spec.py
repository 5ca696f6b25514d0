"""The inputs of a plan (:class:`PlanSpec`) and their fingerprint."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field

from solar.config import BufferConfig, RunConfig
from solar.errors import SolarError
from solar.schedule.draw.pagemates import PageLayout
from solar.schedule.draw.samplers import SHUFFLE, Sampler, is_shuffle, sampler_from_record
from solar.schedule.policy import check_policy, slot_count

# The version of the plan file format (solar/schedule/plans/planfile.py). It is one of a spec's
# inputs, so a plan of another format never matches a spec's fingerprint.
FORMAT_VERSION = 5


@dataclass(frozen=True)
class PlanSpec:
    """Everything a plan depends on; its digest is the plan's fingerprint."""

    run: RunConfig
    buffer: BufferConfig
    policy: str = "solar"
    reorder_epochs: bool = False
    sample_bytes: int | None = None
    dataset: str | None = None  # identity of the data files and keys, see solar.io.hdf5
    # Who draws each step's ids (solar.schedule.draw.samplers) and, for all but Shuffle, how many
    # epochs ahead the planner looks for next uses (None: the whole run, see traces.py).
    sampler: Sampler = field(default=SHUFFLE, compare=False)
    horizon: int | None = None
    # Every rank delivers exactly its nominal share each step: the rows a rank serves beyond
    # it move to the ranks under it (solar.schedule.keep.transfer); Shuffle's planning only.
    equal_batches: bool = False
    # Where the sampled rows lie in the file read (solar.schedule.draw.pagemates): the solar policy
    # then keeps rows that share pages with a step's reads. A sampler's trace without affinity,
    # a RAM buffer only.
    pages: PageLayout | None = None
    # A sampler's trace planned in windows of this many steps, each window's next uses known
    # one window ahead (traces.py: memory grows with the window, not the epoch); None: the
    # default (traces.default_window: the whole epoch wherever its trace fits).
    window: int | None = None

    def __post_init__(self) -> None:
        check_policy(self.policy, self.buffer, traced=self.traced)
        if self.traced and self.reorder_epochs:
            raise SolarError("reorder_epochs reorders Shuffle's permutations: not for this sampler")
        if self.horizon is not None and (not isinstance(self.horizon, int) or self.horizon < 0):
            raise SolarError(f"horizon must be a whole number of epochs >= 0, got {self.horizon!r}")
        if not isinstance(self.equal_batches, bool):
            raise SolarError(f"equal_batches must be True or False, got {self.equal_batches!r}")
        if self.pages is not None and not self.plans_page_mates:
            raise SolarError("pages: page mates are planned for a sampler's trace without "
                             "affinity, by the solar policy, in a RAM buffer only")  # fmt: skip
        if self.window is not None:
            w = self.window
            if not isinstance(w, int) or isinstance(w, bool) or w < 1:
                raise SolarError(f"window must be a whole number of steps >= 1 or None, got {w!r}")
            if not self.plans_windows:
                raise SolarError("window: a sampler's trace without affinity (a NeighborSampler, "
                                 "a Trace), planned by the solar policy, is planned in windows "
                                 "of steps")  # fmt: skip
        if self.equal_batches and self.traced:
            raise SolarError(
                "equal_batches applies to the default Shuffle sampler only (another sampler "
                "fixes each rank's batch itself)"
            )

    @property
    def traced(self) -> bool:
        """Whether the sampler's trace is planned (every sampler but Shuffle)."""
        return not is_shuffle(self.sampler)

    @property
    def affinity(self) -> bool:
        """Whether the planner splits a traced sampler's global batches over the ranks (the
        ``solar`` policy, for a sampler with affinity); else each rank takes the sampler's."""
        return self.traced and self.sampler.affinity and self.policy == "solar"

    @property
    def plans_page_mates(self) -> bool:
        """Whether its rows' page layout (``pages``) may be planned: a sampler's trace split by
        the sampler, the solar policy, a RAM buffer (solar.schedule.draw.pagemates)."""
        solar_ram = self.policy == "solar" and not self.buffer.tier
        return self.traced and not self.affinity and solar_ram

    @property
    def plans_windows(self) -> bool:
        """Whether it may be planned in windows of steps (``window``): a sampler's trace split
        by the sampler, the solar policy (Belady's next uses are what a window cuts)."""
        return self.traced and not self.affinity and self.policy == "solar"

    @property
    def steps_window(self) -> int | None:
        """Steps per window its epochs are planned in: ``window``, else the default
        (:func:`~solar.schedule.draw.traces.default_window`, where windows may be planned);
        None: whole epochs."""
        if self.window is not None or not self.plans_windows:
            return self.window
        from solar.schedule.draw.traces import default_window

        return default_window(self.run, self.sampler)

    @property
    def slots(self) -> int:
        """Slots of a rank's RAM buffer: its capacity, at most N."""
        return slot_count(self.run, self.buffer)

    def batch_rows(self, rows: int) -> int:
        """Rows of batch memory a batch of ``rows`` needs: with page mates, room for its side
        rows too (a step keeps at most its batch's length of them)."""
        return rows if self.pages is None else 2 * rows

    @property
    def bound(self) -> float:
        """Largest possible hit rate: min(P·(C+D), per-epoch samples) hits per epoch
        transition, for C RAM and D tier slots per rank (a pure function of the spec)."""
        run, c = self.run, self.buffer.capacity + self.buffer.tier
        per_epoch = run.samples_per_epoch
        return min(run.world_size * c, per_epoch) * (run.epochs - 1) / (per_epoch * run.epochs)

    def as_dict(self) -> dict:
        """The inputs as a flat JSON-ready dict (what a plan file records)."""
        d = {**dataclasses.asdict(self.run), **dataclasses.asdict(self.buffer)}
        d.update(
            policy=self.policy,
            reorder_epochs=self.reorder_epochs,
            sample_bytes=self.sample_bytes,
            dataset=self.dataset,
            format_version=FORMAT_VERSION,
        )
        # Plans without a tier, or of Shuffle, keep the fingerprints they always had.
        if not self.buffer.tier:
            del d["tier"]
        if self.run.draws is None:
            del d["draws"]
        if self.traced:
            d.update(sampler=self.sampler.identity(), horizon=self.horizon)
        if self.equal_batches:
            d.update(equal_batches=True)
        if self.pages is not None:
            d.update(pages=self.pages.as_record())
        if self.window is not None:  # (a plan of whole epochs keeps its fingerprint)
            d.update(window=self.window)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> PlanSpec:
        """The spec :meth:`as_dict` recorded."""
        run = RunConfig(**{f.name: d[f.name] for f in dataclasses.fields(RunConfig) if f.name in d})
        buffer = BufferConfig(d["capacity"], d["slack"], d.get("tier", 0))
        pages = None if d.get("pages") is None else PageLayout.from_record(d["pages"])
        return cls(run, buffer, d["policy"], d["reorder_epochs"], d["sample_bytes"], d["dataset"],
                   sampler_from_record(d.get("sampler")), d.get("horizon"),
                   bool(d.get("equal_batches", False)), pages, d.get("window"))  # fmt: skip

    @property
    def fingerprint(self) -> str:
        return fingerprint_of(self.as_dict())


def differences(mine: PlanSpec, theirs: PlanSpec) -> str:
    """The recorded fields in which ``mine`` differs from ``theirs``, as a user reads them."""
    a, b = mine.as_dict(), theirs.as_dict()
    keys = [*a, *(k for k in b if k not in a)]  # a field only one records
    return ", ".join(f"{k} {a.get(k)!r} (expected {b.get(k)!r})" for k in keys
                     if a.get(k) != b.get(k))  # fmt: skip


def fingerprint_of(d: dict) -> str:
    """The fingerprint of a spec recorded as :meth:`PlanSpec.as_dict`: sha256 hex of its JSON."""
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()


def equal_by_default(world: int, sampler: Sampler) -> bool:
    """Whether a run plans equal local batches unless told: several ranks and the Shuffle
    sampler (another sampler decides each rank's batch itself). The Loader also needs the
    ranks' communicator; ``solar plan``'s files are for such a Loader."""
    return world > 1 and is_shuffle(sampler)
