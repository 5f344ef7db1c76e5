"""Efficient-CapsNet: Mazzia, Salvetti and Chiaberge, "Efficient-CapsNet: capsule network with self-attention
routing" (Scientific Reports 2021), the MNIST model of the official code (EscVM/Efficient-CapsNet).

Four convolutions (32 5x5, 64 3x3, 64 3x3, 128 3x3 stride 2; each ReLU then
batch norm) -> primary capsules from a depthwise convolution over the whole
9x9 map (128 channels = 16 capsules of 8D, the paper's squash) -> 10 class
capsules of 16D by self-attention routing -> the length of each is the class
score. 161,824 weights without the decoder, exactly as the paper; the
reconstruction decoder (512-1024-784, 1,411,344 weights) is CapsNet's and
its loss weight, 0.0005 x the summed squared error (both train with
``capsnet_loss``), equals the paper's 0.392 x the per-pixel mean squared
error at 28 x 28 grey only (784 pixels; at 36 x 36, 0.648; the official code
keeps 0.392 at every size).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from .._config import JsonConfig, MAX_WEIGHTS, check_choice, check_range, check_types
from ..layers import DenseCaps
from ..ops import exp_squash
from ..routing import RoutingView, SelfAttentionRouting
from .capsnet import CapsNetOutput, Decoder, decode_masked
from .inputs import check_config, check_decode_labels, check_model_images, refuse_batch_of_one

__all__ = ["INITS", "EfficientCapsNetConfig", "EfficientCapsNet"]

_CONVS = ((32, 5, 1), (64, 3, 1), (64, 3, 1), (128, 3, 2))  # (channels, kernel, stride), official MNIST model
INITS = ("torch", "official")  # EfficientCapsNetConfig.init


@dataclass(frozen=True)
class EfficientCapsNetConfig(JsonConfig):
    """The sizes of the network; the defaults are the paper's MNIST model."""

    input_height: int = 28
    input_width: int = 28
    in_channels: int = 1
    num_classes: int = 10
    primary_caps: int = 16  # 128 channels of the last convolution = 16 capsules ...
    primary_dim: int = 8  # ... of 8 dimensions
    class_dim: int = 16  # each class capsule's dimensions
    decoder: bool = True  # CapsNet's reconstruction decoder, for the paper's loss (not counted in its 161,824)
    decoder_hidden: tuple[int, ...] = (512, 1024)  # the decoder's fully connected ReLU layers, then a sigmoid
    init: str = "torch"  # the class capsules' transforms start as the official code's (truncated He-normal) either
    # way, the four convolutions He-normal; "torch" (every run recorded here) draws those untruncated and leaves the
    # depthwise primary convolution and the decoder at PyTorch's start, "official" starts all of them as the
    # official code's Keras layers (he_normal truncated at 2 std; Glorot-uniform and zero bias; He-normal, the last
    # layer Glorot-normal, zero biases)

    def __post_init__(self) -> None:
        check_types(self)
        check_choice(self, "init", INITS)
        object.__setattr__(self, "decoder_hidden", tuple(self.decoder_hidden))
        for name in ("input_height", "input_width"):
            check_range(self, name, 1, 4096)
        for name in ("in_channels", "num_classes", "primary_caps", "primary_dim", "class_dim"):
            check_range(self, name, 1, 1 << 16)
        check_range(self, "decoder_hidden", 1, 1 << 16)
        check_range(self, "num_classes", 2, 1 << 16)  # one class: every image scored class 0, an accuracy of 100%
        if self.primary_caps * self.primary_dim != _CONVS[-1][0]:
            raise ValueError(f"primary_caps * primary_dim must be the last convolution's {_CONVS[-1][0]} channels, "
                             f"got {self.primary_caps} * {self.primary_dim}")
        if min(self.grid) < 1:
            raise ValueError(f"input {self.input_height}x{self.input_width} is too small for the four convolutions "
                             f"(it needs at least 11x11)")
        if self.num_weights > MAX_WEIGHTS:
            raise ValueError(f"this EfficientCapsNetConfig would hold {self.num_weights:,} weights, more than "
                             f"{MAX_WEIGHTS:,}")

    @property
    def grid(self) -> tuple[int, int]:
        """Height and width of the last feature map (9 x 9 for MNIST): the primary capsules' depthwise kernel."""
        def out(n: int) -> int:
            for _, k, s in _CONVS:
                n = (n - k) // s + 1
            return n
        return out(self.input_height), out(self.input_width)

    @property
    def num_weights(self) -> int:
        n, c_in = 0, self.in_channels
        for c, k, _ in _CONVS:
            n += (c_in * k * k + 1) * c + 2 * c  # convolution with bias, batch norm's scale and shift
            c_in = c
        n += c_in * (self.grid[0] * self.grid[1] + 1)  # depthwise primary convolution
        I, J = self.primary_caps, self.num_classes
        n += self.primary_dim * I * J * self.class_dim + I * J  # transformation matrices, routing prior
        if self.decoder:
            sizes = [J * self.class_dim, *self.decoder_hidden, self.in_channels * self.input_height * self.input_width]
            n += sum((a + 1) * b for a, b in zip(sizes[:-1], sizes[1:]))
        return n


def _keras_normal(weight: torch.Tensor, variance: float) -> None:
    """Keras' truncated normal initialisers (he_normal, glorot_normal): drawn within 2 std and rescaled by
    1 / 0.87962566, the spread lost to the truncation, so the weights keep the nominal ``variance``."""
    std = math.sqrt(variance) / 0.87962566
    nn.init.trunc_normal_(weight, std=std, a=-2 * std, b=2 * std)


class EfficientCapsNet(nn.Module):
    """Efficient-CapsNet (Mazzia, Salvetti and Chiaberge, "Efficient-CapsNet: capsule network with self-attention
    routing", Scientific Reports 2021); returns a ``CapsNetOutput`` (poses, lengths, reconstructions, coupling) like CapsNet."""

    def __init__(self, config: EfficientCapsNetConfig = EfficientCapsNetConfig()) -> None:
        super().__init__()
        check_config(config, EfficientCapsNetConfig, type(self).__name__)
        self.config = cfg = config
        layers: list[nn.Module] = []
        c_in = cfg.in_channels
        for c, k, s in _CONVS:
            conv = nn.Conv2d(c_in, c, k, stride=s)
            nn.init.kaiming_normal_(conv.weight, nonlinearity="relu")  # He-normal (Keras' truncates: init="official")
            nn.init.zeros_(conv.bias)
            # Keras: activation inside the convolution, then BatchNormalization(momentum 0.99, epsilon 1e-3)
            layers += [conv, nn.ReLU(inplace=True), nn.BatchNorm2d(c, eps=1e-3, momentum=0.01)]
            c_in = c
        self.features = nn.Sequential(*layers)
        self.primary = nn.Conv2d(c_in, c_in, cfg.grid, groups=c_in)  # depthwise over the whole map -> 1x1
        self.digits = DenseCaps(cfg.primary_caps, cfg.primary_dim, cfg.num_classes, cfg.class_dim, bias=False,
                                routing=SelfAttentionRouting(cfg.primary_caps, cfg.num_classes))
        # Keras he_normal over the (J, I, Din, Dout) kernel: truncated at 2 std, rescaled to keep sqrt(2 / fan_in)
        _keras_normal(self.digits.weight, 2 / (cfg.num_classes * cfg.primary_caps * cfg.primary_dim))
        self.decoder = (Decoder(cfg.num_classes * cfg.class_dim, (cfg.in_channels, cfg.input_height, cfg.input_width),
                                cfg.decoder_hidden) if cfg.decoder else None)
        if cfg.init == "official":
            self._official_start()

    @torch.no_grad()
    def _official_start(self) -> None:
        """The convolutions, the primary convolution and the decoder as the official code's Keras layers start them:
        the four convolutions Keras' he_normal (a normal truncated at 2 std, rescaled to sqrt(2 / fan_in); PyTorch's
        kaiming_normal_ has no truncation); the depthwise ``Conv2D(128, 9, groups=128)`` Glorot-uniform over its
        (9, 9, 1, 128) kernel (fan in 81, fan out 81 x 128) with a zero bias; the decoder's ReLU layers He-normal,
        its sigmoid layer Glorot-normal (truncated and rescaled the same way), zero biases."""
        for conv in (m for m in self.features if isinstance(m, nn.Conv2d)):
            _keras_normal(conv.weight, 2 / conv.weight[0].numel())  # fan in: c_in x k x k
        k = self.primary.weight[0, 0].numel()  # 81: the depthwise kernel's receptive field
        limit = math.sqrt(6 / (k + k * self.primary.out_channels))
        nn.init.uniform_(self.primary.weight, -limit, limit)
        nn.init.zeros_(self.primary.bias)
        if self.decoder is None:
            return
        linears = [m for m in self.decoder.net if isinstance(m, nn.Linear)]
        for i, layer in enumerate(linears):
            fan_out, fan_in = layer.weight.shape
            _keras_normal(layer.weight, 2 / fan_in if i < len(linears) - 1 else 2 / (fan_in + fan_out))
            nn.init.zeros_(layer.bias)

    def primary_capsules(self, images: torch.Tensor) -> torch.Tensor:
        """Shapes: images (B, C, H, W) -> (B, primary_caps, primary_dim), squashed."""
        x = self.primary(self.features(images))  # (B, 128, 1, 1)
        return exp_squash(x.view(x.shape[0], self.config.primary_caps, self.config.primary_dim))

    def forward(self, images: torch.Tensor, labels: torch.Tensor | None = None) -> CapsNetOutput:
        """Shapes: images (B, C, H, W) in [0, 1]; labels (B,), (B, K) or None ->
        poses (B, J, 16), lengths (B, J), reconstructions (B, C, H, W) (or (B, K, C, H, W)) or None, coupling (B, I, J)."""
        cfg = self.config
        check_model_images(self, images)
        if labels is not None:
            check_decode_labels(labels, cfg.num_classes)
        if self.training and len(images) == 1 and cfg.grid == (1, 1):
            refuse_batch_of_one(f"{cfg.input_height}x{cfg.input_width} image leaves the last convolution a 1x1 map",
                                "or on images of at least 13x13")
        poses, lengths, coupling = self.digits(self.primary_capsules(images))
        reconstructions = None
        if self.decoder is not None:
            index = labels if labels is not None else lengths.argmax(dim=1)
            reconstructions = self.reconstruct(poses, index)
        return CapsNetOutput(poses, lengths, reconstructions, coupling)

    def routing_view(self, images: torch.Tensor) -> RoutingView:
        """The class capsules' self-attention coupling (one round) from the 16 primary capsules."""
        check_model_images(self, images)
        u = self.primary_capsules(images)  # (N, 16, 8)
        r = self.digits(u, record=True)
        return RoutingView(r.rounds, u.norm(dim=-1), r.activations, (self.config.primary_caps, 1, 1))

    def reconstruct(self, poses: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """Decode class capsules masked to ``index`` (B,) or (B, K), as ``CapsNet.reconstruct``."""
        if self.decoder is None:
            raise RuntimeError("this EfficientCapsNet was built with decoder=False and cannot reconstruct")
        return decode_masked(self.decoder, poses, index, (self.config.num_classes, self.config.class_dim))
