"""Evaluation: loss, accuracy and confusion of a model on a split, and models rebuilt from checkpoints.

The loss is the model's own (its ``ModelSpec.loss`` in ``capsnet.models``);
the reconstruction term, where there is one, is computed from the true
label's capsule, as in training. No augmentation.
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn

from . import pretrained
from ._numbers import is_count
from ._progress import progress_bar
from .average import WEIGHTS
from .checkpoint import (Checkpoint, check_fits_before_building, checkpoint_said, load_checkpoint, load_weights,
                         saved_point)
from .data.multimnist import top2_correct
from .data.placement import Placement, placement
from .data.segmentation import overlap_scores
from .data.idx import DataError
from .data.tasks import (EXAMPLE_NOUN, Split, absolute_dataset, check_test_size, class_change, classes_beyond,
                         folder_change, input_shape, load_test, other_classes, task, trained_classes,
                         trained_dataset, user_folder)
from .losses import batch_foreground_weight
from .models import MODELS, model_name, model_spec, segments_size
from .models.inputs import check_class_labels
from .runtime import evaluating, keeps_rng, resolve_device, sum_dtype

__all__ = ["EvalResult", "PairEvalResult", "SegEvalResult", "evaluate", "eval_batch", "evaluate_pairs",
           "evaluate_segmentation", "evaluate_split", "load_model",
           "CheckpointEvaluation", "evaluate_checkpoint"]


@dataclass
class EvalResult:
    loss: float
    accuracy: float
    error: float
    confusion: torch.Tensor  # (K, K) int64, rows: true class, columns: predicted
    predicted: torch.Tensor | None = None  # (N,) int64, each image's predicted class (evaluate gives it)

    @property
    def per_class_accuracy(self) -> list[float | None]:
        """Each class's share of its test images classified right; None for a class with no test image (a small
        --test-size can leave one out: it was reported as 0.0)."""
        totals = self.confusion.sum(dim=1)
        return [None if n == 0 else float(c) / int(n) for c, n in zip(self.confusion.diag().tolist(), totals.tolist())]


@dataclass
class PairEvalResult:
    loss: float
    accuracy: float  # fraction of pairs whose two longest capsules are exactly their two labels
    error: float  # the paper's MultiMNIST error, 1 - accuracy


@dataclass
class SegEvalResult:
    """A segmentation model on a split: per-image Dice and IoU of the mask predicted at probability > 0.5."""

    loss: float
    dice: float  # mean over the images of 2 |P & T| / (|P| + |T|) (1 where both are empty)
    iou: float  # mean over the images of |P & T| / |P | T| (1 where both are empty)
    pixel_accuracy: float
    # (N,) float64 on the CPU: each image's Dice and IoU, in the split's order (the means above are theirs)
    per_image_dice: torch.Tensor | None = field(default=None, repr=False, compare=False)
    per_image_iou: torch.Tensor | None = field(default=None, repr=False, compare=False)

    @property
    def accuracy(self) -> float:  # what chooses the best checkpoint and fills metrics' *_accuracy: the Dice
        return self.dice

    @property
    def error(self) -> float:
        return 1.0 - self.dice


WORST_SHOWN = 5  # a user's test images with the lowest Dice (misclassified ones), named under ``capsnet eval``'s table


def _loss_of(model: nn.Module):
    return model_spec(model_name(model.config)).loss


def eval_batch(model: nn.Module, batch_size: int) -> int:
    """``batch_size``, at most the model's ``eval_batch_limit`` where it sets one: a model whose forward holds
    tens of MB an example (the votes of a convolutional capsule layer) is evaluated that many at a time, so the
    default of 256 does not need ten times the memory of training."""
    limit = getattr(model, "eval_batch_limit", None)
    return batch_size if limit is None else max(1, min(batch_size, limit))


def pixel_batch(model: nn.Module, batch_size: int, height: int, width: int) -> int:
    """How many height x width images hold the pixels of ``batch_size`` at the model's own size (at least 1): a fully
    convolutional model segments other sizes, and a batch of larger images would hold that many times the memory."""
    cfg = model.config
    return max(1, batch_size * cfg.input_height * cfg.input_width // (height * width))


def _check_split(images: torch.Tensor, targets: torch.Tensor, batch_size: int, what: str = "labels") -> None:
    """A ValueError naming the fix for a split that cannot be scored: no examples, images and targets of other
    counts, a batch size below 1 (the loops below would report an empty set as 100% error, or fail deep inside)."""
    if not is_count(batch_size):
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if len(images) != len(targets):
        raise ValueError(f"{len(images)} images but {len(targets)} {what}: give one entry of {what} per image")
    if len(images) == 0:
        raise ValueError("no images to evaluate: the split is empty")


def evaluate(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, *, batch_size: int = 256,
             recon_weight: float = 0.0005, progress: bool = False) -> EvalResult:
    """Loss, accuracy and confusion matrix of ``model`` on a split (no augmentation).

    Shapes: images (N, C, H, W) float in [0, 1]; labels (N,). Returns the mean loss, the accuracy, the error
    and the (K, K) confusion matrix, rows the true classes and columns the predicted ones.
    """
    _check_split(images, labels, batch_size)
    check_class_labels(labels, len(images), model.config.num_classes)
    if labels.dim() != 1:
        raise ValueError("labels of shape (N, 2) are MultiMNIST pairs: score them with evaluate_pairs")
    labels = labels.long()  # uint8 labels wrapped past 255 in y * K + class (17 classes on); int32 failed some losses
    loss_fn = _loss_of(model)
    batch_size = eval_batch(model, batch_size)
    K = model.config.num_classes
    n = len(labels)
    # Sums stay on the device until the end: no host sync per batch.
    confusion = torch.zeros(K * K, dtype=torch.int64, device=images.device)
    total_loss = torch.zeros((), dtype=sum_dtype(images.device), device=images.device)
    predicted = []
    with evaluating(model), torch.inference_mode():
        for start in progress_bar(range(0, n, batch_size), desc="eval", leave=False, progress=progress, unit="batch"):
            x, y = images[start:start + batch_size], labels[start:start + batch_size]
            loss, scores = loss_fn(model, x, y, recon_weight=recon_weight)
            total_loss += loss.to(total_loss.dtype) * len(y)
            predicted.append(scores.argmax(dim=1))
            cell = y * K + predicted[-1]
            confusion.index_add_(0, cell, torch.ones_like(cell))  # bincount would sync to size its output
    confusion = confusion.view(K, K).cpu()
    acc = confusion.diag().sum().item() / max(n, 1)
    return EvalResult(total_loss.item() / max(n, 1), acc, 1.0 - acc, confusion, torch.cat(predicted).cpu())


def evaluate_pairs(model: nn.Module, images: torch.Tensor, labels: torch.Tensor,
                   components: torch.Tensor | None = None, *, batch_size: int = 256, recon_weight: float = 0.0005,
                   progress: bool = False) -> PairEvalResult:
    """MultiMNIST loss and top-2 exact-match accuracy (section 6) of ``model`` on pairs.

    Shapes: images (N, C, 36, 36), labels (N, 2), components (N, 2, C, 36, 36) or None (no reconstruction term).
    """
    _check_split(images, labels, batch_size)
    labels = labels.long()  # as evaluate: a pair's cells in int64, whatever the labels' integer type
    loss_fn = _loss_of(model)
    batch_size = eval_batch(model, batch_size)
    n = len(labels)
    total_loss = torch.zeros((), dtype=sum_dtype(images.device), device=images.device)
    right = torch.zeros((), dtype=torch.int64, device=images.device)
    with evaluating(model), torch.inference_mode():
        for start in progress_bar(range(0, n, batch_size), desc="eval", leave=False, progress=progress, unit="batch"):
            sl = slice(start, start + batch_size)
            comp = components[sl] if components is not None else None
            loss, scores = loss_fn(model, images[sl], labels[sl], comp,
                                   recon_weight=recon_weight if comp is not None else 0.0)
            total_loss += loss.to(total_loss.dtype) * len(labels[sl])
            right += top2_correct(scores, labels[sl]).sum()
    acc = right.item() / max(n, 1)
    return PairEvalResult(total_loss.item() / max(n, 1), acc, 1.0 - acc)


def evaluate_segmentation(model: nn.Module, images: torch.Tensor, masks: torch.Tensor, *, batch_size: int = 64,
                          recon_weight: float = 0.0005, progress: bool = False) -> SegEvalResult:
    """Loss, Dice, IoU and pixel accuracy of a segmentation model on a split (the mask: probability > 0.5).

    Shapes: images (N, C, H, W) float in [0, 1]; masks (N, 1, H, W) 0/1.
    """
    _check_split(images, masks, batch_size, "masks")
    loss_fn = _loss_of(model)
    batch_size = eval_batch(model, batch_size)
    if hasattr(getattr(model, "config", None), "input_height") and images.dim() == 4:
        # images larger than the model's own size (a fully convolutional model segments any size its stride divides):
        # as many at a time as its evaluation batch holds at its own size, as capsnet predict batches them
        batch_size = min(batch_size, pixel_batch(model, batch_size, *images.shape[-2:]))
    n = len(masks)
    wide = sum_dtype(images.device)  # float64 (float32 on MPS)
    sums = torch.zeros(2, dtype=wide, device=images.device)  # loss, pixel accuracy
    each: list[torch.Tensor] = []  # (b, 2) Dice and IoU of each batch's images, kept on the device until the end
    # the weighted cross-entropy weighs the foreground as the whole split does: per batch, its loss changed with the
    # batch size and the last, partial batch (the Dice does not depend on it)
    with evaluating(model), torch.inference_mode(), batch_foreground_weight(masks):
        for start in progress_bar(range(0, n, batch_size), desc="eval", leave=False, progress=progress, unit="batch"):
            x, m = images[start:start + batch_size], masks[start:start + batch_size]
            loss, p = loss_fn(model, x, m, recon_weight=recon_weight)
            pred, truth = p > 0.5, m > 0  # (b, 1, H, W)
            dice, iou = overlap_scores(pred, truth)
            right = (pred == truth).flatten(1).to(wide).mean(1)
            sums += torch.stack([loss.to(wide) * len(m), right.sum()])
            each.append(torch.stack([dice, iou], 1).to(wide))
    loss, right = (sums / max(n, 1)).tolist()
    per_image = torch.cat(each).cpu().double()  # (N, 2): the means are theirs
    dice, iou = per_image.mean(0).tolist()
    return SegEvalResult(loss, dice, iou, right, per_image[:, 0], per_image[:, 1])


BATCH_SIZE, SEGMENTATION_BATCH_SIZE = 256, 64  # examples a pass when none is given (a segmenter's: masks, grids)


def evaluate_split(model: nn.Module, split: Split, *, batch_size: int | None = None, recon_weight: float = 0.0005,
                   progress: bool = False) -> dict[str, EvalResult | PairEvalResult]:
    """Score a split (on the model's device, images float) and its extra sets: {"": result, "affine": result, ...}.
    ``batch_size``: examples a pass (None: ``BATCH_SIZE``, masks ``SEGMENTATION_BATCH_SIZE``)."""
    def one(sp: Split) -> EvalResult | PairEvalResult | SegEvalResult:
        if sp.labels.dim() == 4:  # masks
            return evaluate_segmentation(model, sp.images, sp.labels, batch_size=batch_size or SEGMENTATION_BATCH_SIZE,
                                         recon_weight=recon_weight, progress=progress)
        batch = batch_size or BATCH_SIZE
        if sp.labels.dim() == 2:
            return evaluate_pairs(model, sp.images, sp.labels, sp.components, batch_size=batch,
                                  recon_weight=recon_weight, progress=progress)
        return evaluate(model, sp.images, sp.labels, batch_size=batch, recon_weight=recon_weight, progress=progress)
    return {"": one(split)} | {name: one(sp) for name, sp in split.extra.items()}


def load_model(path: str | os.PathLike | Checkpoint, *, which: str = "best", device: str | torch.device = "cpu",
               weights: str = "saved") -> tuple[nn.Module, Checkpoint]:
    """Rebuild the model saved in a checkpoint, by the name and config it records, with its weights, on
    ``device``: ``path`` a run directory (``which`` "best" or "last" picks its best.safetensors or
    last.safetensors), a .safetensors file, ``pretrained:NAME``, or a Checkpoint already read (a training run may
    replace its file between two reads). ``weights``: "saved", what the checkpoint holds as the model (for a run
    trained with ``--ema-decay``, the average of its weights), or "training", such a run's training weights, which
    its last checkpoint keeps beside Adam's state (``capsnet.average``; a synthesis model's generator, the part
    averaged): the run as it would have scored without the average. Returns (model, the checkpoint read), the model
    in eval mode (as ``capsnet.models.pretrained`` gives it: batch norm's saved statistics, no dropout; call
    ``.train()`` to train it on)."""
    from .train import saved_configs  # train imports this module: a local import keeps the arrows one way

    if weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {', '.join(WEIGHTS)}, got {weights!r}")
    ckpt = path if isinstance(path, Checkpoint) else load_checkpoint(path, which)
    config, _ = saved_configs(ckpt)
    spec = MODELS[ckpt.model_name]
    check_fits_before_building(lambda: spec.build(config), ckpt)  # a config describing a far larger network
    with keeps_rng("cpu"):  # initial weights, replaced by the checkpoint's: the caller's random stream is left as it was
        model = spec.build(config)
    load_weights(model, ckpt)
    if weights == "training":
        _use_training_weights(model, ckpt)
    return model.to(resolve_device(device)).eval(), ckpt


def _use_training_weights(model: nn.Module, ckpt: Checkpoint) -> None:
    """Put an averaged run's training weights (kept beside the optimizer's state) into ``model`` in place of the
    average it was loaded with; a CheckpointError that says why a checkpoint has none."""
    from .average import WeightAverage, restore_training_weights, training_weights
    from .checkpoint import CheckpointError

    if ckpt.optimizer_state is None or training_weights(ckpt.optimizer_state, ckpt.path) is None:
        averaged = bool(ckpt.train_config.get("ema_decay"))
        # a run directory's best: --which last; a file (best.safetensors, or packed: packing keeps the average
        # alone): the run's last.safetensors, which a packed checkpoint has no longer
        packed = ckpt.path is not None and ckpt.path.name != "best.safetensors"
        keeps = ("a packed or shipped checkpoint keeps the average alone; score the run's last.safetensors"
                 if packed else "only a run's last checkpoint keeps them (pass its last.safetensors, or the run "
                                "directory with --which last)")
        why = (keeps if averaged and ckpt.optimizer_state is None
               else "its run was not trained with --ema-decay, so the weights it holds are its training weights "
                    "(leave out --weights training)")
        raise CheckpointError(f"{ckpt.path} holds no training weights beside an average: {why}")
    averaged_part = model.generator if model_spec(ckpt.model_name).kind == "synthesis" else model
    restore_training_weights(ckpt, WeightAverage(averaged_part, 0.5))  # the tensors the run averaged, in its order


@dataclass
class CheckpointEvaluation:
    """What ``capsnet eval`` reports: a checkpoint scored on a data set's test split and its extra sets.

    For a task with several test sets (translated MNIST) or real affNIST files,
    ``titles`` says how each set was made and ``placements`` where its digits
    sit, measured from its images (keys as in ``results``).
    """

    checkpoint: Checkpoint
    dataset: str
    images: int  # examples (pairs for MultiMNIST) in the main split
    results: dict[str, EvalResult | PairEvalResult]  # "" is the main split
    extra_sizes: dict[str, int] = field(default_factory=dict)
    titles: dict[str, str] = field(default_factory=dict)
    placements: dict[str, Placement] = field(default_factory=dict)
    warning: str | None = None  # scored on classes it was not trained for (capsnet.data.tasks.other_classes)
    test_files: tuple[str, ...] | None = None  # a user's folder: the test split's files, index k the k-th
    classes: tuple[str, ...] = ()  # a classifier's class names, index k class k (the confusion's rows and columns)
    labels: torch.Tensor | None = None  # a user's folder of classes: the test split's labels (N,), for its files
    # the names of the model's outputs, index k output k: its own classes where the checkpoint says them, else
    # ``classes``
    predicted_classes: tuple[str, ...] = ()

    def label(self, name: str) -> str:
        """How reports name set ``name``: the main split ("") is "translated" for translated MNIST, else "test"."""
        return name or ("translated" if self.dataset == "translated-mnist" else "test")

    def nearest_placement(self, name: str) -> str | None:
        """The generated set whose ink-box centre spread is closest to set ``name``'s (for real affNIST files)."""
        mine = self.placements.get(name)
        generated = {n: p for n, p in self.placements.items() if not n.startswith("affnist:") and n != name}
        if mine is None or not generated:
            return None
        return self.label(min(generated, key=lambda n: abs(generated[n].centre_std - mine.centre_std)))

    def report(self) -> dict[str, Any]:
        """The JSON record: the main split's figures, per-class accuracy and confusion, and each extra set's."""
        r = self.results[""]
        out = {"checkpoint": pretrained.named(self.checkpoint.path), "model": self.checkpoint.model_name,
               "epoch": self.checkpoint.state.get("epoch"), "saved_at": saved_point(self.checkpoint.state),
               "dataset": self.dataset, "images": self.images,
               "accuracy": r.accuracy, "error": r.error, "loss": r.loss}
        if self.warning:
            out["warning"] = self.warning
        if isinstance(r, PairEvalResult):
            return out | {"metric": "top-2 exact match"}
        if isinstance(r, SegEvalResult):  # accuracy and error above are the Dice and 1 - Dice
            def seg(er: SegEvalResult) -> dict[str, Any]:
                return {"dice": er.dice, "iou": er.iou, "pixel_accuracy": er.pixel_accuracy, "loss": er.loss}
            out |= {"metric": "Dice"} | seg(r) | self._described("")
            if self.test_files is not None:  # which files the figures' and --indices' numbers are, and how each did
                out["test_files"] = list(self.test_files)
                if r.per_image_dice is not None:
                    out["per_image"] = [{"file": f, "dice": d, "iou": i} for f, d, i in zip(
                        out["test_files"], r.per_image_dice.tolist(), r.per_image_iou.tolist())]
            for name, er in self.results.items():
                if name:
                    out[name] = {"images": self.extra_sizes[name], **seg(er)} | self._described(name)
            return out
        out |= self._described("")
        for name, er in self.results.items():
            if name:
                out[name] = {"images": self.extra_sizes[name], "accuracy": er.accuracy, "error": er.error,
                             "loss": er.loss, "per_class_accuracy": er.per_class_accuracy} | self._described(name)
        named = {"classes": list(self.classes)} if self.classes else {}
        if self.test_files is not None and r.predicted is not None:  # a user's folder: how each of its files did
            named |= {"test_files": list(self.test_files), "misclassified": [
                {"file": f, "true": self._class(t), "predicted": self._predicted(p)} for f, t, p in self._wrong()]}
        return out | named | {"per_class_accuracy": r.per_class_accuracy, "confusion": r.confusion.tolist()}

    def _class(self, k: int) -> str:
        return self.classes[k] if k < len(self.classes) else str(k)

    def _predicted(self, k: int) -> str:
        """Output ``k``'s class: the model's (a zero an MNIST model read as 0 was "misclassified as one", the folder's
        class 0, where the folder's classes were others)."""
        named = self.predicted_classes or self.classes
        return named[k] if k < len(named) else str(k)

    def _wrong(self) -> list[tuple[str, int, int]]:
        """(file, true class, predicted class) of each test file of a user's folder classified wrong, in file
        order."""
        r = self.results[""]
        if self.test_files is None or r.predicted is None or self.labels is None:
            return []
        return [(f, t, p) for f, t, p in zip(self.test_files, self.labels.tolist(), r.predicted.tolist()) if t != p]

    def _described(self, name: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if name in self.titles:
            out["title"] = self.titles[name]
        if name in self.placements:
            out["placement"] = self.placements[name].to_dict()
            if name.startswith("affnist:"):
                out["placement_nearest"] = self.nearest_placement(name)
        return out

    def format(self) -> str:
        """The table ``capsnet eval`` prints."""
        r = self.results[""]
        if isinstance(r, SegEvalResult):
            return "\n".join(self._segmentation_table())
        pairs = isinstance(r, PairEvalResult)
        lines = [f"{checkpoint_said(self.checkpoint)}, {self.dataset} "
                 f"test set, {self.images} {'pairs' if pairs else 'images'}"]
        if self.warning:
            lines.append(f"warning: {self.warning}")
        if pairs:
            return "\n".join(lines + [f"top-2 exact accuracy {r.accuracy:.4f}   error {100 * r.error:.2f}%   "
                                      f"loss {r.loss:.4f}",
                                      "(right when the two highest-scoring classes are exactly the pair's two "
                                      "labels, section 6)"])
        label = "translated test " if self.dataset == "translated-mnist" else ""
        lines.append(f"{label}accuracy {r.accuracy:.4f}   error {100 * r.error:.2f}%   loss {r.loss:.4f}")
        if self.placements:
            lines += ["", *self._sets_table()]
        else:
            for name, er in self.results.items():
                if name:
                    lines.append(f"{name} test accuracy {er.accuracy:.4f}   error {100 * er.error:.2f}%   "
                                 f"({self.extra_sizes[name]} images)")
        K = r.confusion.shape[0]
        # class names beside the rows where they are not the numbers themselves (Fashion-MNIST's, a user's folders)
        named = len(self.classes) == K and any(c != str(k) for k, c in enumerate(self.classes))
        lines.append(f"\n{label}class  accuracy   " + " ".join(f"{j:>5}" for j in range(K)) + "   <- predicted")
        for i, acc in enumerate(r.per_class_accuracy):
            shown = "     n/a" if acc is None else f"{acc:8.4f}"  # no test image of this class
            lines.append(f"{i:>5}  {shown}   " + " ".join(f"{int(v):>5}" for v in r.confusion[i])
                         + (f"   {self.classes[i]}" if named else ""))
        if wrong := self._wrong():
            lines.append(f"\nmisclassified ({len(wrong)} of {self.images}): " + ", ".join(
                f"{f} as {self._predicted(p)}" for f, _, p in wrong[:WORST_SHOWN]) + (
                " (every one in the JSON's misclassified)" if len(wrong) > WORST_SHOWN else ""))
        return "\n".join(lines)

    def _segmentation_table(self) -> list[str]:
        """One line per test set: images, Dice, IoU, pixel accuracy, how it was made."""
        lines = [f"{checkpoint_said(self.checkpoint)}, {self.dataset}",
                 f"{'test set':<10}  {'images':>6}    Dice     IoU  pixel acc.  how made"]
        for name, er in self.results.items():
            size = self.extra_sizes.get(name, self.images)
            lines.append(f"{self.label(name):<10}  {size:>6}  {er.dice:6.4f}  {er.iou:6.4f}  {er.pixel_accuracy:10.4f}  "
                         f"{self.titles.get(name, '')}")
        lines.append("(the mask predicted where the probability exceeds 0.5; Dice and IoU are means over the images)")
        r = self.results[""]
        if self.test_files is not None and r.per_image_dice is not None and len(self.test_files) > 1:
            worst = r.per_image_dice.argsort(stable=True)[:WORST_SHOWN].tolist()  # lowest first, ties in file order
            lines.append("lowest Dice: " + ", ".join(f"{self.test_files[k]} {r.per_image_dice[k]:.4f}"
                                                      for k in worst) + " (every image's in the JSON's per_image)")
        return lines

    def _sets_table(self) -> list[str]:
        """One line per test set: its size, accuracy, where its digits sit and how it was made."""
        names = {name: self.label(name) for name in self.results}
        width = max(len(n) for n in names.values())
        lines = [f"{'test set':<{width}}  {'images':>6}  accuracy    error  ink on border  centre spread  how made"]
        for name, label in names.items():
            er, p = self.results[name], self.placements.get(name)
            size = self.extra_sizes.get(name, self.images)
            where = f"{100 * p.border_share:12.2f}%  {p.centre_std:10.1f} px" if p else f"{'':13}  {'':13}"
            how = self.titles.get(name, "")
            if name.startswith("affnist:"):
                how = f"real affNIST file; placement nearest: {self.nearest_placement(name)}"
            lines.append(f"{label:<{width}}  {size:>6}  {er.accuracy:8.4f}  {100 * er.error:6.2f}%  {where}  {how}")
        lines.append("(ink on border: share of images with ink in the outermost rows or columns; centre spread: "
                     "standard deviation of the ink boxes' centres)")
        return lines


def warn_folder_changed(ckpt: Checkpoint, name: str) -> None:
    """A warning where the user's folder a run trained on (``name``: folder:DIR, pairs:DIR, classes:DIR) holds other
    files than when the run last saved: its test pairs or images, scored now, are not those the run was tested on."""
    if (change := folder_change(ckpt.state, name)) is not None:
        noun = EXAMPLE_NOUN[user_folder(name)[0]]
        warnings.warn(f"{name} holds {change}: its test {noun}s are scored as the folder is now, not as the run was "
                      f"tested on them; put the folder back as it was for the run's own figures", UserWarning,
                      stacklevel=3)


def warn_not_finite(ckpt: Checkpoint, results: dict[str, Any]) -> None:
    """A UserWarning when a set's loss is NaN or infinite: finite weights whose outputs overflow (saved just before a
    run diverged) scored every NaN score as class 0 (argmax), a Dice of 0 from NaN probabilities, beside a loss of
    NaN, and nothing said what they meant."""
    import math

    bad = {name or "test": r.loss for name, r in results.items() if not math.isfinite(r.loss)}
    if bad:
        shown = ", ".join(f"{name} loss {loss}" for name, loss in bad.items())
        warnings.warn(f"{ckpt.path}: the model's outputs are NaN or infinite ({shown}): its weights overflow, as a "
                      f"diverging run's do, and the figures below mean nothing (argmax counts a NaN score as class "
                      f"0); evaluate an earlier checkpoint, or train again with a lower --lr", UserWarning,
                      stacklevel=3)


def evaluate_checkpoint(path: str | os.PathLike | Checkpoint, *, which: str = "best", dataset: str | None = None,
                        test_size: int = 0, affnist: Sequence[str | os.PathLike] = (), batch_size: int | None = None,
                        device: str | torch.device = "auto", root: str | os.PathLike | None = None,
                        progress: bool = True, weights: str = "saved") -> CheckpointEvaluation:
    """Score a checkpoint on the test split of ``dataset`` (default: the one it trained on), its extra sets
    (translated MNIST: the affNIST-like set) and any real affNIST ``.mat`` files given; ``weights`` as
    ``load_model``. ``batch_size``: examples a pass (None: 256, a segmentation model's 64)."""
    dev = resolve_device(device)
    model, ckpt = load_model(path, which=which, device=dev, weights=weights)
    train_config = ckpt.train_config
    name = dataset or trained_dataset(train_config, "mnist")
    cfg = model.config
    shape = (cfg.in_channels, cfg.input_height, cfg.input_width)
    kind = model_spec(ckpt.model_name).kind
    if task(name).kind != kind:
        raise ValueError(f"{name} is a {task(name).kind} data set but the checkpoint holds a {kind} model "
                         f"({ckpt.model_name}); evaluate it on a {kind} data set")
    if (data := input_shape(name)) != shape and not segments_size(model, data, name):
        what = (f"{data[0]}-channel images but the checkpoint's model was trained on {shape[0]}-channel "
                f"ones" if data[0] != shape[0] else f"images {data} but the checkpoint's model takes {shape}")
        raise ValueError(f"{name} has {what}; evaluate it on data of the shape it was trained on, or train a model "
                         f"for this data")
    if affnist and shape != (1, 40, 40):
        raise ValueError(f"--affnist scores 40x40 models (trained with --dataset translated-mnist); this one takes {shape}")
    if (changed := class_change(ckpt.state, name, absolute_dataset(name) == train_config.get("dataset"))) is not None:
        raise DataError(changed)
    if beyond := classes_beyond(name, getattr(cfg, "num_classes", None), train_config.get("dataset", "mnist"),
                                "evaluate"):
        raise ValueError(beyond)
    if dataset is None:
        warn_folder_changed(ckpt, name)
    from .data.affnist import load_affnist

    for mat in affnist:  # each read and checked whole before any set is scored (a bad file was refused after the
        load_affnist(mat)  # whole evaluation), one at a time (each can be half a gigabyte), and read again below
    split = load_test(name, size=test_size, root=root, progress=progress)
    check_test_size(test_size, len(split), name)
    recon_weight = train_config.get("recon_weight", 0.0005)
    results = evaluate_split(model, split.to(dev), batch_size=batch_size, recon_weight=recon_weight, progress=progress)
    sizes = {extra: len(s) for extra, s in split.extra.items()}
    if split.labels.dim() == 4:  # segmentation: say how each set was made
        warn_not_finite(ckpt, results)
        titles = {extra: s.title for extra, s in ({"": split} | split.extra).items() if s.title}
        return CheckpointEvaluation(ckpt, name, len(split), results, sizes, titles, test_files=split.names)
    described = bool(split.extra or affnist) and split.labels.dim() == 1  # several single-digit sets to tell apart
    sets = {"": split} | split.extra if described else {}
    titles = {extra: s.title for extra, s in sets.items() if s.title}
    placements = {extra: placement(s.images) for extra, s in sets.items()}
    for mat in affnist:
        real = scored = None  # the file before let go of first: one file's arrays held at a time
        real = load_affnist(mat)
        key = f"affnist:{Path(mat).name}"
        scored = Split(real.images, real.labels, real.classes).to(dev)
        results[key] = evaluate(model, scored.images, scored.labels, batch_size=batch_size or BATCH_SIZE,
                                recon_weight=recon_weight, progress=progress)
        sizes[key] = len(real)
        placements[key] = placement(real.images)
    warn_not_finite(ckpt, results)  # every set, the real affNIST files' too
    classes = tuple(map(str, split.classes)) if split.labels.dim() == 1 and split.classes else ()
    learned = trained_classes(train_config, ckpt.state)  # the model's own classes, its outputs' names
    warning = other_classes(train_config.get("dataset", "mnist"), name, learned, classes or None)
    return CheckpointEvaluation(ckpt, name, len(split), results, sizes, titles, placements, warning,
                                classes=classes, test_files=split.names,
                                labels=split.labels if split.names is not None else None,
                                predicted_classes=tuple(learned) if learned else classes)
