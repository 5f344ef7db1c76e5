"""Self-attention routing: Mazzia, Salvetti and Chiaberge, "Efficient-CapsNet" (Scientific Reports 2021).

One pass, no iterations. For each upper capsule j the votes of all lower
capsules attend to each other: ``A_j = U_j U_j^T / sqrt(D)``, and a lower
capsule's score is the sum of its row, ``sum_k u_ij . u_kj / sqrt(D)`` (a
vote that agrees with the others scores high). A softmax over the upper
capsules turns the scores into coupling coefficients; a learned prior
``b_ij`` is added to them (after the softmax, as the official code does),
``s_j = sum_i u_ij (c_ij + b_ij)``, and the upper capsules are squashed with
the paper's squash, ``(1 - 1/e^|s|) s/|s|``.

The row sums are computed as ``u_ij . (sum_k u_kj)``: O(I J D) instead of
the O(I^2 J D) of the attention matrix. They are quadratic in the votes, so
an example whose votes reach about 1e18 (float32) would overflow them into
a NaN coupling: its votes are then scaled by a power of two ``k`` first
(``capsnet.ops._scale``; ``k = 1``, the plain formula, for every ordinary
input), and the scores, shifted by their maximum over j, are divided by
``k^2`` again before the softmax (the same coupling; a gap of scores past the
dtype's range becomes a coupling of exactly 0 or 1). The votes are summed over
the children before that scaling (no scaled copy of them), so the sum must fit
the dtype: votes up to about 3e38 / I in float32 (2e35 for CapsNet's 1,152
primary capsules).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ..ops import _scale, exp_squash, safe_norm
from .result import RoutingResult, check_count, check_votes, float16_in_float32, widened

__all__ = ["SelfAttentionRouting"]


class SelfAttentionRouting(nn.Module):
    """Efficient-CapsNet's self-attention routing (Mazzia, Salvetti and Chiaberge 2021) with its learned prior, in
    the shared call shape.

    Args:
        in_caps, out_caps: I and J (the prior b is (I, J), initialised to zero as in the official code).

    ``coupling`` is the softmax part, which sums to one over j for every
    lower capsule i; the weights ``s_j`` actually uses are ``coupling + b``,
    and ``b`` may make them sum to anything.
    """

    def __init__(self, in_caps: int, out_caps: int) -> None:
        super().__init__()
        check_count("in_caps", in_caps)
        check_count("out_caps", out_caps)
        self.in_caps, self.out_caps = in_caps, out_caps
        self.prior = nn.Parameter(torch.zeros(in_caps, out_caps))  # b_ij, (I, J)

    def extra_repr(self) -> str:
        return f"in_caps={self.in_caps}, out_caps={self.out_caps}"

    @float16_in_float32
    def forward(self, votes: torch.Tensor, activations: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                *, record: bool = False) -> RoutingResult:
        """Shapes:
            votes: (B, I, J, D); activations: (B, I) or None, ignored; bias: (J, D) or None, added to s_j
            returns: poses (B, J, D), activations |v_j| (B, J), coupling (B, I, J) (the softmax, before the
                prior); with ``record``, ``rounds`` (B, 1, I, J)
        """
        B, I, J, D = check_votes(votes, activations, bias)
        if (I, J) != (self.in_caps, self.out_caps):
            raise ValueError(f"votes (B, I, J, D) = {tuple(votes.shape)} do not fit this routing's "
                             f"(I, J) = ({self.in_caps}, {self.out_caps})")
        votes = widened(votes, self, bias)
        k, _ = _scale(votes, (1, 2, 3), power=1)  # (B, 1, 1, 1): 1, or a power of two where the scores could overflow
        total = votes.sum(dim=1, keepdim=True) * k * k  # k^2 sum_k u_kj, (B, 1, J, D): no scaled copy of the votes
        scores = (votes * total).sum(dim=-1) / math.sqrt(D)  # k^2 times the row sums of U_j U_j^T / sqrt(D), (B, I, J)
        c = torch.softmax(_unscaled(scores, k.view(B, 1, 1), dim=-1), dim=-1)  # over the upper capsules j
        s = ((c + self.prior).unsqueeze(-1) * votes).sum(dim=1)  # (B, J, D)
        if bias is not None:
            s = s + bias
        v = exp_squash(s)
        return RoutingResult(v, safe_norm(v, dim=-1), c, c.unsqueeze(1) if record else None)

    @float16_in_float32
    def route_grid(self, votes: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """The same routing at every position of a grid, on votes in the layout a convolution makes them
        (``capsnet.layers.conv``; as ``DynamicRouting.route_grid``): no copy of the votes into (B * H * W, I, J, D)
        and back. The coupling is not returned (``forward`` for that).

        Shapes:
            votes: (B, I, J, D, H, W); bias: (J, D) or None; returns poses (B, J, D, H, W)
        """
        if votes.dim() != 6:
            raise ValueError(f"votes must be a grid (B, I, J, D, H, W), got shape {tuple(votes.shape)}")
        _, I, J, D, _, _ = votes.shape
        if (I, J) != (self.in_caps, self.out_caps):
            raise ValueError(f"votes (B, I, J, D, H, W) = {tuple(votes.shape)} do not fit this routing's "
                             f"(I, J) = ({self.in_caps}, {self.out_caps})")
        if bias is not None and tuple(bias.shape) != (J, D):
            raise ValueError(f"bias must be (J, D) = ({J}, {D}), got shape {tuple(bias.shape)}")
        k, _ = _scale(votes, (1, 2, 3), power=1)  # (B, 1, 1, 1, H, W), as in forward, per position
        total = votes.sum(dim=1, keepdim=True) * k * k  # k^2 sum_k u_kj at every position, (B, 1, J, D, H, W)
        scores = (votes * total).sum(dim=3, keepdim=True) / math.sqrt(D)  # k^2 times the row sums, (B, I, J, 1, H, W)
        c = torch.softmax(_unscaled(scores, k, dim=2), dim=2)  # over the upper capsules j
        s = ((c + self.prior.view(1, I, J, 1, 1, 1)) * votes).sum(dim=1)  # (B, J, D, H, W)
        if bias is not None:
            s = s + bias.view(1, J, D, 1, 1)
        return exp_squash(s, dim=2)


def _unscaled(scores: torch.Tensor, k: torch.Tensor, dim: int) -> torch.Tensor:
    """Scores made from votes scaled by ``k`` (k^2 times the true ones), shifted by their maximum along ``dim``
    (which the softmax does not see) and divided by k^2: the true scores' softmax input, with no NaN where the
    true scores would overflow (a gap past the dtype's range becomes -inf, whose softmax is exactly 0)."""
    shifted = scores - scores.detach().amax(dim=dim, keepdim=True)  # <= 0, 0 at the maximum
    return shifted * k.reciprocal().square().clamp(max=torch.finfo(scores.dtype).max)
