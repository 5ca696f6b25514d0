"""Tensors handed to torch.distributed, kept alive here until torch's threads have let go.

A gloo collective runs on the process group's worker threads (C++), and a worker drops its
references to the collective's tensors only after it has woken the caller: often (most calls,
measured) the caller returns first. If Python then drops a tensor it made, torch keeps the
tensor's Python object alive for the C++ side, and the worker's final release takes the GIL to
free it. Near exit that races the interpreter's finalisation: a thread taking the GIL after
finalisation began is ended with ``pthread_exit``, whose unwinding through torch's noexcept
destructor calls ``std::terminate`` ("terminate called without an active exception", SIGABRT:
a rank that did all its work fails the job). Python always being the last to let go of its
tensors removes the race: :func:`hold` keeps them until their C++ count is back to one, and at
exit this process waits (GIL released) until torch has let go of all of them.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from typing import Any

_EXIT_WAIT_S = 10.0  # at exit: how long to wait for torch's threads (never long in practice)

_lock = threading.Lock()
_held: list[Any] = []
_pid = os.getpid()


def _shared(t: Any) -> bool:
    """Whether a C++ reference other than the Python object's own holds ``t``."""
    count = getattr(t, "_use_count", None)  # (torch's own count; absent: nothing is held)
    return count is not None and count() > 1


def hold(*tensors: Any) -> None:
    """Keep ``tensors`` (just handed to a collective) until torch holds them no more; drop
    those held before that torch has let go of."""
    global _pid
    with _lock:
        if _pid != os.getpid():  # a forked child: no thread of torch holds the parent's
            _held.clear()
            _pid = os.getpid()
        _held[:] = [t for t in _held if _shared(t)]
        # CPU tensors only: gloo's (NCCL's works are released by its watchdog on its own
        # schedule, which this does not wait for).
        _held.extend(t for t in tensors if t.device.type == "cpu")


def wait_for_release(timeout_s: float = _EXIT_WAIT_S) -> None:
    """Wait until torch's threads hold none of the tensors held here (sleeping: a thread
    waiting for the GIL gets it), then drop them."""
    if _pid != os.getpid():
        return
    deadline = time.monotonic() + timeout_s
    with _lock:
        while any(_shared(t) for t in _held) and time.monotonic() < deadline:
            time.sleep(0.001)
        if not any(_shared(t) for t in _held):
            _held.clear()  # (else a worker stalled for seconds: they stay held)


atexit.register(wait_for_release)
