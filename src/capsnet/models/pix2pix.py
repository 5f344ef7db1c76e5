"""The pix2pix baseline CapsPix2pix is compared with (Isola, Zhu, Zhou and Efros, CVPR 2017).

The generator is pix2pix's U-Net: 4x4 stride-2 convolutions down to the
smallest map the size allows (1x1 for a square power of two: five levels,
C64-C128-C256-C512-C512, for 32x32), LeakyReLU 0.2, batch norm on all but
the first and the innermost (the official code's; the paper's list puts it
on the innermost too, degenerate on a 1x1 map), and 4x4 stride-2
transposed convolutions back up with batch norm and ReLU, the skips
concatenated, dropout 0.5 in the first three up-layers (the paper's
"CD512-CD1024-CD1024"; the official code puts it on the second to fourth,
after the innermost), a sigmoid at the end (images in [0, 1] here; the
paper's tanh is for [-1, 1]). Its noise is that dropout, at test time too:
``generate`` runs the dropout layers active, batch norm in eval mode, under
torch's RNG seeded with ``seed``. The paper (section 3.3) normalises a
test batch by its own statistics instead, instance normalisation at its
batch size of 1; running statistics keep an image independent of the rest of
its batch, and are what training at batch 16 has to offer. The discriminator is the 70x70 PatchGAN
(n_layers 3): C64 stride 2 (no batch norm), C128 s2, C256 s2, C512 s1, a
convolution to one logit per patch, 4x4 kernels, LeakyReLU 0.2; the loss
averages over the patches. ``discriminator="dcgan"`` swaps it for
CapsPix2pix's (the reference code's DCGAN discriminator, one logit per
image), so a comparison can change pix2pix's discriminator alone. Weights
are initialised N(0, 0.02) (pix2pix's ``init_type='normal'``). The losses are CapsPix2pix's
(``capsnet.models.capspix2pix.ConditionalGAN``), smoothed labels and
``l1_weight`` 100 included, so the comparison changes the generator and the
discriminator only.
"""
from __future__ import annotations

import functools
import threading
import weakref
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from .._config import JsonConfig, check_choice, check_range, check_types
from .capspix2pix import (DISCRIMINATORS, ConditionalDiscriminator, ConditionalGAN, CapsPix2pixConfig,
                          check_gan_fields, check_image_pairs, check_label_maps, check_patch_layers, init_gan_weights)
from .inputs import check_config, check_weights_dtype
from .segcaps import STRIDE, check_sides

__all__ = ["Pix2pixConfig", "UNetGenerator", "PatchDiscriminator", "Pix2pix"]


@dataclass(frozen=True)
class Pix2pixConfig(JsonConfig):
    """pix2pix's sizes and training constants; the defaults are the paper's unless said otherwise."""

    input_height: int = 32  # multiples of 8, as CapsPix2pix's
    input_width: int = 32
    in_channels: int = 1  # label-map channels
    out_channels: int = 1  # image channels
    base_channels: int = 64  # ngf: 64, 128, 256, 512, 512, ... (capped at 8x)
    dropout: float = 0.5  # in the first three up-layers, at training and test time
    disc_channels: int = 64  # ndf
    disc_layers: int = 3  # the 70x70 PatchGAN
    # the discriminator: "patch", pix2pix's PatchGAN, or "dcgan", CapsPix2pix's (the reference code's, one logit per
    # image, disc_channels doubling down to 4x4), so a comparison can change pix2pix's discriminator alone
    discriminator: str = "patch"
    l1_weight: float = 100.0  # the paper's lambda
    real_label: float = 0.9  # CapsPix2pix's smoothed labels, so both models train on the same losses (pix2pix: 1, 0)
    fake_label: float = 0.1  # D's target for generated images (smoothed, with real_label)
    beta1: float = 0.5  # Adam's betas; the learning rate, 2e-4, is the training config's
    beta2: float = 0.999  # Adam's second-moment decay, both networks

    def __post_init__(self) -> None:
        check_types(self)
        check_sides(self, STRIDE, "as CapsPix2pix's")
        for name in ("in_channels", "out_channels"):
            check_range(self, name, 1, 64)
        check_range(self, "base_channels", 1, 1024)
        check_range(self, "disc_channels", 1, 1024)
        check_choice(self, "discriminator", DISCRIMINATORS)
        if self.discriminator == "patch":
            check_patch_layers(self, "disc_layers")
        else:
            check_range(self, "disc_layers", 1, 8)
        check_gan_fields(self)

    def dcgan_config(self) -> CapsPix2pixConfig:
        """The ``CapsPix2pixConfig`` whose DCGAN discriminator this model judges with (discriminator "dcgan"): its
        sizes and channels; CapsPix2pix's other fields at their defaults (unused by the discriminator), but a noise
        of one number: the config's weight cap counts CapsPix2pix's generator too, whose noise layer (100 x H x W
        weights) refused large pix2pix models that would hold far fewer."""
        return CapsPix2pixConfig(input_height=self.input_height, input_width=self.input_width,
                                 in_channels=self.in_channels, out_channels=self.out_channels,
                                 disc_channels=self.disc_channels, noise_dim=1)

    @property
    def levels(self) -> int:
        """The U-Net's stride-2 levels: as many as both sides can be halved exactly (log2 of a power-of-two side)."""
        n = 0
        while (self.input_height >> n) % 2 == 0 and (self.input_width >> n) % 2 == 0:
            n += 1
        return n

    @property
    def widths(self) -> list[int]:
        """The channels of each level's down-convolution, outermost first."""
        return [self.base_channels * min(2 ** k, 8) for k in range(self.levels)]

    @property
    def generator_weights(self) -> int:
        """The U-Net's weights: 4x4 kernels, no bias but the last up-layer's, batch norm as the module docstring."""
        w, L = self.widths, self.levels
        n = 16 * self.in_channels * w[0]  # the outermost down-convolution, no batch norm
        n += sum(16 * w[k - 1] * w[k] + (2 * w[k] if k < L - 1 else 0) for k in range(1, L))
        n += 16 * w[L - 1] * w[L - 2] + 2 * w[L - 2]  # the innermost up-convolution (no skip into it)
        n += sum(16 * 2 * w[k] * w[k - 1] + 2 * w[k - 1] for k in range(1, L - 1))
        return n + 16 * 2 * w[0] * self.out_channels + self.out_channels  # the outermost, with bias

    @property
    def discriminator_weights(self) -> int:
        """The PatchGAN's weights: the first and last convolutions with bias, the others with batch norm
        (discriminator "dcgan": CapsPix2pix's discriminator's count)."""
        if self.discriminator == "dcgan":
            return self.dcgan_config().discriminator_weights
        c, ndf = self.in_channels + self.out_channels, self.disc_channels
        n = 16 * c * ndf + ndf
        mult = 1
        for k in range(1, self.disc_layers + 1):
            prev, mult = mult, min(2 ** k, 8)
            n += 16 * ndf * prev * ndf * mult + 2 * ndf * mult
        return n + 16 * ndf * mult + 1

    @property
    def num_weights(self) -> int:
        """Every weight of the generator and the discriminator, from the sizes alone."""
        return self.generator_weights + self.discriminator_weights


class UNetGenerator(nn.Module):
    """pix2pix's U-Net generator (see the module docstring)."""

    def __init__(self, config: Pix2pixConfig = Pix2pixConfig()) -> None:
        super().__init__()
        check_config(config, Pix2pixConfig, type(self).__name__)
        self.config = cfg = config
        w, L = cfg.widths, cfg.levels
        down: list[nn.Module] = [nn.Conv2d(cfg.in_channels, w[0], 4, stride=2, padding=1, bias=False)]
        for k in range(1, L):
            bn = [nn.BatchNorm2d(w[k])] if k < L - 1 else []  # none on the innermost (1x1) map
            down.append(nn.Sequential(nn.LeakyReLU(0.2), nn.Conv2d(w[k - 1], w[k], 4, stride=2, padding=1, bias=False),
                                      *bn))
        self.down = nn.ModuleList(down)
        up: list[nn.Module] = []  # up[k] undoes down[k]; up[L - 1] first
        for k in range(L):
            c_in = w[k] * (1 if k == L - 1 else 2)  # the skip of level k stacked with the layer below's output
            if k == 0:
                up.append(nn.Sequential(nn.ReLU(), nn.ConvTranspose2d(c_in, cfg.out_channels, 4, stride=2, padding=1),
                                        nn.Sigmoid()))
                continue
            drop = [nn.Dropout(cfg.dropout)] if L - 1 - k < 3 else []  # the first three up-layers
            up.append(nn.Sequential(nn.ReLU(), nn.ConvTranspose2d(c_in, w[k - 1], 4, stride=2, padding=1, bias=False),
                                    nn.BatchNorm2d(w[k - 1]), *drop))
        self.up = nn.ModuleList(up)
        init_gan_weights(self)

    def forward(self, labels: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
        """Shapes:
            labels: (B, C_in, H, W), sides multiples of 2^levels; z: unused, for the shared call shape (the noise
                is the dropout)
            returns: images (B, C_out, H, W) in [0, 1]
        """
        check_label_maps(labels, self.config, exact=False, multiple=2 ** self.config.levels)
        check_weights_dtype(labels, self, "label maps", "labels")
        skips, x = [], labels
        for layer in self.down:
            x = layer(x)  # (B, w_k, H / 2^(k+1), W / 2^(k+1))
            skips.append(x)
        x = self.up[-1](skips[-1])  # (B, w_{L-2}, ...): the innermost
        for k in range(len(self.up) - 2, -1, -1):
            # ReLU of the stack: the official code's in-place LeakyReLU on the skip changes nothing after it
            x = self.up[k](torch.cat([skips[k], x], dim=1))  # (B, w_{k-1} or C_out, H / 2^k, W / 2^k)
        return x


class PatchDiscriminator(nn.Module):
    """pix2pix's PatchGAN on (image, label map) stacked: ``disc_layers`` 4x4 stride-2 convolutions (the first with
    a bias and no batch norm), one with stride 1, then a 4x4 convolution to one logit per patch."""

    def __init__(self, config: Pix2pixConfig = Pix2pixConfig()) -> None:
        super().__init__()
        check_config(config, Pix2pixConfig, type(self).__name__)
        self.config = cfg = config
        ndf = cfg.disc_channels
        layers: list[nn.Module] = [nn.Conv2d(cfg.in_channels + cfg.out_channels, ndf, 4, stride=2, padding=1),
                                   nn.LeakyReLU(0.2)]
        mult = 1
        for k in range(1, cfg.disc_layers + 1):
            prev, mult = mult, min(2 ** k, 8)
            stride = 2 if k < cfg.disc_layers else 1
            layers += [nn.Conv2d(ndf * prev, ndf * mult, 4, stride=stride, padding=1, bias=False),
                       nn.BatchNorm2d(ndf * mult), nn.LeakyReLU(0.2)]
        layers.append(nn.Conv2d(ndf * mult, 1, 4, padding=1))
        self.main = nn.Sequential(*layers)
        init_gan_weights(self)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Shapes:
            images: (B, C_out, H, W); labels: (B, C_in, H, W)
            returns: logits (B, 1, H / 2^n - 2, W / 2^n - 2), n = disc_layers: one per 70x70 patch for n = 3
        """
        check_label_maps(labels, self.config, exact=False)
        check_image_pairs(images, labels, self.config)
        check_weights_dtype(images, self)
        check_weights_dtype(labels, self, "label maps", "labels")
        layers, side = self.config.disc_layers, min(labels.shape[-2:])
        if side >> layers < 3:  # maps of another size than the config's (exact=False): the config's own check here
            raise ValueError(f"a PatchGAN of disc_layers {layers} needs sides of at least {3 << layers}, got "
                             f"{labels.shape[-2]}x{labels.shape[-1]} maps: give larger ones")
        return self.main(torch.cat([images, labels], dim=1))  # (B, 1, h, w)


class Pix2pix(ConditionalGAN):
    """pix2pix (Isola, Zhu, Zhou and Efros, "Image-to-Image Translation with Conditional Adversarial Networks", CVPR
    2017): the U-Net generator and the PatchGAN (see the module docstring), or CapsPix2pix's DCGAN
    discriminator with ``discriminator="dcgan"``. Its noise is dropout: ``noise`` gives an empty z (B, 0), and
    ``generate`` keeps dropout on, seeded."""

    def __init__(self, config: Pix2pixConfig = Pix2pixConfig()) -> None:
        generator = UNetGenerator(config)  # first: a seed starts the generator alike with either discriminator
        discriminator: nn.Module = (ConditionalDiscriminator(config.dcgan_config()) if config.discriminator == "dcgan"
                                    else PatchDiscriminator(config))
        super().__init__(config, generator, discriminator)

    def noise(self, batch: int, seed: int | torch.Generator = 0, device: str | torch.device | None = None, *,
              truncation: float | None = None) -> torch.Tensor:
        """An empty z (B, 0): pix2pix has no noise input (so nothing to truncate: ``truncation`` is refused)."""
        if truncation is not None:
            raise ValueError("pix2pix has no noise vector to truncate (its noise is dropout); truncation applies "
                             "to models with a noise input (capspix2pix)")
        return torch.empty(batch, 0, device=device)

    @torch.no_grad()
    def generate(self, labels: torch.Tensor, seed: int = 0, z: torch.Tensor | None = None, *,
                 seeds: Sequence[int] | None = None) -> torch.Tensor:
        """Images as at pix2pix's test time: batch norm in eval mode, dropout on, its masks drawn from torch's RNG
        seeded with ``seed`` (the caller's RNG and the modules' modes restored after).

        With ``seeds`` (one per image) image i's masks come from a stream of its own seeded with ``seeds[i]``,
        drawn layer by layer as a batch of one would draw them under that seed, so an image does not depend on
        the rest of its batch and the batch runs as one (on the CPU the masks equal those of the image alone
        under ``seed=seeds[i]``; CUDA's fused dropout draws its masks another way).

        Shapes: labels (B, C_in, H, W) -> images (B, C_out, H, W) in [0, 1]
        """
        with _generating(self):  # the modes and hooks below are the model's, shared by every thread
            return self._generate(labels, seed, z, seeds)

    def _generate(self, labels: torch.Tensor, seed: int, z: torch.Tensor | None, seeds: Sequence[int] | None
                  ) -> torch.Tensor:
        modes = {m: m.training for m in self.generator.modules()}
        dropouts = [m for m in self.generator.modules() if isinstance(m, nn.Dropout)]
        hooks = []
        try:
            self.generator.eval()
            if seeds is None:
                for m in dropouts:
                    m.train()
                return super().generate(labels, seed, z)
            if len(seeds) != labels.shape[0]:
                raise ValueError(f"seeds gives {len(seeds)} seeds for {labels.shape[0]} label maps; give one per "
                                 f"label map")
            streams = [torch.Generator(labels.device).manual_seed(int(s)) for s in seeds]
            hooks = [m.register_forward_hook(functools.partial(_per_image_dropout, streams=streams))
                     for m in dropouts]  # the dropout modules stay in eval mode (identity); the hook drops
            return super().generate(labels, seed, z)
        finally:
            for h in hooks:
                h.remove()
            for m, training in modes.items():
                m.training = training


_GENERATING: "weakref.WeakKeyDictionary[nn.Module, threading.RLock]" = weakref.WeakKeyDictionary()
_GENERATING_LOCK = threading.Lock()


def _generating(model: nn.Module) -> threading.RLock:
    """One lock per model for ``Pix2pix.generate``: two threads generating with one model ran each other's
    per-image dropout hooks ("The size of tensor a (4) must match the size of tensor b (2)") and flipped each
    other's dropout modes (a model's lock, not an attribute: models are deep-copied, locks are not)."""
    with _GENERATING_LOCK:
        lock = _GENERATING.get(model)
        if lock is None:
            lock = _GENERATING[model] = threading.RLock()
        return lock


def _per_image_dropout(module: nn.Dropout, inputs: tuple[torch.Tensor, ...], output: torch.Tensor, *,
                       streams: Sequence[torch.Generator]) -> torch.Tensor:
    """Dropout whose mask for image i comes from ``streams[i]``, as ``F.dropout`` draws it on the CPU (a Bernoulli
    draw of the keep probability, scaled by its inverse). Shapes: inputs[0] (B, ...) -> (B, ...)"""
    x, p = inputs[0], module.p
    if p == 0:
        return x
    if p == 1:
        return x * 0
    keep = 1.0 - p
    masks = torch.stack([torch.empty(x.shape[1:], dtype=x.dtype, device=x.device).bernoulli_(keep, generator=g)
                         for g in streams])
    return x * masks.div_(keep)
