"""Uploaded and drawn images, turned into what the network saw in training.

MNIST's own recipe (LeCun et al., the MNIST page): the digit's bounding box is
scaled to fit a 20x20 box with its aspect ratio kept (anti-aliased, hence
grey levels), then placed in the 28x28 field so that its centre of mass lies
at the centre. For other input sizes the box scales with the input
(20/28 of it). Dark digits on light paper are inverted first, so photos of
handwriting work as well as white strokes on a black canvas.

A segmentation model's input is a whole scene, not a digit to centre:
``canvas_input`` takes an image of exactly the model's input size as it is
(grey or RGB, as the user's own ``folder:DIR`` images are read).
"""
from __future__ import annotations

import io
import threading

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

from .engine import ViewerError

__all__ = ["MAX_UPLOAD_BYTES", "MAX_UPLOAD_PIXELS", "MAX_DECODED_BYTES", "MAX_CONCURRENT_DECODES", "WORK_SIDE",
           "read_image", "mnist_style", "upload_input", "canvas_input"]

MAX_UPLOAD_BYTES = 4 * 1024 * 1024  # uploads larger than this are refused unread
MAX_UPLOAD_PIXELS = 4096 * 4096  # checked from the header, before a pixel is decoded
# Checked from the header too (size x bytes per pixel in memory, after a JPEG's reduced-scale decoding):
# a 12-megapixel phone photo (4032x3024) fits even as RGBA, 46.5 MiB; a 90 KB PNG declaring 4096x4096
# RGBA (64 MiB, and 0.6 GB once preprocessed at full size) does not.
MAX_DECODED_BYTES = 48 * 1024 * 1024
MAX_CONCURRENT_DECODES = 2  # uploads decoded and preprocessed at once; more wait their turn
WORK_SIDE = 1024  # px: larger images are shrunk to this before preprocessing (the digit ends up 20 px tall)
BOX_FRACTION = 20 / 28  # MNIST: 20x20 box in a 28x28 field

_DECODE_SLOTS = threading.BoundedSemaphore(MAX_CONCURRENT_DECODES)


def _bytes_per_pixel(mode: str) -> int:
    """Bytes per pixel of a decoded PIL image: 1 for 1/L/P, 2 for 16-bit grey, 4 for the rest (RGB is stored as 4)."""
    if mode in ("1", "L", "P"):
        return 1
    return 2 if mode.startswith("I;16") else 4


def read_image(data: bytes, *, max_side: int | None = None) -> Image.Image:
    """A PNG or JPEG from bytes, decoded; every failure is a ``ViewerError`` that says why.

    Its size, and the memory it decodes to, are checked from the header
    before any pixel is decoded (``MAX_UPLOAD_PIXELS``, ``MAX_DECODED_BYTES``).
    With ``max_side``, a large JPEG is decoded at 1/2, 1/4 or 1/8 scale (its
    DCT scaling: cheap) and any image larger than ``max_side`` on a side is
    shrunk to it. An EXIF orientation (phone photos) is applied.
    """
    return _decode(_open(data), max_side)


def _open(data: bytes) -> Image.Image:
    """The image's header, read and checked; no pixel decoded yet."""
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
    return img


def _decode(img: Image.Image, max_side: int | None) -> Image.Image:
    w, h = img.size
    if max_side is not None and img.format == "JPEG":
        img.draft(None, (max_side, max_side))  # decode at the smallest DCT scale still >= max_side
    decoded = img.size[0] * img.size[1] * _bytes_per_pixel(img.mode)
    if decoded > MAX_DECODED_BYTES:
        raise ViewerError(f"the image is {w}x{h} pixels of {img.mode}, {decoded / 2**20:.1f} MiB decoded; the "
                          f"viewer decodes at most {MAX_DECODED_BYTES // 2**20} MiB (a 12-megapixel photo): "
                          "scale it down, a digit needs far fewer pixels")
    try:
        img.load()
        if max_side is not None and max(img.size) > max_side:
            img = _shrink(img, max_side)
        return ImageOps.exif_transpose(img)
    except Exception as e:  # truncated or corrupt pixel data
        raise ViewerError(f"the image data is truncated or corrupt ({e}); upload the whole file") from None


def _shrink(img: Image.Image, side: int) -> Image.Image:
    """The image scaled down (box filter; PIL premultiplies alpha) to at most ``side`` pixels on its longer side."""
    w, h = img.size
    scale = side / max(w, h)
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    try:
        return img.resize(size, Image.Resampling.BOX)
    except ValueError:  # a mode PIL cannot resize: keep it, it is within the caps
        return img


def upload_input(data: bytes, shape: tuple[int, int, int]) -> tuple[torch.Tensor, tuple[int, int]]:
    """An uploaded image as the network's input (C, H, W), and its size (width, height) as uploaded.

    What the server does with an upload: at most ``MAX_CONCURRENT_DECODES``
    run at once (the others wait), each decoding within ``read_image``'s caps
    and working at no more than ``WORK_SIDE`` pixels a side, so concurrent
    uploads hold a bounded amount of memory.
    """
    with _DECODE_SLOTS:  # the header too: reading it inflates a PNG's text chunks (Pillow allows 64 MiB of them)
        img = _open(data)
        size = img.size  # before a JPEG's reduced-scale decoding changes it
        return mnist_style(_decode(img, WORK_SIDE), shape), size


def canvas_input(data: bytes, shape: tuple[int, int, int], what: str = "segments {W}x{H} images"
                 ) -> tuple[torch.Tensor, tuple[int, int]]:
    """An uploaded image of exactly the model's input size as a segmentation model's input (C, H, W) in [0, 1] (or a
    synthesis model's label map), and its size (width, height); any other size is a ``ViewerError`` that names the
    size to send: "this model " + ``what`` (formatted with the model's ``W`` and ``H``).

    Nothing is moved or scaled: grey (C = 1) or RGB (C = 3), an alpha channel dropped, as
    ``capsnet.data.segmentation`` reads the user's PNG images. Decoded under the same caps and slots as
    ``upload_input``.
    """
    C, H, W = shape
    if C not in (1, 3):
        raise ViewerError(f"the viewer converts uploads for 1- or 3-channel models, not {C}")
    with _DECODE_SLOTS:  # the header too (see upload_input)
        img = _open(data)
        w, h = img.size
        if sorted((w, h)) != sorted((W, H)):  # from the header (an EXIF rotation may still swap the sides)
            raise ViewerError(f"the image is {w}x{h} pixels; this model {what.format(W=W, H=H)}: upload one of "
                              f"exactly that size (crop or scale it first)")
        if img.mode.startswith(("I", "F")):
            raise ViewerError(f"the image has mode {img.mode!r} (16/32-bit); save it as an 8-bit grey or RGB image")
        img = _decode(img, None)
        if img.size != (W, H):
            raise ViewerError(f"the image is {img.size[0]}x{img.size[1]} pixels once its EXIF rotation is applied; "
                              f"this model {what.format(W=W, H=H)}: upload one of exactly that size")
        try:
            a = np.asarray(img.convert("L" if C == 1 else "RGB"), dtype=np.float32) / 255
        except Exception as e:  # a mode PIL cannot convert
            raise ViewerError(f"the image's mode {img.mode!r} cannot be read as grey or RGB ({e}); save it as an "
                              "8-bit grey or RGB image") from None
    x = torch.from_numpy(a)
    return (x.unsqueeze(0) if C == 1 else x.permute(2, 0, 1)).contiguous(), (w, h)  # (C, H, W)


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
    Images over ``WORK_SIDE`` pixels a side are shrunk to it first, so the
    float arrays below stay small (the digit ends up 20 pixels tall anyway).
    """
    C, H, W = shape
    if img.mode.startswith("I;16") or img.mode == "I":  # 16-bit grey: scaled to 8 bits (convert("L") clips at 255)
        img = Image.fromarray(np.clip(np.asarray(img, dtype=np.float32) / 257, 0, 255).round().astype(np.uint8), "L")
    if max(img.size) > WORK_SIDE:
        img = _shrink(img, WORK_SIDE)
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
