"""capsnet.viz.images: uploads preprocessed as MNIST was made, and every bad upload refused."""
from __future__ import annotations

import io
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from PIL import Image

from capsnet.data import load_dataset
from capsnet.viz import ViewerError, images
from capsnet.viz.images import MAX_UPLOAD_BYTES, mnist_style, read_image, upload_input


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
    # a larger canvas (translated MNIST's 40x40, MultiMNIST's 36x36) holds MNIST's digits unscaled: a 20 px box,
    # centred on its centre (it was 20/28 of 40, 29 px, larger than any digit those models trained on); a smaller
    # input, 20/28 of its side
    for side, box in ((40, 20), (36, 20), (14, 10)):
        y = mnist_style(read_image(_png(Image.fromarray(a))), (1, side, side))[0].numpy()
        ys, _ = np.nonzero(y > 0.5)
        assert ys.max() - ys.min() + 1 == box and abs(_com(y)[0] - side / 2) <= 0.5, side


def test_a_fashion_models_upload_is_fitted_to_its_frame_not_made_a_digit(data_root):
    """A one-channel model of other data than MNIST's digits (Fashion-MNIST) took uploads through MNIST's digit
    recipe, each item shrunk into a 20x20 box and moved by its centre of mass: the shipped Fashion model read 125
    of 200 test items right through the viewer, 178 through capsnet predict (a review, 2026-11-30). Its uploads are
    now fitted whole to the frame: a test item of its own size reads as predict reads it (pixels / 255); a larger
    photo on white is inverted and fitted, aspect kept."""
    import torch

    test = load_dataset("fashion-mnist", "test", root=data_root, progress=False)
    for i in range(20):
        item = test.images[i, 0].numpy()
        x, size = upload_input(_png(Image.fromarray(item)), (1, 28, 28), "frame")
        assert size == (28, 28)
        torch.testing.assert_close(x, torch.from_numpy(item).float().unsqueeze(0) / 255, rtol=0, atol=0)
    photo = np.full((120, 60), 255, np.uint8)  # a dark 100x40 item on white paper, twice as tall as wide
    photo[10:110, 10:50] = 30
    y = upload_input(_png(Image.fromarray(photo)), (1, 28, 28), "frame")[0][0].numpy()
    ys, xs = np.nonzero(y > 0.5)
    assert (ys.min(), ys.max()) == (2, 25) and 9 <= xs.min() and xs.max() <= 18  # 120 -> 28 rows, 14 columns
    assert y[0, 14] < 0.05 and y[14, 1] < 0.05  # the white paper is the black ground
    # the digit recipe on the same item (what it got before): another image altogether
    assert not np.allclose(upload_input(_png(Image.fromarray(test.images[0, 0].numpy())), (1, 28, 28))[0],
                           torch.from_numpy(test.images[0, 0].numpy()).float() / 255, atol=0.1)


def test_the_viewer_fits_uploads_to_the_frame_for_fashion_models_only():
    """load_viewer sets the recipe from the data set the model learned: digits (mnist, MultiMNIST, translated
    MNIST, the shipped sample) the MNIST recipe, Fashion-MNIST the frame; the page is told which (info)."""
    from capsnet.viz.engine import load_viewer

    fashion = load_viewer("pretrained:capsnet-fashion-small", dataset="mnist-sample", progress=False)
    digits = load_viewer("pretrained:capsnet-mnist-small", progress=False)
    assert (fashion.upload_style, digits.upload_style) == ("frame", "mnist")
    assert fashion.info()["upload_style"] == "frame" and fashion.info()["scores_are"] == "lengths"


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


def _header_only_png(width: int, height: int) -> bytes:
    """A PNG of a grey ``width`` x ``height`` header and no pixel data: what a crafted upload may claim."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)) + \
        chunk(b"IEND", b"")


def test_bad_uploads():
    good = _png(Image.fromarray(np.eye(40, dtype=np.uint8) * 255))
    cases = [
        (b"", "empty"),
        (b"hello, this is text", "not a PNG or JPEG"),
        (b"GIF89a" + good, "not a PNG or JPEG"),
        (good[: len(good) // 2], "truncated or corrupt"),
        (b"\0" * (MAX_UPLOAD_BYTES + 1), "up to 4 MiB"),
        (_png(Image.new("1", (5000, 5000))), "5000x5000 pixels"),  # 5 kB of PNG, 25 Mpx: refused before decoding
        # a header of 100000x100000 (past twice Pillow's cap): Pillow's "decompression bomb DOS attack" before
        (_header_only_png(100000, 100000), r"more than [\d,]+ pixels; the viewer takes images of up to 16,777,216 "
                                            r"pixels \(for example 4096x4096\)"),
    ]
    for data, fragment in cases:
        with pytest.raises(ViewerError, match=fragment):
            read_image(data)
    with pytest.raises(ViewerError, match="blank"):
        mnist_style(read_image(_png(Image.new("L", (50, 50), 255))), (1, 28, 28))


# ---------------------------------------------------------------- caps on decoding (issue 18)


def _ring(mode: str, size: tuple[int, int], ink, paper) -> Image.Image:
    """A ring (a drawn '0') in the middle of an image of ``size``."""
    from PIL import ImageDraw

    img = Image.new(mode, size, paper)
    w, h = size
    ImageDraw.Draw(img).ellipse((w * 3 // 8, h // 4, w * 5 // 8, h * 3 // 4), outline=ink, width=max(2, h // 25))
    return img


def test_decoded_size_is_refused_from_the_header():
    data = _png(_ring("RGBA", (4096, 4096), (255, 255, 255, 255), (0, 0, 0, 0)))  # about 90 KB
    assert len(data) < 200_000
    with pytest.raises(ViewerError, match=r"4096x4096 pixels of RGBA, 64\.0 MiB decoded; .* at most 48 MiB"):
        read_image(data)
    with pytest.raises(ViewerError, match="64.0 MiB decoded"):
        upload_input(data, (1, 28, 28))
    # the same size in grey decodes to 16 MiB: taken
    x, size = upload_input(_png(_ring("L", (4096, 4096), 255, 0)), (1, 28, 28))
    assert size == (4096, 4096) and x.shape == (1, 28, 28) and x.max() == pytest.approx(1.0)


def test_a_phone_photo_passes_and_is_turned_upright():
    """A 12-megapixel JPEG of dark ink on paper, stored sideways with EXIF orientation 6 (as phones do)."""
    upright = _ring("RGB", (3024, 4032), (30, 30, 40), (235, 230, 220))
    upright.paste((30, 30, 40), (1300, 3000, 2600, 3100))  # a bar under the ring: the image is not symmetric
    sideways = upright.transpose(Image.Transpose.ROTATE_90)  # what the sensor stored; 6 = rotate 270 to show
    exif = Image.Exif()
    exif[0x0112] = 6
    buf = io.BytesIO()
    sideways.save(buf, "JPEG", quality=85, exif=exif)
    assert len(buf.getvalue()) <= MAX_UPLOAD_BYTES
    x, size = upload_input(buf.getvalue(), (1, 28, 28))
    assert size == (4032, 3024)  # as uploaded
    reference = mnist_style(upright.resize((378, 504), Image.Resampling.BOX), (1, 28, 28))
    corr = np.corrcoef(x.numpy().ravel(), reference.numpy().ravel())[0, 1]
    assert corr > 0.95, corr


def test_a_canvas_of_another_size_is_taken_upright_and_its_size_said_as_shown():
    """A segmentation model's upload of another size its stride divides (``sides``): a 96x64 JPEG stored sideways
    with EXIF orientation 6 is the upright 64x96 (WxH) image, and its size is said as shown (it was the stored 96x64:
    a review, 2026-12-02); other sizes are refused naming both rules."""
    upright = np.zeros((96, 64), np.uint8)
    upright[10:20, 5:60] = 255  # a bar near the top: not symmetric
    sideways = Image.fromarray(upright).transpose(Image.Transpose.ROTATE_90)  # 96 wide, 64 high, as stored
    exif = Image.Exif()
    exif[0x0112] = 6
    buf = io.BytesIO()
    sideways.save(buf, "JPEG", quality=95, exif=exif)
    x, size = images.canvas_input(buf.getvalue(), (1, 64, 64), sides=(8, 65536))
    assert size == (64, 96) and x.shape == (1, 96, 64)
    assert np.abs(x[0].numpy() * 255 - upright).mean() < 8  # upright (JPEG's loss aside)
    for side, said in (((60, 64), "the image is 60x64 pixels; this model segments images whose sides are multiples of "
                                  "8 (it was trained on 64x64), up to 65,536 pixels in the viewer (e.g. 256x256"),
                       ((16, 8192), "up to 65,536 pixels")):
        with pytest.raises(ViewerError, match=re.escape(said)):
            images.canvas_input(_png(Image.new("L", side)), (1, 64, 64), sides=(8, 65536))
    x, size = images.canvas_input(_png(Image.new("L", (64, 64))), (1, 64, 64), sides=(8, 65536))
    assert size == (64, 64) and x.shape == (1, 64, 64)  # the model's own size, as before


def test_large_images_are_worked_small_with_the_same_result():
    """A 3000x3000 drawing gives the digit the same 28x28 image whether shrunk first or not (the bar: 20 px)."""
    a = np.zeros((3000, 3000), dtype=np.uint8)
    a[600:2600, 1400:1600] = 255
    x = mnist_style(read_image(_png(Image.fromarray(a))), (1, 28, 28))[0].numpy()
    small = mnist_style(read_image(_png(Image.fromarray(a[::10, ::10]))), (1, 28, 28))[0].numpy()
    ys, xs = np.nonzero(x > 0.5)
    assert ys.max() - ys.min() + 1 == 20 and xs.max() - xs.min() + 1 == 2
    np.testing.assert_allclose(x, small, atol=0.1)


def test_four_large_uploads_at_once_stay_within_bounded_memory(tmp_path):
    """Four 12-megapixel RGBA PNGs (each about 60 KB, 46.5 MiB decoded) processed by four threads at once.

    Before the caps, one such upload grew memory by about 450 MB and four at once by nearly 2 GB; now two
    decode at a time at most, each working at 1024 px a side. In a subprocess whose address space may grow
    by at most 1.5 GiB, so a regression fails instead of taking the machine's memory.
    """
    path = tmp_path / "big.png"
    path.write_bytes(_png(_ring("RGBA", (4032, 3024), (255, 255, 255, 255), (0, 0, 0, 0))))
    script = textwrap.dedent(f"""
        import re, resource, threading
        from capsnet.viz.images import upload_input
        vm = int(re.search(r"VmSize:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (vm + 3 * 2**29, resource.RLIM_INFINITY))
        data = open({str(path)!r}, "rb").read()
        upload_input(data, (1, 28, 28))  # warm up: imports, first allocations
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        results = []
        threads = [threading.Thread(target=lambda: results.append(upload_input(data, (1, 28, 28))[1]))
                   for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print("SIZES", results)
        print("GREW_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "SIZES [(4032, 3024), (4032, 3024), (4032, 3024), (4032, 3024)]" in out.stdout
    grew = int(out.stdout.split("GREW_KB")[1])
    assert grew < 600_000, f"peak memory grew by {grew:,} kB"  # about 300 MB now; about 1.7 GB before


def test_a_16_bit_grey_scan_reads_as_its_8_bit_twin(data_root):
    """Pillow opens 16-bit grey PNGs as I;16 and its convert("L") clips at 255: every pixel above 255/65535 turned
    white, and a dark-on-light scan came back "blank"."""
    original = load_dataset("mnist", "test", root=data_root, progress=False).images[0, 0].numpy()
    scan = np.asarray(Image.fromarray(255 - original).resize((112, 112), Image.Resampling.NEAREST))
    sixteen = Image.fromarray(scan.astype(np.uint16) * 257)
    assert Image.open(io.BytesIO(_png(sixteen))).mode in ("I;16", "I")  # I before Pillow 10.3
    x8, _ = upload_input(_png(Image.fromarray(scan)), (1, 28, 28))
    x16, _ = upload_input(_png(sixteen), (1, 28, 28))
    np.testing.assert_array_equal(x16.numpy(), x8.numpy())


def test_an_upload_header_is_read_inside_a_decode_slot(monkeypatch):
    """Reading a PNG's header inflates its text chunks (Pillow allows 64 MiB of them): done outside the slots, 30
    small uploads at once held 1.3 GB."""
    from capsnet.viz import images

    seen = []
    opened = images._open
    monkeypatch.setattr(images, "_open", lambda data: seen.append(images._DECODE_SLOTS._value) or opened(data))
    digit = np.zeros((28, 28), np.uint8)
    digit[6:22, 12:16] = 255
    upload_input(_png(Image.fromarray(digit)), (1, 28, 28))
    images.canvas_input(_png(Image.fromarray(digit)), (1, 28, 28))
    assert seen == [images.MAX_CONCURRENT_DECODES - 1] * 2  # one slot taken: this upload's
