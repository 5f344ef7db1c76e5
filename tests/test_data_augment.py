"""random_shift against a brute-force reference: every output is one of the shifts."""
from __future__ import annotations

import pytest
import torch

from capsnet.data import random_shift


def _shift(images: torch.Tensor, dy: int, dx: int) -> torch.Tensor:
    """Reference: content moved down by dy and right by dx, zeros where it leaves."""
    out = torch.zeros_like(images)
    H, W = images.shape[-2:]
    out[..., max(dy, 0):H + min(dy, 0), max(dx, 0):W + min(dx, 0)] = \
        images[..., max(-dy, 0):H + min(-dy, 0), max(-dx, 0):W + min(-dx, 0)]
    return out


def _which_shift(images: torch.Tensor, shifted: torch.Tensor, max_shift: int) -> list:
    """For each example the (dy, dx) that explains it; None if no shift does."""
    shifts = [(dy, dx) for dy in range(-max_shift, max_shift + 1)
              for dx in range(-max_shift, max_shift + 1)]
    match = torch.stack([(_shift(images, dy, dx) == shifted).flatten(1).all(1)
                         for dy, dx in shifts])  # (S, B)
    # Random noise images in 1..255 make every shift of an image distinct.
    assert (match.sum(0) <= 1).all()
    return [shifts[int(m.nonzero()[0])] if m.any() else None for m in match.T]


def _noise(B: int, C: int = 1, H: int = 28, W: int = 28, dtype=torch.uint8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 256, (B, C, H, W), generator=g).to(dtype)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32, torch.float64, torch.bfloat16])
def test_each_output_is_a_zero_filled_shift_of_its_input(dtype):
    images = _noise(300, C=2, H=12, W=10, dtype=dtype)
    out = random_shift(images, 2, generator=torch.Generator().manual_seed(1))
    assert out.shape == images.shape and out.dtype == dtype and out.device == images.device
    found = _which_shift(images, out, 2)
    assert None not in found
    # Per example, not per batch: a few hundred examples see all 25 shifts.
    assert len(set(found)) == 25


@pytest.mark.parametrize("max_shift", [1, 3])
def test_other_ranges(max_shift):
    images = _noise(600, H=9, W=9)
    out = random_shift(images, max_shift, generator=torch.Generator().manual_seed(0))
    found = _which_shift(images, out, max_shift)
    assert None not in found and len(set(found)) == (2 * max_shift + 1) ** 2


def test_default_generator():
    images = _noise(50)
    assert None not in _which_shift(images, random_shift(images), 2)


def test_seeded_generator_repeats_and_different_seeds_differ():
    images = _noise(64)
    a = random_shift(images, generator=torch.Generator().manual_seed(7))
    b = random_shift(images, generator=torch.Generator().manual_seed(7))
    c = random_shift(images, generator=torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_zero_shift_is_identity_and_bad_input_is_refused():
    images = _noise(4)
    assert random_shift(images, 0) is images
    with pytest.raises(ValueError, match=r"\(B, C, H, W\)"):
        random_shift(images[:, 0])
    with pytest.raises(ValueError, match="max_shift"):
        random_shift(images, -1)


@pytest.mark.requires_cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu_for_the_same_generator():
    images = _noise(256)
    cpu = random_shift(images, generator=torch.Generator().manual_seed(3))
    gpu = random_shift(images.cuda(), generator=torch.Generator().manual_seed(3))
    assert gpu.device.type == "cuda" and torch.equal(gpu.cpu(), cpu)
    on_device = random_shift(images.cuda(), generator=torch.Generator("cuda").manual_seed(3))
    found = _which_shift(images, on_device.cpu(), 2)
    assert None not in found and len(set(found)) == 25
