"""Synthetic datasets shaped like the surrogates solar targets (design notes §5)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from solar._atomic import atomic_path
from solar.errors import SolarError

PRESETS: dict[str, dict[str, tuple[int, ...]]] = {
    # 256×256 diffraction image → 64×64 amplitude and phase
    "ptychonn": {"diffraction": (256, 256), "amplitude": (64, 64), "phase": (64, 64)},
    # 11×11 Bragg peak patch → its 2-D centre
    "braggnn": {"patch": (11, 11), "center": (2,)},
    # 64³ volume (1 MiB per sample)
    "autophasenn": {"volume": (64, 64, 64)},
}

_BLOCK_BYTES = 64 * 2**20  # bounded memory while writing
_ALIGN = 4096  # every dataset page-aligned, as solar convert writes


def generate(
    path: str | os.PathLike,
    preset: str,
    num_samples: int,
    *,
    seed: int = 0,
    chunks: int | None = None,
    compression: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Path:
    """Write ``num_samples`` float32 samples of ``preset`` to ``path``, atomically.

    Contiguous and uncompressed unless ``chunks`` (samples per chunk) or ``compression`` is set;
    contiguous datasets start on a 4 KiB page (what ``solar convert`` writes, and what O_DIRECT
    reads need; chunks are not aligned: each would be padded to a page).
    Sample values are a pure function of (seed, preset, sample index block).
    """
    if preset not in PRESETS:
        raise SolarError(f"preset: unknown {preset!r} (choose from {', '.join(PRESETS)})")
    if num_samples <= 0:
        raise SolarError(f"samples must be positive, got {num_samples}")
    if chunks is not None and chunks <= 0:
        raise SolarError(f"chunks must be positive, got {chunks}")
    keys = PRESETS[preset]
    row_bytes = sum(4 * int(np.prod(s)) for s in keys.values())
    block = max(1, _BLOCK_BYTES // row_bytes)
    with atomic_path(path) as tmp:
        aligned = (
            {}
            if chunks or compression
            else {"alignment_threshold": 1, "alignment_interval": _ALIGN}
        )
        with h5py.File(tmp, "w", **aligned) as f:
            dsets = {}
            for name, shape in keys.items():
                layout: dict[str, Any] = {}
                if chunks or compression:
                    layout["chunks"] = (min(chunks or 1, num_samples), *shape)
                    layout["compression"] = compression
                dsets[name] = f.create_dataset(name, (num_samples, *shape), np.float32, **layout)
            for lo in range(0, num_samples, block):
                hi = min(lo + block, num_samples)
                rng = np.random.default_rng([seed, lo])
                for name, values in _samples(preset, keys, rng, hi - lo).items():
                    dsets[name][lo:hi] = values
                if progress is not None:
                    progress(hi, num_samples)
    return Path(path)


def _samples(preset: str, keys: dict, rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """Random inputs; for PtychoNN-like data, targets that a network can learn from them."""
    if preset != "ptychonn":
        return {name: rng.standard_normal((n, *shape), np.float32) for name, shape in keys.items()}
    image = rng.standard_normal((n, 256, 256), np.float32)
    pooled = image.reshape(n, 64, 4, 64, 4).mean(axis=(2, 4))
    return {"diffraction": image, "amplitude": np.abs(pooled), "phase": np.tanh(2 * pooled)}
