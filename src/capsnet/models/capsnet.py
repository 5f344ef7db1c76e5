"""Sabour, Frosst and Hinton's CapsNet with its reconstruction decoder.

Architecture (section 4, Figures 1 and 2): Conv1 256 @ 9x9 ReLU ->
PrimaryCaps 32 x 8D @ 9x9 stride 2 -> DigitCaps 10 x 16D with 3 rounds of
routing -> decoder 512 -> 1024 -> H*W*C with a sigmoid, fed the digit capsules
masked to one class (the labels when they are passed, as training passes the
true ones, section 4.1; else the longest capsule: a loop of one's own that
calls ``model(x)`` in training trains the decoder on the predicted class).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .._config import JsonConfig, MAX_WEIGHTS, check_choice, check_range, check_types, hash_as_saved, plain_numbers
from .._eager import eager
from .._numbers import is_count
from ..layers import DenseCaps, PrimaryCaps
from ..losses import _one_hot, check_recon_weight, margin_loss, multi_hot, reconstruction_loss
from ..routing import RoutingView, create_routing, list_routings, routing_is, routing_takes
from ..routing.result import check_count
from .inputs import (check_class_labels, check_config, check_decode_labels, check_integer_labels,
                     check_model_images)
from .rounds import SavedRounds, check_rounds

PADDINGS = ("valid", "same")
# how the weights start: "torch", PyTorch's own initialisers (with the digit capsules' W ~ N(0, 0.01^2)); "authors",
# the authors' released code (research/capsules: truncated normals, biases 0.1, primary capsules scaled by 1 / types)
INITS = ("torch", "authors")
# How CapsNet starts a routing whose own defaults do not train in it: (routing options, the digit capsules' W std),
# under what routing_options and digit_init_std set. EM weighs Gaussians with a variance floor of 5e-4, so the votes
# must start above it (W of 0.01 leaves them at about 0.01 and every class equal), and its parents start mostly
# inactive: beta_a -25, the official code's start for its convolutional capsule layers (its class layer's, -12.5,
# did about as well in a first probe; capsnet.routing.em converts both). Measured on 2,000 MNIST digits, 2
# epochs (docs/results/routing-family.md, "CapsNet with each routing"): 9.8% test accuracy from EMRouting's defaults
# and W at 0.01, 90.8% from this start.
ROUTING_STARTS: dict[str, tuple[dict[str, Any], float]] = {"em": ({"beta_a_init": -25.0}, 0.3)}
# routing options CapsNet sets from its own fields (or the layer's sizes), never from routing_options
ROUTING_OPTIONS_SET_ELSEWHERE = {"leaky": "leaky_routing (--leaky-routing)",
                                 "detach_agreement": "detach_agreement (--detach-agreement)",
                                 "iterations": "routing_iterations (--routing-iterations)",
                                 "in_caps": "the layer's sizes", "out_caps": "the layer's sizes",
                                 "dim": "the layer's sizes"}

# routing options that change nothing in CapsNet's digit capsules (option: why), refused rather than ignored
ROUTING_OPTIONS_UNUSED = {"child_norm": "CapsNet's digit capsules share no child between vote rows, so the set a "
                                        "child's coupling is normalised over is always its own row (the option is "
                                        "for convolutional matrix capsules: em-capsnet's conv_e_step)"}

# CapsNet's switches of dynamic routing (field: the routing option it sets), which another routing does not take
DYNAMIC_SWITCHES = {"leaky_routing": "leaky", "detach_agreement": "detach_agreement"}


def unused_switches(config: Any, routing: str) -> dict[str, bool]:
    """The dynamic-routing switches that ``config`` (a config class: its defaults; or an instance) has on and that
    ``routing`` does not take, each set false: what a config moved to that routing drops (capsnet-cifar10's leaky
    routing under --routing em), as a one-pass routing drops its rounds (``models.rounds.unused_rounds``)."""
    if routing not in list_routings():
        return {}
    return {name: False for name, option in DYNAMIC_SWITCHES.items()
            if getattr(config, name, False) is True and not routing_takes(routing, option)}


__all__ = ["DYNAMIC_SWITCHES", "unused_switches", "PADDINGS", "INITS", "ROUTING_STARTS", "ROUTING_OPTIONS_SET_ELSEWHERE", "ROUTING_OPTIONS_UNUSED", "CapsNetConfig", "CapsNetCifar10Config", "CapsNetSvhnConfig", "CapsNet", "CapsNetOutput", "Decoder", "mask_capsules", "decode_masked", "capsnet_loss"]


@dataclass(frozen=True)
class CapsNetConfig(SavedRounds, JsonConfig):
    """Every size of the network; the defaults are the paper's MNIST model."""

    input_height: int = 28
    input_width: int = 28
    in_channels: int = 1
    num_classes: int = 10
    conv1_channels: int = 256  # Conv1's channels (stride 1, ReLU; the paper's MNIST model: 256 of 9x9)
    conv1_kernel: int = 9  # Conv1's kernel side (the paper's: 9)
    primary_types: int = 32  # PrimaryCaps' capsule types, each primary_dim-D (the paper's MNIST model: 32 of 8D)
    primary_dim: int = 8  # each primary capsule's dimensions (the paper's MNIST model: 8)
    primary_kernel: int = 9  # PrimaryCaps' convolution kernel side (the paper's: 9)
    primary_stride: int = 2  # PrimaryCaps' convolution stride (the paper's: 2, 20x20 -> 6x6)
    digit_dim: int = 16  # DigitCaps: one capsule of this many dimensions a class (the paper's MNIST model: 16)
    routing_iterations: int = 3  # rounds of routing by agreement (Procedure 1's r; the paper's figures use 3)
    # the digit capsules' routing: any registered one whose activations are probabilities (capsnet.routing: dynamic,
    # em, self-attention), built with the layer's sizes, routing_iterations (where it iterates) and routing_options,
    # fed the primary capsules' lengths as their activations; the rest of the network and its loss stay the paper's
    routing: str = "dynamic"
    # the routing's own options by name (capsnet.routing; e.g. {"final_lambda": 0.02} for em), over CapsNet's start
    # for that routing, written in when the config is made (ROUTING_STARTS in capsnet.models.capsnet; em:
    # {"beta_a_init": -25})
    routing_options: dict[str, Any] = field(default_factory=dict)
    # the digit capsules' W starts from N(0, std^2); None: init's (torch: 0.01; authors: 0.1); a routing with a start
    # of its own writes it in (em: 0.3)
    digit_init_std: float | None = None
    routing_bias: bool = True  # authors' code: learned bias on s_j, initialised to 0.1 (routings with a pose bias)
    leaky_routing: bool = False  # authors' code: a zero "orphan" logit in the routing softmax (dynamic routing)
    detach_agreement: bool = False  # no gradient through the routing rounds before the last (dynamic routing)
    decoder: bool = True  # the reconstruction decoder (section 4.1), masked by the labels passed (training's: true)
    decoder_hidden: tuple[int, ...] = (512, 1024)  # its fully connected ReLU layers, then a sigmoid to the image
    # "valid": no padding (the paper's MNIST model, 28 -> 20 -> 6); "same": TensorFlow's SAME zero padding for Conv1
    # and the primary capsules' convolution, out = ceil(in / stride) (the authors' CIFAR-10 command, 24 -> 24 -> 12)
    padding: str = "valid"
    # "torch": PyTorch's initialisers (Conv1, the primary convolution, the decoder), the digit capsules' W from
    # N(0, 0.01^2) (digit_init_std; EM routing: 0.3) and their bias 0.1. "authors": the start of the authors' released code (research/capsules, its
    # variables.py and layers.py): weights from a normal truncated at 2 standard deviations, 0.05 for Conv1 and 0.1
    # for the primary convolution, the digit capsules' W and the decoder, every bias 0.1; and the primary capsules
    # squash(conv(x) / types + bias), as that code's one routing round over the types (softmax of zero logits, 1 /
    # 32 each; with leaky_routing its orphan logit too, 1 / (types + 1)) makes them. The same functions either way;
    # under Adam the scale a weight starts at sets how fast it moves relative to itself, and the 1 / types factor
    # slows the primary convolution 32-fold (MNIST).
    init: str = "torch"

    def __post_init__(self) -> None:
        plain_numbers(self)  # np.int64(64) from a sweep is 64
        positive = ["input_height", "input_width", "in_channels", "num_classes", "conv1_channels", "conv1_kernel",
                    "primary_types", "primary_dim", "primary_kernel", "primary_stride", "digit_dim", "routing_iterations"]
        for name in positive:
            value = getattr(self, name)
            if not is_count(value):
                raise ValueError(f"CapsNetConfig.{name} must be a positive integer, got {value!r}")
        check_types(self)  # the flags too: a checkpoint's "routing_bias": "yes" is not a bool
        object.__setattr__(self, "decoder_hidden", tuple(self.decoder_hidden))
        for name in positive:
            check_range(self, name, 1, 4096 if name.startswith("input") else 100 if name == "routing_iterations"
                        else 1 << 20)  # routing: the paper uses 3; a billion rounds is a damaged config
        check_range(self, "decoder_hidden", 1, 1 << 16)
        check_range(self, "num_classes", 2, 1 << 20)  # one class: every image scored class 0, an accuracy of 100%
        if self.digit_init_std is not None:
            check_range(self, "digit_init_std", 1e-6, 100)  # 0 would start every vote at 0 (and no truncated normal)
        # its own copy, not the caller's, with CapsNet's start for the routing written in (ROUTING_STARTS), so a saved
        # config says how its run started even if the table changes
        options, std = ROUTING_STARTS.get(self.routing, ({}, None))  # a string: check_types ran
        object.__setattr__(self, "routing_options", options | dict(self.routing_options))
        if self.digit_init_std is None and std is not None:
            object.__setattr__(self, "digit_init_std", std)
        check_choice(self, "padding", PADDINGS)
        check_choice(self, "init", INITS)
        if self.primary_grid[0] < 1 or self.primary_grid[1] < 1:
            raise ValueError(
                f"input {self.input_height}x{self.input_width} is too small for conv1 {self.conv1_kernel}x{self.conv1_kernel} "
                f"and primary capsules {self.primary_kernel}x{self.primary_kernel}: use a larger input or smaller kernels")
        self._check_routing()  # built with the layer's sizes: the grid checked first
        if self.num_weights > MAX_WEIGHTS:
            raise ValueError(f"this CapsNetConfig would hold {self.num_weights:,} weights, more than {MAX_WEIGHTS:,} "
                             f"({MAX_WEIGHTS * 4 >> 30} GiB in float32): lower its channel, capsule or decoder sizes")

    def _check_routing(self) -> None:
        """``routing`` a registered routing a margin loss can read, and the dynamic-routing switches only with it."""
        check_choice(self, "routing", list_routings())
        if not routing_is(self.routing, "probabilities"):
            raise ValueError(f"CapsNetConfig.routing: {self.routing} routing's activations are not probabilities in "
                             f"[0, 1], and CapsNet's margin loss reads its digit capsules' activations as "
                             f"probabilities; use one of {', '.join(self.probability_routings())}, or a model built "
                             f"for it (capsnet models)")
        check_rounds(self, self.routing)  # routing_iterations, where the routing makes one pass
        for name, option in DYNAMIC_SWITCHES.items():
            if getattr(self, name) and not routing_takes(self.routing, option):
                on = " (on by default in this model)" if getattr(type(self), name) else ""
                raise ValueError(f"{type(self).__name__}.{name} is an option of dynamic routing; {self.routing} "
                                 f"routing does not take it: set it false{on} (--model-option {name}=false)")
        if not self.routing_bias and not routing_is(self.routing, "pose_bias"):
            raise ValueError(f"CapsNetConfig.routing_bias: {self.routing} routing's digit capsules have no pose bias "
                             f"to turn off (the routing takes none: pose_bias = False), so false changes nothing: "
                             f"leave it true (drop --no-routing-bias)")
        for option in self.routing_options:
            if option in ROUTING_OPTIONS_UNUSED:
                raise ValueError(f"{type(self).__name__}.routing_options: {option} changes nothing here: "
                                 f"{ROUTING_OPTIONS_UNUSED[option]}; leave it out")
            if option in ROUTING_OPTIONS_SET_ELSEWHERE:
                raise ValueError(f"CapsNetConfig.routing_options: {option} is set by "
                                 f"{ROUTING_OPTIONS_SET_ELSEWHERE[option]}, not here")
        try:  # an option the routing lacks, or a value it refuses, named now (on the meta device: no data)
            with torch.device("meta"):
                self.digit_routing()
        except ValueError as e:
            raise ValueError(f"CapsNetConfig.routing_options {self.routing_options}: {e}") from None
        except TypeError as e:  # "'>' not supported between 'str' and 'int'": a value of the wrong kind
            raise ValueError(f"CapsNetConfig.routing_options {self.routing_options}: a value of the wrong kind for "
                             f"{self.routing} routing ({e})") from None

    __hash__ = hash_as_saved  # routing_options is a dict: hash the config as saved

    @staticmethod
    def probability_routings() -> list[str]:
        """The registered routings whose activations are probabilities: those ``routing`` may name."""
        return [name for name in list_routings() if routing_is(name, "probabilities")]

    @property
    def digit_std(self) -> float:
        """The standard deviation the digit capsules' W starts from: ``digit_init_std`` (the routing's start written
        in, ``ROUTING_STARTS``), else ``init``'s (torch: 0.01; authors: 0.1, truncated at 2 standard deviations)."""
        if self.digit_init_std is not None:
            return self.digit_init_std
        return 0.1 if self.init == "authors" else 0.01

    @property
    def pose_bias(self) -> bool:
        """Whether the digit capsules have the bias on s_j: ``routing_bias``, where the routing takes one (EM
        does not)."""
        return self.routing_bias and routing_is(self.routing, "pose_bias")

    def digit_routing(self) -> nn.Module:
        """The digit capsule layer's routing module, built by name with that layer's sizes and options."""
        options = {"leaky": True} if self.leaky_routing else {}
        options |= {"detach_agreement": True} if self.detach_agreement else {}
        options |= self.routing_options
        iterations = self.routing_iterations if routing_takes(self.routing, "iterations") else None
        return create_routing(self.routing, in_caps=self.num_primary, out_caps=self.num_classes, dim=self.digit_dim,
                              iterations=iterations, **options)

    @property
    def num_weights(self) -> int:
        """The number of weights the model holds, computed from the sizes alone (checked before anything is allocated;
        the routing's own weights counted on a module built on the meta device, which holds no data)."""
        conv1 = (self.in_channels * self.conv1_kernel**2 + 1) * self.conv1_channels
        primary = (self.conv1_channels * self.primary_kernel**2 + 1) * self.primary_types * self.primary_dim
        digits = self.primary_dim * self.num_primary * self.num_classes * self.digit_dim
        digits += self.num_classes * self.digit_dim if self.pose_bias else 0
        with torch.device("meta"):
            digits += sum(p.numel() for p in self.digit_routing().parameters())
        sizes = [self.num_classes * self.digit_dim, *self.decoder_hidden, self.in_channels * self.input_height * self.input_width]
        decoder = sum((a + 1) * b for a, b in zip(sizes[:-1], sizes[1:])) if self.decoder else 0
        return conv1 + primary + digits + decoder

    @property
    def primary_grid(self) -> tuple[int, int]:
        """Height and width of the primary capsule grid (6 x 6 for MNIST)."""
        def out(n: int) -> int:
            if self.padding == "same":
                return -(-n // self.primary_stride)  # Conv1 keeps n, then ceil(n / stride)
            n = n - self.conv1_kernel + 1
            return (n - self.primary_kernel) // self.primary_stride + 1
        return out(self.input_height), out(self.input_width)

    def same_padding(self, size: tuple[int, int], kernel: int, stride: int) -> tuple[int, int, int, int]:
        """TensorFlow's SAME zero padding of a (H, W) input for ``F.pad``: (left, right, top, bottom), the odd pixel
        after (right, bottom)."""
        pads = []
        for n in reversed(size):  # F.pad takes the last dimension first
            total = max((-(-n // stride) - 1) * stride + kernel - n, 0)
            pads += [total // 2, total - total // 2]
        return tuple(pads)

    @property
    def num_primary(self) -> int:
        """Number I of primary capsules (32 * 6 * 6 = 1152 for MNIST)."""
        h, w = self.primary_grid
        return self.primary_types * h * w


@dataclass(frozen=True)
class CapsNetCifar10Config(CapsNetConfig):
    """Section 7's CIFAR-10 model, as the authors' published command trains it.

    The paper: "the same architecture as the simple model we used for MNIST
    except that there are three color channels and we used 64 different types
    of primary capsule", trained "on 24 x 24 patches of the image" with "a
    'none-of-the-above' category for the routing softmaxes" (an ensemble of 7
    such models: 10.6% test error). The authors' code (tensorflow/models,
    research/capsules) trains it with ``num_prime_capsules=64, padding=SAME,
    leaky=true, remake=false``: the none-of-the-above category is their leaky
    routing (a zero logit in every coupling softmax whose share goes nowhere,
    ``leaky_routing``), the convolutions pad SAME (24x24 -> Conv1 24x24 ->
    12x12 primary grid, 9,216 primary capsules), and there is no
    reconstruction decoder.
    """

    __hash__ = hash_as_saved  # a dataclass would make its own, which cannot hash routing_options

    input_height: int = 24
    input_width: int = 24
    in_channels: int = 3
    primary_types: int = 64
    leaky_routing: bool = True
    decoder: bool = False
    padding: str = "same"


@dataclass(frozen=True)
class CapsNetSvhnConfig(CapsNetConfig):
    """Section 7's smaller SVHN model: "We reduced the number of first convolutional layer channels to 64, the
    primary capsule layer to 16 6D-capsules with 8D final capsule layer at the end" (4.3% test error). The paper
    says nothing more; the rest is the MNIST model's (decoder included), on the 32x32x3 digits."""

    __hash__ = hash_as_saved  # a dataclass would make its own, which cannot hash routing_options

    input_height: int = 32
    input_width: int = 32
    in_channels: int = 3
    conv1_channels: int = 64
    primary_types: int = 16
    primary_dim: int = 6
    digit_dim: int = 8


class CapsNetOutput(NamedTuple):
    poses: torch.Tensor  # (B, J, D) digit capsules
    lengths: torch.Tensor  # (B, J) their lengths, the class probabilities
    reconstructions: torch.Tensor | None  # (B, C, H, W), None without decoder
    coupling: torch.Tensor  # (B, I, J) coupling coefficients of the last round

    @property
    def scores(self) -> torch.Tensor:
        """(B, J) class scores: the capsule lengths (every capsule classifier's output has ``scores``; the CNN
        baseline returns its logits as a plain tensor)."""
        return self.lengths


def mask_capsules(poses: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Keep one capsule per example, zero the others, and flatten.

    Shapes:
        poses: (B, J, D); index: (B,) class to keep
        returns: (B, J * D)
    """
    B, J, D = poses.shape
    check_integer_labels(index)  # 2.7 was truncated to class 2, True read as class 1, silently
    if tuple(index.shape) != (B,):  # one label for four images was broadcast: all four decoded from its capsule
        raise ValueError(f"index must be (B,) = ({B},), one class per example, got shape {tuple(index.shape)}")
    if index.device.type == "cpu" and eager() and len(index) and not 0 <= int(index.min()) <= int(index.max()) < J:
        # said on the CPU, where the check costs no device sync (one_hot's own error is a bare RuntimeError)
        raise ValueError(f"class labels must be in 0..{J - 1} for {J} class capsules, got values from "
                         f"{int(index.min())} to {int(index.max())}")
    keep = _one_hot(index, J, poses.dtype)  # (B, J)
    return (poses * keep.unsqueeze(-1)).reshape(B, J * D)  # (B, J*D)


class Decoder(nn.Module):
    """Section 4.1: three fully connected layers, ReLU, ReLU, sigmoid."""

    def __init__(self, in_features: int, out_shape: tuple[int, int, int], hidden: tuple[int, ...] = (512, 1024)) -> None:
        super().__init__()
        # 0 built zero-width layers (torch only warns), (28, 28) met "not enough values to unpack"
        check_count("in_features", in_features)
        if not isinstance(out_shape, (tuple, list)) or len(out_shape) != 3:
            raise ValueError(f"out_shape must be the image's (C, H, W), e.g. (1, 28, 28), got {out_shape!r}")
        for name, value in zip(("channels", "height", "width"), out_shape):
            check_count(f"out_shape's {name}", value)
        for value in hidden:
            check_count("each hidden layer's width", value)
        self.out_shape = out_shape
        sizes = [in_features, *hidden]
        layers: list[nn.Module] = []
        for a, b in zip(sizes[:-1], sizes[1:]):
            layers += [nn.Linear(a, b), nn.ReLU(inplace=True)]
        C, H, W = out_shape
        layers += [nn.Linear(sizes[-1], C * H * W), nn.Sigmoid()]
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Shapes: x: (B, J*D) masked capsules -> (B, C, H, W) in [0, 1]."""
        return self.net(x).view(x.shape[0], *self.out_shape)  # (B, C, H, W)


class CapsNet(nn.Module):
    """The three-layer CapsNet of Sabour, Frosst and Hinton, "Dynamic Routing Between Capsules" (NIPS 2017), with
    the decoder as a regulariser."""

    def __init__(self, config: CapsNetConfig = CapsNetConfig()) -> None:
        super().__init__()
        check_config(config, CapsNetConfig, type(self).__name__)
        self.config = cfg = config
        self.conv1 = nn.Conv2d(cfg.in_channels, cfg.conv1_channels, kernel_size=cfg.conv1_kernel)
        authors = cfg.init == "authors"
        self.primary = PrimaryCaps(cfg.conv1_channels, types=cfg.primary_types, dim=cfg.primary_dim,
                                   kernel_size=cfg.primary_kernel, stride=cfg.primary_stride,
                                   out_scale=1.0 / (cfg.primary_types + cfg.leaky_routing) if authors else 1.0)
        self.digits = DenseCaps(cfg.num_primary, cfg.primary_dim, cfg.num_classes, cfg.digit_dim,
                                routing=cfg.digit_routing(), bias=cfg.pose_bias)
        if not authors and cfg.digit_std != 0.01:  # DenseCaps starts W from N(0, 0.01^2)
            with torch.no_grad():
                self.digits.weight.normal_(0, cfg.digit_std)
        self.decoder = (Decoder(cfg.num_classes * cfg.digit_dim, (cfg.in_channels, cfg.input_height, cfg.input_width),
                                cfg.decoder_hidden) if cfg.decoder else None)
        if authors:
            self._authors_init()
        size = (cfg.input_height, cfg.input_width)
        self._pads = ((cfg.same_padding(size, cfg.conv1_kernel, 1), cfg.same_padding(size, cfg.primary_kernel,
                                                                                     cfg.primary_stride))
                      if cfg.padding == "same" else None)  # Conv1 keeps the size, so both pad an (H, W) input

    @torch.no_grad()
    def _authors_init(self) -> None:
        """The authors' code's start (``CapsNetConfig.init``): truncated normals (at 2 standard deviations, as
        TensorFlow's ``truncated_normal_initializer``), biases 0.1."""
        def start(weight: torch.Tensor, bias: torch.Tensor | None, std: float) -> None:
            nn.init.trunc_normal_(weight, std=std, a=-2 * std, b=2 * std)
            if bias is not None:
                bias.fill_(0.1)

        start(self.conv1.weight, self.conv1.bias, 0.05)
        start(self.primary.conv.weight, self.primary.conv.bias, 0.1)
        start(self.digits.weight, self.digits.bias, self.config.digit_std)
        for layer in [] if self.decoder is None else self.decoder.net:
            if isinstance(layer, nn.Linear):
                start(layer.weight, layer.bias, 0.1)

    def forward(self, images: torch.Tensor, labels: torch.Tensor | None = None) -> CapsNetOutput:
        """Classify, and reconstruct from the masked digit capsule.

        ``labels`` of shape (B, K) decode K capsules per image, each on its own
        (MultiMNIST, section 6: each of the two digits from its own capsule).

        Shapes:
            images: (B, C, H, W) in [0, 1]; labels: (B,), (B, K) or None
            returns: poses (B, J, D), lengths (B, J), coupling (B, I, J),
                reconstructions (B, C, H, W), or (B, K, C, H, W) for (B, K) labels, or None
        """
        cfg = self.config
        check_model_images(self, images)
        if labels is not None:
            check_decode_labels(labels, cfg.num_classes)
        u = self.primary_capsules(images)  # (B, I, 8)
        poses, lengths, coupling = self.digits(u, self._presence(u))  # (B, J, 16), (B, J), (B, I, J)
        reconstructions = None
        if self.decoder is not None:
            # Section 4.1: mask by the labels passed (training passes the true ones), else by the longest capsule.
            index = labels if labels is not None else lengths.argmax(dim=1)
            reconstructions = self.reconstruct(poses, index)
        return CapsNetOutput(poses, lengths, reconstructions, coupling)

    def primary_capsules(self, images: torch.Tensor) -> torch.Tensor:
        """Conv1 with its ReLU, then the primary capsules: what the digit capsules route.

        Shapes: images (B, C, H, W) -> (B, I, primary_dim), I ordered (type, row, column)
        """
        h = self.conv1_maps(images)  # (B, 256, 20, 20) for MNIST; (B, 256, H, W) under padding "same"
        return self.primary(h if self._pads is None else F.pad(h, self._pads[1]))

    def conv1_maps(self, images: torch.Tensor) -> torch.Tensor:
        """Conv1's feature maps as the primary capsules read them: ReLU(conv1(x)), the input padded first under
        padding "same" (what the viewer draws).

        Shapes: images (B, C, H, W) -> (B, conv1_channels, H', W')
        """
        return F.relu(self.conv1(images if self._pads is None else F.pad(images, self._pads[0])))

    @staticmethod
    def _presence(u: torch.Tensor) -> torch.Tensor:
        """The primary capsules' activations for the routing: their lengths, each capsule's probability of being
        present (section 2); EM weighs its votes by them, the other routings ignore them."""
        return u.norm(dim=-1)  # (B, I)

    def routing_view(self, images: torch.Tensor) -> RoutingView:
        """The digit capsule layer's routing, round by round, from one recorded pass (figures, the viewer)."""
        check_model_images(self, images)  # as forward: a 32x32 image met "expected lower capsules (B, 72, 8)"
        u = self.primary_capsules(images)  # (N, I, D), I ordered (type, row, column)
        r = self.digits(u, self._presence(u), record=True)
        rows, cols = self.config.primary_grid
        return RoutingView(r.rounds, u.norm(dim=-1), r.activations, (self.config.primary_types, rows, cols))

    def reconstruct(self, poses: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """Decode given digit capsules masked to ``index`` (for pose sweeps, or K capsules per image).

        Shapes: poses (B, J, D), index (B,) -> (B, C, H, W); index (B, K) -> (B, K, C, H, W)
        """
        if self.decoder is None:
            raise RuntimeError(f"this {type(self).__name__} was built with decoder=False and cannot reconstruct")
        return decode_masked(self.decoder, poses, index, (self.config.num_classes, self.config.digit_dim))


def decode_masked(decoder: nn.Module, poses: torch.Tensor, index: torch.Tensor,
                  capsules: tuple[int, int] | None = None) -> torch.Tensor:
    """The decoder's image of the capsules ``index`` picks, the others masked (section 4.1); K per image for (B, K).

    Shapes: poses (B, J, D) (``capsules`` = (J, D) where given, checked), index (B,) -> (B, C, H, W);
    index (B, K) -> (B, K, C, H, W)
    """
    if capsules is not None and (poses.dim() != 3 or tuple(poses.shape[1:]) != tuple(capsules)):
        # torch's "mat1 and mat2 shapes cannot be multiplied" from inside the decoder
        raise ValueError(f"poses must be the class capsules (B, {capsules[0]}, {capsules[1]}) (the model's "
                         f"output.poses), got {tuple(poses.shape)}")
    if index.dim() == 1:
        return decoder(mask_capsules(poses, index))
    B, J, D = poses.shape
    if index.dim() != 2 or index.shape[0] != B:
        raise ValueError(f"index must be (B,) or (B, K) with B = {B}, got {tuple(index.shape)}")
    K = index.shape[1]
    repeated = poses.unsqueeze(1).expand(B, K, J, D).reshape(B * K, J, D)  # (B*K, J, D)
    out = decoder(mask_capsules(repeated, index.reshape(B * K)))  # (B*K, C, H, W)
    return out.view(B, K, *out.shape[1:])  # (B, K, C, H, W)


def capsnet_loss(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, components: torch.Tensor | None = None,
                 *, recon_weight: float = 0.0005, progress: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Margin loss plus the scaled reconstruction loss (section 4.1), and the class scores (capsule lengths).

    ``labels`` (B,) are class indices; (B, 2) are MultiMNIST pairs: the margin
    loss takes them multi-hot, and each digit is reconstructed from its own
    capsule against its own ``components`` image (section 6), the squared
    errors summed; without components a pair has no reconstruction term.
    Labels are range-checked on the CPU only (on a GPU the check would wait
    for the device every step): the data sets check them when they load.

    Shapes: images (B, C, H, W); labels (B,) or (B, 2); components (B, 2, C, H, W) or None;
    returns loss (), scores (B, num_classes)
    """
    check_class_labels(labels, images.shape[0], getattr(getattr(model, "config", None), "num_classes", None))
    check_recon_weight(recon_weight)
    out = model(images, labels)
    pairs = labels.dim() == 2
    targets = multi_hot(labels, out.lengths.shape[1], out.lengths.dtype) if pairs else labels
    loss = margin_loss(out.lengths, targets, validate=False)
    target_images = components if pairs else images
    if out.reconstructions is not None and recon_weight > 0 and target_images is not None:
        loss = loss + reconstruction_loss(out.reconstructions, target_images, scale=recon_weight)
    return loss, out.lengths
