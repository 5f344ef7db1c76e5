"""What a trained CapsNet does, as tensors: predictions, reconstructions, pose sweeps, routing rounds, metrics.

These functions need only torch and return CPU tensors, so notebooks can
take them without matplotlib; ``capsnet.figures.plots`` draws them.

Sabour, Frosst and Hinton, "Dynamic Routing Between Capsules" (NIPS 2017):
reconstructions as in Figure 3, pose sweeps as in Figure 4 (each of the 16
dimensions moved from -0.25 to +0.25 in steps of 0.05), and for MultiMNIST
Figure 5: each pair of overlapping digits with its two reconstructions.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, NamedTuple, Sequence

import torch

from .._numbers import is_real
from .._progress import progress_bar
from ..checkpoint import short_repr
from ..data.sets import unit_float
from ..models import cannot_reconstruct, segments, segments_size
from ..models.capsnet import CapsNet
from ..routing import checked_view
from ..runtime import keeps_mode

__all__ = ["FigureError", "DEFAULT_DELTAS", "Reconstructions", "PairReconstructions", "RoutingTrace", "predict",
           "reconstructions", "pair_reconstructions", "overlay_pair", "swept_poses", "sweep_deltas", "pose_sweep",
           "routing_trace", "read_metrics"]

DEFAULT_DELTAS: tuple[float, ...] = tuple(round(-0.25 + 0.05 * k, 2) for k in range(11))  # the paper's Figure 4


class FigureError(ValueError):
    """Input a figure cannot be made from; the message says what and how to fix it."""


def _images(model: CapsNet, images: torch.Tensor) -> torch.Tensor:
    """uint8 0..255 or float 0..1 images (N, C, H, W) as float on the model's device."""
    cfg = model.config
    expected = (cfg.in_channels, cfg.input_height, cfg.input_width)
    if images.dim() == 3 and cfg.in_channels == 1:
        images = images.unsqueeze(1)
    if images.dim() == 4 and tuple(images.shape[1:]) != expected:
        try:  # a segmentation model segments any size its stride divides
            other_size = segments_size(model, tuple(images.shape[1:]), "the input")
        except ValueError as e:
            raise FigureError(str(e)) from None
        if other_size:
            expected = tuple(images.shape[1:])
    if images.dim() != 4 or tuple(images.shape[1:]) != expected:
        raise FigureError(f"images must be (N, {', '.join(map(str, expected))}) for this model, "
                          f"got {tuple(images.shape)}")
    device = next(model.parameters()).device
    x = images.to(device)
    return unit_float(x)


def _decoder(model: CapsNet) -> None:
    why = cannot_reconstruct(model)
    # a segmentation model's decoder has no reconstruct method: predict says what it draws
    if why is not None and not (segments(model) and getattr(model, "decoder", None) is not None):
        raise FigureError(why)


@torch.no_grad()
@keeps_mode
def predict(model: CapsNet, images: torch.Tensor, batch_size: int = 256, *, progress: bool = False
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Class capsules and their scores (lengths for CapsNet), in eval mode; ``progress`` shows a bar over the batches.

    Shapes: images (N, C, H, W) -> poses (N, J, D), scores (N, J), on the CPU.
    """
    model.eval()
    x = _images(model, images)
    poses, lengths = [], []
    for start in progress_bar(range(0, len(x), batch_size), desc="classify", unit="batch", leave=False,
                              progress=progress):
        out = model(x[start:start + batch_size])
        if not (hasattr(out, "poses") and hasattr(out, "scores")):  # the CNN baseline's logits, SegCaps' grids
            raise FigureError(f"this {type(model).__name__} has no class capsules: predict reads a capsule "
                              f"classifier's poses and scores")
        poses.append(out.poses.cpu())
        lengths.append(out.scores.cpu())
    if not poses:
        raise FigureError("no images given")
    return torch.cat(poses), torch.cat(lengths)


class Reconstructions(NamedTuple):
    predicted: torch.Tensor  # (N,) the longest capsule
    from_predicted: torch.Tensor  # (N, C, H, W) decoded from the predicted class's capsule
    from_label: torch.Tensor | None  # (N, C, H, W) decoded from the true label's capsule, when labels are given
    lengths: torch.Tensor  # (N, J)


@torch.no_grad()
def reconstructions(model: CapsNet, images: torch.Tensor, labels: torch.Tensor | None = None) -> Reconstructions:
    """Decode each image from its predicted capsule (inference) and, given labels, from its true one.

    Shapes: images (N, C, H, W), labels (N,) or None; outputs on the CPU.
    """
    _decoder(model)
    poses, lengths = predict(model, images)
    device = next(model.parameters()).device
    predicted = lengths.argmax(dim=1)
    from_pred = model.reconstruct(poses.to(device), predicted.to(device)).cpu()
    from_label = None
    if labels is not None:
        labels = torch.as_tensor(labels).long()
        if labels.shape != predicted.shape:
            raise FigureError(f"labels must be ({len(predicted)},), one per image, got {tuple(labels.shape)}")
        from_label = model.reconstruct(poses.to(device), labels.to(device)).cpu()
    return Reconstructions(predicted, from_pred, from_label, lengths)


class PairReconstructions(NamedTuple):
    capsules: torch.Tensor  # (N, 2) the two capsules decoded, longest first unless chosen
    reconstructions: torch.Tensor  # (N, 2, C, H, W) one digit decoded from each
    lengths: torch.Tensor  # (N, J)


@torch.no_grad()
def pair_reconstructions(model: CapsNet, images: torch.Tensor, capsules: torch.Tensor | None = None
                         ) -> PairReconstructions:
    """Decode two digits from each MultiMNIST image, each from its own capsule (section 6).

    ``capsules`` (N, 2) picks them (e.g. the labels); by default the two
    longest, as at inference. Shapes: images (N, C, H, W) -> outputs on the CPU.
    """
    _decoder(model)
    poses, lengths = predict(model, images)
    if capsules is None:
        capsules = lengths.topk(2, dim=1).indices  # (N, 2)
    capsules = torch.as_tensor(capsules).long()
    J = lengths.shape[1]
    if capsules.shape != (len(lengths), 2) or capsules.min() < 0 or capsules.max() >= J:
        raise FigureError(f"capsules must be (N, 2) = ({len(lengths)}, 2) class indices in 0..{J - 1}, "
                          f"got shape {tuple(capsules.shape)}")
    device = next(model.parameters()).device
    rec = model.reconstruct(poses.to(device), capsules.to(device)).cpu()  # (N, 2, C, H, W)
    return PairReconstructions(capsules, rec, lengths)


def overlay_pair(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """Two one-channel images as one RGB image: the first in red, the second in green (yellow where both).

    Shapes: first, second (1, H, W) or (H, W) in [0, 1] -> (H, W, 3) float in [0, 1].
    """
    a, b = first.detach().cpu().float().reshape(first.shape[-2:]), second.detach().cpu().float().reshape(second.shape[-2:])
    if a.shape != b.shape:
        raise FigureError(f"the two reconstructions differ in size: {tuple(a.shape)} and {tuple(b.shape)}")
    return torch.stack([a, b, torch.zeros_like(a)], dim=-1).clamp(0, 1)  # (H, W, 3)


def _check_dims(dims: Iterable[int], D: int) -> list[int]:
    dims = [int(d) for d in dims]
    if not dims:
        raise FigureError("no pose dimensions chosen")
    bad = [d for d in dims if not 0 <= d < D]
    if bad:
        raise FigureError(f"pose dimension(s) {bad} out of range: the digit capsules have {D} dimensions, 0..{D - 1}")
    return dims


def _check_deltas(deltas: Sequence[float]) -> torch.Tensor:
    t = torch.as_tensor(list(deltas), dtype=torch.float64)  # cast once, to the pose dtype, so deltas are exact there
    if t.numel() == 0 or not torch.isfinite(t).all():
        raise FigureError(f"deltas must be a non-empty list of finite numbers, got {list(deltas)}")
    return t


def swept_poses(pose: torch.Tensor, dims: Iterable[int], deltas: Sequence[float] = DEFAULT_DELTAS) -> torch.Tensor:
    """One capsule with one coordinate moved at a time.

    ``out[a, k] = pose`` except ``out[a, k, dims[a]] = pose[dims[a]] + deltas[k]``.

    Shapes: pose (D,) -> (len(dims), len(deltas), D)
    """
    if pose.dim() != 1:
        raise FigureError(f"pose must be one capsule (D,), got shape {tuple(pose.shape)}")
    dims = _check_dims(dims, pose.shape[0])
    d = _check_deltas(deltas).to(pose)
    out = pose.expand(len(dims), len(d), pose.shape[0]).clone()
    for a, dim in enumerate(dims):
        out[a, :, dim] += d
    return out


def sweep_deltas(delta_range: float, step: float) -> list[float]:
    """The deltas of a sweep from -``delta_range`` to +``delta_range`` in steps of ``step``, passing through 0.

    ``sweep_deltas(0.25, 0.05)`` is the paper's Figure 4 (``DEFAULT_DELTAS``).
    """
    half = delta_range / step  # steps on each side of 0 (infinite for a tiny step: round() of it raised)
    if not math.isfinite(half) or abs(half - round(half)) > 1e-6 or not 1 <= round(half) <= 100:
        raise FigureError(f"--delta-range {delta_range:g} is not a whole number of --delta-step {step:g} (1 to 100 "
                          f"steps each side, so the sweep passes through 0); e.g. --delta-range 0.25 --delta-step 0.05")
    return [round(k * step, 10) for k in range(-round(half), round(half) + 1)]


@torch.no_grad()
def pose_sweep(model: CapsNet, images: torch.Tensor, labels: torch.Tensor | None = None,
               dims: Iterable[int] | None = None, deltas: Sequence[float] = DEFAULT_DELTAS) -> torch.Tensor:
    """The paper's Figure 4: reconstructions as one pose dimension moves (Sabour et al. 2017, section 5.1).

    For each image, the capsule of its label (or, without labels, of its
    predicted class) is swept by ``swept_poses`` and decoded, the other capsules
    masked out as at inference.

    Shapes: images (N, C, H, W) -> (N, len(dims), len(deltas), H, W) for one
    channel, (N, len(dims), len(deltas), C, H, W) otherwise; on the CPU.
    """
    _decoder(model)
    poses, lengths = predict(model, images)
    N, J, D = poses.shape
    classes = lengths.argmax(dim=1) if labels is None else torch.as_tensor(labels).long().cpu()
    if classes.shape != (N,):
        raise FigureError(f"labels must be ({N},), one per image, got {tuple(classes.shape)}")
    if ((classes < 0) | (classes >= J)).any():
        raise FigureError(f"labels must be classes 0..{J - 1}, got {classes.tolist()}")
    dims = _check_dims(range(D) if dims is None else dims, D)
    deltas_t = _check_deltas(deltas)
    device = next(model.parameters()).device
    out = []
    for n in range(N):
        sweep = swept_poses(poses[n, classes[n]], dims, deltas_t.tolist())  # (A, K, D)
        A, K, _ = sweep.shape
        batch = poses[n].expand(A * K, J, D).clone()
        batch[:, classes[n]] = sweep.reshape(A * K, D)
        rec = model.reconstruct(batch.to(device), classes[n].expand(A * K).to(device)).cpu()  # (A*K, C, H, W)
        out.append(rec.reshape(A, K, *rec.shape[1:]))
    result = torch.stack(out)  # (N, A, K, C, H, W)
    return result.squeeze(3) if result.shape[3] == 1 else result


@dataclass
class RoutingTrace:
    """What routing did for some images.

    coupling: (N, R, I, J), the coefficients c_ij used in round r + 1 (round 1
        is uniform, 1/J, before any agreement; the last is what the model used),
        as ``RoutingResult.rounds`` numbers them.
    primary: (N, I), the lower capsules' lengths (or activations).
    lengths: (N, J), the class scores (capsule lengths for CapsNet).
    grid: (types, rows, columns) of the primary capsules; I = types * rows * columns,
        ordered (type, row, column).
    primary_are: what ``primary`` holds, "lengths", "activations" (EM's) or "largest couplings" (inverted).
    """

    coupling: torch.Tensor
    primary: torch.Tensor
    lengths: torch.Tensor
    grid: tuple[int, int, int]
    primary_are: str = "lengths"

    def coupling_maps(self) -> torch.Tensor:
        """Coefficients averaged over the capsule types, per position: (N, R, J, rows, columns)."""
        N, R, _, J = self.coupling.shape
        c = self.coupling.reshape(N, R, *self.grid, J).mean(dim=2)  # (N, R, rows, cols, J)
        return c.permute(0, 1, 4, 2, 3)

    def primary_maps(self) -> torch.Tensor:
        """Primary capsule lengths per type and position: (N, types, rows, columns)."""
        return self.primary.reshape(self.primary.shape[0], *self.grid)


@torch.no_grad()
@keeps_mode
def routing_trace(model: torch.nn.Module, images: torch.Tensor) -> RoutingTrace:
    """Coupling coefficients round by round, the lower capsules and the class scores, from one recorded pass
    of the model's last routing layer (any model with a ``routing_view`` method: every capsule model here)."""
    if not hasattr(model, "routing_view"):
        raise FigureError(f"routing maps need a capsule model; {type(model).__name__} has no routing_view")
    model.eval()
    try:
        view = checked_view(model.routing_view(_images(model, images)), model)
    except ValueError as e:
        raise FigureError(str(e)) from None
    return RoutingTrace(view.rounds.cpu(), view.children.cpu(), view.scores.cpu(), view.grid, view.children_are)


def _number(v: Any) -> bool:
    """A metric's value: a real number (NaN allowed: a diverged epoch) within float's range, not a bool."""
    return is_real(v) and (isinstance(v, float) or abs(v) <= 1 << 1023)


def read_metrics(run_dir: str | os.PathLike[str]) -> list[dict]:
    """The per-epoch records of a run's ``metrics.jsonl``, checked."""
    path = Path(run_dir)
    path = path / "metrics.jsonl" if path.is_dir() else path
    if not path.is_file():
        raise FigureError(f"{path} not found: give a run directory written by `capsnet train`")
    records = []
    for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as e:  # nested past Python's limit too (found by fuzzing)
            raise FigureError(f"{path}, line {n}, is not JSON ({getattr(e, 'msg', 'nested too deep')}); the file is "
                              f"damaged: delete that line or rerun the training") from None
        if not isinstance(rec, dict) or not isinstance(rec.get("epoch"), int) or \
                not ("train_loss" in rec or "train_g_loss" in rec):  # a GAN's record has each network's loss
            raise FigureError(f"{path}, line {n}, is not a capsnet epoch record (needs 'epoch' and 'train_loss', or "
                              f"a GAN's 'train_g_loss')")
        bad = sorted(k for k, v in rec.items() if k.startswith(("train_", "test_", "val_")) and not _number(v))
        if bad:  # plotted as numbers: null, a list or a 400-digit integer failed after the other figures were made
            raise FigureError(f"{path}, line {n}: {', '.join(bad[:3])} must be numbers, got "
                              f"{short_repr(rec[bad[0]])}; the file is damaged: delete that line or rerun the "
                              f"training")
        if records and rec["epoch"] <= records[-1]["epoch"]:  # a curve doubled back (two files joined, a line
            raise FigureError(f"{path}, line {n}: epoch {rec['epoch']} after epoch {records[-1]['epoch']}; the epochs "
                              f"of a run's records increase, so the file is damaged: delete the repeated lines or "
                              f"rerun the training")  # repeated by hand)
        records.append(rec)
    if not records:
        raise FigureError(f"{path} holds no epoch yet: train at least one epoch first")
    return records
