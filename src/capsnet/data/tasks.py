"""The paper's experiment data sets, built from MNIST: MultiMNIST and translated MNIST.

- ``multimnist`` (section 6): 36x36 pairs of overlapping digits of different
  classes. Training pairs are drawn on the fly from the training digits, a new
  draw every batch from the epoch's seeded generator; the test set is one draw
  of ``test_size`` pairs (10,000 by default) from the test digits under the
  fixed seed ``TEST_SEED``, the same for every run and model.
- ``translated-mnist`` (section 5.2): training digits at a uniformly random
  position on a 40x40 black canvas, a new position every time; two fixed test
  sets from the MNIST test digits: the same translation (``test``) and the
  affNIST-like affine set (``affine``, see ``capsnet.data.affine``), each
  drawn under ``TEST_SEED``.

``nested_subset`` gives the "learning from less data" training subsets: the
first ``size`` indices of one seeded permutation, so for one seed the subsets
of 500, 1,000, 5,000, 10,000 and 60,000 examples are nested.
"""
from __future__ import annotations

import torch

from .affine import random_affine, random_translate
from .multimnist import MultiMNISTBatch, draw_pairs, render_pairs

__all__ = ["TASKS", "TEST_SEED", "TEST_PAIRS", "MULTIMNIST_SHIFT", "TRANSLATED_SIZE", "input_shape", "nested_subset",
           "multimnist_test", "translated_test", "affine_test"]

TASKS = ("multimnist", "translated-mnist")
TEST_SEED = 2017  # fixes every generated test set: all runs and both models see the same images
TEST_PAIRS = 10000  # the MultiMNIST test set: pairs drawn from the 10,000 MNIST test digits
MULTIMNIST_SHIFT = 4  # section 6: "each digit is shifted up to 4 pixels in each direction" (36x36)
TRANSLATED_SIZE = 40  # section 5.2: "placed randomly on a black background of 40x40 pixels"


def input_shape(dataset: str) -> tuple[int, int, int]:
    """(C, H, W) of the images a model trained on ``dataset`` takes."""
    if dataset == "multimnist":
        side = 28 + 2 * MULTIMNIST_SHIFT
        return (1, side, side)
    if dataset == "translated-mnist":
        return (1, TRANSLATED_SIZE, TRANSLATED_SIZE)
    return (1, 28, 28)


def nested_subset(n: int, size: int, seed: int) -> torch.Tensor:
    """Indices of a seeded random subset of ``size`` of ``n`` examples; for one seed, smaller subsets nest in larger.

    The first ``size`` entries of ``torch.randperm(n)`` under ``seed`` (torch's
    CPU generator, so the same on every machine).
    """
    if not 0 < size <= n:
        raise ValueError(f"subset size must be in 1..{n}, got {size}")
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:size]


def multimnist_test(images: torch.Tensor, labels: torch.Tensor, n: int, *, seed: int = TEST_SEED) -> MultiMNISTBatch:
    """The fixed MultiMNIST test set: the first ``n`` of ``TEST_PAIRS`` pairs of test digits drawn under ``seed``.

    The draw is always of ``max(n, TEST_PAIRS)`` pairs, so a smaller test set
    (``--test-size``, the pairs a figure shows) is a prefix of the full one;
    only the first ``n`` are drawn as images.
    """
    if images.dim() != 4 or labels.shape != images.shape[:1]:
        raise ValueError(f"need images (N, C, H, W) and labels (N,), got {tuple(images.shape)} and {tuple(labels.shape)}")
    g = torch.Generator().manual_seed(seed)
    sources, shifts = draw_pairs(labels, max(n, TEST_PAIRS), generator=g, max_shift=MULTIMNIST_SHIFT)
    return render_pairs(images, labels, sources[:n], shifts[:n], max_shift=MULTIMNIST_SHIFT)


def translated_test(images: torch.Tensor, *, seed: int = TEST_SEED) -> torch.Tensor:
    """Each digit at a random position on a 40x40 canvas, fixed by ``seed``: (N, C, 40, 40) float in [0, 1]."""
    return random_translate(images, TRANSLATED_SIZE, generator=torch.Generator().manual_seed(seed))[0]


def affine_test(images: torch.Tensor, *, seed: int = TEST_SEED, batch_size: int = 2000) -> torch.Tensor:
    """The affNIST-like test set: each digit affinely transformed within affNIST's ranges and placed inside 40x40.

    Drawn in batches (to bound memory) from one generator, so the result
    depends only on ``seed``. Shapes: images (N, C, 28, 28) -> (N, C, 40, 40) float in [0, 1].
    """
    g = torch.Generator().manual_seed(seed)
    parts = [random_affine(images[s:s + batch_size], TRANSLATED_SIZE, generator=g)[0]
             for s in range(0, len(images), batch_size)]
    if not parts:
        raise ValueError("no images given")
    return torch.cat(parts)
