"""A capsule network with inverted dot-product attention routing (Tsai et al., ICLR 2020), for MNIST-sized input.

The paper reports CIFAR-10/100 with a ResNet backbone (and overlapping digits, DiverseMultiMNIST, with its own);
its code's simple backbone with the same capsule layers gives this model (not a configuration
of the paper or its code; 443,793 weights for 28x28 input counted from the
official classes, 443,792 here: their head's bias is added to every class
logit alike, so the softmax ignores it and it never learns: left out): Conv 3x3 stride 2 (128, ReLU) -> primary capsules (1x1,
32 types of 4x4 poses, layer norm) -> conv capsules 3x3 stride 2 and 3x3
stride 1 (32 types each) -> class capsules (a 4x4 matrix per child position
and class) -> one linear map of each class pose to its logit, trained with
cross-entropy. Votes are pose times matrix; every routing layer has its own
layer norm and 2 passes.

``routing_mode``: "sequential" routes each layer's passes on its own before
the next layer (the code's ``--sequential_routing``; every run recorded
here); "concurrent", the paper's contribution and the code's default,
routes every layer one pass per iteration: the first iteration a uniform
pass bottom up, each later one every layer again from the capsules of the
iteration before (its input, and its own parents' poses to agree with).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .._config import JsonConfig, MAX_WEIGHTS, check_choice, check_range, check_types
from ..layers import ConvMatrixCaps, DenseMatrixCaps, MatrixCaps, grid_routing_view
from ..losses import multi_hot
from ..ops import _scale
from ..routing import InvertedDotProductRouting, RoutingResult, RoutingView
from .inputs import check_class_labels, check_config, check_model_images

__all__ = ["InvertedCapsNetConfig", "InvertedCapsNet", "InvertedCapsNetOutput", "inverted_capsnet_loss",
           "ROUTING_MODES"]

ROUTING_MODES = ("sequential", "concurrent")  # InvertedCapsNetConfig.routing_mode


@dataclass(frozen=True)
class InvertedCapsNetConfig(JsonConfig):
    """The sizes of the network: the official code's simple backbone and capsule layers for MNIST-sized input."""

    input_height: int = 28
    input_width: int = 28
    in_channels: int = 1
    num_classes: int = 10
    backbone_channels: int = 128  # the 3x3 stride-2 convolution before the primary capsules
    primary_types: int = 32  # primary capsule types (4x4 poses, from a 1x1 convolution)
    caps_types: int = 32  # the types of each of the two convolutional capsule layers
    routing_iterations: int = 2  # the paper's CIFAR runs ("num_routing 2"); the code warns that more than 3 converge slowly
    # "sequential": each layer routes its passes before the next (the code's --sequential_routing; every run recorded
    # here); "concurrent": every layer one pass an iteration, from the capsules of the iteration before (the paper's
    # and the code's default; module docstring)
    routing_mode: str = "sequential"

    def __post_init__(self) -> None:
        check_types(self)
        for name in ("input_height", "input_width"):
            check_range(self, name, 1, 4096)
        for name in ("in_channels", "num_classes", "backbone_channels", "primary_types", "caps_types"):
            check_range(self, name, 1, 1 << 16)
        check_range(self, "num_classes", 2, 1 << 16)  # one class: a loss of 0 and no gradient, whatever the image
        check_range(self, "routing_iterations", 1, 100)
        check_choice(self, "routing_mode", ROUTING_MODES)
        if min(self.grids[-1]) < 1:
            raise ValueError(f"input {self.input_height}x{self.input_width} is too small for the backbone and two "
                             f"3x3 capsule layers: it needs at least 13x13")
        if self.num_weights > MAX_WEIGHTS:
            raise ValueError(f"this InvertedCapsNetConfig would hold {self.num_weights:,} weights, more than "
                             f"{MAX_WEIGHTS:,}")

    @property
    def grids(self) -> list[tuple[int, int]]:
        """(height, width) of the backbone/primary grid and the two convolutional capsule layers."""
        def sizes(n: int) -> list[int]:
            g1 = (n + 2 - 3) // 2 + 1  # conv 3x3, stride 2, padding 1
            g2 = (g1 - 3) // 2 + 1
            return [g1, g2, g2 - 2]
        return list(zip(sizes(self.input_height), sizes(self.input_width)))

    @property
    def num_weights(self) -> int:
        C, P, T, K = self.backbone_channels, self.primary_types, self.caps_types, self.num_classes
        h, w = self.grids[-1]
        return ((self.in_channels * 9 + 1) * C + C * P * 16 + 32 + 9 * P * T * 16 + 32 + 9 * T * T * 16 + 32
                + h * w * T * K * 16 + 32 + 16)


class InvertedCapsNetOutput(NamedTuple):
    poses: torch.Tensor  # (B, K, 16) class capsules
    logits: torch.Tensor  # (B, K)
    coupling: torch.Tensor  # (B, I, K) the class layer's last r, I = rows * columns * types

    @property
    def scores(self) -> torch.Tensor:
        """(B, K) class scores: the softmax probabilities."""
        return self.logits.softmax(dim=-1)


class InvertedCapsNet(nn.Module):
    """A capsule network with inverted dot-product attention routing (Tsai, Srivastava, Goh and Salakhutdinov,
    "Capsules with Inverted Dot-Product Attention Routing", ICLR 2020): the module docstring gives its layers;
    returns an ``InvertedCapsNetOutput`` (poses, logits, coupling)."""

    # evaluation runs this many examples at a time (capsnet.evaluate.eval_batch): the first convolutional capsule
    # layer's votes alone take 29 MB an example at 28x28; a forward of 256 MNIST digits peaked at 11.3 GB resident,
    # of 32 at 1.6 GB (2026-11-25, VmHWM)
    eval_batch_limit = 32

    def __init__(self, config: InvertedCapsNetConfig = InvertedCapsNetConfig()) -> None:
        super().__init__()
        check_config(config, InvertedCapsNetConfig, type(self).__name__)
        self.config = cfg = config
        C, P, T, K, R = cfg.backbone_channels, cfg.primary_types, cfg.caps_types, cfg.num_classes, cfg.routing_iterations
        self.backbone = nn.Conv2d(cfg.in_channels, C, 3, stride=2, padding=1)
        self.primary = nn.Conv2d(C, P * 16, 1, bias=False)
        self.primary_norm = nn.LayerNorm(16)
        # the official initialisation's scale, sqrt(parents / (4 * children * kernel area)), as the matrix capsule
        # layers draw it: a normal truncated at 2 of that scale (the official code: an untruncated N(0, 1) times it,
        # so these start with 0.88 times its spread; README, "Inverted dot-product attention")
        self.caps1 = ConvMatrixCaps(P, T, kernel_size=3, stride=2, routing=InvertedDotProductRouting(16, R),
                                    std=math.sqrt(T / (4 * P * 9)))
        self.caps2 = ConvMatrixCaps(T, T, kernel_size=3, stride=1, routing=InvertedDotProductRouting(16, R),
                                    std=math.sqrt(T / (4 * T * 9)))
        h, w = cfg.grids[-1]
        self.classes = DenseMatrixCaps(h * w * T, K, routing=InvertedDotProductRouting(16, R),
                                       std=math.sqrt(K / (4 * h * w * T)))
        self.head = nn.Linear(16, 1, bias=False)  # one map of every class pose to its logit (a shared bias: no effect)

    def forward(self, images: torch.Tensor, labels: torch.Tensor | None = None) -> InvertedCapsNetOutput:
        """Shapes: images (B, C, H, W) -> poses (B, K, 16), logits (B, K), coupling (B, I, K). ``labels`` unused."""
        check_model_images(self, images)
        _, out = self._routed(images)
        return InvertedCapsNetOutput(out.poses, self.head(out.poses).squeeze(-1), out.coupling)

    def _primary_capsules(self, images: torch.Tensor) -> MatrixCaps:
        x = F.relu(self.backbone(images))  # (B, C, H1, W1)
        N, _, H, W = x.shape
        poses = self.primary(x).view(N, self.config.primary_types, 16, H, W).permute(0, 3, 4, 1, 2)  # (B, H, W, P, 16)
        # the layer norm squares the poses, which overflows from about 1e19 (float32; images of 1e20 gave NaN): such
        # a capsule is scaled by a power of two first (ops._scale; 1 for every ordinary one), which the norm takes out
        k, _ = _scale(poses, -1, power=1)
        return MatrixCaps(self.primary_norm(poses * k), poses.new_ones(N, H, W, self.config.primary_types))

    def _routed(self, images: torch.Tensor, *, record: bool = False) -> tuple[MatrixCaps, RoutingResult]:
        """The class layer's input capsules and its routing's result (with ``record``, every pass's coupling), by
        the config's ``routing_mode``."""
        x = self._primary_capsules(images)
        if self.config.routing_mode == "sequential":
            caps = self.caps2(self.caps1(x))
            return caps, self.classes(caps, record=record)

        def grid(caps: MatrixCaps) -> torch.Tensor:  # a conv layer's parents as its routing batches them
            N, H, W, J, D = caps.poses.shape
            return caps.poses.reshape(N * H * W, J, D)

        def route(layer: nn.Module, below: MatrixCaps, start: torch.Tensor | None):  # one pass, from start if given
            if layer is self.classes:
                return layer(below, record=record, passes=1, start=start)
            return layer(below, passes=1, start=start)

        # the first iteration: a uniform pass in every layer, bottom up
        c1 = route(self.caps1, x, None)
        c2 = route(self.caps2, c1, None)
        out, below = route(self.classes, c2, None), c2
        rounds = [out.rounds]
        for _ in range(self.config.routing_iterations - 1):  # each layer from the iteration before's capsules
            c1, c2, out, below = (route(self.caps1, x, grid(c1)), route(self.caps2, c1, grid(c2)),
                                  route(self.classes, c2, out.poses), c2)
            rounds.append(out.rounds)
        if record:
            out = RoutingResult(out.poses, out.activations, out.coupling, torch.cat(rounds, dim=1))
        return below, out

    def routing_view(self, images: torch.Tensor) -> RoutingView:
        """The class layer's passes over the last convolutional capsules (children: each one's largest coupling in
        the last pass, how decidedly it routes: their pose lengths are layer-normalised, near 4 everywhere, a map
        that shows nothing)."""
        check_model_images(self, images)
        caps, result = self._routed(images, record=True)
        view = grid_routing_view(caps, result)
        decided = view.rounds[:, -1].amax(dim=-1)  # (N, T*H*W), in the view's (type, row, column) order
        scores = self.head(result.poses).squeeze(-1).softmax(dim=-1)
        return view._replace(children=decided, children_are="largest couplings", scores=scores)


def inverted_capsnet_loss(model: nn.Module, images: torch.Tensor, labels: torch.Tensor,
                          components: torch.Tensor | None = None, *, recon_weight: float = 0.0, progress: float = 1.0
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy of the class logits (pairs: probability 1/2 on each), and the softmax probabilities as scores."""
    check_class_labels(labels, images.shape[0], model.config.num_classes)
    logits = model(images).logits
    target = multi_hot(labels, logits.shape[1], logits.dtype) / labels.shape[1] if labels.dim() == 2 else labels
    return F.cross_entropy(logits, target), logits.softmax(dim=1)
