"""Inverted dot-product attention routing: Tsai, Srivastava, Goh and Salakhutdinov, "Capsules with inverted
dot-product attention routing" (ICLR 2020), as the official code (apple/ml-capsules-inverted-attention-routing).

The parents' poses start as the plain mean of the votes (the first pass is
uniform, 1/J); every later pass lets each child attend to the parents whose
current pose agrees with its vote, a softmax over the parents of
``v_ij . p_j / sqrt(D)`` (the inverted attention: children compete for
parents; the 1 / sqrt(D) is the official code's, the paper's Eq. 2 has no
scale), and sets ``p_j = sum_i r_ij v_ij`` (no division by sum_i r_ij).
Layer normalisation over the D pose entries follows every pass; there is no
squash and no activation: ``activations`` are the pose lengths. Each layer
routes its passes on its own (the code's ``sequential_routing``) unless a
model runs the paper's concurrent routing across layers: a call with
``passes=1`` makes a single pass, uniform, or, given ``start``, from the
parents' poses (B, J, D) of the iteration before
(``InvertedCapsNetConfig.routing_mode``; the matrix capsule layers hand
these keywords on to their routing).

The votes enter the passes only through batched matrix-vector products
(``sum_i r_ij v_ij`` and ``v_ij . p_j``), so training steps take the votes'
gradient from all passes in one product of rank 2T - 1 (T passes;
``routing/_fused.py``), where plain autograd writes a vote-sized outer
product per use: same values and gradients (tests/test_routing_inverted.py),
and inverted-capsnet's training step in 0.74x the time, at 0.68x the peak
memory, on a CPU (benchmarks/README.md, "Inverted dot-product attention's
fused backward and the block copy"). Recording, inference, tracing, export,
compiling and torch.func transforms take the plain path; for double
backward or ``retain_graph=True`` build the routing with ``fused_backward=False``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..ops import _scale
from ._fused import first_order, tap, tapped_backward, wants_fused_backward
from .result import RoutingResult, check_count, check_switch, check_votes, float16_in_float32, widened

__all__ = ["InvertedDotProductRouting"]


class InvertedDotProductRouting(nn.Module):
    """Inverted dot-product attention routing (Tsai, Srivastava, Goh and Salakhutdinov, "Capsules with Inverted
    Dot-Product Attention Routing", ICLR 2020) with the shared call shape.

    Args:
        dim: D, the pose size (the layer norm's, with its learned scale and shift).
        iterations: passes, the uniform first one included (the paper's CIFAR runs: 2).
        fused_backward: training steps take the votes' gradient in one batched product
            (module docstring); False runs plain autograd (same numbers, slower).
    """

    probabilities = False  # its activations are layer-normed poses' lengths, about sqrt(D): no presence probabilities

    def __init__(self, dim: int, iterations: int = 2, *, fused_backward: bool = True) -> None:
        super().__init__()
        check_count("dim", dim)
        if dim == 1:  # the layer norm of one number is its learned shift alone: constant poses, no gradient
            raise ValueError("dim must be at least 2: the layer norm of a one-number pose is its learned shift alone "
                             "(constant poses, no gradient to the votes); give capsules of 2 or more dimensions")
        check_count("iterations", iterations)
        check_switch("fused_backward", fused_backward)
        self.dim, self.iterations = dim, iterations
        self.fused_backward = fused_backward
        self.norm = nn.LayerNorm(dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, iterations={self.iterations}"

    @float16_in_float32
    def forward(self, votes: torch.Tensor, activations: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                *, record: bool = False, passes: int | None = None, start: torch.Tensor | None = None
                ) -> RoutingResult:
        """Shapes:
            votes: (B, I, J, D); activations: ignored (accepted for the shared call shape); bias: (J, D) or None
            returns: poses p (B, J, D), activations |p_j| (B, J), coupling r of the last pass (B, I, J);
                with ``record``, ``rounds`` (B, R, I, J)

        ``passes``: this call's passes (None: ``iterations``); ``start``: the parents' poses (B, J, D) the first of
        them agrees with, in place of the uniform first pass (concurrent routing's later iterations; the gradient
        reaches ``start`` too). Either takes the plain backward, not the fused one.
        """
        B, I, J, D = check_votes(votes, activations, bias)
        if D != self.dim:
            raise ValueError(f"votes of {D} dimensions for a routing built with dim={self.dim}")
        norm = (self.norm.weight, self.norm.bias)
        votes = widened(votes, self, bias)
        if passes is not None:
            check_count("passes", passes)
        if start is not None and tuple(start.shape) != (B, J, D):
            raise ValueError(f"start must be the parents' poses (B, J, D) = {(B, J, D)}, got {tuple(start.shape)}")
        if start is None and passes is None and self.fused_backward and not record and \
                wants_fused_backward(votes, bias, *norm):
            p, r = _FusedInverted.apply(votes, bias, *norm, self)
            return RoutingResult(p, p.norm(dim=-1), r.transpose(1, 2))
        # Parent-major votes, so both contractions are batched matrix-vector products over (b, j) with no
        # vote-sized temporaries (free when the layer made them in this layout, as the matrix layers do).
        V = votes.transpose(1, 2).reshape(B * J, I, D)  # (B*J, I, D)
        p, r, rounds = self._passes(V, J, bias, norm, record=record, start=start, iterations=passes)
        return RoutingResult(p, p.norm(dim=-1), r.transpose(1, 2), torch.stack(rounds, dim=1) if record else None)

    def _passes(self, V: torch.Tensor, J: int, bias: torch.Tensor | None,
                norm: tuple[torch.Tensor | None, torch.Tensor | None], *, record: bool = False,
                taps: list | None = None, start: torch.Tensor | None = None, iterations: int | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """The passes over parent-major votes V (B*J, I, D): poses p (B, J, D), the last pass's r (B, J, I) and,
        with ``record``, every pass's r as (B, I, J); ``taps`` collects the products for ``_FusedInverted``.
        ``iterations`` passes (None: the module's), the first uniform, or, from the poses ``start``, agreeing."""
        BJ, I, D = V.shape
        B = BJ // J
        r = V.new_full((B, J, I), 1.0 / J)  # the first pass: uniform
        rounds = []
        p = V.new_empty(0) if start is None else start.to(V.dtype)  # the poses, made by each pass, read by the next
        for t in range(self.iterations if iterations is None else iterations):
            if t > 0 or start is not None:
                # v_ij . p_j as p^T V^T: on a CPU several times faster than V p for these thin matrices
                agreement = torch.bmm(p.reshape(BJ, 1, D), V.transpose(1, 2))  # (B*J, 1, I)
                if taps is not None:  # d loss / d V from this product: (d loss / d agreement)^T p^T
                    tap(taps, agreement, None, p.detach().reshape(BJ, 1, D))
                r = torch.softmax(agreement.view(B, J, I) / math.sqrt(D), dim=1)  # over the parents j
            if record:
                rounds.append(r.transpose(1, 2))
            s = torch.bmm(r.reshape(BJ, 1, I), V)  # sum_i r_ij v_ij, (B*J, 1, D)
            if taps is not None:  # d loss / d V from this product: r^T (d loss / d s)
                tap(taps, s, r.detach().reshape(BJ, I, 1), None)
            s = s.view(B, J, D)
            if bias is not None:
                s = s + bias
            # the layer norm squares s, which overflows from about 1e18 (float32): such a parent is scaled by a power
            # of two first (ops._scale; k = 1 for every ordinary one), which the norm takes out again (its eps aside)
            k, _ = _scale(s, -1, power=1)
            # float64 votes into a float32 module: the norm's weights promoted (layer_norm takes one dtype)
            wide = [t.to(s.dtype) if t is not None and torch.promote_types(t.dtype, s.dtype) == s.dtype else t
                    for t in norm]
            p = F.layer_norm(s * k, (D,), *wide, self.norm.eps)  # (B, J, D)
        return p, r, rounds


class _FusedInverted(torch.autograd.Function):
    """The passes with one batched product for the votes' gradient (``routing/_fused.py``).

    forward(votes (B, I, J, D), bias (J, D) or None, norm weight (D,), norm bias (D,), routing) -> poses (B, J, D),
    r (B, J, I). The passes run once, with autograd on, over detached votes; ``backward`` asks their graph
    for the gradients reaching each product and makes the votes' gradient in one ``bmm``.
    """

    @staticmethod
    def forward(ctx, votes, bias, weight, shift, routing):
        B, I, J, D = votes.shape
        with torch.enable_grad():
            bias, weight, shift = (None if t is None else t.detach().requires_grad_() for t in (bias, weight, shift))
            V = votes.detach().transpose(1, 2).reshape(B * J, I, D)  # (B*J, I, D)
            taps: list = []
            p, r, _ = routing._passes(V, J, bias, (weight, shift), taps=taps)
        leaves = tuple(t for t in (bias, weight, shift) if t is not None)
        ctx.graph = ((p, r), taps, leaves, (bias is not None, weight is not None, shift is not None))
        ctx.shape = (B, I, J, D)
        return p.detach(), r.detach()

    @staticmethod
    @first_order("inverted attention routing")
    def backward(ctx, g_p, g_r):
        if ctx.graph is None:
            raise RuntimeError("inverted attention routing's fused backward runs once per forward pass (its graph is "
                               "freed as it goes): to backpropagate through the same forward twice "
                               "(retain_graph=True), build the routing with "
                               "InvertedDotProductRouting(..., fused_backward=False)")
        (outputs, taps, leaves, given), ctx.graph = ctx.graph, None
        L, R, found = tapped_backward(outputs, (g_p, g_r), taps, leaves)
        B, I, J, D = ctx.shape
        g_votes = None
        if L is not None and ctx.needs_input_grad[0]:
            dtype = torch.promote_types(L.dtype, R.dtype)  # under autocast, half-precision products beside fp32 r and p
            g_votes = torch.bmm(L.to(dtype), R.to(dtype)).view(B, J, I, D).transpose(1, 2)  # (B, I, J, D)
        found = iter(found)
        grads = [next(found) if there else None for there in given]
        return (g_votes, *(g if need else None for g, need in zip(grads, ctx.needs_input_grad[1:4])), None)
