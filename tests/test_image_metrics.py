"""capsnet.image_metrics against independent references: SSIM by a plain loop over windows, spreads and IoUs by
NumPy and by hand."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from capsnet.image_metrics import gaussian_window, l1_error, noise_spread, shape_iou, ssim


def ssim_by_loops(x: np.ndarray, y: np.ndarray, size: int = 11, sigma: float = 1.5, L: float = 1.0) -> float:
    """Wang et al. (2004), equation 13, window by window with explicit sums; the mean over the windows."""
    r = np.arange(size) - (size - 1) / 2
    g = np.exp(-r ** 2 / (2 * sigma ** 2))
    w = np.outer(g, g) / np.outer(g, g).sum()
    c1, c2 = (0.01 * L) ** 2, (0.03 * L) ** 2
    values = []
    for i in range(x.shape[0] - size + 1):
        for j in range(x.shape[1] - size + 1):
            a, b = x[i:i + size, j:j + size], y[i:i + size, j:j + size]
            ma, mb = (w * a).sum(), (w * b).sum()
            va, vb = (w * (a - ma) ** 2).sum(), (w * (b - mb) ** 2).sum()
            cov = (w * (a - ma) * (b - mb)).sum()
            values.append(((2 * ma * mb + c1) * (2 * cov + c2)) / ((ma ** 2 + mb ** 2 + c1) * (va + vb + c2)))
    return float(np.mean(values))


def test_ssim_matches_a_loop_over_windows_and_averages_channels():
    rng = np.random.default_rng(0)
    x = rng.random((2, 3, 14, 15))
    y = np.clip(x + rng.normal(0, 0.2, x.shape), 0, 1)
    got = ssim(torch.from_numpy(x), torch.from_numpy(y))
    for n in range(2):
        want = np.mean([ssim_by_loops(x[n, c], y[n, c]) for c in range(3)])
        assert got[n].item() == pytest.approx(want, rel=1e-9, abs=1e-12)


def test_ssim_is_one_for_identical_images_symmetric_and_falls_with_noise():
    torch.manual_seed(0)
    x = torch.rand(4, 1, 32, 32)
    torch.testing.assert_close(ssim(x, x), torch.ones(4, dtype=torch.float64))
    y = (x + 0.1 * torch.randn_like(x)).clamp(0, 1)
    z = (x + 0.3 * torch.randn_like(x)).clamp(0, 1)
    torch.testing.assert_close(ssim(x, y), ssim(y, x))
    assert (ssim(x, z) < ssim(x, y)).all() and (ssim(x, y) < 1).all()
    assert gaussian_window().sum().item() == pytest.approx(1.0) and gaussian_window().shape == (11, 11)
    with pytest.raises(ValueError, match="11x11 window needs images of at least that size, got 8x8"):
        ssim(torch.rand(1, 1, 8, 8), torch.rand(1, 1, 8, 8))
    with pytest.raises(ValueError, match="of one shape"):
        ssim(torch.rand(1, 1, 16, 16), torch.rand(2, 1, 16, 16))


def test_l1_iou_and_spread_by_hand_and_numpy():
    a = torch.tensor([[[[0.0, 1.0], [0.5, 0.5]]]])
    b = torch.tensor([[[[1.0, 1.0], [0.0, 0.5]]]])
    assert l1_error(a, b).item() == pytest.approx((1 + 0 + 0.5 + 0) / 4)
    p = torch.tensor([[[[1, 1, 0], [0, 0, 0]]], [[[0, 0, 0], [0, 0, 0]]]], dtype=torch.uint8)
    t = torch.tensor([[[[1, 0, 0], [1, 0, 0]]], [[[0, 0, 0], [0, 0, 0]]]], dtype=torch.uint8)
    torch.testing.assert_close(shape_iou(p, t), torch.tensor([1 / 3, 1.0], dtype=torch.float64))  # both empty: 1
    rng = np.random.default_rng(1)
    s = rng.random((8, 3, 1, 4, 5))
    want = s.std(axis=0, ddof=1).reshape(3, -1).mean(1)
    np.testing.assert_allclose(noise_spread(torch.from_numpy(s)).numpy(), want, rtol=1e-12)
    same = torch.from_numpy(np.repeat(s[:1], 8, axis=0))
    assert noise_spread(same).abs().max().item() == 0.0  # a generator that ignores its noise spreads nothing
    with pytest.raises(ValueError, match="S >= 2 draws"):
        noise_spread(torch.rand(1, 3, 1, 4, 4))
    with pytest.raises(ValueError, match=r"samples must be floating point in \[0, 1\], got torch.uint8: convert"):
        noise_spread(torch.randint(0, 255, (2, 3, 1, 4, 4), dtype=torch.uint8))  # a spread in 0..255 units before
    assert math.isfinite(noise_spread(torch.rand(2, 1, 1, 4, 4)).item())


def test_bad_inputs_to_ssim_and_l1_are_refused_by_name_and_an_empty_batch_scores_nothing():
    """Found by a review (2026-11-29): uint8 images were scored as 0..255 against a range of 1 (SSIM 0.73 where it
    is 0.87, with no word); sigma 0 made every score NaN; an empty batch failed in a reshape."""
    real = torch.zeros(2, 1, 16, 16)
    real[:, :, 4:12, 6:10] = 1.0
    u8 = (real * 255).to(torch.uint8)
    for f in (ssim, l1_error):
        with pytest.raises(ValueError, match=r"images must be floating point in \[0, 1\] .*got torch.uint8 and "
                                             r"torch.uint8: convert 8-bit images with x.float\(\) / 255"):
            f(u8, u8)
    with pytest.raises(ValueError, match="sigma must be a positive finite number, got 0.0"):
        ssim(real, real, sigma=0.0)
    with pytest.raises(ValueError, match="the window's size must be a positive integer, got 0"):
        ssim(real, real, window=0)
    with pytest.raises(ValueError, match=r"data_range must be a positive finite number \(1 for images in \[0, 1\]\)"):
        ssim(real, real, data_range=0)
    # float images in 0..255 against the default range of 1 scored with no word (a review, 2026-12-01): their range
    # named with the fix; the same images at data_range=255 score as those in [0, 1] do
    noisy = (real + 0.2 * torch.rand(2, 1, 16, 16)).clamp(0, 1)
    with pytest.raises(ValueError, match=r"pixel values reach 255, past data_range 1: .* give data_range=255 for "
                                         r"images in 0..255, or scale them to \[0, 1\]"):
        ssim(noisy * 255, real * 255)
    assert ssim(noisy * 255, real * 255, data_range=255).tolist() == pytest.approx(ssim(noisy, real).tolist())
    assert ssim(noisy * 2 - 1, real * 2 - 1, data_range=2).isfinite().all()  # [-1, 1] images, their range 2
    empty = torch.zeros(0, 1, 16, 16)
    assert ssim(empty, empty).shape == (0,) and l1_error(empty, empty).shape == (0,)
    assert ssim(real, real).tolist() == [1.0, 1.0]


def test_images_with_no_pixels_are_refused_not_scored_nan():
    """Found by a review (2026-12-02): the L1 error and the spread over noise of 0-row images were NaN for each."""
    for shape in ((2, 1, 0, 5), (2, 0, 4, 4)):
        blank = torch.zeros(shape)
        with pytest.raises(ValueError, match=rf"the L1 error of images with no pixels \(shape {re.escape(str(shape))}"
                                             rf"\) is undefined: every image needs at least one channel, row"):
            l1_error(blank, blank)
        with pytest.raises(ValueError, match=r"the spread over noise of images with no pixels \(shape \(2, "):
            noise_spread(torch.stack([blank, blank]))
    assert noise_spread(torch.zeros(2, 0, 1, 4, 4)).shape == (0,)  # no inputs: nothing to score, as before


def test_l1_is_the_mean_over_every_channel_and_pixel():
    """The L1 test used one channel, so an RGB error three times too large passed (mutation testing): by hand on
    a 3-channel 2x2 image."""
    a = torch.zeros(1, 3, 2, 2, dtype=torch.float64)
    b = torch.tensor([[[[0.1, 0.2], [0.3, 0.4]], [[0.0, 0.0], [0.0, 0.6]], [[1.0, 0.0], [0.0, 0.0]]]],
                     dtype=torch.float64)
    assert l1_error(a, b).tolist() == pytest.approx([(1.0 + 0.6 + 1.0) / 12], rel=1e-12)


def test_shape_iou_counts_any_nonzero_integer_as_inside_and_refuses_floats_that_are_not_binary():
    """As its docstring says: an 8-bit 255 or 7 is inside. Floats other than 0 and 1 are refused: probabilities
    passed by mistake were all inside, two random maps a perfect IoU of 1 (a review of the Python API, 2026-12-02)."""
    a = torch.tensor([[[[7, 0], [255, 0]]]], dtype=torch.uint8)
    b = torch.tensor([[[[1.0, 0.0], [1.0, 1.0]]]])
    assert shape_iou(a, b).tolist() == [2 / 3]
    with pytest.raises(ValueError, match=r"shape_iou takes binary shapes; b holds floats other than 0 and 1 "
                                         r"\(probabilities or images\?\): threshold them first, e.g. \(x > 0.5\)"):
        shape_iou(a, torch.rand(1, 1, 2, 2) * 0.9 + 0.05)
    ramp = torch.linspace(-1, 1, 121).view(1, 1, 11, 11)
    with pytest.raises(ValueError, match=r"pixel values span -1 to 1, more than data_range 1: give data_range=2 for "
                                         r"images in \[-1, 1\]"):
        ssim(ramp, ramp.flip(-1))
