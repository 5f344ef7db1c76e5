"""Losses of capsule networks (Sabour et al. 2017, sections 3 and 4.1)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["margin_loss", "reconstruction_loss", "spread_loss", "multi_hot"]


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

    Shapes:
        lengths: (B, J) capsule lengths
        targets: (B,) class indices, or (B, J) multi-hot (overlapping digits)
        returns: () scalar
    """
    if lengths.dim() != 2:
        raise ValueError(f"lengths must be (B, J), got shape {tuple(lengths.shape)}")
    B, J = lengths.shape
    if targets.dim() == 1:
        if targets.shape[0] != B:
            raise ValueError(f"targets (B,) must match lengths' batch {B}, got shape {tuple(targets.shape)}")
        if validate and targets.numel() and (targets.min() < 0 or targets.max() >= J):
            raise ValueError(f"class indices must lie in [0, {J}), got min {int(targets.min())} max {int(targets.max())}")
        T = F.one_hot(targets.long(), J).to(lengths.dtype)  # (B, J)
    elif tuple(targets.shape) == (B, J):
        if validate and targets.numel() and (targets.min() < 0 or targets.max() > 1):
            raise ValueError(f"multi-hot targets must lie in [0, 1], got min {float(targets.min())} max {float(targets.max())}")
        T = targets.to(lengths.dtype)
    else:
        raise ValueError(f"targets must be (B,) indices or (B, J) = ({B}, {J}) multi-hot, got shape {tuple(targets.shape)}")
    present = T * F.relu(m_plus - lengths).pow(2)
    absent = lam * (1.0 - T) * F.relu(lengths - m_minus).pow(2)
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
    B = images.shape[0]
    if reconstructions.shape[0] != B:
        raise ValueError(f"reconstructions hold {reconstructions.shape[0]} images but images hold {B}")
    r = reconstructions.reshape(B, -1)
    if r.dtype in (torch.float16, torch.bfloat16):
        r = r.float()  # autocast's half-precision decoder output: sum 784 squared errors in fp32
    x = images.reshape(B, -1).to(r.dtype)
    if r.shape != x.shape:
        raise ValueError(f"reconstructions {tuple(reconstructions.shape)} and images {tuple(images.shape)} differ in pixels per image")
    return scale * (r - x).pow(2).sum(dim=1).mean()


def multi_hot(labels: torch.Tensor, num_classes: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Class indices as multi-hot rows (MultiMNIST pairs: both classes set).

    Shapes: labels (B, K) int -> (B, num_classes), 1 at every listed class.
    """
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
    T = F.one_hot(targets.long(), J).to(activations.dtype) if targets.dim() == 1 else targets.to(activations.dtype)
    if tuple(T.shape) != (B, J):
        raise ValueError(f"targets must be (B,) indices or (B, J) = ({B}, {J}) multi-hot, got shape {tuple(targets.shape)}")
    gap = activations.unsqueeze(1) - activations.unsqueeze(2)  # gap[b, t, i] = a_i - a_t, (B, J, J)
    pairs = T.unsqueeze(2) * (1.0 - T).unsqueeze(1)  # t a target, i not one, (B, J, J)
    return (pairs * F.relu(margin + gap).pow(2)).sum(dim=(1, 2)).mean()
