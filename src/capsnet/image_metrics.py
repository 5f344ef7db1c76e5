"""How close generated images are to real ones, per image: L1, SSIM, the IoU of shapes, and the spread over noise.

Pure tensor functions (CPU or GPU), used to score conditional synthesis
(CapsPix2pix, pix2pix): ``capsnet.synthesis`` applies them to a test split.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .data.segmentation import overlap_scores
from .routing.result import check_count, check_positive
from .runtime import sum_dtype

__all__ = ["l1_error", "ssim", "window_statistics", "shape_iou", "noise_spread", "gaussian_window"]

SSIM_WINDOW = 11  # Wang, Bovik, Sheikh and Simoncelli (2004), section III.C: an 11x11 Gaussian window ...
SSIM_SIGMA = 1.5  # ... of standard deviation 1.5 pixels
SSIM_K1, SSIM_K2 = 0.01, 0.03  # their constants: C1 = (K1 L)^2, C2 = (K2 L)^2 with L the dynamic range


def _pair(a: torch.Tensor, b: torch.Tensor) -> None:
    if a.shape != b.shape or a.dim() != 4:
        raise ValueError(f"expected two image batches (N, C, H, W) of one shape, got {tuple(a.shape)} and "
                         f"{tuple(b.shape)}")


def _pixels(a: torch.Tensor, b: torch.Tensor) -> None:
    """Two image batches of pixel values: floating point, as SSIM's constants and the L1's units assume (uint8
    images were scored as 0..255 against a range of 1: SSIM 0.73 where it is 0.87)."""
    _pair(a, b)
    if not (a.is_floating_point() and b.is_floating_point()):
        raise ValueError(f"images must be floating point in [0, 1] (or [0, data_range]), got {a.dtype} and "
                         f"{b.dtype}: convert 8-bit images with x.float() / 255")


def _some_pixels(t: torch.Tensor, what: str) -> None:
    """Images with at least one value each (a mean over none was NaN for every image), where there are images."""
    if t.shape[-4] and not t[0].numel():
        raise ValueError(f"{what} of images with no pixels (shape {tuple(t.shape)}) is undefined: every image needs "
                         f"at least one channel, row and column")


def _wide(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float64 for the metrics' sums: on its device, or on the CPU for a device that keeps no float64
    (Apple's MPS: ``capsnet.runtime.sum_dtype``)."""
    return (t if sum_dtype(t.device) == torch.float64 else t.cpu()).double()


def l1_error(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Mean absolute difference per image. Shapes: a, b (N, C, H, W) -> (N,) float64 (on the CPU for MPS inputs)."""
    _pixels(a, b)
    _some_pixels(a, "the L1 error")
    return (_wide(a) - _wide(b)).abs().flatten(1).mean(1)


def gaussian_window(size: int = SSIM_WINDOW, sigma: float = SSIM_SIGMA) -> torch.Tensor:
    """A normalised 2-D Gaussian: (size, size) float64 summing to 1."""
    check_count("the window's size", size)
    check_positive("sigma", sigma)  # 0 made every score NaN
    x = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    g = torch.exp(-x ** 2 / (2 * sigma ** 2))
    g = g / g.sum()
    return g[:, None] * g[None, :]  # (size, size)


def window_statistics(a: torch.Tensor, b: torch.Tensor, *, window: int = SSIM_WINDOW, sigma: float = SSIM_SIGMA
                      ) -> tuple[torch.Tensor, ...]:
    """SSIM's local statistics under the Gaussian window at every position where it fits (no padding), each
    channel on its own: the means mu_a, mu_b, variances var_a, var_b and covariance cov.

    Shapes: a, b (N, C, H, W) with H, W >= ``window`` -> five (N*C, 1, H-k+1, W-k+1) float64 tensors.
    """
    _pixels(a, b)
    N, C, H, W = a.shape
    if H < window or W < window:
        raise ValueError(f"SSIM's {window}x{window} window needs images of at least that size, got {H}x{W}")
    x, y = _wide(a).reshape(N * C, 1, H, W), _wide(b).reshape(N * C, 1, H, W)  # each channel on its own
    w = gaussian_window(window, sigma).to(x.device)[None, None]  # (1, 1, k, k)

    def blur(t: torch.Tensor) -> torch.Tensor:
        return F.conv2d(t, w)  # (N*C, 1, H-k+1, W-k+1)

    mu_x, mu_y = blur(x), blur(y)
    return mu_x, mu_y, blur(x * x) - mu_x ** 2, blur(y * y) - mu_y ** 2, blur(x * y) - mu_x * mu_y


def ssim(a: torch.Tensor, b: torch.Tensor, *, data_range: float = 1.0, window: int = SSIM_WINDOW,
         sigma: float = SSIM_SIGMA) -> torch.Tensor:
    """The structural similarity of each pair of images (Wang et al. 2004, equation 13), its mean SSIM map over
    every position where the Gaussian window fits (no padding), averaged over the channels.

    Shapes: a, b (N, C, H, W) with H, W >= ``window`` -> (N,) float64, 1 for identical images.
    """
    check_positive("data_range", data_range, " (1 for images in [0, 1])")
    _pixels(a, b)
    low = min((t.detach().min().item() for t in (a, b) if t.numel()), default=0.0)
    high = max((t.detach().max().item() for t in (a, b) if t.numel()), default=0.0)
    top = max(-low, high)  # the largest magnitude
    if low < 0 and high - low > data_range * (1 + 1e-3):  # [-1, 1] images passed the check below by their magnitude
        raise ValueError(f"pixel values span {low:g} to {high:g}, more than data_range {data_range:g}: give "
                         f"data_range=2 for images in [-1, 1], or scale them to [0, 1]")
    if top > data_range * (1 + 1e-3):  # float images in 0..255 against the default range of 1: SSIM 0.58 for 0.59
        raise ValueError(f"pixel values reach {top:g}, past data_range {data_range:g}: the constants C1, C2 are made "
                         f"from the range; give data_range=255 for images in 0..255, or scale them to [0, 1]")
    mu_x, mu_y, var_x, var_y, cov = window_statistics(a, b, window=window, sigma=sigma)
    N, C = a.shape[:2]
    c1, c2 = (SSIM_K1 * data_range) ** 2, (SSIM_K2 * data_range) ** 2
    s = ((2 * mu_x * mu_y + c1) * (2 * cov + c2)) / ((mu_x ** 2 + mu_y ** 2 + c1) * (var_x + var_y + c2))
    return s.reshape(N, C, s.shape[-2] * s.shape[-1]).mean(2).mean(1)  # no -1: an empty batch has no size to infer


def shape_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IoU of two batches of binary shapes (any nonzero value is inside; floats must be 0 or 1); 1 where both are
    empty.

    Shapes: a, b (N, 1, H, W) -> (N,) float64.
    """
    _pair(a, b)
    for name, t in (("a", a), ("b", b)):
        if t.is_floating_point() and t.numel() and not bool(((t == 0) | (t == 1)).all()):
            # probabilities passed by mistake were all "inside": a perfect IoU of 1 for two random maps
            raise ValueError(f"shape_iou takes binary shapes; {name} holds floats other than 0 and 1 (probabilities "
                             f"or images?): threshold them first, e.g. (x > 0.5)")
    return overlap_scores(a.bool(), b.bool())[1]


def noise_spread(samples: torch.Tensor) -> torch.Tensor:
    """How much images made from one input with different noise differ: the standard deviation over the samples
    at every pixel, averaged over the pixels (0 when the generator ignores its noise).

    Shapes: samples (S, N, C, H, W), S >= 2 draws for each of N inputs -> (N,) float64.
    """
    if samples.dim() != 5 or samples.shape[0] < 2:
        raise ValueError(f"expected samples (S, N, C, H, W) with S >= 2 draws, got {tuple(samples.shape)}")
    if not samples.is_floating_point():  # 8-bit samples gave a spread in 0..255 units beside the others' 0..1
        raise ValueError(f"samples must be floating point in [0, 1], got {samples.dtype}: convert 8-bit images with "
                         f"x.float() / 255")
    _some_pixels(samples[0], "the spread over noise")
    if not samples.shape[1]:  # no inputs (torch's std warned of its degrees of freedom over the empty dimension)
        return torch.zeros(0, dtype=torch.float64, device=_wide(samples[:, :0]).device)
    return _wide(samples).std(dim=0, unbiased=True).flatten(1).mean(1)

