"""Convolutional capsules with local routing, and their transpose (LaLonde and Bagci 2018, "Capsules for Object
Segmentation", section 3; the capsule tutorial's "Algorithm 1: Convolutional Capsules + Dynamic Routing").

A grid of capsules is a tensor (B, T, D, H, W): T capsule types of D
dimensions at every one of H x W positions. A convolutional capsule layer
makes the votes of every child type with one K x K kernel per parent type,
shared by the child types (SegCaps' "transformation matrix sharing"): each
child type's grid goes through the same convolution, D_in -> J * D_out
channels. At every output position the kernel window is thus already summed,
and the T child types vote for the J parent types: the votes of one position
are (T, J, D_out). Routing is local: it runs at every position on that
position's votes alone, and per example. Positions are folded into the batch,
(B * H' * W', T, J, D_out), so any routing module of the shared call shape
(``capsnet.routing``) routes them all at once, with no loop over positions;
one that offers ``route_grid`` (dynamic and self-attention routing) routes the votes in the
convolution's own layout instead, without that copy, when only the parent
grid is asked for (``forward``).

Padding is TensorFlow's "same" (the reference code's): output side
ceil(H / stride), the odd pixel of padding at the bottom and right. The
transposed layer is SegCaps' deconvolutional capsule: kernel 4, stride 2, the
output side exactly stride x H.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .._eager import promoted
from ..routing import DynamicRouting, RoutingResult
from ..routing.result import check_count, check_floating, check_routing, check_switch

__all__ = ["ConvCaps2d", "ConvTransposeCaps2d", "UPSAMPLINGS", "upsampled_vote_blocks", "same_padding",
           "check_grid"]


def same_padding(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """TensorFlow's "same" padding of one axis: (before, after), the larger half after; output ceil(size / stride)."""
    out = -(-size // stride)
    total = max((out - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def same_conv2d(c: torch.Tensor, w: torch.Tensor, stride: int) -> torch.Tensor:
    """``F.conv2d`` with TensorFlow's "same" padding (``same_padding``): (N, Cin, H, W) -> (N, Cout, ceil(H / stride),
    ceil(W / stride)); ConvCaps2d's votes, and resize-then-convolve's at stride 1."""
    K = w.shape[-1]
    top, bottom = same_padding(c.shape[-2], K, stride)
    left, right = same_padding(c.shape[-1], K, stride)
    if top or bottom or left or right:
        c = F.pad(c, (left, right, top, bottom))  # (N, Cin, H+pad, W+pad)
    return F.conv2d(c, w, stride=stride)


def resize_conv2d(c: torch.Tensor, w: torch.Tensor, stride: int) -> torch.Tensor:
    """``same_conv2d(F.interpolate(c, scale_factor=stride, mode="nearest"), w, 1)`` without the enlarged grid: one
    transposed convolution of stride S over ``c`` itself, whose (K + S - 1)^2 kernel is ``w`` flipped and summed over
    every S x S shift (each enlarged pixel repeats one input pixel S x S times, so the taps that fall on the same
    input pixel add up). (N, Cin, H, W) -> (N, Cout, S H, S W), the same numbers to float rounding, in about
    (K + S - 1)^2 / (K S)^2 of the multiply-adds (25 / 64 for kernel 4, stride 2). In bfloat16 or float16 (weights
    or autocast) the summed kernel is rounded once more: about twice the enlarged grid's rounding error (relative
    RMS 0.4% against 0.17-0.30% in bf16 on random weights), both at the dtype's precision.

    Along an axis, output row S i + a reads input row i + floor((a + u - b) / S) through tap u, b = (K - 1) // 2
    the "same" padding before; in the transposed convolution that input row reaches it through tap a - S d + P of
    the summed kernel, and P = K - 1 - b, the padding after, is the one that puts the lowest such tap at 0. The
    output size (H - 1) S - 2 P + K + S - 1 + (K - 1) % 2 is then S H for every K and S (the output padding, 0 or
    1, below every stride it is used at, S >= 2)."""
    K, S = w.shape[-1], stride
    if S == 1:
        return same_conv2d(c, w, 1)
    flipped = F.pad(w.flip(-2, -1), (S - 1, S - 1, S - 1, S - 1))  # (Cout, Cin, K + 2S - 2, K + 2S - 2)
    n = K + S - 1
    kernel = sum(flipped[..., i:i + n, j:j + n] for i in range(S) for j in range(S))  # (Cout, Cin, n, n)
    return F.conv_transpose2d(c, kernel.transpose(0, 1), stride=S, padding=K - 1 - (K - 1) // 2,
                              output_padding=(K - 1) % 2)


def he_conv_kernel(out_channels: int, in_channels: int, kernel_size: int) -> nn.Parameter:
    """A convolution's kernel (out, in, K, K), He-normal over its fan in K K in as the reference code's,
    untruncated (its Keras of 2018 cut at 2 std, a spread 0.88 of this)."""
    K = kernel_size
    return nn.Parameter(torch.randn(out_channels, in_channels, K, K) * math.sqrt(2.0 / (K * K * in_channels)))


def check_grid(x: torch.Tensor, types: int, dim: int, what: str = "capsule grid") -> tuple[int, int, int]:
    """(B, H, W) of a capsule grid (B, types, dim, H, W); a ValueError that says what came otherwise."""
    if x.dim() != 5 or tuple(x.shape[1:3]) != (types, dim):
        raise ValueError(f"expected a {what} (B, {types}, {dim}, H, W) of {types} types of {dim}D capsules, "
                         f"got shape {tuple(x.shape)}")
    check_floating(x, f"a {what}", "x.float() routes it")  # bool and int grids were routed as floats
    return x.shape[0], x.shape[3], x.shape[4]


class _GridCaps(nn.Module):
    """What both layers share: the routing bias, the routing module and the local routing of a vote grid."""

    def __init__(self, in_types: int, in_dim: int, out_types: int, out_dim: int, kernel_size: int, stride: int,
                 routing: nn.Module | None, bias: bool) -> None:
        super().__init__()
        for name, v in (("in_types", in_types), ("in_dim", in_dim), ("out_types", out_types), ("out_dim", out_dim),
                        ("kernel_size", kernel_size), ("stride", stride)):
            check_count(name, v)
        check_switch("bias", bias)  # "no" built a bias
        if routing is not None:
            check_routing(routing)
        self.in_types, self.in_dim, self.out_types, self.out_dim = in_types, in_dim, out_types, out_dim
        self.kernel_size, self.stride = kernel_size, stride
        # SegCaps' routing bias: one per parent type and dimension, shared by the positions, initialised to 0.1
        self.bias = nn.Parameter(torch.full((out_types, out_dim), 0.1)) if bias else None
        self.routing = routing if routing is not None else DynamicRouting(3)

    def extra_repr(self) -> str:
        return (f"in_types={self.in_types}, in_dim={self.in_dim}, out_types={self.out_types}, "
                f"out_dim={self.out_dim}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"bias={self.bias is not None}")

    def _children(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every child type's grid as one image of the batch, (B, T, Din, H, W) -> (B * T, Din, H, W), and the vote
        kernel, both in their promoted dtype (float64 capsules into a float32 layer: float64, as DenseCaps does;
        torch's convolution refused the pair as "expected scalar type Double but found Float")."""
        check_grid(x, self.in_types, self.in_dim, "child capsule grid")
        return promoted(x.flatten(0, 1), self.weight)  # (B*T, Din, H, W), the kernel

    def _route(self, y: torch.Tensor, B: int, activations: torch.Tensor | None, record: bool
               ) -> tuple[torch.Tensor, RoutingResult]:
        """Route the votes ``y`` (B * T, J * Dout, H', W') at every position; the parent grid and the routing result.

        The routing result's tensors are per position, (B * H' * W', ...), position-major within each example.
        """
        T, J, D = self.in_types, self.out_types, self.out_dim
        _, _, H, W = y.shape
        votes = y.view(B, T, J, D, H, W).permute(0, 4, 5, 1, 2, 3).reshape(B * H * W, T, J, D)  # (B*H'*W', T, J, D)
        a = None
        if activations is not None:  # (B, T, H', W') presence of the children, for routings that use it
            self._check_activations(activations, B, H, W)
            a = activations.permute(0, 2, 3, 1).reshape(B * H * W, T)  # (B*H'*W', T)
        recording = {"record": True} if record else {}
        result = self.routing(votes, a, self.bias, **recording)
        grid = result.poses.view(B, H, W, J, D).permute(0, 3, 4, 1, 2)  # (B, J, D, H', W')
        if self.weight.dtype in (torch.bfloat16, torch.float16) and grid.dtype != self.weight.dtype:
            # a half model (.bfloat16()) routed by EM, which routes half votes in fp32: handed on in the weights'
            # dtype, as DenseCaps and ConvMatrixCaps do, so the next layer's convolution takes it
            grid = grid.to(self.weight.dtype)
        return grid, result

    def forward(self, x: torch.Tensor, activations: torch.Tensor | None = None) -> torch.Tensor:
        """Shapes:
            x: (B, T, Din, H, W) child capsules; activations: (B, T, H', W') or None (routings that use them)
            returns: (B, J, Dout, H', W') parent capsules
        """
        route_grid = getattr(self.routing, "route_grid", None)
        if route_grid is None:
            return self.route(x, activations)[0]
        y = self.votes(x)  # (B * T, J * Dout, H', W'); a routing with route_grid takes no activations
        B, (H, W) = x.shape[0], y.shape[-2:]
        if activations is not None:  # unused by these routings (dynamic, self-attention), but checked as route does
            self._check_activations(activations, B, H, W)
        return route_grid(y.view(B, self.in_types, self.out_types, self.out_dim, H, W), self.bias)

    def route(self, x: torch.Tensor, activations: torch.Tensor | None = None, *, record: bool = False
              ) -> tuple[torch.Tensor, RoutingResult]:
        """The parent grid and the routing result (coupling per position, every round's with ``record``).

        Shapes:
            x: (B, T, Din, H, W)
            returns: parents (B, J, Dout, H', W'); result.coupling (B * H' * W', T, J), positions in
                (example, row, column) order; with ``record``, result.rounds (B * H' * W', R, T, J)
        """
        B = x.shape[0]
        return self._route(self.votes(x), B, activations, record)

    def _check_activations(self, activations: torch.Tensor, B: int, H: int, W: int) -> None:
        """Children's activations of the votes' grid, (B, T, H', W'), or a ValueError naming the shape."""
        want = (B, self.in_types, H, W)
        if not isinstance(activations, torch.Tensor) or tuple(activations.shape) != want:
            got = tuple(activations.shape) if isinstance(activations, torch.Tensor) else type(activations).__name__
            raise ValueError(f"activations must be (B, T, H', W') = {want}, one per child type at each output "
                             f"position, got {got}")

    def votes(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - each layer defines its own
        raise NotImplementedError


class ConvCaps2d(_GridCaps):
    """Convolutional capsules with locally constrained dynamic routing (SegCaps' ``ConvCapsuleLayer``).

    Each child type's D_in-dimensional grid goes through one convolution with
    kernel K and the layer's stride to J * D_out channels, the same kernel for
    every child type (one K x K transform per parent type, shared by the child
    types); at each output position the T child types' votes (T, J, D_out)
    are routed to the J parent types, per position and per example, by any
    routing module of the shared call shape (default ``DynamicRouting(3)``).
    A kernel-1 layer on a 1 x 1 grid is ``DenseCaps`` with the weight shared
    over the child types.

    Args:
        in_types, in_dim: child capsule types T and their length D_in.
        out_types, out_dim: parent capsule types J and their length D_out.
        kernel_size, stride: of the vote convolution; padding is TensorFlow's "same".
        routing: a routing module (``capsnet.routing``); it gets the layer's bias.
        bias: a learned (J, D_out) bias added to s_j in every round, initialised to 0.1 (the reference code's).
    """

    def __init__(self, in_types: int, in_dim: int, out_types: int, out_dim: int, *, kernel_size: int = 5,
                 stride: int = 1, routing: nn.Module | None = None, bias: bool = True) -> None:
        super().__init__(in_types, in_dim, out_types, out_dim, kernel_size, stride, routing, bias)
        # no convolution bias: the routing bias is the bias
        self.weight = he_conv_kernel(out_types * out_dim, in_dim, kernel_size)

    def votes(self, x: torch.Tensor) -> torch.Tensor:
        """Every child type's votes for every parent type at every output position.

        Shapes:
            x: (B, T, Din, H, W)
            returns: (B * T, J * Dout, H', W'), H' = ceil(H / stride)
        """
        c, w = self._children(x)  # (B*T, Din, H, W)
        return same_conv2d(c, w, self.stride)  # (B*T, J*Dout, H', W')


UPSAMPLINGS = ("deconv", "resize", "subpix")  # ConvTransposeCaps2d's upsampling (SegCaps' code's upsamp_type)


def upsampled_vote_blocks(upsampling: str, stride: int) -> int:
    """How many times a layer's J Dout vote channels its kernel makes under ``upsampling``: ``stride^2`` for
    "subpix" (one group per position of the stride x stride block), 1 otherwise."""
    return stride * stride if upsampling == "subpix" else 1


class ConvTransposeCaps2d(_GridCaps):
    """Deconvolutional capsules (SegCaps' ``DeconvCapsuleLayer``): votes on a grid ``stride`` times the input's,
    kernel 4 and stride 2 by default; then local routing as ``ConvCaps2d``.

    ``upsampling`` (``UPSAMPLINGS``, the reference code's ``upsamp_type``) says how the votes are made:
    ``"deconv"`` (the default, the paper's layers) a transposed convolution; ``"resize"`` each child grid
    enlarged ``stride`` times by nearest neighbour, then a ``kernel_size`` convolution of stride 1 with
    TensorFlow's "same" padding (made without the enlarged grid: ``resize_conv2d``, the same numbers to float
    rounding in 25/64 of the multiply-adds for kernel 4, stride 2), the reference code's other choice and the usual
    cure for the checkerboard pattern a transposed convolution of a kernel the stride does not divide evenly leaves
    (Odena et al. 2016, "Deconvolution and Checkerboard Artifacts"). Both hold ``kernel_size^2 Din J Dout``
    weights. ``"subpix"`` the code's third: a ``kernel_size`` convolution of stride 1 ("same") to ``stride^2``
    times the channels, each position's ``stride^2`` groups then laid out as a ``stride x stride`` block
    (sub-pixel convolution, Shi et al. 2016; ``F.pixel_shuffle``'s channel order, where TensorFlow's
    ``depth_to_space`` takes the block position as the slower index: the same layer up to a permutation of its
    kernel's rows); ``stride^2`` times the weights.

    Args: as ``ConvCaps2d``; for ``"deconv"``, ``kernel_size - stride`` must be even and non-negative
    (TensorFlow's "same" output size, stride x H, with equal padding on both sides); ``"resize"`` and
    ``"subpix"`` take any kernel.
    """

    def __init__(self, in_types: int, in_dim: int, out_types: int, out_dim: int, *, kernel_size: int = 4,
                 stride: int = 2, routing: nn.Module | None = None, bias: bool = True,
                 upsampling: str = "deconv") -> None:
        super().__init__(in_types, in_dim, out_types, out_dim, kernel_size, stride, routing, bias)
        if upsampling not in UPSAMPLINGS:
            raise ValueError(f"upsampling must be one of {', '.join(map(repr, UPSAMPLINGS))}, got {upsampling!r}")
        self.upsampling = upsampling
        if upsampling != "deconv":  # a plain convolution's kernel (over the enlarged grid, or to S^2 times the votes)
            blocks = upsampled_vote_blocks(upsampling, stride)
            self.weight = he_conv_kernel(out_types * out_dim * blocks, in_dim, kernel_size)
            return
        K = kernel_size
        if (kernel_size - stride) % 2 or kernel_size < stride:
            raise ValueError(f"kernel_size - stride must be even and >= 0 for an output of stride x the input, got "
                             f"kernel_size {kernel_size} and stride {stride} (upsampling='resize' or 'subpix' takes "
                             f"any kernel)")
        # fan in of a transposed convolution with stride S: (K / S)^2 * Din inputs reach each output
        fan_in = max((K // stride) ** 2, 1) * in_dim
        self.weight = nn.Parameter(torch.randn(in_dim, out_types * out_dim, K, K) * math.sqrt(2.0 / fan_in))

    def extra_repr(self) -> str:
        return super().extra_repr() + (f", upsampling={self.upsampling!r}" if self.upsampling != "deconv" else "")

    def votes(self, x: torch.Tensor) -> torch.Tensor:
        """Shapes:
            x: (B, T, Din, H, W)
            returns: (B * T, J * Dout, stride * H, stride * W)
        """
        c, w = self._children(x)  # (B*T, Din, H, W)
        S = self.stride
        if self.upsampling == "resize":  # the enlarged grid's convolution, made over the grid itself
            return resize_conv2d(c, w, S)  # (B*T, J*Dout, S*H, S*W)
        if self.upsampling == "subpix":  # channel (J*Dout) * S^2 + i * S + j goes to row i, column j of the block
            return F.pixel_shuffle(same_conv2d(c, w, 1), S)  # (B*T, J*Dout*S^2, H, W) -> (B*T, J*Dout, S*H, S*W)
        pad = (self.kernel_size - S) // 2
        return F.conv_transpose2d(c, w, stride=S, padding=pad)  # (B*T, J*Dout, S*H, S*W)
