"""The U-Net baseline SegCaps is compared with (Ronneberger, Fischer and Brox, MICCAI 2015).

Four levels of two 3x3 convolutions each, 64 to 1024 channels, max-pooling
down and 2x2 transposed convolutions up, skip connections concatenated, a
1x1 convolution to one logit per pixel: the network of the U-Net paper
(its Figure 1) with "same" padding, so the output has the input's size, as
the SegCaps paper's U-Net. 31,030,593 weights with one input channel and
no batch norm (the "31M" SegCaps reports), 31,042,369 with it. Batch norm
after every convolution is on by default: without it a 23-layer network
from scratch trains far slower, and in eval mode it is a fixed affine map,
so scores stay per example. ``init="paper"`` starts every convolution as the
paper's section 3 (Gaussian, sd sqrt(2 / N)); the default keeps PyTorch's,
with which the network without batch norm starts with logits about 300 times
smaller (sd 0.0035 against 1.0 over random 64x64 images). The paper's drop-out at the end of the contracting path is left out.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .._config import MAX_WEIGHTS, JsonConfig, check_choice, check_range, check_types
from ..losses import SEGMENTATION_LOSSES
from .inputs import check_config, check_weights_dtype, refuse_batch_of_one
from .segcaps import STRIDE, check_segmentation_input, check_sides

__all__ = ["UNET_INITS", "UNetConfig", "UNet", "UNetOutput"]

UNET_INITS = ("torch", "paper")  # UNetConfig.init


@dataclass(frozen=True)
class UNetConfig(JsonConfig):
    """The U-Net's sizes; the defaults are the paper's widths (64 channels doubling to 1024, four poolings)."""

    input_height: int = 64
    input_width: int = 64
    in_channels: int = 1
    num_classes: int = 1
    base_channels: int = 64  # Ronneberger et al.: 64, 128, 256, 512, 1024
    depth: int = 4  # poolings
    batch_norm: bool = True  # after every convolution (the paper's U-Net has none: false gives it)
    seg_loss: str = "bce+dice"  # as SegCaps' default (capsnet.losses.SEGMENTATION_LOSSES)
    init: str = "torch"  # "torch": PyTorch's start (every run recorded before 2026-11-30); "paper": the paper's
    # section 3, every convolution's weights Gaussian with sd sqrt(2 / N), N its inputs per output, biases 0

    def __post_init__(self) -> None:
        check_types(self)
        check_choice(self, "init", UNET_INITS)
        check_range(self, "depth", 1, 8)
        check_sides(self, max(2 ** self.depth, STRIDE), f"{self.depth} poolings" if 2 ** self.depth >= STRIDE
                    else "SegCaps' multiple, so both take the same images")
        check_range(self, "in_channels", 1, 64)
        check_range(self, "num_classes", 1, 1)
        check_range(self, "base_channels", 1, 1024)
        check_choice(self, "seg_loss", SEGMENTATION_LOSSES)
        if self.num_weights > MAX_WEIGHTS:  # as every other model: refused before anything is allocated
            raise ValueError(f"this UNetConfig would hold {self.num_weights:,} weights, more than {MAX_WEIGHTS:,}: "
                             f"lower base_channels or depth")

    @property
    def widths(self) -> list[int]:
        return [self.base_channels * 2 ** k for k in range(self.depth + 1)]

    @property
    def num_weights(self) -> int:
        """The number of weights the model holds, from the sizes alone."""
        def block(a: int, b: int) -> int:  # two 3x3 convolutions (+ batch norm's scale and shift)
            return (a * 9 + 1) * b + (b * 9 + 1) * b + (4 * b if self.batch_norm else 0)

        w = self.widths
        n = block(self.in_channels, w[0]) + sum(block(a, b) for a, b in zip(w[:-1], w[1:]))
        for a, b in zip(w[:0:-1], w[-2::-1]):  # up: 2x2 transposed convolution a -> b, then a block on 2b -> b
            n += (a * 4 + 1) * b + block(2 * b, b)
        return n + w[0] + 1  # the 1x1 output convolution


class UNetOutput(NamedTuple):
    probabilities: torch.Tensor  # (B, 1, H, W): sigmoid of the logits
    logits: torch.Tensor  # (B, 1, H, W)


def _block(a: int, b: int, bn: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for c_in in (a, b):
        layers += [nn.Conv2d(c_in, b, 3, padding=1)] + ([nn.BatchNorm2d(b)] if bn else []) + [nn.ReLU(inplace=True)]
    return nn.Sequential(*layers)


class UNet(nn.Module):
    """U-Net (Ronneberger, Fischer and Brox, MICCAI 2015): images in, a foreground logit and probability per pixel out."""

    def __init__(self, config: UNetConfig = UNetConfig()) -> None:
        super().__init__()
        check_config(config, UNetConfig, type(self).__name__)
        self.config = cfg = config
        w = cfg.widths
        self.down = nn.ModuleList([_block(cfg.in_channels, w[0], cfg.batch_norm)] +
                                  [_block(a, b, cfg.batch_norm) for a, b in zip(w[:-1], w[1:])])
        self.up = nn.ModuleList([nn.ConvTranspose2d(a, b, 2, stride=2) for a, b in zip(w[:0:-1], w[-2::-1])])
        self.merge = nn.ModuleList([_block(2 * b, b, cfg.batch_norm) for b in w[-2::-1]])
        self.out = nn.Conv2d(w[0], 1, 1)
        if cfg.init == "paper":
            with torch.no_grad():
                for m in self.modules():
                    if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)):
                        # N: the inputs of one output, in channels x kernel area (a stride-2 2x2 transposed
                        # convolution's output sees one input position: in channels)
                        per_output = m.in_channels * (1 if isinstance(m, nn.ConvTranspose2d) else m.weight[0, 0].numel())
                        m.weight.normal_(0.0, (2.0 / per_output) ** 0.5)
                        m.bias.zero_()

    @property
    def side_multiple(self) -> int:
        """What an image's height and width must be multiples of: 2^depth, and SegCaps' 8."""
        return max(2 ** self.config.depth, STRIDE)

    def forward(self, images: torch.Tensor, masks: torch.Tensor | None = None) -> UNetOutput:
        """Shapes: images (B, C, H, W), H and W multiples of 2^depth and of 8 (SegCaps', so both take the same
        images); masks unused (the shared signature) -> probabilities, logits (B, 1, H, W)"""
        depth = self.config.depth
        check_segmentation_input(images, self.config, self.side_multiple,
                                 None if 2 ** depth >= STRIDE else f"SegCaps' multiple, so both take the same images; "
                                                                  f"this U-Net halves them {depth} "
                                                                  f"time{'s' if depth > 1 else ''}")
        check_weights_dtype(images, self)
        H, W = images.shape[-2:]
        if self.training and self.config.batch_norm and len(images) == 1 and max(H, W) >> depth == 1:
            refuse_batch_of_one(f"{H}x{W} image reaches this U-Net's 1x1 bottleneck (depth {depth})",
                                "on larger images, at a lower depth, or with batch_norm=false")
        skips, x = [], images
        for k, block in enumerate(self.down):
            x = block(x if k == 0 else F.max_pool2d(x, 2))  # (B, w_k, H / 2^k, W / 2^k)
            skips.append(x)
        for up, merge, skip in zip(self.up, self.merge, skips[-2::-1]):
            x = merge(torch.cat([up(x), skip], dim=1))  # (B, w, ...) one level up
        logits = self.out(x)  # (B, 1, H, W)
        return UNetOutput(torch.sigmoid(logits), logits)
