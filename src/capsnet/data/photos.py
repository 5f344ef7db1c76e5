"""Photos and scans of single digits made into what an MNIST-family model saw in training.

MNIST's own recipe (LeCun et al., the MNIST page): the digit's bounding box is scaled to fit a 20x20 box with its
aspect ratio kept (anti-aliased, hence grey levels), then placed in the 28x28 field so that its centre of mass lies at
the centre. Larger inputs (MultiMNIST's 36x36, translated MNIST's 40x40) hold MNIST's digits unscaled, so the box
stays 20 pixels; a smaller input gets 20/28 of its side. Dark digits on light paper are inverted first, so photos of
handwriting work as well as white strokes on a black canvas. The viewer's uploads (``capsnet.viz.images``) and
``capsnet predict --mnist-style`` both go through ``mnist_style``; the viewer's uploads to a one-channel model of
other data (Fashion-MNIST, whose items fill their frame) through ``frame_style``.
"""
from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from .idx import DataError

__all__ = ["WORK_SIDE", "BOX_FRACTION", "shrink", "eight_bit", "light_background", "mnist_style", "frame_style"]

WORK_SIDE = 1024  # px: larger images are shrunk to this before preprocessing (the digit ends up 20 px tall)
BOX_FRACTION = 20 / 28  # MNIST: 20x20 box in a 28x28 field


def shrink(img: Image.Image, side: int) -> Image.Image:
    """The image scaled down (box filter; PIL premultiplies alpha) to at most ``side`` pixels on its longer side."""
    w, h = img.size
    scale = side / max(w, h)
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    try:
        return img.resize(size, Image.Resampling.BOX)
    except ValueError:  # a mode PIL cannot resize: keep it, it is within the caps
        return img


def _grey(img: Image.Image) -> np.ndarray:
    """Grey levels in [0, 1], transparent pixels filled with the background the strokes stand out from."""
    if img.mode in ("RGBA", "LA") or (img.mode == "P" and "transparency" in img.info):
        rgba = np.asarray(img.convert("RGBA"), dtype=np.float32) / 255
        alpha = rgba[..., 3]
        grey = rgba[..., :3] @ np.array([0.299, 0.587, 0.114], dtype=np.float32)
        ink = float((grey * alpha).sum() / max(alpha.sum(), 1e-6))  # mean grey of what is painted
        background = 0.0 if ink > 0.5 else 1.0
        return grey * alpha + background * (1 - alpha)
    return np.asarray(img.convert("L"), dtype=np.float32) / 255


def _border(a: np.ndarray) -> np.ndarray:
    """The pixels on the edge of a grey image (H, W): the paper or canvas around a digit."""
    return np.concatenate([a[0], a[-1], a[:, 0], a[:, -1]])


def light_background(a: np.ndarray, *, padded: bool = False) -> bool:
    """Whether a grey image (H, W), uint8 or in [0, 1], is mostly light at its edge: dark ink on light paper, the
    opposite of MNIST's light digits on black (``mnist_style`` inverts such an image). ``padded``: an image fitted by
    ``--fit pad``, whose black bars are cut off before its edge is read (they made a light photo's edge read dark
    half the time): rows of zeros above and below it as many (to a pixel), or columns of zeros left and right, on one
    axis only, as padding centres an image; zeros on every side are a black ground, read as it is."""
    if padded:
        rows, cols = np.flatnonzero(a.any(axis=1)), np.flatnonzero(a.any(axis=0))
        if rows.size == 0:
            return False
        top, bottom = rows[0], a.shape[0] - 1 - rows[-1]
        left, right = cols[0], a.shape[1] - 1 - cols[-1]
        if top + bottom and abs(top - bottom) <= 1 and not left + right:
            a = a[top:a.shape[0] - bottom]
        elif left + right and abs(left - right) <= 1 and not top + bottom:
            a = a[:, left:a.shape[1] - right]
    return float(np.median(_border(a))) > (127.5 if a.dtype == np.uint8 else 0.5)


def eight_bit(img: Image.Image, what: str = "the image") -> Image.Image:
    """A 16-bit (I;16) or 32-bit (I, F) grey image as 8-bit grey: integers as 16-bit values, divided by 257 (65,535
    -> 255: Pillow opens a 16-bit PGM, and a 16-bit PNG before Pillow 10.3, as I); floats in 0..1 times 255; other
    ranges are refused (clipped, they would read as white). Each file by the same rule: the scale was once chosen by
    the image's own maximum (8-bit below 256), so a dark 16-bit image read 200 of 65,535 as 200 of 255 and a lighter
    one 300 as 1. ``what`` names the image in errors. ``capsnet prepare``, ``--fit`` and the two recipes here read
    such images alike (``--mnist-style`` read floats in 0..1 as blank, a bug hunt, 2026-12-05)."""
    a = np.asarray(img, dtype=np.float64)
    low, high = (float(a.min()), float(a.max())) if a.size else (0.0, 0.0)
    if not np.isfinite(a).all() or low < 0 or high > 65535 or (img.mode == "F" and high > 1):
        allowed = "0..1" if img.mode == "F" else "0..65535"
        raise DataError(f"{what} is a {img.mode!r} image with values from {low:g} to {high:g}, outside {allowed}; "
                        f"save it as an 8- or 16-bit image")
    scale = 255 if img.mode == "F" else 1 / 257
    return Image.fromarray(np.round(a * scale).astype(np.uint8), mode="L")


def _worked(img: Image.Image) -> Image.Image:
    """The image both recipes work on: 16- and 32-bit grey as 8 bits (``eight_bit``: convert("L") clips at 255),
    and shrunk to ``WORK_SIDE`` pixels a side at most, so the float arrays stay small. Channels that are not RGB
    (LAB, HSV) are refused, as ``--fit`` refuses them (convert's own ValueError named no file)."""
    if img.mode.startswith(("I", "F")):
        img = eight_bit(img, "this")
    if img.mode not in ("1", "L", "LA", "P", "PA", "RGB", "RGBA", "RGBa", "La", "CMYK", "YCbCr"):
        raise DataError(f"this is a {img.mode!r} image, which is not converted here; save it as RGB or grey")
    return shrink(img, WORK_SIDE) if max(img.size) > WORK_SIDE else img


def mnist_style(img: Image.Image, shape: tuple[int, int, int]) -> torch.Tensor:
    """An image as MNIST was made: bright digit on black, box-scaled, centred by centre of mass.

    Shapes: returns (C, H, W) float in [0, 1] for ``shape`` = (C, H, W).
    Colour models (C = 3) get the image resized to H x W, nothing more.
    Images over ``WORK_SIDE`` pixels a side are shrunk to it first, so the
    float arrays below stay small (the digit ends up 20 pixels tall anyway).
    """
    C, H, W = shape
    img = _worked(img)
    if C == 3:
        a = np.asarray(img.convert("RGB").resize((W, H), Image.Resampling.BOX), dtype=np.float32) / 255
        return torch.from_numpy(a).permute(2, 0, 1).contiguous()  # (3, H, W)
    if C != 1:
        raise DataError(f"only 1- and 3-channel models take MNIST-style images, not {C}-channel ones")
    a = _grey(img)
    if light_background(a):  # dark ink on light paper
        a = 1.0 - a
    a = np.clip(a - float(np.median(_border(a))), 0, None)  # the paper's tone taken away
    peak = float(a.max())
    if peak < 0.05:
        raise DataError("the image is blank: give a digit that stands out from its background")
    a = a / peak
    ys, xs = np.nonzero(a > 0.1)
    a = a[ys.min():ys.max() + 1, xs.min():xs.max() + 1]  # the digit's bounding box
    # MNIST's 20 pixels (20/28 of a smaller input): MultiMNIST's and translated MNIST's larger canvases hold MNIST's
    # digits unscaled (a 36x36 upload's digit was 26 pixels tall)
    box = max(1, round(BOX_FRACTION * min(H, W, 28)))
    h, w = a.shape
    scale = box / max(h, w)
    nh, nw = max(1, round(h * scale)), max(1, round(w * scale))
    digit = np.asarray(Image.fromarray(a, mode="F").resize((nw, nh), Image.Resampling.LANCZOS), dtype=np.float32)
    digit = np.clip(digit, 0, 1)
    mass = digit.sum()
    cy = float((digit.sum(axis=1) * np.arange(nh)).sum() / mass)
    cx = float((digit.sum(axis=0) * np.arange(nw)).sum() / mass)
    # Centre of mass at pixel (H / 2, W / 2), (14, 14) in 28x28, where MNIST's digits have theirs
    # (their mean over the test set: 14.0, 14.0); kept inside the field.
    top = int(np.clip(round(H / 2 - cy), 0, H - nh))
    left = int(np.clip(round(W / 2 - cx), 0, W - nw))
    out = np.zeros((H, W), dtype=np.float32)
    out[top:top + nh, left:left + nw] = digit
    return torch.from_numpy(out).unsqueeze(0)  # (1, H, W)


def frame_style(img: Image.Image, shape: tuple[int, int, int]) -> torch.Tensor:
    """An image as a Fashion-MNIST item was made (for one-channel models of other data than MNIST's digits): light
    on black (a light background inverted), the whole image scaled to fit the frame and centred in it, nothing
    trimmed; an image of the frame's size on a dark ground is read as it is (pixels / 255, as ``capsnet predict``).

    Shapes: returns (1, H, W) float in [0, 1] for ``shape`` = (1, H, W).
    """
    C, H, W = shape
    if C != 1:
        raise DataError(f"frame_style makes one-channel images, not {C}-channel ones")
    img = _worked(img)
    a = _grey(img)
    if light_background(a):  # a product photographed on white: Fashion-MNIST's items are light on black
        a = 1.0 - a
    h, w = a.shape
    if (h, w) != (H, W):
        scale = min(H / h, W / w)
        nh, nw = max(1, min(H, round(h * scale))), max(1, min(W, round(w * scale)))
        fitted = np.asarray(Image.fromarray(a, mode="F").resize((nw, nh), Image.Resampling.BOX), dtype=np.float32)
        a = np.zeros((H, W), dtype=np.float32)
        top, left = (H - nh) // 2, (W - nw) // 2
        a[top:top + nh, left:left + nw] = np.clip(fitted, 0, 1)
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).unsqueeze(0)  # (1, H, W)
