"""Uploaded and drawn images, turned into what the network saw in training.

A digit is made as MNIST was (``capsnet.data.photos.mnist_style``: its box
scaled to 20x20, or 20/28 of a smaller input, centred by its centre of mass,
dark ink on light paper inverted), so photos of handwriting work as well as
white strokes on a black canvas; a one-channel model of other data
(Fashion-MNIST) gets the whole image fitted to its frame
(``photos.frame_style``).

A segmentation model's input is a whole scene, not a digit to centre:
``canvas_input`` takes an image of the model's input size as it is (grey or
RGB, as the user's own ``folder:DIR`` images are read), or of any other size
its stride divides, up to a cap on pixels.
"""
from __future__ import annotations

import io
import threading

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

from ..data import photos
from ..data.idx import DataError
from ..data.photos import WORK_SIDE, shrink
from ..data.png import scale_binary_label_maps, transparent_share
from .engine import ViewerError

__all__ = ["MAX_UPLOAD_BYTES", "MAX_UPLOAD_PIXELS", "MAX_DECODED_BYTES", "MAX_CONCURRENT_DECODES", "MAX_JPEG_SCANS",
           "WORK_SIDE", "read_image", "mnist_style", "upload_input", "canvas_input", "off_sides"]

MAX_UPLOAD_BYTES = 4 * 1024 * 1024  # uploads larger than this are refused unread
MAX_UPLOAD_PIXELS = 4096 * 4096  # checked from the header, before a pixel is decoded
# Checked from the header too (size x bytes per pixel in memory, after a JPEG's reduced-scale decoding):
# a 12-megapixel phone photo (4032x3024) fits even as RGBA, 46.5 MiB; a 90 KB PNG declaring 4096x4096
# RGBA (64 MiB, and 0.6 GB once preprocessed at full size) does not.
MAX_DECODED_BYTES = 48 * 1024 * 1024
MAX_CONCURRENT_DECODES = 2  # uploads decoded and preprocessed at once; more wait their turn
# A JPEG's scans (SOS markers): a progressive one has about 10 (libjpeg's scripts: 6 grey, 10 colour); each scan is a
# pass over the whole image, so 360,000 empty ones in 4 MiB held a decoder for 15 minutes. 0xFF 0xDA is counted over
# the whole file: in entropy-coded data every 0xFF is followed by 0x00 or a restart marker, so the count is the scans
# plus any in metadata (an EXIF thumbnail's), never fewer.
MAX_JPEG_SCANS = 100

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
    except Image.DecompressionBombError:  # a header past twice Pillow's own cap: said as the viewer says any size over
        raise ViewerError(f"the image is more than {2 * Image.MAX_IMAGE_PIXELS:,} pixels; the viewer takes images "
                          f"of up to {MAX_UPLOAD_PIXELS:,} pixels (for example 4096x4096)") from None  # its cap
    except Exception as e:  # PIL raises many types on a damaged header
        raise ViewerError(f"the upload is not a readable PNG or JPEG image ({e})") from None
    w, h = img.size
    if w < 1 or h < 1 or w * h > MAX_UPLOAD_PIXELS:
        raise ViewerError(f"the image is {w}x{h} pixels; the viewer takes images of up to "
                          f"{MAX_UPLOAD_PIXELS:,} pixels (for example 4096x4096)")
    if data[:2] == b"\xff\xd8" and (scans := data.count(b"\xff\xda")) > MAX_JPEG_SCANS:  # JPEG's start marker:
        # Pillow opens a JPEG with a multi-picture segment (many phones' photos) as "MPO"
        raise ViewerError(f"the JPEG holds {scans:,} scans; the viewer decodes at most {MAX_JPEG_SCANS} (a "
                          f"progressive photo has about 10): save it again as a baseline JPEG or as PNG")
    return img


def _decode(img: Image.Image, max_side: int | None, shrink_to: bool = True) -> Image.Image:
    """``img`` decoded (a JPEG at the smallest scale still ``max_side`` a side) and turned by its EXIF orientation;
    ``shrink_to``: then scaled down to ``max_side`` a side (the viewer's working size)."""
    w, h = img.size
    if max_side is not None and img.format in ("JPEG", "MPO"):
        img.draft(None, (max_side, max_side))  # decode at the smallest DCT scale still >= max_side
    decoded = img.size[0] * img.size[1] * _bytes_per_pixel(img.mode)
    if decoded > MAX_DECODED_BYTES:
        raise ViewerError(f"the image is {w}x{h} pixels of {img.mode}, {decoded / 2**20:.1f} MiB decoded; the "
                          f"viewer decodes at most {MAX_DECODED_BYTES // 2**20} MiB (a 12-megapixel photo): "
                          "scale it down, a digit needs far fewer pixels")
    try:
        img.load()
        if shrink_to and max_side is not None and max(img.size) > max_side:
            img = shrink(img, max_side)
        return ImageOps.exif_transpose(img)
    except Exception as e:  # truncated or corrupt pixel data
        raise ViewerError(f"the image data is truncated or corrupt ({e}); upload the whole file") from None


def upload_input(data: bytes, shape: tuple[int, int, int], style: str = "mnist"
                 ) -> tuple[torch.Tensor, tuple[int, int]]:
    """An uploaded image as the network's input (C, H, W), and its size (width, height) as uploaded; ``style``
    "mnist" makes a digit as MNIST's were made, "frame" fits a one-channel model's whole image to its frame (the
    viewer's ``upload_style``: a Fashion-MNIST item fills its frame), "pad" or "crop" fits it as ``capsnet prepare``
    fits photos (a model trained on a user's class folders).

    What the server does with an upload: at most ``MAX_CONCURRENT_DECODES``
    run at once (the others wait), each decoding within ``read_image``'s caps
    and working at no more than ``WORK_SIDE`` pixels a side (a "crop" or "pad"
    fit works on the image as decoded, within ``MAX_DECODED_BYTES``, as
    ``capsnet predict`` fits it), so concurrent uploads hold a bounded amount of memory.
    """
    with _DECODE_SLOTS:  # the header too: reading it inflates a PNG's text chunks (Pillow allows 64 MiB of them)
        img = _open(data)
        size = img.size  # before a JPEG's reduced-scale decoding changes it
        if style in ("crop", "pad"):  # decoded as capsnet prepare and predict decode a photo, and scaled once: a
            # 3000x600 photo's working copy, shrunk first, differed from predict's input by up to 17 grey levels
            from ..data.prepare import DRAFT_MARGIN

            return mnist_style(_decode(img, DRAFT_MARGIN * max(shape[1:]), shrink_to=False), shape, style), size
        return mnist_style(_decode(img, WORK_SIDE), shape, style), size


def canvas_input(data: bytes, shape: tuple[int, int, int], what: str = "segments {W}x{H} images",
                 label_maps: str | None = None, sides: tuple[int, int] | None = None
                 ) -> tuple[torch.Tensor, tuple[int, int]]:
    """An uploaded image of the model's input size as a segmentation model's input (C, H, W) in [0, 1] (or a
    synthesis model's label map), and its size (width, height); any other size is a ``ViewerError`` that names the
    size to send: "this model " + ``what`` (formatted with the model's ``W`` and ``H``), unless ``sides`` takes it.

    ``sides`` = (multiple, max_pixels): a fully convolutional model's other sizes are taken too, each side a
    multiple of ``multiple`` and at most ``max_pixels`` pixels in all (the model's own size is always taken); a
    ``ViewerError`` names both rules.

    Nothing is moved or scaled: grey (C = 1) or RGB (C = 3), transparency refused, as ``capsnet predict`` and
    training read the user's PNG images. A label map (``label_maps``: how the run's training maps read, "binary" or
    "graded") is read as ``capsnet generate`` reads it: a map of 0s and 1s as 0/255 unless the run trained on graded
    maps. Decoded under the same caps and slots as
    ``upload_input``.
    """
    C, H, W = shape
    if C not in (1, 3):
        raise ViewerError(f"the viewer converts uploads for 1- or 3-channel models, not {C}")
    with _DECODE_SLOTS:  # the header too (see upload_input)
        img = _open(data)
        w, h = img.size
        # from the header (an EXIF rotation may still swap the sides: the rules below hold either way round)
        if sorted((w, h)) != sorted((W, H)) and (sides is None or off_sides(w, h, *sides)):
            raise ViewerError(f"the image is {w}x{h} pixels; {_size_rule(W, H, what, sides)} (crop or scale it "
                              f"first)")
        if img.mode.startswith(("I", "F")):
            raise ViewerError(f"the image has mode {img.mode!r} (16/32-bit); save it as an 8-bit grey or RGB image")
        img = _decode(img, None)
        w, h = img.size  # as shown: after its EXIF rotation
        # a rotation swaps the sides: a W x H model's H x W image (the sides rule holds either way round)
        if (w, h) != (W, H) and (sides is None or off_sides(w, h, *sides)):
            raise ViewerError(f"the image is {w}x{h} pixels once its EXIF rotation is applied; "
                              f"{_size_rule(W, H, what, sides)}")
        try:
            transparent = transparent_share(img)
        except DataError as e:  # a damaged transparency chunk: the client's 400, not a 500
            raise ViewerError(str(e)) from None
        if transparent:  # as capsnet predict, generate and training refuse it
            kind = "label map" if label_maps is not None else "image"  # (``what`` is the model's task, above)
            raise ViewerError(f"the {kind} has transparent pixels; a{'n' if kind == 'image' else ''} {kind} is read "
                              "by its values, not its alpha (strokes painted on a transparent canvas would read as "
                              "empty): flatten it onto its background and save it without alpha")
        try:
            a = np.asarray(img.convert("L" if C == 1 else "RGB"), dtype=np.uint8)
        except Exception as e:  # a mode PIL cannot convert
            raise ViewerError(f"the image's mode {img.mode!r} cannot be read as grey or RGB ({e}); save it as an "
                              "8-bit grey or RGB image") from None
        if label_maps is not None and label_maps != "graded":  # a 0/1 map as 0/255, as capsnet generate reads it
            a = scale_binary_label_maps(a)
        a = a.astype(np.float32) / 255
    x = torch.from_numpy(a)
    return (x.unsqueeze(0) if C == 1 else x.permute(2, 0, 1)).contiguous(), (w, h)  # (C, H, W)


def off_sides(w: int, h: int, multiple: int, max_pixels: int) -> bool:
    """Whether a ``w`` x ``h`` image breaks ``canvas_input``'s ``sides`` rule."""
    return w % multiple != 0 or h % multiple != 0 or w * h > max_pixels


def _size_rule(W: int, H: int, what: str, sides: tuple[int, int] | None) -> str:
    """What ``canvas_input`` takes, said for a refusal: the model's own size, or the ``sides`` rule as well."""
    if sides is None:
        return f"this model {what.format(W=W, H=H)}: upload one of exactly that size"
    multiple, max_pixels = sides  # (a segmentation model's: ``what`` is its default)
    return (f"this model segments images whose sides are multiples of {multiple} (it was trained on {W}x{H}), up to "
            f"{max_pixels:,} pixels in the viewer (e.g. {_largest_square(multiple, max_pixels)}; capsnet predict "
            f"takes larger ones)")


def _largest_square(multiple: int, max_pixels: int) -> str:
    side = int(max_pixels ** 0.5) // multiple * multiple
    return f"{side}x{side}"


def mnist_style(img: Image.Image, shape: tuple[int, int, int], style: str = "mnist") -> torch.Tensor:
    """``capsnet.data.photos.mnist_style`` (MNIST's recipe; ``style`` "frame": ``photos.frame_style``, a
    Fashion-MNIST item's) for the viewer: a problem is a ``ViewerError``, which the server answers with its message.

    Shapes: returns (C, H, W) float in [0, 1] for ``shape`` = (C, H, W).
    """
    try:
        if style in ("crop", "pad"):  # a model of a user's class folders: fitted as capsnet prepare fits photos
            from ..data.prepare import fit_array

            return torch.from_numpy(fit_array(img, *shape[1:], "grey" if shape[0] == 1 else "rgb", style)).float() / 255
        if style == "frame" and shape[0] == 1:
            return photos.frame_style(img, shape)
        return photos.mnist_style(img, shape)
    except DataError as e:
        raise ViewerError(f"{e} (draw or upload one)" if "blank" in str(e) else str(e)) from None
