"""Look inside a trained CapsNet: reconstructions, pose sweeps, routing maps, lengths, training curves.

Two layers, so notebooks can take either:

- array functions (``predict``, ``reconstructions``, ``swept_poses``,
  ``pose_sweep``, ``routing_trace``, ``read_metrics``) return tensors and
  need only torch;
- ``plot_*`` functions turn those arrays into matplotlib ``Figure`` objects
  (made without pyplot, so they work headless and in servers), and
  ``save_figure`` writes one atomically.

Sabour, Frosst and Hinton, "Dynamic Routing Between Capsules" (NIPS 2017):
reconstructions as in Figure 3, pose sweeps as in Figure 4 (each of the 16
dimensions moved from -0.25 to +0.25 in steps of 0.05), and for MultiMNIST
Figure 5: each pair of overlapping digits with its two reconstructions
overlaid in red and green.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, NamedTuple, Sequence

import torch

from .checkpoint import atomic_write
from .models.capsnet import CapsNet
from .routing import DynamicRouting

if TYPE_CHECKING:  # matplotlib is imported only by the plot functions
    from matplotlib.figure import Figure

__all__ = ["FigureError", "DEFAULT_DELTAS", "FORMATS", "Reconstructions", "RoutingTrace", "predict",
           "reconstructions", "swept_poses", "pose_sweep", "routing_trace", "read_metrics", "plot_reconstructions",
           "plot_misclassified", "plot_pose_sweep", "plot_routing", "plot_lengths", "plot_training_curves",
           "save_figure", "PairReconstructions", "pair_reconstructions", "overlay_pair", "plot_multimnist"]

DEFAULT_DELTAS: tuple[float, ...] = tuple(round(-0.25 + 0.05 * k, 2) for k in range(11))  # the paper's Figure 4
FORMATS = ("png", "svg", "pdf")


class FigureError(ValueError):
    """Input a figure cannot be made from; the message says what and how to fix it."""


# ---------------------------------------------------------------------------------------------- arrays


def _images(model: CapsNet, images: torch.Tensor) -> torch.Tensor:
    """uint8 0..255 or float 0..1 images (N, C, H, W) as float on the model's device."""
    cfg = model.config
    expected = (cfg.in_channels, cfg.input_height, cfg.input_width)
    if images.dim() == 3 and cfg.in_channels == 1:
        images = images.unsqueeze(1)
    if images.dim() != 4 or tuple(images.shape[1:]) != expected:
        raise FigureError(f"images must be (N, {', '.join(map(str, expected))}) for this model, "
                          f"got {tuple(images.shape)}")
    device = next(model.parameters()).device
    x = images.to(device)
    return x.float() / 255.0 if not x.is_floating_point() else x.float()


def _decoder(model: CapsNet) -> None:
    if model.decoder is None:
        raise FigureError("this CapsNet was trained without a decoder (decoder=False): it cannot reconstruct")


@torch.no_grad()
def predict(model: CapsNet, images: torch.Tensor, batch_size: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """Digit capsules and predictions, in eval mode.

    Shapes: images (N, C, H, W) -> poses (N, J, D), lengths (N, J), on the CPU.
    """
    model.eval()
    x = _images(model, images)
    poses, lengths = [], []
    for start in range(0, len(x), batch_size):
        out = model(x[start:start + batch_size])
        poses.append(out.poses.cpu())
        lengths.append(out.lengths.cpu())
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
        is uniform, 1/J, before any agreement).
    primary: (N, I), the primary capsule lengths.
    lengths: (N, J), the digit capsule lengths after the last round.
    grid: (types, rows, columns) of the primary capsules; I = types * rows * columns,
        ordered (type, row, column).
    """

    coupling: torch.Tensor
    primary: torch.Tensor
    lengths: torch.Tensor
    grid: tuple[int, int, int]

    def coupling_maps(self) -> torch.Tensor:
        """Coefficients averaged over the capsule types, per position: (N, R, J, rows, columns)."""
        N, R, _, J = self.coupling.shape
        c = self.coupling.reshape(N, R, *self.grid, J).mean(dim=2)  # (N, R, rows, cols, J)
        return c.permute(0, 1, 4, 2, 3)

    def primary_maps(self) -> torch.Tensor:
        """Primary capsule lengths per type and position: (N, types, rows, columns)."""
        return self.primary.reshape(self.primary.shape[0], *self.grid)


@torch.no_grad()
def routing_trace(model: CapsNet, images: torch.Tensor) -> RoutingTrace:
    """Coupling coefficients round by round, primary and digit capsule lengths."""
    model.eval()
    x = _images(model, images)
    routing = model.digits.routing
    if not isinstance(routing, DynamicRouting):
        raise FigureError(f"routing maps need dynamic routing; this model routes with {type(routing).__name__}")
    u = model.primary(torch.relu(model.conv1(x)))  # (N, I, D)
    rounds = []
    for r in range(1, routing.iterations + 1):
        step = DynamicRouting(r, leaky=routing.leaky, detach_agreement=routing.detach_agreement)
        result = step.route_linear(u, model.digits.weight, model.digits.bias)
        rounds.append(result.coupling.cpu())
    rows, cols = model.config.primary_grid
    return RoutingTrace(torch.stack(rounds, dim=1), u.norm(dim=-1).cpu(), result.activations.cpu(),
                        (model.config.primary_types, rows, cols))


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
        except json.JSONDecodeError as e:
            raise FigureError(f"{path}, line {n}, is not JSON ({e.msg}); the file is damaged: "
                              f"delete that line or rerun the training") from None
        if not isinstance(rec, dict) or not isinstance(rec.get("epoch"), int) or "train_loss" not in rec:
            raise FigureError(f"{path}, line {n}, is not a capsnet epoch record (needs 'epoch' and 'train_loss')")
        records.append(rec)
    if not records:
        raise FigureError(f"{path} holds no epoch yet: train at least one epoch first")
    return records


# ---------------------------------------------------------------------------------------------- plots


def _figure(width: float, height: float) -> "Figure":
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _show(ax, image: torch.Tensor, title: str | None = None) -> None:
    img = image.detach().cpu()
    img = img.float() / 255.0 if not img.is_floating_point() else img.float()  # uint8 data set images
    if img.dim() == 3:
        img = img[0] if img.shape[0] == 1 else img.permute(1, 2, 0)
    ax.imshow(img.clamp(0, 1).numpy(), cmap="gray", vmin=0, vmax=1)
    ax.set_xticks([])
    ax.set_yticks([])
    if title:
        ax.set_title(title, fontsize=8)


def plot_reconstructions(images: torch.Tensor, rec: Reconstructions, labels: torch.Tensor,
                         classes: Sequence[str] | None = None) -> "Figure":
    """Inputs (top row) above their reconstructions from the predicted capsule (bottom row)."""
    N = len(images)
    name = (lambda k: classes[k]) if classes else str
    fig = _figure(max(4.0, 1.1 * N), 2.9)
    axes = fig.subplots(2, N, squeeze=False)
    for n in range(N):
        t, p = int(labels[n]), int(rec.predicted[n])
        _show(axes[0, n], images[n], f"true {name(t)}\npred {name(p)}" + (" ✗" if t != p else ""))
        _show(axes[1, n], rec.from_predicted[n])
    axes[0, 0].set_ylabel("input", fontsize=9)
    axes[1, 0].set_ylabel("reconstruction", fontsize=9)
    fig.suptitle("Test inputs and their reconstructions from the longest digit capsule", fontsize=10)
    return fig


def plot_misclassified(images: torch.Tensor, rec: Reconstructions, labels: torch.Tensor,
                       classes: Sequence[str] | None = None) -> "Figure":
    """Sabour et al. 2017, Figure 3 (right): each misread input decoded from the true and the predicted capsule."""
    if rec.from_label is None:
        raise FigureError("misclassified reconstructions need the true labels")
    N = len(images)
    if N == 0:
        raise FigureError("no misclassified examples to show")
    name = (lambda k: classes[k]) if classes else str
    fig = _figure(max(4.0, 1.1 * N), 4.0)
    axes = fig.subplots(3, N, squeeze=False)
    for n in range(N):
        t, p = int(labels[n]), int(rec.predicted[n])
        _show(axes[0, n], images[n], f"true {name(t)}, pred {name(p)}")
        _show(axes[1, n], rec.from_label[n], f"as {name(t)}")
        _show(axes[2, n], rec.from_predicted[n], f"as {name(p)}")
    axes[0, 0].set_ylabel("input", fontsize=9)
    axes[1, 0].set_ylabel("from true\ncapsule", fontsize=9)
    axes[2, 0].set_ylabel("from predicted\ncapsule", fontsize=9)
    fig.suptitle("Misclassified test inputs, reconstructed from the true and the predicted class's capsule",
                 fontsize=10)
    return fig


def plot_pose_sweep(sweep: torch.Tensor, dims: Sequence[int], deltas: Sequence[float], *, label: str = "",
                    image: torch.Tensor | None = None) -> "Figure":
    """One grid: a row per pose dimension, a column per delta (Sabour et al. 2017, Figure 4).

    Shapes: sweep (len(dims), len(deltas), H, W) or (..., C, H, W); image (C, H, W) or None.
    """
    A, K = sweep.shape[:2]
    if A != len(dims) or K != len(deltas):
        raise FigureError(f"sweep is {A} x {K} but {len(dims)} dims and {len(deltas)} deltas were given")
    tiles = sweep.detach().cpu().float().clamp(0, 1)
    if tiles.dim() == 4:
        tiles = tiles.unsqueeze(2)  # (A, K, C, H, W)
    _, _, C, H, W = tiles.shape
    pad = 2
    # One montage, drawn by a single imshow: a 16 x 11 grid of subplots would take seconds to render.
    canvas = torch.ones(C, A * (H + pad) - pad, K * (W + pad) - pad)
    for a in range(A):
        for k in range(K):
            canvas[:, a * (H + pad):a * (H + pad) + H, k * (W + pad):k * (W + pad) + W] = tiles[a, k]
    extra = 1.3 if image is not None else 0.0
    fig = _figure(0.5 * K + extra + 1.0, 0.5 * A + 1.3)
    if image is not None:
        ax_in, ax = fig.subplots(1, 2, width_ratios=[extra, 0.5 * K])
        _show(ax_in, image, "input")
    else:
        ax = fig.subplots()
    ax.imshow(canvas[0].numpy() if C == 1 else canvas.permute(1, 2, 0).numpy(), cmap="gray", vmin=0, vmax=1,
              interpolation="nearest")
    ax.set_yticks([a * (H + pad) + H / 2 for a in range(A)], [f"dim {d}" for d in dims], fontsize=7)
    ax.set_xticks([k * (W + pad) + W / 2 for k in range(K)], [f"{d:+.2f}" for d in deltas], fontsize=7)
    ax.set_xlabel("change of the dimension's value", fontsize=8)
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    fig.suptitle(f"Pose sweep{' of ' + label if label else ''}\neach row moves one dimension of the capsule by "
                 f"the amount under its column, then decodes", fontsize=9)
    return fig


def plot_routing(trace: RoutingTrace, n: int, *, image: torch.Tensor | None = None,
                 classes: Sequence[str] | None = None) -> "Figure":
    """Coupling maps round by round (rows) for every digit capsule (columns), and the primary capsule lengths."""
    maps = trace.coupling_maps()[n]  # (R, J, rows, cols)
    R, J = maps.shape[:2]
    types = trace.grid[0]
    name = (lambda k: classes[k]) if classes else str
    fig = _figure(1.15 * (J + 1) + 0.6, 1.2 * R + 2.8)
    sub = fig.subfigures(2, 1, height_ratios=[1.2 * R + 0.5, 2.2])
    axes = sub[0].subplots(R, J + 1, squeeze=False)
    vmin, vmax = float(maps.min()), float(maps.max())  # round 1 is uniform: the scale shows what routing changed
    pred = int(trace.lengths[n].argmax())
    im = None
    for r in range(R):
        if image is not None and r == 0:
            _show(axes[0, 0], image, "input")
        else:
            axes[r, 0].axis("off")
        for j in range(J):
            ax = axes[r, j + 1]
            im = ax.imshow(maps[r, j].numpy(), cmap="viridis", vmin=vmin, vmax=vmax)
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(f"{name(j)}{' (pred)' if j == pred else ''}", fontsize=8)
            if j == 0:
                ax.set_ylabel(f"round {r + 1}", fontsize=8)
    sub[0].colorbar(im, ax=axes[:, -1], shrink=0.8, label="coupling c_ij")
    sub[0].suptitle(f"Coupling from the {trace.coupling.shape[2]} primary capsules to each digit capsule, "
                    f"averaged over the {types} types, per position; rows: routing rounds", fontsize=9)
    prim = trace.primary_maps()[n]  # (types, rows, cols)
    cols = min(types, 16)
    rows = math.ceil(types / cols)
    axes2 = sub[1].subplots(rows, cols, squeeze=False)
    pmax = float(prim.max())
    for t in range(rows * cols):
        ax = axes2[t // cols, t % cols]
        ax.set_xticks([])
        ax.set_yticks([])
        if t < types:
            pim = ax.imshow(prim[t].numpy(), cmap="magma", vmin=0, vmax=pmax)
            ax.set_title(f"type {t}", fontsize=6)
        else:
            ax.axis("off")
    sub[1].colorbar(pim, ax=axes2[:, -1], shrink=0.8, label="length")
    sub[1].suptitle("Primary capsule lengths, one map per capsule type", fontsize=9)
    return fig


def plot_lengths(lengths: torch.Tensor, labels: torch.Tensor | None = None, *, m_plus: float = 0.9,
                 m_minus: float = 0.1, classes: Sequence[str] | None = None) -> "Figure":
    """Bars of the digit capsule lengths per input, with the margin loss's m+ and m- drawn."""
    N, J = lengths.shape
    cols = min(N, 5)
    rows = math.ceil(N / cols)
    fig = _figure(2.6 * cols, 2.1 * rows + 0.5)
    axes = fig.subplots(rows, cols, squeeze=False)
    names = [classes[j] if classes else str(j) for j in range(J)]
    for n in range(rows * cols):
        ax = axes[n // cols, n % cols]
        if n >= N:
            ax.axis("off")
            continue
        pred = int(lengths[n].argmax())
        colors = ["tab:orange" if j == pred else "tab:blue" for j in range(J)]
        ax.bar(range(J), lengths[n].numpy(), color=colors)
        ax.axhline(m_plus, color="green", linestyle="--", linewidth=0.8, label=f"m+ = {m_plus}")
        ax.axhline(m_minus, color="red", linestyle="--", linewidth=0.8, label=f"m- = {m_minus}")
        ax.set_ylim(0, 1)
        ax.set_xticks(range(J), names, fontsize=7)
        title = f"input {n}" if labels is None else f"input {n}: true {names[int(labels[n])]}"
        ax.set_title(title, fontsize=8)
        if n % cols == 0:
            ax.set_ylabel("capsule length", fontsize=8)
        if n == 0:
            ax.legend(fontsize=6, loc="upper left")
    fig.suptitle("Digit capsule lengths (the predicted class in orange)", fontsize=10)
    return fig


def plot_training_curves(runs: dict[str, list[dict]]) -> "Figure":
    """Loss, training accuracy and held-out error per epoch; one line per run."""
    fig = _figure(12, 3.4)
    ax_loss, ax_acc, ax_err = fig.subplots(1, 3)
    for name, records in runs.items():
        epochs = [r["epoch"] for r in records]
        held = "val" if "val_error" in records[-1] else "test"
        line = ax_loss.plot(epochs, [r["train_loss"] for r in records], marker="o", label=f"{name} train")[0]
        if f"{held}_loss" in records[-1]:
            ax_loss.plot(epochs, [r.get(f"{held}_loss", math.nan) for r in records], marker="o", linestyle="--",
                         color=line.get_color(), label=f"{name} {held}")
        if "train_accuracy" in records[-1]:
            ax_acc.plot(epochs, [100 * r.get("train_accuracy", math.nan) for r in records], marker="o",
                        color=line.get_color(), label=name)
        ax_err.plot(epochs, [100 * r.get(f"{held}_error", math.nan) for r in records], marker="o",
                    color=line.get_color(), label=f"{name} ({held})")
    ax_loss.set(title="Loss (margin + 0.0005 x reconstruction)", xlabel="epoch", ylabel="loss")
    ax_acc.set(title="Training accuracy (augmented batches)", xlabel="epoch", ylabel="accuracy (%)")
    ax_err.set(title="Held-out error", xlabel="epoch", ylabel="error (%)")
    for ax in (ax_loss, ax_acc, ax_err):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        ax.xaxis.get_major_locator().set_params(integer=True)
    return fig


def plot_multimnist(images: torch.Tensor, rec: PairReconstructions, labels: torch.Tensor,
                    classes: Sequence[str] | None = None) -> "Figure":
    """Sabour et al. 2017, Figure 5: each MultiMNIST input (top) above its two reconstructions, red and green.

    Titles give the labels L:(a,b) and the decoded capsules R:(r,g), red's
    first; a cross marks a pair whose two longest capsules are not its two labels.
    """
    N = len(images)
    if N == 0:
        raise FigureError("no MultiMNIST images to show")
    if tuple(labels.shape) != (N, 2) or tuple(rec.capsules.shape) != (N, 2):
        raise FigureError(f"need (N, 2) = ({N}, 2) labels and decoded capsules, got {tuple(labels.shape)} and "
                          f"{tuple(rec.capsules.shape)}")
    name = (lambda k: classes[k]) if classes else str
    fig = _figure(max(4.0, 1.2 * N), 3.1)
    axes = fig.subplots(2, N, squeeze=False)
    top2 = rec.lengths.topk(2, dim=1).indices.sort(dim=1).values
    for n in range(N):
        a, b = (int(v) for v in labels[n])
        r, g = (int(v) for v in rec.capsules[n])
        wrong = top2[n].tolist() != sorted((a, b))
        _show(axes[0, n], images[n], f"L:({name(a)},{name(b)})" + (" ✗" if wrong else ""))
        axes[1, n].imshow(overlay_pair(rec.reconstructions[n, 0], rec.reconstructions[n, 1]).numpy())
        axes[1, n].set_xticks([])
        axes[1, n].set_yticks([])
        axes[1, n].set_title(f"R:({name(r)},{name(g)})", fontsize=8)
    axes[0, 0].set_ylabel("input", fontsize=9)
    axes[1, 0].set_ylabel("reconstructions", fontsize=9)
    fig.suptitle("MultiMNIST: each digit decoded from its own capsule, first in red, second in green", fontsize=10)
    return fig


def save_figure(fig: "Figure", path: str | os.PathLike[str], *, dpi: int = 100) -> Path:
    """Write ``fig`` to ``path`` (format from the suffix) via a temporary file, so no partial file is left.

    PDF and SVG carry no creation date, so the same figure gives the same bytes.
    """
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower()
    if fmt not in FORMATS:
        raise FigureError(f"unknown figure format {fmt!r} for {path}; use one of {', '.join(FORMATS)}")
    metadata = {"png": {"Software": None}, "svg": {"Date": None}, "pdf": {"CreationDate": None}}[fmt]
    path.parent.mkdir(parents=True, exist_ok=True)

    def write(f) -> None:
        import matplotlib

        with matplotlib.rc_context({"svg.hashsalt": "capsnet"}):
            fig.savefig(f, format=fmt, dpi=dpi, metadata=metadata, bbox_inches="tight", pad_inches=0.1)  # no clipped labels

    atomic_write(path, write)
    return path
