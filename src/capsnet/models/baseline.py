"""The CNN that Sabour et al. compare CapsNet with (NIPS 2017, section 5).

"The baseline is a standard CNN with three convolutional layers of 256, 256,
128 channels. Each has 5x5 kernels and stride of 1. The last convolutional
layers are followed by two fully connected layers of size 328, 192. The last
fully connected layer is connected with dropout to a 10 class softmax layer
with cross entropy loss." The paper counts 35.4M parameters for it; that count
holds with "same" padding and no pooling (28 x 28 x 128 features into the
328-unit layer), which is what this module builds.

``pool=True`` puts a 2x2 max-pool of stride 2 after every convolution
(TensorFlow's "same" pooling: an odd side rounds up): with ``channels=(512,
256)``, ``hidden=(1024,)`` it is the layers of the authors' ``conv_model.py``, the
MultiMNIST baseline of section 6, with ``padding=SAME`` (its code's default is
VALID: 12,738,826 weights at 36x36) and trained here with cross-entropy (its
code's default loss is the margin loss): 24,535,306 weights at 36x36, near
the paper's "24.56M" (a 9x9 first convolution would give 24,563,978).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .._config import JsonConfig, MAX_WEIGHTS, check_range, check_types, plain_numbers
from .._numbers import is_count
from ..losses import multi_hot
from .inputs import check_class_labels, check_config, check_model_images

__all__ = ["BaselineCNNConfig", "BaselineCNN", "baseline_loss"]


@dataclass(frozen=True)
class BaselineCNNConfig(JsonConfig):
    """Every size of the baseline; the defaults are the paper's MNIST CNN (35,445,522 parameters)."""

    input_height: int = 28
    input_width: int = 28
    in_channels: int = 1
    num_classes: int = 10
    channels: tuple[int, ...] = (256, 256, 128)  # section 5: three convolutions of 256, 256 and 128 channels ...
    kernel: int = 5  # ... with 5x5 kernels and stride 1
    hidden: tuple[int, ...] = (328, 192)  # then two fully connected layers of 328 and 192
    dropout: float = 0.5  # before the last layer, "connected with dropout to a 10 class softmax layer"
    pool: bool = False  # a 2x2 max-pool after every convolution (the authors' conv_model.py; section 5's has none)

    def __post_init__(self) -> None:
        plain_numbers(self)  # np.int64(64) from a sweep is 64
        for name in ("input_height", "input_width", "in_channels", "num_classes", "kernel"):
            value = getattr(self, name)
            if not is_count(value):
                raise ValueError(f"BaselineCNNConfig.{name} must be a positive integer, got {value!r}")
        check_types(self)
        for name in ("input_height", "input_width", "in_channels", "num_classes", "kernel"):
            check_range(self, name, 1, 4096 if name.startswith("input") else 1 << 20)
        check_range(self, "num_classes", 2, 1 << 20)  # one class: a loss of 0 and no gradient, whatever the image
        if self.kernel % 2 == 0:
            raise ValueError(f"BaselineCNNConfig.kernel must be odd so 'same' padding keeps the size, got {self.kernel}")
        object.__setattr__(self, "channels", tuple(self.channels))
        object.__setattr__(self, "hidden", tuple(self.hidden))
        if not self.channels or any(not isinstance(c, int) or c < 1 for c in self.channels + self.hidden):
            raise ValueError(f"BaselineCNNConfig.channels and .hidden must be positive integers, got {self.channels}, {self.hidden}")
        check_range(self, "channels", 1, 1 << 20)
        check_range(self, "hidden", 1, 1 << 20)
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"BaselineCNNConfig.dropout must be in [0, 1), got {self.dropout}")
        if self.num_weights > MAX_WEIGHTS:
            raise ValueError(f"this BaselineCNNConfig would hold {self.num_weights:,} weights, more than "
                             f"{MAX_WEIGHTS:,}: lower its channel or layer sizes")

    @property
    def num_weights(self) -> int:
        """The number of weights the model holds, computed from the sizes alone."""
        convs = [self.in_channels, *self.channels]
        n = sum((a * self.kernel**2 + 1) * b for a, b in zip(convs[:-1], convs[1:]))
        height, width = self.features
        fcs = [self.channels[-1] * height * width, *self.hidden, self.num_classes]
        return n + sum((a + 1) * b for a, b in zip(fcs[:-1], fcs[1:]))

    @property
    def features(self) -> tuple[int, int]:
        """Height and width of the last convolution's output: the input's, halved (rounding up) per pooled layer."""
        height, width = self.input_height, self.input_width
        if self.pool:
            for _ in self.channels:
                height, width = -(-height // 2), -(-width // 2)
        return height, width


class BaselineCNN(nn.Module):
    """The CNN baseline of Sabour et al. 2017 (section 5): three 5x5 'same' convolutions with ReLU (each max-pooled
    with ``pool``), two fully connected layers, dropout, class logits."""

    def __init__(self, config: BaselineCNNConfig = BaselineCNNConfig()) -> None:
        super().__init__()
        check_config(config, BaselineCNNConfig, type(self).__name__)
        self.config = cfg = config
        convs, c_in = [], cfg.in_channels
        for c_out in cfg.channels:
            convs.append(nn.Conv2d(c_in, c_out, cfg.kernel, padding=cfg.kernel // 2))
            c_in = c_out
        self.convs = nn.ModuleList(convs)
        fcs, f_in = [], c_in * cfg.features[0] * cfg.features[1]
        for f_out in cfg.hidden:
            fcs.append(nn.Linear(f_in, f_out))
            f_in = f_out
        self.fcs = nn.ModuleList(fcs)
        self.dropout = nn.Dropout(cfg.dropout)
        self.out = nn.Linear(f_in, cfg.num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Shapes: images (B, C, H, W) in [0, 1] -> logits (B, num_classes)."""
        cfg = self.config
        check_model_images(self, images)
        x = images
        for conv in self.convs:
            x = F.relu(conv(x))
            if cfg.pool:
                x = F.max_pool2d(x, 2, 2, ceil_mode=True)  # TensorFlow's "same" pooling for odd sides
        x = x.flatten(1)
        for fc in self.fcs:
            x = F.relu(fc(x))
        return self.out(self.dropout(x))


def baseline_loss(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, components: torch.Tensor | None = None,
                  *, recon_weight: float = 0.0, progress: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy (section 5) and the class scores (softmax probabilities).

    For MultiMNIST pairs (labels (B, 2)) the target puts probability 1/2 on
    each of the two classes. The CNN reconstructs nothing: ``components`` and
    ``recon_weight`` are accepted for the shared loss signature and unused.

    Shapes: images (B, C, H, W); labels (B,) or (B, 2); returns loss (), scores (B, num_classes)
    """
    check_class_labels(labels, images.shape[0], model.config.num_classes)
    logits = model(images)  # (B, K)
    target = multi_hot(labels, logits.shape[1], logits.dtype) / labels.shape[1] if labels.dim() == 2 else labels
    return F.cross_entropy(logits, target), logits.softmax(dim=1)
