"""Pure tensor functions on capsules: squash and a norm that is safe at zero.

Sabour, Frosst and Hinton, "Dynamic Routing Between Capsules" (NIPS 2017),
Eq. 1: ``v = |s|^2 / (1 + |s|^2) * s / |s|``. The length of ``v`` is in [0, 1)
and reads as the probability that the entity the capsule stands for is
present; its orientation is the entity's pose.
"""
from __future__ import annotations

import torch

__all__ = ["safe_norm", "squash", "exp_squash"]


def _eps(dtype: torch.dtype) -> float:
    # 1e-8 is representable in float32, float64 and bfloat16 (whose exponent
    # range is float32's) but underflows to 0 in float16, whose smallest
    # subnormal is about 6e-8: there 1e-7 keeps sqrt(0 + eps) > 0.
    return 1e-7 if dtype == torch.float16 else 1e-8


def safe_norm(s: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:
    """Euclidean norm with the epsilon inside the square root.

    ``sqrt(sum(s^2) + eps)`` is never zero, so it can be divided by (squash
    divides by the norm), and its gradient ``s / norm`` is finite everywhere,
    also in low precision. The value at 0 is ``sqrt(eps)``, 1e-4 in float32,
    well below anything routing or the margin loss can see.
    """
    return torch.sqrt(s.pow(2).sum(dim=dim, keepdim=keepdim) + _eps(s.dtype))


def squash(s: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Eq. 1: shrink ``s`` to length ``|s|^2 / (1 + |s|^2)``, keep its direction.

    Shapes:
        s: (..., D) with the capsule dimension at ``dim``; returns the same shape.
    """
    sq = s.pow(2).sum(dim=dim, keepdim=True)  # |s|^2, (..., 1)
    norm = torch.sqrt(sq + _eps(s.dtype))
    return s * (sq / (1.0 + sq) / norm)


def _squash_vjp(s: torch.Tensor, grad_v: torch.Tensor, eps: float | None = None) -> torch.Tensor:
    """The gradient of ``squash`` (its epsilon included) at ``s`` times ``grad_v``, in closed form.

    squash(s) = h(q) s with q = |s|^2, m = sqrt(q + eps), h = q / ((1 + q) m); so
    grad_s = h g + 2 (s . g) h'(q) s, h'(q) = 1 / ((1 + q)^2 m) - q / (2 (1 + q) m^3).
    Written out rather than taken with torch.autograd.grad, which torch.compile
    cannot trace: a compiled model then keeps the routing's hand-written
    backward (capsnet.routing) inside its graph.
    Half-precision inputs are worked in fp32 (m^3 and (1 + q)^2 leave fp16's range).
    """
    if s.dtype in (torch.float16, torch.bfloat16):
        return _squash_vjp(s.float(), grad_v.float(), _eps(s.dtype)).to(s.dtype)
    q = s.pow(2).sum(dim=-1, keepdim=True)
    m = torch.sqrt(q + (_eps(s.dtype) if eps is None else eps))
    h = q / (1.0 + q) / m
    dh = 1.0 / ((1.0 + q).pow(2) * m) - q / (2.0 * (1.0 + q) * m.pow(3))
    return h * grad_v + (2.0 * (s * grad_v).sum(dim=-1, keepdim=True) * dh) * s


def exp_squash(s: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Efficient-CapsNet's squash (Mazzia et al. 2021, eq. 3): ``(1 - 1/e^|s|) s/|s|``.

    Lengths approach 1 faster than Eq. 1's ``|s|^2 / (1 + |s|^2)`` (length 0.63
    at |s| = 1, where Eq. 1 gives 0.5). Written with ``expm1`` and the safe norm,
    so it is finite, with a finite gradient, at s = 0 and for any finite s.

    Shapes:
        s: (..., D) with the capsule dimension at ``dim``; returns the same shape.
    """
    norm = safe_norm(s, dim=dim, keepdim=True)  # (..., 1)
    return s * (-torch.expm1(-norm) / norm)
