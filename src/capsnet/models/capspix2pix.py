"""CapsPix2pix: Bass et al., "Image synthesis with a convolutional capsule generative adversarial network" (MIDL 2019).

A conditional GAN that turns a label map (a segmentation) into an image.
The generator is SegCaps R3 (``capsnet.models.segcaps``, the same capsule
layers, built and walked by the same code) over the label map plus one noise
channel: z (B, noise_dim) goes through a linear layer to an H x W map
concatenated with the label map (the reference code's default
``noise_source='input'``); conv1 (5x5, 16 channels, LeakyReLU 0.01) is read
as one 16D capsule type; 2D dropout drops whole capsule types after every
capsule layer but the last, in training (the reference code's ``Dropout2d``
on the 5-D grid); a 1x1 convolution of the final capsule's 16 pose channels
and a sigmoid make the image (from the pose, not the capsule length). The
discriminator is the reference code's DCGAN one over the image and the label
map stacked. Losses: D's BCE against two-sided smoothed labels (0.9 real,
0.1 fake, the reference code's) halved as pix2pix; G's BCE against 1 plus
``l1_weight`` times the mean absolute error.

Where we differ from the reference code (commit 018c8d8): routing is this
library's dynamic routing (``capsnet.layers.conv``): logits per example
(the reference code averages them over the batch), the softmax over the
parent types with a routing bias (the reference code normalises over the
child types, adds a convolution bias to the votes instead, and routes 3
rounds in the primary layer too; ``routing_softmax="children"`` is its
normalisation); the capsule layers' vote kernels start as SegCaps' here
(He-normal), where the reference code's DCGAN start gives them N(0, 0.02);
``l1_weight`` defaults to pix2pix's 100 so both models of the
comparison share it (the reference code's ``lambda_L1`` is 1); the 1x1 image
convolution starts at N(0, 10), not DCGAN's N(0, 0.02) that the reference
code gives every convolution (``image_init_std``): the final pose is squashed
to a length below 1, so at 0.02 every logit sits within about 0.1 of the
bias, every pixel near 0.5, and Adam needs thousands of steps to grow the
weights to where a pixel can be black (87% of an MNIST target's pixels are
below 0.05). In 375-step probes on MNIST skeletons at Adam 2e-4, N(0, 10)
gave L1 0.039 and SSIM 0.74 where 0.02 gave 0.387 and 0.01 (grey images;
0.150 and 0.40 at 1e-3)
(docs/results.md, "CapsPix2pix's image convolution at the start"). The
discriminator is the reference's exactly at 64 x 64; for other sizes it halves
the map while its smaller side is at least 8, and averages the 4x4 head's
logits over the positions left (one position for a square power of two).
``discriminator="patch"`` swaps it for pix2pix's PatchGAN (``patch_layers``
stride-2 layers), the baseline's discriminator, so a comparison with pix2pix
can differ in the generator alone. ``capsule_norm="instance"`` is SegCaps'
per-example capsule normalisation (not in the paper) in the generator.
Smaller departures: the stride-2 capsule layers pad as SegCaps' code
(TensorFlow's "same": one row and column before, two after), where the
reference's ``padding=2`` pads two on each side, so its grid samples the
input one pixel up and left of this one's; the discriminator's loss is
halved (pix2pix's), the reference's ``errD`` is not (Adam takes out a
constant scale, but for its epsilon); ``init_gan_weights`` zeroes the
plain convolutions' biases, which the reference's ``weights_init`` leaves
at PyTorch's default; and the learning rate follows capsnet's schedule
(``--lr-decay 0.96`` every ``--lr-decay-steps 2000`` by default; every
synthesis run recorded here used it), where the reference's anneals
linearly to 0.88 of 2e-4 over its 50 epochs (``--lr-decay 1`` keeps it
constant).

``ConditionalGAN``, what this model and pix2pix (``capsnet.models.pix2pix``)
share, is here too: the noise, seeded generation, the two losses.
"""
from __future__ import annotations

import contextlib
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from .._config import JsonConfig, MAX_WEIGHTS, check_choice, check_range, check_types, hash_as_saved
from .segcaps import (CAPSULE_NORMS, STRIDE, capsule_stack, capsule_stack_weights, check_capsule_norm_grid,
                      check_sides, check_stack_fields, sides_fix, StackRouted, instance_norm_capsules,
                      walk_capsule_stack)
from .inputs import check_config, check_floating, check_nonempty, check_weights_dtype

__all__ = ["CapsPix2pixConfig", "CapsPix2pixDeepConfig", "CapsPix2pixGenerator", "ConditionalDiscriminator", "CapsPix2pix", "ConditionalGAN",
           "GAN_LR", "synthesis_losses", "check_label_maps", "check_image_pairs", "init_gan_weights", "check_gan_fields",
           "truncate_normal", "check_truncation", "check_patch_layers"]


def check_label_maps(labels: torch.Tensor, cfg: Any, *, exact: bool, multiple: int = STRIDE) -> None:
    """A ValueError that names the fix unless ``labels`` are (B, cfg.in_channels, H, W) with H x W the config's
    size (``exact``) or sides multiples of ``multiple``."""
    if labels.dim() != 4 or labels.shape[1] != cfg.in_channels:
        got = tuple(labels.shape)
        raise ValueError(f"expected label maps (B, {cfg.in_channels}, H, W) for a model of {cfg.in_channels}-channel "
                         f"label maps, got {got}" + ("" if labels.dim() != 4 else
                                                     f" ({labels.shape[1]} channels): convert them or build the "
                                                     f"model with in_channels {labels.shape[1]}"))
    check_floating(labels, "label maps")
    H, W = labels.shape[-2:]
    h, w = cfg.input_height, cfg.input_width
    if exact and (H, W) != (h, w):
        raise ValueError(f"expected {h}x{w} label maps (the noise layer makes one {h}x{w} map), got {H}x{W}: resize "
                         f"or crop them to {h}x{w}, or build the model with input_height {H} and input_width {W}")
    if H % multiple or W % multiple:
        raise ValueError(f"label map sides must be multiples of {multiple} (the generator halves them), got {H}x{W}: "
                         f"{sides_fix(H, W, multiple)}")


def check_image_pairs(images: torch.Tensor, labels: torch.Tensor, cfg: Any) -> None:
    """A ValueError unless ``images`` are (B, cfg.out_channels, H, W) with the batch and size of ``labels``."""
    want = (labels.shape[0], cfg.out_channels, *labels.shape[-2:])
    if tuple(images.shape) != want:
        raise ValueError(f"expected images (B, {cfg.out_channels}, H, W) paired with the label maps, here "
                         f"{want}, got {tuple(images.shape)}: give one {cfg.out_channels}-channel image per label map, "
                         f"of its size")


def check_gan_fields(cfg: Any) -> None:
    """The fields both GAN configs share: dropout, the L1 weight, the smoothed labels and Adam's betas."""
    if not 0 <= cfg.dropout < 1:
        raise ValueError(f"{type(cfg).__name__}.dropout must be in 0..1 (1 excluded), got {cfg.dropout!r}")
    check_range(cfg, "l1_weight", 0, 1e6)
    for name in ("real_label", "fake_label"):
        check_range(cfg, name, 0, 1)
    if cfg.real_label <= cfg.fake_label:  # equal: no signal for the discriminator; swapped: the objective inverted
        raise ValueError(f"{type(cfg).__name__}.real_label ({cfg.real_label!r}) must be above fake_label "
                         f"({cfg.fake_label!r}): the discriminator learns to tell real (high) from fake (low)")
    for name in ("beta1", "beta2"):
        if not 0 <= getattr(cfg, name) < 1:
            raise ValueError(f"{type(cfg).__name__}.{name} must be in 0..1 (1 excluded), got {getattr(cfg, name)!r}")
    if cfg.num_weights > MAX_WEIGHTS:
        raise ValueError(f"this {type(cfg).__name__} would hold {cfg.num_weights:,} weights, more than "
                         f"{MAX_WEIGHTS:,}: use smaller images or fewer channels")


def check_patch_layers(cfg: Any, name: str) -> None:
    """``cfg.name``, a PatchGAN's stride-2 layers, in 1..8 and few enough for the image: each halves the map and the
    two 4x4 convolutions after them need at least 3 positions, so sides of at least 3 << layers; else a ValueError
    naming the most layers that fit."""
    check_range(cfg, name, 1, 8)
    layers, side = getattr(cfg, name), min(cfg.input_height, cfg.input_width)
    if side >> layers < 3:
        from ..image_metrics import SSIM_WINDOW

        fit = max(n for n in range(1, 9) if side >> n >= 3)  # side >= 8: 1 at least
        least = -(-SSIM_WINDOW // 8) * 8  # 16: the networks take multiples of 8
        # below the SSIM window the GAN loop refuses the data next, whatever the layers (a review, 2026-12-01)
        fix = f"use images of at least {least}x{least} (training scores SSIM, whose {SSIM_WINDOW}x{SSIM_WINDOW} " \
              f"window needs them)" if side < SSIM_WINDOW else f"use larger images or --model-option {name}={fit}"
        raise ValueError(f"a PatchGAN of {name} {layers} needs sides of at least {3 << layers}, got "
                         f"{cfg.input_height}x{cfg.input_width}: {fix}")


def init_gan_weights(module: nn.Module) -> None:
    """DCGAN's and pix2pix's initialisation (the reference code's ``weights_init``): plain convolutions N(0, 0.02)
    with zero bias (the reference leaves their biases at PyTorch's default), batch-norm scales N(1, 0.02) and
    shifts 0. Capsule layers and linear layers keep their own."""
    for m in module.modules():
        if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)):
            nn.init.normal_(m.weight, 0.0, 0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.normal_(m.weight, 1.0, 0.02)
            nn.init.zeros_(m.bias)


@contextlib.contextmanager
def _seeded(seed: int, device: torch.device) -> Iterator[None]:
    """Torch's RNGs (the CPU's, and every CUDA device's when on CUDA) seeded with ``seed``, restored after."""
    devices = list(range(torch.cuda.device_count())) if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.random.default_generator.manual_seed(seed)
        if devices:
            torch.cuda.manual_seed_all(seed)
        yield


def _bce(logits: torch.Tensor, target: float) -> torch.Tensor:
    """BCE with logits against a constant target, the mean over every logit (per image, or per patch)."""
    return F.binary_cross_entropy_with_logits(logits, torch.full_like(logits, target))


def check_truncation(truncation: float) -> float:
    """``truncation`` as a float, refused unless a finite real number at least 0."""
    if isinstance(truncation, bool) or not isinstance(truncation, numbers.Real) \
            or not math.isfinite(truncation) or truncation < 0:
        raise ValueError(f"truncation must be a finite number >= 0 (the noise's values are cut to [-t, t]; 0 gives "
                         f"the noise's mean, larger values approach the untruncated normal), got {truncation!r}")
    return float(truncation)


def truncate_normal(z: torch.Tensor, truncation: float) -> torch.Tensor:
    """Standard normal values ``z`` mapped to the standard normal truncated to [-t, t], t = ``truncation``, by
    matching their CDFs: F_t^-1(Phi(z)), F_t^-1(p) = Phi^-1(Phi(-t) + p (Phi(t) - Phi(-t))). Monotone and odd, so
    each value keeps its sign and order and shrinks towards 0 as t falls (t = 0: all 0; large t: ``z`` itself).
    Worked on the CPU in float64 from each value's own tail, Phi(-|z|) (no cancellation near p = 1).

    Shapes: z (...) -> (...), the same dtype and device.
    """
    t = check_truncation(truncation)
    x = z.detach().to("cpu", torch.float64)
    low = torch.special.ndtr(torch.tensor(-t, dtype=torch.float64))  # Phi(-t)
    tail = torch.special.ndtri(low + torch.special.ndtr(-x.abs()) * (1 - 2 * low))  # F_t^-1 of the tail, <= 0
    return (-torch.sign(x) * tail).clamp_(-t, t).to(device=z.device, dtype=z.dtype)


DISCRIMINATORS = ("dcgan", "patch")  # CapsPix2pixConfig.discriminator
NOISE_CHUNK = 16  # ConditionalGAN.noise draws a multiple of this many values (torch's CPU normal fills 16 at a time)
GAN_LR = 2e-4  # pix2pix (Isola et al. 2017, section 3.3) and CapsPix2pix's code: Adam at 2e-4, betas (0.5, 0.999)


class ConditionalGAN(nn.Module):
    """What CapsPix2pix and pix2pix share: a generator (labels, z) -> images, a discriminator (images, labels) ->
    logits, seeded noise and generation, and the two losses. The GAN loop calls ``d_loss`` then ``g_loss``."""

    def __init__(self, config: Any, generator: nn.Module, discriminator: nn.Module) -> None:
        super().__init__()
        self.config = config
        self.generator = generator
        self.discriminator = discriminator

    def noise(self, batch: int, seed: int | torch.Generator = 0, device: str | torch.device | None = None, *,
              truncation: float | None = None) -> torch.Tensor:
        """Standard normal z (B, noise_dim), drawn on the CPU from a generator seeded with ``seed`` (or from the
        torch.Generator given), then moved: the same z on every device. Row i is the same for every ``batch`` > i,
        so an image's noise does not depend on how many are drawn with it.

        ``truncation`` t (BigGAN's truncation trick, Brock et al. 2019, section 3.1): the same draw mapped to the
        standard normal truncated to [-t, t] (``truncate_normal``: BigGAN resamples the values outside, which
        gives the same distribution), so one seed's z shrinks monotonically towards 0 (the noise's mean, t = 0)
        as t falls and is the untruncated z for large t; fidelity for variety.
        """
        g = seed if isinstance(seed, torch.Generator) else torch.Generator().manual_seed(seed)
        n = batch * self.config.noise_dim
        # drawn as a multiple of 16 values: the CPU's randn fills 16 at a time and draws the last 16 afresh when the
        # count is not a multiple of 16, which would give the last row of a draw other values than the same row of
        # a longer one; padded, row i of one seed's draw is the same whatever the batch (capsnet.synthesis.generate)
        z = torch.randn(-(-n // NOISE_CHUNK) * NOISE_CHUNK, generator=g, device=g.device)[:n]
        z = z.view(batch, self.config.noise_dim)  # (B, Z)
        if truncation is not None:
            z = truncate_normal(z, truncation)  # the same draw, cut
        return z if device is None else z.to(device)

    @torch.no_grad()
    def generate(self, labels: torch.Tensor, seed: int = 0, z: torch.Tensor | None = None) -> torch.Tensor:
        """Images for ``labels`` from the noise of ``seed`` (or ``z``), without gradients, in the current mode;
        torch's RNG seeded with ``seed`` when a module trains (dropout), the caller's restored after; untouched in eval
        mode.

        Shapes: labels (B, C_in, H, W), z (B, Z) or None -> images (B, C_out, H, W) in [0, 1]
        """
        # torch's RNG only where dropout may draw from it (a module in training mode): seeding it in eval mode did
        # nothing but replace the stream of every other thread (a viewer serving in one, the caller's draws in another)
        drawing = any(m.training for m in self.generator.modules())
        with _seeded(seed, labels.device) if drawing else contextlib.nullcontext():
            if z is None:
                z = self.noise(labels.shape[0], seed, labels.device).to(labels.dtype)  # (B, Z)
            return self.generator(labels, z)

    def forward(self, labels: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
        """The generator's images (z drawn from seed 0 when None).

        Shapes: labels (B, C_in, H, W), z (B, Z) or None -> images (B, C_out, H, W) in [0, 1]
        """
        if z is None:
            z = self.noise(labels.shape[0], 0, labels.device).to(labels.dtype)  # (B, Z)
        return self.generator(labels, z)

    def d_loss(self, real: torch.Tensor, fake: torch.Tensor, labels: torch.Tensor
               ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The discriminator's loss: half the sum of BCE(D(real | labels), real_label) and BCE(D(fake | labels),
        fake_label), each a mean over the batch (and patches); ``fake`` is detached, so only D gets gradients.
        Parts: ``d_real`` and ``d_fake``, D's mean probability on each (detached).

        Shapes: real, fake (B, C_out, H, W); labels (B, C_in, H, W) -> loss ()
        """
        cfg = self.config
        check_nonempty(real.shape[0])
        real_logits = self.discriminator(real, labels)  # (B,) or (B, 1, h, w)
        fake_logits = self.discriminator(fake.detach(), labels)
        loss = 0.5 * (_bce(real_logits, cfg.real_label) + _bce(fake_logits, cfg.fake_label))  # pix2pix halves D's
        return loss, {"d_real": torch.sigmoid(real_logits.detach()).mean(),
                      "d_fake": torch.sigmoid(fake_logits.detach()).mean()}

    def g_loss(self, real: torch.Tensor, fake: torch.Tensor, labels: torch.Tensor
               ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The generator's loss: BCE(D(fake | labels), 1) + l1_weight x mean |fake - real|. Its backward also
        leaves gradients on D's weights: zero them before D's next step. Parts: ``g_adv``, ``l1`` (detached).

        Shapes: real, fake (B, C_out, H, W); labels (B, C_in, H, W) -> loss ()
        """
        check_nonempty(real.shape[0])
        adv = _bce(self.discriminator(fake, labels), 1.0)
        l1 = (fake - real).abs().mean()
        return adv + self.config.l1_weight * l1, {"g_adv": adv.detach(), "l1": l1.detach()}


def synthesis_losses(model: ConditionalGAN, labels: torch.Tensor, real: torch.Tensor, z: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """The registry's loss for kind "synthesis": D's and G's losses on one generated batch, and their parts.

    The GAN loop calls ``d_loss`` and ``g_loss`` itself, each before its own
    optimizer step; this is for tests and uniformity. ``z`` None: seed 0's.

    Shapes: labels (B, C_in, H, W); real (B, C_out, H, W); z (B, Z) or None -> d_loss (), g_loss (), parts
    """
    fake = model(labels, z)  # (B, C_out, H, W)
    d, d_parts = model.d_loss(real, fake, labels)
    g, g_parts = model.g_loss(real, fake, labels)
    return d, g, {**d_parts, **g_parts}


@dataclass(frozen=True)
class CapsPix2pixConfig(StackRouted, JsonConfig):
    """CapsPix2pix's sizes and training constants; defaults are the reference code's unless said otherwise."""

    input_height: int = 32  # multiples of 8 (the capsule U-Net halves the map three times)
    input_width: int = 32
    in_channels: int = 1  # label-map channels
    out_channels: int = 1  # image channels
    noise_dim: int = 100  # the noise z's entries, made into one extra H x W input map by a linear layer
    dropout: float = 0.5  # of whole capsule types after every capsule layer but the last, in training
    routing_iterations: int = 3  # SegCaps R3: 3 rounds but in the primary layer (the reference code: 3 everywhere)
    primary_routing_iterations: int = 1  # the rounds in the primary capsule layer (SegCaps': 1)
    routing_softmax: str = "parents"  # as SegCaps here; the reference code's normalisation is "children"
    routing_bias: bool = True  # a learned bias per parent type in every capsule layer (SegCaps' code's)
    init_gain: float = 1.0  # the hidden capsule layers' He-normal vote kernels times this (segcaps.capsule_stack)
    bias_init: float = 0.1  # the hidden capsule layers' routing bias at the start (SegCaps' reference code's 0.1;
    # CapsPix2pix's has no routing bias, its vote convolutions' own biases instead)
    squash: str = "sabour"  # every capsule layer's squash (routing.dynamic.SQUASHES): the paper's Eq. 1, or "exp"
    image_init_std: float = 10.0  # the 1x1 image convolution's weights at the start: N(0, this) (the reference: 0.02)
    image_kernel: int = 1  # the image convolution's kernel over the final pose (odd; the reference code's is 1); its
    # weights start at N(0, image_init_std / image_kernel), so the logits spread alike for every kernel
    dropout_min_scale: int = 1  # dropout only on grids at 1/s of the image with s >= this (1: every grid, the
    # reference code's; 4: the two deepest levels only, as pix2pix drops out only in its innermost decoder layers)
    conv1_skip_dropout: bool = False  # dropout on conv1's copy in the last skip too (the reference: conv1 undropped)
    conv1_init_std: float = 0.02  # conv1's weights at the start: N(0, this) (the reference code's DCGAN 0.02)
    level_widths: tuple[float, ...] = (1.0, 1.0, 1.0, 1.0)  # the hidden capsule layers' types times these by the
    # scale of their grid, the full image, 1/2, 1/4, 1/8 (segcaps.LEVELS, SegCaps' field); not in the paper
    upsampling: str = "deconv"  # the three deconvolutional capsule layers' votes (SegCaps' field): the paper's
    # transposed convolution, "resize" (nearest neighbour, then a 4x4 convolution; no checkerboard pattern) or
    # "subpix" (a 4x4 convolution to 4 times the votes laid out as 2x2 blocks; 516,096 more generator weights)
    capsule_norm: str = "none"  # "instance": SegCaps' option (segcaps.instance_norm_capsules; not in the paper):
    # every capsule layer's output but the last centred over the grid and scaled to unit RMS length, per example and
    # capsule type, before its dropout
    disc_channels: int = 64  # DCGAN's; doubling per layer, capped at 8x
    # the discriminator: "dcgan", the reference code's (one logit per image), or "patch", pix2pix's PatchGAN (one
    # logit per patch; what the pix2pix baseline judges with), so a comparison can change the generator alone
    discriminator: str = "dcgan"
    patch_layers: int = 3  # with discriminator "patch": its stride-2 layers (pix2pix's n_layers; 3: 70x70 patches)
    l1_weight: float = 100.0  # pix2pix's lambda, shared by both models; the reference code's lambda_L1 is 1
    real_label: float = 0.9  # the reference code's two-sided label smoothing of D's targets
    fake_label: float = 0.1  # D's target for generated images (smoothed, with real_label)
    beta1: float = 0.5  # Adam's betas (DCGAN's); the learning rate, 2e-4, is the training config's
    beta2: float = 0.999  # Adam's second-moment decay, both networks
    routing: str = "dynamic"  # every capsule layer's routing: the paper's, or another that SegCaps' layers take
    # (segcaps.stack_routings: self-attention, one pass with a learned prior per layer; not in the paper)
    routing_options: dict[str, Any] = field(default_factory=dict)  # the routing's own options by name (never the
    # layer's sizes, iterations, softmax or squash: segcaps.STACK_SETS)
    _SAVED_BEFORE = {"image_init_std": 0.02}  # runs saved before the field existed started from DCGAN's init
    # why a routing whose activations are not lengths is refused (segcaps._check_stack_routing)
    _STACK_LENGTHS = "the generator's capsule layers pass on their poses alone, as SegCaps' do"

    def __post_init__(self) -> None:
        check_types(self)
        check_sides(self, STRIDE, "the generator halves the map three times")
        for name in ("in_channels", "out_channels"):
            check_range(self, name, 1, 64)
        check_range(self, "noise_dim", 1, 1 << 16)
        check_stack_fields(self)
        check_range(self, "disc_channels", 1, 1024)
        check_range(self, "image_init_std", 0, 100)
        check_range(self, "conv1_init_std", 0, 100)
        if self.image_kernel not in (1, 3, 5, 7):
            raise ValueError(f"{type(self).__name__}.image_kernel must be 1, 3, 5 or 7 (odd, so the image keeps its "
                             f"size), got {self.image_kernel!r}")
        if self.dropout_min_scale not in (1, 2, 4, 8):
            raise ValueError(f"{type(self).__name__}.dropout_min_scale must be 1, 2, 4 or 8 (the grids are at 1, "
                             f"1/2, 1/4 and 1/8 of the image), got {self.dropout_min_scale!r}")
        check_choice(self, "capsule_norm", CAPSULE_NORMS)
        check_capsule_norm_grid(self)
        check_choice(self, "discriminator", DISCRIMINATORS)
        if self.discriminator == "patch":
            check_patch_layers(self, "patch_layers")
        else:
            check_range(self, "patch_layers", 1, 8)
        check_gan_fields(self)
        object.__setattr__(self, "routing_options", dict(self.routing_options))  # its own copy, not the caller's

    __hash__ = hash_as_saved  # routing_options is a dict: hash the config as saved

    def patch_config(self) -> Any:
        """The ``Pix2pixConfig`` whose PatchGAN this model judges with (discriminator "patch"): its sizes, channels
        and ``patch_layers``; pix2pix's other fields at their defaults (unused by the discriminator)."""
        from .pix2pix import Pix2pixConfig  # pix2pix builds on this module
        return Pix2pixConfig(input_height=self.input_height, input_width=self.input_width,
                             in_channels=self.in_channels, out_channels=self.out_channels,
                             disc_channels=self.disc_channels, disc_layers=self.patch_layers)

    @property
    def disc_widths(self) -> tuple[int, ...]:
        """The discriminator's stride-2 layers' channels: one per halving while the smaller side is at least 8."""
        side, widths = min(self.input_height, self.input_width), []
        while side >= 8:
            widths.append(self.disc_channels * min(2 ** len(widths), 8))
            side //= 2
        return tuple(widths)

    @property
    def generator_weights(self) -> int:
        """The generator's weights: the noise layer, conv1, SegCaps' capsule layers, the 1x1 image convolution."""
        noise = (self.noise_dim + 1) * self.input_height * self.input_width
        conv1 = ((self.in_channels + 1) * 25 + 1) * 16
        image = (16 * self.image_kernel ** 2 + 1) * self.out_channels
        return noise + conv1 + capsule_stack_weights(self.routing_bias, self.routing, self.routing_options,
                                                          level_widths=self.level_widths,
                                                          upsampling=self.upsampling) + image

    @property
    def discriminator_weights(self) -> int:
        """4x4 convolutions without bias, batch norm (scale, shift) on all but the first, a 4x4 head to one logit
        (discriminator "patch": the PatchGAN's count)."""
        if self.discriminator == "patch":
            return self.patch_config().discriminator_weights
        n, c = 0, self.in_channels + self.out_channels
        for k, w in enumerate(self.disc_widths):
            n += 16 * c * w + (2 * w if k else 0)
            c = w
        return n + 16 * c

    @property
    def num_weights(self) -> int:
        """Every weight of the generator and the discriminator, from the sizes alone."""
        return self.generator_weights + self.discriminator_weights


@dataclass(frozen=True)
class CapsPix2pixDeepConfig(CapsPix2pixConfig):
    """CapsPix2pix with a start whose capsule layers carry the label map: conv1 at N(0, 0.2) (ten times DCGAN's), the
    hidden capsule layers' votes at twice He's gain, their routing bias at 0.01, and no capsule dropout. At the
    reference start (``capspix2pix``) the input's trace shrinks three- to sevenfold per capsule layer and training
    reads the image from conv1's 5x5 window alone; from this one it reads the 1/2 and 1/4 levels (docs/results.md,
    "A start that opens the deep path"). The same layers and weights. Its deconvolutional capsule layers resize then
    convolve (a point of Fashion SSIM over the transposed convolution, docs/results.md, "Resize-then-convolve in the
    capsule generator's deconvolutions"); runs saved before that default read as the transposed convolution they had."""

    dropout: float = 0.0
    init_gain: float = 2.0
    bias_init: float = 0.01
    conv1_init_std: float = 0.2
    upsampling: str = "resize"
    _SAVED_BEFORE = {"upsampling": "deconv"}  # saved before 2026-12-04 (and CapsPix2pixConfig's entries)

    __hash__ = hash_as_saved  # a frozen dataclass writes its own (over a dict field) unless given one


class CapsPix2pixGenerator(nn.Module):
    """SegCaps R3 over the label map and a noise map; the final capsule's pose, through a 1x1 convolution, is the
    image (see the module docstring)."""

    def __init__(self, config: CapsPix2pixConfig = CapsPix2pixConfig()) -> None:
        super().__init__()
        check_config(config, CapsPix2pixConfig, type(self).__name__)
        self.config = cfg = config
        self.noise = nn.Linear(cfg.noise_dim, cfg.input_height * cfg.input_width)
        self.conv1 = nn.Conv2d(cfg.in_channels + 1, 16, 5, padding=2)
        self.caps = capsule_stack(routing_iterations=cfg.routing_iterations,
                                  primary_routing_iterations=cfg.primary_routing_iterations,
                                  routing_softmax=cfg.routing_softmax, routing_bias=cfg.routing_bias,
                                  init_gain=cfg.init_gain, bias_init=cfg.bias_init, squash=cfg.squash,
                                  routing=cfg.routing, routing_options=cfg.routing_options,
                                  level_widths=cfg.level_widths, upsampling=cfg.upsampling)
        # Dropout3d on (B, T, D, H, W) zeroes whole (D, H, W) slices: capsule types, what the reference code's
        # Dropout2d did on this 5-D grid (PyTorch now deprecates Dropout2d on 5-D input)
        self.dropout = nn.Dropout3d(cfg.dropout)
        self.to_image = nn.Conv2d(16, cfg.out_channels, cfg.image_kernel, padding=cfg.image_kernel // 2)
        init_gan_weights(self)
        with torch.no_grad():  # N(0, 0.02) rescaled: no more random draws, so the other weights are seed for seed;
            # divided by the kernel's side, so a k x k kernel's logits spread as the 1x1 kernel's (k^2 inputs each)
            self.to_image.weight.mul_(cfg.image_init_std / 0.02 / cfg.image_kernel)
            self.conv1.weight.mul_(cfg.conv1_init_std / 0.02)

    def capsule_grids(self, labels: torch.Tensor, z: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every layer's capsule grid, in order: {"conv1": (B, 1, 16, H, W), "primary": (B, 2, 16, H/2, W/2), ...,
        "seg_caps": (B, 1, 16, H, W)}, after dropout (in training) where it applies."""
        cfg = self.config
        check_label_maps(labels, cfg, exact=True)
        check_weights_dtype(labels, self, "label maps", "labels")
        B, _, H, W = labels.shape
        if z.shape != (B, cfg.noise_dim):
            raise ValueError(f"expected noise z ({B}, {cfg.noise_dim}), one per label map, got {tuple(z.shape)}: "
                             f"draw it with model.noise({B}, seed)")
        noise = self.noise(z).view(B, 1, H, W)  # (B, 1, H, W)
        x = torch.cat([labels, noise], dim=1)  # (B, C_in + 1, H, W)
        conv1 = F.leaky_relu(self.conv1(x), 0.01).unsqueeze(1)  # (B, 1, 16, H, W): one 16D capsule type

        def between(grid: torch.Tensor) -> torch.Tensor:  # (B, T, D, h, w), h = H / s: dropped when s is deep enough
            if cfg.capsule_norm == "instance" and grid is not conv1:  # conv1 goes on unnormalised, as in SegCaps
                grid = instance_norm_capsules(grid)
            return self.dropout(grid) if H // grid.shape[-2] >= cfg.dropout_min_scale else grid

        return walk_capsule_stack(self.caps, conv1, between, between_conv1_skip=cfg.conv1_skip_dropout)

    def forward(self, labels: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """Shapes:
            labels: (B, C_in, H, W), the config's H x W; z: (B, Z)
            returns: images (B, C_out, H, W) in [0, 1]
        """
        poses = self.capsule_grids(labels, z)["seg_caps"][:, 0]  # (B, 16, H, W)
        return torch.sigmoid(self.to_image(poses))  # (B, C_out, H, W)


class ConditionalDiscriminator(nn.Module):
    """The reference code's DCGAN discriminator on (image, label map) stacked: 4x4 stride-2 convolutions without
    bias, ``disc_channels`` doubling per layer (capped at 8x), batch norm on all but the first, LeakyReLU 0.2,
    down to a 4x4 map (for a square power-of-two side), then a 4x4 convolution without padding to one logit."""

    def __init__(self, config: CapsPix2pixConfig = CapsPix2pixConfig()) -> None:
        super().__init__()
        check_config(config, CapsPix2pixConfig, type(self).__name__)
        self.config = cfg = config
        layers: list[nn.Module] = []
        c = cfg.in_channels + cfg.out_channels
        for k, w in enumerate(cfg.disc_widths):
            layers += [nn.Conv2d(c, w, 4, stride=2, padding=1, bias=False)]
            layers += ([nn.BatchNorm2d(w)] if k else []) + [nn.LeakyReLU(0.2)]
            c = w
        layers += [nn.Conv2d(c, 1, 4, bias=False)]
        self.main = nn.Sequential(*layers)
        init_gan_weights(self)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Shapes:
            images: (B, C_out, H, W); labels: (B, C_in, H, W), the config's H x W
            returns: logits (B,), the mean over the head's positions (one for a square power-of-two side)
        """
        check_label_maps(labels, self.config, exact=True)
        check_image_pairs(images, labels, self.config)
        check_weights_dtype(images, self)
        check_weights_dtype(labels, self, "label maps", "labels")
        x = torch.cat([images, labels], dim=1)  # (B, C_out + C_in, H, W): the reference code's order
        return self.main(x).flatten(1).mean(1)  # (B,)


class CapsPix2pix(ConditionalGAN):
    """CapsPix2pix (Bass et al., "Image synthesis with a convolutional capsule generative adversarial network",
    MIDL 2019): the capsule generator and the DCGAN discriminator (see the module docstring), or pix2pix's
    PatchGAN with ``discriminator="patch"``."""

    def __init__(self, config: CapsPix2pixConfig = CapsPix2pixConfig()) -> None:
        generator = CapsPix2pixGenerator(config)  # first: a seed gives the weights it gave before the option
        if config.discriminator == "patch":
            from .pix2pix import PatchDiscriminator  # pix2pix builds on this module
            discriminator: nn.Module = PatchDiscriminator(config.patch_config())
        else:
            discriminator = ConditionalDiscriminator(config)
        super().__init__(config, generator, discriminator)
