"""Matrix capsules: 4x4 poses with a logistic activation (Hinton, Sabour and Frosst, ICLR 2018, section 3).

A capsule grid is ``MatrixCaps(poses (N, H, W, T, 16), activations (N, H, W, T))``:
T capsule types at every position, each pose a 4x4 matrix flattened row by
row. A child's vote for a parent is its pose times a learned 4x4
transformation matrix, ``V_ij = M_i W_ij`` (section 3).

- ``PrimaryMatrixCaps``: poses and activations from 1x1 convolutions of the
  features below (section 4: "a learned linear transformation ... of the
  lower-layer ReLUs centred at that location").
- ``ConvMatrixCaps``: every parent at (h, w) sees the children in its K x K
  window (all child types); the windows are folded into the batch. By
  default each (child, window) copy is routed on its own: R_ij sums to one
  over the parent types within a window (what the most-used PyTorch port
  does). With ``share_children`` the routing is told which copies are one
  child, and EM routing normalises a child's R across every window that
  holds it (``EMRouting``'s ``child_norm``: over all those parents, as
  Procedure 1 and IBM's port, or per parent type, as the official code).
- ``ClassMatrixCaps``: one transformation per (child type, class) shared over
  positions, with coordinate addition (section 4).
- ``DenseMatrixCaps``: one transformation per (child, parent), every child
  position its own (the class layer of inverted dot-product attention).

Routing is any module of the shared call shape (``capsnet.routing``); EM
routing is the paper's.
"""
from __future__ import annotations

import inspect
import math

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .._eager import permute_contiguous, promoted
from .._numbers import is_finite
from ..routing import RoutingResult, RoutingView
from ..routing.result import check_count, check_floating, check_positive, check_routing, check_switch

__all__ = ["MatrixCaps", "PrimaryMatrixCaps", "ConvMatrixCaps", "ClassMatrixCaps", "DenseMatrixCaps",
           "grid_routing_view"]

POSE = 16  # 4x4


class MatrixCaps(NamedTuple):
    poses: torch.Tensor  # (N, H, W, T, 16)
    activations: torch.Tensor  # (N, H, W, T) in (0, 1)


def _as_caps(caps: Any, where: str) -> MatrixCaps:
    """``caps`` as a MatrixCaps: a plain (poses, activations) pair taken as one; a TypeError naming it otherwise (a bare
    tensor met "'Tensor' object has no attribute 'poses'"). Both floating point."""
    if not (isinstance(caps, tuple) and len(caps) == 2 and all(isinstance(t, torch.Tensor) for t in caps)):
        raise TypeError(f"{where} takes a MatrixCaps(poses, activations) capsule grid, got {type(caps).__name__}")
    caps = MatrixCaps(*caps)
    check_floating(caps.poses, "poses", "poses.float() takes them")
    check_floating(caps.activations, "activations", "activations.float() takes them")
    return caps


def _check(caps: Any, types: int, where: str) -> MatrixCaps:
    """``caps`` as a MatrixCaps grid of ``types`` capsule types (a ValueError naming the shapes otherwise)."""
    caps = _as_caps(caps, where)
    p, a = caps.poses, caps.activations
    if p.dim() != 5 or p.shape[3:] != (types, POSE) or tuple(a.shape) != tuple(p.shape[:4]):
        raise ValueError(f"{where} expects poses (N, H, W, {types}, 16) and activations (N, H, W, {types}), "
                         f"got {tuple(p.shape)} and {tuple(a.shape)}")
    return caps


def _promoted(caps: MatrixCaps, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The poses, activations and transformation matrices in the dtype they promote to (float64 capsules into a
    float32 layer: float64; float32 ones into a bfloat16 layer: float32), as the other capsule layers promote
    (torch's products refused the pair: "expected scalar type Float but found Double"); as they are under autocast,
    which casts the products' inputs itself, except float64 ones (_eager.promoted)."""
    return promoted(caps.poses, caps.activations, weight)


def _transform(shape: tuple[int, ...], std: float) -> nn.Parameter:
    """4x4 transformation matrices, truncated normal (the official code's initialiser)."""
    check_positive("std", std)
    return nn.Parameter(nn.init.trunc_normal_(torch.empty(*shape, 4, 4), std=std, a=-2 * std, b=2 * std))


class PrimaryMatrixCaps(nn.Module):
    """Primary matrix capsules: ``types`` 4x4 poses and logistic activations per position, from 1x1 convolutions."""

    def __init__(self, in_channels: int, types: int) -> None:
        super().__init__()
        check_count("in_channels", in_channels)
        check_count("types", types)
        self.types = types
        self.pose = nn.Conv2d(in_channels, types * POSE, kernel_size=1)
        self.activation = nn.Conv2d(in_channels, types, kernel_size=1)

    def forward(self, x: torch.Tensor) -> MatrixCaps:
        """Shapes: x (N, C, H, W) -> poses (N, H, W, types, 16), activations (N, H, W, types)."""
        C = self.pose.in_channels
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"PrimaryMatrixCaps takes (N, {C}, H, W) feature maps as a tensor, got {type(x).__name__}")
        if x.dim() != 4 or x.shape[1] != C:  # torch's "not enough values to unpack" or its convolution's complaint
            raise ValueError(f"PrimaryMatrixCaps takes (N, {C}, H, W) feature maps, got {tuple(x.shape)}")
        check_floating(x, "feature maps", "x.float() takes them")
        N, _, H, W = x.shape
        # as PrimaryCaps: float64 maps into a float32 layer give float64 capsules, bfloat16 ones float32
        x, *wb = promoted(x, self.pose.weight, self.pose.bias, self.activation.weight, self.activation.bias)
        if wb[0] is self.pose.weight and wb[2] is self.activation.weight:
            p, a = self.pose(x), self.activation(x)
        else:
            p, a = F.conv2d(x, wb[0], wb[1]), F.conv2d(x, wb[2], wb[3])
        poses = p.view(N, self.types, POSE, H, W).permute(0, 3, 4, 1, 2)  # (N, H, W, T, 16)
        activations = torch.sigmoid(a).permute(0, 2, 3, 1)  # (N, H, W, T)
        return MatrixCaps(poses, activations)


class ConvMatrixCaps(nn.Module):
    """Convolutional matrix capsules: each parent routes the K x K x in_types children of its window.

    Args:
        in_types, out_types: child and parent capsule types.
        kernel_size, stride: the window (the paper: 3x3, stride 2 then 1), no padding.
        routing: shared call shape, for ``out_types`` upper capsules (``EMRouting(out_types)``).
        std: initial spread of the 4x4 transformation matrices.
        share_children: pass the routing each vote row's child ids (``children``, ``num_children``: a routing
            that takes them, as ``EMRouting``), so a child held by several windows is normalised across them.
    """

    def __init__(self, in_types: int, out_types: int, *, kernel_size: int = 3, stride: int = 1,
                 routing: nn.Module, std: float = 0.5, share_children: bool = False) -> None:
        super().__init__()
        # a kernel of 0 gave a grid of zero poses, a stride of 0 a ZeroDivisionError (a review, 2026-12-01)
        for name, value in (("in_types", in_types), ("out_types", out_types), ("kernel_size", kernel_size),
                            ("stride", stride)):
            check_count(name, value)
        check_switch("share_children", share_children)
        check_routing(routing)  # None met "'NoneType' object has no attribute 'forward'"
        takes = inspect.signature(routing.forward).parameters.values()
        if share_children and not any(q.name == "children" or q.kind is q.VAR_KEYWORD for q in takes):
            raise ValueError(f"share_children=True hands the routing each vote's child ids, which "
                             f"{type(routing).__name__} does not take (EMRouting does): leave it False")
        self.in_types, self.out_types, self.kernel_size, self.stride = in_types, out_types, kernel_size, stride
        self.share_children = share_children
        self.weight = _transform((kernel_size, kernel_size, in_types, out_types), std)  # (K, K, I, J, 4, 4)
        self.routing = routing

    def extra_repr(self) -> str:
        return (f"in_types={self.in_types}, out_types={self.out_types}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}" + (", share_children=True" if self.share_children else ""))

    def output_size(self, size: int) -> int:
        return (size - self.kernel_size) // self.stride + 1

    def forward(self, caps: MatrixCaps, **route: Any) -> MatrixCaps:
        """Shapes: poses (N, H, W, I, 16), activations (N, H, W, I) -> (N, H', W', J, 16), (N, H', W', J).
        ``route``: keywords for the routing (inverted attention's ``passes`` and ``start``, the latter as its
        parents batch, (N*H'*W', J, 16))."""
        caps = _check(caps, self.in_types, type(self).__name__)
        K, s, I, J = self.kernel_size, self.stride, self.in_types, self.out_types
        N, H, W = caps.poses.shape[:3]
        Ho, Wo = self.output_size(H), self.output_size(W)
        if Ho < 1 or Wo < 1:
            raise ValueError(f"a {H}x{W} capsule grid is smaller than the {K}x{K} kernel")
        C, M = K * K * I, N * Ho * Wo  # children of a window, windows
        poses, activations, weight = _promoted(caps, self.weight)
        p = poses.unfold(1, K, s).unfold(2, K, s)  # (N, H', W', I, 16, K, K)
        p = p.permute(5, 6, 3, 0, 1, 2, 4).reshape(C, M * 4, 4)  # each window child's pose rows, (K*K*I, N*H'*W'*4, 4)
        a = activations.unfold(1, K, s).unfold(2, K, s)  # (N, H', W', I, K, K)
        a = a.permute(0, 1, 2, 4, 5, 3).reshape(M, C)  # (N*H'*W', K*K*I)
        w = weight.permute(0, 1, 2, 4, 3, 5).reshape(C, 4, J * 4)  # (K*K*I, 4, J*4)
        votes = torch.bmm(p, w).view(C, M, 4, J, 4)  # V = M W, one product per window child: (K*K*I, N*H'*W', 4, J, 4)
        # windows folded into the batch, made upper-capsule-major, then viewed as the call shape's (B, I, J, D)
        votes = permute_contiguous(votes, (1, 3, 0, 2, 4)).view(M, J, C, POSE).transpose(1, 2)  # (N*H'*W', K*K*I, J, 16)
        if self.share_children and N > 0:  # no images, no children to share (and num_children 0 is no count)
            ids = self.child_ids(N, H, W, caps.poses.device)
            out = self.routing(votes, a, children=ids, num_children=N * H * W * I, **route)
        else:
            out = self.routing(votes, a, **route)
        poses, activations = out.poses.reshape(N, Ho, Wo, J, POSE), out.activations.reshape(N, Ho, Wo, J)
        if weight.dtype in (torch.bfloat16, torch.float16):  # a half model (.bfloat16()): routed in fp32 (as
            # EMRouting routes half votes), handed on in the weights' dtype for the next layer's product; under
            # autocast the weights stay fp32 and so do these
            poses, activations = poses.to(weight.dtype), activations.to(weight.dtype)
        return MatrixCaps(poses, activations)

    def child_ids(self, N: int, H: int, W: int, device: torch.device | None = None) -> torch.Tensor:
        """(N*H'*W', K*K*I): the id of the child behind each vote row, ((n H + row) W + column) I + type,
        in the order ``forward`` folds the windows (window-major, then kernel row, column, child type)."""
        K, s, I = self.kernel_size, self.stride, self.in_types
        ids = torch.arange(N * H * W * I, device=device).view(N, H, W, I)
        ids = ids.unfold(1, K, s).unfold(2, K, s)  # (N, H', W', I, K, K)
        return ids.permute(0, 1, 2, 4, 5, 3).reshape(-1, K * K * I)


def _check_receptive_field(field: object) -> None:
    """A ValueError unless ``field`` is (stride, offset, image height, image width): positive finite stride and sides,
    a finite offset (zero sides made NaN class capsules, a pair met "not enough values to unpack" at the forward)."""
    ok = isinstance(field, (tuple, list)) and len(field) == 4
    if ok:
        stride, offset, height, width = field
        try:
            for name, value in (("stride", stride), ("image height", height), ("image width", width)):
                check_positive(name, value)
            ok = is_finite(offset)
        except ValueError:
            ok = False
    if not ok:
        raise ValueError(f"receptive_field must be (stride, offset, image height, image width): a positive stride and "
                         f"sides and a finite offset, e.g. (4, 8.5, 28, 28) (em-capsnet on MNIST), got {field!r}")


class ClassMatrixCaps(nn.Module):
    """Class capsules: every child votes for every class with a transformation shared over positions.

    Coordinate addition (section 4): a scaled (row, column) of each child is
    added to the first two entries of the right-hand column of its vote
    matrix, flat entries 3 and 7. By default the centre of the child's cell
    in its own grid, ((r + 0.5) / H, (c + 0.5) / W), as Gritzman's port (and
    most ports) scale it; with ``receptive_field`` = (stride, offset, image
    height, image width), the centre of its receptive field in the image,
    ((stride r + offset) / image height, ...), the paper's words ("the scaled
    coordinate (row, column) of the center of the receptive field of each
    capsule"; the network's composed stride and the first centre's pixel
    coordinate, which the model computes from its layers).
    """

    def __init__(self, in_types: int, classes: int, *, routing: nn.Module, coordinate_addition: bool = True,
                 std: float = 0.5, receptive_field: tuple[int, float, int, int] | None = None) -> None:
        super().__init__()
        check_count("in_types", in_types)
        check_count("classes", classes)
        check_switch("coordinate_addition", coordinate_addition)
        check_routing(routing)
        if receptive_field is not None:
            _check_receptive_field(receptive_field)
        self.in_types, self.classes, self.coordinate_addition = in_types, classes, coordinate_addition
        self.receptive_field = receptive_field
        self.weight = _transform((in_types, classes), std)  # (I, J, 4, 4)
        self.routing = routing

    def extra_repr(self) -> str:
        return (f"in_types={self.in_types}, classes={self.classes}, coordinate_addition={self.coordinate_addition}"
                + (f", receptive_field={self.receptive_field}" if self.receptive_field is not None else ""))

    def forward(self, caps: MatrixCaps, *, record: bool = False):
        """Shapes: poses (N, H, W, I, 16), activations (N, H, W, I) -> a ``RoutingResult`` over the
        H*W*I children (ordered row, column, type): poses (N, classes, 16), activations (N, classes),
        coupling (N, H*W*I, classes)."""
        caps = _check(caps, self.in_types, type(self).__name__)
        N, H, W, I, _ = caps.poses.shape
        J = self.classes
        poses, activations, weight = _promoted(caps, self.weight)
        p = poses.reshape(N, H, W, I, 4, 4)
        votes = torch.einsum("nhwixy,ijyz->njhwixz", p, weight).reshape(N, J, H, W, I, POSE)  # upper-major
        if self.coordinate_addition:
            # the receptive field's centre in the image, or by default the cell's centre in its own grid
            stride, offset, image_h, image_w = self.receptive_field or (1, 0.5, H, W)
            rows = (torch.arange(H, device=p.device, dtype=p.dtype) * stride + offset) / image_h  # (H,)
            cols = (torch.arange(W, device=p.device, dtype=p.dtype) * stride + offset) / image_w  # (W,)
            coords = votes.new_zeros(H, W, POSE)
            coords[:, :, 3] = rows.view(H, 1)
            coords[:, :, 7] = cols.view(1, W)
            votes = votes + coords.view(1, 1, H, W, 1, POSE)
        votes = votes.reshape(N, J, H * W * I, POSE).transpose(1, 2)  # (N, H*W*I, J, 16), a view
        a = activations.reshape(N, H * W * I)
        return self.routing(votes, a, record=True) if record else self.routing(votes, a)


class DenseMatrixCaps(nn.Module):
    """Fully connected matrix capsules: each child at each position votes for each parent with its own 4x4 matrix.

    Args:
        in_caps: children (positions x types of the grid below, flattened row, column, type).
        out_caps: parents.
        routing: shared call shape for ``out_caps`` upper capsules.
        std: initial spread of the 4x4 transformation matrices.
    """

    def __init__(self, in_caps: int, out_caps: int, *, routing: nn.Module, std: float = 0.5) -> None:
        super().__init__()
        check_count("in_caps", in_caps)
        check_count("out_caps", out_caps)
        check_routing(routing)
        self.in_caps, self.out_caps = in_caps, out_caps
        self.weight = _transform((in_caps, out_caps), std)  # (I, J, 4, 4)
        self.routing = routing

    def extra_repr(self) -> str:
        return f"in_caps={self.in_caps}, out_caps={self.out_caps}"

    def forward(self, caps: MatrixCaps, *, record: bool = False, **route: Any):
        """Shapes: poses (N, H, W, T, 16) with H*W*T = in_caps -> a ``RoutingResult`` over the parents;
        ``route``: keywords for the routing (as ``ConvMatrixCaps``'s)."""
        caps = _as_caps(caps, type(self).__name__)
        N, shape = caps.poses.shape[0], caps.poses.shape
        if (caps.poses.dim() < 3 or shape[-1] != POSE or math.prod(shape[1:-1]) != self.in_caps  # sizes, not -1: an
                or caps.activations.shape != shape[:-1]):  # empty batch reshapes too; activations as the poses lay out
            raise ValueError(f"{type(self).__name__} takes {self.in_caps} child capsules of {POSE} pose entries, "
                             f"poses (N, ..., {POSE}) and activations (N, ...) of the same grid, got poses "
                             f"{tuple(shape)} and activations {tuple(caps.activations.shape)}")
        poses, activations, weight = _promoted(caps, self.weight)
        p = poses.reshape(N, self.in_caps, 4, 4)
        votes = torch.einsum("nixy,ijyz->njixz", p, weight).reshape(N, self.out_caps, self.in_caps, POSE)
        a = activations.reshape(N, self.in_caps)
        votes = votes.transpose(1, 2)  # (N, I, J, 16), a view of the upper-capsule-major votes
        return self.routing(votes, a, record=True, **route) if record else self.routing(votes, a, **route)


def grid_routing_view(caps: MatrixCaps, result: RoutingResult) -> RoutingView:
    """A class layer's recorded routing over the capsule grid ``caps``, its children reordered from
    (row, column, type), as the layers flatten them, to (type, row, column), as ``RoutingView`` lays them out."""
    N, H, W, T = caps.activations.shape
    R, K = result.rounds.shape[1], result.rounds.shape[-1]
    rounds = result.rounds.reshape(N, R, H, W, T, K).permute(0, 1, 4, 2, 3, 5).reshape(N, R, T * H * W, K)
    children = caps.activations.permute(0, 3, 1, 2).reshape(N, T * H * W)
    return RoutingView(rounds, children, result.activations, (T, H, W), "activations")
