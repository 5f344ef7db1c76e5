"""Translated MNIST for training and an affNIST-like test set (Sabour et al. 2017, section 5.2).

The paper trains on MNIST digits "placed randomly on a black background of
40x40 pixels" and tests on affNIST, whose digits went through random affine
transforms. ``random_affine`` makes an affNIST-like set from any 28x28 digits
within affNIST's published ranges: rotation within +-20 degrees, shear within
+-0.2, each axis scaled by 0.8 to 1.2; the transformed digit is then placed at
a uniformly random position that keeps all of it inside the 40x40 frame. The
draw is fixed by the generator's seed. The real affNIST .mat files are read
by ``capsnet.data.affnist.load_affnist``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .multimnist import bounding_boxes, place

__all__ = ["AffineParams", "random_translate", "random_affine", "AFFNIST_RANGES"]

# affNIST's ranges (Tieleman's affNIST page): rotation, shear, scale per axis.
AFFNIST_RANGES = {"rotation_deg": 20.0, "shear": 0.2, "scale": (0.8, 1.2)}


def _float(images: torch.Tensor) -> torch.Tensor:
    return images.float() / 255.0 if not images.is_floating_point() else images.float()


def random_translate(images: torch.Tensor, size: int = 40, *, generator: torch.Generator | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each image at a uniformly random position on a ``size`` x ``size`` black canvas.

    Shapes: images (N, C, H, W) -> canvases (N, C, size, size) float in [0, 1], offsets (N, 2) (row, column).
    """
    N, _, H, W = images.shape
    if size < max(H, W):
        raise ValueError(f"canvas {size} is smaller than the {H}x{W} images")
    gen_dev = generator.device if generator is not None else torch.device("cpu")
    offsets = torch.stack([torch.randint(0, size - H + 1, (N,), generator=generator, device=gen_dev),
                           torch.randint(0, size - W + 1, (N,), generator=generator, device=gen_dev)], dim=1)
    return place(_float(images), offsets.to(images.device), size), offsets.to(images.device)


@dataclass
class AffineParams:
    """The transform drawn for each image: (N,) tensors each, and the (N, 2) placement in the frame."""

    rotation_deg: torch.Tensor
    shear: torch.Tensor
    scale_x: torch.Tensor
    scale_y: torch.Tensor
    offsets: torch.Tensor


def random_affine(images: torch.Tensor, size: int = 40, *, generator: torch.Generator | None = None,
                  rotation_deg: float = 20.0, shear: float = 0.2, scale: tuple[float, float] = (0.8, 1.2)
                  ) -> tuple[torch.Tensor, AffineParams]:
    """affNIST-like digits: a random affine transform each, then a random position fully inside the frame.

    The transform maps output to input coordinates about the image centre as
    ``A = R(theta) @ Shear(s) @ diag(sx, sy)`` inverted; bilinear sampling on a
    canvas large enough that no part of the digit is cut off; then the digit's
    bounding box is placed uniformly at random inside ``size`` x ``size``.

    Shapes: images (N, C, H, W) -> (N, C, size, size) float in [0, 1], AffineParams.
    """
    N, C, H, W = images.shape
    gen_dev = generator.device if generator is not None else torch.device("cpu")

    def uniform(lo: float, hi: float) -> torch.Tensor:
        return lo + (hi - lo) * torch.rand(N, generator=generator, device=gen_dev, dtype=torch.float64)

    rot = uniform(-rotation_deg, rotation_deg)
    sh = uniform(-shear, shear)
    sx, sy = uniform(*scale), uniform(*scale)
    dev = images.device
    big = 2 * max(H, W)  # room for any transform within the ranges
    x = place(_float(images), torch.full((N, 2), (big - H) // 2, dtype=torch.long, device=dev), big)

    theta = torch.deg2rad(rot)
    cos, sin = torch.cos(theta), torch.sin(theta)
    R = torch.stack([torch.stack([cos, -sin], -1), torch.stack([sin, cos], -1)], -2)  # (N, 2, 2)
    S = torch.stack([torch.stack([torch.ones_like(sh), sh], -1), torch.stack([torch.zeros_like(sh), torch.ones_like(sh)], -1)], -2)
    D = torch.diag_embed(torch.stack([sx, sy], -1))
    A = R @ S @ D  # forward map on (x, y) about the centre
    inv = torch.linalg.inv(A)  # grid_sample wants output -> input
    grid_theta = torch.cat([inv, torch.zeros(N, 2, 1, dtype=inv.dtype, device=inv.device)], dim=2).float().to(dev)
    grid = F.affine_grid(grid_theta, (N, C, big, big), align_corners=False)
    warped = F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False).clamp_(0, 1)

    boxes = bounding_boxes(warped)  # (N, 4)
    h = boxes[:, 2] - boxes[:, 0] + 1
    w = boxes[:, 3] - boxes[:, 1] + 1
    if (h > size).any() or (w > size).any():
        raise ValueError(f"a transformed digit is larger than the {size}x{size} frame; use a larger frame")
    # Crop each digit's box into a (size x size) tile at its top-left, then place the tile randomly.
    r0 = torch.rand(N, generator=generator, device=gen_dev, dtype=torch.float64)
    c0 = torch.rand(N, generator=generator, device=gen_dev, dtype=torch.float64)
    top = (r0 * (size - h.to(gen_dev) + 1)).floor().long()  # 0 .. size - h
    left = (c0 * (size - w.to(gen_dev) + 1)).floor().long()
    shift_r = (top.to(dev) - boxes[:, 0])  # output row = input row + shift
    shift_c = (left.to(dev) - boxes[:, 1])
    rows = torch.arange(size, device=dev)[None, :] - shift_r[:, None]  # source row for each output row, (N, size)
    cols = torch.arange(size, device=dev)[None, :] - shift_c[:, None]
    valid = ((rows >= 0) & (rows < big))[:, :, None] & ((cols >= 0) & (cols < big))[:, None, :]  # (N, size, size)
    b = torch.arange(N, device=dev)[:, None, None]
    out = warped[b, :, rows.clamp(0, big - 1)[:, :, None], cols.clamp(0, big - 1)[:, None, :]]  # (N, size, size, C)
    out = out.permute(0, 3, 1, 2) * valid[:, None]
    params = AffineParams(rot.float(), sh.float(), sx.float(), sy.float(), torch.stack([top, left], 1).to(dev))
    return out.contiguous(), params
