"""Declarative transform specs. They hold parameters only; the native engine runs them.

Both produce a fixed ``size`` output (uint8, H x W x 3) so samples can be batched.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple, Union

Size = Union[int, Tuple[int, int]]


def _hw(size: Size) -> Tuple[int, int]:
    if isinstance(size, int):
        h = w = size
    else:
        if len(size) != 2:
            raise ValueError(f"size must be an int or (height, width), got {size!r}")
        h, w = (int(s) for s in size)
    if h <= 0 or w <= 0 or h > 16384 or w > 16384:
        raise ValueError(f"output size must be within 1..16384, got {(h, w)}")
    return h, w


@dataclass(frozen=True)
class RandomResizedCrop:
    """torchvision's RandomResizedCrop + RandomHorizontalFlip, fused.

    The crop box follows torchvision exactly (10 tries of a random area in ``scale`` and
    log-uniform aspect ratio in ``ratio``, then the center-crop fallback), computed on the
    EXIF-oriented image; then an antialiased bilinear resize to ``size`` and a horizontal
    flip with probability ``hflip``. Randomness comes from (seed, epoch, index) only.
    """

    size: Size
    scale: Tuple[float, float] = (0.08, 1.0)
    ratio: Tuple[float, float] = (3 / 4, 4 / 3)
    hflip: float = 0.5

    def __post_init__(self) -> None:
        _hw(self.size)
        if not (0 < self.scale[0] <= self.scale[1]):
            raise ValueError(f"scale must satisfy 0 < min <= max, got {self.scale}")
        if not (0 < self.ratio[0] <= self.ratio[1]):
            raise ValueError(f"ratio must satisfy 0 < min <= max, got {self.ratio}")
        if not (0.0 <= self.hflip <= 1.0):
            raise ValueError(f"hflip is a probability in [0, 1], got {self.hflip}")

    @property
    def output_size(self) -> Tuple[int, int]:
        return _hw(self.size)


@dataclass(frozen=True)
class CenterCrop:
    """Evaluation transform: resize the shorter side to ``resize``, then center-crop ``size``.

    ``resize=None`` uses the ImageNet convention ``round(size / 0.875)`` (256 for 224).
    Both steps are fused into one antialiased resize of the matching source box.
    """

    size: Size
    resize: Optional[int] = None

    def __post_init__(self) -> None:
        _hw(self.size)
        if self.resize is not None and self.resize <= 0:
            raise ValueError(f"resize must be positive, got {self.resize}")

    @property
    def output_size(self) -> Tuple[int, int]:
        return _hw(self.size)

    @property
    def resize_to(self) -> int:
        if self.resize is not None:
            return int(self.resize)
        return int(round(max(self.output_size) / 0.875))


Transform = Union[RandomResizedCrop, CenterCrop]
