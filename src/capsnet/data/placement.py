"""Where a set's digits sit on their canvas, measured from the pixels.

Two numbers tell the test sets of ``translated-mnist`` apart (``tasks.py``):
the share of images whose ink touches the canvas border (the outermost rows
and columns), and the spread of the ink bounding boxes' centres. ``capsnet
eval`` reports them for every set it scores, real affNIST files included, so
a file's placement can be read against the generated sets'.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from .multimnist import bounding_boxes

__all__ = ["Placement", "placement"]


@dataclass(frozen=True)
class Placement:
    """Placement statistics of a set of images (blank images left out).

    border_share: fraction of the images with ink on the first or last row or column.
    centre_std: standard deviation of the ink-box centres in pixels, rows and columns pooled.
    centre_min, centre_max: the extreme centre coordinates (row or column), in pixels from the top-left pixel.
    images: how many images had ink.
    """

    border_share: float
    centre_std: float
    centre_min: float
    centre_max: float
    images: int

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


def placement(images: torch.Tensor, threshold: float = 0.0) -> Placement:
    """Placement statistics of ``images`` (N, C, H, W), ink being pixels above ``threshold`` (any channel)."""
    if images.dim() != 4 or len(images) == 0:
        raise ValueError(f"need images (N, C, H, W) with N > 0, got {tuple(images.shape)}")
    H, W = images.shape[-2:]
    boxes = bounding_boxes(images, threshold)  # (N, 4) as (top, left, bottom, right)
    boxes = boxes[boxes[:, 2] >= 0]  # a blank image has bottom -1
    if len(boxes) == 0:
        raise ValueError("every image is blank: no ink to place")
    top, left, bottom, right = boxes.unbind(1)
    touches = (top == 0) | (left == 0) | (bottom == H - 1) | (right == W - 1)
    centres = torch.cat([(top + bottom).double() / 2, (left + right).double() / 2])  # rows, then columns
    return Placement(touches.double().mean().item(), centres.std().item() if len(centres) > 1 else 0.0,
                     centres.min().item(), centres.max().item(), len(boxes))
