"""Per-sample transforms for ``Loader(transform=...)`` and ``solar bench --transform``.

``augment`` is a PtychoNN-style augmentation costing 1-3 ms per 256x256 float32 sample on a
2-core machine: on the largest key (the network's input image) a random crop to 7/8 of the image, a
random horizontal flip, a log, a light blur, normalisation and Gaussian noise; the other keys
(its targets) take the same flip. ``solar bench DATA --transform examples/transforms.py:augment``
"""

from __future__ import annotations

import numpy as np


def augment(sample: dict[str, np.ndarray], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Crop, flip, log-normalise and add noise to the largest key; flip the others alike."""
    keys = sorted(sample, key=lambda k: -sample[k].size)  # the largest first: the image
    x = sample[keys[0]]
    h, w = x.shape[-2:]
    ch, cw = h - h // 8, w - w // 8
    i, j = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
    flip = bool(rng.random() < 0.5)
    x = x[..., i : i + ch, j : j + cw]
    if flip:
        x = x[..., ::-1]
    x = np.log1p(np.abs(x, dtype=np.float32))
    x = (x + np.roll(x, 1, -1) + np.roll(x, 1, -2)) / np.float32(3)  # a light blur
    x = (x - x.mean()) / (x.std() + np.float32(1e-6))
    x = x + rng.normal(0.0, 0.01, x.shape)  # float64 noise, as users write it
    out = {keys[0]: x.astype(np.float32, copy=False)}
    for k in keys[1:]:
        y = sample[k]
        out[k] = np.ascontiguousarray(y[..., ::-1]) if flip and y.ndim >= 1 else y.copy()
    return out
