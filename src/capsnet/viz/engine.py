"""What the viewer computes: one CapsNet walked layer by layer for one image.

The server (``server.py``) only parses requests and calls ``Viewer``; this
module knows nothing of HTTP, so notebooks and tests can use it directly.
Every array leaves as an ``encode``d dict (uint8 + the range it maps to), small
enough to send to a browser as JSON. Segmentation models (SegCaps, the U-Net)
have their own ``SegmentationViewer`` (``segmentation.py``) answering the same
calls; ``load_viewer`` picks the one a checkpoint needs.
"""
from __future__ import annotations

import base64
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .._numbers import is_finite, is_int
from .._text import told_apart
from ..data.sets import shown_range
from ..models import cannot_reconstruct, reconstructs, segments
from ..models.capsnet import CapsNet, CapsNetConfig
from ..routing import checked_view, routing_is, routing_name

if TYPE_CHECKING:
    from .segmentation import SegmentationViewer
    from .synthesis import SynthesisViewer

__all__ = ["ViewerError", "Viewer", "load_viewer", "encode", "decode", "conv_kernels", "SWEEP_HALF_RANGE"]

SWEEP_HALF_RANGE = 0.25  # Sabour et al., Figure 4: each dimension moved within [-0.25, 0.25]


class ViewerError(ValueError):
    """A request the viewer cannot answer; the message says what was wrong and what to send instead."""


def encode(values: torch.Tensor | np.ndarray, lo: float | Sequence[float] | None = None,
           hi: float | Sequence[float] | None = None) -> dict[str, Any]:
    """An array as ``{"shape", "lo", "hi", "data"}``: data is base64 uint8, value = lo + byte / 255 * (hi - lo).

    ``lo``/``hi`` default to the array's minimum and maximum. A list gives one
    range per entry of the first axis (per kernel, per feature map).
    """
    a = torch.as_tensor(values).detach().float().cpu()
    n = a.shape[0] if a.dim() else 1
    per_entry = isinstance(lo, (list, tuple)) or isinstance(hi, (list, tuple))
    flat = a.reshape(n, -1) if per_entry else a.reshape(1, -1)
    lo_t = torch.as_tensor(lo if lo is not None else flat.min(dim=1).values, dtype=torch.float32).reshape(-1, 1)
    hi_t = torch.as_tensor(hi if hi is not None else flat.max(dim=1).values, dtype=torch.float32).reshape(-1, 1)
    span = torch.where(hi_t > lo_t, hi_t - lo_t, torch.ones_like(hi_t))
    q = ((flat - lo_t) / span).clamp(0, 1).mul(255).round().to(torch.uint8)
    lo_out = lo_t.flatten().tolist()
    hi_out = hi_t.flatten().tolist()
    return {"shape": list(a.shape), "lo": lo_out if per_entry else lo_out[0], "hi": hi_out if per_entry else hi_out[0],
            "data": base64.b64encode(q.numpy().tobytes()).decode("ascii")}


def decode(d: dict[str, Any]) -> np.ndarray:
    """The inverse of ``encode``, up to the 1/255 quantisation (for tests and notebooks)."""
    q = np.frombuffer(base64.b64decode(d["data"]), dtype=np.uint8).astype(np.float32) / 255
    lo, hi = np.asarray(d["lo"], dtype=np.float32), np.asarray(d["hi"], dtype=np.float32)
    n = lo.size
    q = q.reshape(n, -1)
    values = lo.reshape(-1, 1) + q * (hi - lo).reshape(-1, 1)
    return values.reshape(d["shape"])


def conv_kernels(conv: nn.Conv2d) -> dict[str, Any]:
    """A convolution's weights (K, C, k, k) as ``{"kernels": encoded}``, each kernel in its own symmetric range."""
    w = conv.weight.detach().float().cpu()  # (K, C, k, k)
    m = w.reshape(w.shape[0], -1).abs().amax(dim=1).clamp_min(1e-12)
    return {"kernels": encode(w, (-m).tolist(), m.tolist())}


@dataclass
class _Input:
    image: torch.Tensor  # (C, H, W) float in [0, 1]
    source: dict[str, Any]
    truth: torch.Tensor | None = None  # (1, H, W) 0/1: a segmentation test canvas's mask


def scores_are(model: nn.Module) -> str:
    """What a classifier's class scores are, for the page's words: "lengths" (capsule lengths, the margin loss's),
    "activations" (EM routing's, the spread loss's) or "probabilities" (the inverted model's softmax)."""
    from ..models import MODELS

    # the registry's word for the model's scores; a config of one's own, not registered (the Viewer takes any model
    # with a routing view), has that of the registered config it derives from, else capsule lengths
    by_config = {spec.config: spec.scores for spec in MODELS.values()}
    own = next((by_config[c] for c in type(model.config).__mro__ if c in by_config), "lengths")
    if own == "lengths" and not routing_is(getattr(model.config, "routing", "dynamic"), "length_activations"):
        return "activations"  # CapsNet's digit capsules under a routing whose activations are not lengths (EM)
    return own


class _ViewerBase:
    """What every viewer holds: the model in eval mode, its config and input shape, the data set and checkpoint it
    was opened with, its device, one lock for model calls, and its first convolution (``conv``, set by the viewer)
    with the kernels drawn from it once."""

    kind = ""
    conv: nn.Conv2d

    def _hold(self, model: nn.Module, dataset: str | None, checkpoint: str | os.PathLike | None) -> None:
        self.model = model.eval()
        self.config = cfg = model.config
        self.shape = (cfg.in_channels, cfg.input_height, cfg.input_width)  # what the model reads
        self.dataset = dataset
        self.checkpoint = str(checkpoint) if checkpoint is not None else None
        self.device = next(model.parameters()).device
        self._lock = threading.Lock()
        self._kernels: dict[str, Any] | None = None
        self.warning: str | None = None  # a classifier shown other classes than it learned (load_viewer sets it)
        self.weights = "saved"  # or "training": an averaged run's training weights (load_viewer sets it)
        self.saved: str | None = None  # the checkpoint's save point as read ("epoch 18", ...; load_viewer sets it)
        self._stamp: tuple[Path, tuple[int, int, int]] | None = None  # the file read and its stat (load_viewer sets it)
        # how a classifier's uploads and drawings are made into its input (load_viewer sets it): "mnist", a digit as
        # MNIST's were made (photos.mnist_style; a colour model's image resized), or "frame", for a one-channel model
        # of other data (Fashion-MNIST), the whole image fitted to the frame (photos.frame_style); "as-is" for a
        # segmentation or synthesis model, whose uploads are its input as they are (canvas_input)
        self.upload_style = "mnist" if self.kind == "classification" else "as-is"
        self.no_uploads: str | None = None  # why uploads are refused (a model of prepared inputs: upload_style none)

    def _described(self, test_size: int, classes: list[str]) -> dict[str, Any]:
        """The head of ``info()``, the same for every viewer; each adds its own fields after it."""
        return {"kind": self.kind, "checkpoint": self.checkpoint, "trained": self.checkpoint is not None,
                "weights": self.weights, "saved": self.saved, "dataset": self.dataset, "test_size": test_size,
                "classes": classes, "input": list(self.shape),
                "upload_style": self.upload_style,
                "model": type(self.model).__name__} | ({"warning": self.warning} if self.warning else {}) \
            | ({"changed": changed} if (changed := self.file_changed()) else {})

    def file_changed(self) -> str | None:
        """What happened to the checkpoint file since the viewer read it (a run training on saves it again; the page
        keeps showing the weights it read), or None: unchanged, or no file (untrained, a shipped model)."""
        if self._stamp is None:
            return None
        path, read = self._stamp
        try:
            now = _stat_stamp(path)
        except OSError:
            return f"{path.name} is no longer on disk; the page shows the weights the viewer read from it"
        if now == read:
            return None
        return (f"{path.name} has been saved again since the viewer read it{f' ({self.saved})' if self.saved else ''}; "
                f"the page shows the weights it read: restart capsnet viz to see the new ones")

    def kernels(self) -> dict[str, Any]:
        """The first convolution's weights (K, C, k, k), each kernel scaled to its own symmetric range (CapsPix2pix's
        conv1: C = the label map's channels and the noise channel, last)."""
        if self._kernels is None:
            self._kernels = conv_kernels(self.conv)
        return self._kernels


def first_conv(model: nn.Module) -> tuple[str, nn.Conv2d]:
    """The model's first ``nn.Conv2d`` and its name in the model, whose kernels and feature maps every viewer draws;
    a model without one is a ViewerError naming that need (it was a StopIteration traceback)."""
    found = next(((name, m) for name, m in model.named_modules() if isinstance(m, nn.Conv2d)), None)
    if found is None:
        raise ViewerError(f"the viewer draws the first convolution's kernels and feature maps, and "
                          f"{type(model).__name__} has no nn.Conv2d; give the model a convolution before its capsules "
                          f"to open it here (capsnet figures draws it without one)")
    return found


class Viewer(_ViewerBase):
    """One CapsNet, the test images to pick from, and the per-layer views of an input.

    Thread-safe: all model calls hold one lock, so a threaded server can call
    it from every request thread.
    """

    kind = "classification"  # the page's layout; SegmentationViewer's is "segmentation"

    def __init__(self, model: nn.Module, *, test_images: torch.Tensor | None = None,
                 test_labels: torch.Tensor | None = None, classes: Sequence[str] | None = None,
                 dataset: str | None = None, checkpoint: str | os.PathLike | None = None) -> None:
        if not hasattr(model, "routing_view"):
            hint = ": a segmentation model opens in SegmentationViewer" if segments(model) else ""
            raise ViewerError(f"the viewer looks inside a capsule model (one with routing_view), got "
                              f"{type(model).__name__}{hint}")
        self._hold(model, dataset, checkpoint)
        cfg = self.config
        # the first convolution: its kernels and feature maps (CapsNet's conv1, the others' first layer)
        _, self.conv = first_conv(model)
        if test_images is not None:
            if tuple(test_images.shape[1:]) != self.shape:
                raise ViewerError(f"{dataset or 'the'} test images are {tuple(test_images.shape[1:])} but the model "
                                  f"takes {self.shape}: pick the data set the checkpoint was trained on (--dataset)")
            if test_labels is None or len(test_labels) != len(test_images):
                raise ViewerError("test_labels must give one label per test image")
        self.test_images = test_images
        self.test_labels = test_labels
        self.classes = list(classes) if classes is not None else [str(k) for k in range(cfg.num_classes)]
        if len(self.classes) != cfg.num_classes:
            raise ViewerError(f"{len(self.classes)} class names for a model with {cfg.num_classes} classes")
        with torch.inference_mode():  # the sizes of every view, from one blank input
            x = torch.zeros(1, *self.shape, device=self.device)
            try:
                view = checked_view(model.routing_view(x), model)
            except ValueError as e:
                raise ViewerError(str(e)) from None
            out = model(x)
            self._map = list(self._conv1_maps(x).shape[2:])
        self._grid, self._rounds, self.digit_dim = list(view.grid), view.rounds.shape[1], out.poses.shape[-1]
        self.decodes = reconstructs(model)

    # ------------------------------------------------------------------ description

    def info(self) -> dict[str, Any]:
        cfg = self.config
        types, rows, cols = self._grid
        return self._described(0 if self.test_images is None else len(self.test_images), self.classes) | {
            "conv1": {"channels": self.conv.out_channels, "kernel": self.conv.kernel_size[0], "map": self._map},
            # the capsules the last routing layer routes (CapsNet: the primary capsules)
            "primary": {"types": types, "dim": getattr(cfg, "primary_dim", None), "grid": [rows, cols]},
            "digit_dim": self.digit_dim,
            "routing_iterations": self._rounds,
            "routing": routing_name(self.model),  # the algorithm of the routing drawn (capsnet.routing's name)
            "decoder": self.decodes,
            "scores_are": scores_are(self.model),
            "sweep_half_range": SWEEP_HALF_RANGE,
        }

    def _conv1_maps(self, x: torch.Tensor) -> torch.Tensor:
        """The first convolution's maps as the network computes them: the model's own ``conv1_maps`` (CapsNet pads
        the input under padding "same", EM's conv1 may have a batch norm: both were left out, drawing maps the
        network never made), else ReLU(conv(x))."""
        own = getattr(self.model, "conv1_maps", None)
        return own(x) if own is not None else F.relu(self.conv(x))

    # ------------------------------------------------------------------ inputs

    def test_input(self, index: int | None = None, label: int | None = None, nth: int = 0) -> _Input:
        """A test image by index, or the ``nth`` test image of class ``label``."""
        if self.test_images is None:
            raise ViewerError("no test set is loaded; draw or upload an image instead")
        n = len(self.test_images)
        if label is not None:
            if not is_int(label) or not 0 <= label < len(self.classes):
                raise ViewerError(f"unknown class {label!r}: classes are 0..{len(self.classes) - 1} "
                                  f"({', '.join(told_apart(self.classes))})")
            if not is_int(nth) or nth < 0:
                raise ViewerError(f"nth must be a non-negative integer, got {nth!r}")
            hit = self.test_labels == label  # (N,), or (N, 2) for MultiMNIST pairs: either digit
            where = (hit.any(dim=1) if hit.dim() == 2 else hit).nonzero().flatten()
            if len(where) == 0:
                raise ViewerError(f"the test set has no image of class {self.classes[label]!r}")
            index = int(where[nth % len(where)])
        checked_index(index, n)
        image = self.test_images[index].float() / 255.0 if not self.test_images.is_floating_point() \
            else self.test_images[index].float()
        lab = self.test_labels[index]
        if lab.dim() == 1:  # a MultiMNIST pair
            return _Input(image, {"kind": "test", "index": index, "label": [int(v) for v in lab],
                                  "label_name": "+".join(self.classes[int(v)] for v in lab)})
        return _Input(image, {"kind": "test", "index": index, "label": int(lab),
                              "label_name": self.classes[int(lab)]})

    def image_input(self, image: torch.Tensor, source: dict[str, Any]) -> _Input:
        return _Input(checked_image(image, self.shape), source)

    # ------------------------------------------------------------------ the network, layer by layer

    def walk(self, inp: _Input) -> dict[str, Any]:
        """Every layer's view of one input (the JSON of POST /api/forward)."""
        types, rows, cols = self._grid
        with self._lock, torch.inference_mode():
            x = inp.image.to(self.device).unsqueeze(0)  # (1, C, H, W)
            maps = self._conv1_maps(x)  # (1, K, H', W')
            # One recorded routing of the last routing layer: rounds[0, r] is the coupling round r + 1 used
            # (round 1 uniform), as in capsnet figures; the last is the model's own coupling.
            view = self.model.routing_view(x)  # rounds (1, R, I, J), children (1, I), scores (1, J)
            poses, lengths = self.model(x).poses, view.scores  # (1, J, D), (1, J)
            predicted = int(lengths[0].argmax())
            rec = self.model.reconstruct(poses, torch.tensor([predicted], device=self.device))[0] \
                if self.decodes else None
        rounds = view.rounds
        R = rounds.shape[1]
        coupling = rounds[0].cpu().reshape(R, types, rows, cols, -1).permute(0, 4, 1, 2, 3)  # (R, J, types, rows, cols)
        fmap = maps[0].cpu()  # (K, H', W')
        fmax = fmap.reshape(fmap.shape[0], -1).amax(dim=1).clamp_min(1e-12)
        return {
            "source": inp.source,
            "input": encode(inp.image, *shown_range(inp.image)),
            "feature_maps": encode(fmap, [0.0] * len(fmax), fmax.tolist()),
            "primary_lengths": encode(view.children[0].cpu().reshape(types, rows, cols)),  # min..max
            "primary_are": view.children_are,  # "lengths", or EM's "activations"
            "coupling": encode(coupling, 0.0, float(coupling.max())),
            "lengths": [round(v, 6) for v in lengths[0].cpu().tolist()],
            "poses": [[round(v, 6) for v in row] for row in poses[0].cpu().tolist()],
            "predicted": predicted,
            "reconstruction": encode(rec.cpu(), 0.0, 1.0) if rec is not None else None,
        }

    def reconstruct(self, pose: Any, capsule: Any) -> dict[str, Any]:
        """The decoder's image of one digit capsule with the given pose (the sliders' call)."""
        cfg = self.config
        if not self.decodes:
            raise ViewerError(cannot_reconstruct(self.model))
        if not is_int(capsule) or not 0 <= capsule < cfg.num_classes:
            raise ViewerError(f"unknown capsule {capsule!r}: digit capsules are 0..{cfg.num_classes - 1}")
        if not isinstance(pose, list) or len(pose) != self.digit_dim:
            got = f"{len(pose)} numbers" if isinstance(pose, list) else type(pose).__name__
            raise ViewerError(f"pose must be a list of {self.digit_dim} numbers, got {got}")
        if not all(_pose_number(v) for v in pose):
            raise ViewerError(f"pose must hold finite numbers within ±{MAX_POSE:g} only (no NaN, infinity, strings "
                              f"or null)")
        poses = torch.zeros(1, cfg.num_classes, self.digit_dim, device=self.device)
        poses[0, capsule] = torch.tensor(pose, dtype=torch.float32, device=self.device)
        with self._lock, torch.inference_mode():
            rec = self.model.reconstruct(poses, torch.tensor([capsule], device=self.device))[0]
        return {"capsule": capsule, "reconstruction": encode(rec.cpu(), 0.0, 1.0)}


MAX_POSE = 1e9  # far past any pose a sweep reaches (±0.25 around values near ±1), far inside float32


def checked_image(image: torch.Tensor, shape: tuple[int, int, int]) -> torch.Tensor:
    """``image`` (C, H, W) as float in [0, 1], after checking its shape and that every pixel is finite."""
    if tuple(image.shape) != shape:
        raise ViewerError(f"image must be {shape}, got {tuple(image.shape)}")
    if not torch.isfinite(image).all():
        raise ViewerError("image has NaN or infinite pixels")
    return image.float().clamp(0, 1)


def _pose_number(v: Any) -> bool:
    return is_finite(v) and abs(v) <= MAX_POSE  # is_finite: no OverflowError on an int too large for a float


def checked_index(index: Any, n: int, unit: str = "images") -> None:
    """A ViewerError unless ``index`` picks one of a test set's ``n`` items: a type ("3", 3.0, true, null) said as
    one, an index outside 0..n-1 as out of range."""
    if not is_int(index):
        raise ViewerError(f"test index must be an integer, got {index!r}")
    if not 0 <= index < n:
        raise ViewerError(f"test index {index!r} out of range: the test set has {n} {unit}, 0..{n - 1}")


def load_viewer(checkpoint: str | os.PathLike | None = None, *, which: str = "best", weights: str = "saved",
                dataset: str | None = None,
                data_dir: str | os.PathLike | None = None, device: str = "cpu", progress: bool = True,
                test_size: int | None = None) -> Viewer | SegmentationViewer | SynthesisViewer:
    """A viewer for a checkpoint (or, without one, an untrained paper CapsNet on ``mnist-sample``).

    A classification checkpoint gives a ``Viewer``; a segmentation one
    (``segcaps``, ``segcaps-r1``, ``unet``) a ``SegmentationViewer`` and a
    synthesis one (``capspix2pix``, ``pix2pix``) a ``SynthesisViewer``, of the
    same calls. A shipped model (``pretrained:NAME``) trained on MNIST shows the
    shipped ``mnist-sample`` test digits (a segmentation or synthesis model: the
    canvases or pairs made from them, ``mnist-sample-segmentation`` and
    ``mnist-sample-skeleton``) unless ``dataset`` says otherwise, so it works
    offline (``capsnet.data.tasks.shipped_default``); any other checkpoint, and
    a shipped model of another data set (Fashion-MNIST), the data set it was
    trained on (``folder:DIR`` reads the user's own images and masks).

    The test inputs are the data set's test split (``capsnet.data.tasks``): for
    the experiment sets, the fixed MultiMNIST test pairs (36x36) or translated
    test digits (40x40); for ``mnist-segmentation`` the first
    ``SEGMENTATION_TEST_SIZE`` (1,000) of its fixed test canvases, as
    ``capsnet eval`` numbers them; for ``mnist-skeleton`` and
    ``fashion-silhouette`` the first ``SYNTHESIS_TEST_SIZE`` (1,000) test
    pairs (``pairs:DIR``: all the user's). ``test_size`` keeps the first this many
    test examples instead (0: all). ``weights``: the checkpoint's "saved" weights or an averaged run's "training"
    ones (``load_model``; the page says which).
    """
    from ..data.tasks import (TASKS, absolute_dataset, class_change, input_shape, load_test, other_classes,
                              saved_folder, shipped_default, task, trained_classes, trained_dataset, user_folder)
    from ..evaluate import load_model
    from .. import pretrained
    from ..models import MODELS
    from .segmentation import SEGMENTATION_TEST_SIZE, SegmentationViewer
    from .synthesis import SYNTHESIS_TEST_SIZE, SynthesisViewer

    if test_size is not None and (not is_int(test_size) or test_size < 0):
        raise ViewerError(f"test_size must be a non-negative integer (0: all), got {test_size!r}")
    if checkpoint is None:
        if weights != "saved":
            raise ViewerError(f"weights={weights!r} picks a checkpoint's weights; give a checkpoint")
        name, what, kind = dataset or "mnist-sample", "the untrained CapsNet", "classification"
        # sized for the data set asked for (CIFAR-10's 24x24 colour crops, ...), as capsnet train sizes a new run;
        # a data set of another task is refused below, by name
        sized = {}
        if task(name).kind == "classification":
            from ..train import input_fields

            sized = input_fields("capsnet", name)
        with torch.random.fork_rng(devices=[]):  # seeded weights; the caller's random state untouched
            torch.manual_seed(0)
            model: Any = CapsNet(CapsNetConfig(**sized)).to(device)
    else:
        stamp = None  # the file's identity before it is read: a save landing meanwhile is reported, not missed
        source = checkpoint  # what load_model reads: the file resolved here, so a fallback's warning is said once
        if not pretrained.is_shipped(checkpoint):  # a shipped file is the install's: it changes with capsnet alone
            from ..checkpoint import resolve_checkpoint

            try:
                path = resolve_checkpoint(checkpoint, which)
                stamp = (path, _stat_stamp(path))
                source = path
            except (OSError, ValueError):  # load_model says what is wrong with it
                pass
        model, ckpt = load_model(source, which=which, device=device, weights=weights)
        kind = MODELS[ckpt.model_name].kind
        if kind == "classification" and not hasattr(model, "routing_view"):
            raise ViewerError(f"{ckpt.path} holds a {ckpt.model_name!r} model; the viewer looks inside a capsule "
                              f"model, a segmentation model or a synthesis model: a classifier with a "
                              f"routing_view(images) method (and, for reconstructions, a decoder with a "
                              f"reconstruct(poses, index) method; README, \"Where things live, and how to add one\")")
        shipped = pretrained.is_shipped(checkpoint)
        trained_on = ckpt.train_config.get("dataset", "mnist")
        # a shipped model opens offline, on the shipped digits (made into canvases or pairs for its task)
        name = dataset or (shipped_default(trained_on) if shipped else trained_dataset(ckpt.train_config, "mnist"))
        # a shipped model by its name, as the user gave it: its file's path is the install's (which /api/info
        # and the page's header showed to anyone a --host 0.0.0.0 viewer serves)
        what, checkpoint = ckpt.model_name, checkpoint if shipped else ckpt.path
        if (changed := class_change(ckpt.state, name, absolute_dataset(name) == trained_on)) is not None:
            raise ViewerError(changed)  # classes:DIR: its class folders are not the model's
    if task(name).kind != kind:  # before any test image is loaded
        fix = {"segmentation": "mnist-segmentation, mnist-sample-segmentation (offline) or folder:DIR",
               "synthesis": "mnist-skeleton, mnist-sample-skeleton (offline), fashion-silhouette or pairs:DIR"
               }.get(kind, "a classification data set such as mnist-sample" if checkpoint is None
                     else "the data set it was trained on")
        raise ViewerError(f"{what} is a {kind} model but {name} is a {task(name).kind} data set: open it on {fix} "
                          f"(--dataset)")
    if kind == "synthesis":
        from ..synthesis import pairs_misfit

        if misfit := pairs_misfit(name, model.config):
            raise ViewerError(f"{misfit}: open it on data of the shape it was trained on (--dataset)")
    asked = test_size  # typed by the user: more than the data set holds is said, as eval says it
    if test_size is None:  # the generated canvases are drawn on loading: 10,000 take ~10 s on a CPU
        made = not user_folder(name)
        test_size = {"segmentation": SEGMENTATION_TEST_SIZE, "synthesis": SYNTHESIS_TEST_SIZE}.get(kind, 0) if made \
            else 0
    cfg = model.config
    shape = (cfg.in_channels, cfg.input_height, cfg.input_width)
    if kind != "synthesis" and input_shape(name) != shape:  # known before any file is read or downloaded
        raise ViewerError(f"{name} test images are {input_shape(name)} but the model takes {shape}: pick the data set "
                          f"the checkpoint was trained on (--dataset)")
    if kind == "classification" and (n := task(name).num_classes) != cfg.num_classes:  # before the test set loads
        # ("10 class names for a model with 3 classes", after the whole set had loaded)
        learned = f" (it trained on {trained_on})" if checkpoint is not None else ""
        raise ViewerError(f"{what} tells {cfg.num_classes} classes apart{learned} but {name} has {n}: open it on "
                          f"the data set it was trained on (--dataset)")
    test = load_test(name, size=test_size, extras=False, root=data_dir, progress=progress)
    if asked and len(test) < asked:
        raise ViewerError(f"--test-size {asked} exceeds the {len(test)} test examples of {name}; give at most "
                          f"{len(test)}, or 0 for all")
    viewer: Viewer | SegmentationViewer | SynthesisViewer
    if kind == "segmentation":
        viewer = SegmentationViewer(model, test_images=test.images, test_masks=test.labels, dataset=name,
                                    checkpoint=checkpoint)
    elif kind == "synthesis":  # images: the label maps; components: the real images; labels: their classes
        classless = task(name).num_classes < 2  # the user's pairs (pairs:DIR) have none
        viewer = SynthesisViewer(model, test_labels=test.images, test_images=test.components,
                                 test_classes=None if classless else test.labels,
                                 classes=None if classless else test.classes, dataset=name, checkpoint=checkpoint)
        viewer.label_maps = ckpt.state.get("label_maps", "binary")  # an upload's 0/1 map read as generate reads it
    else:
        viewer = Viewer(model, test_images=test.images, test_labels=test.labels, classes=test.classes, dataset=name,
                        checkpoint=checkpoint)
        if checkpoint is not None:  # a Fashion-MNIST model opened on digits (or an MNIST one on a folder of other
            # classes): said, not refused
            viewer.warning = other_classes(trained_on, name, trained_classes(ckpt.train_config, ckpt.state),
                                           test.classes)
        learned = trained_on if checkpoint is not None else name
        if user_folder(learned):  # a user's own images (classes:DIR), not known to be digits or items on white:
            # fitted as capsnet prepare made the folder (its record, kept by the run), else whole (pad)
            viewer.upload_style = (checkpoint is not None and saved_folder(ckpt.state).get("prepared_fit")) or "pad"
        elif shape[0] == 1 and learned in TASKS and TASKS[learned].source not in ("mnist", "mnist-sample"):
            viewer.upload_style = "frame"  # a Fashion-MNIST item fills its frame: MNIST's 20x20 box would shrink it
        from ..data.tasks import PREPARED

        if learned in PREPARED:  # its inputs are not pixels / 255: an upload would be read wrong (predict refuses it)
            viewer.upload_style = "none"
            viewer.no_uploads = (f"this model was trained on {learned}, whose images are {PREPARED[learned]}; an "
                                 f"upload, read as pixels / 255, would be classified wrong: pick a test image")
    viewer.weights = weights
    if checkpoint is not None:  # which save of the file the page shows: a run training on replaces it meanwhile
        from ..checkpoint import saved_point

        viewer.saved = saved_point(ckpt.state)
        viewer._stamp = stamp
    return viewer


def _stat_stamp(path: Path) -> tuple[int, int, int]:
    """A file's identity for ``file_changed``: an atomic save replaces it (a new inode), an edit changes its time."""
    st = path.stat()
    return st.st_ino, st.st_mtime_ns, st.st_size
