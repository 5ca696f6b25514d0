"""Every example of the README and of the documentation site runs: their Python blocks, their
`solar` command lines, the example script.

The pages: README.md and every page under docs/. A fenced block labelled ``python`` is a
program and runs; one labelled ``py`` is a fragment of one (shown, not run); an unlabelled
block's lines that start with ``solar`` are command lines.

The fixture, the only substitution: each distinct Python block runs as it is written, in a
fresh process, in a directory holding small generated data under the names the pages use
(``data.h5``: 320 PtychoNN-like samples; ``graph.h5``: a 500-node graph; ``ogb/``: the same
graph as OGB keeps it; ``data/*.h5`` with keys ``img`` and ``grp/lab``; ``data/x_*.npy`` and
``data/y_*.npy``, one sample each; ``cosmoflow/``: one-sample HDF5 files; ``frames/``:
``.npy`` files of several samples), after a prelude that binds the names a block takes from
its surroundings (:data:`PRELUDE`). Every ``solar`` command line is checked with ``--help``;
the short ones (``solar plan``) run in full on the same data.
"""

from __future__ import annotations

import itertools
import os
import shlex
from collections.abc import Iterator
from pathlib import Path

import h5py
import numpy as np
import pytest
from click.testing import CliRunner
from fresh import Run, zygote

from solar.cli import cli
from solar.graph import generate_graph
from solar.io.generate import generate

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
PAGES = {"README.md": README} | {
    str(p.relative_to(ROOT)): p.read_text() for p in sorted((ROOT / "docs").rglob("*.md"))
}

# Names a block uses without defining them (its context in the page's prose), by what the
# block contains.
PRELUDE = {
    "dist.init()": (
        "import torch\n"
        "path, B, E, C = 'data.h5', 16, 2, 40\n"
        "net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(256 * 256, 1))\n"
        "def per_sample_loss(model, batch):\n"
        "    return model(batch['diffraction']).square().flatten()\n"
    ),
    # A DataLoader script as torchrun starts it, here as a world of one.
    "td.init_process_group": (
        "import os, socket\n"
        "with socket.socket() as _s:\n"
        "    _s.bind(('127.0.0.1', 0))\n"
        "    _port = _s.getsockname()[1]\n"
        "os.environ.update(RANK='0', WORLD_SIZE='1', MASTER_ADDR='127.0.0.1',\n"
        "                  MASTER_PORT=str(_port))\n"
    ),
}


def blocks(text: str, language: str) -> list[str]:
    """The fenced blocks of ``language`` ("" for unlabelled ones) in ``text``, in order."""
    found: list[tuple[str, list[str]]] = []
    inside = False
    for line in text.splitlines():
        if line.startswith("```"):
            inside = not inside
            if inside:
                found.append((line[3:].strip(), []))
        elif inside:
            found[-1][1].append(line)
    return ["\n".join(lines) + "\n" for lang, lines in found if lang == language]


def _distinct_python() -> dict[str, str]:
    """Each distinct ``python`` block of the pages, named by the first page that shows it
    (the README's quick start repeats the DataLoader guide's blocks: they run once)."""
    out: dict[str, str] = {}
    for page, text in PAGES.items():
        for i, block in enumerate(blocks(text, "python")):
            out.setdefault(block, f"{page}:{i}")
    return out


PYTHON = _distinct_python()
COMMANDS = [  # each distinct one, in order
    list(c)
    for c in dict.fromkeys(
        tuple(shlex.split(line.split("  #")[0]))
        for text in PAGES.values()
        for block in blocks(text, "")
        for line in block.replace("\\\n", " ").splitlines()
        if line.startswith("solar ")
    )
]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("readme")
    generate(d / "data.h5", "ptychonn", 320)  # the README plans 8 ranks x 32
    rng = np.random.default_rng(0)
    np.save(d / "weights.npy", (1.0 + np.arange(320)) ** -0.6)
    generate_graph(d / "graph.h5", 500, 6.0, 8, train_fraction=0.3)  # and as OGB keeps it:
    (d / "ogb").mkdir()
    with h5py.File(d / "graph.h5") as f:
        np.save(d / "ogb" / "features.npy", f["features"][()])
        np.save(d / "ogb" / "labels.npy", f["labels"][()][:, None])
        np.save(d / "ogb" / "train_idx.npy", f["train_idx"][()])
        dst = np.repeat(np.arange(500), np.diff(f["indptr"][()]))
        np.save(d / "ogb" / "edge_index.npy", np.stack([f["indices"][()], dst]))
    for sub in ("data", "cosmoflow", "frames"):
        (d / sub).mkdir()
    for i, n in enumerate((40, 23)):
        with h5py.File(d / "data" / f"part{i}.h5", "w") as f:
            f["img"] = rng.random((n, 4, 4), np.float32)
            f["grp/lab"] = rng.integers(0, 9, n)
    for i in range(40):
        np.save(d / "data" / f"x_{i:02d}.npy", rng.random((4, 4), np.float32))
        np.save(d / "data" / f"y_{i:02d}.npy", np.int64(i))
        with h5py.File(d / "cosmoflow" / f"{i:03d}.hdf5", "w") as f:
            f["x"] = rng.random((4, 4, 4), np.float32)
        np.save(d / "frames" / f"{i:02d}.npy", rng.random((5, 8), np.float32))
    return d


def test_the_pages_have_the_examples_this_file_runs():
    readme = blocks(README, "python")
    assert len(readme) >= 3 and all(block in PYTHON for block in readme)
    for guide in ("dataloader", "pyg", "one-sample-files", "launchers", "resume"):
        assert blocks(PAGES[f"docs/guides/{guide}.md"], "python"), guide
    lines = [line.split() for block in blocks(README, "") for line in block.splitlines()]
    readme_commands = {words[1] for words in lines if words[:1] == ["solar"]}
    assert readme_commands >= set(cli.commands), "the README shows every command once"
    assert all(any(key in block for block in PYTHON) for key in PRELUDE)


@pytest.fixture(scope="module")
def fresh(workdir) -> Iterator[Run]:
    """Fresh processes in ``workdir``, forked from one that imported torch and solar once."""
    env = {**os.environ, "SOLAR_LAUNCHER": "none", "PYTHONPATH": str(ROOT)}
    preload = "import h5py, numpy, torch, torch.distributed, torch.utils.data, solar, solar.dist"
    with zygote(preload, cwd=workdir, env=env) as run:
        yield run


@pytest.mark.parametrize("block", list(PYTHON), ids=list(PYTHON.values()))
def test_python_block_runs(block, fresh, tmp_path):
    prelude = "".join(code for key, code in PRELUDE.items() if key in block)
    res = fresh(prelude + block, out=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]


@pytest.mark.parametrize(
    "command", COMMANDS, ids=[" ".join(c[:2]) + f"-{i}" for i, c in enumerate(COMMANDS)]
)
def test_solar_command_line(command, workdir, monkeypatch):
    """Every command line names a command and only options it has (``--help`` works); the
    ones without placeholders and quick to run (``solar plan``) run in full."""
    assert command[0] == "solar" and command[1] in cli.commands, command
    runner = CliRunner()
    res = runner.invoke(cli, [command[1], "--help"])
    assert res.exit_code == 0, res.output
    params = cli.commands[command[1]].params
    known = {o for p in params for o in (*p.opts, *p.secondary_opts)}
    words = " ".join(command[2:]).replace("[", " ").replace("]", " ").split()
    options = {w.split("=")[0] for w in words if w.startswith("-") and not w[1:2].isdigit()}
    assert options <= known, f"{command[1]}: no option {sorted(options - known)}"
    quick = command[1] == "plan" and not any(c in " ".join(command) for c in "[]|")
    if quick:
        monkeypatch.chdir(workdir)
        # Each example starts afresh (-o refuses to overwrite what another example wrote).
        for flag, name in itertools.pairwise(command):
            if flag in ("-o", "--out", "--plot"):
                (workdir / name).unlink(missing_ok=True)
        res = runner.invoke(cli, command[1:])
        assert res.exit_code == 0, res.output
        # Each example starts afresh: what it wrote goes (-o refuses to overwrite).
        for flag, name in itertools.pairwise(command):
            if flag in ("-o", "--out", "--plot"):
                (workdir / name).unlink(missing_ok=True)


def test_the_example_script_helps_and_runs(fresh, tmp_path):
    """The script as ``python SCRIPT ARGS`` runs it: as ``__main__`` in a fresh process (one
    forked from the fixture's, SOLAR_LAUNCHER=none); every path it writes is given."""
    run = (ROOT / "examples" / "train_surrogate.py").read_text()
    res = fresh(run, "--help", out=tmp_path)
    assert res.returncode == 0 and "--epochs" in res.stdout
    args = ["--data", str(tmp_path / "d.h5"), "--samples", "48", "--epochs", "1",
            "--batch-size", "16", "--checkpoint", str(tmp_path / "ck.pt")]  # fmt: skip
    res = fresh(run, *args, out=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert (tmp_path / "ck.pt").exists()


def test_the_layout_lists_every_module():
    """The architecture page's Layout names each module of the package once, and none that
    is gone."""
    architecture = PAGES["docs/architecture.md"]
    section = architecture.split("## Layout\n", 1)[1].split("\n## ", 1)[0]
    listed = [line.split()[0] for line in section.split("```")[1].splitlines() if line.strip()]
    listed = [p for p in listed if p.startswith("solar/")]
    tree = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "solar").rglob("*.py"))
    assert sorted(listed) == tree
    assert len(listed) == len(set(listed))
