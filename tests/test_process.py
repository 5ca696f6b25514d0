"""ProcessLocal: per-process state is rebuilt in a forked child or an unpickled copy."""

from __future__ import annotations

import os
import pickle
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

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


def test_threads_asking_first_build_once():
    builds = []

    def build():
        builds.append(1)
        # Widens the race (other threads ask meanwhile); one build holds at any speed.
        time.sleep(0.05)
        return object()

    local = ProcessLocal(build)
    with ThreadPoolExecutor(8) as pool:
        values = list(pool.map(lambda _: local.get(), range(8)))
    assert len(builds) == 1 and all(v is values[0] for v in values)


def test_a_child_forked_while_another_thread_builds_can_build():
    started, release = threading.Event(), threading.Event()

    def slow():
        started.set()
        release.wait(10)
        return "parent"

    local = ProcessLocal(slow)
    other = ProcessLocal(lambda: "child")
    t = threading.Thread(target=local.get)
    t.start()
    started.wait(10)  # a thread of the parent holds the build lock now
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads
        pid = os.fork()
    if pid == 0:
        os._exit(0 if other.get() == "child" and local._pid != os.getpid() else 1)
    release.set()
    t.join()
    assert os.waitpid(pid, 0)[1] == 0
