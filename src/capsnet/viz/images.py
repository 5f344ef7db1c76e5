"""Uploaded and drawn images, turned into what the network saw in training.

MNIST's own recipe (LeCun et al., the MNIST page): the digit's bounding box is
scaled to fit a 20x20 box with its aspect ratio kept (anti-aliased, hence
grey levels), then placed in the 28x28 field so that its centre of mass lies
at the centre. For other input sizes the box scales with the input
(20/28 of it). Dark digits on light paper are inverted first, so photos of
handwriting work as well as white strokes on a black canvas.
"""
from __future__ import annotations

import io

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from .engine import ViewerError

__all__ = ["MAX_UPLOAD_BYTES", "MAX_UPLOAD_PIXELS", "read_image", "mnist_style"]

MAX_UPLOAD_BYTES = 4 * 1024 * 1024  # uploads larger than this are refused unread
MAX_UPLOAD_PIXELS = 4096 * 4096  # checked from the header, before a pixel is decoded
BOX_FRACTION = 20 / 28  # MNIST: 20x20 box in a 28x28 field


def read_image(data: bytes) -> Image.Image:
    """A PNG or JPEG from bytes, fully decoded; every failure is a ``ViewerError`` that says why."""
    if len(data) == 0:
        raise ViewerError("the upload is empty: send the bytes of a PNG or JPEG image")
    if len(data) > MAX_UPLOAD_BYTES:
        raise ViewerError(f"the upload is {len(data):,} bytes; the viewer takes images up to "
                          f"{MAX_UPLOAD_BYTES // 2**20} MiB (a digit needs far fewer pixels: scale it down)")
    try:
        img = Image.open(io.BytesIO(data), formats=["PNG", "JPEG"])
    except UnidentifiedImageError:
        raise ViewerError("the upload is not a PNG or JPEG image") from None
    except Exception as e:  # PIL raises many types on a damaged header
        raise ViewerError(f"the upload is not a readable PNG or JPEG image ({e})") from None
    w, h = img.size
    if w < 1 or h < 1 or w * h > MAX_UPLOAD_PIXELS:
        raise ViewerError(f"the image is {w}x{h} pixels; the viewer takes images of up to "
                          f"{MAX_UPLOAD_PIXELS:,} pixels (for example 4096x4096)")
    try:
        img.load()
    except Exception as e:  # truncated or corrupt pixel data
        raise ViewerError(f"the image data is truncated or corrupt ({e}); upload the whole file") from None
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


def mnist_style(img: Image.Image, shape: tuple[int, int, int]) -> torch.Tensor:
    """An image as MNIST was made: bright digit on black, box-scaled, centred by centre of mass.

    Shapes: returns (C, H, W) float in [0, 1] for ``shape`` = (C, H, W).
    Colour models (C = 3) get the image resized to H x W, nothing more.
    """
    C, H, W = shape
    if C == 3:
        a = np.asarray(img.convert("RGB").resize((W, H), Image.Resampling.BOX), dtype=np.float32) / 255
        return torch.from_numpy(a).permute(2, 0, 1).contiguous()  # (3, H, W)
    if C != 1:
        raise ViewerError(f"the viewer converts uploads for 1- or 3-channel models, not {C}")
    a = _grey(img)
    border = np.concatenate([a[0], a[-1], a[:, 0], a[:, -1]])
    if np.median(border) > 0.5:  # dark ink on light paper
        a = 1.0 - a
        border = 1.0 - border
    a = np.clip(a - float(np.median(border)), 0, None)
    peak = float(a.max())
    if peak < 0.05:
        raise ViewerError("the image is blank: draw or upload a digit that stands out from its background")
    a = a / peak
    ys, xs = np.nonzero(a > 0.1)
    a = a[ys.min():ys.max() + 1, xs.min():xs.max() + 1]  # the digit's bounding box
    box = max(1, round(BOX_FRACTION * min(H, W)))
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
