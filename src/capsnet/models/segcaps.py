"""SegCaps: LaLonde and Bagci, "Capsules for Object Segmentation" (2018), a capsule U-Net.

The layer list is the paper's Figure 2 and the authors' ``CapsNetR3``: a 5x5
convolution (16 channels) read as one 16D capsule type; primary capsules
(2 types x 16D, stride 2); then convolutional capsules down to 1/8 of the
input and deconvolutional capsules (kernel 4, stride 2) back up, with skip
connections that concatenate capsule types; a 1x1 segmentation capsule of
16D whose length at every pixel is the probability of the foreground. The
reconstruction regulariser: the segmentation capsules masked by the ground
truth (by the prediction when none is given) go through three 1x1
convolutions (64, 128, C channels) to the input masked by the ground truth,
scored as a sum of squared errors times ``recon_weight`` (the authors' 131.072
for a mean over 512 x 512 pixels is exactly 0.0005 per pixel, Sabour et
al.'s scale, at that size; their mean keeps its balance with the per-pixel
segmentation loss at any size, which a sum does not: at 64 x 64 theirs is
131.072 / 4,096 = 0.032 per pixel). 1,425,649 weights for one input channel
(the paper's 1.4M), whatever the image size.

Routing: 3 rounds in every capsule layer but the primary one (1 round) for
R3; for R1, as the authors' ``CapsNetR1``, 3 rounds in the five layers that
change the resolution (the two stride-2 capsule convolutions after the
primary layer and the three deconvolutions) and 1 in the others (the
primary, the stride-1 layers and seg_caps); dynamic routing applied
locally (``capsnet.layers.conv``), its softmax over the parent types and
the routing bias on, as the authors' code; both are options. ``routing``
swaps the algorithm in every capsule layer for another registered one whose
activations are its capsules' lengths as probabilities (``stack_routings``:
self-attention, one pass with a learned (T, J) prior per layer; not in the
paper).

The capsule layers are built (``capsule_stack``) and run (``walk_capsule_stack``)
by module-level functions, shared with the CapsPix2pix generator
(``capsnet.models.capspix2pix``), which is this network over a label map.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .._config import JsonConfig, check_choice, check_range, check_types, hash_as_saved
from ..layers import ConvCaps2d, ConvTransposeCaps2d
from ..layers.conv import UPSAMPLINGS, upsampled_vote_blocks
from ..losses import SEGMENTATION_LOSSES, check_recon_weight, reconstruction_loss, segmentation_loss
from ..ops import safe_norm
from ..routing import create_routing, list_routings, routing_is, routing_takes
from ..routing.dynamic import SQUASHES
from .rounds import SavedRounds, check_rounds
from .inputs import check_config, check_floating, check_nonempty, check_weights_dtype

__all__ = ["SegCapsConfig", "SegCapsR1Config", "SegCaps", "SegCapsOutput", "segmentation_model_loss", "STRIDE",
           "check_segmentation_input", "LAYER_NAMES", "capsule_stack", "capsule_stack_weights", "walk_capsule_stack",
           "CAPSULE_NORMS", "SEGCAPS_CAPSULE_NORMS", "BatchNormCapsules", "DECONV_INITS", "instance_norm_capsules",
           "stack_routings", "stack_routing",
           "check_sides", "check_stack_fields", "StackRouted", "LEVELS", "layer_scales"]

STRIDE = 8  # three stride-2 layers: an image side must be a multiple of 8 (so the skips line up)

# (name, layer, in types, in dim, out types, out dim, kernel, stride, skip concatenated to the output);
# the paper's Figure 2 / the authors' CapsNetR3
_LAYERS = (
    ("primary", "conv", 1, 16, 2, 16, 5, 2),
    ("conv_2_1", "conv", 2, 16, 4, 16, 5, 1),
    ("conv_2_2", "conv", 4, 16, 4, 32, 5, 2),
    ("conv_3_1", "conv", 4, 32, 8, 32, 5, 1),
    ("conv_3_2", "conv", 8, 32, 8, 64, 5, 2),
    ("conv_4_1", "conv", 8, 64, 8, 32, 5, 1),
    ("deconv_1_1", "deconv", 8, 32, 8, 32, 4, 2),  # + conv_3_1: 16 types
    ("deconv_1_2", "conv", 16, 32, 4, 32, 5, 1),
    ("deconv_2_1", "deconv", 4, 32, 4, 16, 4, 2),  # + conv_2_1: 8 types
    ("deconv_2_2", "conv", 8, 16, 4, 16, 5, 1),
    ("deconv_3_1", "deconv", 4, 16, 2, 16, 4, 2),  # + conv1 as one 16D type: 3 types
    ("seg_caps", "conv", 3, 16, 1, 16, 1, 1),
)
_SKIPS = {"deconv_1_1": "conv_3_1", "deconv_2_1": "conv_2_1", "deconv_3_1": "conv1"}
LAYER_NAMES = ("conv1",) + tuple(layer[0] for layer in _LAYERS)
LEVELS = (1, 2, 4, 8)  # the capsule grids' scales (the image's side over the grid's): level_widths' four entries


def widened(types: int, width: float) -> int:
    """A layer's ``types`` capsule types at ``width`` times the paper's: rounded to the nearest (halves up), at
    least 1."""
    return max(1, int(types * width + 0.5))


def layer_scales() -> dict[str, int]:
    """Each capsule layer's output grid as a fraction of the image, by name: 2 for 1/2 (``LEVELS``)."""
    scales, scale = {}, 1
    for name, kind, *_, s in _LAYERS:
        scale = scale * s if kind == "conv" else scale // s
        scales[name] = scale
    return scales


def _layers(seg_kernel: int = 1, width: float = 1.0,
            level_widths: Sequence[float] = (1.0,) * len(LEVELS)) -> tuple[tuple[Any, ...], ...]:
    """``_LAYERS`` with the last layer's (seg_caps') kernel ``seg_kernel`` (the paper's 1) and every hidden layer's
    capsule types ``width`` times the paper's, and times ``level_widths``' entry for the scale of its output grid
    (``LEVELS``: the full image, 1/2, 1/4, 1/8) (``widened``; conv1's one type and seg_caps' one stay): each
    layer's input types are then the previous layer's output types plus, after a skip, the skipped grid's."""
    out_types, last, scales = {"conv1": 1}, _LAYERS[-1][0], layer_scales()
    rows, before = [], "conv1"
    for name, kind, _, din, j, dout, k, s in _LAYERS:
        t = out_types[before] + (out_types[_SKIPS[before]] if before in _SKIPS else 0)
        j, k = (j, seg_kernel) if name == last else \
            (widened(j, width * level_widths[LEVELS.index(scales[name])]), k)
        rows.append((name, kind, t, din, j, dout, k, s))
        out_types[name], before = j, name
    return tuple(rows)


def stack_routings() -> list[str]:
    """The registered routings SegCaps' capsule layers can route by: those whose activations are probabilities and
    are their poses' lengths (the ``probabilities`` and ``length_activations`` class attributes), since the
    segmentation capsule's length is the foreground's probability (dynamic and self-attention routing today)."""
    return [name for name in list_routings()
            if routing_is(name, "probabilities") and routing_is(name, "length_activations")]


# a routing's options that capsule_stack sets from the config's own fields or the layer's sizes, never from
# routing_options; softmax and squash go only to a routing that takes them (dynamic routing)
STACK_SETS = {"iterations": "routing_iterations (--routing-iterations; primary_routing_iterations in the primary "
                            "layer, strided_routing_iterations in the other layers that change the resolution)",
              "softmax": "routing_softmax", "squash": "squash", "in_caps": "the layer's sizes",
              "out_caps": "the layer's sizes", "dim": "the layer's sizes"}


def stack_routing(routing: str, options: dict[str, Any] | None, *, types: int, parents: int, dim: int,
                  iterations: int, softmax: str = "parents", squash: str = "sabour") -> nn.Module:
    """One capsule layer's routing module, by name: over ``types`` child capsule types into ``parents`` types of
    ``dim`` dimensions at every position; ``iterations``, ``softmax`` and ``squash`` given where the routing takes
    them, then the routing's own ``options``."""
    given = {k: v for k, v in (("softmax", softmax), ("squash", squash)) if routing_takes(routing, k)}
    return create_routing(routing, in_caps=types, out_caps=parents, dim=dim,
                          iterations=iterations if routing_takes(routing, "iterations") else None,
                          **given, **(options or {}))


def capsule_stack(*, routing_iterations: int, primary_routing_iterations: int, routing_softmax: str,
                  routing_bias: bool, init_gain: float = 1.0, bias_init: float = 0.1,
                  squash: str = "sabour", routing: str = "dynamic",
                  routing_options: dict[str, Any] | None = None, seg_kernel: int = 1,
                  width: float = 1.0, deconv_init: str = "fan-in",
                  strided_routing_iterations: int | None = None,
                  level_widths: Sequence[float] = (1.0,) * len(LEVELS), upsampling: str = "deconv") -> nn.ModuleDict:
    """SegCaps' capsule layers (``_LAYERS``, primary to seg_caps), keyed by name: what SegCaps and the
    CapsPix2pix generator share. Dynamic routing (or the registered ``routing`` named, ``stack_routing``, with its
    ``routing_options``), ``primary_routing_iterations`` rounds in the primary layer, ``strided_routing_iterations``
    (where given) in the other layers that change the resolution (the stride-2 convolutions and the
    deconvolutions) and ``routing_iterations`` in the rest, its softmax over ``routing_softmax``, its ``squash`` (``SQUASHES``), a routing bias when asked
    (and the routing takes one); the last layer, seg_caps, with a ``seg_kernel`` x ``seg_kernel`` kernel (the
    paper's 1); every hidden layer with ``width`` times the paper's capsule types, and times ``level_widths``' entry
    for the scale of its grid (``_layers``); the three deconvolutional layers' votes by ``upsampling``
    (``ConvTransposeCaps2d``: the paper's transposed convolution, "resize", nearest neighbour then a convolution, or
    "subpix", a convolution to stride^2 times the votes laid out as stride x stride blocks).

    Initialisation: every layer's vote kernel He-normal; the hidden layers' (all but seg_caps) times ``init_gain``
    and their routing bias ``bias_init`` (the last layer keeps gain 1 and 0.1). The convolutional layers' fan in is
    the reference code's, K K Din; the deconvolutional ones' is ``deconv_init``'s (``DECONV_INITS``): "fan-in", the
    (K / stride)^2 Din inputs that reach each output, or "reference", the reference code's Keras fan of its
    (K, K, J Dout, Din) transposed kernel, K K J Dout (2.8-5.7 times smaller a start at the paper's sizes); under
    ``upsampling="resize"`` or ``"subpix"`` their kernel is a plain convolution's, whose fan both readings make
    K K Din.
    Without the routing bias a gain below 3 warns: the squash shortens short vectors quadratically, so from the
    He-normal start the capsules shrink to zero within a few layers and the deep layers get no gradient
    (measured: seven layers exactly zero at gain 1, none at gain 3). The ``"exp"`` squash, linear near zero,
    shrinks them only as the kernels do: it warns below gain 1 (at 0.5 the deep layers' gradients are already
    100-1000 times smaller; at gain 1 every layer gets one: tests). Self-attention routing squashes by its own exp
    squash, and from this start its gradients are dynamic routing's under the exp squash, layer for layer: it warns
    likewise."""
    applied = {"dynamic": squash, "self-attention": "exp"}.get(routing)  # the squash measured; None: not measured
    safe_gain = 3.0 if applied == "sabour" else 1.0
    if applied is not None and not routing_bias and init_gain < safe_gain:
        fate = ("shrink to zero within a few layers and the deep layers get no gradient" if applied == "sabour" else
                "shrink layer by layer and the deep layers' gradients fall 100-1000 times")
        warnings.warn(f"SegCaps' capsule layers without the routing bias at init_gain {init_gain:g}: from this start "
                      f"the capsules {fate}; set init_gain={safe_gain:g} (--model-option init_gain={safe_gain:g}) to "
                      f"train without the bias", stacklevel=3)
    caps = {}
    last = _LAYERS[-1][0]
    bias = routing_bias and routing_is(routing, "pose_bias")
    for name, kind, t, din, j, dout, k, s in _layers(seg_kernel, width, level_widths):
        iterations = (primary_routing_iterations if name == "primary" else
                      strided_routing_iterations if s != 1 and strided_routing_iterations is not None else
                      routing_iterations)
        module = stack_routing(routing, routing_options, types=t, parents=j, dim=dout, iterations=iterations,
                               softmax=routing_softmax, squash=squash)
        up = {} if kind == "conv" else {"upsampling": upsampling}
        layer = ConvCaps2d if kind == "conv" else ConvTransposeCaps2d
        caps[name] = layer(t, din, j, dout, kernel_size=k, stride=s, routing=module, bias=bias, **up)
        if kind == "deconv" and deconv_init == "reference" and upsampling == "deconv":
            with torch.no_grad():  # from sqrt(2 / ((K / S)^2 Din)) to sqrt(2 / (K K J Dout))
                caps[name].weight.mul_(math.sqrt(max((k // s) ** 2, 1) * din / (k * k * j * dout)))
        if name != last:
            with torch.no_grad():
                caps[name].weight.mul_(init_gain)
                if caps[name].bias is not None:
                    caps[name].bias.fill_(bias_init)
    return nn.ModuleDict(caps)


CAPSULE_NORMS = ("none", "instance")  # CapsPix2pixConfig.capsule_norm
SEGCAPS_CAPSULE_NORMS = CAPSULE_NORMS + ("batch",)  # SegCapsConfig.capsule_norm
DECONV_INITS = ("fan-in", "reference")  # SegCapsConfig.deconv_init (capsule_stack)


def instance_norm_capsules(x: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """Each example's grid of each capsule type centred over the positions (every pose dimension's mean over the
    grid taken away) and scaled so that its capsules' lengths have a root mean square of 1: a type whose poses do
    not vary over the grid passes zeros on. Per example, so an image's output does not depend on its batch (no
    learned scale: the next layer's vote kernels are one).

    Shapes: x (B, J, D, H, W) -> (B, J, D, H, W)."""
    centred = x - x.mean(dim=(-2, -1), keepdim=True)
    lengths_squared = centred.float().pow(2).sum(dim=2, keepdim=True)  # (B, J, 1, H, W), summed in fp32
    rms = lengths_squared.mean(dim=(3, 4), keepdim=True).add(eps).sqrt()  # (B, J, 1, 1, 1)
    return centred / rms.to(x.dtype)


class BatchNormCapsules(nn.Module):
    """``instance_norm_capsules`` over the batch: each capsule type's poses centred by their mean over the batch
    and the grid, and scaled so that their lengths have a root mean square of 1 over both; in evaluation, by running
    averages of the two (momentum ``momentum``, as ``nn.BatchNorm2d``, but of the biased mean square), so an image's
    output then does not depend on its batch. No learned scale, as the instance norm. Under torchrun each process
    takes its own batch's statistics (DistributedDataParallel then hands every process rank 0's averages).

    Shapes: x (B, J, D, H, W) -> (B, J, D, H, W), J = ``types``, D = ``dims``."""

    def __init__(self, types: int, dims: int, momentum: float = 0.1, eps: float = 1e-5) -> None:
        super().__init__()
        self.momentum, self.eps = momentum, eps
        self.register_buffer("running_mean", torch.zeros(types, dims))  # (J, D)
        self.register_buffer("running_square", torch.ones(types))  # (J,): the centred lengths' mean square

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and x.shape[0]:  # (an empty batch's NaN statistics would stay in the averages)
            wide = x.to(torch.promote_types(x.dtype, torch.float32))  # bf16 summed in fp32
            mean = wide.mean(dim=(0, 3, 4))  # (J, D)
            square = (wide - mean[:, :, None, None]).pow(2).sum(dim=2).mean(dim=(0, 2, 3))  # (J,)
            with torch.no_grad():
                self.running_mean.lerp_(mean.detach().to(self.running_mean.dtype), self.momentum)
                self.running_square.lerp_(square.detach().to(self.running_square.dtype), self.momentum)
        else:
            mean, square = self.running_mean, self.running_square
        scale = square.add(self.eps).rsqrt()  # (J,)
        return ((x - mean[:, :, None, None].to(x.dtype)) * scale[:, None, None, None].to(x.dtype))

    def extra_repr(self) -> str:
        return f"{self.running_mean.shape[0]}, {self.running_mean.shape[1]}, momentum={self.momentum}"


def check_sides(cfg: Any, multiple: int, why: str = "") -> None:
    """``cfg.input_height`` and ``cfg.input_width`` in ``multiple``..8192 and multiples of ``multiple``, or a
    ValueError naming the field (and ``why``)."""
    for name in ("input_height", "input_width"):
        check_range(cfg, name, multiple, 8192)
        side = getattr(cfg, name)
        if side % multiple:  # side >= multiple (checked above), so cropping is possible too
            down, up = side // multiple * multiple, side // multiple * multiple + multiple
            raise ValueError(f"{type(cfg).__name__}.{name} must be a multiple of {multiple}"
                             f"{f' ({why})' if why else ''}, got {side}: pad the images to {up} or crop them to "
                             f"{down}")


def check_capsule_norm_grid(cfg: Any) -> None:
    """``capsule_norm="instance"`` centres each layer over its grid: a grid of one position (the 1/8 grid of an 8-pixel
    side) would be all zeros, whatever the image (the config was taken, and three layers carried nothing)."""
    if cfg.capsule_norm == "instance" and max(cfg.input_height, cfg.input_width) <= STRIDE:
        raise ValueError(f"{type(cfg).__name__}.capsule_norm='instance' centres every capsule layer over its grid, and "
                         f"at {cfg.input_height}x{cfg.input_width} the deepest grid is a single position, all zeros "
                         f"after centring: give a side of at least {2 * STRIDE}, or capsule_norm='none'")


def check_stack_fields(cfg: Any) -> None:
    """The fields a config hands to ``capsule_stack`` (SegCaps', CapsPix2pix's): a ValueError naming the first
    out of range or not one of its choices."""
    check_range(cfg, "routing_iterations", 1, 100)
    check_range(cfg, "primary_routing_iterations", 1, 100)
    check_range(cfg, "init_gain", 1e-3, 100)
    check_range(cfg, "bias_init", -10, 10)
    object.__setattr__(cfg, "level_widths", tuple(cfg.level_widths))  # a list from JSON or the command line
    if len(cfg.level_widths) != len(LEVELS):
        raise ValueError(f"{type(cfg).__name__}.level_widths must be {len(LEVELS)} numbers, the capsule types' "
                         f"factors at the full image, 1/2, 1/4 and 1/8 of it, got {list(cfg.level_widths)}: e.g. "
                         f"level_widths=[1,2,1.5,0.5]")
    check_range(cfg, "level_widths", 0.25, 8)
    if cfg.routing_softmax not in ("parents", "children"):
        raise ValueError(f"{type(cfg).__name__}.routing_softmax must be 'parents' or 'children', got "
                         f"{cfg.routing_softmax!r}")
    check_choice(cfg, "squash", SQUASHES)
    check_choice(cfg, "upsampling", UPSAMPLINGS)
    _check_stack_routing(cfg)


def _check_stack_routing(cfg: Any) -> None:
    """``cfg.routing`` (where the config has one) one of ``stack_routings``, dynamic routing's fields left at their
    defaults under another, and ``cfg.routing_options`` options the routing takes: a ValueError naming the field."""
    routing, options = getattr(cfg, "routing", "dynamic"), getattr(cfg, "routing_options", {})
    kind = type(cfg).__name__
    if routing not in list_routings():
        raise ValueError(f"{kind}.routing must be one of {', '.join(stack_routings())}, got {routing!r}")
    if routing not in stack_routings():
        why = getattr(cfg, "_STACK_LENGTHS", "the segmentation capsule's length is the foreground's probability")
        raise ValueError(f"{kind}.routing: {routing} routing's activations are not its capsules' lengths as "
                         f"probabilities, and {why}; use one of {', '.join(stack_routings())}")
    for name, option, default in (("routing_softmax", "softmax", "parents"), ("squash", "squash", "sabour")):
        if getattr(cfg, name) != default and not routing_takes(routing, option):
            raise ValueError(f"{kind}.{name} is an option of dynamic routing; {routing} routing does not take it: "
                             f"leave it at {default!r}")
    check_rounds(cfg, routing)  # rounds a one-pass routing would ignore
    for option in options:  # softmax and squash where the routing takes them (else it names them below)
        if option == "iterations" and not routing_takes(routing, option):
            raise ValueError(f"{kind}.routing_options: {routing} routing makes one pass and takes no iterations")
        if option in STACK_SETS and (option not in ("softmax", "squash") or routing_takes(routing, option)):
            raise ValueError(f"{kind}.routing_options: {option} is set by {STACK_SETS[option]}, not here")
    try:  # an option the routing lacks, or a value it refuses, named now (on the meta device: no data)
        with torch.device("meta"):
            stack_routing(routing, options, types=1, parents=1, dim=16, iterations=1)
    except ValueError as e:
        raise ValueError(f"{kind}.routing_options {options}: {e}") from None
    except TypeError as e:  # a value of the wrong kind
        raise ValueError(f"{kind}.routing_options {options}: a value of the wrong kind for {routing} routing "
                         f"({e})") from None


def capsule_stack_weights(routing_bias: bool, routing: str = "dynamic",
                          routing_options: dict[str, Any] | None = None, seg_kernel: int = 1,
                          width: float = 1.0, level_widths: Sequence[float] = (1.0,) * len(LEVELS),
                          upsampling: str = "deconv") -> int:
    """The number of weights ``capsule_stack`` holds: a K x K x Din x (J Dout) vote kernel per layer (stride^2
    times that in a deconvolution under ``upsampling="subpix"``), plus the routing bias J x Dout where the routing
    takes one, plus the routing's own weights (self-attention's prior, counted on modules built on the meta device);
    independent of the image size."""
    bias = routing_bias and routing_is(routing, "pose_bias")
    layers = _layers(seg_kernel, width, level_widths)
    n = sum(k * k * din * j * dout * (upsampled_vote_blocks(upsampling, s) if kind == "deconv" else 1)
            + (j * dout if bias else 0) for _, kind, _, din, j, dout, k, s in layers)
    with torch.device("meta"):
        n += sum(p.numel() for _, _, t, _, j, dout, _, _ in layers
                 for p in stack_routing(routing, routing_options, types=t, parents=j, dim=dout,
                                        iterations=1).parameters())
    return n


def walk_capsule_stack(caps: nn.ModuleDict, conv1: torch.Tensor,
                       between: Callable[[torch.Tensor], torch.Tensor] | None = None, *,
                       between_conv1_skip: bool = False, norms: nn.ModuleDict | None = None
                       ) -> dict[str, torch.Tensor]:
    """Run ``conv1``, the first grid, through the layers of ``capsule_stack``; every layer's grid, in order.

    The skips stack capsule types: deconv_1_1's output with conv_3_1's, deconv_2_1's with conv_2_1's,
    deconv_3_1's with conv1's. ``between`` (CapsPix2pix's dropout) is applied to every layer's grid but the
    last before it goes on, the skips included; the grids returned are the ones that went on. With
    ``between_conv1_skip`` it is applied to conv1's copy in the last skip as well (conv1 itself goes on whole).
    ``norms`` (SegCaps' ``capsule_norm="batch"``) holds a module for every layer but the last, applied to its grid
    before ``between``.

    Shapes:
        conv1: (B, 1, 16, H, W), H and W multiples of 8
        returns: {"conv1": (B, 1, 16, H, W), "primary": (B, 2, 16, H/2, W/2), ..., "seg_caps": (B, 1, 16, H, W)}
    """
    grids = {"conv1": conv1}
    x = conv1
    last = next(reversed(caps.keys()))
    # the skip's copy of conv1 (the primary layer still reads conv1 whole)
    conv1_skip = between(conv1) if between is not None and between_conv1_skip else conv1
    for name, layer in caps.items():
        x = layer(x)  # (B, J, D, H', W')
        if norms is not None and name != last:
            x = norms[name](x)  # (B, J, D, H', W')
        if between is not None and name != last:
            x = between(x)  # (B, J, D, H', W')
        grids[name] = x
        if name in _SKIPS:
            skip = conv1_skip if _SKIPS[name] == "conv1" else grids[_SKIPS[name]]
            x = torch.cat([x, skip], dim=1)  # (B, J + T_skip, D, H', W'): capsule types stacked
    return grids


def check_segmentation_input(images: torch.Tensor, cfg: Any, multiple: int = STRIDE, why: str | None = None) -> None:
    """A ValueError that names the fix when ``images`` are not (B, in_channels, H, W) with sides multiples of
    ``multiple`` (SegCaps: 8, its three halvings); ``why`` says where the multiple comes from (default: that many
    halvings)."""
    if images.dim() != 4 or images.shape[1] != cfg.in_channels:
        got = tuple(images.shape)
        raise ValueError(f"expected images (B, {cfg.in_channels}, H, W) for a model trained on {cfg.in_channels}-channel "
                         f"images, got {got}" + ("" if images.dim() != 4 else
                                                 f" ({images.shape[1]} channels): convert them or train a model "
                                                 f"with in_channels {images.shape[1]}"))
    check_floating(images)
    H, W = images.shape[-2:]
    m = multiple
    if H % m or W % m:
        why = why or f"the network halves them {m.bit_length() - 1} times"
        raise ValueError(f"image sides must be multiples of {m} ({why}), got {H}x{W}: {sides_fix(H, W, m)}")


def sides_fix(H: int, W: int, m: int) -> str:
    """How to bring an HxW image to sides that are multiples of ``m``: pad, or crop where cropping leaves a side."""
    up = f"{-(-H // m) * m}x{-(-W // m) * m}"
    return f"pad or crop them to {up} or {H // m * m}x{W // m * m}" if H >= m and W >= m else f"pad them to {up}"


class StackRouted(SavedRounds):
    """What the configs of a capsule stack's owners (SegCaps, CapsPix2pix) share for its ``routing``: the routings it
    may name, and rounds a one-pass routing never used read back at their defaults (``models.rounds``)."""

    @staticmethod
    def probability_routings() -> list[str]:
        """The registered routings ``routing`` may name (``stack_routings``; CapsNetConfig's hook of this name)."""
        return stack_routings()


@dataclass(frozen=True)
class SegCapsConfig(StackRouted, JsonConfig):
    """SegCaps R3; the architecture's defaults are the paper's (1,425,649 weights for one input channel); the loss,
    ``seg_loss``, is not (the paper trains a weighted BCE)."""

    input_height: int = 64
    input_width: int = 64
    in_channels: int = 1
    num_classes: int = 1  # one foreground class against the background (the paper's task)
    routing_iterations: int = 3  # R3: every capsule layer but the primary one (the authors' CapsNetR3)
    primary_routing_iterations: int = 1  # the rounds in the primary capsule layer (the paper's: 1)
    strided_routing_iterations: int | None = None  # the rounds in the five layers after the primary one that change
    # the resolution (conv_2_2, conv_3_2 and the three deconvolutions); null: routing_iterations (R3 routes 3 rounds
    # in them as in every layer but the primary one; R1, 3 where its other layers route 1)
    routing_softmax: str = "parents"  # over the parent types, as the authors' code and Procedure 1; or "children"
    routing_bias: bool = True  # the authors' code: a learned bias per parent type, initialised to 0.1
    reconstruction: bool = True  # the masked-input reconstruction regulariser (section 3.3)
    seg_loss: str = "bce+dice"  # capsnet.losses.SEGMENTATION_LOSSES; the paper trains a weighted BCE, its code
    # also a margin loss (weighted-margin, margin)
    init_gain: float = 1.0  # the hidden capsule layers' He-normal vote kernels times this (capsule_stack)
    bias_init: float = 0.1  # the hidden capsule layers' routing bias at the start (the reference code's 0.1)
    squash: str = "sabour"  # every capsule layer's squash (routing.dynamic.SQUASHES): the paper's Eq. 1, or "exp"
    capsule_norm: str = "none"  # "instance": every capsule layer's output but the last centred over the grid and
    # scaled to capsules of unit length (RMS) per example and type before it goes on (instance_norm_capsules; not in
    # the paper); "batch": the same over the batch and the grid, running averages in evaluation (BatchNormCapsules)
    routing: str = "dynamic"  # every capsule layer's routing: the paper's, or another registered one whose
    # activations are its capsules' lengths as probabilities (stack_routings: self-attention, one pass with a learned
    # prior per layer; not in the paper)
    routing_options: dict[str, Any] = field(default_factory=dict)  # the routing's own options by name (never the
    # layer's sizes, iterations, softmax or squash: STACK_SETS)
    seg_kernel: int = 1  # the segmentation capsule layer's kernel side, odd: the paper's 1 (each pixel's capsule from
    # its own position's; 3 or 5 make its votes from its neighbours' too at full resolution; not in the paper)
    width: float = 1.0  # every hidden capsule layer's types times this, rounded (the paper's 2-8 types at 1; the
    # weights and the step's cost grow about as width and width squared; not in the paper)
    level_widths: tuple[float, ...] = (1.0, 1.0, 1.0, 1.0)  # the hidden capsule layers' types (after width) times
    # these by the scale of their grid: the full image, 1/2, 1/4, 1/8 (LEVELS; deconv_3_1, then primary, conv_2_1,
    # deconv_2_1, deconv_2_2, then conv_2_2, conv_3_1, deconv_1_1, deconv_1_2, then conv_3_2, conv_4_1), to move
    # types between the scales; not in the paper
    deconv_init: str = "fan-in"  # the three deconvolutional capsule layers' He-normal fan (capsule_stack): "fan-in",
    # the inputs that reach each output, or "reference", the reference code's Keras fan (2.8-5.7x smaller a start)
    upsampling: str = "deconv"  # the three deconvolutional capsule layers' votes (layers.conv.UPSAMPLINGS): the
    # paper's transposed convolution, "resize" (the reference code's other upsamp_type: nearest neighbour, then
    # a 4x4 convolution; no checkerboard; the same weights) or "subpix" (its third: a 4x4 convolution to 4 times
    # the votes, laid out as 2x2 blocks; 1,941,745 weights)

    def __post_init__(self) -> None:
        check_types(self)
        check_sides(self, STRIDE, "the network halves the image three times")
        check_range(self, "seg_kernel", 1, 9)
        check_range(self, "width", 0.5, 8)
        if self.seg_kernel % 2 == 0:
            raise ValueError(f"{type(self).__name__}.seg_kernel must be odd (its 'same' padding keeps the mask on the "
                             f"image's pixels), got {self.seg_kernel}: use {self.seg_kernel - 1} or "
                             f"{self.seg_kernel + 1}")
        check_range(self, "in_channels", 1, 64)
        if self.strided_routing_iterations is not None:
            check_range(self, "strided_routing_iterations", 1, 100)
        check_range(self, "num_classes", 1, 1)
        check_stack_fields(self)
        check_choice(self, "seg_loss", SEGMENTATION_LOSSES)
        check_choice(self, "capsule_norm", SEGCAPS_CAPSULE_NORMS)
        check_capsule_norm_grid(self)
        check_choice(self, "deconv_init", DECONV_INITS)
        object.__setattr__(self, "routing_options", dict(self.routing_options))  # its own copy, not the caller's

    __hash__ = hash_as_saved  # routing_options is a dict: hash the config as saved

    @property
    def num_weights(self) -> int:
        """The number of weights the model holds, from the sizes alone (independent of the image size)."""
        n = (self.in_channels * 25 + 1) * 16 + capsule_stack_weights(self.routing_bias, self.routing,
                                                                     self.routing_options,
                                                                     self.seg_kernel, self.width,
                                                                     self.level_widths, self.upsampling)  # conv1, caps
        if self.reconstruction:
            n += (16 + 1) * 64 + (64 + 1) * 128 + (128 + 1) * self.in_channels
        return n


@dataclass(frozen=True)
class SegCapsR1Config(SegCapsConfig):
    """SegCaps R1, the paper's faster variant, as the authors' ``CapsNetR1``: one routing round in every capsule
    layer but the five after the primary one that change the resolution, which route 3 (a run saved before
    2026-11-30 routed one round everywhere, and reads back so)."""

    routing_iterations: int = 1  # R1: one round in the primary, the stride-1 layers and seg_caps (CapsNetR1)
    strided_routing_iterations: int | None = 3  # R1: 3 rounds in conv_2_2, conv_3_2 and the deconvolutions (CapsNetR1)

    _SAVED_BEFORE = {"strided_routing_iterations": 1}  # runs saved before the field existed routed 1 round there

    __hash__ = hash_as_saved  # a frozen dataclass writes its own field-tuple hash, which a dict defeats


class SegCapsOutput(NamedTuple):
    probabilities: torch.Tensor  # (B, 1, H, W): the segmentation capsule's length at every pixel
    poses: torch.Tensor  # (B, 1, 16, H, W): the segmentation capsules
    reconstructions: torch.Tensor | None  # (B, C, H, W) in [0, 1], or None without the regulariser


class SegCaps(nn.Module):
    """SegCaps (LaLonde and Bagci, "Capsules for Object Segmentation", 2018): images in, a foreground probability per pixel out (see the module docstring)."""

    def __init__(self, config: SegCapsConfig = SegCapsConfig()) -> None:
        super().__init__()
        check_config(config, SegCapsConfig, type(self).__name__)
        self.config = cfg = config
        self.conv1 = nn.Conv2d(cfg.in_channels, 16, 5, padding=2)
        self.caps = capsule_stack(routing_iterations=cfg.routing_iterations,
                                  primary_routing_iterations=cfg.primary_routing_iterations,
                                  routing_softmax=cfg.routing_softmax, routing_bias=cfg.routing_bias,
                                  init_gain=cfg.init_gain, bias_init=cfg.bias_init, squash=cfg.squash,
                                  routing=cfg.routing, routing_options=cfg.routing_options,
                                  seg_kernel=cfg.seg_kernel, width=cfg.width, deconv_init=cfg.deconv_init,
                                  strided_routing_iterations=cfg.strided_routing_iterations,
                                  level_widths=cfg.level_widths, upsampling=cfg.upsampling)
        self.decoder = nn.Sequential(nn.Conv2d(16, 64, 1), nn.ReLU(), nn.Conv2d(64, 128, 1), nn.ReLU(),
                                     nn.Conv2d(128, cfg.in_channels, 1), nn.Sigmoid()) if cfg.reconstruction else None
        last = next(reversed(self.caps.keys()))
        self.capsule_norms = nn.ModuleDict({name: BatchNormCapsules(layer.out_types, layer.out_dim)
                                            for name, layer in self.caps.items()
                                            if name != last}) if cfg.capsule_norm == "batch" else None

    side_multiple = STRIDE  # what an image's height and width must be multiples of (three stride-2 layers)

    def capsule_grids(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every layer's capsule grid, in order: {"conv1": (B, 1, 16, H, W), "primary": (B, 2, 16, H/2, W/2), ...,
        "seg_caps": (B, 1, 16, H, W)} (the skip concatenations are not layers)."""
        check_segmentation_input(images, self.config)
        check_weights_dtype(images, self)
        conv1 = F.relu(self.conv1(images)).unsqueeze(1)  # (B, 1, 16, H, W): one 16D capsule type
        between = instance_norm_capsules if self.config.capsule_norm == "instance" else None
        return walk_capsule_stack(self.caps, conv1, between, norms=self.capsule_norms)

    def forward(self, images: torch.Tensor, masks: torch.Tensor | None = None) -> SegCapsOutput:
        """Shapes:
            images: (B, C, H, W) in [0, 1], H and W multiples of 8
            masks: (B, 1, H, W) 0/1 ground truth (masks the reconstruction in training), or None: the prediction
            returns: probabilities (B, 1, H, W), poses (B, 1, 16, H, W), reconstructions (B, C, H, W) or None
        """
        if masks is not None and (masks.dim() != 4 or masks.shape[1] != 1 or masks.shape[0] != images.shape[0]
                                  or masks.shape[-2:] != images.shape[-2:]):  # broadcast over the 16 pose entries,
            # or over the batch, it masked the reconstruction wrongly and silently (a (B, H, W) mask at B = 16)
            raise ValueError(f"masks must be (B, 1, H, W) = ({images.shape[0]}, 1, {images.shape[-2]}, "
                             f"{images.shape[-1]}), one per image, got {tuple(masks.shape)}")
        return self.forward_with_grids(images, masks)[0]

    def forward_with_grids(self, images: torch.Tensor, masks: torch.Tensor | None = None
                           ) -> tuple[SegCapsOutput, dict[str, torch.Tensor]]:
        """``forward``'s output and ``capsule_grids``' layers from one pass (the viewer shows both: two passes took
        twice the time). Shapes as the two."""
        grids = self.capsule_grids(images)
        poses = grids["seg_caps"]  # (B, 1, 16, H, W)
        # (B, 1, H, W), in float32 whatever the poses' dtype: float16 rounds a probability near 1 in steps of 5e-4,
        # which the cross-entropy of a sure pixel, -log(1 - p), magnifies (the shipped model's loss 4.9% off)
        probabilities = safe_norm(poses.to(torch.promote_types(poses.dtype, torch.float32)), dim=2)  # float64 kept
        recon = None
        if self.decoder is not None:
            keep = (probabilities.detach() > 0.5) if masks is None else masks
            recon = self.decoder(poses[:, 0] * keep.to(poses.dtype))  # (B, C, H, W)
        return SegCapsOutput(probabilities, poses, recon), grids


def segmentation_model_loss(model: nn.Module, images: torch.Tensor, masks: torch.Tensor,
                            components: torch.Tensor | None = None, *, recon_weight: float = 0.0005,
                            progress: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The segmentation models' training loss and their per-pixel probabilities (the registry's loss signature).

    The model's ``seg_loss`` on its probabilities (from logits when it gives
    them: a CNN), plus, for a model with a reconstruction, ``recon_weight``
    times the sum of squared errors between the reconstruction (from the
    capsules masked by the ground truth) and the input masked by the ground
    truth, averaged over the batch. ``components`` and ``progress`` are
    accepted for the shared signature and unused.

    Shapes: images (B, C, H, W); masks (B, 1, H, W) 0/1; returns loss (), probabilities (B, 1, H, W)
    """
    if masks.dim() != 4 or masks.shape[1] != 1 or masks.shape[-2:] != images.shape[-2:] \
            or masks.shape[0] != images.shape[0]:
        raise ValueError(f"a segmentation model trains on masks (B, 1, H, W) matching the images "
                         f"{tuple(images.shape)}, got labels {tuple(masks.shape)}: use a segmentation data set")
    check_nonempty(images.shape[0])
    check_recon_weight(recon_weight)
    m = masks.to(images.dtype)
    out = model(images, m)
    logits = getattr(out, "logits", None)
    loss = segmentation_loss(out.probabilities, m, model.config.seg_loss, logits=logits)
    recon = getattr(out, "reconstructions", None)
    if recon is not None and recon_weight:
        # summed in float32 (a float16 sum over 512 x 512 pixels overflowed)
        loss = loss + reconstruction_loss(recon, images * m, scale=recon_weight)
    return loss, out.probabilities
