"""Batched data augmentation on image tensors, on whatever device they live.

- ``shift``: Sabour et al. (2017), section 5: "trained on 28x28 MNIST images
  that have been shifted by up to 2 pixels in each direction with zero
  padding"; no other augmentation.
- ``efficient-capsnet``: the recipe of Efficient-CapsNet's official code
  (``pre_process_mnist.py``): a rotation of up to +-30 degrees for half the
  images, a shift within each digit's empty margins (it never cuts the
  digit), a horizontal squish by 1-7 pixels, and a 4x4 patch erased.

Every step is batched tensor work (gathers and ``grid_sample``), so the data
set can stay on the GPU as a single tensor (as airbench does) with no Python
loop over examples; every draw comes from the generator given.
"""
from __future__ import annotations

import functools
import math
import operator
from typing import Callable

import torch
import torch.nn.functional as F

from .multimnist import bounding_boxes

__all__ = ["AUGMENTATIONS", "augmentation", "random_shift", "random_rotate", "margin_shift", "random_squish",
           "random_erase", "efficient_capsnet_augment"]

AUGMENTATIONS = ("shift", "efficient-capsnet")


def random_shift(
    images: torch.Tensor, max_shift: int = 2, *, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Shift every image by its own random (dx, dy), |dx|, |dy| <= max_shift, zero fill.

    The 2 * max_shift + 1 offsets per axis are drawn uniformly and independently
    for each example (not per batch). The offsets come from ``generator``
    (on its own device, CPU when None uses torch's default generator), so a
    seeded generator gives the same shifts on any device. Works for any dtype.

    Shapes:
        images: (B, C, H, W); returns (B, C, H, W), same dtype and device.
        ``max_shift=0`` returns ``images`` itself.
    """
    if images.dim() != 4:
        raise ValueError(f"random_shift expects (B, C, H, W) images, got shape {tuple(images.shape)}")
    try:  # any integer (numpy's, a 0-d tensor's); 1.5 was a TypeError deep in torch
        whole = operator.index(max_shift) if not isinstance(max_shift, bool) else None
    except TypeError:
        whole = None
    if whole is None or whole < 0:
        raise ValueError(f"max_shift must be a whole number of pixels >= 0, got {max_shift!r}")
    max_shift = whole
    if max_shift == 0:
        return images
    B, C, H, W = images.shape
    s = max_shift
    padded = images.new_zeros(B, C, H + 2 * s, W + 2 * s)
    padded[:, :, s:s + H, s:s + W] = images  # zero border of width s: the fill
    gen_device = generator.device if generator is not None else torch.device("cpu")
    # Window origin in the padded image, 0..2s per axis; origin s is no shift.
    offsets = torch.randint(0, 2 * s + 1, (2, B), generator=generator, device=gen_device)
    offsets = offsets.to(images.device)  # (2, B): rows (y), then columns (x)
    rows = offsets[0, :, None] + torch.arange(H, device=images.device)  # (B, H)
    cols = offsets[1, :, None] + torch.arange(W, device=images.device)  # (B, W)
    b = torch.arange(B, device=images.device)[:, None, None, None]  # (B, 1, 1, 1)
    c = torch.arange(C, device=images.device)[None, :, None, None]  # (1, C, 1, 1)
    return padded[b, c, rows[:, None, :, None], cols[:, None, None, :]]  # (B, C, H, W)


def _shift(images: torch.Tensor, g: torch.Generator | None, *, shift: int) -> torch.Tensor:
    return random_shift(images, shift, generator=g)


def augmentation(name: str, shift: int = 2) -> Callable[[torch.Tensor, torch.Generator], torch.Tensor]:
    """The augmentation ``name`` of ``AUGMENTATIONS`` as ``f(images, generator)``; ``shift`` for "shift"."""
    if name == "shift":  # a partial, not a lambda: it pickles (a DataLoader's workers under spawn)
        return functools.partial(_shift, shift=shift)
    if name == "efficient-capsnet":
        return efficient_capsnet_augment
    raise ValueError(f"unknown augmentation {name!r}; valid names are {', '.join(AUGMENTATIONS)}")


def _check_float(images: torch.Tensor, name: str) -> None:
    """Images to resample: floating point (torch's own error on 8-bit ones named theta or grid_sampler)."""
    if not images.is_floating_point():
        raise ValueError(f"{name} takes float images in [0, 1], got {images.dtype}: convert 8-bit images (what "
                         f"load_dataset gives) with x.float() / 255")


def _normal(n: int, g: torch.Generator | None, device: torch.device, std: float = 0.33) -> torch.Tensor:
    """The official code's draws: N(0, 0.33) clipped to +-0.9999."""
    gen_device = g.device if g is not None else torch.device("cpu")
    return (torch.randn(n, generator=g, device=gen_device) * std).clamp(-0.9999, 0.9999).to(device)


def _uniform(n: int, g: torch.Generator | None, device: torch.device) -> torch.Tensor:
    gen_device = g.device if g is not None else torch.device("cpu")
    return torch.rand(n, generator=g, device=gen_device).to(device)


def random_rotate(images: torch.Tensor, max_degrees: float = 30.0, *, generator: torch.Generator | None = None
                  ) -> torch.Tensor:
    """Rotate half the images (on average) about their centre by a whole number of degrees within +-max_degrees.

    As the official code: angle = int(r0 * 30) with r0 ~ N(0, 0.33) clipped, applied where r1 <= 0 (bilinear, zero
    fill). Shapes: images (B, C, H, W) float -> the same.
    """
    _check_float(images, "random_rotate")
    B = images.shape[0]
    if B == 0:  # affine_grid refuses an empty batch (a masked part of a batch: x[m] = augment(x[m], g))
        return images.clone()
    r0, r1 = _normal(B, generator, images.device), _normal(B, generator, images.device)
    angle = torch.trunc(r0 * max_degrees) * (r1 <= 0) * (math.pi / 180)  # (B,), radians; 0 keeps the image
    cos, sin = torch.cos(angle), torch.sin(angle)
    H, W = images.shape[-2:]  # affine_grid's coordinates run -1..1 along each side: a turn of a non-square image
    # in pixels is scaled by the sides' ratio there (without it, a point 20 px from the centre of a 20x60 image
    # landed 18.4-19.3 px away: a shear)
    theta = torch.stack([torch.stack([cos, -sin * (H / W), torch.zeros_like(cos)], -1),
                         torch.stack([sin * (W / H), cos, torch.zeros_like(cos)], -1)], 1)  # (B, 2, 3)
    grid = F.affine_grid(theta.to(images.dtype), list(images.shape), align_corners=False)
    return F.grid_sample(images, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def margin_shift(images: torch.Tensor, *, generator: torch.Generator | None = None) -> torch.Tensor:
    """Shift each image within its empty margins, so no ink leaves the frame (the official code's ``shift``).

    Per axis: r = |N(0, 0.33)| clipped below 1 and a coin: towards the start by
    floor(r * margin before), or towards the end by floor(r * (1 + margin after)).
    Shapes: images (B, C, H, W) -> the same.
    """
    B, C, H, W = images.shape
    top, left, bottom, right = bounding_boxes(images).unbind(-1)  # (B,) each; an empty image: top = H, bottom = -1
    empty = bottom < 0
    before = torch.stack([top, left]).where(~empty, 0)  # (2, B): free rows above, columns left
    after = torch.stack([H - 1 - bottom, W - 1 - right]).where(~empty, 0)  # free rows below, columns right
    r = torch.stack([_normal(B, generator, images.device), _normal(B, generator, images.device)]).abs()  # (2, B)
    coin = torch.stack([_uniform(B, generator, images.device), _uniform(B, generator, images.device)]) < 0.5
    delta = torch.where(coin, torch.floor(-r * before), torch.floor(r * (1 + after))).long()  # (2, B) rows, cols
    rows = (torch.arange(H, device=images.device) - delta[0, :, None]) % H  # (B, H): source row of each output row
    cols = (torch.arange(W, device=images.device) - delta[1, :, None]) % W  # (B, W)
    b = torch.arange(B, device=images.device)[:, None, None, None]
    c = torch.arange(C, device=images.device)[None, :, None, None]
    return images[b, c, rows[:, None, :, None], cols[:, None, None, :]]  # (B, C, H, W)


def random_squish(images: torch.Tensor, *, generator: torch.Generator | None = None) -> torch.Tensor:
    """Squeeze each image horizontally by 1 to W/4 pixels and re-centre it, give or take one pixel (the official
    ``squish``, ``image_squish_random``).

    r, r' = |N(0, 0.33)| clipped below 1 (the official draws, as ``margin_shift``'s); width_mod = floor(r * W/4 + 1)
    (1..7 at 28, mostly 1-3), offset = floor(r' * 2) (1 for about one image in eight): the image resized to width
    W - width_mod is placed width_mod // 2 + offset pixels from the left. (Until 2026-11-30 r and r' were uniform:
    a squeeze of 4 pixels on average and an offset for every other image, stronger than the official code's.)
    Shapes: images (B, C, H, W) float -> the same.
    """
    _check_float(images, "random_squish")
    B, C, H, W = images.shape
    r = torch.stack([_normal(B, generator, images.device), _normal(B, generator, images.device)]).abs()  # (2, B)
    wm = torch.floor(r[0] * (W / 4) + 1)  # (B,) in 1..W/4
    pad = torch.div(wm, 2, rounding_mode="floor") + torch.floor(r[1] * 2)
    x = torch.arange(W, device=images.device, dtype=images.dtype)  # output column centres at x + 0.5
    src = (x + 0.5 - pad[:, None]) * (W / (W - wm[:, None])) - 0.5  # (B, W): source column, pixel units
    gx = (2 * src + 1) / W - 1  # normalised, align_corners=False
    gy = (2 * torch.arange(H, device=images.device, dtype=images.dtype) + 1) / H - 1  # (H,)
    grid = torch.stack([gx[:, None, :].expand(B, H, W), gy[None, :, None].expand(B, H, W)], dim=-1)  # (B, H, W, 2)
    return F.grid_sample(images, grid.to(images.dtype), mode="bilinear", padding_mode="zeros", align_corners=False)


def random_erase(images: torch.Tensor, size: int = 4, *, generator: torch.Generator | None = None) -> torch.Tensor:
    """Zero one ``size`` x ``size`` patch per image at a row and column drawn from 4..H-6 (the official ``erase``).

    Shapes: images (B, C, H, W) -> the same.
    """
    B, C, H, W = images.shape
    top = torch.floor(_uniform(B, generator, images.device) * (H - 9)).long() + 4  # 28: 4..22
    left = torch.floor(_uniform(B, generator, images.device) * (W - 9)).long() + 4
    r, c = torch.arange(H, device=images.device), torch.arange(W, device=images.device)
    rows = (r >= top[:, None]) & (r < top[:, None] + size)  # (B, H)
    cols = (c >= left[:, None]) & (c < left[:, None] + size)  # (B, W)
    keep = ~(rows[:, :, None] & cols[:, None, :])  # (B, H, W)
    return images * keep[:, None].to(images.dtype)


def efficient_capsnet_augment(images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Efficient-CapsNet's training augmentation, in the official order: rotate, shift, squish, erase.

    Shapes: images (B, C, H, W) float in [0, 1] -> the same.
    """
    _check_float(images, "efficient_capsnet_augment")
    x = random_rotate(images, generator=generator)
    x = margin_shift(x, generator=generator)
    x = random_squish(x, generator=generator)
    return random_erase(x, generator=generator)
