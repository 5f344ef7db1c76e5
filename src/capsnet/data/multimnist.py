"""MultiMNIST: two overlapping digits of different classes (Sabour et al. 2017, section 6).

"We generate the MultiMNIST training and test dataset by overlaying a digit on
top of another digit from the same set (training or test) but different class.
Each digit is shifted up to 4 pixels in each direction resulting in a 36x36
image." Pixel values are added and clipped to [0, 1]. Both component images
are kept, so each digit's reconstruction can be scored against its own digit.

Pairs are drawn on the fly from a ``torch.Generator`` (the paper's 60M-example
set is never stored); a fixed test set is the same draw from a fixed seed.
Everything is batched tensor work, on the device of the source images.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .sets import unit_float

__all__ = ["MultiMNISTBatch", "make_pairs", "draw_pairs", "render_pairs", "place", "bounding_boxes", "box_overlap", "top2_correct"]


@dataclass
class MultiMNISTBatch:
    """n overlaid pairs.

    images: (n, C, S, S) float in [0, 1], the sum of the two components clipped to 1.
    components: (n, 2, C, S, S) float, each digit alone on the canvas.
    labels: (n, 2) int64, two different classes.
    shifts: (n, 2, 2) int64, each digit's (dy, dx) from the centre, within +-max_shift.
    sources: (n, 2) int64, indices of the two digits in the source set.
    """

    images: torch.Tensor
    components: torch.Tensor
    labels: torch.Tensor
    shifts: torch.Tensor
    sources: torch.Tensor

    def __len__(self) -> int:
        return len(self.labels)

    def multi_hot(self, num_classes: int = 10) -> torch.Tensor:
        """(n, num_classes) targets with a 1 at both labels, for the margin loss."""
        out = torch.zeros(len(self.labels), num_classes, device=self.labels.device)
        return out.scatter_(1, self.labels, 1.0)


def place(images: torch.Tensor, offsets: torch.Tensor, size: int) -> torch.Tensor:
    """Put each image on a zero canvas of ``size`` x ``size`` with its top-left corner at ``offsets``.

    Shapes: images (B, C, H, W), offsets (B, 2) as (row, column) -> (B, C, size, size).
    """
    B, C, H, W = images.shape
    if offsets.shape != (B, 2):
        raise ValueError(f"offsets must be (B, 2) = ({B}, 2), got {tuple(offsets.shape)}")
    if (offsets < 0).any() or (offsets[:, 0] + H > size).any() or (offsets[:, 1] + W > size).any():
        raise ValueError(f"offsets must keep the {H}x{W} images inside the {size}x{size} canvas")
    dev = images.device
    offsets = offsets.to(dev)
    canvas = images.new_zeros(B, C, size, size)
    rows = offsets[:, 0, None] + torch.arange(H, device=dev)  # (B, H)
    cols = offsets[:, 1, None] + torch.arange(W, device=dev)  # (B, W)
    b = torch.arange(B, device=dev)[:, None, None, None]
    c = torch.arange(C, device=dev)[None, :, None, None]
    canvas[b, c, rows[:, None, :, None], cols[:, None, None, :]] = images
    return canvas


def make_pairs(images: torch.Tensor, labels: torch.Tensor, n: int, *, generator: torch.Generator | None = None,
               max_shift: int = 4) -> MultiMNISTBatch:
    """Draw ``n`` MultiMNIST examples from one split.

    The first digit is drawn uniformly from the split; the second uniformly from
    the digits of the other classes. Each is centred on a canvas of side
    ``H + 2 * max_shift`` (36 for MNIST) and shifted by its own uniform (dy, dx)
    in -max_shift..max_shift.

    Shapes: images (N, C, H, W) uint8 0..255 or float 0..1, labels (N,).
    """
    if images.dim() != 4 or labels.shape != images.shape[:1]:
        raise ValueError(f"need images (N, C, H, W) and labels (N,), got {tuple(images.shape)} and {tuple(labels.shape)}")
    sources, shifts = draw_pairs(labels, n, generator=generator, max_shift=max_shift)
    return render_pairs(images, labels, sources, shifts, max_shift=max_shift)


def draw_pairs(labels: torch.Tensor, n: int, *, generator: torch.Generator | None = None, max_shift: int = 4
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """The random part of ``make_pairs``: source indices (n, 2) and shifts (n, 2, 2), on the generator's device."""
    if n < 0 or max_shift < 0:
        raise ValueError(f"n and max_shift must be >= 0, got {n} and {max_shift}")
    if labels.unique().numel() < 2:
        raise ValueError("MultiMNIST needs digits of at least two classes")
    gen_dev = generator.device if generator is not None else torch.device("cpu")
    N = len(labels)
    lab = labels.to(gen_dev)
    first = torch.randint(0, N, (n,), generator=generator, device=gen_dev)
    second = torch.randint(0, N, (n,), generator=generator, device=gen_dev)
    clash = lab[first] == lab[second]
    while clash.any():  # redraw the second digit until its class differs: uniform over the other classes' digits
        second[clash] = torch.randint(0, N, (int(clash.sum()),), generator=generator, device=gen_dev)
        clash = lab[first] == lab[second]
    shifts = torch.randint(-max_shift, max_shift + 1, (n, 2, 2), generator=generator, device=gen_dev)
    return torch.stack([first, second], dim=1), shifts  # (n, 2), (n, 2, 2)


def render_pairs(images: torch.Tensor, labels: torch.Tensor, sources: torch.Tensor, shifts: torch.Tensor, *,
                 max_shift: int = 4) -> MultiMNISTBatch:
    """The pairs that ``draw_pairs`` chose, drawn on their canvas (see ``make_pairs``)."""
    dev = images.device
    lab = labels.to(sources.device)
    x = images.to(dev)
    x = unit_float(x)
    _, C, H, W = x.shape
    size = max(H, W) + 2 * max_shift
    parts = []
    for k in range(2):
        offsets = (shifts[:, k] + max_shift).to(dev)  # top-left corner: centred, then shifted
        parts.append(place(x[sources[:, k].to(dev)], offsets, size))
    components = torch.stack(parts, dim=1)  # (n, 2, C, S, S)
    return MultiMNISTBatch(components.sum(1).clamp_(max=1.0), components, lab[sources].to(dev),
                           shifts.to(dev), sources.to(dev))


def bounding_boxes(images: torch.Tensor, threshold: float = 0.0) -> torch.Tensor:
    """Tight boxes of the pixels above ``threshold``: (..., C, H, W) -> (..., 4) as (top, left, bottom, right), inclusive."""
    on = (images > threshold).any(dim=-3)  # (..., H, W)
    rows, cols = on.any(dim=-1), on.any(dim=-2)  # (..., H), (..., W)
    H, W = rows.shape[-1], cols.shape[-1]
    r = torch.arange(H, device=images.device)
    c = torch.arange(W, device=images.device)
    top = torch.where(rows, r, H).amin(-1)
    bottom = torch.where(rows, r, -1).amax(-1)
    left = torch.where(cols, c, W).amin(-1)
    right = torch.where(cols, c, -1).amax(-1)
    return torch.stack([top, left, bottom, right], dim=-1)


def box_overlap(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Area of the intersection of two boxes over the area of the smaller one, in [0, 1].

    Shapes: a, b (..., 4) as from ``bounding_boxes`` -> (...,).
    """
    h = (torch.minimum(a[..., 2], b[..., 2]) - torch.maximum(a[..., 0], b[..., 0]) + 1).clamp(min=0)
    w = (torch.minimum(a[..., 3], b[..., 3]) - torch.maximum(a[..., 1], b[..., 1]) + 1).clamp(min=0)
    area = lambda x: (x[..., 2] - x[..., 0] + 1) * (x[..., 3] - x[..., 1] + 1)  # noqa: E731
    return (h * w).float() / torch.minimum(area(a), area(b)).clamp(min=1).float()


def top2_correct(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The paper's MultiMNIST metric: right when the two longest capsules are exactly the two labels.

    Ties are broken by ``torch.topk``; order does not matter. Shapes: scores (n, J), labels (n, 2) -> (n,) bool.
    """
    if scores.dim() != 2 or labels.shape != (scores.shape[0], 2):
        raise ValueError(f"need scores (n, J) and labels (n, 2), got {tuple(scores.shape)} and {tuple(labels.shape)}")
    top = scores.topk(2, dim=1).indices.sort(dim=1).values
    return (top == labels.sort(dim=1).values).all(dim=1)
