"""The only map from a data set or task name to its training batches and its test data.

Every name a user can train or evaluate on is a ``Task`` in ``TASKS``:

- the image sets of ``capsnet.data.sets`` (``mnist``, ``fashion-mnist``,
  ``mnist-sample``): training batches shifted by up to ``shift`` pixels
  (Sabour et al. 2017, section 5), tested on the set's test split;
- ``multimnist`` (section 6): 36x36 pairs of overlapping digits of different
  classes. Training pairs are drawn on the fly from the training digits, a new
  draw every batch from the epoch's seeded generator; the test set is one draw
  of ``TEST_PAIRS`` pairs (10,000) from the test digits under the fixed seed
  ``TEST_SEED``, the same for every run and model (``multimnist.py``);
- ``smallnorb`` (Hinton et al. 2018, section 5): both cameras' 96x96 images
  downsampled to 48x48 and standardised per image; training takes random
  32x32 crops with random brightness and contrast, testing the centre crop;
- ``cifar10`` (Sabour et al. 2017, section 7): 24x24 patches of the 32x32
  images, as the authors' ``cifar10_input.py`` makes them: training takes a
  random crop, flipped left-right half the time, with a random contrast;
  testing the centre crop; each image then standardised;
- ``svhn`` (section 7): the 32x32 cropped digits as they are (training
  shifted like MNIST's), the 73,257 training digits only;
- ``translated-mnist`` (section 5.2): training digits with their 28x28 frame
  at a uniformly random offset on a 40x40 black canvas (+-6 pixels about the
  centre), a new offset every time. Four fixed test sets from the same MNIST
  test digits, each drawn under ``TEST_SEED``, that tell where a digit is
  placed apart from how it is distorted (``affine.py`` has the rules):

  ======================  ==============  =========================================
  split                   digits          placement
  ======================  ==============  =========================================
  main                    untransformed   28x28 frame shifted +-6 px (as trained)
  ``affine_centred``      affine          ink box centred, then shifted +-6 px
  ``translated_anywhere`` untransformed   ink box anywhere wholly inside 40x40
  ``affine``              affine          ink box anywhere wholly inside 40x40
  ======================  ==============  =========================================

  ``affine`` is the affNIST-like set; ``affine_centred`` has the same
  transforms, digit for digit, and ``translated_anywhere`` the same placement
  draws as ``affine``.

- ``mnist-segmentation`` (SegCaps, LaLonde and Bagci 2018, on a task made
  from MNIST): 64x64 canvases, each with one target digit (random rotation,
  scale and position) among clutter (fragments of other digits, noise, a
  background gradient); the mask is the target digit's pixels. Training
  canvases are drawn on the fly from the training digits; the test set is
  10,000 canvases of the test digits under ``TEST_SEED``, with an
  out-of-distribution set ``ood`` (larger rotations and scales) beside it
  (``segmentation.py`` has the rules);
- ``folder:DIR``: the user's own segmentation data, PNG images in
  ``DIR/images`` and masks (0/1 or 0/255) of the same names in
  ``DIR/masks``; held-out pairs in ``DIR/test/images`` and ``DIR/test/masks``
  when that folder exists, else about one pair in five held out of
  training, each chosen by a hash of ``TEST_SEED`` and its own file name
  (``held_out_names``: adding files never moves another pair across).

- ``mnist-skeleton`` and ``fashion-silhouette`` (conditional synthesis,
  CapsPix2pix and pix2pix): the input is a label map made from the image,
  the digit's Zhang-Suen skeleton or the item's filled silhouette, and the
  target the image itself, both centred on 32x32 (``synthesis.py``); the
  class labels come along for scoring generated images with a classifier.
  The test pairs are those of the 10,000 test images, in order.
- ``pairs:DIR``: the user's own label maps in ``DIR/labels`` and images of
  the same names in ``DIR/images`` (PNG), held out as ``folder:DIR``.
- ``classes:DIR``: the user's own classification images, one subfolder of
  PNG files per class (``DIR/cat/*.png``, ``DIR/dog/*.png``: the classes in
  the order of their names, ``class_folders.py`` has the rules); held-out
  images in ``DIR/test/CLASS`` when ``DIR/test`` exists, else about one
  image in five of each class, chosen by name as ``folder:DIR``'s pairs are
  (at least one of each class held out and one kept). Trained with the
  shifts of ``--shift`` and ``--augment``, as the image sets are.
- ``mnist-sample-segmentation`` and ``mnist-sample-skeleton``: the same
  canvases and pairs made from the MNIST digits that ship with capsnet
  (``mnist-sample``: 2,000 training and 500 test digits), so the shipped
  segmentation and synthesis models open, and a first run trains, offline.

``nested_subset`` gives the "learning from less data" training subsets: the
first ``size`` indices of one seeded permutation, so for one seed the subsets
of 500, 1,000, 5,000, 10,000 and 60,000 examples are nested.

Adding a task is one file that makes its images, its test and one ``Task``
line here.
"""
from __future__ import annotations

import collections
import functools
import hashlib
import math
import numbers
import os
import threading
import warnings
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence, TypeVar

import torch
import torch.nn.functional as F

from .._text import some_of, told_apart
from ..routing.result import check_switch
from .affine import random_affine, random_translate
from .multimnist import MultiMNISTBatch, draw_pairs, make_pairs, render_pairs
from .idx import DataError
from .sets import _OTHER_CACHES, DATASETS, Dataset, load_dataset, split_validation, unit_float
from .cifar10 import CIFAR10_CLASSES, load_cifar10
from .class_folders import TEST_FOLDER, class_folders, load_class_folder, passed_over_folder, refuse_test_twin
from .segmentation import (CANVAS, IN_DISTRIBUTION, OUT_OF_DISTRIBUTION, load_mask_folder, random_canvases,
                           segmentation_test)
from .smallnorb import SMALLNORB_CLASSES, load_smallnorb
from .synthesis import load_pair_folder, pad_to, silhouette, skeletonize
from .svhn import SVHN_CLASSES, load_svhn

T = TypeVar("T")

__all__ = ["Task", "Split", "TASKS", "SHIPPED_SAMPLES", "shipped_default", "other_classes", "classes_beyond",
           "task_kind",
           "check_test_size", "user_folder", "absolute_dataset", "dataset_stem", "trained_dataset",
           "TEST_SEED", "TEST_PAIRS", "MULTIMNIST_SHIFT", "TRANSLATED_SIZE",
           "TRANSLATED_SHIFT", "task", "input_shape", "nested_subset", "load_test", "load_training", "multimnist_test",
           "translated_test", "affine_test", "affine_centred_test", "translated_anywhere_test", "FOLDER_PREFIX",
           "SEGMENTATION_CLASSES", "load_folder", "PAIRS_PREFIX", "SYNTHESIS_SIDE", "load_pairs", "load_source",
           "folder_contents", "CLASSES_PREFIX", "load_classes", "USER_PREFIXES", "EXAMPLE_NOUN", "class_change",
           "trained_classes", "saved_folder"]

TEST_SEED = 2017  # fixes every generated test set: all runs and both models see the same images
TEST_PAIRS = 10000  # the MultiMNIST test set: pairs drawn from the 10,000 MNIST test digits
MULTIMNIST_SHIFT = 4  # section 6: "each digit is shifted up to 4 pixels in each direction" (36x36)
TRANSLATED_SIZE = 40  # section 5.2: "placed randomly on a black background of 40x40 pixels"
TRANSLATED_SHIFT = (TRANSLATED_SIZE - 28) // 2  # 6: training's frame offsets 0..12 are +-6 px about the centre


@dataclass
class Split:
    """Images to train on or score, with what scoring them needs.

    images: (N, C, H, W), uint8 0..255 as loaded or float in [0, 1] as generated.
    labels: (N,) int64 classes, or (N, 2) for MultiMNIST pairs (scored top-2), or (N, 1, H, W) uint8 0/1 masks
        (segmentation: scored by Dice and IoU).
    classes: the class names.
    components: (N, 2, C, H, W) each digit of a pair alone (reconstruction targets), or (N, C, H, W) the images
        to synthesise from the label maps in ``images`` (synthesis), or None.
    extra: more test sets scored alike, by name (translated MNIST's "affine", ...).
    title: how its images were made, in a few words, for reports ("" where there is nothing to tell).
    names: a user's folder: each example's file name, its first file's (index k is file names[k]); None for the other sets.
    """

    images: torch.Tensor
    labels: torch.Tensor
    classes: tuple[str, ...]
    components: torch.Tensor | None = None
    extra: dict[str, "Split"] = field(default_factory=dict)
    title: str = ""
    names: tuple[str, ...] | None = None

    def __len__(self) -> int:
        return self.labels.shape[0]

    def to(self, device: str | torch.device) -> "Split":
        """On ``device``, images as float in [0, 1] and labels as int64, masks as uint8 (extra sets too)."""
        images = self.images.to(device)
        images = unit_float(images)
        labels = self.labels.to(device)
        return Split(images, labels if labels.dim() == 4 else labels.long(), self.classes,
                     None if self.components is None else self.components.to(device),
                     {name: s.to(device) for name, s in self.extra.items()}, self.title, self.names)


# A training batch: images (B, C, H, W), labels (B,) or (B, 2), components (B, 2, C, H, W) or None.
Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]
Augment = Callable[[torch.Tensor, torch.Generator], torch.Tensor]  # (images, generator) -> images


@dataclass(frozen=True)
class Task:
    """How one name becomes training batches and held-out splits.

    source: the image set of ``capsnet.data.sets`` it is made from.
    input_shape: (C, H, W) of its images.
    held: (digits, size, extras) -> the split scored on ``digits`` held out of
        training (test or validation), its first ``size`` examples (0: all; for
        MultiMNIST the number of pairs); ``extras=False`` leaves out the extra sets.
    batch: (training digits on the device, indices, generator, augmentation) -> one training batch; the
        augmentation (``capsnet.data.augment.augmentation``) applies to plain image sets, the generated tasks
        place their digits themselves.
    num_classes: the classes a model of this task scores.
    places_digits: True when the task places its digits itself (``shift`` does not apply).
    metric: what its accuracy counts.
    help: one line for the command line's help.
    kind: "classification" (labels are classes), "segmentation" (labels are masks (N, 1, H, W)) or "synthesis"
        (images are label maps, components the images to make from them, labels classes for scoring).
    target_channels: synthesis: the channels of the images made from the label maps.
    shape: synthesis: an image's binary shape, (N, C, H, W) -> (N, 1, H, W) 0/1, for the IoU of generated
        against real images (None: the pixels above half intensity).
    train_defaults: training settings (``TrainConfig`` fields) a run on this task gets from ``capsnet train`` and
        ``capsnet experiment`` unless typed, over its model's own (MultiMNIST: the paper's 10x decay period);
        ``fit`` trains the ``TrainConfig`` it is given.
    """

    source: str
    input_shape: tuple[int, int, int]
    held: Callable[[Dataset, int, bool], Split]
    batch: Callable[[Split, torch.Tensor, torch.Generator, Augment], Batch]
    num_classes: int = 10
    places_digits: bool = False
    metric: str = "accuracy"
    help: str = ""
    kind: str = "classification"
    target_channels: int = 1
    shape: Callable[[torch.Tensor], torch.Tensor] | None = None
    train_defaults: tuple[tuple[str, Any], ...] = ()  # (field, value) pairs (a tuple: a Task is hashable)


def _first(digits: Dataset, size: int) -> Dataset:
    return digits.subset(torch.arange(min(size, len(digits)))) if size else digits


def _plain_held(digits: Dataset, size: int, extras: bool = True) -> Split:
    d = _first(digits, size)
    return Split(d.images, d.labels, d.classes)


def _plain_batch(train: Split, idx: torch.Tensor, g: torch.Generator, augment: Augment) -> Batch:
    return augment(train.images[idx], g), train.labels[idx], None


def _multimnist_held(digits: Dataset, size: int, extras: bool = True) -> Split:
    if digits.labels.unique().numel() < 2:  # a validation split of a digit or two (--val-size 1)
        raise DataError(f"MultiMNIST pairs digits of two classes, and the {len(digits)} digit(s) held out here are "
                        f"all a {int(digits.labels[0])}: give a larger --val-size")
    # a split holds as many pairs as digits (the test set: TEST_PAIRS); more asked for are refused by
    # check_test_size, as for every task (a larger draw is another set: its pairs are not the fixed ones)
    pairs = multimnist_test(digits.images, digits.labels, min(size, len(digits)) if size else len(digits))
    return Split(pairs.images, pairs.labels, digits.classes, pairs.components)


def _multimnist_batch(train: Split, idx: torch.Tensor, g: torch.Generator, augment: Augment) -> Batch:
    # section 6: fresh pairs every batch, never stored; len(idx) pairs from the whole training set
    pairs = make_pairs(train.images, train.labels, len(idx), generator=g, max_shift=MULTIMNIST_SHIFT)
    return pairs.images, pairs.labels, pairs.components


# The translated task's test sets in the order reports show them: name -> (maker, title); "" is the main split.
# (Lambdas, because the makers are defined further down.)
# Each maker takes (digits, n) and returns the first n of the set made from all the digits.
_TRANSLATED_SETS = {
    "": (lambda x, n: translated_test(x)[:n],
         f"untransformed, 28x28 frame shifted +-{TRANSLATED_SHIFT} px (as trained)"),
    "affine_centred": (lambda x, n: affine_centred_test(x, first=n),
                       f"affine, ink box centred then shifted +-{TRANSLATED_SHIFT} px"),
    "translated_anywhere": (lambda x, n: translated_anywhere_test(x, first=n),
                            "untransformed, ink box anywhere in 40x40"),
    "affine": (lambda x, n: affine_test(x, first=n), "affine, ink box anywhere in 40x40 (affNIST-like)"),
}


def _translated_held(digits: Dataset, size: int, extras: bool = True) -> Split:
    # each set the first ``size`` of the one made from every digit: a maker's draws depend on how many images it
    # is given, and a run tested on --test-size N and `capsnet eval` on all of them must score the same placements
    # (the affine makers draw only the batches that hold the first ``size``)
    d = _first(digits, size)
    sets = {name: Split(make(digits.images, len(d)), d.labels, d.classes, title=title)
            for name, (make, title) in _TRANSLATED_SETS.items() if extras or not name}
    main = sets.pop("")
    main.extra = sets
    return main


def _translated_batch(train: Split, idx: torch.Tensor, g: torch.Generator, augment: Augment) -> Batch:
    # section 5.2: a random position on the 40x40 canvas, a new one every time
    return random_translate(train.images[idx], TRANSLATED_SIZE, generator=g)[0], train.labels[idx], None


NORB_SIDE, NORB_CROP = 48, 32  # Hinton et al. 2018, section 5: "downsampled to 48x48", "random 32x32 crops"
NORB_BRIGHTNESS, NORB_CONTRAST = 0.3, (0.7, 1.3)  # jitter in standard deviations and as a factor (the paper gives none)


# data sets whose models take prepared images (made by the tasks below), not PNG pixels / 255: how their test images
# are made (predict and the viewer refuse a user's images for them, training warns a sigmoid decoder of them)
PREPARED = {"cifar10": "centre-cropped to 24x24 and standardised per image",
            "smallnorb": "as two 96x96 views, downsampled to 48x48, standardised, then centre-cropped to 32x32"}


def _standardised(x: torch.Tensor) -> torch.Tensor:
    """Each image (N, C, H, W), pixels in [0, 1], to zero mean and unit variance over all its values, as
    ``tf.image.per_image_standardization`` does it to the pixels in 0..255 that the authors' CIFAR-10 and smallNORB
    pipelines give it (tensorflow/models research/capsules, google-research capsule_em): the standard deviation at
    least 1 / sqrt(C * H * W) in those units, 1 / (255 sqrt(C * H * W)) in these (the floor in [0, 1] units was 255
    times theirs: a low-contrast crop came out with a standard deviation of 0.42 where theirs has 1)."""
    mean = x.mean(dim=(1, 2, 3), keepdim=True)
    std = x.std(dim=(1, 2, 3), keepdim=True, unbiased=False).clamp_min(1.0 / (255.0 * math.sqrt(x[0].numel())))
    return (x - mean) / std


def _random_crops(x: torch.Tensor, crop: int, g: torch.Generator | None) -> torch.Tensor:
    """A random ``crop`` x ``crop`` window of each image, each its own corner: (B, C, H, W) -> (B, C, crop, crop)."""
    B, C, H, W = x.shape
    dev = x.device
    gen_dev = g.device if g is not None else torch.device("cpu")
    corner = torch.randint(0, min(H, W) - crop + 1, (2, B), generator=g, device=gen_dev).to(dev)
    r = torch.arange(crop, device=dev)
    rows, cols = corner[0, :, None] + r, corner[1, :, None] + r  # (B, crop) each
    return x[torch.arange(B, device=dev)[:, None, None, None], torch.arange(C, device=dev)[None, :, None, None],
             rows[:, None, :, None], cols[:, None, None, :]]


def _norb_standardised(images: torch.Tensor) -> torch.Tensor:
    """(N, 2, 96, 96) uint8 or [0, 1] -> (N, 2, 48, 48) float, each image zero mean and unit variance."""
    x = F.interpolate(unit_float(images), size=(NORB_SIDE, NORB_SIDE), mode="area")  # (N, 2, 48, 48)
    return _standardised(x)  # as tf.image.per_image_standardization


def _norb_held(digits: Dataset, size: int, extras: bool = True) -> Split:
    d = _first(digits, size)
    m = (NORB_SIDE - NORB_CROP) // 2
    images = torch.cat([_norb_standardised(d.images[k:k + 1000]) for k in range(0, len(d), 1000)] or
                       [torch.empty(0, 2, NORB_SIDE, NORB_SIDE)])
    return Split(images[:, :, m:m + NORB_CROP, m:m + NORB_CROP].contiguous(), d.labels, d.classes)  # the centre crop


def _norb_batch(train: Split, idx: torch.Tensor, g: torch.Generator, augment: Augment) -> Batch:
    x = _norb_standardised(train.images[idx])  # (B, 2, 48, 48)
    B, dev = len(idx), x.device
    gen_dev = g.device if g is not None else torch.device("cpu")
    x = _random_crops(x, NORB_CROP, g)  # (B, 2, 32, 32), a random crop of each
    u = torch.rand(2, B, 1, 1, 1, generator=g, device=gen_dev).to(dev)
    lo, hi = NORB_CONTRAST
    mean = x.mean(dim=(1, 2, 3), keepdim=True)
    x = (x - mean) * (lo + (hi - lo) * u[0]) + mean + NORB_BRIGHTNESS * (2 * u[1] - 1)  # contrast, then brightness
    return x, train.labels[idx], None


CIFAR_SIDE, CIFAR_CROP = 32, 24  # Sabour et al. 2017, section 7: "trained ... on 24 x 24 patches of the image"
CIFAR_CONTRAST = (0.2, 1.8)  # the authors' cifar10_input.py: tf.image.random_contrast(lower=0.2, upper=1.8)


def _cifar_held(digits: Dataset, size: int, extras: bool = True) -> Split:
    d = _first(digits, size)
    m = (CIFAR_SIDE - CIFAR_CROP) // 2
    crops = [_standardised(unit_float(d.images[k:k + 5000, :, m:m + CIFAR_CROP, m:m + CIFAR_CROP]))
             for k in range(0, len(d), 5000)]
    return Split(torch.cat(crops or [torch.empty(0, 3, CIFAR_CROP, CIFAR_CROP)]), d.labels, d.classes)  # centre crop


def _cifar_batch(train: Split, idx: torch.Tensor, g: torch.Generator, augment: Augment) -> Batch:
    # The authors' _distort_resize, then per-image standardisation: a random 24x24 crop, a left-right flip for half
    # the images, a random contrast factor in 0.2..1.8 about each channel's mean. (Their random brightness, +-63 of
    # 255, is left out: the standardisation takes the image's mean out again, so it would change nothing.)
    x = _random_crops(unit_float(train.images[idx]), CIFAR_CROP, g)  # (B, 3, 24, 24)
    B, dev = len(idx), x.device
    gen_dev = g.device if g is not None else torch.device("cpu")
    u = torch.rand(2, B, 1, 1, 1, generator=g, device=gen_dev).to(dev)
    x = torch.where(u[0] < 0.5, x.flip(-1), x)
    lo, hi = CIFAR_CONTRAST
    mean = x.mean(dim=(2, 3), keepdim=True)  # tf.image.adjust_contrast: each channel about its own mean
    x = (x - mean) * (lo + (hi - lo) * u[1]) + mean
    return _standardised(x), train.labels[idx], None


SEGMENTATION_CLASSES = ("background", "foreground")


def _check_clutter_pool(count: int, flag: str) -> None:
    """The canvases' clutter is cut from other digits of their split: one digit alone would clutter each canvas
    with pieces of its own target, marked background (a --val-size or --train-size of 1)."""
    if count < 2:
        raise DataError(f"the segmentation canvases' clutter is cut from other digits of their split, and this one "
                        f"holds {count} digit: give a larger {flag}")


def _seg_held(digits: Dataset, size: int, extras: bool = True) -> Split:
    # the fixed test canvases (the first `size` of them: a prefix of the full set), and the out-of-distribution set
    _check_clutter_pool(len(digits), "--val-size")  # the test splits hold 500 or 10,000
    n = min(size, len(digits)) if size else len(digits)  # one canvas per test digit: 10,000 at most
    images, masks = segmentation_test(digits.images, n, seed=TEST_SEED)
    split = Split(images, masks, SEGMENTATION_CLASSES, title="as trained: rotation, scale and clutter of training")
    if extras:
        ood = segmentation_test(digits.images, n, seed=TEST_SEED, rule=OUT_OF_DISTRIBUTION)
        split.extra = {"ood": Split(*ood, SEGMENTATION_CLASSES,
                                    title=f"out of distribution: rotation up to {OUT_OF_DISTRIBUTION.rotation_deg:g} "
                                          f"degrees, scale {OUT_OF_DISTRIBUTION.scale[0]:g}-"
                                          f"{OUT_OF_DISTRIBUTION.scale[1]:g}")}
    return split


def _seg_batch(train: Split, idx: torch.Tensor, g: torch.Generator, augment: Augment) -> Batch:
    # fresh canvases every batch: the target digits at idx, clutter from the whole training set
    images, masks = random_canvases(train.images, idx, g, IN_DISTRIBUTION)
    return images, masks, None


def _folder_held(pairs: Dataset, size: int, extras: bool = True) -> Split:
    d = _first(pairs, size)
    return Split(d.images, d.labels, d.classes, names=d.names)


def _folder_batch(train: Split, idx: torch.Tensor, g: torch.Generator, augment: Augment) -> Batch:
    return train.images[idx], train.labels[idx], None  # the user's pairs as they are


SYNTHESIS_SIDE = 32  # the 28x28 images centred on 32x32: the generators halve their input three times


def _synthesis_pairs(images: torch.Tensor, make_label) -> tuple[torch.Tensor, torch.Tensor]:
    """(label maps, targets), both float on SYNTHESIS_SIDE: ``make_label`` of the 28x28 images, and the images."""
    x = unit_float(images)  # (N, 1, 28, 28)
    return pad_to(make_label(x).float(), SYNTHESIS_SIDE), pad_to(x, SYNTHESIS_SIDE)


def _synthesis_held(source: Dataset, size: int, extras: bool = True, *, make_label, what: str) -> Split:
    d = _first(source, size)
    labels, targets = _synthesis_pairs(d.images, make_label)
    return Split(labels, d.labels, d.classes, targets, title=f"{what} of the test images, in order")


def _synthesis_batch(train: Split, idx: torch.Tensor, g: torch.Generator, augment: Augment, *, make_label) -> Batch:
    labels, targets = _synthesis_pairs(train.images[idx], make_label)  # made on the fly, on the device
    return labels, train.labels[idx], targets


def _synthesis_task(make_label, what: str):
    """The held-out split and training batch of a synthesis task: partials of module functions, not closures, so a
    Task pickles (a DataLoader's workers under spawn) as every other task does."""
    return (functools.partial(_synthesis_held, make_label=make_label, what=what),
            functools.partial(_synthesis_batch, make_label=make_label))


_SKELETON = _synthesis_task(skeletonize, "Zhang-Suen skeletons")
_SILHOUETTE = _synthesis_task(silhouette, "filled silhouettes")


def _pairs_held(pairs: Dataset, size: int, extras: bool = True) -> Split:
    d = _first(pairs, size)  # images: the label maps; labels: the images made from them
    return Split(d.images.float() / 255.0, torch.zeros(len(d), dtype=torch.long), d.classes,
                 d.labels.float() / 255.0, title="your label maps and images", names=d.names)


def _pairs_batch(train: Split, idx: torch.Tensor, g: torch.Generator, augment: Augment) -> Batch:
    # the training split holds the label maps as its images and the images to make as its labels (uint8)
    return train.images[idx], torch.zeros_like(idx), train.labels[idx].float() / 255.0


_MULTI_SIDE = 28 + 2 * MULTIMNIST_SHIFT
TASKS: dict[str, Task] = {
    **{name: Task(name, (1, 28, 28), _plain_held, _plain_batch) for name in DATASETS},
    "multimnist": Task("mnist", (1, _MULTI_SIDE, _MULTI_SIDE), _multimnist_held, _multimnist_batch, places_digits=True,
                       metric="top-2 exact accuracy",  # section 6: both longest capsules are the pair's labels
                       # section 6.1: "we increased the period of the decay step for the learning rate to be 10x
                       # larger because the training dataset is larger" (the authors' code: 2,000 steps)
                       train_defaults=(("lr_decay_steps", 20000),),
                       help="overlapping digit pairs on 36x36, made from MNIST on the fly (section 6)"),
    "translated-mnist": Task("mnist", (1, TRANSLATED_SIZE, TRANSLATED_SIZE), _translated_held, _translated_batch,
                             places_digits=True,
                             help="MNIST digits shifted up to 6 px on 40x40, scored on translated and affine test "
                                  "digits, each placed within the training range and anywhere (section 5.2)"),
    "smallnorb": Task("smallnorb", (2, NORB_CROP, NORB_CROP), _norb_held, _norb_batch,
                      num_classes=len(SMALLNORB_CLASSES), places_digits=True,
                      help="smallNORB, both cameras, 32x32 crops of the 48x48 images (Hinton et al. 2018); not "
                           "downloadable offline"),
    "cifar10": Task("cifar10", (3, CIFAR_CROP, CIFAR_CROP), _cifar_held, _cifar_batch, places_digits=True,
                    help="CIFAR-10, random 24x24 crops (flipped, contrast-jittered) for training, the centre crop for "
                         "testing, each image standardised (section 7); use --model capsnet-cifar10"),
    "svhn": Task("svhn", (3, 32, 32), _plain_held, _plain_batch,
                 help="SVHN's cropped 32x32 digits, training on the 73,257 of train_32x32.mat (not extra), scored on "
                      "test_32x32.mat; use --model capsnet-svhn"),
    "mnist-segmentation": Task("mnist", (1, CANVAS, CANVAS), _seg_held, _seg_batch, num_classes=1, places_digits=True,
                               metric="Dice", kind="segmentation",
                               help="64x64 canvases, one rotated and scaled MNIST digit among clutter, its pixels the "
                                    "mask; scored by Dice and IoU, also out of distribution; use --model segcaps, "
                                    "segcaps-r1 or unet (SegCaps, LaLonde and Bagci 2018)"),
    "mnist-skeleton": Task("mnist", (1, SYNTHESIS_SIDE, SYNTHESIS_SIDE), *_SKELETON, places_digits=True, metric="L1",
                           kind="synthesis", help="a digit's skeleton -> the digit, 32x32; use --model capspix2pix, "
                                                  "capspix2pix-deep or pix2pix (CapsPix2pix, Bass et al. 2019)"),
    "fashion-silhouette": Task("fashion-mnist", (1, SYNTHESIS_SIDE, SYNTHESIS_SIDE), *_SILHOUETTE, places_digits=True,
                               metric="L1", kind="synthesis", shape=silhouette,
                               help="a Fashion-MNIST item's filled silhouette -> the item, 32x32; use --model "
                                    "capspix2pix, capspix2pix-deep or pix2pix"),
    # the same two tasks on the digits that ship with capsnet (mnist-sample): offline, for the shipped segmentation
    # and synthesis models (the viewer opens them on these), a first run, or a tutorial
    "mnist-sample-segmentation": Task("mnist-sample", (1, CANVAS, CANVAS), _seg_held, _seg_batch, num_classes=1,
                                      places_digits=True, metric="Dice", kind="segmentation",
                                      help="mnist-segmentation's canvases from the 2,000 training and 500 test MNIST "
                                           "digits that ship with capsnet: offline"),
    "mnist-sample-skeleton": Task("mnist-sample", (1, SYNTHESIS_SIDE, SYNTHESIS_SIDE), *_SKELETON, places_digits=True,
                                  metric="L1", kind="synthesis",
                                  help="mnist-skeleton's pairs from the MNIST digits that ship with capsnet: offline"),
}
# a task on MNIST -> the same task on the digits that ship with capsnet: where a shipped model (pretrained:NAME)
# opens by default in the viewer and `capsnet figures`, offline
SHIPPED_SAMPLES = {"mnist": "mnist-sample", "mnist-segmentation": "mnist-sample-segmentation",
                   "mnist-skeleton": "mnist-sample-skeleton"}


def shipped_default(trained_on: str) -> str:
    """The data set a shipped model trained on ``trained_on`` is shown on when none is given: the same task on the
    shipped MNIST digits where there is one (offline), else ``trained_on`` itself (a Fashion-MNIST model on
    Fashion-MNIST, never on digits)."""
    return SHIPPED_SAMPLES.get(trained_on, trained_on)


def _task_classes(name: str) -> tuple[str, ...] | None:
    """The class names of registered classification task ``name`` without loading it; None for any other name."""
    from .sets import class_names

    if name not in TASKS or TASKS[name].kind != "classification":
        return None
    known = {"cifar10": CIFAR10_CLASSES, "svhn": SVHN_CLASSES, "smallnorb": SMALLNORB_CLASSES}
    return known.get(TASKS[name].source) or class_names(TASKS[name].source)


def saved_folder(state: dict[str, Any]) -> dict[str, Any]:
    """What a run's saved ``state`` recorded of its user's folder (``folder_contents``: its files' count and digest;
    for classes:DIR its class names and the fit ``capsnet prepare`` made it with), or {} where it recorded none."""
    data = state.get("data")
    return data if isinstance(data, dict) else {}


def trained_classes(train_config: dict[str, Any], state: dict[str, Any]) -> tuple[str, ...] | None:
    """The class names of the classifier a run trained (its saved ``train_config`` and ``state``), without reading
    any data: a registered set's own, or the class folders a ``classes:DIR`` run recorded; None for other runs
    (segmentation, synthesis) and for a run that does not say."""
    name = train_config.get("dataset", "mnist")
    if name.startswith(CLASSES_PREFIX):
        saved = saved_folder(state).get("classes")
        return tuple(map(str, saved)) if isinstance(saved, list) and saved else None
    return _task_classes(name)


def other_classes(trained_on: str, scored_on: str, trained: Sequence[str] | None = None,
                  scored: Sequence[str] | None = None) -> str | None:
    """A warning when a classifier trained on ``trained_on`` is scored or shown on ``scored_on`` whose classes are
    others (a Fashion-MNIST model on MNIST digits: its accuracy there counts nothing); None when they agree or
    either is not known, or the scored classes are the model's first ones (a folder of the digits 0, 1 and 2: its
    labels name the model's outputs 0, 1 and 2). ``trained``, ``scored``: the class names where the data set's name
    alone does not give them (a ``classes:DIR`` run's recorded folders, ``trained_classes``; a loaded split's): an
    MNIST model scored on a folder of zero/one/two was scored without a word."""
    a = tuple(map(str, trained)) if trained else _task_classes(trained_on)
    b = tuple(map(str, scored)) if scored else _task_classes(scored_on)
    if a is None or b is None or a[:len(b)] == b:  # (the model's first classes: a folder of digits 0, 1 and 2 alone)
        return None
    return (f"the model was trained on {trained_on} ({', '.join(told_apart(a, b)[:3])}, ...) but {scored_on}'s "
            f"classes are others ({', '.join(told_apart(b, a)[:3])}, ...), so its accuracy there means nothing "
            f"(--dataset {trained_on} uses its own classes)")


def classes_beyond(name: str, model_classes: int | None, trained_on: str, verb: str) -> str | None:
    """Why a classifier of ``model_classes`` outputs (trained on ``trained_on``) cannot be scored or drawn on data
    set ``name``, whose labels run past them, said for the user (``verb``: what the command does, "evaluate"); None
    where it can (a set of at most that many classes, or not a classification set). Known from the name (a folder's
    from its files), before the set is read: "class labels must be in 0..2 for 3 classes" came from deep in the
    scoring once the whole set had loaded (a bug hunt, 2026-12-05)."""
    n = task(name).num_classes
    if model_classes is None or task(name).kind != "classification" or n <= model_classes:
        return None
    return (f"{name} has {n} classes but the checkpoint's model tells {model_classes} apart (it trained on "
            f"{trained_on}): its labels would name outputs the model does not have; {verb} it on the data set it was "
            f"trained on (--dataset), or one of at most {model_classes} classes")


FOLDER_PREFIX = "folder:"  # --dataset folder:DIR, the user's own images and masks
PAIRS_PREFIX = "pairs:"  # --dataset pairs:DIR, the user's own label maps and images
CLASSES_PREFIX = "classes:"  # --dataset classes:DIR, the user's own images in one subfolder per class
USER_PREFIXES = (FOLDER_PREFIX, PAIRS_PREFIX, CLASSES_PREFIX)
# what one example of a user's folder is called in messages, by its prefix
EXAMPLE_NOUN = {FOLDER_PREFIX: "pair", PAIRS_PREFIX: "pair", CLASSES_PREFIX: "image"}


def user_folder(name: str) -> tuple[str, str] | None:
    """(prefix, DIR) of a user's ``folder:DIR``, ``pairs:DIR`` or ``classes:DIR``; None for every other data set
    name."""
    prefix = next((p for p in USER_PREFIXES if name.startswith(p)), None)
    return None if prefix is None else (prefix, name[len(prefix):])


def dataset_stem(name: str) -> str:
    """A data set's name as part of a file or folder name: folder:DIR, pairs:DIR and classes:DIR as folder-NAME,
    pairs-NAME and classes-NAME (NAME: DIR's last part), every other name as it is."""
    folder = user_folder(name)  # the name as given (a link's own name, not its target's: stable once it is gone)
    return f"{folder[0][:-1]}-{Path(os.path.abspath(os.path.expanduser(folder[1]))).name}" if folder else name


def folder_contents(name: str) -> dict[str, Any] | None:
    """What the user's folder of ``folder:DIR``, ``pairs:DIR`` or ``classes:DIR`` holds, for a resume to notice a
    change: how many PNG files its two subfolders (its class folders; and test/'s) hold and a digest of their names
    and contents (the files the loader reads: hidden files such as .DS_Store and other files are not counted, a file
    rewritten to the same size is), and for ``classes:DIR`` the class names (so a model trained on it names its
    classes where the folder is not at hand). ``version`` 2; a run saved with version 1 (names and sizes of every
    file) is compared by count alone. None for other data sets and for a folder that is not there."""
    folder = user_folder(name)
    if folder is None or not Path(folder[1]).expanduser().is_dir():
        return None
    root = Path(folder[1]).expanduser()
    files = sorted(f for top in (root, root / "test") for sub in _subfolders_of(folder[0], top) if (top / sub).is_dir()
                   for f in (top / sub).iterdir()
                   if f.is_file() and not f.name.startswith(".") and f.suffix.lower() == ".png")
    digest = hashlib.blake2b(digest_size=8)
    for f in files:
        digest.update(str(f.relative_to(root)).encode() + b"\0")
        with open(f, "rb") as data:  # (hashlib.file_digest is Python 3.11's; capsnet runs on 3.10)
            each = hashlib.blake2b()
            for chunk in iter(lambda: data.read(1 << 20), b""):
                each.update(chunk)
        digest.update(each.digest())
    classes = {}
    if folder[0] == CLASSES_PREFIX:  # the names a model of it scores; the fit capsnet prepare made it with, if it did
        from .prepare import prepared_fit

        classes = {"classes": list(class_folders(root, at_least=0))} | (
            {"prepared_fit": fit} if (fit := prepared_fit(root)) else {})
    return {"files": len(files), "digest": digest.hexdigest(), "version": 2} | classes


def folder_change(state: dict[str, Any], dataset: str, now: dict[str, Any] | None = None) -> str | None:
    """How the user's folder of ``dataset`` (folder:DIR, pairs:DIR) differs from what a run's saved ``state`` says
    it held ("N files, M when the run last saved", or other names or contents), or None: unchanged, not a user's
    folder, or a state that does not say (``now``: ``folder_contents(dataset)``, if read already)."""
    now = folder_contents(dataset) if now is None else now
    before = state.get("data")
    if now is None or not isinstance(before, dict):
        return None
    if before.get("version") != now["version"]:  # saved by an earlier capsnet: its digest counted other files; their
        before = {**now, "files": before.get("files")}  # number alone compares
    # the images alone: not the class names (class_change) nor the fit capsnet prepare recorded, whose record may
    # have gone (the PNGs copied alone)
    if all(before.get(k) == now[k] for k in ("files", "digest", "version")):
        return None
    return (f"{now['files']} files, {before['files']} when the run last saved" if now["files"] != before["files"]
            else f"{now['files']} files, as when the run last saved, but other names or contents")


def class_change(state: dict[str, Any], dataset: str, trained_here: bool = True) -> str | None:
    """Where the class folders of ``dataset`` (classes:DIR) are not those of the run whose saved ``state`` is given:
    a message naming both lists and the fix (a model scores the classes it was trained on, by their order: a class
    folder added, removed or renamed makes its labels mean other classes), or None (the same classes, another data
    set, or a state that does not say). ``trained_here``: ``dataset`` is the folder the run trained on (else another
    folder the model is scored on)."""
    folder = user_folder(dataset)
    saved = saved_folder(state).get("classes")
    if folder is None or folder[0] != CLASSES_PREFIX or not isinstance(saved, list):
        return None
    now = list(class_folders(Path(folder[1]).expanduser(), at_least=0))
    if now == saved:
        return None

    def listed(names: list[str]) -> str:
        return some_of(told_apart(names, [*now, *saved]), 8)

    added, gone = [c for c in now if c not in saved], [c for c in saved if c not in now]
    new, missing = ("new", "gone") if trained_here else ("not the model's", "missing")
    differ = "; ".join(([f"{new}: {listed(added)}"] if added else []) +
                       ([f"{missing}: {listed(gone)}"] if gone else [])) or "the same names in another order"
    if not trained_here:
        return (f"{dataset} holds other class folders than the model was trained on ({differ}), and a model scores "
                f"the classes it was trained on in their order; give it a folder of those classes "
                f"({listed([str(c) for c in saved])})")
    return (f"{dataset} holds other class folders than when the run trained on it ({differ}), and a model scores the "
            f"classes it was trained on in their order; put the class folders back as they were, or train a new run "
            f"on the folder as it is")


def trained_dataset(train_config: dict[str, Any], default: str = "mnist") -> str:
    """The data set a run trained on (its saved ``dataset``, else ``default``): a user's folder that is no longer
    where the run recorded it is a DataError that says so and names the fix (--dataset with its new place), not
    "no such folder" of a --dataset the user never typed."""
    name = train_config.get("dataset", default)
    folder = user_folder(name)
    if folder and folder[1] and not Path(folder[1]).expanduser().is_dir():
        raise DataError(f"the run trained on {name}, which is not there any more (moved or removed): give "
                        f"--dataset {folder[0]}DIR with the folder's new place")
    return name


def absolute_dataset(name: str) -> str:
    """``name`` with the DIR of folder:DIR or pairs:DIR made absolute (``~`` expanded), other names as they are: a run
    records where its folder is, so it resumes, evaluates and draws from any working directory."""
    folder = user_folder(name)
    if folder is None or not folder[1]:
        return name
    return folder[0] + os.path.abspath(os.path.expanduser(folder[1]))


def _both_splits(root: str | os.PathLike, prefix: str) -> Dataset:
    """The test split of a user's folder (``prefix`` folder: or pairs:), after checking that its training split has
    the same shapes (they differ only when DIR/test holds its own pairs): every file read and checked, for the
    models' shapes. Once while the folder's files stay as they are: a long-lived process (the viewer, a notebook)
    sees a file added, removed or rewritten, as ``_read_folder`` does."""
    base = Path(root).expanduser().absolute()
    stamp = tuple(_stamp(top, _subfolders_of(prefix, top)) for top in (base, base / "test")) + \
        ((base / "test").is_dir(),)
    # keyed by the absolute folder: classes:d and classes:/abs/d read (and warned) once
    return _BOTH_SPLITS.get((str(base), prefix), stamp, lambda: _read_both_splits(root, prefix))


class _LatestByFolder:
    """What was read from a folder, the latest copy of each folder only (its stamp: its files' names, sizes and
    times): a file changed replaces the copy, where a cache keyed by the stamp kept up to its size of stale whole
    copies of one folder (3,000 pairs of 256x256: 1.7 GB after one read, 4.9 GB after five edits). At most
    ``maxsize`` folders, the least recently read dropped first."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize, self.items, self.lock = maxsize, collections.OrderedDict(), threading.Lock()

    def get(self, key: Any, stamp: tuple, make: Callable[[], T]) -> T:
        with self.lock:
            held = self.items.pop(key, None)  # a stale copy goes before the new one is read
            if held is not None and held[0] == stamp:
                self.items[key] = held
                return held[1]
        value = make()
        with self.lock:
            self.items[key] = (stamp, value)
            while len(self.items) > self.maxsize:
                self.items.popitem(last=False)
        return value

    def clear(self) -> int:
        """Let go of every folder's copy; how many there were."""
        with self.lock:
            n = len(self.items)
            self.items.clear()
        return n


_BOTH_SPLITS = _LatestByFolder(8)
_FOLDERS = _LatestByFolder(4)
_OTHER_CACHES.append(lambda: _FOLDERS.clear() + _BOTH_SPLITS.clear())  # capsnet.data.clear_data_cache


def _read_both_splits(root: str | os.PathLike, prefix: str) -> Dataset:
    load = {FOLDER_PREFIX: load_folder, PAIRS_PREFIX: load_pairs, CLASSES_PREFIX: load_classes}[prefix]
    noun = EXAMPLE_NOUN[prefix]
    test = load(root, "test")
    if (Path(root).expanduser() / "test").is_dir():
        train = load(root, "train")
        # the two folders' own names ("second files" before; a pairs:DIR's label maps were called its images)
        first, second = {PAIRS_PREFIX: ("label maps", "images"), FOLDER_PREFIX: ("images", "masks")}.get(
            prefix, ("images", "labels"))
        for what, a, b in ((first, train.images, test.images), (second, train.labels, test.labels)):
            if a.shape[1:] != b.shape[1:]:
                raise DataError(f"{root}: the training {noun}s' {what} are {tuple(a.shape[1:])} (C, H, W) but those in "
                                f"{Path(root) / 'test'} are {tuple(b.shape[1:])}; make both splits one size and mode")
        trained: dict[bytes, str] = {}
        for k in range(len(train)):
            trained.setdefault(_pair_digest(train, k), train.names[k])
        copied = [f"{test.names[k]} (= {trained[d]})" for k in range(len(test))
                  if (d := _pair_digest(test, k)) in trained]  # each named beside its training twin
        if copied:  # a test pair also trained on scores as if seen: its figures would be too good
            shown = some_of(copied)
            same = "the same file's contents, of the same class" if prefix == CLASSES_PREFIX else \
                "the same files' contents"
            raise DataError(f"{Path(root) / 'test'} holds {len(copied)} of the training {noun}s ({same}): {shown}; "
                            f"a test {noun} must not be trained on: keep it in test/ only (remove it from the "
                            f"training folders of {root})")
    if prefix == CLASSES_PREFIX:
        inside = "test/" if (Path(root).expanduser() / "test").is_dir() else ""  # the test files' own folder
        _warn_other_class_twins(root, [("", load(root, "train")), (inside, test)])  # read already: from the cache
    return test


def _warn_other_class_twins(root: str | os.PathLike, splits: list[tuple[str, Dataset]]) -> None:
    """A UserWarning naming the images of ``root`` (classes:DIR) whose contents are another class's image too (a
    photo saved into two class folders): labelled both ways, at most one of them can be scored right, and a test
    copy of another class's training image is a test image trained on. ``splits``: (the folder its names are in,
    split)."""
    first: dict[bytes, tuple[int, str]] = {}
    clashes: list[str] = []
    for folder, split in splits:
        for k in range(len(split)):
            label, name = int(split.labels[k]), folder + split.names[k]
            seen = first.setdefault(_digest(split.images[k]), (label, name))
            if seen[0] != label:
                clashes.append(f"{name} = {seen[1]}")
    if clashes:
        shown = some_of(clashes)
        warnings.warn(f"{CLASSES_PREFIX}{root} holds {len(clashes)} image(s) whose contents are an image of another "
                      f"class too: {shown}; labelled both ways, at most one of each can be scored right: keep each "
                      f"in its own class only", UserWarning, stacklevel=2)


def _pair_digest(pairs: Dataset, k: int) -> bytes:
    """A digest of pair ``k``'s two arrays (its contents, not its name)."""
    return _digest(pairs.images[k], pairs.labels[k])


def _digest(*arrays: torch.Tensor) -> bytes:
    """A digest of the arrays' contents."""
    h = hashlib.blake2b(digest_size=16)
    for t in arrays:
        h.update(t.contiguous().numpy().tobytes())
    return h.digest()


def _folder_task(name: str) -> Task:
    pairs = _both_splits(name[len(FOLDER_PREFIX):], FOLDER_PREFIX)  # the shape for models
    return Task(name, tuple(pairs.images.shape[1:]), _folder_held, _folder_batch, num_classes=1, places_digits=True,
                metric="Dice", kind="segmentation")


def _classes_task(name: str) -> Task:
    test = _both_splits(name[len(CLASSES_PREFIX):], CLASSES_PREFIX)  # the shape and classes for models
    return Task(name, tuple(test.images.shape[1:]), _folder_held, _plain_batch, num_classes=len(test.classes))


def load_classes(root: str | os.PathLike, split: str) -> Dataset:
    """The user's classification images under ``root`` (see the module docstring) as a Dataset: (N, C, H, W) uint8
    images, (N,) int64 labels indexing the class folders' names (sorted). Without ``root/test``, about a fifth of
    each class's images, each chosen by its name (``held_out_names``), are the test split and the rest the training
    split."""
    if split not in ("train", "test"):
        raise DataError(f"unknown split {split!r} of {CLASSES_PREFIX}{root}; valid splits: train, test")
    base = Path(root).expanduser()
    if not base.is_dir():
        raise DataError(f"{CLASSES_PREFIX}{root}: no such folder; give a folder holding one subfolder of PNG images "
                        f"per class (DIR/cat/*.png, DIR/dog/*.png, ...)")
    classes = tuple(class_folders(base))
    held_out = (base / TEST_FOLDER).is_dir()
    where = base / TEST_FOLDER if held_out and split == "test" else base
    images, labels, names = _read_classes(where, classes, held_out and split == "test")  # the cache's tensors:
    name = f"{CLASSES_PREFIX}{root}"  # each split below is a copy
    if held_out:
        keep = _by_turns(labels, range(len(labels))) if split == "test" else list(range(len(labels)))
        return Dataset(name, split, images[keep], labels[keep], classes, tuple(names[i] for i in keep))
    keep: list[int] = []
    for k, c in enumerate(classes):  # each class held out apart: every class is both trained on and tested
        members = (labels == k).nonzero().flatten().tolist()
        if len(members) < 2:
            raise DataError(f"class {c!r} holds {len(members)} image in {base / c}; at least 2 are needed to hold one "
                            f"out for testing (add images, or put the test images in {base / TEST_FOLDER / c})")
        held = held_out_twins([names[i] for i in members], [_digest(images[i]) for i in members], base / c)
        keep += [i for i in members if (names[i] in held) == (split == "test")]
    if split == "test":
        keep = _by_turns(labels, keep)
    return Dataset(name, split, images[keep], labels[keep], classes, tuple(names[i] for i in keep))


def _by_turns(labels: torch.Tensor, indices) -> list[int]:
    """``indices`` reordered a class at a time in turn (the first of each class, then the second of each, ...), each
    class's in its own order: a test split's first N images (--test-size N, the viewer's first ones) then hold every
    class, where the class folders' order gave the first class alone."""
    by_class: dict[int, list[int]] = {}
    for i in indices:
        by_class.setdefault(int(labels[i]), []).append(i)
    turns = [(k, c, i) for c, members in by_class.items() for k, i in enumerate(members)]
    return [i for _, _, i in sorted(turns)]


def _read_classes(where: Path, classes: tuple[str, ...], test_split: bool = False
                  ) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """``load_class_folder(where, classes)``, once while the class folders' files stay as they are (``_read_folder``
    for a folder of classes)."""
    where = Path(where).expanduser().absolute()
    images, labels, names = _FOLDERS.get((CLASSES_PREFIX, str(where), classes, test_split),
                                         _stamp(where, _subfolders_of(CLASSES_PREFIX, where)),
                                         lambda: load_class_folder(where, classes, test_split=test_split)[:3])
    return images, labels, list(names)


def _subfolders_of(prefix: str, top: Path) -> tuple[str, ...]:
    """The subfolders of ``top`` a user's folder of kind ``prefix`` reads: its two (images and masks, labels and
    images), or for ``classes:DIR`` every visible one but test/ (the class folders)."""
    if prefix != CLASSES_PREFIX:
        return _SUBFOLDERS[prefix]
    if not top.is_dir():
        return ()
    return tuple(sorted(e.name for e in os.scandir(top)
                        if e.is_dir() and not passed_over_folder(e.name) and e.name != TEST_FOLDER))


def _pairs_task(name: str) -> Task:
    pairs = _both_splits(name[len(PAIRS_PREFIX):], PAIRS_PREFIX)  # the shapes for models
    return Task(name, tuple(pairs.images.shape[1:]), _pairs_held, _pairs_batch, num_classes=1, places_digits=True,
                metric="L1", kind="synthesis", target_channels=pairs.labels.shape[1])


def load_pairs(root: str | os.PathLike, split: str) -> Dataset:
    """The user's synthesis pairs under ``root`` as a Dataset: images = the label maps (N, C, H, W) uint8, labels =
    the images to make from them (N, C', H, W) uint8; split and held out as ``load_folder``."""
    scale = _binary_label_maps(str(root)) if (Path(root).expanduser() / "test").is_dir() else None
    return _user_split(root, split, PAIRS_PREFIX, "labels/ and images/", lambda where: _read_folder(
        PAIRS_PREFIX, where, scale), ("pair",))


def _binary_label_maps(root: str) -> bool:
    """Whether every label map of a user's pairs, in ``root/labels`` and ``root/test/labels``, holds only 0s and 1s:
    both splits are then read as 0/255, else both as they are (decided per folder, a class map of the test split
    holding only classes 0 and 1 read 255 times brighter than in training). Read once while the files stay as they
    are (``_read_folder``'s key)."""
    base = Path(root).expanduser().absolute()
    stamp = tuple(_stamp(top, ("labels",)) for top in (base, base / "test"))
    return _binary_label_maps_once(str(base), stamp)


@functools.lru_cache(maxsize=4)
def _binary_label_maps_once(root: str, stamp: tuple) -> bool:
    from .png import label_map_array, png_files, refuse_mixed_binary_label_maps

    base = Path(root)
    maps = [(str(f), label_map_array(f)) for top in (base, base / "test")
            for f in png_files(top / "labels", "label maps").values()]
    refuse_mixed_binary_label_maps(maps, str(base))
    return all(a.max() <= 1 for _, a in maps)


def load_folder(root: str | os.PathLike, split: str) -> Dataset:
    """The user's segmentation pairs under ``root`` (see the module docstring) as a Dataset of masks: (N, C, H, W)
    uint8 images, (N, 1, H, W) uint8 0/1 masks. Without ``root/test``, about a fifth of the pairs, each
    chosen by its name (``held_out_names``), are the test split and the rest the training split."""
    return _user_split(root, split, FOLDER_PREFIX, "images/ and masks/", lambda where: _read_folder(
        FOLDER_PREFIX, where), SEGMENTATION_CLASSES)


# a user's folder's two subfolders, by its prefix: the first and second files of each pair
_SUBFOLDERS = {FOLDER_PREFIX: ("images", "masks"), PAIRS_PREFIX: ("labels", "images")}


def _read_folder(kind: str, where: Path, scale: bool | None = None) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """A user's folder of pairs (``kind`` its prefix, folder: or pairs:) read (``load_mask_folder`` or
    ``load_pair_folder``), once while its files stay as they are: a run reads a folder for its shapes, its training
    split and its test split, and the viewer and figures read it again; each PNG was decoded up to four times. The
    files' names, sizes and change times are the key, so a file added, removed or rewritten is read afresh. The
    tensors returned are the cache's: copy them before handing them on (``_user_split`` does)."""
    where = Path(where).expanduser().absolute()
    first, second, names = _FOLDERS.get((kind, str(where), scale), _stamp(where, _SUBFOLDERS[kind]),
                                        lambda: _read_folder_once(kind, str(where), scale))
    return first, second, list(names)


def _file_names(where: Path, kind: str, stems: list[str]) -> list[str]:
    """The first files' own names (``img.PNG``, a name in the form the disk holds) of a folder's pairs, by stem."""
    from .png import png_files

    files = png_files(Path(where) / _SUBFOLDERS[kind][0], _SUBFOLDERS[kind][0])
    return [files[s].name for s in stems]


def _stamp(where: Path, subs: tuple[str, ...]) -> tuple:
    """The names, sizes and change times of the files in ``where``'s subfolders ``subs``: a cache key that changes
    when a file is added, removed or rewritten."""
    stamp = []
    for sub in subs:
        folder = where / sub
        if folder.is_dir():
            for entry in sorted(os.scandir(folder), key=lambda e: e.name):
                try:  # the file a link points at (rewritten through the link, it is read afresh)
                    st = entry.stat()
                except OSError:  # a link to nothing: refused when read
                    st = entry.stat(follow_symlinks=False)
                stamp.append((sub, entry.name, st.st_size, st.st_mtime_ns))
    return tuple(stamp)


def _read_folder_once(kind: str, where: str, scale: bool | None):
    base = Path(where)
    if kind == FOLDER_PREFIX:
        return load_mask_folder(base / "images", base / "masks")
    return load_pair_folder(base / "labels", base / "images", scale=scale)


def held_out_twins(names: list[str], digests: list[bytes], where: str | os.PathLike) -> set[str]:
    """``held_out_names`` over the files' contents: files of the same contents (``digests``; a photo saved twice,
    "IMG_1.jpg" and "IMG_1 (1).jpg") go to one split, the one their first name (sorted) is drawn for, so no test
    file is a copy of a training one (one was scored as if unseen). Files without a twin split as
    ``held_out_names`` splits them. A DataError when every file in ``where`` holds the same contents (nothing left to
    test on that was not trained on)."""
    first: dict[bytes, str] = {}
    for name, digest in sorted(zip(names, digests)):
        first.setdefault(digest, name)
    if len(first) < 2:
        raise DataError(f"the {len(names)} files in {where} hold the same contents: a test file must not be a copy of a "
                        f"training one, so at least 2 different ones are needed (add others, or put the test files "
                        f"in a test/ folder)")
    held = held_out_names(sorted(first.values()))
    return {name for name, digest in zip(names, digests) if first[digest] in held}


def held_out_names(names: list[str]) -> set[str]:
    """The pairs of a user's folder held out for testing: each pair by its own name (a hash of ``TEST_SEED`` and the
    name, one in five on average), so adding or removing files never moves another pair between the splits, and a
    run's test pairs stay unseen by it. At least one pair is held out and one kept for training (the lowest and
    highest hashes decide when the rule alone would hold out none or all)."""
    def draw(name: str) -> int:
        return int.from_bytes(hashlib.blake2b(f"{TEST_SEED}:{name}".encode(), digest_size=8).digest(), "big")

    held = {n for n in names if draw(n) % 5 == 0}
    if not held:
        held = {min(names, key=draw)}
    if len(held) == len(names):
        held.discard(max(names, key=draw))
    return held


def _user_split(root: str | os.PathLike, split: str, prefix: str, holding: str, read, classes) -> Dataset:
    """One split of a user's folder of pairs: ``read(folder) -> (first, second, names)``; ``root/test`` holds the
    test pairs when it exists, else about a fifth of the pairs, chosen by name (``held_out_names``), is the test
    split."""
    if split not in ("train", "test"):  # any other word was the training split, named as asked
        raise DataError(f"unknown split {split!r} of {prefix}{root}; valid splits: train, test")
    base = Path(root).expanduser()
    if not base.is_dir():  # no flag named: --dataset to train and eval, --datasets to capsnet experiment
        raise DataError(f"{prefix}{root}: no such folder; give a folder holding {holding} (PNG files of "
                        f"the same names)")
    refuse_test_twin(base, f"pairs ({holding})")
    held_out = (base / "test").is_dir()
    where = base / "test" if held_out and split == "test" else base
    first, second, names = read(where)  # the cache's tensors: every split below is a copy of its own
    files = _file_names(where, prefix, names)  # a Dataset's names are the files' own (reports name real files)
    if held_out:
        return Dataset(f"{prefix}{root}", split, first.clone(), second.clone(), classes, tuple(files))
    n = len(names)
    if n < 2:
        raise DataError(f"{where} holds {n} pair; at least 2 are needed to hold one out for testing (or put test "
                        f"pairs in {base / 'test'})")
    held = held_out_twins(list(names), [_digest(first[k], second[k]) for k in range(n)], where)  # by stem, as ever
    # (a run's split does not move), a pair's copies with it
    keep = torch.tensor([(name in held) == (split == "test") for name in names]).nonzero().flatten()
    return Dataset(f"{prefix}{root}", split, first[keep], second[keep], classes, tuple(files[k] for k in keep.tolist()))


def task_kind(name: str) -> str:
    """``task(name).kind`` without reading a user's folder: folder:DIR is segmentation, pairs:DIR synthesis,
    classes:DIR classification (so a model of the wrong kind is told so before the folder's files are checked)."""
    if name.startswith(FOLDER_PREFIX):
        return "segmentation"
    if name.startswith(PAIRS_PREFIX):
        return "synthesis"
    if name.startswith(CLASSES_PREFIX):
        return "classification"
    return task(name).kind


def task(name: str) -> Task:
    """The task of ``name`` (``folder:DIR`` reads DIR); an unknown name is a ValueError listing the valid ones."""
    if name.startswith(FOLDER_PREFIX):
        return _folder_task(name)
    if name.startswith(PAIRS_PREFIX):
        return _pairs_task(name)
    if name.startswith(CLASSES_PREFIX):
        return _classes_task(name)
    if name not in TASKS:
        raise ValueError(f"unknown dataset {name!r}; valid names are {', '.join(TASKS)}, or {FOLDER_PREFIX}DIR (your "
                         f"own images and masks), or {PAIRS_PREFIX}DIR (your own label maps and images), or "
                         f"{CLASSES_PREFIX}DIR (your own images, a folder per class)")
    return TASKS[name]


def input_shape(name: str) -> tuple[int, int, int]:
    """(C, H, W) of the images a model trained on ``name`` takes."""
    return task(name).input_shape


def _is_whole(value: object) -> bool:
    """Whether ``value`` is an integer (numpy's too), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_whole(name: str, value: object, hint: str = "", low: int = 0) -> None:
    """A ValueError unless ``value`` is an integer (not a bool) of at least ``low``: a size, count or seed (True was
    one example, 2.5 met "slice indices must be integers", -1 took all but one)."""
    if not _is_whole(value) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}{hint}, got {value!r}")


def _check_seed(seed: object) -> None:
    """A ValueError unless ``seed`` is an integer (not a bool) torch's generator takes."""
    if not _is_whole(seed) or not -(1 << 63) <= seed < (1 << 64):
        raise ValueError(f"seed must be an integer, got {seed!r}")


def load_test(name: str, *, size: int = 0, extras: bool = True, root: str | os.PathLike | None = None,
              progress: bool = True) -> Split:
    """The fixed test split of ``name`` on the CPU: its first ``size`` examples (0: all), with its extra sets."""
    _check_whole("size", size, " (0: the whole test split)")  # -1 met torch's arange error, 1.5 gave 2
    check_switch("extras", extras)
    t = task(name)
    return t.held(load_source(t.source, "test", root, progress), size, extras)


def load_training(name: str, *, train_size: int = 0, val_size: int = 0, test_size: int = 0, seed: int = 0,
                  root: str | os.PathLike | None = None, progress: bool = True) -> tuple[Split, Split, str]:
    """The training digits of ``name`` and the split to evaluate on: validation if ``val_size``, else test.

    ``train_size`` keeps a seeded subset (nested across sizes for one seed),
    ``val_size`` examples of it held out: the same ones for every
    ``train_size`` (the first of the seed's order), so the validation set
    does not change with the size and the training examples still nest
    (before 2026-11-29 they were drawn again inside each subset); ``test_size`` keeps the
    first examples of the test split. Returns (train, held, "val" or "test"),
    on the CPU. For the generated tasks the training split holds the 28x28
    source digits (``Task.batch`` places them) and the held split the
    generated images.
    """
    for key, value, hint in (("train_size", train_size, " (0: all)"), ("val_size", val_size, " (0: none)"),
                             ("test_size", test_size, " (0: all)")):
        _check_whole(key, value, hint)
    _check_seed(seed)
    t = task(name)
    train = load_source(t.source, "train", root, progress)
    if train_size > len(train):
        raise ValueError(f"train_size {train_size} exceeds the {len(train)} training examples of {name}; give at "
                         f"most {len(train)}, or 0 for all")
    if train_size and not val_size:
        train = train.subset(nested_subset(len(train), train_size, seed))
    if val_size:  # of the same seeded subset nested_subset draws
        train, val = split_validation(train, val_size, seed=seed, keep=train_size)
    if t.batch is _seg_batch:  # before the held split is drawn: a --train-size of 1 is named before a --val-size
        _check_clutter_pool(len(train), "--train-size")
    if val_size:
        held, held_name = t.held(val, 0, True), "val"
    else:
        held, held_name = load_test(name, size=test_size, root=root, progress=progress), "test"
        check_test_size(test_size, len(held), name)
    return Split(train.images, train.labels, train.classes), held, held_name


def check_test_size(test_size: int, available: int, name: str) -> None:
    """A ValueError when more test examples were asked for than the ``available`` of ``name`` (it scored the fewer
    without a word, where too large a train_size is refused)."""
    if test_size and available < test_size:
        raise ValueError(f"test_size {test_size} exceeds the {available} test examples of {name}; give at most "
                         f"{available}, or 0 for all")


_LOADERS = {"smallnorb": load_smallnorb, "cifar10": load_cifar10, "svhn": load_svhn}  # the rest: load_dataset


def load_source(source: str, split: str, root: str | os.PathLike | None, progress: bool) -> Dataset:
    """One split of a task's plain source (``Task.source``): a registered image set, or a user's folder of images
    and masks (``folder:DIR``) or of label maps and images (``pairs:DIR``), as read from disk."""
    if source.startswith(FOLDER_PREFIX):
        return load_folder(source[len(FOLDER_PREFIX):], split)
    if source.startswith(PAIRS_PREFIX):
        return load_pairs(source[len(PAIRS_PREFIX):], split)
    if source.startswith(CLASSES_PREFIX):
        return load_classes(source[len(CLASSES_PREFIX):], split)
    if source in _LOADERS:
        return _LOADERS[source](split, root=root, progress=progress)
    return load_dataset(source, split, root=root, progress=progress)


def nested_subset(n: int, size: int, seed: int) -> torch.Tensor:
    """Indices of a seeded random subset of ``size`` of ``n`` examples; for one seed, smaller subsets nest in larger.

    The first ``size`` entries of ``torch.randperm(n)`` under ``seed`` (torch's
    CPU generator, so the same on every machine).
    """
    _check_seed(seed)  # 1.5 met "manual_seed expected a long"
    if not _is_whole(size) or not 0 < size <= n:
        raise ValueError(f"subset size must be in 1..{n} (an integer), got {size!r}")  # 2.5 met "slice indices must
        # be integers"
    return torch.randperm(n, generator=torch.Generator().manual_seed(int(seed)))[:int(size)]


def multimnist_test(images: torch.Tensor, labels: torch.Tensor, n: int, *, seed: int = TEST_SEED) -> MultiMNISTBatch:
    """The fixed MultiMNIST test set: the first ``n`` of ``TEST_PAIRS`` pairs of test digits drawn under ``seed``.

    The draw is always of ``max(n, TEST_PAIRS)`` pairs, so a smaller test set
    (``--test-size``, the pairs a figure shows) is a prefix of the full one;
    only the first ``n`` are drawn as images.
    """
    if images.dim() != 4 or labels.shape != images.shape[:1]:
        raise ValueError(f"need images (N, C, H, W) and labels (N,), got {tuple(images.shape)} and {tuple(labels.shape)}")
    _check_whole("n", n, " (the number of pairs)", low=1)  # -1 drew all pairs but one
    g = torch.Generator().manual_seed(seed)
    sources, shifts = draw_pairs(labels, max(n, TEST_PAIRS), generator=g, max_shift=MULTIMNIST_SHIFT)
    return render_pairs(images, labels, sources[:n], shifts[:n], max_shift=MULTIMNIST_SHIFT)


def translated_test(images: torch.Tensor, *, seed: int = TEST_SEED) -> torch.Tensor:
    """The translated test set, placed as in training: each 28x28 frame at a uniformly random offset of 0..12
    pixels per axis on 40x40 (+-6 about the centre), fixed by ``seed``: (N, C, 40, 40) float in [0, 1]."""
    return random_translate(images, TRANSLATED_SIZE, generator=torch.Generator().manual_seed(seed))[0]


def affine_test(images: torch.Tensor, *, seed: int = TEST_SEED, batch_size: int = 2000,
                first: int | None = None) -> torch.Tensor:
    """The affNIST-like test set: each digit affinely transformed within affNIST's ranges, its ink box placed
    uniformly anywhere wholly inside 40x40 (``random_affine`` with ``max_shift=None``).

    Drawn in batches (to bound memory) from one generator, so the result
    depends only on ``seed`` (and the number of images: the first 1,000 of a
    10,000-digit set are not the 1,000-digit set). ``first=n`` returns the
    first n images of the set made from all of ``images``, drawing only the
    batches that hold them (a batch's draws never depend on the ones after
    it). Shapes: images (N, C, 28, 28) -> (min(N, first), C, 40, 40) float in
    [0, 1].
    """
    return _affine_batches(images, seed, batch_size, first)


def affine_centred_test(images: torch.Tensor, *, seed: int = TEST_SEED, batch_size: int = 2000,
                        first: int | None = None) -> torch.Tensor:
    """The affine test set placed within the training range: the same transforms as ``affine_test`` (same seed),
    each ink box centred in 40x40 and then shifted by up to ``TRANSLATED_SHIFT`` pixels per axis, never onto the
    border (``random_affine`` with ``max_shift=6``). ``first`` and shapes as ``affine_test``.
    """
    return _affine_batches(images, seed, batch_size, first, max_shift=TRANSLATED_SHIFT)


def translated_anywhere_test(images: torch.Tensor, *, seed: int = TEST_SEED, batch_size: int = 2000,
                             first: int | None = None) -> torch.Tensor:
    """The untransformed test digits placed by the affNIST-like rule: each ink box uniformly anywhere wholly inside
    40x40, with the same placement draws as ``affine_test`` (same seed). ``first`` and shapes as ``affine_test``.
    """
    return _affine_batches(images, seed, batch_size, first, rotation_deg=0.0, shear=0.0, scale=(1.0, 1.0))


def _affine_batches(images: torch.Tensor, seed: int, batch_size: int, first: int | None, **rule) -> torch.Tensor:
    _check_whole("batch_size", batch_size, low=1)  # 0 met "range() arg 3 must not be zero"
    if first is not None and first < 1:
        raise ValueError(f"first must be a positive number of images, got {first}")
    g = torch.Generator().manual_seed(seed)
    stop = len(images) if first is None else min(len(images), first)
    parts = [random_affine(images[s:s + batch_size], TRANSLATED_SIZE, generator=g, **rule)[0]
             for s in range(0, stop, batch_size)]  # the batches that hold the first `stop`, each its whole draw
    if not parts:
        raise ValueError("no images given")
    return torch.cat(parts)[:stop]
