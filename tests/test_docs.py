"""The documentation site builds strictly, and its pages and the README name only what exists.

The pages' code blocks run in tests/test_readme.py; here: ``mkdocs build --strict`` (a broken
link or anchor, a page outside the navigation, a docstring mkdocstrings cannot collect, a
click command mkdocs-click cannot render: each is an error), no absolute path of a machine in
the prose (a reader's machine has no /work or /home/someone), and every module, file and
dotted name of solar that the prose quotes exists.
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = {"README.md": (ROOT / "README.md").read_text()} | {
    str(p.relative_to(ROOT)): p.read_text() for p in sorted((ROOT / "docs").rglob("*.md"))
}


def prose(text: str) -> str:
    """``text`` without its fenced code blocks (which may create or name any path)."""
    out, inside = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            inside = not inside
        elif not inside:
            out.append(line)
    return "\n".join(out)


# An absolute path: a slash that starts a word (not inside a URL, a fraction such as 1/P, I/O
# or a relative path such as bench/results/x), followed by a name and another slash or a dot
# extension, as in /tmp/g21/graph1m.h5, /home/me/data, /usr/bin/time or /data.h5.
# The kernel's own file systems (/dev/shm, /proc, /sys) are the same on every Linux machine.
ABSOLUTE = re.compile(r"(?<![\w.:/~\])-])/(?!(?:dev|proc|sys)/)[A-Za-z_][\w.-]*(?:/|\.\w)")


def test_absolute_paths_are_found():
    found = [ABSOLUTE.search(t) for t in ("see /work/x.h5", "`/tmp/a/b`", "(/home/me/d)")]
    assert all(found)
    fine = (
        "1/P of the reuse",
        "I/O",
        "`/dev/shm`",
        "/proc/PID/fd",
        "bench/results/a.json",
        "https://x.org/a",
        "~/.cache/x",
    )
    assert not any(ABSOLUTE.search(t) for t in fine)


@pytest.mark.parametrize("page", list(PAGES))
def test_no_absolute_paths_outside_code_blocks(page):
    hits = [m.group(0) for m in ABSOLUTE.finditer(prose(PAGES[page]))]
    assert not hits, f"{page}: absolute paths {hits}"


def test_the_readme_is_short_and_links_the_site():
    readme = PAGES["README.md"]
    assert len(readme.splitlines()) <= 400
    assert readme.startswith("# solar\n\n```\nmake demo ") and "\nmake test " in readme[:300]
    for page in ("docs/guides/dataloader.md", "docs/performance.md", "docs/cli.md"):
        assert f"]({page})" in readme
    # Its links to files of the repository (mkdocs checks the site's own) lead somewhere.
    targets = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", prose(readme))
    assert len(targets) > 10 and [t for t in targets if not (ROOT / t).exists()] == []


# `solar/...py` files and `solar.x.y` dotted names quoted in the prose.
FILES = re.compile(r"\b((?:solar|bench|examples|tests)/[\w/]+\.py)\b")
DOTTED = re.compile(r"`(solar(?:\.\w+)+)")


def _resolves(name: str) -> bool:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def test_every_file_and_name_quoted_exists():
    files = {f for t in PAGES.values() for f in FILES.findall(prose(t))}
    names = {n for t in PAGES.values() for n in DOTTED.findall(prose(t))}
    assert len(files) > 20 and len(names) > 5
    assert sorted(f for f in files if not (ROOT / f).exists()) == []
    assert sorted(n for n in names if not _resolves(n)) == []


def test_the_site_builds_strictly(tmp_path):
    """What `make docs` runs, into a scratch directory; warnings are errors."""
    res = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    for page in ("index.html", "cli/index.html", "api/index.html", "guides/pyg/index.html"):
        assert (tmp_path / page).stat().st_size > 1000, page
    cli = (tmp_path / "cli" / "index.html").read_text()
    assert all(f"solar {c}" in cli for c in ("plan", "bench", "inspect", "convert", "gen"))
    api = (tmp_path / "api" / "index.html").read_text()
    assert "solar.loader.Loader" in api and ":func:" not in api  # roles shown as code (hooks.py)
