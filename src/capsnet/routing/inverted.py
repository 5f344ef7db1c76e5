"""Inverted dot-product attention routing: Tsai, Srivastava, Goh and Salakhutdinov, "Capsules with inverted
dot-product attention routing" (ICLR 2020), as the official code (apple/ml-capsules-inverted-attention-routing).

The parents' poses start as the plain mean of the votes (the first pass is
uniform, 1/J); every later pass lets each child attend to the parents whose
current pose agrees with its vote, a softmax over the parents of
``v_ij . p_j / sqrt(D)`` (the inverted attention: children compete for
parents), and sets ``p_j = sum_i r_ij v_ij`` (no division by sum_i r_ij).
Layer normalisation over the D pose entries follows every pass; there is no
squash and no activation: ``activations`` are the pose lengths. The paper's
"concurrent" routing across layers is not modelled: each layer routes its
passes on its own (the code's ``sequential_routing``).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from .result import RoutingResult, check_votes

__all__ = ["InvertedDotProductRouting"]


class InvertedDotProductRouting(nn.Module):
    """Inverted dot-product attention routing with the shared call shape.

    Args:
        dim: D, the pose size (the layer norm's, with its learned scale and shift).
        iterations: passes, the uniform first one included (the paper's CIFAR runs: 2).
    """

    def __init__(self, dim: int, iterations: int = 2) -> None:
        super().__init__()
        if not isinstance(iterations, int) or isinstance(iterations, bool) or iterations < 1:
            raise ValueError(f"iterations must be a positive integer, got {iterations!r}")
        self.dim, self.iterations = dim, iterations
        self.norm = nn.LayerNorm(dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, iterations={self.iterations}"

    def forward(self, votes: torch.Tensor, activations: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                *, record: bool = False) -> RoutingResult:
        """Shapes:
            votes: (B, I, J, D); activations: ignored (accepted for the shared call shape); bias: (J, D) or None
            returns: poses p (B, J, D), activations |p_j| (B, J), coupling r of the last pass (B, I, J);
                with ``record``, ``rounds`` (B, R, I, J)
        """
        B, I, J, D = check_votes(votes, activations)
        if D != self.dim:
            raise ValueError(f"votes of {D} dimensions for a routing built with dim={self.dim}")
        # Parent-major votes, so both contractions are batched matrix-vector products over (b, j) with no
        # vote-sized temporaries (free when the layer made them in this layout, as the matrix layers do).
        V = votes.transpose(1, 2).reshape(B * J, I, D)  # (B*J, I, D)
        r = votes.new_full((B, J, I), 1.0 / J)  # the first pass: uniform
        rounds = []
        for t in range(self.iterations):
            if t > 0:
                agreement = torch.bmm(V, p.reshape(B * J, D, 1)).view(B, J, I) / math.sqrt(D)  # v_ij . p_j / sqrt(D)
                r = torch.softmax(agreement, dim=1)  # over the parents j: children compete for parents
            if record:
                rounds.append(r.transpose(1, 2))
            s = torch.bmm(r.reshape(B * J, 1, I), V).view(B, J, D)  # sum_i r_ij v_ij
            if bias is not None:
                s = s + bias
            p = self.norm(s)  # (B, J, D)
        return RoutingResult(p, p.norm(dim=-1), r.transpose(1, 2), torch.stack(rounds, dim=1) if record else None)
