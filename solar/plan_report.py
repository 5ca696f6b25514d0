"""What ``solar plan`` and ``solar inspect`` report of a plan: its figures (JSON-ready) and
their text, for a buffer per rank (:func:`rank_summary`) or one per host
(:func:`node_summary`), the kind decided once, by :func:`plan_summary`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from solar._units import format_bytes
from solar.schedule.keep.summary import HostTotals, PlanSummary
from solar.schedule.plans.plan import grouping


@dataclass(frozen=True)
class PlanReport:
    """A plan's figures (``solar plan --json``'s; a caller may add its own) and the function
    printing them."""

    figures: dict
    format: Callable[[dict], str]

    def text(self) -> str:
        """The figures as ``solar plan`` prints them."""
        return self.format(self.figures)


def plan_summary(p: PlanSummary, path: Path | None = None) -> PlanReport:
    """What ``solar plan`` reports of ``p`` (``path``: the file written, if any): of a buffer
    per rank or, grouped by host, of one per host."""
    if p.hosts is None:
        return PlanReport(rank_summary(p, path), format_summary)
    return PlanReport(node_summary(p, path), format_node_summary)


def rank_summary(p: PlanSummary, path: Path | None = None) -> dict:
    """The figures ``solar plan`` reports (JSON-ready) of a plan of a buffer per rank: the run,
    each rank's totals and the whole's, the hit rate against its bound, the file written."""
    assert isinstance(p.stats, tuple)
    run, spec = p.run, p.spec
    reads = p.accesses - p.hits
    summary = {
        "policy": spec.policy,
        "num_samples": run.num_samples,
        "sample_bytes": spec.sample_bytes,
        "world_size": run.world_size,
        "batch_size": run.batch_size,
        "epochs": run.epochs,
        "buffer": spec.buffer.capacity,
        "tier_size": spec.buffer.tier,
        "slack": spec.buffer.slack,
        "steps_per_epoch": run.steps_per_epoch,
        "accesses": p.accesses,
        "hits": p.hits,
        "ram_hits": p.ram_hits,
        "tier_hits": p.tier_hits,
        "reads": reads,
        "hit_rate": p.hit_rate,
        "bound": None if spec.traced else p.bound,  # (P·C bounds permutations only)
        "sampler": spec.sampler.identity() or {"kind": "shuffle"},
        "reads_per_epoch": reads / run.epochs,
        "bytes_read_per_epoch": (reads * spec.sample_bytes / run.epochs)
        if spec.sample_bytes
        else None,
        "plan_seconds": p.plan_seconds,
        "fingerprint": p.fingerprint,
        "ranks": [dict(rank=r, **vars(s)) for r, s in enumerate(p.stats)],
        "equal_batches": spec.equal_batches,
    }
    if spec.equal_batches:  # rows served by one rank and delivered by another
        moved = sum(s.sent for s in p.stats) / run.epochs
        summary.update(
            rows_moved_per_epoch=moved,
            moved_share=moved / run.samples_per_epoch,
            bytes_moved_per_epoch=moved * spec.sample_bytes if spec.sample_bytes else None,
        )
    if path is not None:
        size = path.stat().st_size
        summary.update(out=str(path), file_bytes=size, bytes_per_access=size / p.accesses)
    return summary


def format_summary(s: dict) -> str:
    """:func:`rank_summary` as ``solar plan`` prints it: the run, each rank's figures, the hit
    rate against the bound."""
    each = f" ({format_bytes(s['sample_bytes'])} each)" if s["sample_bytes"] else ""
    graph = s["sampler"]["kind"] == "neighbor"  # a graph's feature rows, B seed nodes per rank
    unit = "feature rows" if graph else "samples"
    lines = [
        f"policy {s['policy']}: N={s['num_samples']} {unit}{each}, P={s['world_size']}, "
        f"B={s['batch_size']}{' seeds' if graph else ''}, E={s['epochs']}, "
        f"{s['steps_per_epoch']} steps/epoch, buffer {s['buffer']} {unit}/rank"
        + (f" + tier {s['tier_size']}" if s["tier_size"] else "")
        + f", slack {s['slack']}",
        f"{'rank':>5} {'accesses':>10} {'hits':>10} {'reads':>10} {'batch min-max':>14}",
    ]
    for r in s["ranks"]:
        batch = f"{r['min_batch']}-{r['max_batch']}"
        lines.append(
            f"{r['rank']:>5} {r['accesses']:>10} {r['hits']:>10} {r['reads']:>10} {batch:>14}"
        )
    lines.append(f"{'all':>5} {s['accesses']:>10} {s['hits']:>10} {s['reads']:>10}")
    if s["tier_size"]:
        lines.append(f"hits from RAM {s['ram_hits']}, from the tier {s['tier_hits']}")
    if s["bound"] is None:
        lines.append(f"hit rate {100 * s['hit_rate']:.2f} % ({s['sampler']['kind']} sampler)")
    else:
        share = s["hit_rate"] / s["bound"] if s["bound"] else 1.0
        held = "P·(C+D)" if s["tier_size"] else "P·C"
        lines.append(
            f"hit rate {100 * s['hit_rate']:.2f} %, bound min({held}, N)·(E−1)/(N·E) = "
            f"{100 * s['bound']:.2f} % ({100 * share:.1f} % of it)"
        )
    rates = s.get("hit_rate_per_epoch") or []
    if 1 < len(rates) <= 12:
        lines.append("hit rate per epoch: " + ", ".join(f"{100 * r:.1f} %" for r in rates))
    lines.append(reads_line(s, "samples"))
    if s["equal_batches"]:
        moved = f"{s['rows_moved_per_epoch']:.0f} rows ({100 * s['moved_share']:.1f} %"
        if s["bytes_moved_per_epoch"] is not None:
            moved += f", {format_bytes(s['bytes_moved_per_epoch'])}"
        lines.append(f"equal batches: moved between ranks per epoch {moved})")
    lines += closing_lines(s)
    if s.get("plot"):
        lines.append(f"plot -> {s['plot']}")
    return "\n".join(lines)


def node_summary(p: PlanSummary, path: Path | None = None) -> dict:
    """The figures ``solar plan --share node`` reports (JSON-ready) of a plan grouped by host:
    the run, the grouping, the node's totals (:func:`~solar.schedule.keep.hostplan.host_totals`),
    the file written."""
    spec, run = p.spec, p.spec.run
    assert p.hosts is not None and isinstance(p.stats, HostTotals)
    s = {
        "share": "node", "policy": spec.policy, "num_samples": run.num_samples,
        "sample_bytes": spec.sample_bytes, "world_size": run.world_size,
        "batch_size": run.batch_size, "epochs": run.epochs, "buffer": spec.buffer.capacity,
        "slack": spec.buffer.slack, "steps_per_epoch": run.steps_per_epoch,
        "sampler": spec.sampler.identity() or {"kind": "shuffle"},
        **p.stats.as_dict(), "grouping": grouping(p.hosts), "plan_seconds": p.plan_seconds,
        "fingerprint": p.fingerprint,
    }  # fmt: skip
    s["bytes_read_per_epoch"] = (s["reads_per_epoch"] * spec.sample_bytes
                                 if spec.sample_bytes else None)  # fmt: skip
    if path is not None:
        s.update(out=str(path), file_bytes=path.stat().st_size)
    return s


def format_node_summary(s: dict) -> str:
    """:func:`node_summary` as ``solar plan`` prints it."""
    unit = "feature rows" if s["sampler"]["kind"] == "neighbor" else "samples"
    lines = [
        f"policy {s['policy']}, one buffer per host: N={s['num_samples']} {unit}, "
        f"P={s['world_size']}, B={s['batch_size']}, E={s['epochs']}, "
        f"{s['steps_per_epoch']} steps/epoch, {s['buffer_per_host']} {unit}/host "
        f"({s['buffer']}/rank), slack {s['slack']}",
        f"hosts {s['grouping']}",
        f"node accesses {s['accesses']} (the union of each host's ranks'), hits {s['hits']}, "
        f"reads {s['reads']}" + (f" + {s['side_reads']} page mates" if s["side_reads"] else ""),
        f"hit rate {100 * s['hit_rate']:.2f} %; rows one local rank reads for another "
        f"{s['peer_rows']}",
    ]
    lines.append(reads_line(s, unit))
    lines += closing_lines(s)
    return "\n".join(lines)


# -- the lines both kinds of plan print -----------------------------------------------------
def reads_line(s: dict, unit: str) -> str:
    """``reads per epoch: ...`` of a plan's figures ``s`` (``solar plan --json``'s), counted in
    ``unit`` (samples, feature rows), with their bytes where known."""
    per_epoch = f"{s['reads_per_epoch']:.0f} {unit}"
    if s["bytes_read_per_epoch"] is not None:
        per_epoch += f" ({format_bytes(s['bytes_read_per_epoch'])})"
    return f"reads per epoch: {per_epoch}"


def closing_lines(s: dict) -> list[str]:
    """The last lines of a plan's report (figures ``s``): how long planning took and the file
    written, the kernels' warm-up where ``s`` has one (not in the planning time), and the
    fingerprint."""
    where = f" -> {s['out']} ({format_bytes(s['file_bytes'])})" if "out" in s else ""
    lines = [f"planned in {s['plan_seconds']:.2f} s{where}"]
    if "compile_seconds" in s:
        lines.append(
            f"kernels warmed first in {s['warm_seconds']:.2f} s "
            f"(compiling {s['compile_seconds']:.2f} s; not in the planning time)"
        )
    lines.append(f"fingerprint {s['fingerprint']}")
    return lines
