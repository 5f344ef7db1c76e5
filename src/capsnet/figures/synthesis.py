"""What a synthesis model (CapsPix2pix, pix2pix) makes, drawn: samples per label map, noise interpolations, the
generator's capsule features layer by layer, and a GAN's training curves.

The figures of the CapsPix2pix paper (Bass et al. 2019) and of the capsule
tutorial that shows it: different noise gives different images for one
label map; a row interpolating between two noise vectors; the generator's
capsule features per layer.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

import torch

from ..ops import safe_norm
from ..runtime import keeps_mode
from ..synthesis import row_noise
from .arrays import FigureError
from .plots import _figure, _show

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["interpolate_noise", "truncate_noise", "generator_maps", "label_maps_shown", "plot_samples",
           "plot_interpolation", "plot_truncation", "plot_gan_curves"]


@torch.no_grad()
@keeps_mode
def interpolate_noise(model: torch.nn.Module, label: torch.Tensor, steps: int = 8, seeds: tuple[int, int] = (0, 1),
                      row: int = 0, truncation: float | None = None) -> torch.Tensor:
    """Images of one label map with the noise moved linearly from seed ``seeds[0]``'s vector to seed ``seeds[1]``'s.

    ``row``: the label map's place among those generated together, whose noise is row ``row`` of each seed's draw
    (``capsnet.synthesis.row_noise``): the ends are then that map's images of the two seeds in the samples figure
    (and the viewer's). ``truncation``: both vectors truncated first (``ConditionalGAN.noise``).
    Shapes: label (C, H, W) -> (steps, C', H, W). A model without a noise vector (pix2pix) is refused.
    """
    dev = _noise_vector_model(model, "interpolate")
    a, b = (row_noise(model, row, s, dev, truncation=truncation) for s in seeds)  # (1, noise_dim) each
    t = torch.linspace(0, 1, steps, device=dev)[:, None]  # (steps, 1)
    return _label_images(model, label, (1 - t) * a + t * b)  # z (steps, noise_dim)


@torch.no_grad()
@keeps_mode
def truncate_noise(model: torch.nn.Module, label: torch.Tensor, truncations: Sequence[float | None], seed: int = 0,
                   row: int = 0) -> torch.Tensor:
    """Images of one label map with seed ``seed``'s noise truncated at each of ``truncations`` (None: untruncated)
    (``ConditionalGAN.noise``: the seed's own draw, cut, so the vector shrinks towards the mean, T = 0).

    ``row``: the label map's place among those generated together, as ``interpolate_noise``.
    Shapes: label (C, H, W) -> (len(truncations), C', H, W). A model without a noise vector (pix2pix) is refused.
    """
    dev = _noise_vector_model(model, "truncate")
    return _label_images(model, label, torch.cat([row_noise(model, row, seed, dev, truncation=t)
                                                  for t in truncations]))  # z (K, noise_dim)


def _noise_vector_model(model: torch.nn.Module, what: str) -> torch.device:
    """``model`` put in eval mode, refused (naming ``what`` cannot be done) when it takes no noise vector; its
    device."""
    model.eval()
    if model.noise(1, 0).shape[1] == 0:
        raise FigureError(f"{type(model).__name__} takes no noise vector (its noise is dropout): nothing to {what}")
    return next(model.parameters()).device


def _label_images(model: torch.nn.Module, label: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """One label map's images, one per row of ``z``: (C, H, W), (K, noise_dim) -> (K, C', H, W) on the CPU."""
    return model.generate(label.to(z.device).unsqueeze(0).expand(len(z), *label.shape), z=z, seed=0).cpu()


@torch.no_grad()
@keeps_mode
def generator_maps(model: torch.nn.Module, label: torch.Tensor, seed: int = 0, row: int = 0
                   ) -> dict[str, torch.Tensor]:
    """The length of every capsule type at every position of every generator layer, for one label map and seed
    (its noise: row ``row`` of the seed's draw, as ``interpolate_noise``).

    Shapes: label (C, H, W) -> {layer: (types, H', W')} in the network's order, on the CPU.
    """
    generator = model.generator
    if not hasattr(generator, "capsule_grids"):
        raise FigureError(f"{type(generator).__name__} has no capsule layers to draw")
    model.eval()
    dev = next(model.parameters()).device
    z = row_noise(model, row, seed, dev)  # (1, noise_dim)
    grids = generator.capsule_grids(label.to(dev).unsqueeze(0), z)  # {name: (1, T, D, h, w)}
    return {name: safe_norm(g[0].float(), dim=1).cpu() for name, g in grids.items()}


def label_maps_shown(labels: torch.Tensor) -> torch.Tensor:
    """Label maps (N, C, H, W) as drawn: each divided by its own largest value, so 0/255 (or 0/1) maps show black and
    white and a user's class maps 0..K show K + 1 greys (drawn as pixels / 255 they were all but black: a review,
    2026-12-01); an all-0 map stays 0."""
    top = labels.float().amax(dim=(1, 2, 3), keepdim=True)
    return labels.float() / top.clamp_min(torch.finfo(torch.float32).tiny)


def plot_samples(labels: torch.Tensor, real: torch.Tensor, samples: torch.Tensor, *, indices: Sequence[int],
                 seeds: Sequence[int], title: str = "") -> "Figure":
    """One column per label map: the label map, the real image, then one generated image per noise seed.

    Shapes: labels (N, C, H, W), real (N, C', H, W), samples (S, N, C', H, W).
    """
    S, N = samples.shape[:2]
    if N == 0:
        raise FigureError("no label maps to show")
    fig = _figure(max(4.0, 1.15 * N + 0.8), 1.15 * (S + 2) + 0.4)
    axes = fig.subplots(S + 2, N, squeeze=False)
    for n in range(N):
        _show(axes[0, n], labels[n], f"#{indices[n]}")
        _show(axes[1, n], real[n])
        for s in range(S):
            _show(axes[s + 2, n], samples[s, n])
    axes[0, 0].set_ylabel("label map", fontsize=8)
    axes[1, 0].set_ylabel("real", fontsize=8)
    for s, seed in enumerate(seeds):
        axes[s + 2, 0].set_ylabel(f"noise {seed}", fontsize=8)
    fig.suptitle(title or "Label maps, the real images and generated ones for several noise seeds", fontsize=10)
    return fig


def plot_interpolation(labels: torch.Tensor, rows: torch.Tensor, *, indices: Sequence[int],
                       seeds: tuple[int, int] = (0, 1), title: str = "") -> "Figure":
    """One row per label map: the label map, then its images as the noise moves from one seed's vector to another's.

    Shapes: labels (N, C, H, W), rows (N, K, C', H, W).
    """
    K = rows.shape[1]
    return _plot_rows(labels, rows, indices, [f"t = {k / max(K - 1, 1):.2f}" for k in range(K)],
                      title or f"Noise interpolated linearly from seed {seeds[0]}'s vector (t = 0) to seed "
                               f"{seeds[1]}'s (t = 1)")


def plot_truncation(labels: torch.Tensor, rows: torch.Tensor, *, indices: Sequence[int],
                    truncations: Sequence[float | None], seed: int = 0, title: str = "") -> "Figure":
    """One row per label map: the label map, then its images with seed ``seed``'s noise truncated at each T
    (None: untruncated).

    Shapes: labels (N, C, H, W), rows (N, len(truncations), C', H, W).
    """
    return _plot_rows(labels, rows, indices, ["untruncated" if t is None else f"T = {t:g}" for t in truncations],
                      title or f"Noise seed {seed} truncated at T (the normal cut to [-T, T]; T = 0: its mean)")


def _plot_rows(labels: torch.Tensor, rows: torch.Tensor, indices: Sequence[int], columns: Sequence[str],
               title: str) -> "Figure":
    """One row per label map: the label map, then K images under the given column titles."""
    N, K = rows.shape[:2]
    if N == 0:
        raise FigureError("no label maps to show")
    fig = _figure(1.05 * (K + 1) + 0.6, 1.1 * N + 0.5)
    axes = fig.subplots(N, K + 1, squeeze=False)
    for n in range(N):
        _show(axes[n, 0], labels[n], f"#{indices[n]}" if n == 0 else None)
        axes[n, 0].set_ylabel(f"#{indices[n]}", fontsize=8)
        for k in range(K):
            _show(axes[n, k + 1], rows[n, k], columns[k] if n == 0 else None)
    fig.suptitle(title, fontsize=10)
    return fig


def plot_gan_curves(runs: dict[str, list[dict]]) -> "Figure":
    """Per epoch: both training losses, the training L1, and the held-out L1 and SSIM where evaluated."""
    from matplotlib.ticker import MaxNLocator

    fig = _figure(12, 3.4)
    ax_loss, ax_l1, ax_ssim = fig.subplots(1, 3)
    for name, records in runs.items():
        epochs = [r["epoch"] for r in records]
        held = "val" if any("val_l1" in r for r in records) else "test"
        line = ax_loss.plot(epochs, [r.get("train_d_loss", math.nan) for r in records], marker="o",
                            label=f"{name} D")[0]
        ax_loss.plot(epochs, [r.get("train_g_loss", math.nan) for r in records], marker="s", linestyle="--",
                     color=line.get_color(), label=f"{name} G")
        ax_l1.plot(epochs, [r.get("train_l1", math.nan) for r in records], marker="o", color=line.get_color(),
                   label=f"{name} train")
        scored = [r for r in records if f"{held}_l1" in r]
        ax_l1.plot([r["epoch"] for r in scored], [r[f"{held}_l1"] for r in scored], marker="s", linestyle="--",
                   color=line.get_color(), label=f"{name} {held}")
        ax_ssim.plot([r["epoch"] for r in scored], [r[f"{held}_ssim"] for r in scored], marker="o",
                     color=line.get_color(), label=f"{name} {held}")
    ax_loss.set(title="Discriminator and generator losses", xlabel="epoch", ylabel="loss")
    ax_l1.set(title="L1 to the real image", xlabel="epoch", ylabel="mean absolute error")
    ax_ssim.set(title="Held-out SSIM (noise seed 0)", xlabel="epoch", ylabel="SSIM")
    for ax in (ax_loss, ax_l1, ax_ssim):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        # whole epochs only, also for a run of one epoch (its axis ticked 0.96, 0.98, ... 1.04)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    return fig
