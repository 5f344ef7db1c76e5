"""Translated MNIST on a 40x40 canvas and the affine digits, placed anywhere or centred, from real MNIST digits."""
from __future__ import annotations

import pytest
import torch

from capsnet.data import load_dataset
from capsnet.data.affine import random_affine, random_translate
from capsnet.data.multimnist import bounding_boxes


@pytest.fixture(scope="module")
def digits(data_root):
    return load_dataset("mnist", "test", root=data_root).images[:600]


def test_affine_parameters_stay_within_affnists_ranges_and_span_them(digits):
    out, p = random_affine(digits, generator=torch.Generator().manual_seed(0))
    assert out.shape == (600, 1, 40, 40) and 0 <= out.min() and out.max() <= 1
    assert p.rotation_deg.abs().max() <= 20 and p.shear.abs().max() <= 0.2
    for s in (p.scale_x, p.scale_y):
        assert 0.8 <= s.min() and s.max() <= 1.2
    assert p.rotation_deg.min() < -18 and p.rotation_deg.max() > 18  # the whole range is drawn
    assert p.shear.min() < -0.18 and p.shear.max() > 0.18


def test_affine_digit_is_whole_and_inside_the_frame(digits):
    out, p = random_affine(digits, generator=torch.Generator().manual_seed(1))
    boxes = bounding_boxes(out)
    assert torch.equal(boxes[:, :2], p.offsets)  # placed where the parameters say
    assert boxes.min() >= 0 and boxes[:, 2:].max() <= 39
    # Nothing cut off: an affine map scales ink by its determinant, sx * sy (rotation and shear keep area).
    ink_in = digits.float().sum((1, 2, 3)) / 255
    ratio = out.sum((1, 2, 3)) / (ink_in * p.scale_x * p.scale_y)
    assert ratio.min() > 0.9 and ratio.max() < 1.1
    offsets = p.offsets
    assert len(set(map(tuple, offsets.tolist()))) > 100  # positions vary


def test_identity_transform_moves_the_digit_unchanged(digits):
    out, p = random_affine(digits[:20], generator=torch.Generator().manual_seed(2), rotation_deg=0, shear=0,
                           scale=(1.0, 1.0))
    src = bounding_boxes(digits[:20].float())
    dst = bounding_boxes(out)
    for n in range(20):
        t, l, b, r = src[n].tolist()
        T, L, B, R = dst[n].tolist()
        assert (b - t, r - l) == (B - T, R - L)
        assert torch.equal(out[n, :, T:B + 1, L:R + 1], digits[n, :, t:b + 1, l:r + 1].float() / 255)  # exact


def test_centred_placement_shifts_each_box_at_most_max_shift_from_the_centre_and_never_onto_the_border(digits):
    for max_shift, size in ((6, 40), (3, 40), (6, 36)):
        out, p = random_affine(digits, size, generator=torch.Generator().manual_seed(6), max_shift=max_shift)
        boxes = bounding_boxes(out)
        assert torch.equal(boxes[:, :2], p.offsets)
        for lo, hi in ((0, 2), (1, 3)):  # rows, then columns
            extent = boxes[:, hi] - boxes[:, lo] + 1
            shift = boxes[:, lo] - (size - extent) // 2
            room = torch.minimum(torch.full_like(extent, max_shift), (size - extent) // 2 - 1)
            assert (shift.abs() <= room).all() and shift.min() == -max_shift and shift.max() == max_shift
            assert boxes[:, lo].min() >= 1 and boxes[:, hi].max() <= size - 2  # off the border
    with pytest.raises(ValueError, match="cannot stay off the border of a 21-pixel frame"):
        random_affine(digits, 21, generator=torch.Generator().manual_seed(6), rotation_deg=0, shear=0,
                      scale=(1.0, 1.0), max_shift=6)  # 20-pixel digits, centred at row 0


def test_same_seed_same_set(digits):
    a, pa = random_affine(digits[:50], generator=torch.Generator().manual_seed(3))
    b, pb = random_affine(digits[:50], generator=torch.Generator().manual_seed(3))
    c, _ = random_affine(digits[:50], generator=torch.Generator().manual_seed(4))
    assert torch.equal(a, b) and torch.equal(pa.offsets, pb.offsets)
    assert not torch.equal(a, c)


def test_translate_places_the_whole_digit_at_its_offset(digits):
    canvas, offsets = random_translate(digits, generator=torch.Generator().manual_seed(5))
    assert canvas.shape == (600, 1, 40, 40) and offsets.min() == 0 and offsets.max() == 12
    for n in range(0, 600, 37):
        y, x = offsets[n].tolist()
        assert torch.equal(canvas[n, :, y:y + 28, x:x + 28], digits[n].float() / 255)
        rest = canvas[n].clone()
        rest[:, y:y + 28, x:x + 28] = 0
        assert rest.abs().sum() == 0  # black elsewhere
    with pytest.raises(ValueError, match="smaller than the 28x28 images"):
        random_translate(digits, 20)


def test_the_affine_test_sets_are_the_same_on_every_cpu_path():
    """Found by a review (2026-11-29): the warp ran in float32, whose vectorised (AVX2, AVX-512) and plain CPU code
    paths differ by up to 6e-6 a pixel, so the fixed affine test sets were not the same on every machine. A process
    held to the plain path (ATEN_CPU_CAPABILITY=default) now makes the same bytes as this one."""
    import contextlib
    import io
    import os
    import subprocess
    import sys

    code = ("import hashlib, torch\n"
            "from capsnet.data.tasks import affine_test, affine_centred_test\n"
            "g = torch.Generator().manual_seed(7)\n"
            "x = torch.zeros(64, 1, 28, 28, dtype=torch.uint8)\n"  # a blotch of ink the size of a digit's
            "x[:, :, 8:20, 10:18] = (torch.rand(64, 1, 12, 8, generator=g) * 255).to(torch.uint8)\n"
            "print(' '.join(hashlib.md5(f(x).numpy().tobytes()).hexdigest() for f in (affine_test, "
            "affine_centred_test)))\n")
    # this process's own path (its best vectorised code) computes here, as a process of this environment would; the
    # plain path needs a process started with the variable, which torch reads once
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        exec(code, {})
    here = said.getvalue()
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "ATEN_CPU_CAPABILITY": "default"}).stdout
    assert here == plain and len(here.split()) == 2


def test_translate_offsets_span_zero_to_the_maximum_on_rows_and_on_columns():
    """Found by mutation testing (2026-11-30): row offsets drawn from 0..size-H-1 (one short) passed, since the
    columns alone met the old test's offsets.max() == 12. Each axis on its own must take every offset 0..12."""
    _, offsets = random_translate(torch.zeros(500, 1, 28, 28), generator=torch.Generator().manual_seed(8))
    assert sorted(set(offsets[:, 0].tolist())) == list(range(13))  # rows: 13 values, each about 38 times in 500
    assert sorted(set(offsets[:, 1].tolist())) == list(range(13))  # columns


def _bars(vertical: bool, n: int) -> torch.Tensor:
    """n 28x28 frames holding one bar of 20 pixels, one pixel wide, through the middle."""
    x = torch.zeros(n, 1, 28, 28)
    if vertical:
        x[:, 0, 4:24, 14] = 1
    else:
        x[:, 0, 14, 4:24] = 1
    return x


def test_shear_slides_rows_sideways_in_proportion_to_the_drawn_shear():
    """Found by mutation testing (2026-11-30): a shear matrix [[1, s], [s, 1]] (s where the 0 belongs) passed every
    test. With rotation 0 and scale 1 the transform is the horizontal shear x' = x + s y (y down): a horizontal bar
    keeps its one row whatever the shear, and a vertical bar leans by s columns a row."""
    gen = torch.Generator().manual_seed(9)
    out, p = random_affine(_bars(False, 200), generator=gen, rotation_deg=0, scale=(1.0, 1.0))
    strong = p.shear.abs() > 0.15  # such a shear tilts the 20-pixel bar over 3 rows if it moved rows
    assert strong.sum() >= 20 and (p.rotation_deg == 0).all() and (p.scale_x == 1).all() and (p.scale_y == 1).all()
    rows = (out[:, 0] > 0.01).any(2).sum(1)  # rows holding ink
    assert rows[strong].max() <= 2
    out, p = random_affine(_bars(True, 200), generator=gen, rotation_deg=0, scale=(1.0, 1.0))
    strong = p.shear.abs() > 0.15
    assert strong.sum() >= 20
    for k in strong.nonzero().flatten().tolist():
        ink = out[k, 0].double()
        lit = (ink.sum(1) > 0.5).nonzero().flatten().tolist()
        columns = [sum(c * float(ink[r, c]) for c in range(40)) / float(ink[r].sum()) for r in lit]  # centroids
        lean = (columns[-1] - columns[0]) / (lit[-1] - lit[0])  # columns moved a row down
        assert abs(lean - float(p.shear[k])) < 0.02


def _axis_deg(m: torch.Tensor) -> float:
    """The principal-axis angle of a (h, w) image's ink in degrees, measured with y down (clockwise as displayed)."""
    h, w = m.shape
    ys, xs = torch.meshgrid(torch.arange(h, dtype=torch.float64), torch.arange(w, dtype=torch.float64), indexing="ij")
    m = m.double()
    n = m.sum()
    mx, my = (m * xs).sum() / n, (m * ys).sum() / n
    cxx, cyy = (m * (xs - mx) ** 2).sum(), (m * (ys - my) ** 2).sum()
    cxy = (m * (xs - mx) * (ys - my)).sum()
    return float(torch.rad2deg(0.5 * torch.atan2(2 * cxy, cxx - cyy)))


def test_rotation_turns_a_bar_by_the_drawn_angle_clockwise_as_displayed():
    """Found by mutation testing (2026-11-30): the rotation matrix transposed (the opposite turn to the angle
    reported in AffineParams.rotation_deg) passed every test. R(theta) acts on (x, y) with y down, so with no shear
    and scale 1 a horizontal bar's axis turns by +theta measured with y down: clockwise as displayed."""
    out, p = random_affine(_bars(False, 100), generator=torch.Generator().manual_seed(10), shear=0, scale=(1.0, 1.0))
    assert (p.shear == 0).all() and p.rotation_deg.min() < -15 and p.rotation_deg.max() > 15
    for k in range(100):
        assert abs(_axis_deg(out[k, 0]) - float(p.rotation_deg[k])) < 1.0


def test_the_warp_applies_rotation_after_shear_after_scale_to_a_point():
    """R(theta) @ Shear(s) @ diag(sx, sy), composed in that order (each transform was tested with the others off, so
    the order never mattered in a test: mutation testing, 2026-12-01): one pixel 8 columns right of and 10 rows below
    the centre of a 41x41 canvas lands, as the intensity's centroid, where the composed matrix sends it."""
    import math

    from capsnet.data.affine import _warp

    side, c = 41, 20
    x = torch.zeros(1, 1, side, side, dtype=torch.float64)
    x[0, 0, c + 10, c + 8] = 1.0
    rot, sh, sx, sy = 20.0, 0.2, 1.2, 0.8
    out = _warp(x, *(torch.tensor([v], dtype=torch.float64) for v in (rot, sh, sx, sy)))[0, 0]
    rows, cols = torch.meshgrid(torch.arange(side, dtype=torch.float64), torch.arange(side, dtype=torch.float64),
                                indexing="ij")
    got = ((out * cols).sum() / out.sum() - c, (out * rows).sum() / out.sum() - c)  # (x, y) about the centre
    t = math.radians(rot)
    R = torch.tensor([[math.cos(t), -math.sin(t)], [math.sin(t), math.cos(t)]], dtype=torch.float64)
    S, D = torch.tensor([[1.0, sh], [0.0, 1.0]], dtype=torch.float64), torch.diag(torch.tensor([sx, sy]).double())
    p = torch.tensor([8.0, 10.0], dtype=torch.float64)
    want, other = R @ S @ D @ p, D @ S @ R @ p
    assert torch.allclose(torch.stack(got), want, atol=0.3), (got, want)
    assert (want - other).norm() > 1.0  # the two orders differ here by more than the tolerance


def test_random_affine_draws_its_two_scales_apart_and_places_boxes_over_the_whole_frame():
    """sx and sy are drawn one each (isotropic scaling passed the range test), and the box's top row and left column
    reach both 0 and size - h (a range one short of the bottom passed: mutation testing, 2026-12-01)."""
    from capsnet.data.affine import random_affine

    g = torch.Generator().manual_seed(0)
    digits = torch.zeros(400, 1, 28, 28)
    digits[:, :, 10:15, 12:16] = 1.0  # a 5x4 box, kept by the identity transform below
    _, params = random_affine(digits[:50], generator=g)
    assert (params.scale_x != params.scale_y).all()
    out, params = random_affine(digits, size=40, generator=g, rotation_deg=0.0, shear=0.0, scale=(1.0, 1.0))
    top, left = params.offsets.unbind(1)
    assert (top.min(), top.max(), left.min(), left.max()) == (0, 40 - 5, 0, 40 - 4)
