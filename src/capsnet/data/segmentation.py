"""Digit segmentation on cluttered canvases (for SegCaps, LaLonde and Bagci 2018), user folders, Otsu, Dice and IoU.

Each 64x64 canvas holds one target digit, rotated, scaled and placed at
random, among clutter: square fragments cut from other digits, rotated and
scaled, composited with max; then a linear background ramp and Gaussian noise
are added and the result clipped to [0, 1]. The mask is the target's own
pixels (its transformed intensity above ``rule.threshold``), taken before any
clutter, so a fragment lying over the target never changes it. The ranges
live in a ``CanvasRule``; ``OUT_OF_DISTRIBUTION`` widens rotation and scale
and keeps the clutter.

As in ``multimnist``, the random part (``draw_canvases``) is separate from
the drawing (``render_canvases``): every draw comes from the generator given,
on its device, and the draws for the target come first, so two rules that
differ only in clutter, noise or gradient place the same target digits the
same way for one generator state.

``load_mask_folder`` reads the user's own PNG images and masks (``png.py`` reads each file);
``otsu_threshold`` is the classical baseline (Otsu 1979); ``dice_iou`` scores.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from .._numbers import is_int
from ..runtime import sum_dtype
from .idx import DataError
from .multimnist import bounding_boxes
from .png import load_png_pairs
from .sets import unit_float

__all__ = ["CANVAS", "CanvasRule", "IN_DISTRIBUTION", "OUT_OF_DISTRIBUTION", "CanvasDraw", "draw_canvases",
           "render_canvases", "make_canvases", "random_canvases", "segmentation_test", "load_mask_folder",
           "otsu_threshold", "otsu_masks", "dice_iou", "overlap_scores"]

CANVAS = 64  # px: a side of the canvas; the target digit at scale 1.6 spans up to 45 px of it


@dataclass(frozen=True)
class CanvasRule:
    """The ranges every canvas is drawn from (each uniform)."""

    rotation_deg: float = 30.0  # the target turned by up to +-this, counter-clockwise positive as displayed
    scale: tuple[float, float] = (1.0, 1.6)  # the target's 28x28 frame scaled by this
    fragments: tuple[int, int] = (2, 4)  # clutter fragments per canvas
    fragment_size: tuple[int, int] = (10, 16)  # px: the side of a fragment's square, cut from its digit's own frame
    fragment_scale: tuple[float, float] = (1.0, 1.6)  # fragments scaled as the targets are: stroke width is no cue
    noise: float = 0.05  # std of the Gaussian noise added to every pixel
    gradient: float = 0.3  # a background ramp rises from 0 to an amplitude in [0, gradient] across the canvas
    threshold: float = 0.5  # mask = the transformed target's intensity above this

    def __post_init__(self):
        for name, lo in (("scale", 1e-3), ("fragments", 0), ("fragment_size", 1), ("fragment_scale", 1e-3)):
            r = getattr(self, name)
            whole = name in ("fragments", "fragment_size")  # counts and pixels: randint's bounds
            if (len(r) != 2 or not all(math.isfinite(v) for v in r) or not lo <= r[0] <= r[1]
                    or (whole and not all(is_int(v) for v in r))):
                raise ValueError(f"CanvasRule.{name} must be (min, max) of finite {'integers' if whole else 'numbers'}"
                                 f" with {lo} <= min <= max, got {r}")
        # NaN passes every comparison below: NaN canvases and empty masks (or, for the noise, none added)
        values = (self.rotation_deg, self.noise, self.gradient, self.threshold)
        if (not all(math.isfinite(v) for v in values) or self.rotation_deg < 0 or self.noise < 0
                or self.gradient < 0 or not 0 < self.threshold < 1):
            raise ValueError(f"CanvasRule needs finite rotation_deg, noise and gradient >= 0 and 0 < threshold < 1, "
                             f"got {self}")


IN_DISTRIBUTION = CanvasRule()
OUT_OF_DISTRIBUTION = CanvasRule(rotation_deg=75.0, scale=(0.7, 2.1))  # larger rotations and scales, same clutter


@dataclass
class CanvasDraw:
    """The random part of B canvases with F = ``rule.fragments[1]`` fragment slots, on the generator's device."""

    rotation_deg: torch.Tensor  # (B,) the target's turn
    scale: torch.Tensor  # (B,)
    place: torch.Tensor  # (B, 2) uniforms in [0, 1) picking (x, y) within the range that keeps the ink inside
    count: torch.Tensor  # (B,) fragments shown: slots k < count
    source_offset: torch.Tensor  # (B, F) in 1..N-1: a fragment's digit is (target + offset) % N, another digit
    side: torch.Tensor  # (B, F) int px, the cut square's side in its digit's frame
    cut: torch.Tensor  # (B, F, 2) uniforms placing the square's centre within its digit's ink box
    frag_rotation_deg: torch.Tensor  # (B, F)
    frag_scale: torch.Tensor  # (B, F)
    frag_position: torch.Tensor  # (B, F, 2) (x, y) of its centre in canvas px from the canvas centre
    ramp_angle: torch.Tensor  # (B,) radians: the direction the background ramp rises in
    ramp_amplitude: torch.Tensor  # (B,)
    noise: torch.Tensor | None  # (B, 1, S, S), None when rule.noise is 0

    def __getitem__(self, index: slice) -> "CanvasDraw":
        """The draws of some canvases (a slice of the batch)."""
        return CanvasDraw(*(None if v is None else v[index] for v in vars(self).values()))


def draw_canvases(n: int, pool_size: int, generator: torch.Generator | None, *, rule: CanvasRule = IN_DISTRIBUTION,
                  size: int = CANVAS) -> CanvasDraw:
    """Every random number ``n`` canvases need, target first, on the generator's device (see ``CanvasDraw``)."""
    if pool_size < 1:
        raise ValueError("the pool of digits is empty: pass at least one digit")
    gd = generator.device if generator is not None else torch.device("cpu")
    Fk = rule.fragments[1]

    def uniform(lo: float, hi: float, *shape: int) -> torch.Tensor:
        return lo + (hi - lo) * torch.rand(*shape, generator=generator, device=gd, dtype=torch.float64)

    def randint(lo: int, hi: int, *shape: int) -> torch.Tensor:  # lo..hi inclusive
        return torch.randint(lo, hi + 1, shape, generator=generator, device=gd)

    rot, scale, place = uniform(-rule.rotation_deg, rule.rotation_deg, n), uniform(*rule.scale, n), uniform(0, 1, n, 2)
    count = randint(*rule.fragments, n)
    offset = randint(1, pool_size - 1, n, Fk) if pool_size > 1 else torch.zeros(n, Fk, dtype=torch.long, device=gd)
    side, cut = randint(*rule.fragment_size, n, Fk), uniform(0, 1, n, Fk, 2)
    f_rot, f_scale = uniform(-180, 180, n, Fk), uniform(*rule.fragment_scale, n, Fk)
    f_pos = uniform(-size / 2, size / 2, n, Fk, 2)
    angle, amp = uniform(0, 2 * math.pi, n), uniform(0, rule.gradient, n)
    noise = (torch.randn(n, 1, size, size, generator=generator, device=gd) * rule.noise) if rule.noise > 0 else None
    return CanvasDraw(rot, scale, place, count, offset, side, cut, f_rot, f_scale, f_pos, angle, amp, noise)


def _ink_box(x: torch.Tensor) -> torch.Tensor:
    """Each image's ink box (x0, y0, x1, y1) in px from its frame's centre; the whole frame when it has no ink.

    Shapes: x (B, 1, h, w) -> (B, 4) float64.
    """
    _, _, h, w = x.shape
    top, left, bottom, right = bounding_boxes(x).double().unbind(-1)
    empty = bottom < top
    box = torch.stack([left - w / 2, top - h / 2, right + 1 - w / 2, bottom + 1 - h / 2], -1)  # (B, 4)
    return torch.where(empty[:, None], box.new_tensor([-w / 2, -h / 2, w / 2, h / 2]), box)


def _rotation(deg: torch.Tensor) -> torch.Tensor:
    """(B,) degrees -> (B, 2, 2) acting on (x, y) with y down: counter-clockwise as displayed for positive angles."""
    t = torch.deg2rad(deg)
    c, s = torch.cos(t), torch.sin(t)
    return torch.stack([torch.stack([c, s], -1), torch.stack([-s, c], -1)], -2)  # (B, 2, 2)


def _warp(src: torch.Tensor, deg: torch.Tensor, scale: torch.Tensor, centre: torch.Tensor, position: torch.Tensor,
          size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``src`` turned by ``deg`` and scaled about its point ``centre``, that point put at ``position`` on the canvas.

    The forward map is p = scale R (q - centre) + position, q and p in px from the centres of the source frame and
    of the canvas; bilinear, zero outside. Shapes: src (B, 1, h, w), deg, scale (B,), centre, position (B, 2)
    -> canvas (B, 1, size, size), q (B, size, size, 2) the source point each canvas pixel samples.
    """
    B, _, h, w = src.shape
    R_inv = _rotation(deg).transpose(1, 2) / scale[:, None, None]  # (B, 2, 2): q - centre = R^T (p - position) / scale
    to_norm = R_inv.new_tensor([2 / w, 2 / h])  # source px -> grid_sample's [-1, 1]
    A = to_norm[None, :, None] * R_inv * (size / 2)  # canvas [-1, 1] -> source [-1, 1]
    b = to_norm * (centre - (R_inv @ position[:, :, None])[..., 0])  # (B, 2)
    theta = torch.cat([A, b[:, :, None]], 2).float().to(src.device)  # (B, 2, 3)
    grid = F.affine_grid(theta, [B, 1, size, size], align_corners=False)  # (B, size, size, 2)
    out = F.grid_sample(src, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    return out, grid * grid.new_tensor([w / 2, h / 2])


def render_canvases(digits: torch.Tensor, targets: torch.Tensor, draw: CanvasDraw, *,
                    rule: CanvasRule = IN_DISTRIBUTION, size: int = CANVAS) -> tuple[torch.Tensor, torch.Tensor]:
    """The canvases that ``draw`` describes, with ``digits[targets]`` as their targets (see ``make_canvases``)."""
    if digits.dim() != 4 or digits.shape[1] != 1:
        raise ValueError(f"digits must be (N, 1, H, W), got {tuple(digits.shape)}")
    N, _, h, w = digits.shape
    dev = digits.device
    targets = targets.to(dev).long()
    B = len(targets)
    if B and (targets.min() < 0 or targets.max() >= N):
        raise ValueError(f"targets must index the {N} digits, got values {int(targets.min())}..{int(targets.max())}")
    if len(draw.rotation_deg) != B or draw.source_offset.shape[1] != rule.fragments[1]:
        raise ValueError(f"the draw is for {len(draw.rotation_deg)} canvases with {draw.source_offset.shape[1]} fragment "
                         f"slots, not {B} targets and {rule.fragments[1]}: draw with the same rule and number")
    if rule.fragments[1] and rule.fragment_size[1] > min(h, w):
        raise ValueError(f"fragment_size {rule.fragment_size} does not fit the {h}x{w} digits; use a smaller one")
    if B == 0:  # no canvases (affine_grid refuses an empty batch)
        return torch.zeros(0, 1, size, size, device=dev), torch.zeros(0, 1, size, size, dtype=torch.uint8, device=dev)
    d = {k: (v.to(dev) if v is not None else None) for k, v in vars(draw).items()}
    half = size / 2

    # The target: the rotated, scaled corners of its ink box bound where it goes; place it uniformly so that the box
    # stays 1 px inside (bilinear sampling spreads ink by up to a pixel), centred on an axis where it cannot.
    x = unit_float(digits[targets])  # (B, 1, h, w)
    box = _ink_box(x)  # (B, 4)
    corners = torch.stack([box[:, [0, 1]], box[:, [2, 1]], box[:, [0, 3]], box[:, [2, 3]]], 1)  # (B, 4, 2)
    moved = d["scale"][:, None, None] * corners @ _rotation(d["rotation_deg"]).transpose(1, 2)  # (B, 4, 2)
    lo = -half + 1 - moved.amin(1)  # (B, 2): the least position keeping the box inside
    hi = half - 1 - moved.amax(1)
    position = torch.where(hi >= lo, lo + d["place"] * (hi - lo), (lo + hi) / 2)
    target, _ = _warp(x, d["rotation_deg"], d["scale"], torch.zeros_like(position), position, size)
    target = target.clamp_(0, 1)  # (B, 1, size, size)
    masks = (target > rule.threshold).to(torch.uint8)
    image = target.clone()

    # Clutter: one slot at a time, a square cut from another digit (its centre inside that digit's ink box).
    for k in range(draw.source_offset.shape[1]):
        shown = d["count"] > k  # (B,); no skipping of unused slots: that would sync with a GPU every batch
        src = unit_float(digits[(targets + d["source_offset"][:, k]) % N])  # (B, 1, h, w)
        sbox = _ink_box(src)
        r = d["side"][:, k, None].double() / 2  # (B, 1)
        frame = sbox.new_tensor([w / 2, h / 2])  # the cut stays inside the source's frame
        centre = sbox[:, :2] + d["cut"][:, k] * (sbox[:, 2:] - sbox[:, :2])  # (B, 2)
        centre = torch.maximum(torch.minimum(centre, frame - r), r - frame)
        frag, q = _warp(src, d["frag_rotation_deg"][:, k], d["frag_scale"][:, k], centre, d["frag_position"][:, k], size)
        inside = ((q - centre[:, None, None].float()).abs().amax(-1) <= r[:, :, None].float())  # (B, size, size)
        frag = frag * (inside & shown[:, None, None])[:, None]
        image = torch.maximum(image, frag)

    # A linear ramp from 0 at one corner to its amplitude at the opposite one, along a random direction.
    u = (torch.arange(size, device=dev, dtype=torch.float64) + 0.5 - half) / half  # (size,) in (-1, 1)
    cos, sin = torch.cos(d["ramp_angle"]), torch.sin(d["ramp_angle"])  # (B,)
    along = (cos[:, None, None] * u[None, None, :] + sin[:, None, None] * u[None, :, None])  # (B, size, size)
    ramp = d["ramp_amplitude"][:, None, None] * (1 + along / (cos.abs() + sin.abs())[:, None, None]) / 2
    image = image + ramp[:, None].float()
    if d["noise"] is not None:
        image = image + d["noise"].float()
    return image.clamp_(0, 1), masks


def make_canvases(digits: torch.Tensor, targets: torch.Tensor, generator: torch.Generator | None, *,
                  rule: CanvasRule = IN_DISTRIBUTION, size: int = CANVAS) -> tuple[torch.Tensor, torch.Tensor]:
    """Cluttered canvases, one per target digit, and the target's mask.

    ``digits`` is the pool (targets and the digits fragments are cut from); the generator may live on any device:
    the draws are made there and the drawing is done on the digits' device.

    Shapes: digits (N, 1, h, w) uint8 0..255 or float 0..1, targets (B,) int64 indices into digits
    -> images (B, 1, size, size) float32 in [0, 1], masks (B, 1, size, size) uint8 0/1.
    """
    draw = draw_canvases(len(targets), len(digits), generator, rule=rule, size=size)
    return render_canvases(digits, targets, draw, rule=rule, size=size)


def random_canvases(digits: torch.Tensor, idx: torch.Tensor, generator: torch.Generator | None,
                    rule: CanvasRule = IN_DISTRIBUTION, *, size: int = CANVAS) -> tuple[torch.Tensor, torch.Tensor]:
    """A training batch drawn on the fly: the digits at ``idx`` as targets, clutter from the whole pool."""
    return make_canvases(digits, idx, generator, rule=rule, size=size)


def segmentation_test(digits: torch.Tensor, n: int = 10000, *, seed: int, rule: CanvasRule = IN_DISTRIBUTION,
                      batch_size: int = 1000, size: int = CANVAS) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed test set: canvas i has digit ``i % N`` as its target; on the CPU from one generator seeded by ``seed``.

    Each batch draws for a full ``batch_size`` canvases, so the set of n canvases is a prefix of any larger one for
    the same seed, rule and batch size, and it is the same whichever device the digits are on.

    Shapes: digits (N, 1, h, w) -> images (n, 1, size, size) float32, masks (n, 1, size, size) uint8.
    """
    if n < 0 or batch_size < 1:
        raise ValueError(f"need n >= 0 and batch_size >= 1, got {n} and {batch_size}")
    digits = digits.cpu()
    g = torch.Generator().manual_seed(seed)
    parts = [(torch.zeros(0, 1, size, size), torch.zeros(0, 1, size, size, dtype=torch.uint8))]
    for start in range(0, n, batch_size):
        m = min(batch_size, n - start)
        draw = draw_canvases(batch_size, len(digits), g, rule=rule, size=size)[:m]  # a full batch's draws: prefixes
        parts.append(render_canvases(digits, torch.arange(start, start + m) % len(digits), draw, rule=rule, size=size))
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


# ---------------------------------------------------------------------------------------------- the user's folders

def load_mask_folder(images_dir: str | Path, masks_dir: str | Path
                     ) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """The user's PNG images and masks, paired by file name (``images/a.png`` with ``masks/a.png``), checked.

    Images (``opaque_image_array``): grayscale (L, or 1-bit) gives 1 channel and RGB 3; a palette image (P) reads
    as grey when every entry of its palette is grey, else as RGB; an image with any transparent pixel (an alpha
    channel or a tRNS entry) is refused, as its colours alone would lose a shape held in the alpha, and an alpha
    that is opaque everywhere is dropped; 16- and 32-bit images (I;16, I, F) and 16-bit colour are refused: save
    them as 8-bit. All images must have one size and one channel count. Masks (``mask_array``): 1-bit, 8-bit
    grayscale holding 0/1 or 0/255, or 16-bit grayscale holding 0/1, 0/255 or 0/65535 (a mask all 0 is fine, a
    folder of them all 0 is not: nothing to segment, and any model would score Dice 1 on it); an RGB mask is
    accepted when its channels are equal; a palette mask is read by its indices when they are 0/1 or 0/255, else by
    its greys (refused when an index it uses is in colour); transparency is refused. An image and its mask must
    have one size and one EXIF orientation (each file is turned by its own). Every file is read and checked before
    anything is returned; a problem is a ``DataError`` (a ValueError) naming the file and the fix. Nothing is
    written.

    Shapes: -> images (N, C, H, W) uint8, masks (N, 1, H, W) uint8 0/1, names: the N file stems, sorted.
    """
    images, masks, names = load_png_pairs(images_dir, masks_dir)
    if len(masks) and not masks.any():
        raise DataError(f"every mask in {masks_dir} is empty (all 0): there is nothing to segment, and a model "
                        f"predicting nothing would score Dice 1; give masks with the objects marked 255 (or 1)")
    return images, masks, names


# ---------------------------------------------------------------------------------------------- baseline and metrics

def _gray_levels(images: torch.Tensor) -> torch.Tensor:
    """(N, C, H, W) uint8 or float [0, 1] -> (N, H*W) float64 grey levels in [0, 255] (channel mean)."""
    if images.dim() != 4:
        raise ValueError(f"images must be (N, C, H, W), got {tuple(images.shape)}")
    x = images.double() if images.is_floating_point() else images.double() / 255.0
    return (x.mean(1).flatten(1) * 255).clamp(0, 255)  # (N, H*W)


def otsu_threshold(images: torch.Tensor) -> torch.Tensor:
    """Otsu's threshold per image (Otsu 1979): the split of a 256-bin histogram maximising between-class variance.

    Grey levels are ``round(255 x)`` (the channel mean for C > 1); the split after level k is returned as the value
    ``(k + 0.5) / 255`` in [0, 1], so ``image > threshold`` is the upper class. Among equal maxima the lowest k is
    taken; an image of one level gets the threshold just above it (all background).

    Shapes: images (N, C, H, W) uint8 or float in [0, 1] -> (N,) float64.
    """
    levels = _gray_levels(images).round().long()  # (N, P)
    N = len(levels)
    hist = torch.zeros(N, 256, dtype=torch.float64, device=levels.device).scatter_add_(
        1, levels, torch.ones_like(levels, dtype=torch.float64))
    p = hist / hist.sum(1, keepdim=True).clamp(min=1)  # (N, 256)
    w0 = p.cumsum(1)  # class 0 = levels <= k
    mu = (p * torch.arange(256, dtype=torch.float64, device=p.device)).cumsum(1)
    mu_t = mu[:, -1:]
    valid = (w0 > 1e-12) & (w0 < 1 - 1e-12)
    sigma_b = torch.where(valid, (mu_t * w0 - mu) ** 2 / (w0 * (1 - w0)).clamp(min=1e-300), -1.0)  # (N, 256)
    k = sigma_b.argmax(1)
    k = torch.where(valid.any(1), k, levels.amax(1) if levels.shape[1] else torch.zeros_like(k))
    return (k.double() + 0.5) / 255


def otsu_masks(images: torch.Tensor) -> torch.Tensor:
    """Pixels above each image's Otsu threshold. Shapes: (N, C, H, W) -> (N, 1, H, W) uint8 0/1."""
    N, _, H, W = images.shape
    levels = _gray_levels(images).round()  # (N, H*W)
    return (levels / 255 > otsu_threshold(images)[:, None]).view(N, 1, H, W).to(torch.uint8)


def dice_iou(pred: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dice 2|P & T| / (|P| + |T|) and IoU |P & T| / |P | T| per image; both 1 when P and T are empty.

    Shapes: pred, target (N, 1, H, W) bool, uint8 or float holding only 0 and 1 -> dice (N,), iou (N,) float64.
    """
    if pred.shape != target.shape or pred.dim() != 4:
        raise ValueError(f"pred and target must both be (N, 1, H, W), got {tuple(pred.shape)} and {tuple(target.shape)}")
    for name, m in (("pred", pred), ("target", target)):
        if m.numel() and not ((m == 0) | (m == 1)).all():
            raise ValueError(f"{name} must hold only 0 and 1; threshold probabilities first (for example p > 0.5)")
    return overlap_scores(pred.bool(), target.bool())


def overlap_scores(pred: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``dice_iou`` of boolean masks, unchecked and without waiting for the device (the training loop's).

    Shapes: pred, target (N, ...) bool -> dice (N,), iou (N,) float64 (float32 on MPS).
    """
    p, t = pred.flatten(1), target.flatten(1)  # (N, P)
    wide = sum_dtype(p.device)  # float64 (float32 on MPS, which has none)
    inter = (p & t).sum(1).to(wide)
    total = p.sum(1).to(wide) + t.sum(1).to(wide)
    union = (p | t).sum(1).to(wide)
    one = torch.ones_like(inter)
    return (torch.where(total > 0, 2 * inter / total.clamp(min=1), one),
            torch.where(union > 0, inter / union.clamp(min=1), one))
