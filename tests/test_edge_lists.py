"""Text edge lists read strictly (solar.graph.textedges): two integer ids a line (or a weight
column declared), comments and one header; any other line, a bad gzip file or an id no int64
holds refused in one line naming the file; the passes ask for blocks the budget holds."""

from __future__ import annotations

import gzip
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest

from solar.cli import main as cli_main
from solar.errors import SolarError
from solar.graph import textedges, write_graph
from solar.graph.csrwrite import edge_block, memory_bytes
from solar.graph.textedges import TextEdges


def _edges(path: Path, weights=None, size=3) -> np.ndarray:
    """The (E, 2) edges a text file reads as, in file order."""
    got = [np.stack([s.copy(), d.copy()], 1) for s, d in TextEdges(path, weights).chunks(size)]
    return np.concatenate(got) if got else np.zeros((0, 2), np.int64)


def _convert(path: Path, out: Path, **kw) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (no labels, no split)
        return write_graph(path, out, **kw)


def _pairs_of(h5: Path) -> list[tuple[int, int]]:
    with h5py.File(h5, "r") as f:
        indptr, indices = f["indptr"][()], f["indices"][()]
    dst = np.repeat(np.arange(indptr.shape[0] - 1), np.diff(indptr))
    return sorted(zip(indices.tolist(), dst.tolist(), strict=True))


def test_separators_comments_and_a_header_are_read_as_declared(tmp_path):
    p = tmp_path / "e.csv"
    p.write_bytes(b"\xef\xbb\xbf# SNAP-style comment\n% and another\nsrc,dst\n1,2\n3 4\n"
                  b"5\t6\r\n 7 , 8 \n\n9,\t10\n11  12")  # fmt: skip
    assert _edges(p).tolist() == [[1, 2], [3, 4], [5, 6], [7, 8], [9, 10], [11, 12]]
    w = tmp_path / "w.txt"
    w.write_text("src dst weight\n0 1 0.5\n2 3 -1e-3\n4 5 7\n")
    assert _edges(w, "ignore").tolist() == [[0, 1], [2, 3], [4, 5]]
    big = tmp_path / "big.csv"
    big.write_text(f"{2**63 - 1},0\n")
    assert _edges(big).tolist() == [[2**63 - 1, 0]]


@pytest.mark.parametrize(
    "text, weights, message",
    [
        # a weighted list without the option: its first edge refused, never paired
        ("src,dst,w\n1,2,0.5\n3,4,0.25\n", None, 'e.csv:2: expected 2 integer ids, got "1,2,0.5"'),
        # one id on a line (two such lines used to shift every later pair by one)
        ("1,2\n3,4\n7\n5,6\n8\n", None, 'e.csv:3: expected 2 integer ids, got "7"'),
        ("0,1\n2,3,0.5\n", None, 'e.csv:2: expected 2 integer ids, got "2,3,0.5"'),
        ("0,1\n12.7,40.2\n", None, 'e.csv:2: node ids must be integers, got "12.7,40.2"'),
        ("0,1\n3,1e3\n", None, 'e.csv:2: node ids must be integers, got "3,1e3"'),
        (f"0,1\n{2**63},1\n", None, f"e.csv:2: a node id above {2**63 - 1} (int64's largest)"),
        (f"0,{2**64 + 5}\n", None, f"e.csv:1: a node id above {2**63 - 1}"),
        ("0,1\n-1,3\n", None, 'e.csv:2: a negative node id, got "-1,3"'),
        ("0,1\nsrc,dst\n", None, 'e.csv:2: expected 2 integer ids, got "src,dst"'),
        ("0,1,\n", None, 'e.csv:1: expected 2 integer ids, got "0,1,"'),
        ("0,1,0.5\n2,3\n", "ignore", 'e.csv:2: expected 2 integer ids and a weight, got "2,3"'),
        ("0,1,w\n", "ignore", 'e.csv:1: expected 2 integer ids and a weight, got "0,1,w"'),
        # a first line of numbers written nan/inf is no header
        ("nan,1\n0,1\n", None, 'e.csv:1: expected 2 integer ids, got "nan,1"'),
    ],
)
def test_a_line_not_of_the_declared_shape_is_refused_naming_it(tmp_path, text, weights, message):
    p = tmp_path / "e.csv"
    p.write_text(text)
    with pytest.raises(SolarError) as got:
        _convert(p, tmp_path / "g.h5", weights=weights)
    assert str(got.value).startswith(f"{p.parent}/{message}") and "\n" not in str(got.value)
    assert not (tmp_path / "g.h5").exists()


def test_a_weighted_list_converts_with_its_weights_ignored(tmp_path):
    rng = np.random.default_rng(0)
    e = rng.integers(0, 50, (2000, 2))
    p = tmp_path / "w.csv.gz"
    with gzip.open(p, "wt") as f:
        f.write("src,dst,weight\n" + "".join(f"{a},{b},{rng.random():.3f}\n" for a, b in e))
    got = _convert(p, tmp_path / "g.h5", weights="ignore", num_nodes=50)
    assert got["edges"] == 2000
    assert _pairs_of(tmp_path / "g.h5") == sorted(map(tuple, e.tolist()))


def test_lines_across_buffer_refills_and_a_late_bad_line(tmp_path):
    e = np.random.default_rng(1).integers(0, 10**9, (30_000, 2))
    p = tmp_path / "e.txt"
    text = "".join(f"{a}\t{b}\n" for a, b in e)
    p.write_text(text)  # ~600 KB: several 64 KiB buffers, lines cut at their edges
    assert np.array_equal(_edges(p, size=4096), e)
    p.write_text(text + "5 6 7\n")
    with pytest.raises(SolarError, match=r'e\.txt:30001: expected 2 integer ids, got "5 6 7"'):
        _edges(p, size=4096)


def _truncated(p: Path) -> None:
    data = gzip.compress(b"0,1\n" * 5000)
    p.write_bytes(data[: len(data) // 2])


def _not_gzip(p: Path) -> None:
    p.write_bytes(b"0,1\n1,2\n")


@pytest.mark.parametrize(
    "make, message",
    [
        (_truncated, "truncated gzip file (the compressed data ends before its end marker)"),
        (_not_gzip, "not a readable gzip file (Not a gzipped file (b'0,'))"),
    ],
)
def test_a_bad_gzip_file_is_refused_naming_it(tmp_path, capsys, make, message):
    p = tmp_path / "e.csv.gz"
    make(p)
    with pytest.raises(SolarError, match="^" + str(p).replace(".", r"\.") + ": "):
        _convert(p, tmp_path / "g.h5")
    with pytest.raises(SystemExit) as code:
        cli_main(["convert", str(p), str(tmp_path / "g.h5")])
    err = capsys.readouterr().err
    assert code.value.code == 1
    assert err.splitlines()[-1] == f"solar: error: {p}: {message}"
    assert err.count("solar: ") == 1 and not (tmp_path / "g.h5").exists()


def test_the_cli_refuses_a_bad_line_in_one_line_and_reads_a_declared_weight(tmp_path, capsys):
    p = tmp_path / "e.csv"
    p.write_text("0,1,0.5\n1,2,0.5\n")
    with pytest.raises(SystemExit) as code:
        cli_main(["convert", str(p), str(tmp_path / "g.h5")])
    err = capsys.readouterr().err
    assert code.value.code == 1
    assert err.splitlines()[-1] == f'solar: error: {p}:1: expected 2 integer ids, got "0,1,0.5"'
    cli_main(["convert", str(p), str(tmp_path / "g.h5"), "--weight-column", "ignore"])
    assert _pairs_of(tmp_path / "g.h5") == [(0, 1), (1, 2)]


@pytest.mark.parametrize("raised, code, line", [
    (EOFError("ran out"), 1, "solar: error: input ended early (ran out)"),
    (KeyboardInterrupt(), 130, "solar: aborted"),
])  # fmt: skip
def test_only_an_interrupt_exits_130(tmp_path, capsys, monkeypatch, raised, code, line):
    import solar.graph.ingest as ingest

    def fail(*a, **kw):
        raise raised

    monkeypatch.setattr(ingest, "convert_graph", fail)
    p = tmp_path / "e.csv"
    p.write_text("0,1\n")
    with pytest.raises(SystemExit) as got:
        cli_main(["convert", str(p), str(tmp_path / "g.h5")])
    assert got.value.code == code
    assert capsys.readouterr().err.strip().splitlines()[-1] == line


@pytest.mark.parametrize("num_nodes, order", [(None, False), (40, False), (40, True)])
def test_every_pass_asks_for_blocks_the_budget_holds(tmp_path, monkeypatch, num_nodes, order):
    """A block's edges at their bytes (40, or 48 with a node order's relabelled copy) fill at
    most half the budget."""
    asked: list[int] = []
    chunks = TextEdges.chunks

    def recording(self, size, lo=0, hi=None):
        asked.append(size)
        return chunks(self, size, lo, hi)

    monkeypatch.setattr(TextEdges, "chunks", recording)
    p = tmp_path / "e.csv"
    p.write_text("".join(f"{i},{(i * 7) % 40}\n" for i in range(40)))
    perm = np.random.default_rng(0).permutation(40) if order else None
    _convert(p, tmp_path / "g.h5", memory="16MiB", num_nodes=num_nodes, order=perm)
    # the node count's pass (when not given), the counting pass and one placing pass
    block = edge_block(memory_bytes("16MiB"), relabel=order)
    assert asked == [block] * (3 if num_nodes is None else 2)
    assert block * (48 if order else 40) <= memory_bytes("16MiB") // 2


def test_the_kernel_stays_in_bounds_whatever_the_bytes(monkeypatch):
    """The kernel run as Python (an index out of range raises there) on random and mutated
    lines, with small outputs, agrees with the compiled one."""
    rng = np.random.default_rng(7)
    tokens = ["0", "42", "9" * 19, "9" * 20, ",", ", ", " ", "\t", "\n", "\r\n", "#", "%", ".5",
              "-", "e3", "+", "a", '"', "1.5e-2"]  # fmt: skip
    cases = []
    for _ in range(1000):
        if rng.random() < 0.8:
            buf = np.frombuffer("".join(rng.choice(tokens, rng.integers(0, 14))).encode(), np.uint8)
        else:
            buf = rng.integers(0, 256, int(rng.integers(0, 40))).astype(np.uint8)
        cases.append((buf, len(buf) + int(rng.integers(0, 3)), bool(rng.random() < 0.6),
                      int(rng.integers(2, 4)), int(rng.integers(0, 4))))  # fmt: skip
    compiled = []
    for buf, n, final, cols, cap in cases:
        s, d, res = np.zeros(cap, np.int64), np.zeros(cap, np.int64), np.zeros(6, np.int64)
        textedges._parse(buf, n, final, cols, s, d, res)
        compiled.append((res.tolist(), s.tolist(), d.tolist()))
    column = []  # the one-column kernel (labels or ids) on the same bytes
    for buf, _, _, cols, cap in cases:
        out, res = np.zeros(cap, np.int64), np.zeros(6, np.int64)
        textedges._parse(buf, len(buf), True, cols - 2, out, out, res)  # one label, one id
        column.append((res.tolist(), out.tolist()))
    for name in ("_blank", "_digit", "_id", "_sep", "_number", "_word", "_header", "_label"):
        monkeypatch.setattr(textedges, name, getattr(textedges, name).py_func)
    for (buf, n, final, cols, cap), want, col in zip(cases, compiled, column, strict=True):
        s, d, res = np.zeros(cap, np.int64), np.zeros(cap, np.int64), np.zeros(6, np.int64)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (uint8 arithmetic on the Python path)
            textedges._parse.py_func(buf, n, final, cols, s, d, res)
            assert (res.tolist(), s.tolist(), d.tolist()) == want
            assert 0 <= res[0] <= len(buf) and 0 <= res[1] <= cap
            out, res = np.zeros(cap, np.int64), np.zeros(6, np.int64)
            textedges._parse.py_func(buf, len(buf), True, cols - 2, out, out, res)
            assert (res.tolist(), out.tolist()) == col
            assert 0 <= res[0] <= len(buf) and 0 <= res[1] <= cap


# -- one-column files: labels, splits, node counts --------------------------------------------
EDGES = np.array([[0, 1, 2, 3], [1, 2, 3, 0]])


def test_labels_and_splits_in_text_keep_every_line(tmp_path):
    """A labels CSV whose first line is -1 or nan (unlabelled), +3 or 2.0, and a split whose
    first line is a node id, keep that line (it used to be dropped as a header, shifting every
    label by one node); a real header is skipped; labels and split end up in the file as
    written."""
    edges = EDGES
    lab, train = tmp_path / "node-label.csv", tmp_path / "train.csv"
    lab.write_text("-1\n2\nnan\n+3\n")
    train.write_text("3\n0\n")
    _convert({"edge_index": edges}, tmp_path / "g.h5", labels=lab, train_idx=train)
    with h5py.File(tmp_path / "g.h5") as f:
        assert f["labels"][()].tolist() == [-1, 2, -1, 3]
        assert f["train_idx"][()].tolist() == [3, 0]
    lab.write_text("# OGB-style\nlabel\nNaN\n2.0\n1e0\n-1\n")
    train.write_text('"node"\r\n1\r\n')
    _convert({"edge_index": edges}, tmp_path / "h.h5", labels=lab, train_idx=train)
    with h5py.File(tmp_path / "h.h5") as f:
        assert f["labels"][()].tolist() == [-1, 2, 1, -1]
        assert f["train_idx"][()].tolist() == [1]


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("labels", "0\n1,2\n3\n4\n", 'labels.csv:2: expected one class label, got "1,2"'),
        ("labels", "y,z\n0,1\n2,3\n", 'labels.csv:2: expected one class label, got "0,1"'),
        ("labels", ".5\n1\n2\n3\n", "labels.csv:1: a class label must be a whole number"),
        ("labels", "1\n2\ninf\n3\n", "labels.csv:3: a class label must be a whole number"),
        ("labels", "1\n2\n3\nx\n", 'labels.csv:4: expected one class label, got "x"'),
        ("train_idx", "-1\n2\n", 'train_idx.csv:1: a negative node id, got "-1"'),
        ("train_idx", "nan\n2\n", 'train_idx.csv:1: expected one integer node id, got "nan"'),
        ("train_idx", "+3\n2\n", 'train_idx.csv:1: expected one integer node id, got "+3"'),
        ("train_idx", "1\n2.0\n", 'train_idx.csv:2: node ids must be integers, got "2.0"'),
        ("train_idx", "1 2\n", 'train_idx.csv:1: expected one integer node id, got "1 2"'),
    ],
)
def test_a_bad_line_of_a_one_column_file_is_refused_naming_it(tmp_path, name, text, message):
    p = tmp_path / f"{name}.csv"
    p.write_text(text)
    with pytest.raises(SolarError) as got:
        _convert({"edge_index": EDGES}, tmp_path / "g.h5", **{name: p})
    assert str(got.value).startswith(f"{p.parent}/{message}") and "\n" not in str(got.value)
    assert not (tmp_path / "g.h5").exists()
