"""One sample per file (HDF5 and .npy) and .npy datasets, served as they are: whole runs are
byte-identical to h5py/numpy; descriptors stay bounded; bad input is one line."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import h5py
import numpy as np
import pytest

from solar import Loader, PlanningConfig, ReaderConfig
from solar.errors import SolarError
from solar.io.handles import FdCache
from solar.io.reader import Reader
from solar.io.sources import describe_source

N = 31  # prime
RNG = np.random.default_rng(12)
IMG = RNG.standard_normal((N, 5, 6)).astype(np.float32)
LAB = RNG.integers(-99, 99, (N, 3)).astype(np.int16)


def one_per_file_h5(root, chunked: bool = False):
    root.mkdir()
    for i in range(N):
        with h5py.File(root / f"s{i:03d}.h5", "w") as f:
            if chunked:
                f.create_dataset("img", data=IMG[i], chunks=(2, 6), compression="gzip")
            else:
                f["img"] = IMG[i]
            f["grp/lab"] = LAB[i]
    return root


def run_all(source, keys, world: int, **kw) -> dict[str, np.ndarray]:
    """Every rank's batches of a 2-epoch run, checked against ``IMG``/``LAB`` sample by sample."""
    seen = []
    for rank in range(world):
        with Loader(
            source, keys, batch_size=4, epochs=2, buffer=7, rank=rank, world_size=world, **kw
        ) as ld:
            for e in range(2):
                ld.set_epoch(e)
                for b in ld:
                    idx = b["index"].numpy()
                    seen.append(idx)
                    for name, ref in (("img", IMG), ("grp/lab", LAB), ("x", IMG), ("y", LAB)):
                        if name in b:
                            got = b[name].numpy()
                            assert got.tobytes() == ref[idx].tobytes(), name
                    if "data" in b:
                        assert b["data"].numpy().tobytes() == IMG[idx].tobytes()
    counts = np.bincount(np.concatenate(seen), minlength=N)
    assert (counts == 2).all()  # every sample once per epoch over all ranks
    return {}


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("world", [1, 3])
def test_one_sample_hdf5_files_are_served_exactly(tmp_path, chunked, world):
    root = one_per_file_h5(tmp_path / "d", chunked)
    run_all(root, None, world, reader=ReaderConfig(one_per_file=True))
    run_all(str(root / "s*.h5"), ["img", "grp/lab"], 1, reader=ReaderConfig(one_per_file=True))
    # (a glob)


def test_one_sample_layouts_take_the_fast_paths(tmp_path):
    root = one_per_file_h5(tmp_path / "d", chunked=True)
    info = describe_source(root, one_per_file=True)
    reader = Reader(info)
    lay = reader._layouts[0]
    assert lay[1].decoded and lay[1].whole and lay[0].offset is not None  # grp/lab, img
    flat = one_per_file_h5(tmp_path / "e")
    assert all(x.offset is not None for x in Reader(describe_source(flat, one_per_file=True))
               ._layouts[3])  # fmt: skip


@pytest.mark.parametrize("world", [1, 3])
def test_npy_one_per_file_and_many_per_file(tmp_path, world):
    one = tmp_path / "one"
    one.mkdir()
    for i in range(N):
        np.save(one / f"x_{i:03d}.npy", IMG[i])
        np.save(one / f"y_{i:03d}.npy", LAB[i])
    run_all({"x": str(one / "x_*.npy"), "y": str(one / "y_*.npy")}, None, world,
            reader=ReaderConfig(one_per_file=True))  # fmt: skip
    many = tmp_path / "many"
    many.mkdir()
    for j, (lo, hi) in enumerate([(0, 10), (10, 11), (11, N)]):
        np.save(many / f"{j}.npy", IMG[lo:hi])
    run_all(many, None, world)  # a directory: one key, "data"


def test_identity_covers_the_new_sources(tmp_path):
    root = one_per_file_h5(tmp_path / "d")
    a = describe_source(root, one_per_file=True).identity
    with pytest.warns(UserWarning, match=r"pass reader=ReaderConfig\(one_per_file=True\)"):
        b = describe_source(root, ["grp/lab"]).identity  # each file read as 3 samples
    assert a != b
    d = tmp_path / "n"
    d.mkdir()
    for i in range(N):
        np.save(d / f"x_{i:03d}.npy", IMG[i])
        np.save(d / f"y_{i:03d}.npy", LAB[i])
    x = describe_source({"x": str(d / "x_*.npy")}, one_per_file=True).identity
    xy = describe_source({"x": str(d / "x_*.npy"), "y": str(d / "y_*.npy")}, one_per_file=True)
    assert x != xy.identity
    assert x == describe_source(str(d / "x_*.npy"), ["x"], one_per_file=True).identity


def test_no_warning_for_many_samples_per_file(tmp_path):
    root = tmp_path / "d"
    root.mkdir()
    for i in range(10):
        with h5py.File(root / f"{i}.h5", "w") as f:
            f["img"] = IMG[:5]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        describe_source(root)


def test_bad_npy_is_one_line(tmp_path):
    np.save(tmp_path / "f.npy", np.asfortranarray(IMG[:4]))
    with pytest.raises(SolarError, match=r"f\.npy: Fortran-ordered"):
        describe_source(tmp_path / "f.npy")
    np.save(tmp_path / "o.npy", np.array([1, "a"], dtype=object), allow_pickle=True)
    with pytest.raises(SolarError, match=r"o\.npy: dtype object"):
        describe_source(tmp_path / "o.npy")
    np.save(tmp_path / "t.npy", IMG)
    raw = (tmp_path / "t.npy").read_bytes()
    (tmp_path / "t.npy").write_bytes(raw[:-10])
    with pytest.raises(SolarError, match=r"t\.npy: truncated"):
        describe_source(tmp_path / "t.npy")
    np.save(tmp_path / "b.npy", IMG[:4].astype(IMG.dtype.newbyteorder(">")))
    with pytest.raises(SolarError, match=r"b\.npy: byte order >"):  # read by offset: swapped
        describe_source(tmp_path / "b.npy")
    (tmp_path / "g.npy").write_bytes(b"not numpy")
    with pytest.raises(SolarError, match=r"g\.npy: not a readable \.npy"):
        describe_source(tmp_path / "g.npy")
    np.save(tmp_path / "a.npy", IMG[:3])
    with pytest.raises(SolarError, match="different numbers of files"):
        describe_source({"x": [tmp_path / "a.npy"], "y": [tmp_path / "a.npy"] * 2})


@pytest.mark.parametrize("kind", ["h5", "npy"])
def test_streamed_files_read_what_the_cache_reads(tmp_path, monkeypatch, kind):
    """More files than the descriptor cache holds: the compiled open-read-close loop puts
    the same bytes in the same rows as reads through the cache (repeats included)."""
    if kind == "h5":
        root = one_per_file_h5(tmp_path / "d")
    else:
        root = tmp_path / "d"
        root.mkdir()
        for i in range(N):
            np.save(root / f"x_{i:03d}.npy", IMG[i])
    info = describe_source(root, one_per_file=True)
    samples = np.concatenate([np.random.default_rng(3).permutation(N), [4, 4, 30]])
    got = {}
    for capacity in (1024, 16):  # 16 < N files: streamed
        monkeypatch.setattr("solar.io.handles.fd_capacity", lambda c=capacity: c)
        reader = Reader(info)
        assert reader.files.streams == (capacity < N)
        out = [np.full((samples.size, *k.sample_shape), 7, k.native_dtype) for k in info.keys]
        reader.read(samples, out)
        reader.close()
        img = [k.name for k in info.keys].index("img" if kind == "h5" else "data")
        assert out[img].tobytes() == IMG[samples].tobytes()
        got[capacity] = b"".join(o.tobytes() for o in out)
    assert got[16] == got[1024]
    os.remove(sorted(root.iterdir())[5])  # a file gone: the retry names it
    reader = Reader(info)
    with pytest.raises(SolarError, match="cannot open"):
        reader.read(np.array([2, 5]), [np.empty((2, *k.sample_shape), k.native_dtype)
                                       for k in info.keys])  # fmt: skip
    reader.close()


def test_fd_cache_closes_idle_descriptors_only(tmp_path):
    paths = []
    for i in range(20):
        paths.append(tmp_path / f"{i}")
        paths[-1].write_bytes(b"x")
    cache = FdCache(16, lambda i: os.open(paths[i], os.O_RDONLY))
    with cache.use(0) as held:
        for i in range(1, 20):
            with cache.use(i):
                pass
        assert len(cache) == 16
        assert os.pread(held, 1, 0) == b"x"  # in use: never closed
    cache.close()
    assert len(cache) == 0


def test_descriptors_bounded_by_rlimit(tmp_path):
    root = tmp_path / "d"
    root.mkdir()
    script = textwrap.dedent(
        f"""
        import resource, os, numpy as np, h5py
        root = {str(root)!r}
        data = np.arange(300 * 8, dtype=np.float64).reshape(300, 8)
        for i in range(300):
            np.save(f"{{root}}/{{i:04d}}.npy", data[i])
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
        from solar import Loader
        from solar.config import ReaderConfig
        ld = Loader(root, batch_size=32, epochs=2, buffer=10,
                    reader=ReaderConfig(threads=4, one_per_file=True))
        for e in range(2):
            ld.set_epoch(e)
            for b in ld:
                assert (b["data"].numpy() == data[b["index"].numpy()]).all()
        assert len(ld.reader.files.fds) <= 32, len(ld.reader.files.fds)
        assert len(os.listdir("/proc/self/fd")) < 64
        # Three readers at once would want 3 x 32: they shrink when the process runs out.
        more = [Loader(root, batch_size=32, epochs=1, buffer=10, seed=s,
                       reader=ReaderConfig(threads=4, one_per_file=True)) for s in range(3)]
        for other in more:
            for b in other:
                assert (b["data"].numpy() == data[b["index"].numpy()]).all()
        print("ok")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ok" in out.stdout


def test_plan_file_from_the_cli_runs_one_sample_files(tmp_path, capsys):
    import json

    from test_cli import run_cli

    root = one_per_file_h5(tmp_path / "d")
    plan = tmp_path / "p.h5"
    # Ranks simulated in one process exchange no rows: a plan of variable batches.
    args = ["plan", root, "--one-per-file", "-P", 3, "-B", 4, "-E", 2, "-C", 7,
            "--variable-batches", "-o", plan]  # fmt: skip
    code, stdout, err = run_cli([*args, "--json"], capsys)
    assert code == 0, err
    assert json.loads(stdout)["accesses"] == 2 * N
    run_all(root, None, 3, reader=ReaderConfig(one_per_file=True),
            planning=PlanningConfig(plan=plan))  # fmt: skip
    # the plan's dataset identity matches
    with pytest.raises(SolarError, match="dataset"):
        run_all(root, ["img"], 3, reader=ReaderConfig(one_per_file=True),
                planning=PlanningConfig(plan=plan))  # fmt: skip
