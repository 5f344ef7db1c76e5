"""squash and safe_norm against Eq. 1's closed form (Sabour et al. 2017)."""
from __future__ import annotations

import pytest
import torch

from capsnet.ops import safe_norm, squash

# The epsilon sits inside the square root (shared/DESIGN.md), so squash's
# length is off the closed form by at most about eps / 2 = 5e-9 in absolute
# terms; 1e-7 leaves room for float32 rounding and nothing more.
LENGTH_ATOL = 1e-7


def _random(shape: tuple[int, ...], norm: float, dim: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Random vectors along ``dim`` rescaled to lengths in [norm/2, 2 norm]."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    x = x / torch.linalg.norm(x, dim=dim, keepdim=True)
    scale = norm * 2.0 ** (2 * torch.rand(x.sum(dim=dim, keepdim=True).shape, generator=g, dtype=torch.float64) - 1)
    return (x * scale).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("norm", [1e-8, 1e-5, 1e-3, 1e-1, 1.0, 10.0, 1e3, 1e6, 1e15])
@pytest.mark.parametrize("shape,dim", [((64, 8), -1), ((16, 10, 16), -1), ((5, 7, 3), 1), ((6, 4, 5), 0), ((3, 1), -1)])
def test_squash_length_and_direction(dtype, norm, shape, dim):
    s = _random(shape, norm, dim, dtype)
    v = squash(s, dim=dim)
    assert v.shape == s.shape and v.dtype == dtype
    s64, v64 = s.double(), v.double()
    n = torch.linalg.norm(s64, dim=dim)
    expected = n**2 / (1 + n**2)  # Eq. 1: |v| = |s|^2 / (1 + |s|^2)
    torch.testing.assert_close(torch.linalg.norm(v64, dim=dim), expected, rtol=1e-5, atol=LENGTH_ATOL)
    cos = (s64 * v64).sum(dim) / (n * torch.linalg.norm(v64, dim=dim))
    torch.testing.assert_close(cos, torch.ones_like(cos), rtol=0, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_squash_length_relative_accuracy_away_from_zero(dtype):
    # Away from zero the epsilon is invisible: relative error at float precision.
    s = _random((256, 16), 1.0, -1, dtype, seed=1) * torch.logspace(0, 3, 256, dtype=dtype).unsqueeze(1)
    n = torch.linalg.norm(s.double(), dim=-1)
    rtol = 1e-5 if dtype == torch.float32 else 1e-6
    torch.testing.assert_close(torch.linalg.norm(squash(s).double(), dim=-1), n**2 / (1 + n**2), rtol=rtol, atol=0)


def test_squash_bfloat16_matches_closed_form():
    s = _random((128, 8), 1.0, -1, torch.float64, seed=2) * torch.logspace(-2, 2, 128, dtype=torch.float64).unsqueeze(1)
    v = squash(s.to(torch.bfloat16))
    assert v.dtype == torch.bfloat16
    n = torch.linalg.norm(s, dim=-1)
    # bfloat16 keeps 8 bits of mantissa: 2^-8 relative per operation, a few operations.
    torch.testing.assert_close(torch.linalg.norm(v.double(), dim=-1), n**2 / (1 + n**2), rtol=3e-2, atol=1e-4)


def test_squash_float16_matches_closed_form():
    s = _random((64, 8), 1.0, -1, torch.float64, seed=3) * torch.logspace(-1, 1, 64, dtype=torch.float64).unsqueeze(1)
    v = squash(s.half())
    n = torch.linalg.norm(s, dim=-1)
    torch.testing.assert_close(torch.linalg.norm(v.double(), dim=-1), n**2 / (1 + n**2), rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(8,), (4, 16), (2, 3, 8)])
def test_squash_finite_value_and_gradient_at_zero(dtype, shape):
    s = torch.zeros(shape, dtype=dtype, requires_grad=True)
    v = squash(s)
    assert torch.isfinite(v).all()
    assert (v == 0).all()
    # A loss with a non-zero upstream gradient everywhere, so a NaN at zero would show.
    (g,) = torch.autograd.grad((v * torch.ones_like(v)).sum() + safe_norm(v).sum(), s)
    assert g.dtype == dtype
    assert torch.isfinite(g).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_squash_gradient_finite_next_to_zero(dtype):
    # Some capsules exactly zero, others tiny, others ordinary, in one batch.
    s = torch.cat([torch.zeros(2, 8), torch.full((2, 8), 1e-6), torch.randn(2, 8, generator=torch.Generator().manual_seed(0))])
    s = s.to(dtype).requires_grad_(True)
    (g,) = torch.autograd.grad(squash(s).pow(2).sum(), s)
    assert torch.isfinite(g).all()
    assert (g[4:] != 0).any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("norm", [1e-1, 1.0, 1e3])
@pytest.mark.parametrize("dim,keepdim", [(-1, False), (0, True), (1, False)])
def test_safe_norm_matches_linalg_norm_away_from_zero(dtype, norm, dim, keepdim):
    s = _random((6, 5, 4), norm, dim, dtype, seed=4)
    out = safe_norm(s, dim=dim, keepdim=keepdim)
    ref = torch.linalg.norm(s, dim=dim, keepdim=keepdim)
    assert out.shape == ref.shape and out.dtype == dtype
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_safe_norm_finite_at_zero(dtype):
    s = torch.zeros(3, 8, dtype=dtype, requires_grad=True)
    n = safe_norm(s)
    assert torch.isfinite(n).all() and (n < 1e-3).all() and (n >= 0).all()
    (g,) = torch.autograd.grad(n.sum(), s)
    assert torch.isfinite(g).all()


def test_gradcheck_float64_away_from_zero():
    g = torch.Generator().manual_seed(5)
    s = (torch.randn(4, 3, 6, generator=g, dtype=torch.float64) * 1.5).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: squash(x, dim=-1), (s,))
    assert torch.autograd.gradcheck(lambda x: squash(x, dim=1), (s,))
    assert torch.autograd.gradcheck(lambda x: safe_norm(x, dim=-1), (s,))
    assert torch.autograd.gradcheck(lambda x: safe_norm(x, dim=0, keepdim=True), (s,))
    assert torch.autograd.gradgradcheck(lambda x: squash(x, dim=-1), (s,))
