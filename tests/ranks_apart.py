"""Jobs of several processes, each rank's output read apart from the others'.

Ranks writing to one pipe (the launcher's) may reach it as one line: under load a test once saw
two ranks' "refused: ..." lines joined (issue 45, 7). So each rank writes files of its own
(mpiexec's ``-outfile-pattern``/``-errfile-pattern``, torchrun's ``--log-dir --redirects 3``,
a simulated srun's files), and a job's ``stdout``/``stderr`` are its ranks', one after the
other in rank order, then the launcher's own; ``ranks[r]`` is rank r's (stdout, stderr).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

MPIEXEC = Path(sys.executable).with_name("mpiexec")
TORCHRUN = Path(sys.executable).with_name("torchrun")


class Job(subprocess.CompletedProcess):
    """A finished job: ``stdout``/``stderr`` are its ranks' (in rank order) then the
    launcher's; ``ranks[r]``: rank r's (stdout, stderr), never another rank's text."""

    ranks: list[tuple[str, str]]


def joined(args, code: int, ranks: list[tuple[str, str]], out: str = "", err: str = "") -> Job:
    """The job of ``ranks``' outputs and the launcher's ``out``/``err``."""
    job = Job(args, code, "".join(r[0] for r in ranks) + out, "".join(r[1] for r in ranks) + err)
    job.ranks = ranks
    return job


def run_job(launcher: Path, n: int, argv: Sequence[str], timeout: float,
            env: dict[str, str] | None = None) -> Job:  # fmt: skip
    """``python argv`` on ``n`` ranks under ``launcher`` (MPIEXEC or TORCHRUN), one node."""
    with tempfile.TemporaryDirectory() as tmp:
        if launcher == TORCHRUN:
            cmd = [str(launcher), "--standalone", "--nproc_per_node", str(n), "--log-dir", tmp,
                   "--redirects", "3", *argv]  # fmt: skip
        else:
            cmd = [str(launcher), "-outfile-pattern", f"{tmp}/out.%r", "-errfile-pattern",
                   f"{tmp}/err.%r", "-n", str(n), sys.executable, *argv]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                              check=False)  # fmt: skip
        ranks = [(_read(tmp, launcher, r, "out"), _read(tmp, launcher, r, "err")) for r in range(n)]
    return joined(cmd, proc.returncode, ranks, proc.stdout, proc.stderr)


def _read(tmp: str, launcher: Path, r: int, which: str) -> str:
    if launcher == TORCHRUN:  # <log-dir>/<run id>/attempt_0/<local rank>/stdout.log
        found = sorted(Path(tmp).glob(f"*/attempt_*/{r}/std{which}.log"))
    else:
        found = [Path(tmp) / f"{which}.{r}"]
    return "".join(p.read_text(errors="replace") for p in found if p.exists())
