"""ProcessLocal: per-process state is rebuilt in a forked child or an unpickled copy."""

from __future__ import annotations

import os
import pickle
import threading
import warnings

from solar._process import ProcessLocal


def test_built_once_per_process_and_never_shared_with_a_child():
    local = ProcessLocal(threading.Lock)
    lock = local.get()
    assert local.get() is lock and local.here() is lock
    lock.acquire()  # held by the parent at fork: a child must not inherit it
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads
        pid = os.fork()
    if pid == 0:
        ok = local.here() is None and local.get() is not lock and local.get().acquire(False)
        ok = ok and local.drop() is not None and local.here() is None
        os._exit(0 if ok else 1)
    assert os.waitpid(pid, 0)[1] == 0
    assert local.here() is lock  # the parent's is untouched
    lock.release()
    assert local.drop() is lock and local.here() is None
    assert local.get() is not lock  # built again after drop


def test_pickling_keeps_only_the_builder():
    local = ProcessLocal(dict)
    local.get()["x"] = 1
    copy = pickle.loads(pickle.dumps(local))
    assert copy.here() is None and copy.get() == {}
