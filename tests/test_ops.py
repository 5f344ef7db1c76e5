"""squash and safe_norm against Eq. 1's closed form (Sabour et al. 2017)."""
from __future__ import annotations

import pytest
import torch

from capsnet.ops import _squash_vjp, exp_squash, safe_norm, squash

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
    # |v| grows as |s|^2 near zero (v = s |s| / ((1 + |s|^2) sqrt(|s|^2 + eps))), so its Jacobian there is 0, and so
    # is safe_norm's gradient v / |v| at v = 0: exactly 0, not merely finite
    assert (g == 0).all()


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


def test_safe_norm_of_float16_capsules_past_its_squares_range():
    """16 entries of 300: |s|^2 = 1.44e6, past float16's 65,504 (norm inf and gradient 0 before: a review,
    2026-11-30); summed in float32, the norm 1200 and the gradient s / |s| = 0.25 come back in float16."""
    s = torch.full((2, 16), 300.0, dtype=torch.float16, requires_grad=True)
    n = safe_norm(s)
    assert n.dtype == torch.float16 and torch.equal(n, torch.full((2,), 1200.0, dtype=torch.float16))
    (g,) = torch.autograd.grad(n.sum(), s)
    assert g.dtype == torch.float16 and torch.equal(g, torch.full_like(s, 0.25))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_safe_norm_finite_at_zero(dtype):
    s = torch.zeros(3, 8, dtype=dtype, requires_grad=True)
    n = safe_norm(s)
    eps = 1e-7 if dtype == torch.float16 else 1e-8  # the documented epsilon inside the root
    wide = torch.float32 if dtype == torch.float16 else dtype  # float16's root is taken in float32
    assert torch.equal(n, torch.full((3,), eps, dtype=wide).sqrt().to(dtype))
    (g,) = torch.autograd.grad(n.sum(), s)
    assert (g == 0).all()  # s / norm: finite, and 0 at s = 0


def test_gradcheck_float64_away_from_zero():
    g = torch.Generator().manual_seed(5)
    s = (torch.randn(4, 3, 6, generator=g, dtype=torch.float64) * 1.5).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: squash(x, dim=-1), (s,))
    assert torch.autograd.gradcheck(lambda x: squash(x, dim=1), (s,))
    assert torch.autograd.gradcheck(lambda x: safe_norm(x, dim=-1), (s,))
    assert torch.autograd.gradcheck(lambda x: safe_norm(x, dim=0, keepdim=True), (s,))
    assert torch.autograd.gradgradcheck(lambda x: squash(x, dim=-1), (s,))


# ---------------------------------------------------------------- huge inputs (issue 18)
# |s|^2 overflows float32 from |s| of about 1.8e19 (float16: 256); squash scales such capsules by a
# power of two first. Lengths and directions are checked against Eq. 1 in float64, gradients against its
# derivative in float64: dv/ds = |s|/(1+|s|^2) (I - u u^T) + 2|s|/(1+|s|^2)^2 u u^T, u = s/|s|.

_HUGE = {
    torch.float32: [1e10, 1e18, 2e19, 1e20, 1e30, 1e37, 3e38],
    torch.bfloat16: [1e10, 2e19, 1e30, 3e38],
    torch.float16: [30.0, 100.0, 300.0, 1e4, 65504.0],
}


def _huge_batch(dtype: torch.dtype) -> torch.Tensor:
    """Capsules (rows, D = 16) whose largest entries run up to the dtype's maximum, in several shapes."""
    g = torch.Generator().manual_seed(7)
    top = torch.finfo(dtype).max
    rows = []
    for m in _HUGE[dtype]:
        rows.append(torch.full((16,), m, dtype=torch.float64))  # every entry at m: |s| = 4 m
        one = torch.zeros(16, dtype=torch.float64)
        one[3] = -m  # one-hot, negative
        rows.append(one)
        r = torch.randn(16, generator=g, dtype=torch.float64)
        rows.append(r / r.abs().max() * m)  # random direction, largest entry m
        mixed = torch.randn(16, generator=g, dtype=torch.float64)
        mixed[0] = m  # one huge entry among ordinary ones
        rows.append(mixed)
    s = torch.stack(rows).clamp(-top, top).to(dtype)
    assert torch.isfinite(s).all()
    return s


def _reference(s: torch.Tensor, grad_v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 1's length and its vector-Jacobian product in float64, written to stay finite for huge |s|."""
    s64, g64 = s.double(), grad_v.double()
    n = torch.linalg.norm(s64, dim=-1, keepdim=True)  # at most 4 * 3.4e38: finite in float64
    u = s64 / n
    ug = (u * g64).sum(-1, keepdim=True)
    vjp = n / (1 + n * n) * (g64 - ug * u) + 2 * n / (1 + n * n) ** 2 * ug * u
    return (n * n / (1 + n * n)).squeeze(-1), vjp


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_squash_finite_and_exact_for_huge_inputs(dtype):
    s = _huge_batch(dtype)
    grad_v = torch.randn(s.shape, generator=torch.Generator().manual_seed(8)).to(dtype)
    length, vjp = _reference(s, grad_v)
    leaf = s.clone().requires_grad_(True)
    v = squash(leaf)
    (g_auto,) = torch.autograd.grad(v, leaf, grad_v)
    g_closed = _squash_vjp(s, grad_v)
    for name, t in [("squash", v), ("autograd gradient", g_auto), ("closed-form gradient", g_closed)]:
        assert t.dtype == dtype and torch.isfinite(t).all(), name
    rtol = {torch.float32: 1e-6, torch.bfloat16: 2e-2, torch.float16: 2e-3}[dtype]
    v64 = v.detach().double()
    torch.testing.assert_close(torch.linalg.norm(v64, dim=-1), length, rtol=rtol, atol=0)
    cos = (s.double() * v64).sum(-1) / (torch.linalg.norm(s.double(), dim=-1) * torch.linalg.norm(v64, dim=-1))
    torch.testing.assert_close(cos, torch.ones_like(cos), rtol=0, atol=rtol)
    # The gradient is about 1/|s|: compare it scaled by |s| (1e-38 is below float32's normal range).
    n = torch.linalg.norm(s.double(), dim=-1, keepdim=True)
    gtol = {torch.float32: 2e-6, torch.bfloat16: 5e-2, torch.float16: 1e-2}[dtype]
    for name, got in [("autograd", g_auto), ("closed form", g_closed)]:
        err = ((got.double() - vjp) * n).abs().max().item()
        assert err < gtol * grad_v.double().abs().max().item(), (name, err)


def test_squash_of_the_largest_float32_and_in_every_position():
    top = torch.finfo(torch.float32).max
    s = torch.full((2, 3, 8), top)
    s[1] = -top
    for dim in (0, 1, 2, -1):
        v = squash(s, dim=dim)
        assert torch.isfinite(v).all()
        torch.testing.assert_close(torch.linalg.norm(v.double(), dim=dim), torch.ones(v.sum(dim).shape,
                                   dtype=torch.float64), rtol=1e-6, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_squash_ordinary_inputs_are_computed_exactly_as_eq1_is_written(dtype):
    """The scaling leaves ordinary capsules alone: bit for bit Eq. 1 with its epsilon, value and gradient."""
    from capsnet.ops import _eps

    g = torch.Generator().manual_seed(9)
    s = (torch.randn(512, 16, generator=g, dtype=torch.float64)
         * torch.logspace(-9, 1.4, 512, dtype=torch.float64).unsqueeze(1)).to(dtype)  # entries up to about 30
    s[:4] = 0
    q = s.pow(2).sum(-1, keepdim=True)
    as_written = s * (q / (1.0 + q) / torch.sqrt(q + _eps(dtype)))
    assert torch.equal(squash(s), as_written)
    grad_v = torch.randn(s.shape, generator=g).to(dtype)
    qf = s.float().pow(2).sum(-1, keepdim=True) if dtype in (torch.float16, torch.bfloat16) else q
    sf, gf = (s.float(), grad_v.float()) if dtype in (torch.float16, torch.bfloat16) else (s, grad_v)
    m = torch.sqrt(qf + _eps(dtype))
    dh = 1.0 / ((1.0 + qf).pow(2) * m) - qf / (2.0 * (1.0 + qf) * m.pow(3))
    closed = (qf / (1.0 + qf) / m * gf + (2.0 * (sf * gf).sum(-1, keepdim=True) * dh) * sf).to(dtype)
    assert torch.equal(_squash_vjp(s, grad_v), closed)


def test_squash_is_continuous_where_the_scaling_starts():
    """Just below and above the float32 thresholds (2^19 for the gradient, 2^61 for the value) nothing jumps."""
    u = torch.randn(16, generator=torch.Generator().manual_seed(10), dtype=torch.float64)
    u = u / u.abs().max()
    for edge in (2.0**19, 2.0**61):
        s = torch.stack([u * edge * f for f in (0.999, 1.0, 1.001, 1.01)]).float()
        grad_v = torch.ones_like(s)
        length, vjp = _reference(s, grad_v)
        torch.testing.assert_close(torch.linalg.norm(squash(s).double(), dim=-1), length, rtol=1e-6, atol=0)
        n = torch.linalg.norm(s.double(), dim=-1, keepdim=True)
        assert ((_squash_vjp(s, grad_v).double() - vjp) * n).abs().max() < 2e-6


def test_squash_empty_capsules():
    assert squash(torch.zeros(3, 0)).shape == (3, 0)
    assert _squash_vjp(torch.zeros(3, 0), torch.zeros(3, 0)).shape == (3, 0)


def test_safe_norm_of_integer_capsules_is_a_float_norm_as_squash_takes_them():
    """safe_norm of int64 [[1, 1]] was int64 [1] (and 0 for [[0, 0]], against the docstring's "never zero"); it
    now promotes to the default float dtype, as squash does (a review of the Python API, 2026-12-02)."""
    for s in (torch.tensor([[1, 1], [0, 0]]), torch.tensor([[True, True], [False, False]])):
        got = safe_norm(s)
        assert got.dtype == torch.get_default_dtype()
        torch.testing.assert_close(got, safe_norm(s.to(torch.get_default_dtype())), rtol=0, atol=0)
        assert abs(got[0].item() - 2 ** 0.5) < 1e-6 and got[1] > 0


@pytest.mark.parametrize("f", [squash, exp_squash, safe_norm])
def test_complex_capsules_a_0d_tensor_and_a_wrong_dim_are_refused_by_name(f):
    """Found by a review (2026-12-01): complex capsules lost their imaginary part with torch's warning alone, and a
    dim past the tensor's met "tuple index out of range" (squash) or torch's own message."""
    name = f.__name__
    with pytest.raises(TypeError, match=rf"{name} takes real capsules, got torch.complex64: pass the real and "
                                        r"imaginary parts as entries of their own \(torch.view_as_real"):
        f(torch.ones(2, 3, dtype=torch.complex64))
    with pytest.raises(ValueError, match=rf"{name} takes capsules \(\.\.\., D\), got a 0-d tensor"):
        f(torch.tensor(2.0))
    for dim in (5, -3, 1.0, True):
        with pytest.raises(ValueError, match=rf"{name}'s dim must be an integer in -2..1 for capsules of shape "
                                             rf"\(2, 3\), got {dim!r}"):
            f(torch.ones(2, 3), dim=dim)
    with pytest.raises(TypeError, match=rf"{name} takes a tensor of capsules, got list"):
        f([1.0, 2.0])
    # integers and bools still read as the default float dtype, along any valid dim
    assert torch.equal(f(torch.ones(2, 3, dtype=torch.bool), dim=-2), f(torch.ones(2, 3), dim=0))
