"""Primary capsules: a convolution whose channels, grouped, are squashed into capsules."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .._eager import promoted
from ..ops import squash
from ..routing.result import check_count, check_floating, check_positive

__all__ = ["PrimaryCaps"]


class PrimaryCaps(nn.Module):
    """Convolutional primary capsules (Sabour et al. 2017, section 4).

    One convolution gives ``types * dim`` channels; each group of ``dim``
    consecutive channels at one position is a capsule, squashed. The paper's
    MNIST layer: 32 types of 8D capsules, 9x9 kernel, stride 2, on 20x20x256,
    giving 32 x 6 x 6 = 1152 capsules. ``out_scale`` multiplies the
    convolution's product before its bias is added: 1 / types gives the
    authors' code's primary capsules (their one routing round over the types).
    """

    def __init__(self, in_channels: int, *, types: int = 32, dim: int = 8, kernel_size: int = 9, stride: int = 2,
                 out_scale: float = 1.0) -> None:
        super().__init__()
        for name, value in (("in_channels", in_channels), ("types", types), ("dim", dim),
                            ("kernel_size", kernel_size), ("stride", stride)):
            check_count(name, value)  # 0 built and failed inside conv2d at the first forward
        check_positive("out_scale", out_scale)  # NaN made NaN capsules
        self.types, self.dim, self.out_scale = types, dim, float(out_scale)
        self.conv = nn.Conv2d(in_channels, types * dim, kernel_size=kernel_size, stride=stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Shapes:
            x: (B, C, H, W) feature maps
            returns: (B, I, D) squashed capsules, I = types * H' * W', ordered (type, row, column)
        """
        c = self.conv
        k = c.kernel_size
        if x.dim() != 4 or x.shape[-2] < k[0] or x.shape[-1] < k[1]:  # torch's bare "Kernel size can't be greater"
            raise ValueError(f"PrimaryCaps takes (B, C, H, W) feature maps of at least its {k[0]}x{k[1]} kernel, got "
                             f"{tuple(x.shape)}")
        check_floating(x, "feature maps", "x.float() takes them")
        # float64 maps into a float32 layer: float64, as the capsule layers promote (torch's convolution refused the
        # pair: "Input type (double) and bias type (float) should be the same"); bfloat16 ones: float32
        x, weight, bias = promoted(x, c.weight, c.bias)
        if self.out_scale == 1.0:  # the module itself where it can (a speed variant gives it another forward)
            y = c(x) if weight is c.weight else F.conv2d(x, weight, bias, c.stride, c.padding, c.dilation, c.groups)
        else:  # the convolution's product scaled before its bias is added (CapsNetConfig.init="authors")
            y = F.conv2d(x, weight, None, c.stride, c.padding, c.dilation, c.groups) * self.out_scale
            y = y + bias.view(1, -1, 1, 1)
        B, _, H, W = y.shape
        y = y.view(B, self.types, self.dim, H, W).permute(0, 1, 3, 4, 2)  # (B, types, H', W', D)
        return squash(y.reshape(B, self.types * H * W, self.dim))  # (B, I, D)
