"""capsnet.viz.images: uploads preprocessed as MNIST was made, and every bad upload refused."""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from capsnet.data import load_dataset
from capsnet.viz import ViewerError
from capsnet.viz.images import MAX_UPLOAD_BYTES, mnist_style, read_image


def _png(img: Image.Image, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt)
    return buf.getvalue()


def _com(a: np.ndarray) -> tuple[float, float]:
    m = a.sum()
    return float((a.sum(1) * np.arange(a.shape[0])).sum() / m), float((a.sum(0) * np.arange(a.shape[1])).sum() / m)


def test_real_mnist_digits_survive_a_scan(data_root):
    """A real test digit, enlarged 4x and printed dark on light paper, comes back as the original."""
    test = load_dataset("mnist", "test", root=data_root, progress=False)
    corr = []
    for i in range(100):
        original = test.images[i, 0].numpy()
        scan = Image.fromarray(255 - original).resize((112, 112), Image.Resampling.NEAREST)
        x = mnist_style(read_image(_png(scan)), (1, 28, 28))
        assert x.shape == (1, 28, 28) and 0 <= x.min() and x.max() <= 1
        corr.append(np.corrcoef(x[0].numpy().ravel(), original.ravel())[0, 1])
    assert np.median(corr) > 0.99 and np.percentile(corr, 10) > 0.99


def test_box_and_centre_of_mass():
    """An off-centre white bar on black (a drawn '1') becomes 20 px tall, aspect kept, mass at (14, 14)."""
    a = np.zeros((300, 200), dtype=np.uint8)
    a[20:120, 10:30] = 255  # 100 x 20: scaled to 20 x 4
    x = mnist_style(read_image(_png(Image.fromarray(a))), (1, 28, 28))[0].numpy()
    ys, xs = np.nonzero(x > 0.5)
    assert ys.max() - ys.min() + 1 == 20 and xs.max() - xs.min() + 1 == 4
    cy, cx = _com(x)
    assert abs(cy - 14) <= 0.5 and abs(cx - 14) <= 0.5
    # other input sizes scale the box: 40x40 gets a 29 px box (20/28 of 40)
    y = mnist_style(read_image(_png(Image.fromarray(a))), (1, 40, 40))[0].numpy()
    ys, _ = np.nonzero(y > 0.5)
    assert ys.max() - ys.min() + 1 == 29 and abs(_com(y)[0] - 20) <= 0.5


def test_transparent_canvas_and_jpeg():
    rgba = np.zeros((100, 100, 4), dtype=np.uint8)
    rgba[30:70, 45:55] = (255, 255, 255, 255)  # white strokes on a transparent canvas
    a = mnist_style(read_image(_png(Image.fromarray(rgba, "RGBA"))), (1, 28, 28))
    rgba[30:70, 45:55] = (0, 0, 0, 255)  # black strokes on a transparent canvas
    b = mnist_style(read_image(_png(Image.fromarray(rgba, "RGBA"))), (1, 28, 28))
    assert a.max() == pytest.approx(1.0) and np.allclose(a.numpy(), b.numpy(), atol=1e-6)
    rgb = np.full((64, 64, 3), 250, dtype=np.uint8)
    rgb[10:50, 28:36] = (20, 20, 90)  # dark blue ink on white paper, as a JPEG
    c = mnist_style(read_image(_png(Image.fromarray(rgb), "JPEG")), (1, 28, 28))[0].numpy()
    assert c[14, 14] > 0.9 and c[1, 1] < 0.05
    # colour models get the image resized, channels kept
    assert mnist_style(read_image(_png(Image.fromarray(rgb))), (3, 32, 32)).shape == (3, 32, 32)


def test_bad_uploads():
    good = _png(Image.fromarray(np.eye(40, dtype=np.uint8) * 255))
    cases = [
        (b"", "empty"),
        (b"hello, this is text", "not a PNG or JPEG"),
        (b"GIF89a" + good, "not a PNG or JPEG"),
        (good[: len(good) // 2], "truncated or corrupt"),
        (b"\0" * (MAX_UPLOAD_BYTES + 1), "up to 4 MiB"),
        (_png(Image.new("1", (5000, 5000))), "5000x5000 pixels"),  # 5 kB of PNG, 25 Mpx: refused before decoding
    ]
    for data, fragment in cases:
        with pytest.raises(ViewerError, match=fragment):
            read_image(data)
    with pytest.raises(ViewerError, match="blank"):
        mnist_style(read_image(_png(Image.new("L", (50, 50), 255))), (1, 28, 28))
