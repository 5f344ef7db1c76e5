"""Figures of a trained CapsNet as matplotlib ``Figure`` objects, made without pyplot (headless, in servers).

Each ``plot_*`` function draws arrays from ``capsnet.figures.arrays``;
``save_figure`` writes one atomically.
"""
from __future__ import annotations

import contextlib
import contextvars
import math
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import torch

from ..checkpoint import atomic_write
from ..data.sets import shown_range, unit_float
from .arrays import FigureError, PairReconstructions, Reconstructions, RoutingTrace, overlay_pair

if TYPE_CHECKING:  # matplotlib is imported only when a figure is drawn
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure

__all__ = ["FORMATS", "BARELY_MOVES", "sweep_change", "plot_reconstructions", "plot_misclassified", "plot_pose_sweep", "plot_routing", "plot_lengths",
           "plot_training_curves", "plot_multimnist", "save_figure"]

FORMATS = ("png", "svg", "pdf")


def _figure(width: float, height: float) -> "Figure":
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _short(name: str, limit: int = 18) -> str:
    """A class name cut to ``limit`` characters for a title or a tick (a user's class folders can be long), the cut
    shown by an ellipsis."""
    return name if len(name) <= limit else name[:limit - 1] + "…"


def _file_tail(name: str, limit: int) -> str:
    """A user's file ``CLASS/FILE.png`` for a panel's title: the file alone (the title names its class), cut from
    the left where it is long, so the end that tells IMG_20240312_0001.png from _0002.png stays."""
    name = name.rsplit("/", 1)[-1]
    return name if len(name) <= limit else "…" + name[-(limit - 1):]


MAX_TICKS = 20  # class names under one panel's bars: past this, every k-th bar is named


def shown_image(image: torch.Tensor) -> torch.Tensor:
    """An image (C, H, W) or (H, W) as it is drawn: (H, W) grey or (H, W, 3) colour in [0, 1]. Two channels (smallNORB's
    two cameras) side by side, (H, 2W); values outside [0, 1] (inputs standardised per image: CIFAR-10's, smallNORB's)
    stretched from their own minimum to maximum, where clamping turned everything below the mean black."""
    img = unit_float(image.detach().cpu()).float()  # uint8 data set images
    if img.dim() == 3:
        img = img[0] if img.shape[0] == 1 else torch.cat(list(img), dim=-1) if img.shape[0] == 2 else \
            img.permute(1, 2, 0)
    if img.numel() and (shown := shown_range(img)) != (0.0, 1.0):
        img = (img - shown[0]) / (shown[1] - shown[0])
    return img.clamp(0, 1)


def _show(ax, image: torch.Tensor, title: str | None = None) -> None:
    ax.imshow(shown_image(image).numpy(), cmap="gray", vmin=0, vmax=1)
    ax.set_xticks([])
    ax.set_yticks([])
    if title:
        ax.set_title(title, fontsize=8)


def plot_reconstructions(images: torch.Tensor, rec: Reconstructions, labels: torch.Tensor,
                         classes: Sequence[str] | None = None,
                         model_classes: Sequence[str] | None = None) -> "Figure":
    """Inputs (top row) above their reconstructions from the predicted capsule (bottom row). ``classes`` name the
    true labels, ``model_classes`` (``classes`` when None) the model's capsules: a model shown on a data set of
    other classes predicts its own."""
    N = len(images)
    if N == 0:
        raise FigureError("no inputs to show the reconstructions of")
    name = (lambda k: classes[k]) if classes else str
    model_classes = model_classes or classes
    own = (lambda k: model_classes[k]) if model_classes else str
    fig = _figure(max(4.0, 1.1 * N), 2.9)
    axes = fig.subplots(2, N, squeeze=False)
    for n in range(N):
        t, p = int(labels[n]), int(rec.predicted[n])
        _show(axes[0, n], images[n], f"true {name(t)}\npred {own(p)}" + (" ✗" if t != p else ""))
        _show(axes[1, n], rec.from_predicted[n])
    axes[0, 0].set_ylabel("input", fontsize=9)
    axes[1, 0].set_ylabel("reconstruction", fontsize=9)
    fig.suptitle("Test inputs and their reconstructions from the longest digit capsule", fontsize=10)
    return fig


def plot_misclassified(images: torch.Tensor, rec: Reconstructions, labels: torch.Tensor,
                       classes: Sequence[str] | None = None, indices: Sequence[int] | None = None,
                       model_classes: Sequence[str] | None = None, names: Sequence[str] | None = None) -> "Figure":
    """Sabour et al. 2017, Figure 3 (right): each misread input decoded from the true and the predicted capsule;
    ``indices``: their test indices, shown above them (to find them again: --indices, the viewer); ``names``: their
    files (a user's folder), shown under the index; ``classes`` name the true labels, ``model_classes``
    (``classes`` when None) the capsules decoded from."""
    if rec.from_label is None:
        raise FigureError("misclassified reconstructions need the true labels")
    N = len(images)
    if N == 0:
        raise FigureError("no misclassified examples to show")
    name = (lambda k: _short(classes[k], 12)) if classes else str
    model_classes = model_classes or classes
    own = (lambda k: _short(model_classes[k], 12)) if model_classes else str
    fig = _figure(max(4.0, 1.1 * N), 4.0 + (0.25 if names else 0))
    axes = fig.subplots(3, N, squeeze=False)
    for n in range(N):
        t, p = int(labels[n]), int(rec.predicted[n])
        head = ("" if indices is None else f"#{indices[n]}: ") + (f"{_file_tail(names[n], 14)}\n" if names else "")
        _show(axes[0, n], images[n], head + f"true {name(t)}\npred {own(p)}")
        _show(axes[1, n], rec.from_label[n], f"as {own(t)}")
        _show(axes[2, n], rec.from_predicted[n], f"as {own(p)}")
    axes[0, 0].set_ylabel("input", fontsize=9)
    axes[1, 0].set_ylabel("from true\ncapsule", fontsize=9)
    axes[2, 0].set_ylabel("from predicted\ncapsule", fontsize=9)
    fig.suptitle("Misclassified test inputs, reconstructed from the true and the predicted class's capsule",
                 fontsize=10)
    return fig


BARELY_MOVES = 0.02  # a sweep whose tiles differ from the unswept one by less (mean |pixel change|) says so


def sweep_change(sweep: torch.Tensor, deltas: Sequence[float]) -> torch.Tensor:
    """Per swept dimension, the largest mean absolute pixel change of a tile from the unswept (delta 0) tile.

    Shapes: sweep (A, K, ...) with K = len(deltas), one of them 0; returns (A,) in pixel units (0..1).
    """
    zero = min(range(len(deltas)), key=lambda k: abs(deltas[k]))
    tiles = sweep.detach().cpu().float().clamp(0, 1).flatten(2)  # (A, K, pixels)
    return (tiles - tiles[:, zero:zero + 1]).abs().mean(-1).amax(-1)


def plot_pose_sweep(sweep: torch.Tensor, dims: Sequence[int], deltas: Sequence[float], *, label: str = "",
                    image: torch.Tensor | None = None) -> "Figure":
    """One grid: a row per pose dimension, a column per delta (Sabour et al. 2017, Figure 4).

    Where no dimension moves the reconstruction by more than ``BARELY_MOVES`` (mean absolute pixel change),
    as for a barely trained model, whose sweeps all look alike, the figure says so in its title.

    Shapes: sweep (len(dims), len(deltas), H, W) or (..., C, H, W); image (C, H, W) or None.
    """
    A, K = sweep.shape[:2]
    if A != len(dims) or K != len(deltas):
        raise FigureError(f"sweep is {A} x {K} but {len(dims)} dims and {len(deltas)} deltas were given")
    tiles = sweep.detach().cpu().float().clamp(0, 1)
    if tiles.dim() == 4:
        tiles = tiles.unsqueeze(2)  # (A, K, C, H, W)
    if tiles.shape[2] == 2:  # smallNORB's two cameras side by side, as shown_image draws them
        tiles = torch.cat([tiles[:, :, :1], tiles[:, :, 1:]], dim=-1)
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
    ax.set_xticks([k * (W + pad) + W / 2 for k in range(K)], [f"{d:+.4g}" for d in deltas], fontsize=7)  # as
    # asked: +.2f read 0.125 as +0.12 and 0.0005 as +0.00
    ax.set_xlabel("change of the dimension's value", fontsize=8)
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    moved = float(sweep_change(sweep, deltas).max())
    why = ("the capsule is barely trained or ignores these dimensions" if max(map(abs, deltas)) >= 0.25 else
           "a wider range of changes moves it further")
    still = (f"\nthe reconstruction barely moves (at most {moved:.3f} mean pixel change): {why}"
             if moved < BARELY_MOVES else "")
    fig.suptitle(f"Pose sweep{' of ' + label if label else ''}\neach row moves one dimension of the capsule by "
                 f"the amount under its column, then decodes{still}", fontsize=9, color="#a00" if still else "black")
    return fig


def plot_routing(trace: RoutingTrace, n: int, *, image: torch.Tensor | None = None,
                 classes: Sequence[str] | None = None) -> "Figure":
    """Coupling maps round by round (rows) for every digit capsule (columns), and the primary capsule lengths. On
    a 1x1 grid (Efficient-CapsNet's 16 primary capsules) each class gets a strip of its coupling from every lower
    capsule, one cell each: averaged over the types, a map there was a single cell."""
    types, H, W = trace.grid
    strips = H * W == 1
    # (R, J, rows, cols): per position averaged over types, or per lower capsule (types x 1) on a 1x1 grid
    maps = trace.coupling[n].permute(0, 2, 1).reshape(*trace.coupling.shape[1:2], -1, types, 1) if strips else \
        trace.coupling_maps()[n]
    R, J = maps.shape[:2]
    name = (lambda k: classes[k]) if classes else str
    fig = _figure(1.15 * (J + 1) + 0.6, 1.2 * R + 2.8)
    sub = fig.subfigures(2, 1, height_ratios=[1.2 * R + 0.5, 2.2])
    axes = sub[0].subplots(R, J + 1, squeeze=False)
    # one scale for every panel (round 1 is uniform: the scale shows what routing changed), shared as one object:
    # the colour bar's widening of a constant range (one routing round, coupling all 1/J) then moves every panel
    norm = _one_scale(float(maps.min()), float(maps.max()))
    pred = int(trace.lengths[n].argmax())
    im = None
    for r in range(R):
        if image is not None and r == 0:
            _show(axes[0, 0], image, "input")
        else:
            axes[r, 0].axis("off")
        for j in range(J):
            ax = axes[r, j + 1]
            im = ax.imshow(maps[r, j].numpy(), cmap="viridis", norm=norm, aspect="auto" if strips else None)
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(f"{name(j)}{' (pred)' if j == pred else ''}", fontsize=8)
            if j == 0:
                ax.set_ylabel(f"round {r + 1}", fontsize=8)
    sub[0].colorbar(im, ax=axes[:, -1], shrink=0.8, label="coupling c_ij")
    sub[0].suptitle(f"Coupling from the {trace.coupling.shape[2]} lower capsules to each class capsule, " + (
                    "one cell per lower capsule (top: capsule 0)" if strips else
                    f"averaged over the {types} types, per position") + "; rows: routing rounds", fontsize=9)
    prim = trace.primary_maps()[n]  # (types, rows, cols)
    cols = min(types, 16)
    rows = math.ceil(types / cols)
    axes2 = sub[1].subplots(rows, cols, squeeze=False)
    pnorm = _one_scale(0.0, float(prim.max()))
    for t in range(rows * cols):
        ax = axes2[t // cols, t % cols]
        ax.set_xticks([])
        ax.set_yticks([])
        if t < types:
            pim = ax.imshow(prim[t].numpy(), cmap="magma", norm=pnorm)
            ax.set_title(f"type {t}", fontsize=6)
        else:
            ax.axis("off")
    sub[1].colorbar(pim, ax=axes2[:, -1], shrink=0.8, label=trace.primary_are.rstrip("s"))
    sub[1].suptitle(f"Lower capsule {trace.primary_are}, one map per capsule type", fontsize=9)
    return fig


def _one_scale(lo: float, hi: float) -> "Normalize":
    """One colour scale for several panels, from ``lo`` to ``hi``; a constant (``lo == hi``, or a spread within
    float32 rounding of the values: one routing round's uniform coupling, 0.1 +- 7.5e-9 once averaged, drawn as
    bright maps with dark corners) is centred on a narrow range around it, so every panel shows it in the same
    middle colour."""
    from matplotlib.colors import Normalize

    if hi - lo <= 1e-6 * max(abs(lo), abs(hi)):
        mid = (lo + hi) / 2
        pad = max(abs(mid) * 0.05, 1e-6)
        lo, hi = mid - pad, mid + pad
    return Normalize(vmin=lo, vmax=hi)


def plot_lengths(lengths: torch.Tensor, labels: torch.Tensor | None = None, *, m_plus: float | None = 0.9,
                 m_minus: float | None = 0.1, classes: Sequence[str] | None = None, score: str = "capsule length",
                 indices: Sequence[int] | None = None, names: Sequence[str] | None = None) -> "Figure":
    """Bars of the class scores per input (``score`` names them: a CapsNet's capsule lengths, EM's activations, a
    probability), with the margin loss's m+ and m- drawn where the model trains with one (None: not drawn), each
    panel titled by its file (``names``: a user's folder), else its test index (``indices``), else its place."""
    lengths = lengths.detach().cpu()  # a model's own output (it requires grad; it may be on a GPU)
    N, J = lengths.shape
    if N == 0:
        raise FigureError("no inputs to show the class scores of")
    cols = min(N, 5)
    rows = math.ceil(N / cols)
    tick_names = [_short(classes[j] if classes else str(j)) for j in range(J)]
    step = math.ceil(J / MAX_TICKS)  # many classes: every step-th named (40 names under one panel were a smear)
    ticks = list(range(0, J, step))
    longest = max(len(tick_names[j]) for j in ticks)
    upright = len(ticks) * longest > 24  # names longer than a digit or two (Fashion-MNIST's, a user's class
    # folders) stand on end, not over each other; a title naming a long class takes a second line
    two_lines = labels is not None and (bool(names) or max(len(tick_names[int(k)]) for k in labels) > 8)
    fig = _figure(2.6 * cols, (2.1 + (0.06 * longest if upright else 0) + (0.15 if two_lines else 0)) * rows + 0.5)
    axes = fig.subplots(rows, cols, squeeze=False)
    for n in range(rows * cols):
        ax = axes[n // cols, n % cols]
        if n >= N:
            ax.axis("off")
            continue
        pred = int(lengths[n].argmax())
        colors = ["tab:orange" if j == pred else "tab:blue" for j in range(J)]
        ax.bar(range(J), lengths[n].numpy(), color=colors)
        if m_plus is not None:
            ax.axhline(m_plus, color="green", linestyle="--", linewidth=0.8, label=f"m+ = {m_plus}")
        if m_minus is not None:
            ax.axhline(m_minus, color="red", linestyle="--", linewidth=0.8, label=f"m- = {m_minus}")
        ax.set_ylim(0, 1)
        ax.set_xticks(ticks, [tick_names[j] for j in ticks], fontsize=7, rotation=90 if upright else 0)
        which = f"test image {indices[n]}" if indices is not None else f"input {n}"
        which = f"{which}, {_file_tail(names[n], 18)}" if names else which
        title = which if labels is None else f"{which}{chr(10) if two_lines else ': '}true {tick_names[int(labels[n])]}"
        ax.set_title(title, fontsize=8)
        if n % cols == 0:
            ax.set_ylabel(score, fontsize=8)
        if n == 0 and (m_plus is not None or m_minus is not None):
            ax.legend(fontsize=6, loc="upper left")
    fig.suptitle("Class scores: capsule lengths, activations or probabilities (the predicted class in orange)",
                 fontsize=10)
    return fig


def _series(records: list[dict], key: str, scale: float = 1.0) -> tuple[list, list]:
    """The epochs whose records hold ``key``, and its values (times ``scale``): a run evaluated every few epochs
    (--eval-every) has held-out figures in those records alone, each series one line through them (a NaN at the
    others broke it into dots, and a last epoch not evaluated left the series out)."""
    kept = [r for r in records if r.get(key) is not None]
    return [r["epoch"] for r in kept], [scale * r[key] for r in kept]


def plot_training_curves(runs: dict[str, list[dict]]) -> "Figure":
    """Loss, training accuracy and held-out error per epoch; one line per run."""
    from matplotlib.ticker import MaxNLocator

    fig = _figure(12, 3.4)
    ax_loss, ax_acc, ax_err = fig.subplots(1, 3)
    for name, records in runs.items():
        held = "val" if any("val_error" in r for r in records) else "test"
        line = ax_loss.plot(*_series(records, "train_loss"), marker="o", label=f"{name} train")[0]
        if any(f"{held}_loss" in r for r in records):
            ax_loss.plot(*_series(records, f"{held}_loss"), marker="o", linestyle="--", color=line.get_color(),
                         label=f"{name} {held}")
        if any("train_accuracy" in r for r in records):
            ax_acc.plot(*_series(records, "train_accuracy", 100), marker="o", color=line.get_color(), label=name)
        ax_err.plot(*_series(records, f"{held}_error", 100), marker="o", color=line.get_color(),
                    label=f"{name} ({held})")
    if any(k.endswith("_dice") for records in runs.values() for r in records for k in r):  # segmentation: Dice
        ax_loss.set(title="Loss (segmentation; SegCaps: + reconstruction)", xlabel="epoch", ylabel="loss")
        ax_acc.set(title="Training Dice (training batches)", xlabel="epoch", ylabel="Dice (%)")
        ax_err.set(title="Held-out 1 - Dice", xlabel="epoch", ylabel="1 - Dice (%)")
    else:
        ax_loss.set(title="Loss (the model's own;\nCapsNet: margin + reconstruction)", xlabel="epoch", ylabel="loss")
        ax_acc.set(title="Training accuracy (augmented batches)", xlabel="epoch", ylabel="accuracy (%)")
        ax_err.set(title="Held-out error", xlabel="epoch", ylabel="error (%)")
    for ax in (ax_loss, ax_acc, ax_err):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        # whole epochs only, also for a run of one epoch (its axis ticked 0.96, 0.98, ... 1.04)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
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


_DRAWING: contextvars.ContextVar[Any] = contextvars.ContextVar("capsnet_figures_bar", default=None)


@contextlib.contextmanager
def drawing(bar: Any) -> Iterator[None]:
    """Inside the block every ``save_figure`` ticks ``bar`` (a progress bar of the figures written)."""
    token = _DRAWING.set(bar)
    try:
        yield
    finally:
        _DRAWING.reset(token)


_SVG_SALT = threading.Lock()  # SVG's id salt is a global setting: one save sets and restores it at a time


def save_figure(fig: "Figure", path: str | os.PathLike[str], *, dpi: int = 100) -> Path:
    """Write ``fig`` to ``path`` (format from the suffix) via a temporary file, so no partial file is left.

    PDF and SVG carry no creation date (nor SVG a random id), so a figure made twice gives the same bytes (its
    first save: saving one Figure object again can move its layout by a pixel). Only SVG's id salt is set, for
    the save alone and under a lock: the rest of matplotlib's settings are not touched (``rc_context`` restored
    all of them afterwards, undoing a setting another thread made meanwhile).
    """
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower()
    if fmt not in FORMATS:
        raise FigureError(f"unknown figure format {fmt!r} for {path}; use one of {', '.join(FORMATS)}")
    metadata = {"png": {"Software": None}, "svg": {"Date": None}, "pdf": {"CreationDate": None}}[fmt]
    path.parent.mkdir(parents=True, exist_ok=True)

    def write(f) -> None:
        import matplotlib

        save = dict(format=fmt, dpi=dpi, metadata=metadata, bbox_inches="tight", pad_inches=0.1)  # no clipped labels
        if fmt != "svg":
            fig.savefig(f, **save)
            return
        with _SVG_SALT:
            salt = matplotlib.rcParams["svg.hashsalt"]
            matplotlib.rcParams["svg.hashsalt"] = "capsnet"
            try:
                fig.savefig(f, **save)
            finally:
                matplotlib.rcParams["svg.hashsalt"] = salt

    atomic_write(path, write)
    bar = _DRAWING.get()
    if bar is not None:
        bar.update(1)
    return path
