"""What a segmentation model does, as tensors and figures: predicted masks, reconstructions, capsule maps per layer.

For SegCaps (LaLonde and Bagci 2018) and the U-Net it is compared with:

- ``segment``: each image's foreground probability, its mask (probability
  > 0.5, the rule of ``capsnet.evaluate``), SegCaps' reconstruction (its
  decoder on the segmentation capsules masked by the prediction, as at
  inference) and, given the truth, each image's Dice and IoU;
- ``capsule_maps``: the length of every capsule type over its grid, layer by
  layer (the view of the capsule tutorial: what each layer of the capsule
  U-Net sees);
- ``plot_segmentations`` and ``plot_capsule_maps`` draw them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Sequence

import torch

from .._progress import progress_bar
from ..data.segmentation import dice_iou
from ..ops import safe_norm
from ..runtime import keeps_mode
from .arrays import FigureError, _images
from .plots import _figure, _short, _show

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["Segmentations", "segment", "capsule_maps", "plot_segmentations", "plot_capsule_maps", "overlay_masks"]


class Segmentations(NamedTuple):
    probabilities: torch.Tensor  # (N, 1, H, W) foreground probability
    predicted: torch.Tensor  # (N, 1, H, W) uint8: probability > 0.5
    reconstructions: torch.Tensor | None  # (N, C, H, W) SegCaps' decoder output, None for a model without one
    dice: torch.Tensor | None  # (N,) float64, given the truth
    iou: torch.Tensor | None  # (N,)


@torch.no_grad()
@keeps_mode
def segment(model: torch.nn.Module, images: torch.Tensor, masks: torch.Tensor | None = None, *, batch_size: int = 32,
            progress: bool = False) -> Segmentations:
    """Segment ``images`` in eval mode; ``masks`` (the truth) gives each image's Dice and IoU.

    Shapes: images (N, C, H, W) uint8 or float in [0, 1]; masks (N, 1, H, W) 0/1 or None; outputs on the CPU.
    """
    model.eval()
    x = _images(model, images)
    if masks is not None and tuple(masks.shape) != (len(x), 1, *x.shape[-2:]):
        raise FigureError(f"masks must be ({len(x)}, 1, {x.shape[-2]}, {x.shape[-1]}), one per image, got "
                          f"{tuple(masks.shape)}")
    probs, recons = [], []
    for start in progress_bar(range(0, len(x), batch_size), desc="segment", unit="batch", leave=False,
                              progress=progress):
        out = model(x[start:start + batch_size])  # no mask: SegCaps reconstructs from its own prediction
        if not hasattr(out, "probabilities"):  # a classifier's scores, a generator's images
            raise FigureError(f"this {type(model).__name__} does not segment: segment reads a segmentation model's "
                              f"per-pixel probabilities (SegCaps, the U-Net)")
        probs.append(out.probabilities.float().cpu())
        rec = getattr(out, "reconstructions", None)
        if rec is not None:
            recons.append(rec.float().cpu())
    if not probs:
        raise FigureError("no images given")
    p = torch.cat(probs)  # (N, 1, H, W)
    predicted = (p > 0.5).to(torch.uint8)
    dice = iou = None
    if masks is not None:
        dice, iou = dice_iou(predicted, (masks.cpu() > 0).to(torch.uint8))
    return Segmentations(p, predicted, torch.cat(recons) if recons else None, dice, iou)


@torch.no_grad()
@keeps_mode
def capsule_maps(model: torch.nn.Module, image: torch.Tensor) -> dict[str, torch.Tensor]:
    """The length of every capsule type at every position of every capsule layer, for one image.

    Shapes: image (C, H, W) -> {layer: (types, H', W')} in the network's order, on the CPU.
    """
    if not hasattr(model, "capsule_grids"):
        raise FigureError(f"capsule maps need a capsule segmentation model; {type(model).__name__} has no capsule "
                          f"layers")
    model.eval()
    grids = model.capsule_grids(_images(model, image.unsqueeze(0)))  # {layer: (1, T, D, H', W')}
    return {name: safe_norm(g[0].float(), dim=1).cpu() for name, g in grids.items()}  # (T, H', W')


def overlay_masks(predicted: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """A prediction against the truth as one RGB image: white where both, red where only predicted (false
    positive), blue where only true (missed), black where neither.

    Shapes: predicted, truth (1, H, W) or (H, W) holding 0/1 -> (H, W, 3) float in [0, 1].
    """
    p, t = predicted.reshape(predicted.shape[-2:]).bool(), truth.reshape(truth.shape[-2:]).bool()
    if p.shape != t.shape:
        raise FigureError(f"prediction and truth differ in size: {tuple(p.shape)} and {tuple(t.shape)}")
    both, fp, fn = (p & t).float(), (p & ~t).float(), (~p & t).float()
    return torch.stack([both + fp, both, both + fn], dim=-1)  # (H, W, 3)


def plot_segmentations(images: torch.Tensor, masks: torch.Tensor | None, seg: Segmentations, *,
                       indices: Sequence[int] | None = None, title: str = "",
                       names: Sequence[str] | None = None) -> "Figure":
    """One column per image: the input, the true mask, the foreground probability, the predicted mask against
    the truth (white right, red false positive, blue missed) and SegCaps' reconstruction; Dice and IoU above.
    ``names``: each image's file name (a user's folder), shown under its index."""
    N = len(images)
    if N == 0:
        raise FigureError("no images to show")
    rows = [("input", None), ("true mask", None), ("probability", None), ("prediction\nvs truth", None)]
    if masks is None:
        rows = [r for r in rows if r[0] != "true mask"]
    if seg.reconstructions is not None:
        rows.append(("reconstruction\n(masked by the\nprediction)", None))
    fig = _figure(max(4.0, 1.25 * N + 0.8), 1.3 * len(rows) + 0.4)
    axes = fig.subplots(len(rows), N, squeeze=False)
    for n in range(N):
        head = (f"#{indices[n]}" if indices is not None else f"{n}") + (f"\n{_short(names[n], 14)}" if names else "")
        if seg.dice is not None:
            head += f"\nDice {seg.dice[n]:.3f}\nIoU {seg.iou[n]:.3f}"
        r = 0
        _show(axes[r, n], images[n], head)
        if masks is not None:
            r += 1
            _show(axes[r, n], masks[n].float())
        r += 1
        axes[r, n].imshow(seg.probabilities[n, 0].numpy(), cmap="magma", vmin=0, vmax=1)
        axes[r, n].set_xticks([])
        axes[r, n].set_yticks([])
        r += 1
        shown = overlay_masks(seg.predicted[n], masks[n]) if masks is not None else seg.predicted[n, 0].float()
        axes[r, n].imshow(shown.numpy(), cmap="gray", vmin=0, vmax=1)
        axes[r, n].set_xticks([])
        axes[r, n].set_yticks([])
        if seg.reconstructions is not None:
            _show(axes[r + 1, n], seg.reconstructions[n])
    for r, (label, _) in enumerate(rows):
        axes[r, 0].set_ylabel(label, fontsize=8)
    fig.suptitle(title or "Test images, their masks and the model's segmentation (mask: probability > 0.5)",
                 fontsize=10)
    return fig


def plot_capsule_maps(maps: dict[str, torch.Tensor], image: torch.Tensor, *, title: str = "") -> "Figure":
    """One row per capsule layer: the length of each capsule type over its grid, each row on its own scale
    (black 0, white the layer's longest capsule); the input at the left of the first row."""
    if not maps:
        raise FigureError("no capsule layers to show")
    cols = max(m.shape[0] for m in maps.values()) + 1
    fig = _figure(1.05 * cols + 0.6, 1.05 * len(maps) + 0.5)
    grid = fig.add_gridspec(len(maps), cols)  # axes only where a map is drawn (SegCaps: 59 of 117 cells; the empty
    _show(fig.add_subplot(grid[0, 0]), image, "input")  # ones, hidden, took half the drawing's time)
    for r, (name, m) in enumerate(maps.items()):
        T, h, w = m.shape
        top = float(m.max()) or 1.0
        for t in range(T):
            ax = fig.add_subplot(grid[r, t + 1])
            ax.imshow(m[t].numpy(), cmap="gray", vmin=0, vmax=top)
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0 or t == 0:
                ax.set_title(f"type {t}", fontsize=7)
            if t == 0:
                ax.set_ylabel(f"{name}\n{T} type{'s' if T > 1 else ''}, {h}x{w}\nmax {top:.2f}", fontsize=7)
    fig.suptitle(title or "Capsule lengths per type, layer by layer", fontsize=10)
    return fig
