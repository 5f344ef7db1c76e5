"""Matrix capsules with EM routing: Hinton, Sabour and Frosst, ICLR 2018, section 4 and Figure 1.

ReLU Conv1 (A channels, 5x5, stride 2) -> PrimaryCaps (B types of 4x4 pose +
activation, 1x1) -> ConvCaps1 (C types, 3x3, stride 2) -> ConvCaps2 (D types,
3x3, stride 1) -> Class capsules (one per class, transformations shared over
positions, coordinate addition), EM routing between every pair of capsule
layers, trained with the spread loss and its growing margin (section 4.1).
No padding (as the official code), so a 32x32 smallNORB crop gives grids of
14, 6 and 4, and a 28x28 MNIST digit 12, 5 and 3.

Registered twice: ``em-capsnet`` is the paper's smallNORB network (A = B = C =
D = 32) and ``em-capsnet-small`` its small variant (A = 64, B = 8, C = D = 16).
Section 5 gives "310K" and "68K" weights; counted from the architecture
(tests/test_models_em.py) they are 316,394 and 67,154 with 5 classes and
biased primary convolutions: the paper's 310K is a rounded figure (the two
convolutional capsule layers alone hold 294,912).

``conv1_batch_norm`` (off by default; ``--model-option conv1_batch_norm=true``)
puts batch norm between conv1 and its ReLU, as the most-used PyTorch port of
the paper does; neither the paper nor the official code has it. In eval mode
it is a fixed affine map, so an example's output stays independent of its batch.

``conv_e_step`` (``window`` by default) chooses how the convolutional capsule
layers' E-step treats a child held by several windows: each window routes
it on its own (``window``, the most-used PyTorch port), or its R is
normalised over every parent of every window holding it (``child``:
Procedure 1's sum over the parents, IBM's port) or over those windows per
parent type (``child-type``: the official code). ``EMRouting``'s module
docstring has the details; docs/results/routing-family.md what each does on MNIST.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .._config import JsonConfig, MAX_WEIGHTS, check_choice, check_range, check_types
from ..layers import ClassMatrixCaps, ConvMatrixCaps, PrimaryMatrixCaps, grid_routing_view
from ..losses import check_recon_weight, multi_hot, spread_loss
from ..routing import EMRouting, RoutingView
from .inputs import check_class_labels, check_config, check_model_images

# EMCapsNetConfig.conv_e_step -> EMRouting's child_norm (None: each window routed on its own)
CONV_E_STEPS = {"window": None, "child": "all", "child-type": "type"}
COORDINATE_FRAMES = ("grid", "receptive-field")  # EMCapsNetConfig.coordinate_frame
PRIMARY_INITS = ("torch", "official")  # "torch" as the other models spell it ("pytorch" before 2026-12-03: read)
# the receptive field of a ConvCaps2 capsule at (r, c): conv1 (5x5, stride 2), the 1x1 primary capsules, ConvCaps1
# (3x3, stride 2), ConvCaps2 (3x3, stride 1), no padding; the centre of a K-wide window from s q is s q + (K - 1) / 2
_LAYER_WINDOWS = ((5, 2), (1, 1), (3, 2), (3, 1))  # (kernel, stride), image to ConvCaps2
_CONV1, _PRIMARY, _CAPS1, _CAPS2 = _LAYER_WINDOWS  # each layer's (kernel, stride): the one place they are written


def receptive_field_centres() -> tuple[int, float]:
    """(stride, offset): the pixel coordinate of the centre of the receptive field of the ConvCaps2 capsule at grid
    position q is stride q + offset (pixel i spanning [i, i + 1)), composed over ``_LAYER_WINDOWS``."""
    stride, offset = 1, 0.5  # at ConvCaps2: q itself, then back through each layer to the image
    for k, s in reversed(_LAYER_WINDOWS):
        stride, offset = stride * s, offset * s + (k - 1) / 2 - (0.5 * s - 0.5)
    return stride, offset


__all__ = ["EMCapsNetConfig", "EMCapsNetSmallConfig", "EMCapsNet", "EMCapsNetOutput", "em_capsnet_loss"]


@dataclass(frozen=True)
class EMCapsNetConfig(JsonConfig):
    """Every size of the network; the defaults are the paper's smallNORB model (Figure 1, A = B = C = D = 32)."""

    input_height: int = 32
    input_width: int = 32
    in_channels: int = 1
    num_classes: int = 5  # smallNORB's five categories
    conv1_channels: int = 32  # A
    primary_types: int = 32  # B
    caps1_types: int = 32  # C
    caps2_types: int = 32  # D
    routing_iterations: int = 3  # Table 1: 3 iterations give the lowest smallNORB error
    final_lambda: float = 0.01  # official code: inverse temperature scale (the class layer takes a quarter)
    coordinate_addition: bool = True  # section 4: the class layer adds its child's scaled (row, column) to each vote
    # which (row, column): "grid", the child's cell centre in its own grid, (r + 0.5) / H (Gritzman's port; every
    # run recorded here), or "receptive-field", the centre of its receptive field in the image over the image's side,
    # the paper's words (section 4; the official code adds pixel coordinates centred and over 100 instead)
    coordinate_frame: str = "grid"
    normalise_cost: bool = False  # EMRouting's option: each parent's cost standardised against the others
    margin_start: float = 0.2  # section 4.1: "starting with a small margin of 0.2 ...
    margin_end: float = 0.9  # ... and linearly increasing it during training to 0.9"
    margin_warmup: float = 0.5  # fraction of training over which the margin grows (the paper gives none)
    conv1_batch_norm: bool = False  # not in the paper nor the official code: batch norm between conv1 and its ReLU
    # initial spread of the 4x4 transformation matrices: the official code's convolutional layers' (Gritzman's
    # code: 1.0); 0.5 before 2026-11-27 (evening), which reproduces the runs recorded before
    transform_std: float = 0.3
    class_transform_std: float | None = None  # the class layer's spread; None: transform_std (official: 0.01)
    var_floor: float = 5e-4  # EMRouting's variance floor (official code: 5e-4; Gritzman's code: 1e-9)
    beta_u_init: float = 0.0  # EMRouting's beta_u start; ~3: half the capsules start active (EMRouting)
    class_beta_u_init: float | None = None  # the class layer's; None: beta_u_init (official: 2.838 at cost_scale 2)
    beta_a_init: float = -25.0  # the convolutional capsule layers' beta_a start in final-logit units (EMRouting):
    # the official code's (act_b 0.5); 0, the ports' start (saturated capsules), reproduces runs before 2026-11-27
    class_beta_a_init: float = -12.5  # the class layer's: the official code's (act_b 1.0); 0 before 2026-11-27
    # the convolutional capsule layers' E-step: "window" routes each window on its own (the most-used port);
    # "child" normalises a child over every parent of every window holding it (Procedure 1, IBM's port);
    # "child-type" over those windows for each parent type (the official code)
    conv_e_step: str = "window"
    detach_routing: bool = False  # EMRouting's option: no gradient through the E-steps (no paper or reference code)
    # EMRouting's cost_scale in place of Gritzman's 100 J / I (None: that); 2, with beta_u_init 0.709 and
    # class_beta_u_init 2.838, is the official code's cost and start (beta_v 0.5 and 2.0)
    cost_scale: float | None = None
    mean_momentum: float = 0.0  # EMRouting's: the previous mean's share in each M-step's (official code: 0.1)
    e_step_temperature: float = 1.0  # EMRouting's: R proportional to (a p)^tau in every E-step (not in the paper)
    e_step_var_floor: float = 0.0  # EMRouting's: added to the E-step's variances alone (not in the paper)
    # the start of conv1 and the primary capsules: "torch" (PyTorch's defaults) or "official": conv1 truncated normal
    # 0.05 with biases 0.1, the primary 1x1 convolutions truncated normal 0.5 with pose biases 0 and activation
    # biases -1 (the official code: no biases there, sigmoid(x - 1); its activation kernel's std 3.0 reaches only the
    # last two types, through a reshape of the concatenated kernels, so 0.5 is what most of its types start from)
    primary_init: str = "torch"
    # runs saved before these fields existed started from these (0.5 until 2026-11-24's field, whose default moved
    # to 0.3 later; beta_a at 0 until 2026-11-27): read back so, an experiment and a resume compare and record the
    # run's own start, not today's defaults
    _SAVED_BEFORE = {"transform_std": 0.5, "beta_a_init": 0.0, "class_beta_a_init": 0.0}

    def __post_init__(self) -> None:
        check_types(self)
        if self.primary_init == "pytorch":  # its spelling before 2026-12-03 (older checkpoints, the shipped model)
            object.__setattr__(self, "primary_init", "torch")
        for name in ("class_transform_std", "cost_scale"):  # 0, their first unset value, reads as None
            if getattr(self, name) == 0:
                object.__setattr__(self, name, None)
        for name in ("input_height", "input_width"):
            check_range(self, name, 1, 4096)
        for name in ("in_channels", "num_classes", "conv1_channels", "primary_types", "caps1_types", "caps2_types"):
            check_range(self, name, 1, 1 << 16)
        check_range(self, "num_classes", 2, 1 << 16)  # one class: a spread loss of 0 and no gradient
        check_range(self, "routing_iterations", 1, 100)
        check_range(self, "final_lambda", 1e-9, 1e3)
        check_range(self, "transform_std", 1e-6, 100)
        if self.class_transform_std is not None:
            check_range(self, "class_transform_std", 1e-6, 100)
        check_range(self, "var_floor", 1e-12, 1)
        for name in ("beta_u_init", "beta_a_init", "class_beta_a_init") + (
                ("class_beta_u_init",) if self.class_beta_u_init is not None else ()):
            check_range(self, name, -100, 100)
        if self.cost_scale is not None:
            check_range(self, "cost_scale", 1e-6, 1e6)
        check_range(self, "mean_momentum", 0, 0.99)
        check_range(self, "e_step_temperature", 0.01, 10)
        check_range(self, "e_step_var_floor", 0, 100)
        check_range(self, "margin_start", 0, 1)
        check_range(self, "margin_end", 0, 1)
        check_range(self, "margin_warmup", 0, 1)
        check_choice(self, "conv_e_step", CONV_E_STEPS)
        check_choice(self, "coordinate_frame", COORDINATE_FRAMES)
        check_choice(self, "primary_init", PRIMARY_INITS)
        if min(self.grids[-1]) < 1:
            raise ValueError(f"input {self.input_height}x{self.input_width} is too small for conv1 "
                             f"{_CONV1[0]}x{_CONV1[0]}/{_CONV1[1]} and two capsule layers ({_CAPS1[0]}x{_CAPS1[0]}/"
                             f"{_CAPS1[1]}, then {_CAPS2[0]}x{_CAPS2[0]}/{_CAPS2[1]}): it needs at least "
                             f"{self.smallest_side}x{self.smallest_side}")
        if self.num_weights > MAX_WEIGHTS:
            raise ValueError(f"this {type(self).__name__} would hold {self.num_weights:,} weights, more than "
                             f"{MAX_WEIGHTS:,}: lower its sizes")

    @property
    def grids(self) -> list[tuple[int, int]]:
        """(height, width) of the conv1/primary grid, ConvCaps1 and ConvCaps2."""
        def sizes(n: int) -> list[int]:
            grid = []
            for kernel, stride in _LAYER_WINDOWS:  # no padding
                n = (n - kernel) // stride + 1
                grid.append(n)
            return grid[1:]  # the primary grid (1x1 over conv1's), ConvCaps1, ConvCaps2
        return list(zip(sizes(self.input_height), sizes(self.input_width)))

    @property
    def smallest_side(self) -> int:
        """The smallest input side that leaves ConvCaps2 a grid of one capsule (17 for the paper's layers)."""
        n = 1
        for kernel, stride in reversed(_LAYER_WINDOWS):
            n = (n - 1) * stride + kernel
        return n

    @property
    def num_weights(self) -> int:
        A, B, C, D, K = self.conv1_channels, self.primary_types, self.caps1_types, self.caps2_types, self.num_classes
        k1, k2 = _CAPS1[0] ** 2, _CAPS2[0] ** 2  # each capsule layer's window
        conv1 = (self.in_channels * _CONV1[0] ** 2 + 1) * A
        primary = (A + 1) * B * 16 + (A + 1) * B  # 1x1 pose and activation convolutions, with biases
        caps = k1 * B * C * 16 + 2 * C + k2 * C * D * 16 + 2 * D + D * K * 16 + 2 * K  # 4x4 transforms, beta_u, beta_a
        norm = 2 * A if self.conv1_batch_norm else 0  # batch norm's scale and shift
        return conv1 + norm + primary + caps

    def margin(self, progress: float) -> float:
        """The spread loss's margin after ``progress`` (0..1) of training: linear from start to end over the warm-up."""
        if self.margin_warmup == 0:
            return self.margin_end
        return self.margin_start + (self.margin_end - self.margin_start) * min(1.0, progress / self.margin_warmup)


@dataclass(frozen=True)
class EMCapsNetSmallConfig(EMCapsNetConfig):
    """The paper's small variant (section 5: "A = 64, B = 8, C = D = 16 with only 68K trainable parameters")."""

    conv1_channels: int = 64
    primary_types: int = 8
    caps1_types: int = 16
    caps2_types: int = 16


class EMCapsNetOutput(NamedTuple):
    poses: torch.Tensor  # (B, K, 16) class capsule poses (4x4, flattened)
    activations: torch.Tensor  # (B, K) class capsule activations: the class scores
    coupling: torch.Tensor  # (B, I, K) the class layer's last R, I = rows * columns * D children (row, column, type)

    @property
    def scores(self) -> torch.Tensor:
        """(B, K) class scores: the activations."""
        return self.activations


class EMCapsNet(nn.Module):
    """The matrix capsule network of Hinton, Sabour and Frosst, "Matrix capsules with EM routing" (ICLR 2018), with EM
    routing between every pair of capsule layers."""

    # evaluation runs this many examples at a time (capsnet.evaluate.eval_batch): a forward of 256 MNIST digits
    # through em-capsnet peaked at 12.8 GB resident (em-capsnet-small 1.9 GB), where training at batch 32 needs
    # a tenth of that (2026-11-25, VmHWM)
    eval_batch_limit = 32

    def __init__(self, config: EMCapsNetConfig = EMCapsNetConfig()) -> None:
        super().__init__()
        check_config(config, EMCapsNetConfig, type(self).__name__)
        self.config = cfg = config
        self.conv1 = nn.Conv2d(cfg.in_channels, cfg.conv1_channels, kernel_size=_CONV1[0], stride=_CONV1[1])
        self.conv1_norm = nn.BatchNorm2d(cfg.conv1_channels) if cfg.conv1_batch_norm else nn.Identity()
        self.primary = PrimaryMatrixCaps(cfg.conv1_channels, cfg.primary_types)
        if cfg.primary_init == "official":
            self._official_start()
        iters, lam, std = cfg.routing_iterations, cfg.final_lambda, cfg.transform_std
        em = dict(normalise_cost=cfg.normalise_cost, var_floor=cfg.var_floor, detach_routing=cfg.detach_routing,
                  cost_scale=cfg.cost_scale, mean_momentum=cfg.mean_momentum,
                  e_step_temperature=cfg.e_step_temperature, e_step_var_floor=cfg.e_step_var_floor)
        norm = CONV_E_STEPS[cfg.conv_e_step]
        conv = dict(std=std, share_children=norm is not None)
        conv_em = dict(em, final_lambda=lam, child_norm=norm or "all", beta_a_init=cfg.beta_a_init,
                       beta_u_init=cfg.beta_u_init)
        class_beta_u = cfg.beta_u_init if cfg.class_beta_u_init is None else cfg.class_beta_u_init
        self.caps1 = ConvMatrixCaps(cfg.primary_types, cfg.caps1_types, kernel_size=_CAPS1[0], stride=_CAPS1[1], **conv,
                                    routing=EMRouting(cfg.caps1_types, iters, **conv_em))
        self.caps2 = ConvMatrixCaps(cfg.caps1_types, cfg.caps2_types, kernel_size=_CAPS2[0], stride=_CAPS2[1], **conv,
                                    routing=EMRouting(cfg.caps2_types, iters, **conv_em))
        # official code: the class layer's inverse temperature is a quarter of the convolutional layers'
        class_em = EMRouting(cfg.num_classes, iters, final_lambda=lam / 4, beta_a_init=cfg.class_beta_a_init,
                             beta_u_init=class_beta_u, **em)
        field = None if cfg.coordinate_frame == "grid" else (*receptive_field_centres(), cfg.input_height,
                                                             cfg.input_width)
        self.classes = ClassMatrixCaps(cfg.caps2_types, cfg.num_classes, coordinate_addition=cfg.coordinate_addition,
                                       std=std if cfg.class_transform_std is None else cfg.class_transform_std,
                                       routing=class_em, receptive_field=field)

    @torch.no_grad()
    def _official_start(self) -> None:
        """conv1 and the primary capsules as the official code starts them (EMCapsNetConfig.primary_init)."""
        for weight, std in ((self.conv1.weight, 0.05), (self.primary.pose.weight, 0.5),
                            (self.primary.activation.weight, 0.5)):
            nn.init.trunc_normal_(weight, std=std, a=-2 * std, b=2 * std)
        self.conv1.bias.fill_(0.1)
        self.primary.pose.bias.zero_()
        self.primary.activation.bias.fill_(-1.0)

    def forward(self, images: torch.Tensor, labels: torch.Tensor | None = None) -> EMCapsNetOutput:
        """Shapes: images (B, C, H, W) float in [0, 1] -> poses (B, K, 16), activations (B, K), coupling (B, I, K).

        ``labels`` are accepted for the shared model signature and unused (no decoder).
        """
        check_model_images(self, images)
        out = self.classes(self._conv_capsules(images))
        return EMCapsNetOutput(out.poses, out.activations, out.coupling)

    def _conv_capsules(self, images: torch.Tensor):
        caps = self.primary(self.conv1_maps(images))  # (B, H1, W1, B_types, 16)
        return self.caps2(self.caps1(caps))  # (B, H3, W3, D, 16)

    def conv1_maps(self, images: torch.Tensor) -> torch.Tensor:
        """Conv1's feature maps as the primary capsules read them: ReLU(conv1(x)), its batch norm between under
        ``conv1_batch_norm`` (what the viewer draws). Shapes: images (B, C, H, W) -> (B, conv1_channels, H', W')."""
        return F.relu(self.conv1_norm(self.conv1(images)))

    def routing_view(self, images: torch.Tensor) -> RoutingView:
        """The class layer's EM routing, iteration by iteration, over the ConvCaps2 capsules."""
        check_model_images(self, images)
        caps = self._conv_capsules(images)
        return grid_routing_view(caps, self.classes(caps, record=True))


def em_capsnet_loss(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, components: torch.Tensor | None = None,
                    *, recon_weight: float = 0.0, progress: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The spread loss at the margin of ``progress`` (0..1) through training, and the class activations as scores.

    Shapes: images (B, C, H, W); labels (B,) or (B, 2) pairs; returns loss (), scores (B, K).
    ``components`` and ``recon_weight`` are accepted for the shared loss signature: no decoder.
    """
    check_recon_weight(recon_weight)  # as capsnet_loss: -1 is refused, though no decoder reads it
    try:
        within = not isinstance(progress, (bool, str)) and 0.0 <= progress <= 1.0  # NaN fails both comparisons
    except TypeError:
        within = False
    if not within:  # -3 made a negative margin and a loss of exactly 0; NaN read as the end of training
        raise ValueError(f"progress must be a number from 0 (start of training) to 1 (end), got {progress!r}")
    check_class_labels(labels, images.shape[0], model.config.num_classes)
    out = model(images)
    targets = multi_hot(labels, out.activations.shape[1], out.activations.dtype) if labels.dim() == 2 else labels
    return spread_loss(out.activations, targets, model.config.margin(progress)), out.activations
