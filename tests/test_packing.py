"""Misses packed in plan order (solar/schedule/plans/packing.py decides, solar/cache/packed.py lays
out, solar/runtime/packing.py builds and reads): the model's choices, the layout's round trip,
batches byte for byte as the random path's, a tampered layout refused, the disk bound."""

from __future__ import annotations

import dataclasses
import os
import tempfile
import warnings

import h5py
import numpy as np
import pytest
from helpers import every_batch, skip_without_o_direct, write_h5

from solar import Loader, NeighborSampler
from solar._memory import aligned
from solar.cache.packed import PackedFile
from solar.cache.tier import in_memory
from solar.errors import SolarError
from solar.graph import generate_graph
from solar.io.executor import Executor, wait_all
from solar.io.handles import NoDirectIO, TooManyOpen, open_descriptor
from solar.io.identity import FileChanged
from solar.options import MemoryConfig, PackingConfig
from solar.schedule.plans.packing import (
    DeviceRates,
    PackModel,
    RowsAt,
    plan_windows,
    scan_bytes,
    step_pages,
)

HDD_LIKE = DeviceRates(random_pages_per_second=75e3, sequential_bytes_per_second=1e9)
NVME = DeviceRates(random_pages_per_second=1e6, sequential_bytes_per_second=3e9)


def _reads(steps: int, per_step: int, n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [np.sort(rng.choice(n, per_step, replace=False)) for _ in range(steps)]


def test_the_model_packs_where_random_pages_are_dear_and_keeps_pages_where_they_are_cheap():
    """1 KiB rows, a 75k pages/s disk, misses of 4 % of the rows per step: packing (a scan,
    a write, a read, all sequential) beats a random page per row; on an NVMe of 1M pages/s,
    or with 4 KiB rows and few misses per scan, random pages win and are kept. Whether
    packing can pay at all (``PackModel.packs``) agrees where it is decided."""
    n = 1_000_000
    at = RowsAt(offset=2048, row_bytes=1024, rows=n, chunk_rows=16384)
    reads = _reads(20, 40_000, n)
    kw = {"window_bytes": 2**40, "margin": 1.25, "lead": True}
    (w,) = plan_windows(reads, 100, at, HDD_LIKE, **kw)
    assert (w.first, w.end, w.packed, w.rows) == (100, 120, True, 800_000)
    assert w.packed_seconds * 1.25 < w.random_seconds
    assert w.pages == sum(step_pages(r, at) for r in reads)
    assert not plan_windows(reads, 100, at, NVME, **kw)[0].packed
    big = RowsAt(offset=0, row_bytes=4096, rows=n, chunk_rows=4096)
    few = _reads(2, 20_000, n)  # a whole scan for few rows: dearer than their pages
    assert not plan_windows(few, 0, big, HDD_LIKE, **kw)[0].packed
    # Whether packing can pay at all (the plan then reads rows alone): its largest window, at
    # most an epoch's reads. On the NVMe, an epoch of these 800k misses cannot: no window
    # packs above, so page mates are kept; a larger epoch could.
    model = PackModel(at, HDD_LIKE, window_bytes=2**32, margin=1.25)
    assert model.packs(800_000) and not dataclasses.replace(model, rates=NVME).packs(800_000)
    assert dataclasses.replace(model, rates=NVME).packs(4_000_000)
    assert not dataclasses.replace(model, rates=DeviceRates(4e6, 3e9)).packs(10**9)


@pytest.mark.parametrize("row_bytes", [96, 1024, 3000, 4096, 20000])
def test_pages_and_scans_are_counted_as_a_brute_force_counts_them(row_bytes):
    """The random path's distinct pages of a step (sorted rows, repeats allowed) and a
    window's scanned chunks (the last one short), against sets of them."""
    n = 10_007
    at = RowsAt(offset=777, row_bytes=row_bytes, rows=n, chunk_rows=1000)
    rng = np.random.default_rng(row_bytes)
    reads = [np.sort(rng.integers(0, n, m)) for m in (1, 50, 3000)] + [np.array([n - 1])]
    for r in reads:
        start = at.offset + r * row_bytes
        pages = {
            p for s in start.tolist() for p in range(s // 4096, (s + row_bytes - 1) // 4096 + 1)
        }
        assert step_pages(r, at) == len(pages)
    chunks = {int(c) for r in reads for c in (r // 1000).tolist()}
    want = sum(min(1000, n - 1000 * c) for c in chunks) * row_bytes
    assert scan_bytes(reads, at) == want


def test_windows_are_bounded_and_the_runs_first_window_is_read_at_random():
    """Without an earlier window (``lead``), the first window is read at random, its steps
    the fewest whose random reads take as long as packing the next window; windows hold at
    most ``window_bytes`` of disk; a step larger than that is a window of its own, never
    packed; the windows cover the steps in order."""
    n = 100_000
    at = RowsAt(offset=0, row_bytes=1024, rows=n, chunk_rows=1000)
    reads = _reads(10, 3000, n)
    reads[6] = np.arange(9000, dtype=np.int64)  # larger than a window
    rates = DeviceRates(1e3, 1e9)
    ws = plan_windows(reads, 0, at, rates, window_bytes=7 * 2**20, margin=1.0, lead=False)
    assert (ws[0].first, ws[0].end, ws[0].packed) == (0, 1, False)  # pages dear: one step
    # Every step reads rows 0, 25, ..., 24975 (25 chunks, 1000 pages): a pass scans 25.6 MB
    # and writes 7 MiB (a window) in 0.33 s at 100 MB/s; a step's pages take 0.1 s at 10k/s.
    spread = [np.arange(0, 25_000, 25, dtype=np.int64)] * 10
    opening = plan_windows(spread, 0, at, DeviceRates(1e4, 1e8), window_bytes=7 * 2**20,
                           margin=1.0, lead=False)[0]  # fmt: skip
    assert (opening.end, opening.packed, opening.pages) == (4, False, 4000)
    assert [w.first for w in ws[1:]] == [w.end for w in ws[:-1]] and ws[-1].end == 10
    assert all(w.nbytes <= 7 * 2**20 or (w.end - w.first == 1 and not w.packed) for w in ws)
    (own,) = [w for w in ws if w.first == 6]
    assert own.end == 7 and not own.packed
    assert all(w.packed for w in ws[1:] if w is not own)
    again = plan_windows(reads, 0, at, rates, window_bytes=7 * 2**20, margin=1.0, lead=True)
    assert again[0].packed and again[0].end > 1


def _source(n: int, width: int) -> np.ndarray:
    return np.random.default_rng(3).integers(0, 255, (n, width), np.uint8)


def _built(tmp_path, data: np.ndarray, samples: list[np.ndarray], chunk_rows: int,
           ex: Executor) -> PackedFile:  # fmt: skip
    width = data.shape[1]
    packed = PackedFile(tmp_path, np.arange(10, 10 + len(samples)), samples, width, chunk_rows,
                        "t")  # fmt: skip
    for c in packed.chunks.tolist():
        staging = np.ascontiguousarray(data[c * chunk_rows : (c + 1) * chunk_rows])
        out = aligned(packed.chunk_bytes(c))  # O_DIRECT writes: page-aligned memory
        tasks = packed.chunk_write(staging, c, out, groups=2)
        assert tasks
        wait_all(ex.start(packed, tasks))
    packed.seal()
    return packed


@pytest.mark.parametrize("width", [1024, 20])  # words of 8 bytes, and bytes
def test_a_packed_layout_gives_back_each_steps_rows_byte_for_byte(tmp_path, width):
    """Steps' reads (repeats across steps, a last chunk shorter than the others) packed chunk
    by chunk, read back into shuffled batch rows: every row is the source's."""
    n, chunk_rows = 1001, 97
    data = _source(n, width)
    rng = np.random.default_rng(1)
    samples = [np.sort(rng.choice(n, m, replace=False)) for m in (0, 5, 300, 1000, 1)]
    ex = Executor(3)
    packed = _built(tmp_path, data, samples, chunk_rows, ex)
    assert packed.nbytes % 4096 == 0 and packed.nbytes >= sum(s.size for s in samples) * width
    for j, s in enumerate(samples):
        dest = np.zeros((s.size + 3, width), np.uint8)
        rows = rng.permutation(s.size + 3)[: s.size]
        shuffled = rng.permutation(s.size)
        wait_all(ex.start(packed, packed.read_tasks(10 + j, s[shuffled], dest, rows[shuffled],
                                                     groups=2)))  # fmt: skip
        assert dest[rows].tobytes() == data[s].tobytes()
    with pytest.raises(SolarError, match="other samples than the ones packed"):
        packed.read_tasks(12, samples[2][:-1], np.zeros((400, width), np.uint8),
                          np.arange(299), groups=1)  # fmt: skip
    with pytest.raises(SolarError, match="step 99 is not packed here"):
        packed.region(99)
    packed.close()
    ex.close()


def test_a_packed_layout_written_to_or_truncated_after_its_build_is_refused(tmp_path):
    """Its identity is pinned once built: a write through its descriptor (as through
    /proc/PID/fd) or a truncation refuses the next read in one line; nothing is served."""
    n, width = 500, 64
    data = _source(n, width)
    samples = [np.arange(0, 400, 3, dtype=np.int64)]
    ex = Executor(2)
    for harm in ("write", "truncate"):
        packed = _built(tmp_path, data, samples, 128, ex)
        dest = np.zeros((samples[0].size, width), np.uint8)
        rows = np.arange(samples[0].size)
        wait_all(ex.start(packed, packed.read_tasks(10, samples[0], dest, rows, groups=1)))
        fd = os.open(f"/proc/self/fd/{packed._fd}", os.O_WRONLY)
        try:
            if harm == "write":
                os.pwrite(fd, b"\xff" * 64, 0)
            else:
                os.ftruncate(fd, 4096)
        finally:
            os.close(fd)
        dest[:] = 0
        with pytest.raises(FileChanged, match=r"packed.*changed since it was opened"):
            wait_all(ex.start(packed, packed.read_tasks(10, samples[0], dest, rows, groups=1)))
        assert not dest.any()
        packed.close()
    ex.close()


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    """2003 nodes (a prime) of 24 floats (96 B rows, a page's rows not whole)."""
    path = tmp_path_factory.mktemp("packing") / "g.h5"
    generate_graph(path, 2003, 6.0, 24, seed=7, train_fraction=0.3)
    with h5py.File(path) as f:
        feats = f["features"][()]
    return path, feats


def _loader(path, disk, directory, page_mates=True, **pack) -> Loader:
    sampler = NeighborSampler(path, (4, 2), batch_size=23)  # 601 seeds: a short last step
    pack = {"random_pages_per_second": 100.0, **pack}  # random pages made dear: windows pack
    config = PackingConfig(disk=disk, directory=directory, sequential_bytes_per_second=1e9,
                           chunk_bytes=2**16, **pack)  # fmt: skip
    return Loader(path, ["features"], sampler=sampler, epochs=3, buffer=150,
                  memory=MemoryConfig(pack=config, page_mates=page_mates))  # fmt: skip


def test_packed_windows_serve_the_random_paths_batches_byte_for_byte(graph, tmp_path):
    """Three epochs with packed windows (chunks not dividing the rows, steps not dividing
    the seeds): every batch is the random path's, byte for byte, and h5py's rows; hits are
    the plan's either way; the model's windows are recorded and most are packed; the runtime
    obeys them: no miss of a packed step is read from the source (the recording reader sees
    only the passes' whole chunks)."""
    path, feats = graph
    # The same plan read at random: rows alone, as a packing loader plans where it packs.
    with _loader(path, 0, tmp_path, page_mates=False) as plain:
        assert plain.stats.packing is None
        want = every_batch(plain, range(3))
        hits = plain.stats.totals().hits
    with _loader(path, "4MiB", tmp_path) as ld:
        reader = ld.reader
        seen: list[np.ndarray] = []
        submit = reader.submit

        def recording(samples, out, rows):
            seen.append(np.asarray(samples).copy())
            return submit(samples, out, rows)

        reader.submit = recording  # type: ignore[method-assign]
        got = every_batch(ld, range(3))
        figures = ld.stats.packing
        assert ld.stats.totals().hits == hits
        # Random pages dear: packing pays, so the plan reads rows alone (no page mates).
        assert ld.spec.pages is None and ld.stats.totals().side_reads == 0
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a["x"].numpy().tobytes() == b["x"].numpy().tobytes()
        assert a["x"].numpy().tobytes() == feats[a["n_id"].numpy()].tobytes()
    ws = figures.windows
    packed = [w for w in ws if w.packed]
    assert len(packed) >= len(ws) // 2 and figures.built == len(packed)
    assert figures.written_bytes >= sum(w.rows for w in packed) * feats[0].nbytes
    chunk = 2**16 // feats[0].nbytes
    scans = [
        s
        for s in seen
        if s.size > 1
        and np.array_equal(s, np.arange(s[0], s[-1] + 1))
        and s[0] % chunk == 0
        and (s.size == chunk or s[-1] == feats.shape[0] - 1)
    ]
    assert len(scans) >= len(packed)
    assert len(seen) - len(scans) <= sum(w.end - w.first for w in ws if not w.packed) + 1


def test_where_packing_cannot_pay_the_loader_does_not_pack_and_keeps_page_mates(graph, tmp_path):
    """Random pages as cheap as sequential bytes (10^9 pages/s): no window could pay, so the
    Loader does not pack and its plan keeps page mates: its hits and side reads are those of
    the loader without packing, its batches the same bytes. (Where pages are dear, the plan
    reads rows alone: test_packed_windows_serve_the_random_paths_batches_byte_for_byte.)"""
    path, feats = graph
    runs = []
    for disk in (0, "4MiB"):
        with _loader(path, disk, tmp_path, random_pages_per_second=1e9) as ld:
            batches = every_batch(ld, range(3))
            runs.append((ld.stats.totals(), ld.stats.packing, batches, ld.spec.pages))
    (plain, _, want, pages), (cheap, packing, got, kept) = runs
    assert pages is not None and plain.side_reads > 0  # this graph's rows share pages
    assert packing is None and kept == pages
    assert (cheap.hits, cheap.side_reads) == (plain.hits, plain.side_reads)
    for a, b in zip(got, want, strict=True):
        assert a["x"].numpy().tobytes() == b["x"].numpy().tobytes()
        assert a["x"].numpy().tobytes() == feats[a["n_id"].numpy()].tobytes()


def test_the_planning_thread_decides_the_windows_and_the_runtime_obeys_them(
    graph, tmp_path, monkeypatch
):
    """Each epoch's windows are decided once, on the planning thread, as the epoch is planned
    (the run's first without a lead: its first window at random); the runtime's windows are
    exactly those, in order, and its packed steps are the ones built."""
    import threading

    import solar.schedule.plans.stream as stream_module

    path, _ = graph
    decided: list[tuple[int, str, tuple]] = []
    decide = stream_module.epoch_windows

    def recording(epoch, *args, **kwargs):
        got = decide(epoch, *args, **kwargs)
        decided.append((epoch, threading.current_thread().name, got.windows))
        return got

    monkeypatch.setattr(stream_module, "epoch_windows", recording)
    with _loader(path, "4MiB", tmp_path) as ld:
        every_batch(ld, range(3))
        figures = ld.stats.packing
    assert [e for e, _, _ in decided] == [0, 1, 2]
    assert all(name.startswith("solar-plan") for _, name, _ in decided)
    assert not decided[0][2][0].packed  # the run's start: read while the next is packed
    assert figures.windows == [w for _, _, ws in decided for w in ws]
    assert figures.built == sum(w.packed for w in figures.windows) > 0


def test_the_disk_bound_holds_and_packing_is_refused_where_it_cannot_run(graph, tmp_path):
    """The packed files live never take more than the disk given (two windows of at most half
    of it); a tier, or packing asked with bad values, is refused in one line."""
    path, _ = graph
    with _loader(path, "256KiB", tmp_path) as ld:
        every_batch(ld, range(2))
        f = ld.stats.packing
        assert 0 < f.disk_peak <= 256 * 1024
        assert all(w.nbytes <= 128 * 1024 for w in f.windows if w.packed)
        assert f.built > 0
    tier = MemoryConfig(tier=str(tmp_path), tier_size=100, pack=PackingConfig(disk="1MiB"))
    with pytest.raises(SolarError, match="pack: packing misses needs a buffer without a tier"):
        Loader(path, ["features"], sampler=NeighborSampler(path, (4, 2), batch_size=23),
               epochs=1, buffer=150, memory=tier)  # fmt: skip
    with pytest.raises(SolarError, match="margin must be a positive number"):
        PackingConfig(disk="1MiB", margin=0)


def test_a_resumed_run_with_packed_windows_serves_the_same_batches(graph, tmp_path):
    """Resumed mid-epoch from its state, a packing Loader obeys the windows its planner
    decided for the epoch it resumes in (from the step it resumes at) and serves the batches
    of an uninterrupted run, byte for byte."""
    path, _ = graph
    with _loader(path, "4MiB", tmp_path) as ld:
        whole = every_batch(ld, range(3))
    spe = len(whole) // 3
    with _loader(path, "4MiB", tmp_path) as ld:
        ld.set_epoch(1)
        it = iter(ld)
        for _ in range(spe // 2):
            next(it)
        state = ld.state_dict()
    with _loader(path, "4MiB", tmp_path) as ld:
        ld.load_state_dict(state)
        rest = every_batch(ld, [1, 2])
        assert ld.stats.packing.built > 0
    for got, want in zip(rest, whole[spe + spe // 2 :], strict=True):
        assert got["x"].numpy().tobytes() == want["x"].numpy().tobytes()


def test_a_pack_directory_missing_short_of_space_or_tmpfs_by_default_is_refused(
    graph, tmp_path, monkeypatch
):
    """Checked at construction, each refusal one line naming the parameter: a directory that
    does not exist, one without the disk budget free, and the default (the system's
    temporary directory) where it is tmpfs: memory, not disk."""
    path, feats = graph
    with pytest.raises(SolarError, match=r"^pack directory \S+none: directory does not exist$"):
        _loader(path, "1MiB", tmp_path / "none")
    vfs = os.statvfs(tmp_path)
    rows = vfs.f_bavail * vfs.f_frsize // feats[0].nbytes + 10**6  # more than is free
    with pytest.raises(SolarError, match=r"^pack disk: \S+ \w+ asked, \S+ \w+ free in \S+$"):
        _loader(path, rows, tmp_path)
    if not in_memory("/dev/shm"):
        pytest.skip("/dev/shm is not tmpfs here")
    monkeypatch.setattr(tempfile, "tempdir", "/dev/shm")
    with pytest.raises(SolarError, match=r"^pack directory: the default /dev/shm is tmpfs"):
        _loader(path, "1MiB", None)


def test_a_packed_file_that_cannot_be_made_mid_run_turns_its_window_random(
    graph, tmp_path, monkeypatch
):
    """Every other packed file fails to be made (as on ENOSPC or EMFILE): training goes on,
    those windows read at random, warned once; the batches are the random path's, byte for
    byte; the windows whose files were made are packed and built."""
    import solar.runtime.packing as runtime_packing

    path, feats = graph
    with _loader(path, 0, tmp_path, page_mates=False) as plain:
        want = every_batch(plain, range(3))
    made = runtime_packing.PackedFile
    calls: list[int] = []

    def every_other(*args, **kwargs):
        calls.append(int(args[1][0]))
        if len(calls) % 2 == 0:
            raise SolarError("packed layout x: cannot allocate 1 MiB (No space left on device)")
        return made(*args, **kwargs)

    monkeypatch.setattr(runtime_packing, "PackedFile", every_other)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with _loader(path, "4MiB", tmp_path) as ld:
            got = every_batch(ld, range(3))
            figures = ld.stats.packing
    assert len(calls) >= 2 and len(set(calls)) == len(calls)  # each window tried once
    said = [w for w in caught if "read at random" in str(w.message)]
    assert len(said) == 1 and "No space left on device" in str(said[0].message)
    made_files = len(calls) - len(calls) // 2
    assert figures.built == sum(w.packed for w in figures.windows) == made_files
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a["x"].numpy().tobytes() == b["x"].numpy().tobytes()
        assert a["x"].numpy().tobytes() == feats[a["n_id"].numpy()].tobytes()


def test_a_packed_file_not_reopened_with_o_direct_leaves_no_descriptor(tmp_path, monkeypatch):
    """Its creation failing past the file's allocation (running out of descriptors at the
    O_DIRECT reopen) refuses in one line and closes what it opened."""
    import solar.cache.tier as tier

    def refuse(path, flags, o_direct):
        raise TooManyOpen(f"{path}: cannot open (Too many open files)")

    monkeypatch.setattr(tier, "open_descriptor", refuse)
    before = sorted(os.listdir("/proc/self/fd"))
    with pytest.raises(SolarError, match=r"^packed layout \S+: cannot allocate .*Too many open"):
        PackedFile(tmp_path, np.arange(1), [np.arange(3)], 64, 16, "t")
    assert sorted(os.listdir("/proc/self/fd")) == before


def test_o_direct_by_default_for_a_neighbour_samplers_features_where_it_opens(
    graph, tmp_path, monkeypatch
):
    """ReaderConfig(direct_io=None): a neighbour sampler's features are read with O_DIRECT
    where the file system takes it, through the page cache where it refuses it; Shuffle's
    samples through the page cache."""
    import solar.runtime.setup as setup

    path, _ = graph

    def gnn() -> Loader:
        sampler = NeighborSampler(path, (4, 2), batch_size=23)
        return Loader(path, ["features"], sampler=sampler, epochs=1, buffer=150)

    with skip_without_o_direct():
        os.close(open_descriptor(path, os.O_RDONLY, o_direct=True))
    with gnn() as ld:
        assert ld.reader.direct_io is True
    opened = setup.open_descriptor

    def no_direct(p, flags, o_direct):
        if o_direct:
            raise NoDirectIO(f"{p}: the file system does not support O_DIRECT")
        return opened(p, flags, o_direct)

    monkeypatch.setattr(setup, "open_descriptor", no_direct)
    with gnn() as ld:
        assert ld.reader.direct_io is False
    monkeypatch.undo()
    samples = write_h5(tmp_path / "s.h5", x=np.arange(64 * 8, dtype=np.float32).reshape(64, 8))
    with Loader([samples], batch_size=4, epochs=1, buffer=8) as ld:
        assert ld.reader.direct_io is False


@pytest.mark.parametrize("width", [1024, 20])  # words of 8 bytes, and bytes
def test_the_rehearsal_compiles_the_kernel_a_pass_runs(tmp_path, width):
    """packed.rehearse (solar/warm.py's, where packing is configured) leaves a pass nothing
    to compile: the kernel's signature is the one chunk_write calls."""
    from solar.cache.packed import _assemble, rehearse

    rehearse(width)
    known = list(_assemble.signatures)
    ex = Executor(2)
    _built(tmp_path, _source(300, width), [np.arange(0, 300, 7, dtype=np.int64)], 64, ex).close()
    ex.close()
    assert list(_assemble.signatures) == known


@pytest.mark.xdist_group("launchers")  # node buffers: beside the tests watching their names
def test_a_hosts_ranks_pack_the_misses_its_plan_gives_each_byte_for_byte(graph, tmp_path):
    """``share="node"`` under mpiexec (one host of 3 ranks; nodes, seeds and chunks dividing
    nothing; the script runs as well on 2): whole epochs of every rank's batches are the
    random path's of the same plan (rows alone, agreed though only rank 0's device packs),
    byte for byte, and h5py's rows, with its hits; each rank's windows, decided by its
    planner, cover its steps and hold exactly the storage reads the host plan gives it; rank
    0's packed windows are built (tests/mpi/host_packing.py)."""
    from ranks_apart import MPIEXEC, run_job

    if not MPIEXEC.exists():
        pytest.skip("no mpiexec beside python")
    script = os.path.join(os.path.dirname(__file__), "mpi", "host_packing.py")
    env = {k: v for k, v in os.environ.items() if k != "SOLAR_HOSTS"}
    result = run_job(MPIEXEC, 3, [script, str(graph[0]), str(tmp_path)], 240, env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "host packing 3 ranks: ok" in result.stdout
    assert os.listdir(tmp_path) == []  # every packed layout freed (unlinked from the start)
