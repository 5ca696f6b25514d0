"""Sample transforms that tests run in worker processes (``Transform(processes=True)``).

A worker is spawned and imports the module that defines its function: this one imports only
numpy, so a worker starts in about 2 s where a test module (solar.loader, hence torch) takes
about 7 s, and a test starting four workers waits for it.
"""

from __future__ import annotations

import os
import signal

import numpy as np


def crop_flip_noise(sample, rng):
    """A typical augmentation: random crop to 8×8, random flip, log, noise; label kept."""
    i, j = rng.integers(0, 5, size=2)
    x = sample["img"][i : i + 8, j : j + 8]
    if rng.random() < 0.5:
        x = x[:, ::-1]
    x = np.log1p(x) + rng.normal(0, 0.01, x.shape).astype(np.float32)
    return {"img": x.astype(np.float32), "label": sample["label"]}


def fails_on_50(sample, rng):
    if sample["label"] == 150:
        raise ValueError("no 50s here")
    return {"img": sample["img"]}


def shrink(sample, rng):
    """Deterministic: the centre, doubled, as float64 (other shape and dtype than the raw)."""
    return {"centre": sample["img"][2:10, 2:10].astype(np.float64) * 2, "label": sample["label"]}


def exits(sample, rng):
    if int(sample["label"]) == 57:
        os._exit(3)
    return {"img": sample["img"]}


def kills_itself(sample, rng):
    if int(sample["label"]) == 57:
        os.kill(os.getpid(), signal.SIGKILL)
    return {"img": sample["img"]}
