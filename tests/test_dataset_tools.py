"""`solar inspect` and `solar convert`: every input layout round-trips; bad input leaves nothing."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
from test_cli import run_cli

from solar import Loader
from solar.io.convert import convert
from solar.io.inspect import format_reports, inspect_files

RNG = np.random.default_rng(7)
IMG = RNG.standard_normal((23, 4, 6)).astype(np.float32)
LAB = RNG.integers(-9, 9, (23, 3)).astype(np.int16)


def h5(path, img=IMG, lab=LAB, **layout):
    with h5py.File(path, "w") as f:
        f.create_dataset("img", data=img, **layout)
        f.create_dataset("grp/lab", data=lab, **({} if "chunks" in layout else layout))
    return path


def make_source(kind: str, root):
    root.mkdir()
    if kind == "contiguous":
        return [h5(root / "a.h5")], False
    if kind == "chunked-gzip":
        return [h5(root / "a.h5", chunks=(5, 2, 6), compression="gzip", shuffle=True)], False
    if kind == "big-endian":
        return [h5(root / "a.h5", img=IMG.astype(">f4"), lab=LAB.astype(">i2"))], False
    if kind == "many-files":
        return [h5(root / f"{i}.h5", IMG[lo:hi], LAB[lo:hi])
                for i, (lo, hi) in enumerate([(0, 10), (10, 11), (11, 23)])], False  # fmt: skip
    if kind == "one-per-file":
        for i in range(23):
            with h5py.File(root / f"s{i:03d}.h5", "w") as f:
                f["img"], f["grp/lab"] = IMG[i], LAB[i]
        return [root], True
    if kind == "npy-dir":
        np.save(root / "0.npy", IMG[:20])
        np.save(root / "1.npy", IMG[20:])
        return [root], False
    if kind == "npy-one-per-file":
        for i in range(23):
            np.save(root / f"{i:03d}.npy", IMG[i])
        return [root], True
    raise AssertionError(kind)


KINDS = ["contiguous", "chunked-gzip", "big-endian", "many-files", "one-per-file", "npy-dir",
         "npy-one-per-file"]  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
def test_convert_round_trips_and_loads_fast(kind, tmp_path):
    srcs, one = make_source(kind, tmp_path / "src")
    out = tmp_path / "out.h5"
    result = convert(srcs, out, one_per_file=one)
    assert result["samples"] == 23
    with h5py.File(out) as f:
        np.testing.assert_array_equal(f["img" if "npy" not in kind else "data"][()], IMG)
        if "npy" not in kind:
            np.testing.assert_array_equal(f["grp/lab"][()], LAB)
    reports = inspect_files([out])
    assert all(r.layout == "contiguous" and r.aligned and r.offset_reader for r in reports)
    assert all(r.filters == [] for r in reports)
    # The converted file is what the loader serves from offsets, byte for byte.
    keys = ["img"] if "npy" not in kind else ["data"]
    ld = Loader(out, keys, batch_size=5, epochs=1, buffer=5)
    for b in ld:
        np.testing.assert_array_equal(b[keys[0]].numpy(), IMG[b["index"].numpy()])


def test_inspect_names_layout_and_advice(tmp_path):
    path = h5(tmp_path / "a.h5", chunks=(1, 4, 6), compression="gzip")
    (img,) = [r for r in inspect_files([path]) if r.name == "img"]
    assert img.layout == "chunked" and img.chunks == (1, 4, 6)
    assert img.filters == ["deflate level 4"] and not img.offset_reader
    assert img.sample_bytes == 96
    assert any("one sample per chunk" in a for a in img.advice)
    assert any("compressed" in a and "solar convert" in a for a in img.advice)
    (lab,) = [r for r in inspect_files([path]) if r.name == "grp/lab"]
    assert lab.layout == "contiguous" and lab.offset_reader
    # Which path the Reader takes, and why: the same decision the Reader makes.
    assert img.read_path == "chunks" and "deflate" in img.read_path_why
    assert lab.read_path == "offset"


def test_inspect_says_why_a_dataset_falls_back_to_h5py(tmp_path):
    path = tmp_path / "s.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("lab", data=np.arange(40).reshape(10, 4), chunks=(2, 4), scaleoffset=0)
        f.create_dataset("be", data=np.zeros((10, 4), ">f4"))
    reports = {r.name: r for r in inspect_files([path])}
    assert reports["lab"].read_path == "h5py" and "scaleoffset" in reports["lab"].read_path_why
    assert reports["be"].read_path == "h5py" and "byte order" in reports["be"].read_path_why
    assert "read path: h5py (h5py fallback: filter 6 (scaleoffset)" in format_reports(
        list(reports.values())
    )


def test_inspect_cli_json_and_probe(tmp_path, capsys):
    path = h5(tmp_path / "a.h5")
    code, out, _ = run_cli(["inspect", path, "--json", "--probe", 8], capsys)
    assert code == 0
    result = json.loads(out)
    report = {r["name"]: r for r in result["datasets"]}
    assert report["img"]["shape"] == [23, 4, 6]
    assert set(report["img"]["probe_us"]) == {"h5py", "solar"}
    assert result["summary"]["samples"] == 23 and result["summary"]["convert"] is None
    code, out, _ = run_cli(["inspect", path], capsys)
    assert "at byte offsets" in out and "contiguous" in out and "nothing to convert" in out
    code, out, _ = run_cli(["inspect", path, "--verbose"], capsys)
    assert "served at byte offsets" in out and "read path: offset" in out


def _bad(tmp_path):
    a = h5(tmp_path / "a.h5")
    other_shape = h5(tmp_path / "b.h5", img=np.zeros((3, 4, 7), np.float32), lab=LAB[:3])
    other_dtype = h5(tmp_path / "c.h5", img=np.zeros((3, 4, 6)), lab=LAB[:3])
    truncated = h5(
        tmp_path / "t.h5", img=np.zeros((500, 64, 64), np.float32), lab=np.zeros((500, 3))
    )
    truncated.write_bytes(truncated.read_bytes()[:100_000])
    exists = tmp_path / "exists.h5"
    exists.write_bytes(b"keep me")
    return {
        "shapes disagree": ([a, other_shape], "holds (4, 7) float32 samples"),
        "dtypes disagree": ([a, other_dtype], "float64"),
        "missing key": ([a, "--key", "nope"], "no dataset key 'nope'"),
        "unreadable": ([tmp_path / "absent.h5"], "no such file"),
        "truncated": ([truncated], "t.h5"),
        "destination exists": ([a], "exists (use --force"),
    }, exists


@pytest.mark.parametrize("case", ["shapes disagree", "dtypes disagree", "missing key",
                                  "unreadable", "truncated", "destination exists"])  # fmt: skip
def test_convert_bad_input_is_one_line_and_leaves_nothing(case, tmp_path, capsys):
    cases, exists = _bad(tmp_path)
    args, message = cases[case]
    out = exists if case == "destination exists" else tmp_path / "out.h5"
    before = sorted(p.name for p in tmp_path.iterdir())
    code, stdout, err = run_cli(["convert", *args, out], capsys)
    assert code == 1 and stdout == ""
    assert err.count("\n") == 1 and err.startswith("solar: error:") and message in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no output, no temp file
    assert exists.read_bytes() == b"keep me"


def test_convert_force_overwrites(tmp_path, capsys):
    a = h5(tmp_path / "a.h5")
    out = tmp_path / "out.h5"
    out.write_bytes(b"old")
    code, stdout, _ = run_cli(["convert", a, out, "--force", "--key", "img"], capsys)
    assert code == 0 and "verified" in stdout
    with h5py.File(out) as f:
        assert list(f) == ["img"]
