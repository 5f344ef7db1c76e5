"""Label maps paired with images, for conditional synthesis (CapsPix2pix, Bass et al. 2019; pix2pix, Isola et al. 2017).

The library makes the label maps of its offline tasks from the images:

- ``skeletonize``: Zhang and Suen's thinning ("A fast parallel algorithm for
  thinning digital patterns", CACM 1984) of the binarised image, a skeleton
  one pixel wide almost everywhere (the algorithm leaves a 2x2 block at some
  junctions: 270 of the 10,000 test digits hold one; a stroke of two pixels
  may vanish whole, 11 test digits lose a small piece): MNIST digit skeleton -> digit. The
  skeleton keeps the digit's shape but not its stroke width or texture, which
  the generator must supply.
- ``silhouette``: the pixels above a threshold, with every background region
  they enclose filled: Fashion-MNIST silhouette -> item. The outline is given;
  the texture, folds and shading inside are not.

Both work on whole batches as tensor operations (a few passes of shifted
comparisons), on any device. ``pad_to`` centres 28x28 images on the 32x32
frame the generators take (their sides must be multiples of 8).
``load_pair_folder`` reads the user's own label maps and images (PNG),
paired by file name.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from .png import label_map_array, opaque_image_array, load_png_pairs, refuse_mixed_binary_label_maps, scale_binary_label_maps
from .sets import unit_float

__all__ = ["skeletonize", "silhouette", "pad_to", "load_pair_folder", "SKELETON_THRESHOLD", "SILHOUETTE_THRESHOLD"]

SKELETON_THRESHOLD = 0.5  # a digit's pixel is ink above half intensity
SILHOUETTE_THRESHOLD = 0.05  # an item's pixel is part of it above 5% intensity (Fashion-MNIST's background is 0)


def _binary(images: torch.Tensor, threshold: float) -> torch.Tensor:
    """(N, 1, H, W) uint8 0..255 or float 0..1 -> (N, H, W) bool, the pixels above ``threshold`` (in 0..1)."""
    if images.dim() != 4 or images.shape[1] != 1:
        raise ValueError(f"images must be (N, 1, H, W) single-channel images, got shape {tuple(images.shape)}")
    x = unit_float(images)
    return x[:, 0] > threshold


def _neighbours(x: torch.Tensor) -> list[torch.Tensor]:
    """The eight neighbours of every pixel, P2 (north) clockwise to P9 (north-west), zero outside.

    Shapes: x (N, H, W) -> 8 tensors (N, H, W) of x's dtype.
    """
    p = F.pad(x, (1, 1, 1, 1))  # (N, H+2, W+2)
    H, W = x.shape[-2:]

    def at(dy: int, dx: int) -> torch.Tensor:
        return p[:, 1 + dy:1 + dy + H, 1 + dx:1 + dx + W]

    return [at(-1, 0), at(-1, 1), at(0, 1), at(1, 1), at(1, 0), at(1, -1), at(0, -1), at(-1, -1)]


def skeletonize(images: torch.Tensor, threshold: float = SKELETON_THRESHOLD, max_passes: int = 100) -> torch.Tensor:
    """Zhang-Suen thinning of each image's pixels above ``threshold``: a skeleton one pixel wide but for a 2x2 block
    at some junctions (the algorithm's own, kept as published).

    Each pass has two sub-iterations; a foreground pixel P1 is removed when it
    has 2 to 6 foreground neighbours, exactly one 0 -> 1 transition in the
    cycle P2, P3, ..., P9, P2, and P2 P4 P6 = P4 P6 P8 = 0 (first
    sub-iteration) or P2 P4 P8 = P2 P6 P8 = 0 (second); every decision of a
    sub-iteration uses the image as it was at its start. Passes repeat until
    nothing changes (at most ``max_passes``).

    Shapes: images (N, 1, H, W) uint8 0..255 or float 0..1 -> (N, 1, H, W) uint8 0/1.
    """
    x = _binary(images, threshold).to(torch.uint8)  # (N, H, W)
    for _ in range(max_passes):
        before = x
        for first in (True, False):
            P = _neighbours(x)  # P2 .. P9, each (N, H, W)
            B = torch.stack(P).sum(0)  # foreground neighbours
            A = sum(((P[k] == 0) & (P[(k + 1) % 8] == 1)).to(torch.uint8) for k in range(8))  # 0 -> 1 transitions
            p2, p4, p6, p8 = P[0], P[2], P[4], P[6]
            if first:
                c, d = p2 * p4 * p6, p4 * p6 * p8
            else:
                c, d = p2 * p4 * p8, p2 * p6 * p8
            remove = (x == 1) & (B >= 2) & (B <= 6) & (A == 1) & (c == 0) & (d == 0)
            x = x.masked_fill(remove, 0)
        if torch.equal(x, before):
            break
    return x.unsqueeze(1)  # (N, 1, H, W)


def silhouette(images: torch.Tensor, threshold: float = SILHOUETTE_THRESHOLD) -> torch.Tensor:
    """Each image's pixels above ``threshold`` with the background they enclose filled.

    The background that stays is what a 4-connected flood fill reaches from the
    image's border through pixels at or below the threshold (so a foreground
    touching itself diagonally closes a region, as 8-connected shapes do).

    Shapes: images (N, 1, H, W) uint8 0..255 or float 0..1 -> (N, 1, H, W) uint8 0/1.
    """
    fg = _binary(images, threshold)  # (N, H, W)
    free = ~fg
    edge = torch.zeros_like(fg)
    edge[:, 0, :] = edge[:, -1, :] = True
    edge[:, :, 0] = edge[:, :, -1] = True
    outside = edge & free  # background reached from the border so far
    while True:
        p = F.pad(outside, (1, 1, 1, 1))
        H, W = outside.shape[-2:]
        grown = outside | p[:, :-2, 1:1 + W] | p[:, 2:, 1:1 + W] | p[:, 1:1 + H, :-2] | p[:, 1:1 + H, 2:]  # 4-neighbours
        grown &= free
        if torch.equal(grown, outside):
            break
        outside = grown
    return (~outside).to(torch.uint8).unsqueeze(1)  # (N, 1, H, W)


def pad_to(images: torch.Tensor, side: int) -> torch.Tensor:
    """Centre ``images`` on a ``side`` x ``side`` frame of zeros (the extra pixel, if odd, at the bottom and right).

    Shapes: (N, C, H, W) -> (N, C, side, side).
    """
    H, W = images.shape[-2:]
    if H > side or W > side:
        raise ValueError(f"images of {H}x{W} do not fit a {side}x{side} frame")
    top, left = (side - H) // 2, (side - W) // 2
    return F.pad(images, (left, side - W - left, top, side - H - top))


def load_pair_folder(labels_dir: str | Path, images_dir: str | Path, *, scale: bool | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """The user's label maps and images (PNG), paired by file name (``labels/a.png`` with ``images/a.png``).

    Both are read as 8-bit grey (1 channel) or RGB (3) images
    (``opaque_image_array``: a file with any transparent pixel refused, an
    opaque alpha channel ignored; a palette read as grey when every entry is
    grey, else as RGB; 16/32-bit refused), each folder in one size and mode,
    every label map the size and EXIF orientation of its image (each file is
    turned by its own); a folder of label maps holding
    only 0s and 1s is read as 0/255 (``scale`` True or False: as the caller
    decided for a data set of several folders). A problem is a ``DataError``
    naming the file and the fix; nothing is written.

    Shapes: -> labels (N, C_label, H, W) uint8, images (N, C_image, H, W) uint8, names: the N file stems, sorted.
    """
    labels, images, names = load_png_pairs(labels_dir, images_dir, first=("label map", "label maps", label_map_array),
                                           second=("image", "images", opaque_image_array))
    maps = labels.numpy()
    if scale is None:  # the caller of several folders (train and test) checks them all together
        refuse_mixed_binary_label_maps(zip((f"{n}.png" for n in names), maps), str(labels_dir))
        maps = scale_binary_label_maps(maps)
    elif scale:
        maps = maps * np.uint8(255)
    return torch.from_numpy(maps), images, names
