from __future__ import annotations

import shutil

import h5py
import numpy as np
import pytest
from helpers import write_h5

from solar import SolarError
from solar.io.generate import PRESETS, generate
from solar.io.hdf5 import describe


def test_files_concatenate_into_one_sample_space(tmp_path):
    a = write_h5(tmp_path / "a.h5", img=np.zeros((5, 2, 3), np.float32), lab=np.zeros(5, np.int8))
    b = write_h5(tmp_path / "b.h5", img=np.zeros((7, 2, 3), np.float32), lab=np.zeros(7, np.int8))
    info = describe([a, b], ["img", "lab"])
    assert info.num_samples == 12 and info.lengths == (5, 7)
    assert info.sample_bytes == 2 * 3 * 4 + 1
    assert [k.name for k in describe([a]).keys] == ["img", "lab"]  # default: every dataset


def test_identity_follows_content_layout_not_location(tmp_path):
    a = write_h5(tmp_path / "a.h5", img=np.zeros((5, 2), np.float32))
    (tmp_path / "copy").mkdir()
    shutil.copy(a, tmp_path / "copy" / "a.h5")
    assert describe([a]).identity == describe([tmp_path / "copy" / "a.h5"]).identity
    other = write_h5(tmp_path / "copy" / "a.h5", img=np.zeros((5, 3), np.float32))
    assert describe([a]).identity != describe([other]).identity


def test_files_that_disagree_are_named(tmp_path):
    a = write_h5(tmp_path / "a.h5", img=np.zeros((5, 2), np.float32))
    b = write_h5(tmp_path / "b.h5", img=np.zeros((5, 3), np.float32))
    with pytest.raises(SolarError, match=r"b.h5: key 'img' holds \(3,\) float32"):
        describe([a, b])
    g = tmp_path / "g.h5"
    with h5py.File(g, "w") as f:
        f.create_group("img")
        f["s"] = 3.0
    with pytest.raises(SolarError, match="a group, not a dataset"):
        describe([g], ["img"])
    with pytest.raises(SolarError, match="scalar"):
        describe([g], ["s"])
    with pytest.raises(SolarError, match="no file matches"):
        describe([tmp_path / "none*.h5"])
    with pytest.raises(SolarError, match="is a directory"):
        describe([tmp_path])


@pytest.mark.parametrize("preset", list(PRESETS))
def test_generate_is_deterministic_and_atomic(preset, tmp_path):
    a = generate(tmp_path / "a.h5", preset, 9, seed=1)
    b = generate(tmp_path / "b.h5", preset, 9, seed=1, chunks=4, compression="gzip")
    with h5py.File(a) as fa, h5py.File(b) as fb:
        for key, shape in PRESETS[preset].items():
            assert fa[key].shape == (9, *shape) and fa[key].chunks is None
            assert fb[key].chunks == (4, *shape)
            np.testing.assert_array_equal(fa[key][()], fb[key][()])
    with pytest.raises(SolarError, match="preset"):
        generate(tmp_path / "c.h5", "nope", 9)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.h5", "b.h5"]


def test_every_file_needs_the_first_files_keys(tmp_path):
    a = write_h5(tmp_path / "a.h5", img=np.zeros((5, 2), np.float32))
    b = write_h5(tmp_path / "b.h5", label=np.zeros((5, 2), np.float32))
    with pytest.raises(SolarError, match=r"b\.h5: no dataset key 'img'"):
        describe([a, b])
    c = write_h5(tmp_path / "c.h5", img=np.zeros((4, 2), np.float32), extra=np.zeros(4))
    assert describe([a, c]).num_samples == 9  # extra datasets elsewhere are ignored


def test_non_numeric_keys_are_refused(tmp_path):
    path = tmp_path / "s.h5"
    with h5py.File(path, "w") as f:
        f["names"] = np.array([b"a", b"bb"], dtype=h5py.string_dtype())
    with pytest.raises(SolarError, match="'names' has dtype"):
        describe([path])


def test_damaged_metadata_is_one_error(tmp_path, monkeypatch):
    path = write_h5(tmp_path / "a.h5", img=np.zeros((5, 2), np.float32))

    def broken(*args, **kwargs):
        raise RuntimeError("Object visitation failed (bad symbol table)")

    monkeypatch.setattr(h5py.File, "visititems", broken)
    with pytest.raises(SolarError, match=r"a\.h5: corrupt HDF5 file"):
        describe([path])
