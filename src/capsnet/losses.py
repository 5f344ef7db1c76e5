"""Losses of capsule networks (Sabour et al. 2017, sections 3 and 4.1) and of segmentation (SegCaps, U-Net)."""
from __future__ import annotations

import contextlib
import contextvars
import math

import torch
import torch.nn.functional as F

from ._eager import eager
from ._numbers import is_count
from .routing.result import check_switch


__all__ = ["check_nonempty", "check_mask_values", "check_recon_weight", "margin_loss", "reconstruction_loss",
           "spread_loss", "multi_hot", "SEGMENTATION_LOSSES", "WEIGHTED_SEGMENTATION_LOSSES", "segmentation_loss",
           "soft_dice", "foreground_weight", "batch_foreground_weight"]

# the weighted cross-entropy's foreground weight of the whole batch, where a process sees only its slice of it
_BATCH_FOREGROUND_WEIGHT: contextvars.ContextVar[torch.Tensor | None] = contextvars.ContextVar(
    "batch_foreground_weight", default=None)


def check_nonempty(batch: int) -> None:
    """A ValueError for a loss over an empty batch: its mean over no examples is NaN (or a reshape error), which an
    optimizer step would write into every weight. A forward pass of no images is fine (no outputs)."""
    if batch == 0:
        raise ValueError("a loss over an empty batch (0 examples) is undefined (its mean is NaN); give at least one "
                         "example")


def check_mask_values(masks: torch.Tensor) -> None:
    """A ValueError unless segmentation ``masks`` lie in [0, 1] (read on the CPU only): 0/255 masks trained towards
    255 and scored a loss of thousands without a word."""
    if masks.device.type != "cpu" or not eager() or not masks.numel() or masks.dtype == torch.bool:
        return
    low, high = masks.min().item(), masks.max().item()
    if low < 0 or high > 1:
        fix = "divide 0/255 masks by 255 (or give masks > 0)" if high > 1 and low >= 0 else "give masks of 0 and 1"
        raise ValueError(f"masks must hold 0 (background) and 1 (foreground), got values from {low:g} to {high:g}: "
                         f"{fix}")


def check_recon_weight(weight: float, name: str = "recon_weight") -> None:
    """A ValueError unless a reconstruction loss's weight is a finite number >= 0: a negative one made a loss that
    training lowers by reconstructing worse (SegCaps' loss), NaN a NaN loss, and CapsNet's loss dropped both
    without a word."""
    _check_constant(name, weight, " (0: no reconstruction loss; the paper's 0.0005)")


def _check_constant(name: str, value: object, hint: str = "", *, low: float | None = 0.0) -> None:
    """A ValueError unless ``value`` is a finite real number (not a bool, not a string) of at least ``low`` (None:
    any finite number): a loss's constant, which a negative or NaN value turned into a loss training lowers by
    getting worse, a loss of exactly 0 (no gradient) or NaN, and a string into torch's bare TypeError."""
    try:
        ok = not isinstance(value, (bool, str)) and math.isfinite(value) and (low is None or value >= low)
    except TypeError:
        ok = False
    if not ok:
        want = "a finite number" + (f" >= {low:g}" if low is not None else "")
        raise ValueError(f"{name} must be {want}{hint}, got {value!r}")


def _check_index_dtype(targets: torch.Tensor, what: str = "class indices") -> None:
    """A ValueError for float or bool class indices: 2.9 was truncated to class 2, and True read as class 1, silently."""
    if targets.is_floating_point() or targets.dtype == torch.bool or targets.is_complex():
        raise ValueError(f"{what} must be integers, got {targets.dtype}; (B, J) multi-hot targets may be floats")


def foreground_weight(masks: torch.Tensor) -> torch.Tensor:
    """The weighted cross-entropy's weight of a foreground pixel: background pixels per foreground one, at least 1
    (an empty batch weighs nothing extra). Shapes: masks (B, 1, H, W) 0/1; returns ()."""
    m = masks.float()
    fg = m.sum()
    return ((m.numel() - fg) / fg.clamp_min(1)).clamp_min(1).detach()


@contextlib.contextmanager
def batch_foreground_weight(masks: torch.Tensor):
    """Within it, ``segmentation_loss`` weighs the foreground as ``masks``' whole batch does: a process of a
    multi-process step computes its slice's loss with the weight one process computes for the whole batch."""
    token = _BATCH_FOREGROUND_WEIGHT.set(foreground_weight(masks))
    try:
        yield
    finally:
        _BATCH_FOREGROUND_WEIGHT.reset(token)


def _one_hot(index: torch.Tensor, num_classes: int, dtype: torch.dtype) -> torch.Tensor:
    """``F.one_hot(index, num_classes).to(dtype)``; under a torch.func transform (vmap(grad): per-example gradients)
    or a trace, a comparison with the class numbers, as F.one_hot reads the indices on the host (its range check),
    which a transform cannot (an out-of-range index then gives a row of zeros, not an error).

    Shapes: index (...) integers -> (..., num_classes)."""
    if eager():
        return F.one_hot(index.long(), num_classes).to(dtype)
    return (index.long().unsqueeze(-1) == torch.arange(num_classes, device=index.device)).to(dtype)


def _refuse_out_of_range(targets: torch.Tensor, J: int) -> None:
    """A ValueError when class indices ``targets`` (B,) fall outside 0..J-1 (reads them on the host: callers decide
    when that is free)."""
    if targets.min() < 0 or targets.max() >= J:
        raise ValueError(f"class indices must lie in [0, {J}), got min {int(targets.min())} max {int(targets.max())}")


def _refuse_multi_hot_out_of_range(targets: torch.Tensor) -> None:
    """A ValueError when (B, J) multi-hot ``targets`` leave [0, 1] (reads them on the host: callers decide when that
    is free)."""
    if targets.numel() and (targets.min() < 0 or targets.max() > 1):
        raise ValueError(f"multi-hot targets must lie in [0, 1], got min {float(targets.min())} max {float(targets.max())}")


def margin_loss(
    lengths: torch.Tensor,
    targets: torch.Tensor,
    *,
    m_plus: float = 0.9,
    m_minus: float = 0.1,
    lam: float = 0.5,
    validate: bool = True,
) -> torch.Tensor:
    """Eq. 4: ``T max(0, m+ - |v|)^2 + lam (1 - T) max(0, |v| - m-)^2``.

    Summed over the classes, averaged over the batch. ``validate=False`` skips
    the range check of the targets, which reads them on the host (a GPU sync);
    the training loop passes it for labels checked when the data set loaded.
    A torch.func transform (per-example gradients) or a trace skips it too: it
    cannot read them.

    Shapes:
        lengths: (B, J) capsule lengths
        targets: (B,) class indices, or (B, J) multi-hot (overlapping digits)
        returns: () scalar
    """
    if lengths.dim() != 2:
        raise ValueError(f"lengths must be (B, J), got shape {tuple(lengths.shape)}")
    B, J = lengths.shape
    check_nonempty(B)
    _check_constant("m_plus", m_plus, low=None)  # NaN made a NaN loss, a string torch's bare TypeError
    _check_constant("m_minus", m_minus, low=None)
    _check_constant("lam", lam, " (the paper's 0.5)")  # a negative one rewarded long wrong capsules
    check_switch("validate", validate)
    if targets.dim() == 1:
        if targets.shape[0] != B:
            raise ValueError(f"targets (B,) must match lengths' batch {B}, got shape {tuple(targets.shape)}")
        _check_index_dtype(targets)
        if validate and eager() and targets.numel():
            _refuse_out_of_range(targets, J)
        T = _one_hot(targets, J, lengths.dtype)  # (B, J)
    elif tuple(targets.shape) == (B, J):
        if validate and eager():
            _refuse_multi_hot_out_of_range(targets)
        T = targets.to(lengths.dtype)
    else:
        raise ValueError(f"targets must be (B,) indices or (B, J) = ({B}, {J}) multi-hot, got shape {tuple(targets.shape)}")
    # each term only where its weight is not 0: a class's weighted-out term that overflows (a score past ~1e19, or
    # 256 in float16) made 0 x inf = NaN of a right answer
    present = torch.where(T > 0, T * F.relu(m_plus - lengths).pow(2), 0.0)
    absent = lam * torch.where(T < 1, (1.0 - T) * F.relu(lengths - m_minus).pow(2), 0.0)
    return (present + absent).sum(dim=1).mean()


def reconstruction_loss(reconstructions: torch.Tensor, images: torch.Tensor, *, scale: float = 0.0005) -> torch.Tensor:
    """Sum of squared pixel errors per image, times ``scale``, mean over the batch.

    Section 4.1: the sum (not the mean) of squared differences, scaled down by
    0.0005 so it does not dominate the margin loss during training.

    Shapes:
        reconstructions: (B, ...) any layout with B * P elements
        images: (B, C, H, W) or (B, P) with the same number of pixels P
        returns: () scalar
    """
    check_recon_weight(scale, "scale")  # -1 made a loss that training lowers by reconstructing worse
    B = images.shape[0]
    if reconstructions.shape[0] != B:
        raise ValueError(f"reconstructions hold {reconstructions.shape[0]} images but images hold {B}")
    check_nonempty(B)  # a mean over none (and a reshape of 0 elements to (0, -1) fails)
    r = reconstructions.reshape(B, -1)
    if r.dtype in (torch.float16, torch.bfloat16):
        r = r.float()  # autocast's half-precision decoder output: sum 784 squared errors in fp32
    if not images.is_floating_point() and images.numel():  # integers only: no wait for floats
        lo, hi = int(images.min()), int(images.max())
        if lo < 0 or hi > 1:  # 0/1 integers are taken; 0-255 bytes against a sigmoid's [0, 1] scored 152 for 0.15
            raise ValueError(f"images are {images.dtype} from {lo} to {hi}; the reconstruction is compared with "
                             f"images in [0, 1]: capsnet.data.unit_float(images) converts 0-255 bytes")
    x = images.reshape(B, -1).to(r.dtype)
    if r.shape != x.shape:
        raise ValueError(f"reconstructions {tuple(reconstructions.shape)} and images {tuple(images.shape)} differ in pixels per image")
    return scale * (r - x).pow(2).sum(dim=1).mean()


def multi_hot(labels: torch.Tensor, num_classes: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Class indices as multi-hot rows (MultiMNIST pairs: both classes set).

    Shapes: labels (B, K) int -> (B, num_classes), 1 at every listed class.
    """
    if labels.dim() != 2:
        raise ValueError(f"labels must be (B, K) class indices, K of them per example, got shape {tuple(labels.shape)}")
    if not is_count(num_classes):
        raise ValueError(f"num_classes must be a positive integer, got {num_classes!r}")
    if labels.is_floating_point() or labels.dtype == torch.bool or labels.is_complex():  # 2.9 was class 2, silently
        raise ValueError(f"labels must be integer class indices, got {labels.dtype}")
    if labels.device.type == "cpu" and eager() and labels.numel():  # scatter's own was a bare "index 12 is out of
        _refuse_out_of_range(labels, num_classes)  # bounds" RuntimeError
    return torch.zeros(len(labels), num_classes, dtype=dtype, device=labels.device).scatter_(1, labels.long(), 1.0)


def spread_loss(activations: torch.Tensor, targets: torch.Tensor, margin: float) -> torch.Tensor:
    """Hinton et al. 2018, eq. 3: ``sum_{i != t} max(0, m - (a_t - a_i))^2``, averaged over the batch.

    Summed over the wrong classes i (the official code averages over the
    classes as well, a constant factor). With (B, K) multi-hot targets every
    target class is held ``m`` above every other class.

    Shapes:
        activations: (B, J) class capsule activations
        targets: (B,) class indices, or (B, J) multi-hot
        returns: () scalar
    """
    if activations.dim() != 2:
        raise ValueError(f"activations must be (B, J), got shape {tuple(activations.shape)}")
    B, J = activations.shape
    check_nonempty(B)  # a mean over no examples: NaN, which a step would write into every weight
    _check_constant("margin", margin, " (the paper's schedule runs from 0.2 to 0.9)")  # -1 gave a loss of 0, NaN NaN
    if targets.dim() == 1:
        _check_index_dtype(targets)
    if targets.dim() == 1 and targets.device.type == "cpu" and eager() and len(targets) == B and B:
        # as margin_loss says it (F.one_hot's own was a bare RuntimeError); on the CPU, where the check costs no
        # device sync (as mask_capsules)
        _refuse_out_of_range(targets, J)
    T = _one_hot(targets, J, activations.dtype) if targets.dim() == 1 else targets.to(activations.dtype)
    if tuple(T.shape) != (B, J):
        raise ValueError(f"targets must be (B,) indices or (B, J) = ({B}, {J}) multi-hot, got shape {tuple(targets.shape)}")
    if targets.dim() == 2 and targets.device.type == "cpu" and eager():  # 2 * eye held the gap at 2m, silently
        _refuse_multi_hot_out_of_range(targets)
    gap = activations.unsqueeze(1) - activations.unsqueeze(2)  # gap[b, t, i] = a_i - a_t, (B, J, J)
    pairs = T.unsqueeze(2) * (1.0 - T).unsqueeze(1)  # t a target, i not one, (B, J, J)
    # only the pairs that count: a pair weighted out whose gap overflows squared made 0 x inf = NaN (as margin_loss)
    return torch.where(pairs > 0, pairs * F.relu(margin + gap).pow(2), 0.0).sum(dim=(1, 2)).mean()


# "bce": binary cross-entropy per pixel; "weighted-bce": the foreground pixels weighted by the batch's
# background-to-foreground ratio (SegCaps' code weights by the training set's ratio); "dice": 1 - soft Dice;
# "bce+dice": their sum (the default of the segmentation models: the metric is Dice, BCE keeps every pixel's
# gradient alive).
SEGMENTATION_LOSSES = ("bce", "weighted-bce", "dice", "bce+dice", "margin", "weighted-margin")
WEIGHTED_SEGMENTATION_LOSSES = ("weighted-bce", "weighted-margin")  # foreground weighed by the batch's ratio
# SegCaps' code's margin loss ('mar', 'w_mar') per pixel: a foreground pixel shorter than 0.9 costs
# 0.5 w (0.9 - p)^2, a background one longer than 0.1 costs 0.25 (p - 0.1)^2 (its margin 0.4 about 0.5, its
# downweight 0.5), averaged over the pixels as Keras averages it
_SEG_M_PLUS, _SEG_M_MINUS, _SEG_DOWNWEIGHT = 0.9, 0.1, 0.5
_P_EPS = 1e-6  # probabilities are kept in [eps, 1 - eps] for the logarithms


def soft_dice(probabilities: torch.Tensor, masks: torch.Tensor, *, smooth: float = 1.0) -> torch.Tensor:
    """Per-example soft Dice ``(2 sum(p m) + smooth) / (sum(p) + sum(m) + smooth)``: (B,) in (0, 1]; ``smooth`` >= 0
    (with 0 an example whose mask and prediction are both empty scores 0/0 = NaN).

    Shapes: probabilities (B, 1, H, W) in [0, 1]; masks (B, 1, H, W) 0/1
    """
    if tuple(probabilities.shape) != tuple(masks.shape):  # they broadcast: one prediction scored against two masks
        raise ValueError(f"probabilities {tuple(probabilities.shape)} and masks {tuple(masks.shape)} must have the "
                         f"same shape (B, 1, H, W)")
    _check_constant("smooth", smooth, " (0: the exact Dice, NaN for an empty mask and an empty prediction, which the "
                                      "default 1 scores 1)")  # -1 scored an empty pair 1 and near-misses above it
    check_mask_values(masks)
    return _soft_dice(probabilities, masks, smooth=smooth)


def _soft_dice(probabilities: torch.Tensor, masks: torch.Tensor, *, smooth: float = 1.0) -> torch.Tensor:
    # in float32 at least, as the cross-entropy: bf16 sums of H*W pixels kept about 3 digits (U-Net's Dice under
    # autocast 0.8281 for 0.8271)
    dtype = torch.promote_types(probabilities.dtype, torch.float32)
    p, m = probabilities.to(dtype).flatten(1), masks.to(dtype).flatten(1)  # (B, H*W)
    return (2 * (p * m).sum(1) + smooth) / (p.sum(1) + m.sum(1) + smooth)


def segmentation_loss(probabilities: torch.Tensor, masks: torch.Tensor, kind: str = "bce+dice", *,
                      logits: torch.Tensor | None = None) -> torch.Tensor:
    """A segmentation loss of ``SEGMENTATION_LOSSES``, averaged over the batch.

    The capsule models give probabilities (a capsule's length, in [0, 1)), a
    CNN gives ``logits`` too, from which the cross-entropy is computed
    exactly (no clamping). ``margin`` and ``weighted-margin`` are SegCaps'
    code's margin loss on the probabilities (``mar``, ``w_mar``): per pixel
    0.5 w m max(0, 0.9 - p)^2 + 0.25 (1 - m) max(0, p - 0.1)^2, w 1 or the
    batch's background-to-foreground ratio, averaged over the pixels.

    Shapes: probabilities (B, 1, H, W); masks (B, 1, H, W) 0/1 (any dtype); logits as probabilities or None;
    returns ()
    """
    if kind not in SEGMENTATION_LOSSES:
        raise ValueError(f"unknown segmentation loss {kind!r}; valid values are {', '.join(SEGMENTATION_LOSSES)}")
    if probabilities.shape != masks.shape:
        raise ValueError(f"probabilities {tuple(probabilities.shape)} and masks {tuple(masks.shape)} must have one shape")
    check_nonempty(probabilities.shape[0])  # a mean over no examples: NaN, which a step writes into every weight
    check_mask_values(masks)
    m = masks.to(probabilities.dtype)
    loss = probabilities.new_zeros(())
    if kind in WEIGHTED_SEGMENTATION_LOSSES:  # background / foreground pixels of the batch (batch_foreground_weight's)
        whole = _BATCH_FOREGROUND_WEIGHT.get()
        pos_weight = foreground_weight(m) if whole is None else whole.to(m.device)
    else:
        pos_weight = None
    # the per-pixel terms from probabilities in float32 at least: in bf16 or fp16 1 - _P_EPS rounds to 1, and
    # log1p(-1) of a sure pixel is -inf; float64 kept (.float() lowered it: a gradient check in float64 failed by 4e-7)
    dt = torch.promote_types(probabilities.dtype, torch.float32)
    p, mt = probabilities.to(dt), m.to(dt)
    w = 1.0 if pos_weight is None else pos_weight
    if kind in ("margin", "weighted-margin"):
        short = (_SEG_M_PLUS - p).clamp_min(0)  # a foreground pixel's gap below 0.9
        long = (p - _SEG_M_MINUS).clamp_min(0)  # a background pixel's above 0.1
        return (0.5 * w * mt * short.square() + 0.5 * _SEG_DOWNWEIGHT * (1 - mt) * long.square()).mean()
    if kind in ("bce", "weighted-bce", "bce+dice"):
        if logits is not None:
            loss = loss + F.binary_cross_entropy_with_logits(logits, m, pos_weight=pos_weight)
        else:
            p = p.clamp(_P_EPS, 1 - _P_EPS)
            loss = loss - (w * mt * torch.log(p) + (1 - mt) * torch.log1p(-p)).mean()
    if kind in ("dice", "bce+dice"):
        loss = loss + (1 - _soft_dice(probabilities, m)).mean()
    return loss
