"""Capsule layers: primary capsules from a convolution, fully connected capsules."""
from __future__ import annotations

import torch
from torch import nn

from .ops import squash
from .routing import DynamicRouting, RoutingResult

__all__ = ["PrimaryCaps", "DenseCaps"]


class PrimaryCaps(nn.Module):
    """Convolutional primary capsules (Sabour et al. 2017, section 4).

    One convolution gives ``types * dim`` channels; each group of ``dim``
    consecutive channels at one position is a capsule, squashed. The paper's
    MNIST layer: 32 types of 8D capsules, 9x9 kernel, stride 2, on 20x20x256,
    giving 32 x 6 x 6 = 1152 capsules.
    """

    def __init__(self, in_channels: int, *, types: int = 32, dim: int = 8, kernel_size: int = 9, stride: int = 2) -> None:
        super().__init__()
        self.types, self.dim = types, dim
        self.conv = nn.Conv2d(in_channels, types * dim, kernel_size=kernel_size, stride=stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Shapes:
            x: (B, C, H, W) feature maps
            returns: (B, I, D) squashed capsules, I = types * H' * W', ordered (type, row, column)
        """
        y = self.conv(x)  # (B, types*D, H', W')
        B, _, H, W = y.shape
        y = y.view(B, self.types, self.dim, H, W).permute(0, 1, 3, 4, 2)  # (B, types, H', W', D)
        return squash(y.reshape(B, self.types * H * W, self.dim))  # (B, I, D)


class DenseCaps(nn.Module):
    """Fully connected capsules: every lower capsule votes for every upper one.

    ``u_hat_j|i = W_ij u_i`` (Sabour et al. 2017, Eq. 2), then any routing
    module turns the votes into upper capsules. The weight is stored once, as
    ``(Din, I, J, Dout)``, and never copied per example or per upper capsule.
    With ``DynamicRouting`` the layer calls its ``route_linear``, which builds
    the votes in cache-sized blocks and has a hand-written backward
    (``factored=False`` forces the plain autograd path through ``votes()``,
    which tests compare against).

    Args:
        in_caps, in_dim: number I and length Din of the lower capsules.
        out_caps, out_dim: number J and length Dout of the upper capsules.
        routing: a routing module with the shared call shape (default
            ``DynamicRouting(3)``).
        bias: a learned bias (J, Dout) added to s_j before the squash,
            initialised to 0.1 as in the authors' code.
        factored: route with ``DynamicRouting.route_linear`` (same maths, faster).
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
        u_hat = torch.bmm(u.transpose(0, 1), W)  # (I, B, J*Dout)
        return u_hat.view(I, B, self.out_caps, self.out_dim).transpose(0, 1)  # (B, I, J, Dout)

    def _check(self, u: torch.Tensor) -> None:
        if u.dim() != 3 or tuple(u.shape[1:]) != (self.in_caps, self.in_dim):
            raise ValueError(f"expected lower capsules (B, {self.in_caps}, {self.in_dim}), got {tuple(u.shape)}")

    def forward(self, u: torch.Tensor, activations: torch.Tensor | None = None) -> RoutingResult:
        """Shapes:
            u: (B, I, Din) lower capsules; activations: (B, I) or None
            returns: poses (B, J, Dout), activations (B, J), coupling (B, I, J)
        """
        if self.factored and isinstance(self.routing, DynamicRouting):
            self._check(u)
            return self.routing.route_linear(u, self.weight, self.bias)
        return self.routing(self.votes(u), activations, self.bias)
