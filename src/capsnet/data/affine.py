"""Translated MNIST for training and the affine test sets (Sabour et al. 2017, section 5.2).

The paper trains on MNIST digits "placed randomly on a black background of
40x40 pixels" and tests on affNIST, whose digits went through random affine
transforms. Two ways of placing a digit on the 40x40 frame are used here, and
the test sets differ in which one they use:

- ``random_translate`` shifts the whole 28x28 frame to a uniformly random
  offset, 0..12 pixels per axis: +-6 pixels about the centre. Training uses it
  (as the authors' code does), and so does the translated test set. MNIST's
  ink lies inside its 28x28 frame (a 20x20 box centred by its centre of mass),
  so the ink stays at least 4 pixels off the canvas border except for the rare
  digit whose ink reaches its own frame's edge.
- ``random_affine`` transforms the digit within affNIST's published ranges
  (rotation within +-20 degrees, shear within +-0.2, each axis scaled by 0.8
  to 1.2), then places the transformed digit's ink bounding box either
  uniformly anywhere wholly inside the frame (``max_shift=None``: the
  affNIST-like set; about 18% of the digits then touch the border) or centred
  and then shifted by up to ``max_shift`` pixels per axis, never onto the
  border (``max_shift=6``: the translated set's range). With the identity
  transform it moves the untransformed digit's pixels exactly.

Every draw comes from the generator given, so a set is fixed by its seed. The
real affNIST .mat files are read by ``capsnet.data.affnist.load_affnist``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .multimnist import bounding_boxes, place
from .sets import unit_float

__all__ = ["AffineParams", "random_translate", "random_affine", "AFFNIST_RANGES"]

# affNIST's ranges (Tieleman's affNIST page): rotation, shear, scale per axis.
AFFNIST_RANGES = {"rotation_deg": 20.0, "shear": 0.2, "scale": (0.8, 1.2)}


def random_translate(images: torch.Tensor, size: int = 40, *, generator: torch.Generator | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each whole image frame at a uniformly random offset on a ``size`` x ``size`` black canvas.

    The offsets are drawn uniformly from 0..size-H (rows, all N first) and
    0..size-W (columns): for 28x28 digits on 40x40, +-6 pixels about the
    centre. Where the ink lands follows from where it lies in its frame.

    Shapes: images (N, C, H, W) -> canvases (N, C, size, size) float in [0, 1], offsets (N, 2) (row, column).
    """
    N, _, H, W = images.shape
    if size < max(H, W):
        raise ValueError(f"canvas {size} is smaller than the {H}x{W} images")
    gen_dev = generator.device if generator is not None else torch.device("cpu")
    offsets = torch.stack([torch.randint(0, size - H + 1, (N,), generator=generator, device=gen_dev),
                           torch.randint(0, size - W + 1, (N,), generator=generator, device=gen_dev)], dim=1)
    return place(unit_float(images), offsets.to(images.device), size), offsets.to(images.device)


@dataclass
class AffineParams:
    """The transform drawn for each image: (N,) tensors each, and the (N, 2) placement in the frame.

    A positive ``rotation_deg`` turns the digit clockwise as an image is shown (rows down), the opposite of
    ``capsnet.data.segmentation``'s canvases; the angles are drawn symmetrically about 0, so only the sign reported
    differs. ``shear`` moves each row sideways by that much per row below the centre."""

    rotation_deg: torch.Tensor
    shear: torch.Tensor
    scale_x: torch.Tensor
    scale_y: torch.Tensor
    offsets: torch.Tensor


def random_affine(images: torch.Tensor, size: int = 40, *, generator: torch.Generator | None = None,
                  rotation_deg: float = 20.0, shear: float = 0.2, scale: tuple[float, float] = (0.8, 1.2),
                  max_shift: int | None = None) -> tuple[torch.Tensor, AffineParams]:
    """affNIST-like digits: a random affine transform each, then its ink placed inside the frame.

    The transform maps output to input coordinates about the image centre as
    ``A = R(theta) @ Shear(s) @ diag(sx, sy)`` inverted; bilinear sampling on a
    canvas large enough that no part of the digit is cut off (the identity
    transform, all ranges zero and scale (1, 1), copies the pixels exactly).
    Then the transformed digit's ink bounding box, h x w, is placed:

    - ``max_shift=None``: anywhere wholly inside ``size`` x ``size``, its top
      row uniform over 0..size-h and its left column over 0..size-w (the
      affNIST-like placement);
    - ``max_shift=k``: centred, top row ``(size - h) // 2``, then shifted by an
      integer uniform over -m..m with ``m = min(k, (size - h) // 2 - 1)``, so
      the ink never reaches the frame's outer rows and columns; the same per
      column. With ``k = 6`` a digit whose box is at most 26 pixels on an axis
      takes the translated set's full +-6 pixels on it.

    Draws, in order: rotation, shear, sx, sy (N each, uniform in their
    ranges), then two uniforms in [0, 1) per image that pick the row and the
    column within the allowed range. Both placements read the same uniforms,
    so for one generator state the transforms are the same and each digit sits
    at the same quantile of its range whichever placement is asked for.

    Shapes: images (N, C, H, W) -> (N, C, size, size) float in [0, 1], AffineParams
    (offsets: the top-left corner of each ink box in the output).
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
    x = place(unit_float(images), torch.full((N, 2), (big - H) // 2, dtype=torch.long, device=dev), big)
    identity = rotation_deg == 0 and shear == 0 and tuple(scale) == (1.0, 1.0)
    warped = x if identity else _warp(x, rot, sh, sx, sy)

    boxes = bounding_boxes(warped)  # (N, 4)
    h = boxes[:, 2] - boxes[:, 0] + 1
    w = boxes[:, 3] - boxes[:, 1] + 1
    if (h > size).any() or (w > size).any():
        raise ValueError(f"a transformed digit is larger than the {size}x{size} frame; use a larger frame")
    r0 = torch.rand(N, generator=generator, device=gen_dev, dtype=torch.float64)
    c0 = torch.rand(N, generator=generator, device=gen_dev, dtype=torch.float64)
    if max_shift is None:  # the box anywhere inside the frame
        top = (r0 * (size - h.to(gen_dev) + 1)).floor().long()  # 0 .. size - h
        left = (c0 * (size - w.to(gen_dev) + 1)).floor().long()
    else:  # the box centred, then shifted by -m..m, m keeping it off the border
        top, left = _centred(r0, h.to(gen_dev), size, max_shift), _centred(c0, w.to(gen_dev), size, max_shift)
    # Each digit's box moved to (top, left): gather the output from the warped canvas.
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


def _centred(u: torch.Tensor, extent: torch.Tensor, size: int, max_shift: int) -> torch.Tensor:
    """Start of a box of ``extent`` pixels centred on ``size``, shifted by ``floor(u (2m + 1)) - m``, m as above."""
    centre = (size - extent) // 2
    m = (centre - 1).clamp(max=max_shift)  # (N,)
    if (m < 0).any():
        raise ValueError(f"a transformed digit of {int(extent.max())} pixels cannot stay off the border of a "
                         f"{size}-pixel frame; use a larger frame")
    return centre + (u * (2 * m + 1)).floor().long() - m


def _warp(x: torch.Tensor, rot: torch.Tensor, sh: torch.Tensor, sx: torch.Tensor, sy: torch.Tensor) -> torch.Tensor:
    """Each canvas of ``x`` (N, C, S, S) under ``R(rot) @ Shear(sh) @ diag(sx, sy)`` about its centre, bilinear.

    In float64, rounded to float32 at the end: float32's vectorised and plain CPU paths differ by up to 6e-6 per
    pixel (AVX2 against ``ATEN_CPU_CAPABILITY=default``), and the fixed test sets are to be the same on every
    machine (a review, 2026-11-29; they moved by under 1e-5 a pixel with the change)."""
    N, C, side, _ = x.shape
    if N == 0:  # affine_grid refuses an empty batch
        return x.clone()
    dev = x.device
    theta = torch.deg2rad(rot)
    cos, sin = torch.cos(theta), torch.sin(theta)
    R = torch.stack([torch.stack([cos, -sin], -1), torch.stack([sin, cos], -1)], -2)  # (N, 2, 2)
    S = torch.stack([torch.stack([torch.ones_like(sh), sh], -1), torch.stack([torch.zeros_like(sh), torch.ones_like(sh)], -1)], -2)
    D = torch.diag_embed(torch.stack([sx, sy], -1))
    A = R @ S @ D  # forward map on (x, y) about the centre
    inv = torch.linalg.inv(A)  # grid_sample wants output -> input
    grid_theta = torch.cat([inv, torch.zeros(N, 2, 1, dtype=inv.dtype, device=inv.device)], dim=2).double().to(dev)
    grid = F.affine_grid(grid_theta, (N, C, side, side), align_corners=False)
    out = F.grid_sample(x.double(), grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    return out.clamp_(0, 1).to(x.dtype)
