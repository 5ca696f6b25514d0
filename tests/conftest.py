from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, settings

# Property tests check what the code computes, never how fast this machine is: no per-example
# deadline, and no failure when examples are drawn slowly (Hypothesis's two timing checks). A
# test's own @settings inherits these unless it sets the same field.
settings.register_profile("solar", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("solar")


@pytest.fixture
def small_h5(tmp_path: Path) -> Path:
    """A contiguous file with two keys of 103 samples (a prime: no batch divides it)."""
    path = tmp_path / "small.h5"
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        f["x"] = rng.standard_normal((103, 4, 5), np.float32)
        f["y"] = rng.integers(0, 10, (103, 2)).astype(np.int64)
    return path
