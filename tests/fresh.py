"""Fresh processes without a fresh import of torch each: :func:`zygote` starts one process
that imports what the scripts import (and runs ``check``), then runs each script in a child
forked from it, in the child's ``__main__`` as ``python -c SCRIPT ARGS`` would. The child
starts with nothing of another script's: no kernel loaded, no object made, no state changed
(the zygote runs nothing else); what it saves is the interpreter's start and the imports,
about 2-3 s each (torch)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ZYGOTE = textwrap.dedent(
    """
    import json, os, sys

    def child(code, argv, out):
        import atexit, builtins, os, signal, sys, traceback  # (the globals go: see main)
        status = 1
        try:
            signal.alarm(300)  # a script that hangs ends (as subprocess.run's timeout did)
            for fd, name in ((1, "stdout"), (2, "stderr")):
                os.dup2(os.open(os.path.join(out, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
            sys.argv = ["-c", *argv]
            main = sys.modules["__main__"].__dict__  # (what the script defines pickles)
            main.clear()
            main.update(__name__="__main__", __builtins__=builtins)
            exec(compile(code, "<string>", "exec"), main)
            status = 0
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        except BaseException:
            traceback.print_exc()
        finally:
            atexit._run_exitfuncs()  # what a process's exit runs (closing what it made)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)

    exec(sys.argv[1])  # the imports and the check
    for line in sys.stdin:
        code, argv, out = json.loads(line)
        pid = os.fork()
        if pid == 0:
            child(code, argv, out)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), flush=True)
    """
)

Run = Callable[..., subprocess.CompletedProcess]


@contextmanager
def zygote(preload: str, cwd: Path | None = None, env: dict | None = None) -> Iterator[Run]:
    """``run(script, *args, out=DIR)`` runs ``script`` in a fresh process (a child of a
    process that ran ``preload``) and returns its exit code, stdout and stderr (kept in
    ``DIR``)."""
    proc = subprocess.Popen([sys.executable, "-c", ZYGOTE, preload], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=cwd,
                            env=env)  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    stdin, stdout = proc.stdin, proc.stdout

    def run(code: str, *args: str, out: Path) -> subprocess.CompletedProcess:
        for name in ("stdout", "stderr"):
            (out / name).unlink(missing_ok=True)
        stdin.write(json.dumps([code, list(args), str(out)]) + "\n")
        stdin.flush()
        status = stdout.readline().strip()
        assert status, f"the zygote ended ({proc.wait()})"
        return subprocess.CompletedProcess(args, int(status), (out / "stdout").read_text(),
                                           (out / "stderr").read_text())  # fmt: skip

    try:
        yield run
    finally:
        stdin.close()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
