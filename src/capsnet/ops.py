"""Pure tensor functions on capsules: squash and a norm that is safe at zero.

Sabour, Frosst and Hinton, "Dynamic Routing Between Capsules" (NIPS 2017),
Eq. 1: ``v = |s|^2 / (1 + |s|^2) * s / |s|``. The length of ``v`` is in [0, 1)
and reads as the probability that the entity the capsule stands for is
present; its orientation is the entity's pose.
"""
from __future__ import annotations

import math

import torch

from ._numbers import is_int

__all__ = ["safe_norm", "squash", "exp_squash"]


def _eps(dtype: torch.dtype) -> float:
    # 1e-8 is representable in float32, float64 and bfloat16 (whose exponent
    # range is float32's) but underflows to 0 in float16, whose smallest
    # subnormal is about 6e-8: there 1e-7 keeps sqrt(0 + eps) > 0.
    return 1e-7 if dtype == torch.float16 else 1e-8


def _real(s: torch.Tensor, dim: int, what: str) -> torch.Tensor:
    """``s`` as real floating-point capsules along ``dim``: integers and bools in the default float dtype; complex
    input, a 0-d tensor or a ``dim`` past ``s``'s dimensions refused by name (a complex capsule lost its imaginary
    part with only torch's warning; a wrong dim met "tuple index out of range")."""
    if not isinstance(s, torch.Tensor):
        raise TypeError(f"{what} takes a tensor of capsules, got {type(s).__name__}")
    if s.is_complex():
        raise TypeError(f"{what} takes real capsules, got {s.dtype}: pass the real and imaginary parts as entries "
                        f"of their own (torch.view_as_real(s).flatten(-2)) or the magnitudes (s.abs())")
    if s.dim() == 0:
        raise ValueError(f"{what} takes capsules (..., D), got a 0-d tensor: give one capsule as a 1-d tensor")
    if not (is_int(dim) and -s.dim() <= dim < s.dim()):
        raise ValueError(f"{what}'s dim must be an integer in {-s.dim()}..{s.dim() - 1} for capsules of shape "
                         f"{tuple(s.shape)}, got {dim!r}")
    return s if s.is_floating_point() else s.to(torch.get_default_dtype())


def _scale(s: torch.Tensor, dim: int | tuple[int, ...], power: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A power of two ``k`` per capsule (``s``'s shape with ``dim`` kept as 1) and ``r = k^2``.

    ``dim`` may be a tuple: one ``k`` for all the entries along those dimensions (their count plays D's part
    below), as the attention routings take one for each example's votes.

    ``k = 1`` (and ``r = 1``) while every entry is at most ``big``, chosen so
    that ``|s|^2`` raised to ``power`` stays inside ``s``'s dtype (squash
    needs ``q = |s|^2`` itself; its closed-form gradient ``q^2.5``): every
    ordinary capsule is then computed exactly as Eq. 1 is written. Above
    ``big``, ``k = 2^-e`` with ``2^e`` the capsule's largest entry rounded
    down to a power of two, so ``t = k s`` has entries below 4 and nothing
    squared can overflow. ``k`` comes from a detached maximum through
    ``torch.where`` (no gradient flows through it, and the squash of ``s``
    does not depend on it), with no Python branching on values, so
    torch.compile traces one graph.
    """
    maxexp = math.frexp(torch.finfo(s.dtype).max)[1]  # max < 2^maxexp: 128 for float32 and bfloat16, 16 for float16
    D = 1
    for d in (dim,) if isinstance(dim, int) else dim:  # a loop, not a generator: torch.compile traces no generators
        D *= s.shape[d]
    D = max(D, 1)
    # D big^2 <= 2^((maxexp - 2) / power): q^power fits with a factor of 4 to spare (float32: 2^61 for squash
    # and 2^19 for its gradient at D = 16; float16: 32).
    big = 2.0 ** math.floor(((maxexp - 2) / power - math.ceil(math.log2(D))) / 2)
    a = torch.maximum(s.detach().amax(dim=dim, keepdim=True), -s.detach().amin(dim=dim, keepdim=True))  # |s| max, no copy
    # e <= maxexp - 2 keeps 2^-e a normal number (never flushed to zero), and |t| < 4 still; e >= 0 never scales
    # up (big < 1 only for capsules of thousands of float16 entries, which no scaling to |t| < 4 can save)
    e = torch.log2(a).floor().clamp(min=0, max=maxexp - 2)
    k = torch.where(a > big, torch.exp2(-e), torch.ones_like(a))
    return k, k * k  # r underflows to 0 for huge inputs, where 1 / |s|^2 is below the dtype's resolution


def safe_norm(s: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:
    """Euclidean norm with the epsilon inside the square root.

    ``sqrt(sum(s^2) + eps)`` is never zero, so it can be divided by (squash
    divides by the norm), and its gradient ``s / norm`` is finite everywhere,
    also in low precision. The value at 0 is ``sqrt(eps)``, 1e-4 in float32,
    well below anything routing or the margin loss can see. Float16 is
    summed in float32 and returned in float16 (its squares overflow for
    entries from about 256 on: a capsule of 16 entries of 300 had norm inf).
    """
    s = _real(s, dim, "safe_norm")  # as squash: integer capsules' norm had been truncated to an integer (0 for 0)
    wide = s.float() if s.dtype == torch.float16 else s  # float16's own epsilon (its value at 0), the sum in float32
    return torch.sqrt(wide.pow(2).sum(dim=dim, keepdim=keepdim) + _eps(s.dtype)).to(s.dtype)


def squash(s: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Eq. 1: shrink ``s`` to length ``|s|^2 / (1 + |s|^2)``, keep its direction.

    Finite for every finite input: ``|s|^2`` of a capsule with entries from
    about 1e19 (float32, bfloat16) or 32 (float16) on would overflow, so such a
    capsule is first scaled by a power of two ``k`` (see ``_scale``) and Eq. 1
    is rewritten in ``t = k s``, ``q = |t|^2``, ``r = k^2``:
    ``v = t q / ((r + q) sqrt(q + eps r))``, the same function of ``s``
    (``k = 1`` gives Eq. 1 with its epsilon exactly as written).

    Shapes:
        s: (..., D) with the capsule dimension at ``dim``; returns the same shape.
    """
    s = _real(s, dim, "squash")
    if s.shape[dim] == 0:  # no entries: nothing to scale (and amax refuses an empty dimension)
        return s.clone()
    k, r = _scale(s, dim, power=1)
    t = s * k
    q = t.pow(2).sum(dim=dim, keepdim=True)  # |s|^2 r, (..., 1)
    norm = torch.sqrt(q.add(r, alpha=_eps(s.dtype)))  # q + eps r, as Eq. 1's q + eps when r = 1
    return t * (q / (r + q) / norm)


def _squash_vjp(s: torch.Tensor, grad_v: torch.Tensor, eps: float | None = None) -> torch.Tensor:
    """The gradient of ``squash`` (its epsilon included) at ``s`` times ``grad_v``, in closed form.

    squash(s) = h(q) s with q = |s|^2, m = sqrt(q + eps), h = q / ((1 + q) m); so
    grad_s = h g + 2 (s . g) h'(q) s, h'(q) = 1 / ((1 + q)^2 m) - q / (2 (1 + q) m^3).
    Like ``squash``, worked in t = k s (``_scale``, here so that q^2 cannot
    overflow): with q_t = |t|^2, r = k^2, m_t = sqrt(q_t + eps r),
    h = k q_t / ((r + q_t) m_t) and h' = k^3 (r / ((r + q_t)^2 m_t) - q_t / (2 (r + q_t) m_t^3)),
    so grad_s = k (h_t g + 2 (t . g) dh_t t); k = 1 for ordinary inputs.
    Written out rather than taken with torch.autograd.grad, which torch.compile
    cannot trace (a compiled model takes the plain routing path today, where
    autograd differentiates squash itself; ``capsnet._eager``).
    Half-precision inputs are worked in fp32 (m^3 and (1 + q)^2 leave fp16's range).
    """
    if s.dtype in (torch.float16, torch.bfloat16):
        return _squash_vjp(s.float(), grad_v.float(), _eps(s.dtype)).to(s.dtype)
    if s.shape[-1] == 0:
        return torch.zeros_like(grad_v)
    k, r = _scale(s, -1, power=3)
    t = s * k
    q = t.pow(2).sum(dim=-1, keepdim=True)
    m = torch.sqrt(q.add(r, alpha=_eps(s.dtype) if eps is None else eps))
    h = q / (r + q) / m
    dh = r / ((r + q).pow(2) * m) - q / (2.0 * (r + q) * m.pow(3))
    return k * (h * grad_v + (2.0 * (t * grad_v).sum(dim=-1, keepdim=True) * dh) * t)


def exp_squash(s: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Efficient-CapsNet's squash (Mazzia et al. 2021, eq. 3): ``(1 - 1/e^|s|) s/|s|``.

    Lengths approach 1 faster than Eq. 1's ``|s|^2 / (1 + |s|^2)`` (length 0.63
    at |s| = 1, where Eq. 1 gives 0.5). Written with ``expm1`` and the safe norm,
    so it is finite, with a finite gradient, at s = 0; a capsule whose |s|^2
    could overflow its dtype is scaled by a power of two first (``_scale``, as
    ``squash`` does), so a long capsule has length 1 in float16 too.

    Shapes:
        s: (..., D) with the capsule dimension at ``dim``; returns the same shape.
    """
    s = _real(s, dim, "exp_squash")
    if s.shape[dim] == 0:  # no entries: nothing to scale (and amax refuses an empty dimension)
        return s.clone()
    k, _ = _scale(s, dim, power=1)  # (..., 1): 1, or a power of two where |s|^2 could overflow
    t = k * s  # the direction of s
    norm_t = safe_norm(t, dim=dim, keepdim=True)
    return t * (-torch.expm1(-(norm_t / k)) / norm_t)  # norm_t / k = |s|
