"""Primary capsules: a convolution whose channels, grouped, are squashed into capsules."""
from __future__ import annotations

import torch
from torch import nn

from ..ops import squash

__all__ = ["PrimaryCaps"]


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
