"""``Kept``: the one small cache of the package, for values that take a while to make.

A planner, a validator and the runtime ask for the same epoch's draws, in different threads:
each value is made once (a second caller of the same key waits for the first, never makes it
again), the least recently used dropped beyond ``keep``, or sooner by the owner
(:meth:`Kept.drop`). A copy in another process starts empty (what is kept is this process's).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import Generic, TypeVar

V = TypeVar("V")


class Kept(Generic[V]):
    """Up to ``keep`` values by key, each made once."""

    def __init__(self, keep: int) -> None:
        self._keep = max(1, int(keep))
        self._lock = threading.Lock()
        self._items: OrderedDict[Hashable, Future] = OrderedDict()
        self._pid = os.getpid()

    def _here(self) -> None:
        """In a forked child, start empty: a value the parent was making never comes."""
        if self._pid != os.getpid():
            self.__init__(self._keep)  # type: ignore[misc]

    def get(self, key: Hashable, make: Callable[[], V]) -> V:
        """The value of ``key``: kept, being made (waited for), or made now by ``make``."""
        self._here()
        with self._lock:
            kept = self._items.get(key)
            if kept is None:
                got: Future = Future()
                self._items[key] = got
                while len(self._items) > self._keep:
                    self._items.popitem(last=False)  # (a waiter holds its future)
            else:
                self._items.move_to_end(key)
        if kept is not None:
            return kept.result()
        try:
            value = make()
        except BaseException as exc:
            with self._lock:  # not kept: the next caller tries again
                if self._items.get(key) is got:
                    del self._items[key]
            got.set_exception(exc)
            raise
        got.set_result(value)
        return value

    def __contains__(self, key: Hashable) -> bool:
        self._here()
        with self._lock:
            return key in self._items

    def drop(self, unwanted: Callable[[Hashable], bool]) -> None:
        """Forget every key ``unwanted`` says (their values are not asked again)."""
        self._here()
        with self._lock:
            for key in [k for k in self._items if unwanted(k)]:
                del self._items[key]

    def __getstate__(self) -> dict:
        return {"keep": self._keep}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["keep"])  # type: ignore[misc]
