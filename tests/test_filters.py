"""The filter table (solar/io/filters.py) is the one place filters are described: the decoder,
the reader's routing and ``solar inspect`` all read it."""

from __future__ import annotations

import dataclasses

import h5py
import numpy as np
import pytest

from solar.io.codecs import Decoder, Unsupported, decoder_for
from solar.io.filters import DEFLATE, FILTERS, SHUFFLE, describe_filter, filter_problem
from solar.io.hdf5 import describe, read_path
from solar.io.inspect import format_reports, inspect_files

pytest.importorskip("imagecodecs")


def test_every_filter_has_a_name_a_label_and_a_decoder_or_a_reason():
    names = [f.name for f in FILTERS.values()]
    assert len(set(names)) == len(names)
    for filter_id, record in FILTERS.items():
        assert record.id == filter_id and record.name
        assert record.label(()).startswith(record.name)  # e.g. "bitshuffle(none)"
        assert describe_filter(filter_id, ()) == record.label(())
        why = record.problem(())
        assert (record.decode is not None) != (why is not None)
        if why is not None:
            assert why == f"filter {filter_id} ({record.name}) has no decoder"
    assert FILTERS[SHUFFLE].added == 0 and not FILTERS[SHUFFLE].compresses
    assert describe_filter(32017, ()) == "filter 32017"
    assert filter_problem(32017, (), "") == "filter 32017 (unknown) has no decoder"


def _gzip_shuffle(path) -> None:
    with h5py.File(path, "w") as f:
        data = np.arange(10 * 6 * 4, dtype="<f4").reshape(10, 6, 4)
        f.create_dataset("x", data=data, chunks=(2, 6, 4), compression="gzip", shuffle=True)


def test_inspect_names_filters_as_the_table_does(tmp_path):
    path = tmp_path / "g.h5"
    _gzip_shuffle(path)
    (report,) = inspect_files([path])
    assert report.filters == ["shuffle", "deflate level 4"] and report.compressed
    assert report.read_path == "chunks"
    assert "parallel decode: shuffle+deflate" in report.read_path_why
    assert "shuffle, deflate level 4" in format_reports([report])


def test_the_table_drives_inspect_and_the_readers_decoder(tmp_path, monkeypatch):
    path = tmp_path / "g.h5"
    _gzip_shuffle(path)
    renamed = dataclasses.replace(FILTERS[DEFLATE], name="inflate")
    monkeypatch.setitem(FILTERS, DEFLATE, renamed)
    (report,) = inspect_files([path])
    assert report.filters == ["shuffle", "inflate level 4"]
    assert "shuffle+inflate" in report.read_path_why
    with h5py.File(path) as f:
        decoder = decoder_for(f["x"])
        assert isinstance(decoder, Decoder) and decoder.stages[1].filter is renamed
        assert decoder.decode(f["x"].id.read_direct_chunk((0, 0, 0))[1]).tobytes() == (
            f["x"][:2].tobytes()
        )
    # A filter without a decoder in the table: every part reads the dataset through h5py.
    monkeypatch.setitem(FILTERS, DEFLATE, dataclasses.replace(renamed, decode=None))
    with h5py.File(path) as f:
        assert decoder_for(f["x"]) == Unsupported("filter 1 (inflate) has no decoder")
        assert read_path(f["x"]) == ("h5py", "h5py fallback: filter 1 (inflate) has no decoder")
    assert describe([path]).stored.decodable.tolist() == [[False]]
    (report,) = inspect_files([path])
    assert report.read_path == "h5py" and report.filters == ["shuffle", "inflate level 4"]
