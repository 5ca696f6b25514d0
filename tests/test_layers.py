"""The package's layering: imports go downward only, and no module reaches into another
package's private modules. Every import statement counts, at any depth of a module (inside
functions, under ``if TYPE_CHECKING``): a lazy import hides a circle, it does not remove it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "solar"


def _modules() -> dict[str, Path]:
    """Every module of solar by dotted name (a package by its ``__init__``)."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The solar modules ``name`` imports anywhere in its file."""
    is_package = path.name == "__init__.py"
    here = name.split(".") if is_package else name.split(".")[:-1]
    found: set[str] = set()

    def add(target: str) -> None:
        while target and target not in modules:  # a name inside a module: the module
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = here[: len(here) - node.level + 1]
                base = ".".join([*up, base]) if base else ".".join(up)
            for alias in node.names:
                add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {m for m in found if m == "solar" or m.startswith("solar.")}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {n: _imports(n, p, modules) for n, p in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of the graph, if it has one (depth-first search, colours)."""
    colour: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        colour[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if colour.get(m) == 1:
                return [*stack[stack.index(m) :], m]
            if m not in colour and (found := visit(m)):
                return found
        stack.pop()
        colour[n] = 2
        return None

    for n in sorted(graph):
        if n not in colour and (found := visit(n)):
            return found
    return None


def test_imports_form_no_circle():
    graph = _graph()
    assert len(graph) > 50  # the walk found the package
    assert graph["solar.loader"] >= {"solar.runtime.pipeline", "solar.runtime.setup"}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_packages_form_no_circle():
    """solar/io below solar/cache below solar/runtime, and so on: between packages too (a
    module of io importing cache while cache imports io is a circle of layers)."""

    def package(m: str) -> str:
        parts = m.split(".")
        return ".".join(parts[:2]) if len(parts) > 2 else m

    packages: dict[str, set[str]] = {}
    for name, targets in _graph().items():
        packages.setdefault(package(name), set()).update(package(t) for t in targets)
    for p, targets in packages.items():
        targets.discard(p)
    assert _cycle(packages) is None, " -> ".join(_cycle(packages) or [])


def test_the_cycle_finder_finds_a_planted_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycle(graph) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_imports_another_packages_private_module():
    bad = []
    for name, targets in _graph().items():
        for target in targets:
            parts = target.split(".")
            private = [i for i, p in enumerate(parts) if p.startswith("_")]
            if not private:
                continue
            owner = ".".join(parts[: private[0]])  # the package the private module is of
            if not (name == owner or name.startswith(owner + ".")):
                bad.append(f"{name} imports {target}")
    assert not bad, bad


def test_lazy_imports_count(tmp_path):
    """An import inside a function or under TYPE_CHECKING is an edge like any other."""
    src = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from solar.stats import X\n"
    src += "def f():\n    import solar.runtime.steps\n"
    path = tmp_path / "m.py"
    path.write_text(src)
    modules = _modules()
    assert _imports("solar.fake", path, modules) == {"solar.stats", "solar.runtime.steps"}


_SHARING = ("mmap", "fcntl", "solar.host.memfd", "memfd_create", "/proc")


def _shares_memory(root: Path) -> list[str]:
    """What the modules under ``root`` use of a host's shared memory (see below)."""
    bad = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                names = [base, *(f"{base}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Attribute) and node.attr == "memfd_create":
                names = ["memfd_create"]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names = ["/proc"] if "/proc/" in node.value else []
            bad += [f"{path.name}: {n}" for n in names if n in _SHARING]
    return bad


def test_the_planner_is_pure():
    """solar/schedule/ decides; what a host's processes share (memfds, mappings, /proc paths)
    lives in solar/host/: no module of schedule imports mmap, fcntl or solar.host.memfd,
    creates a memfd or names a /proc path."""
    assert not _shares_memory(PACKAGE / "schedule"), _shares_memory(PACKAGE / "schedule")


def test_the_purity_check_finds_shared_memory(tmp_path):
    (tmp_path / "m.py").write_text("import mmap\nfd = os.memfd_create('x')\n")
    (tmp_path / "n.py").write_text("from solar.host import memfd\np = f'/proc/{pid}/fd/{fd}'\n")
    assert _shares_memory(tmp_path) == ["m.py: mmap", "m.py: memfd_create",
                                        "n.py: solar.host.memfd", "n.py: /proc"]  # fmt: skip
