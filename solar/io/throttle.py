"""An emulated remote file system: per-request latency and a bandwidth cap (``--throttle``).

Used by the benchmark for every loader alike. The bandwidth is a token bucket shared by all
threads of a process and by the worker processes it forks (a shared ``multiprocessing``
value), so each rank gets ``bytes_per_s`` however many readers it runs; latency overlaps
between concurrent requests, as on a parallel file system.
"""

from __future__ import annotations

import multiprocessing as mp
import time

from solar.errors import SolarError


class Throttle:
    def __init__(self, mb_per_s: float, latency_ms: float) -> None:
        if mb_per_s <= 0 or latency_ms < 0:
            raise SolarError(
                f"throttle: need MB/s > 0 and latency >= 0, got {mb_per_s},{latency_ms}"
            )
        self.bytes_per_s = mb_per_s * 1e6
        self.latency_s = latency_ms / 1e3
        self._next = mp.get_context("fork").Value("d", 0.0)  # when the link is next free

    @classmethod
    def parse(cls, text: str) -> Throttle:
        """``"200,2"`` → 200 MB/s, 2 ms per request."""
        try:
            mbps, latency = (float(v) for v in text.split(","))
        except ValueError:
            raise SolarError(f"--throttle: expected MBps,latency_ms, got {text!r}") from None
        return cls(mbps, latency)

    def wait(self, nbytes: int, requests: int = 1) -> None:
        """Block as a remote read of ``nbytes`` in ``requests`` sequential requests would."""
        now = time.monotonic()
        with self._next.get_lock():
            start = max(now, self._next.value)
            self._next.value = start + nbytes / self.bytes_per_s
            done = self._next.value + requests * self.latency_s
        time.sleep(max(0.0, done - now))

    def __str__(self) -> str:
        return f"{self.bytes_per_s / 1e6:g} MB/s, {1e3 * self.latency_s:g} ms/request (emulated)"
