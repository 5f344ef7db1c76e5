"""Batched data augmentation on image tensors, on whatever device they live.

Sabour et al. (2017), section 5: "trained on 28x28 MNIST images that have
been shifted by up to 2 pixels in each direction with zero padding"; no other
augmentation. Done as one gather over the whole batch, so the data set can
stay on the GPU as a single tensor (as airbench does) with no Python loop
over examples.
"""
from __future__ import annotations

import torch

__all__ = ["random_shift"]


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
    if max_shift < 0:
        raise ValueError(f"max_shift must be >= 0, got {max_shift}")
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
