"""Per-channel normalization of uint8 RGB: ``(x / 255 - mean) / std`` (no torch here).

One definition of the ImageNet statistics, of what a valid mean/std is, and of the
arithmetic: the native CPU path and the GPU normalizer both compute ``x * scale + bias``
with the scale and bias from ``scale_bias_for``.
"""
from __future__ import annotations

import math
from typing import List, Sequence, Tuple

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "check_mean_std", "scale_bias_for"]

# torchvision's ImageNet statistics (RGB, for pixels scaled to [0, 1]).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def check_mean_std(mean: Sequence[float], std: Sequence[float]) -> Tuple[Tuple[float, ...], Tuple[float, ...]]:
    """``mean`` and ``std`` as tuples of 3 floats; ValueError unless 3 finite values each and
    std > 0 (a NaN would pass ``std <= 0`` and turn every pixel into NaN)."""
    if len(mean) != 3 or len(std) != 3 or not all(math.isfinite(float(v)) for v in (*mean, *std)) or min(std) <= 0:
        raise ValueError(f"mean and std need 3 finite values each, std > 0; got {mean}, {std}")
    return tuple(float(m) for m in mean), tuple(float(s) for s in std)


def scale_bias_for(mean: Sequence[float], std: Sequence[float]) -> Tuple[List[float], List[float]]:
    """(x / 255 - mean) / std as x * scale + bias, per channel (float64 values)."""
    mean, std = check_mean_std(mean, std)
    return [1.0 / (255.0 * s) for s in std], [-m / s for m, s in zip(mean, std)]
