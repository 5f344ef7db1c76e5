"""Routing algorithms: votes of lower capsules in, upper capsules out.

Every algorithm is an ``nn.Module`` with one call shape (shared/DESIGN.md)::

    votes:       (B, I, J, D)   prediction u_hat_{j|i} of lower capsule i for upper j
    activations: (B, I) or None presence of the lower capsules (EM uses it)
    returns      RoutingResult(poses (B, J, D), activations (B, J), coupling (B, I, J))
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from .ops import safe_norm, squash

__all__ = ["RoutingResult", "DynamicRouting"]


class RoutingResult(NamedTuple):
    """Output of a routing module; unpacks as ``poses, activations, coupling``."""

    poses: torch.Tensor  # (B, J, D)
    activations: torch.Tensor  # (B, J)
    coupling: torch.Tensor  # (B, I, J), coefficients of the last round


class DynamicRouting(nn.Module):
    """Routing by agreement (Sabour et al. 2017, Procedure 1).

    The routing logits ``b`` start at zero for every example (never shared by
    the batch); ``c_i = softmax_j(b_i)`` couples each lower capsule to the upper
    ones; ``s_j = sum_i c_ij u_hat_j|i (+ bias_j)``; ``v_j = squash(s_j)``;
    ``b_ij += u_hat_j|i . v_j``. Activations are the lengths ``|v_j|``.

    Args:
        iterations: routing rounds r (the paper uses 3).
        leaky: add a zero logit to every softmax, the "orphan" category of the
            authors' code, so a lower capsule can couple to none of the upper.
        detach_agreement: stop gradients through the agreement updates of all
            but the last round (a common speed trick). The default lets them
            flow through every round, as in the authors' code.
    """

    def __init__(self, iterations: int = 3, *, leaky: bool = False, detach_agreement: bool = False) -> None:
        super().__init__()
        if not isinstance(iterations, int) or iterations < 1:
            raise ValueError(f"iterations must be a positive integer, got {iterations!r}")
        self.iterations = iterations
        self.leaky = leaky
        self.detach_agreement = detach_agreement

    def extra_repr(self) -> str:
        return f"iterations={self.iterations}, leaky={self.leaky}, detach_agreement={self.detach_agreement}"

    def _coupling(self, b: torch.Tensor) -> torch.Tensor:
        if not self.leaky:
            return torch.softmax(b, dim=-1)  # Procedure 1, line 4: softmax over j
        # Authors' code (_leaky_routing): a zero logit joins the softmax and its
        # share is dropped, so the kept coefficients sum to less than one.
        leak = b.new_zeros(b.shape[:-1] + (1,))
        return torch.softmax(torch.cat([leak, b], dim=-1), dim=-1)[..., 1:]  # (B, I, J)

    def forward(
        self,
        votes: torch.Tensor,
        activations: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
    ) -> RoutingResult:
        """Route ``votes`` to the upper capsules.

        Shapes:
            votes: (B, I, J, D)
            activations: ignored by dynamic routing (accepted for the shared call shape)
            bias: (J, D) or None, added to s_j before the squash in every round
            returns: poses (B, J, D), activations (B, J), coupling (B, I, J)
        """
        if votes.dim() != 4:
            raise ValueError(f"votes must be (B, I, J, D), got shape {tuple(votes.shape)}")
        B, I, J, D = votes.shape
        if bias is not None and tuple(bias.shape) != (J, D):
            raise ValueError(f"bias must be (J, D) = ({J}, {D}), got shape {tuple(bias.shape)}")
        # One transposed copy so both contractions below are plain batched
        # matmuls over (B, J): far faster on CPU than broadcasting products.
        u_hat = votes.permute(0, 2, 1, 3)  # (B, J, I, D)
        u_hat_detached = u_hat.detach() if self.detach_agreement else u_hat
        b = votes.new_zeros(B, I, J)  # Procedure 1, line 2: per example
        for r in range(self.iterations):
            last = r == self.iterations - 1
            c = self._coupling(b)  # (B, I, J)
            u = u_hat if last else u_hat_detached
            # Procedure 1, line 5: s_j = sum_i c_ij u_hat_j|i
            s = torch.matmul(c.transpose(1, 2).unsqueeze(2), u).squeeze(2)  # (B, J, D)
            if bias is not None:
                s = s + bias
            v = squash(s)  # Procedure 1, line 6; (B, J, D)
            if not last:
                # Procedure 1, line 7: b_ij += u_hat_j|i . v_j
                agreement = torch.matmul(u, v.unsqueeze(-1)).squeeze(-1)  # (B, J, I)
                b = b + agreement.transpose(1, 2)  # (B, I, J)
        return RoutingResult(v, safe_norm(v, dim=-1), c)

    def route_linear(self, u: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> RoutingResult:
        """The same routing for linear votes ``u_hat_j|i = W_ij u_i``, never built.

        Because the votes are linear in ``u``, ``s_j = sum_i c_ij W_ij u_i`` is one
        matrix product over (i, Din) per upper capsule, and the agreement
        ``u_hat_j|i . v_j = u_i . (W_ij^T v_j)``. Neither materialises the
        (B, I, J, Dout) vote tensor, whose size (one copy of the 1.47M-entry
        weight per example for MNIST) makes routing memory-bound. The result
        equals ``forward(votes)`` up to float rounding (tests check both).

        Shapes:
            u: (B, I, Din) lower capsules
            weight: (Din, I, J, Dout), the layout DenseCaps stores
            bias: (J, Dout) or None
            returns: poses (B, J, Dout), activations (B, J), coupling (B, I, J)
        """
        if u.dim() != 3:
            raise ValueError(f"u must be lower capsules (B, I, Din), got shape {tuple(u.shape)}")
        if weight.dim() != 4:
            raise ValueError(f"weight must be (Din, I, J, Dout), got shape {tuple(weight.shape)}")
        B, I, Din = u.shape
        Din_w, I_w, J, D = weight.shape
        if (Din_w, I_w) != (Din, I):
            raise ValueError(f"weight (Din, I, J, Dout) = {tuple(weight.shape)} does not fit capsules (B, I, Din) = {tuple(u.shape)}")
        if bias is not None and tuple(bias.shape) != (J, D):
            raise ValueError(f"bias must be (J, D) = ({J}, {D}), got shape {tuple(bias.shape)}")
        # I innermost in every elementwise product: CPU kernels vectorise along it.
        u_t = u.transpose(1, 2).contiguous()  # (B, Din, I)
        W = weight.reshape(Din * I, J, D).permute(1, 0, 2)  # (J, Din*I, Dout), a view
        u_t_d, W_d = (u_t.detach(), W.detach()) if self.detach_agreement else (u_t, W)
        b = u.new_zeros(J, B, I)  # Procedure 1, line 2: logits per example
        for r in range(self.iterations):
            last = r == self.iterations - 1
            ur, Wr = (u_t, W) if last else (u_t_d, W_d)
            c = self._coupling_j_first(b)  # (J, B, I)
            x = (c.unsqueeze(2) * ur.unsqueeze(0)).reshape(J, B, Din * I)  # c_ij u_i, (J, B, Din*I)
            s = torch.bmm(x, Wr).transpose(0, 1)  # Procedure 1, line 5; (B, J, Dout)
            if bias is not None:
                s = s + bias
            v = squash(s)  # Procedure 1, line 6; (B, J, Dout)
            if not last:
                y = torch.bmm(v.transpose(0, 1), Wr.transpose(1, 2))  # W_ij^T v_j, (J, B, Din*I)
                b = b + (y.view(J, B, Din, I) * ur.unsqueeze(0)).sum(2)  # Procedure 1, line 7; (J, B, I)
        return RoutingResult(v, safe_norm(v, dim=-1), c.permute(1, 2, 0))  # coupling (B, I, J)

    def _coupling_j_first(self, b: torch.Tensor) -> torch.Tensor:
        """softmax over the upper capsules for logits laid out (J, B, I)."""
        if not self.leaky:
            return torch.softmax(b, dim=0)
        leak = b.new_zeros((1,) + b.shape[1:])
        return torch.softmax(torch.cat([leak, b], dim=0), dim=0)[1:]  # (J, B, I)
