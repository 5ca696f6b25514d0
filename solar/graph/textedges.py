"""Text edge lists read strictly: a declared shape per line, parsed by a compiled kernel.

A line holds exactly two node ids (``src dst``), or, with ``weights="ignore"``, two ids and a
number (``src dst weight``, the weight checked as a number and dropped, never taken for an id).
Ids are decimal integers of 0..2^63 - 1 (no sign, no fraction, no exponent). Fields are
separated by a comma (blanks around it allowed) or by spaces/tabs; a line may end in ``\\r``
(and the file begin with a UTF-8 byte order mark).
Blank lines and comment lines (first non-blank character ``#`` or ``%``) are skipped, and the
first other line is a header, skipped, if it begins with a letter, a quote or ``_`` (and is
not a number written ``nan`` or ``inf``). Any other line is refused in one line naming the
file, its line number and its text. ``.gz`` files are decompressed on the way; a truncated or
non-gzip file is refused naming it. The one-column files beside an edge list (labels, splits,
a node count) are read by the same rules, one number a line (:func:`read_numbers`).

The file is read into one byte buffer (never a Python object per line, never ``loadtxt``), at
most 16 bytes per edge of the block asked for, plus the block's two int64 arrays: about 32
bytes per edge, within the 40 the writer counts (48 with a node order, whose relabelled copy
adds 16: :func:`solar.graph.csrwrite.edge_bytes`). A line longer than the buffer is refused.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from numba import njit

from solar.errors import SolarError

WEIGHTS = (None, "ignore")  # what a weight column may be: none (two ids a line), or ignored
MIN_BUFFER = 1 << 16  # the longest line a file may hold is the buffer (64 KiB at least)
_BYTES_PER_EDGE = 16

# Kernel results (``res``): bytes consumed, edges written, lines passed, error, bad line's start.
_OK, _SHAPE, _OVERFLOW, _NEGATIVE, _FRACTION, _NOT_WHOLE = 0, 1, 2, 3, 4, 5
_INT64_MAX = (1 << 63) - 1
_ONE_LABEL, _ONE_ID = 0, 1  # the kernel's one-column modes (``cols``)


class TextEdges:
    """Edges of a text edge list (module docstring), read again for every pass."""

    def __init__(self, path: Path, weights: str | None = None) -> None:
        if weights not in WEIGHTS:
            raise SolarError(f"weights: expected None or 'ignore', got {weights!r}")
        if not path.is_file():
            raise SolarError(f"{path}: no such file")
        self.path, self.where, self.weights = path, str(path), weights
        self.num_nodes: int | None = None

    def chunks(self, size: int, lo: int = 0, hi: int | None = None):
        """(src, dst) int64 arrays of at most ``size`` edges, in file order. The arrays are
        reused: each pair is valid until the next is asked for."""
        size = max(1, int(size))
        buf = np.empty(max(MIN_BUFFER, _BYTES_PER_EDGE * size), np.uint8)
        src, dst = np.empty(size, np.int64), np.empty(size, np.int64)
        # res: consumed, edges, lines, error, bad line's start, a data/header line seen
        res = np.zeros(6, np.int64)
        cols = 3 if self.weights == "ignore" else 2
        have, eof, line = 0, False, 0
        with open_text(self.path) as f:
            have, eof = self._fill(f, buf, 0)
            if bytes(buf[:3]) == b"\xef\xbb\xbf" and have >= 3:  # a UTF-8 byte order mark
                _shift(buf, 3, have)
                have -= 3
            while True:
                if not eof:
                    have, eof = self._fill(f, buf, have)
                _parse(buf, have, eof, cols, src, dst, res)
                if res[3] != _OK:
                    raise self._refuse(buf, have, int(res[4]), line + int(res[2]) + 1, res[3])
                line += int(res[2])
                consumed, k = int(res[0]), int(res[1])
                if k:
                    yield src[:k], dst[:k]
                _shift(buf, consumed, have)
                have -= consumed
                if eof and have == 0:
                    return
                if consumed == 0 and k == 0 and have == buf.shape[0]:
                    raise SolarError(f"{self.path}:{line + 1}: a line longer than "
                                     f"{buf.shape[0]} bytes")  # fmt: skip

    def degrees(self) -> None:
        """None: a text list's in-degrees are known only by a pass over its lines (the
        writer's counting pass)."""
        return None

    def _fill(self, f: Any, buf: np.ndarray, have: int) -> tuple[int, bool]:
        """Read into ``buf[have:]`` until it is full or the file ends."""
        view = buf.data
        with read_errors(self.path):
            while have < buf.shape[0]:
                # (at most 1 MiB a call: a gzip file reads through a bytes object that long)
                got = f.readinto(view[have : have + (1 << 20)])
                if not got:
                    return have, True
                have += got
        return have, False

    def _refuse(self, buf: np.ndarray, have: int, start: int, line: int, code: int) -> Exception:
        want = "2 integer ids" + (" and a weight" if self.weights == "ignore" else "")
        return _refusal(self.path, buf, have, start, line, code, want)


def _refusal(path: Path, buf: np.ndarray, have: int, start: int, line: int, code: int,
             want: str) -> SolarError:  # fmt: skip
    """The one-line error for the bad line at ``buf[start:]`` (line number ``line``)."""
    ends = np.flatnonzero(buf[start:have] == 10)
    end = start + int(ends[0]) if ends.size else have
    text = bytes(buf[start:end]).rstrip(b"\r").decode("utf-8", "backslashreplace")
    shown = json.dumps(text if len(text) <= 80 else text[:77] + "...", ensure_ascii=False)
    why = {
        _SHAPE: f"expected {want}",
        _OVERFLOW: f"a {'label' if want.endswith('label') else 'node id'} above {_INT64_MAX} "
        "(int64's largest)",
        _NEGATIVE: "a negative node id",
        _FRACTION: "node ids must be integers",
        _NOT_WHOLE: "a class label must be a whole number (or NaN: unlabelled)",
    }[int(code)]
    return SolarError(f"{path}:{line}: {why}, got {shown}")


def open_text(path: Path) -> Any:
    """``path`` opened for reading bytes, decompressed if it ends in ``.gz`` (read it under
    :func:`read_errors`)."""
    try:
        return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb", buffering=0)
    except OSError as exc:
        raise SolarError(f"{path}: cannot read ({exc.strerror})") from None


@contextmanager
def read_errors(path: Path) -> Iterator[None]:
    """A failed read of ``path`` (a truncated or non-gzip ``.gz`` among them) as a one-line
    :class:`SolarError` naming it."""
    try:
        yield
    except EOFError:
        raise SolarError(f"{path}: truncated gzip file (the compressed data ends before its "
                         "end marker)") from None  # fmt: skip
    except gzip.BadGzipFile as exc:
        raise SolarError(f"{path}: not a readable gzip file ({exc})") from None
    except zlib.error as exc:
        raise SolarError(f"{path}: corrupt gzip data ({exc})") from None
    except OSError as exc:
        raise SolarError(f"{path}: cannot read ({exc.strerror or exc})") from None


def read_numbers(path: Path, labels: bool = False) -> np.ndarray:
    """The one column of a small text file read whole and as strictly as an edge list: node
    ids (a split, a node count), or with ``labels`` class labels (integers, whole numbers as
    floats, ``nan`` -- OGB's unlabelled -- read as -1). One number a line; blank and comment
    lines skipped, a first line beginning with a letter, a quote or ``_`` (not ``nan``/``inf``)
    taken as the header; any other line refused naming the file and line. int64."""
    with open_text(path) as f, read_errors(path):
        text = f.read()
    buf = np.frombuffer(text, np.uint8)
    if buf[:3].tobytes() == b"\xef\xbb\xbf":
        buf = buf[3:]
    out = np.empty(int(np.count_nonzero(buf == 10)) + 1, np.int64)  # a slot per line
    res = np.zeros(6, np.int64)
    _parse(buf, buf.shape[0], True, _ONE_LABEL if labels else _ONE_ID, out, out, res)
    if res[3] == _OK and res[0] != buf.shape[0]:  # (never: a slot per line)
        res[3], res[4] = _SHAPE, res[0]
    if res[3] != _OK:
        want = "one class label" if labels else "one integer node id"
        raise _refusal(path, buf, buf.shape[0], int(res[4]), int(res[2]) + 1, int(res[3]), want)
    return out[: int(res[1])].copy()


@njit(cache=True, nogil=True)
def _shift(buf, consumed, have):  # pragma: no cover - compiled
    """Move ``buf[consumed:have]`` to the front (an overlapping copy, lowest bytes first)."""
    have = min(have, buf.shape[0])
    for j in range(max(consumed, 0), have):
        buf[j - consumed] = buf[j]


@njit(cache=True, inline="always")
def _blank(c):  # pragma: no cover - compiled
    return c == 32 or c == 9


@njit(cache=True, inline="always")
def _digit(c):  # pragma: no cover - compiled
    return c >= 48 and c <= 57


@njit(cache=True, inline="always")
def _id(buf, p, e, out, k):  # pragma: no cover - compiled
    """Parse an id at ``buf[p:e]`` into ``out[k]``: (position after it, error code)."""
    if p < e and buf[p] == 45 and p + 1 < e and _digit(buf[p + 1]):
        return p, 3
    if p >= e or not _digit(buf[p]):
        return p, 1
    v = np.int64(0)
    while p < e and _digit(buf[p]):
        d = np.int64(buf[p] - 48)
        if v > (np.int64(9223372036854775807) - d) // 10:
            return p, 2
        v = v * 10 + d
        p += 1
    if p < e and (buf[p] == 46 or buf[p] == 101 or buf[p] == 69):  # '.', 'e', 'E'
        return p, 4
    out[k] = v
    return p, 0


@njit(cache=True, inline="always")
def _sep(buf, p, e):  # pragma: no cover - compiled
    """Skip a separator (blanks, or a comma with blanks around it): its end, or -1 if none."""
    q = p
    while q < e and _blank(buf[q]):
        q += 1
    if q < e and buf[q] == 44:
        q += 1
        while q < e and _blank(buf[q]):
            q += 1
    elif q == p:
        return -1
    return q


@njit(cache=True, inline="always")
def _number(buf, p, e):  # pragma: no cover - compiled
    """Skip a decimal number (sign, digits, fraction, exponent): its end, or -1 if none."""
    if p < e and (buf[p] == 43 or buf[p] == 45):
        p += 1
    digits = 0
    while p < e and _digit(buf[p]):
        p += 1
        digits += 1
    if p < e and buf[p] == 46:
        p += 1
        while p < e and _digit(buf[p]):
            p += 1
            digits += 1
    if digits == 0:
        return -1
    if p < e and (buf[p] == 101 or buf[p] == 69):
        p += 1
        if p < e and (buf[p] == 43 or buf[p] == 45):
            p += 1
        if p >= e or not _digit(buf[p]):
            return -1
        while p < e and _digit(buf[p]):
            p += 1
    return p


@njit(cache=True, nogil=True)
def _parse(buf, n, final, cols, src, dst, res):  # pragma: no cover - compiled
    """Parse the whole lines of ``buf[:n]`` (the last one too if ``final``) into ``src``/
    ``dst`` until they are full: ``cols`` 2 ids a line, 3 two ids and a weight, or one column
    into ``src`` (``dst`` unused): ``_ONE_ID`` an id, ``_ONE_LABEL`` a class label. ``res``:
    [0] bytes consumed, [1] edges (values), [2] lines passed, [3] error code (0: none), [4] the
    bad line's start; [5] whether a data or header line was seen (kept across calls). Every
    index is checked against the arrays' lengths."""
    n = min(n, buf.shape[0])
    cap = min(src.shape[0], dst.shape[0])
    i, k, lines = 0, 0, 0
    res[3] = 0
    while i < n:
        j = i
        while j < n and buf[j] != 10:
            j += 1
        if j == n and not final:
            break
        nxt = j + 1 if j < n else n
        e = j
        if e > i and buf[e - 1] == 13:
            e -= 1
        p = i
        while p < e and _blank(buf[p]):
            p += 1
        if p == e or buf[p] == 35 or buf[p] == 37:  # blank, '#' or '%': skipped
            lines += 1
            i = nxt
            continue
        if k >= cap:
            break
        if res[5] == 0:
            res[5] = 1
            if _header(buf, p, e):
                lines += 1
                i = nxt
                continue
        if cols == _ONE_LABEL:
            p, err = _label(buf, p, e, src, k)
        else:
            p, err = _id(buf, p, e, src, k)
        if err == 0 and cols >= 2:
            p = _sep(buf, p, e)
            if p < 0:
                err = 1
            else:
                p, err = _id(buf, p, e, dst, k)
        if err == 0 and cols == 3:
            p = _sep(buf, p, e)
            p = _number(buf, p, e) if p >= 0 else -1
            if p < 0:
                err = 1
        if err == 0:
            while p < e and _blank(buf[p]):
                p += 1
            if p != e:
                err = 1
        if err != 0:
            res[3], res[4] = err, i
            break
        k += 1
        lines += 1
        i = nxt
    res[0], res[1], res[2] = i, k, lines


@njit(cache=True, inline="always")
def _word(buf, p, e):  # pragma: no cover - compiled
    """1 if ``buf[p:e]`` begins with the field ``nan``, 2 if ``inf`` or ``infinity`` (any
    case), else 0."""
    if p + 3 > e:
        return 0
    a, b, c = buf[p] | 32, buf[p + 1] | 32, buf[p + 2] | 32
    q = p + 3
    if a == 110 and b == 97 and c == 110:  # "nan"
        kind = 1
    elif a == 105 and b == 110 and c == 102:  # "inf", maybe "inity" after it
        kind = 2
        rest = q + 5 <= e
        for j, ch in enumerate((105, 110, 105, 116, 121)):  # "inity"
            rest = rest and (buf[q + j] | 32) == ch
        if rest:
            q += 5
    else:
        return 0
    if q == e or _blank(buf[q]) or buf[q] == 44:
        return kind
    return 0


@njit(cache=True, inline="always")
def _header(buf, p, e):  # pragma: no cover - compiled
    """Whether the first data line (from ``p``) is a header: it begins with a letter, a quote
    or ``_``, and is not a number written ``nan`` or ``inf``."""
    c = buf[p]
    starts = (c >= 65 and c <= 90) or (c >= 97 and c <= 122) or c == 34 or c == 39 or c == 95
    return starts and _word(buf, p, e) == 0


@njit(cache=True, inline="always")
def _label(buf, p, e, out, k):  # pragma: no cover - compiled
    """Parse a class label at ``buf[p:e]`` into ``out[k]``: an optionally signed decimal
    number that is whole (``3``, ``+3``, ``3.0``, ``3e2``), or ``nan`` (-1, unlabelled).
    Returns (position after it, error code)."""
    neg = p < e and buf[p] == 45
    if p < e and (buf[p] == 43 or buf[p] == 45):
        p += 1
    word = _word(buf, p, e)
    if word == 1:
        out[k] = -1
        return p + 3, 0
    if word == 2:
        return p, 5
    top = np.int64(9223372036854775807)
    v, digits, scale = np.int64(0), 0, 0
    while p < e and _digit(buf[p]):
        d = np.int64(buf[p] - 48)
        if v > (top - d) // 10:
            return p, 2
        v = v * 10 + d
        p += 1
        digits += 1
    if p < e and buf[p] == 46:
        p += 1
        zeros = 0  # a fraction's zeros, kept until a digit after them needs them
        while p < e and _digit(buf[p]):
            d = np.int64(buf[p] - 48)
            digits += 1
            if d == 0:
                zeros += 1
            else:
                for _ in range(zeros + 1):
                    if v > top // 10:
                        return p, 2
                    v *= 10
                if v > top - d:
                    return p, 2
                v += d
                scale -= zeros + 1
                zeros = 0
            p += 1
    if digits == 0:
        return p, 1
    if p < e and (buf[p] == 101 or buf[p] == 69):
        p += 1
        eneg = p < e and buf[p] == 45
        if p < e and (buf[p] == 43 or buf[p] == 45):
            p += 1
        if p >= e or not _digit(buf[p]):
            return p, 1
        x = 0
        while p < e and _digit(buf[p]):
            x = min(x * 10 + (int(buf[p]) - 48), 10000)
            p += 1
        scale += -x if eneg else x
    while scale < 0 and v != 0 and v % 10 == 0:
        v //= 10
        scale += 1
    if scale < 0 and v != 0:
        return p, 5
    while scale > 0 and v != 0:
        if v > top // 10:
            return p, 2
        v *= 10
        scale -= 1
    out[k] = -v if neg else v
    return p, 0
