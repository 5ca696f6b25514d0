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
import shutil
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


def build_site(config_dir: Path, site: Path) -> tuple[int, list[str]]:
    """``mkdocs build --strict`` of the site configured in ``config_dir`` into ``site``:
    (exit status, the warnings and errors it logged). Not ``--quiet``: that raises the log
    level past WARNING, and strict mode then counts no warning and passes whatever it met."""
    res = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
        cwd=config_dir, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    problems = [x for x in res.stderr.splitlines() if x.startswith(("WARNING", "ERROR"))]
    return res.returncode, problems


def site_problems(config_dir: Path, site: Path) -> list[str]:
    """What fails the strict build: every warning or error, and a non-zero exit status."""
    code, problems = build_site(config_dir, site)
    return problems + ([f"mkdocs exited with status {code}"] if code else [])


def test_the_site_builds_strictly(tmp_path):
    """What `make docs` runs, into a scratch directory; any warning fails it."""
    assert site_problems(ROOT, tmp_path) == []
    for page in ("index.html", "cli/index.html", "api/index.html", "guides/pyg/index.html"):
        assert (tmp_path / page).stat().st_size > 1000, page
    cli = (tmp_path / "cli" / "index.html").read_text()
    assert all(f"solar {c}" in cli for c in ("plan", "bench", "inspect", "convert", "gen"))
    api = (tmp_path / "api" / "index.html").read_text()
    assert "solar.loader.Loader" in api and ":func:" not in api  # roles shown as code (hooks.py)


def test_a_broken_link_fails_the_build(tmp_path):
    """The check above can fail: a copy of the site with one link to a file outside docs/
    (what once passed under ``--quiet``) is refused, naming the page and the link."""
    copy = tmp_path / "copy"
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    (copy / "solar").symlink_to(ROOT / "solar")  # the API reference's sources
    page = copy / "docs" / "concepts" / "plan.md"
    page.write_text(page.read_text() + "\nSee [the raw figures](../../bench/results/x.json).\n")
    problems = site_problems(copy, tmp_path / "site")
    assert any("concepts/plan.md" in p and "bench/results/x.json" in p for p in problems)
    assert problems[-1].startswith("mkdocs exited with status")


# The API reference's directives (``::: solar.x.Name``) and, for each, the members it lists.
API = (ROOT / "docs" / "api.md").read_text()
DIRECTIVES = dict(re.findall(r"^::: ([\w.]+)\n((?:    .*\n)*)", API, re.M))


def _listed_members(options: str) -> set[str]:
    found = re.search(r"members: \[([^\]]*)\]", options)
    return set() if found is None else {m.strip() for m in found.group(1).split(",")}


def _object(dotted: str) -> object:
    module, _, name = dotted.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError:
        return importlib.import_module(dotted)


def test_every_public_name_is_in_the_api_reference():
    """Every name ``solar`` exports, and ``write_graph``, has its page in the API reference
    (the directive names the very object, wherever it is defined)."""
    import solar
    from solar.graph import write_graph

    assert len(DIRECTIVES) > 20
    shown = {id(_object(d)) for d in DIRECTIVES}
    public = {name: getattr(solar, name) for name in solar.__all__} | {"write_graph": write_graph}
    assert sorted(n for n, obj in public.items() if id(obj) not in shown) == []


def test_every_public_member_of_the_loader_is_in_the_api_reference():
    """The Loader's methods, properties and the attributes it declares (``stats``, ``share``)
    are each listed; a member added later without its entry fails here."""
    from solar.loader import Loader

    public = {n for n in (*vars(Loader), *Loader.__annotations__) if not n.startswith("_")}
    assert {"stats", "share", "set_epoch", "close"} <= public
    listed = _listed_members(DIRECTIVES["solar.loader.Loader"])
    assert sorted(public - listed) == [] and sorted(listed - public) == []


def test_help_shows_what_the_site_shows():
    """``help(write_graph)`` is complete in itself: no pointer to a module docstring, which
    the site does not show."""
    from solar.graph import write_graph

    doc = write_graph.__doc__ or ""
    assert "module docstring" not in doc and "OGB-style directory" in doc


def test_every_field_of_a_documented_record_is_described():
    """The records are shown without members (their docstrings say what each field does):
    each field is named in its record's docstring, and the Loader's keywords, which
    ``LoaderConfig`` holds, are the Loader's parameters (its signature and docstring)."""
    import dataclasses
    import inspect

    from solar.loader import Loader

    records = [d for d in DIRECTIVES if d.endswith("Config") and d != "solar.options.LoaderConfig"]
    assert len(records) >= 6
    for dotted in records:
        cls = _object(dotted)
        doc = cls.__doc__ or ""
        missing = [f.name for f in dataclasses.fields(cls) if f"``{f.name}``" not in doc]
        assert missing == [], f"{dotted}: fields not described {missing}"
    loader_config = _object("solar.options.LoaderConfig")
    keywords = set(inspect.signature(Loader).parameters) - {"moved"}
    assert {f.name for f in dataclasses.fields(loader_config)} == keywords


def test_the_pyg_guide_says_which_code_runs():
    """The PyG guide's ``python`` blocks (tests/test_readme.py runs each, in a process of its
    own, on a small generated graph) need nothing solar's environment lacks; PyG's own
    ``NeighborLoader``, which needs pyg-lib or torch-sparse (no wheel for the pinned torch),
    is only in a fragment, and the page says so before any code."""
    guide = PAGES["docs/guides/pyg.md"]
    runnable, fragments = re.split(r"^```", guide, flags=re.M), guide.split("```py\n")
    python = [b for b in runnable if b.startswith("python\n")]
    assert len(python) >= 2 and not any("NeighborLoader(" in b for b in python)
    assert len(fragments) == 2 and "NeighborLoader(" in fragments[1].split("```")[0]
    before_code = guide.split("```")[0]
    assert "pyg-lib" in before_code and "ImportError" in before_code
