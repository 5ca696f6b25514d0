"""Directory trees walked recursively in sorted order; one scan per job under a communicator,
its exchanged table validated as any file-derived input."""

from __future__ import annotations

import dataclasses

import h5py
import numpy as np
import pytest
from test_mpi import launch

from solar import Loader
from solar.config import ReaderConfig
from solar.errors import SolarError
from solar.io.hdf5 import scan_hdf5
from solar.io.inspect import inspect_files
from solar.io.scan import ScanPart, shared_scan
from solar.io.sources import describe_source, expand_sources

N = 23  # prime: shares and batches that do not divide evenly
RNG = np.random.default_rng(5)
IMG = RNG.standard_normal((N, 4, 3)).astype(np.float32)
LAB = RNG.integers(-9, 9, (N, 2)).astype(np.int64)
# Sorted by path parts: a/ before a0/ (a plain string sort of "a/.." vs "a0/.." agrees; "a-1"
# sorts before "a/" by character but after it by parts).
DIRS = ["a", "a-1", "a/x", "b/000", "b/001", "c"]


def tree(root, kind: str = "h5"):
    """N one-sample files spread over nested directories, with decoys the walk must skip;
    returns the files in the order the walk must give."""
    order = []
    for i in range(N):
        sub = root / DIRS[i % len(DIRS)]
        sub.mkdir(parents=True, exist_ok=True)
        path = sub / f"s{i:02d}.{'npy' if kind == 'npy' else 'hdf5'}"
        if kind == "npy":
            np.save(path, IMG[i])
        else:
            with h5py.File(path, "w") as f:
                f["img"], f["lab"] = IMG[i], LAB[i]
        order.append(path)
    (root / "b" / "notes.txt").write_text("not data")
    (root / ".hidden").mkdir()
    np.save(root / ".hidden" / "x.npy", IMG[0])  # skipped: a dot directory
    order.sort(key=lambda p: p.relative_to(root).parts)
    return order


@pytest.mark.one_process
@pytest.mark.parametrize("kind", ["h5", "npy"])
def test_a_directory_tree_is_walked_in_sorted_order_and_served_exactly(tmp_path, kind):
    order = tree(tmp_path / "train", kind)
    assert expand_sources(tmp_path / "train") == order
    assert [p.relative_to(tmp_path / "train").parts[0] for p in order][:2] == ["a", "a"]
    info = describe_source(tmp_path / "train", one_per_file=True)
    assert list(info.files) == order
    if kind == "h5":
        assert [r.file for r in inspect_files([tmp_path / "train"]) if r.name == "img"] == [
            str(p) for p in order
        ]
    ref = {int(p.stem[1:]): i for i, p in enumerate(order)}  # file name's number -> sample id
    seen = []
    with Loader(
        tmp_path / "train", batch_size=4, epochs=2, buffer=5, reader=ReaderConfig(one_per_file=True)
    ) as ld:
        for e in range(2):
            ld.set_epoch(e)
            for b in ld:
                idx = b["index"].numpy()
                seen.append(idx)
                numbers = np.array([int(order[i].stem[1:]) for i in idx])
                key = "data" if kind == "npy" else "img"
                assert b[key].numpy().tobytes() == IMG[numbers].tobytes()
                if kind == "h5":
                    assert b["lab"].numpy().tobytes() == LAB[numbers].tobytes()
    assert sorted(ref.values()) == list(range(N))
    assert (np.bincount(np.concatenate(seen), minlength=N) == 2).all()


@pytest.mark.one_process
def test_a_directory_with_nothing_usable_names_itself(tmp_path):
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "sub" / "a.txt").write_text("x")
    (tmp_path / "d" / ".cache").mkdir()
    np.save(tmp_path / "d" / ".cache" / "x.npy", IMG)
    with pytest.raises(SolarError, match=r"d: directory holds no \.h5, \.hdf5 or \.npy files"):
        describe_source(tmp_path / "d")
    tree(tmp_path / "mixed")
    np.save(tmp_path / "mixed" / "c" / "z.npy", IMG[0])
    with pytest.raises(SolarError, match=r"mix \.npy and HDF5"):
        describe_source(tmp_path / "mixed", one_per_file=True)


class _Comm:
    """Two ranks in one process: this is rank 0; ``peer`` makes what rank 1 sends."""

    def __init__(self, peer):
        self.peer = peer

    def Get_rank(self):
        return 0

    def Get_size(self):
        return 2

    def bcast(self, obj, root=0):
        return obj

    def allgather(self, obj):
        return [obj, self.peer(obj)]


@pytest.mark.one_process
def test_a_peers_table_is_validated(tmp_path):
    files = tree(tmp_path / "t")
    whole = describe_source(files, one_per_file=True)
    names = [k.name for k in whole.keys]

    def part(lo, hi):
        return scan_hdf5(files[lo:hi], names, True)

    honest = describe_source(files, one_per_file=True, comm=_Comm(lambda _: ("ok", part(11, 23))))
    assert honest.identity == whole.identity and honest.lengths == whole.lengths
    assert np.array_equal(honest.stored.offsets, whole.stored.offsets)
    good = part(11, 23)
    where = good.where.copy()
    where[3, 0, 0] = good.sizes[3, 0]  # a dataset starting at the end of its file
    lies = {
        "ends past the file's end": dataclasses.replace(good, where=where),
        "sample count is out of range": dataclasses.replace(good, lengths=good.lengths * 2),
        "lengths is not int64": dataclasses.replace(good, lengths=good.lengths[:-1]),
        "malformed key record": dataclasses.replace(
            good, keys=(good.keys[0], ("lab", (-2,), "<i8"))
        ),
        "a storage record is out of range": dataclasses.replace(good, where=where - 10**9),
    }
    for message, lie in lies.items():
        with pytest.raises(SolarError, match=message):
            describe_source(files, one_per_file=True, comm=_Comm(lambda _, x=lie: ("ok", x)))
    with pytest.raises(SolarError, match="malformed answer"):
        describe_source(files, one_per_file=True, comm=_Comm(lambda _: "rubbish"))
    with pytest.raises(SolarError, match=r"s05\.hdf5: corrupt"):  # a peer's error, raised here
        describe_source(
            files, one_per_file=True, comm=_Comm(lambda _: ("error", "x/s05.hdf5: corrupt"))
        )
    other = dataclasses.replace(good, keys=(("img", (4, 4), "<f4"), good.keys[1]))
    with pytest.raises(SolarError, match=r"key 'img' holds \(4, 4\) float32 samples, but"):
        describe_source(files, one_per_file=True, comm=_Comm(lambda _: ("ok", other)))


@pytest.mark.one_process
def test_shared_scan_gives_parts_in_file_order():
    made = []

    def scan(lo, hi):
        made.append((lo, hi))
        return ScanPart((), np.zeros(0, np.int64), np.zeros((0, 0, 3), np.int64),
                        np.zeros((0, 1), np.int64))  # fmt: skip

    shared_scan(_Comm(lambda mine: mine), 0, scan, lambda *a: None)
    assert made == [(0, 0)]  # this rank's share of none


# tests/mpi/scan.py's jobs: ranks -> the kinds of tree it checks, one after the other in one job
# (a launch costs more than a case).
SCAN_JOBS = {2: ("h5",), 3: ("h5", "npy")}


@pytest.fixture(scope="module")
def scan_job(tmp_path_factory):
    """``ranks -> the finished job`` of scan.py over a tree of each kind of SCAN_JOBS[ranks]."""
    jobs = {}

    def get(ranks: int):
        if ranks not in jobs:
            args = []
            for kind in SCAN_JOBS[ranks]:
                root = tmp_path_factory.mktemp(f"scan-{kind}") / "train"
                tree(root, kind)
                args += [root, *(["--npy"] if kind == "npy" else [])]
            jobs[ranks] = launch("mpiexec", ranks, "scan.py", *args)
        return jobs[ranks]

    return get


@pytest.mark.parametrize(("ranks", "kind"), [(2, "h5"), (3, "h5"), (3, "npy")])
def test_ranks_share_one_scan_and_serve_exact_bytes(scan_job, ranks, kind):
    result = scan_job(ranks)
    for r in range(ranks):
        assert f"{kind}: rank {r} of {ranks}: ok" in result.stdout, result.stdout + result.stderr
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.one_process
def test_low_level_scan_agrees_with_the_general_one(tmp_path, monkeypatch):
    """The scan's fast path (h5py's low-level calls, plain datasets only) finds what the general
    path finds, for every kind of dataset; anything not plain goes the general way."""
    import solar.io.hdf5 as hdf5

    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    kinds = {
        "plain": dict(data=x),
        "big-endian": dict(data=x.astype(">f4")),
        "chunked": dict(data=x, chunks=(1, 3, 4)),
        "gzip": dict(data=x, chunks=(1, 3, 4), compression="gzip"),
        "compact": dict(data=x[:, :1, :1].copy()),
        "unwritten": dict(shape=(2, 3, 4), dtype=np.float32),
        "empty": dict(shape=(0, 3), dtype=np.int16),
        "bool": dict(data=np.ones((2, 3), bool)),
    }
    for name, kw in kinds.items():
        path = tmp_path / f"{name}.h5"
        with h5py.File(path, "w") as f:
            if name == "compact":
                space = h5py.h5s.create_simple((2, 1, 1))
                plist = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
                plist.set_layout(h5py.h5d.COMPACT)
                dset = h5py.h5d.create(f.id, b"k", h5py.h5t.IEEE_F32LE, space, plist)
                dset.write(h5py.h5s.ALL, h5py.h5s.ALL, kw["data"])
            else:
                f.create_dataset("k", **kw)
            f["g/v"] = np.arange(2, dtype=np.int32)
        for names in (["k"], ["k", "g/v"]):
            for one in (False, True):
                try:
                    fast = scan_hdf5([path], names, one)
                except SolarError as exc:
                    fast = str(exc)
                with monkeypatch.context() as m:
                    m.setattr(hdf5, "_scan_plain", lambda *a: None)
                    try:
                        general = scan_hdf5([path], names, one)
                    except SolarError as exc:
                        general = str(exc)
                if isinstance(general, str):
                    assert fast == general, (name, names, one)
                    continue
                assert isinstance(fast, ScanPart), (name, names, one, fast)
                assert fast.keys == general.keys, (name, names, one)
                for field in ("lengths", "where", "sizes"):
                    assert np.array_equal(getattr(fast, field), getattr(general, field)), (
                        name, names, one, field,
                    )  # fmt: skip
    took = {
        name: hdf5._scan_plain(p, [b"k"], ["k"], False, p.stat().st_size) is not None
        for name in kinds
        for p in [tmp_path / f"{name}.h5"]
    }
    assert took == {**dict.fromkeys(kinds, False), "plain": True, "bool": True}, took
    # A truncated file: the fast path steps aside and the general one names the file.
    path = tmp_path / "plain.h5"
    data = path.read_bytes()
    cut = tmp_path / "cut.h5"
    cut.write_bytes(data[: len(data) - 40])
    with pytest.raises(SolarError, match=r"cut\.h5"):
        scan_hdf5([cut], ["k"], False)
