"""Fully connected capsules: every lower capsule votes for every upper one (Sabour et al. 2017, Eq. 2)."""
from __future__ import annotations

import torch
from torch import nn

from .._eager import autocast_on, eager, promoted
from ..routing import DynamicRouting, RoutingResult, plain_routing_active
from ..routing.result import check_count, check_floating, check_routing, check_switch

__all__ = ["DenseCaps"]


class DenseCaps(nn.Module):
    """Fully connected capsules: every lower capsule votes for every upper one.

    ``u_hat_j|i = W_ij u_i`` (Sabour et al. 2017, Eq. 2), then any routing
    module turns the votes into upper capsules. The weight is stored once, as
    ``(Din, I, J, Dout)``, and never copied per example or per upper capsule.
    When the routing module offers a fast path for linear votes (a
    ``route_linear(u, weight, bias, record=...)`` method, as ``DynamicRouting``
    has), the layer calls it with its weight instead of building the votes;
    ``factored=False`` forces the plain path through ``votes()``, which tests
    compare against; so does ``capsnet.routing.plain_routing()`` for every
    layer at once, and ``torch.export`` tracing (an exported graph holds
    plain operations, not the fast path's autograd function).

    Args:
        in_caps, in_dim: number I and length Din of the lower capsules.
        out_caps, out_dim: number J and length Dout of the upper capsules.
        routing: a routing module with the shared call shape (default
            ``DynamicRouting(3)``).
        bias: a learned bias (J, Dout) added to s_j before the squash,
            initialised to 0.1 as in the authors' code.
        factored: use the routing module's ``route_linear`` when it has one (same maths, faster).
    """

    def __init__(
        self,
        in_caps: int,
        in_dim: int,
        out_caps: int,
        out_dim: int,
        *,
        routing: nn.Module | None = None,
        bias: bool = True,
        factored: bool = True,
    ) -> None:
        super().__init__()
        for name, value in (("in_caps", in_caps), ("in_dim", in_dim), ("out_caps", out_caps), ("out_dim", out_dim)):
            check_count(name, value)
        check_switch("bias", bias)  # "no" built a bias
        check_switch("factored", factored)
        if routing is not None:
            check_routing(routing)
        self.in_caps, self.in_dim, self.out_caps, self.out_dim = in_caps, in_dim, out_caps, out_dim
        self.factored = factored
        self.weight = nn.Parameter(torch.randn(in_dim, in_caps, out_caps, out_dim) * 0.01)  # (Din, I, J, Dout)
        self.bias = nn.Parameter(torch.full((out_caps, out_dim), 0.1)) if bias else None
        self.routing = routing if routing is not None else DynamicRouting(3)

    def extra_repr(self) -> str:
        return f"in_caps={self.in_caps}, in_dim={self.in_dim}, out_caps={self.out_caps}, out_dim={self.out_dim}, bias={self.bias is not None}"

    def votes(self, u: torch.Tensor) -> torch.Tensor:
        """Eq. 2: the predictions ``u_hat_j|i`` of every lower capsule.

        Shapes:
            u: (B, I, Din)
            returns: (B, I, J, Dout), a view of an (I, B, J, Dout) buffer
        """
        self._check(u)
        B, I, Din = u.shape
        W = self.weight.reshape(Din, I, -1).transpose(0, 1)  # (I, Din, J*Dout), a view
        u, W = promoted(u.transpose(0, 1), W)  # as the fast path does: float64 capsules into a float32 layer
        u_hat = torch.bmm(u, W)  # (I, B, J*Dout)
        return u_hat.view(I, B, self.out_caps, self.out_dim).transpose(0, 1)  # (B, I, J, Dout)

    def _check(self, u: torch.Tensor, activations: torch.Tensor | None = None) -> None:
        if u.dim() != 3 or tuple(u.shape[1:]) != (self.in_caps, self.in_dim):
            raise ValueError(f"expected lower capsules (B, {self.in_caps}, {self.in_dim}), got {tuple(u.shape)}")
        check_floating(u, "lower capsules", "u.float() routes them")  # bool and int capsules were routed as floats
        if activations is not None and tuple(activations.shape) != (u.shape[0], self.in_caps):
            # the fast path's routing ignores them, and so had not checked them (the plain path's check_votes does)
            raise ValueError(f"activations must be (B, I) = ({u.shape[0]}, {self.in_caps}) for capsules "
                             f"{tuple(u.shape)}, got shape {tuple(activations.shape)}")

    def forward(self, u: torch.Tensor, activations: torch.Tensor | None = None, *,
                record: bool = False) -> RoutingResult:
        """Shapes:
            u: (B, I, Din) lower capsules; activations: (B, I) or None
            returns: poses (B, J, Dout), activations (B, J), coupling (B, I, J);
                with ``record``, every round's coupling in ``rounds`` (B, R, I, J)
        """
        recording = {"record": True} if record else {}  # a routing module of one's own need not know the keyword
        # the fast path is one autograd Function: plain autograd only (not under vmap, jacrev or forward-mode AD)
        fast = getattr(self.routing, "route_linear", None) \
            if self.factored and not plain_routing_active() and eager() else None
        if fast is not None:
            self._check(u, activations)
            return fast(u, self.weight, self.bias, **recording)
        if autocast_on(u.device.type):  # the votes and the routing in fp32 inside a bf16 step, as the fast path
            # runs them (the plain path is what torch.compile traces: it routed in bf16 there)
            # (float64 capsules stay float64, as the fast path keeps them)
            with torch.autocast(u.device.type, enabled=False):
                wide = torch.promote_types(u.dtype, torch.float32)
                u, a = u.to(wide), None if activations is None else activations.to(wide)
                out = self.routing(self.votes(u), a, self.bias, **recording)
        else:
            out = self.routing(self.votes(u), activations, self.bias, **recording)
        if self.weight.dtype in (torch.bfloat16, torch.float16) and out.poses.dtype != self.weight.dtype:
            # a half model (.bfloat16()) routed by EM, which routes half votes in fp32: handed on in the weights'
            # dtype (as ConvMatrixCaps does), so the decoder's product gets its own dtype; under autocast the weights
            # stay fp32 and so do these
            out = RoutingResult(out.poses.to(self.weight.dtype), out.activations.to(self.weight.dtype), out.coupling,
                                out.rounds)
        return out
