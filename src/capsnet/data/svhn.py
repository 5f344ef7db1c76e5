"""SVHN (Netzer et al. 2011): house-number digits from Street View, the cropped-digit files ("format 2").

http://ufldl.stanford.edu/housenumbers/ publishes ``train_32x32.mat``
(73,257 digits), ``test_32x32.mat`` (26,032) and ``extra_32x32.mat``
(531,131 easier digits), MATLAB v5 files each holding two variables:
``X``, uint8 32x32x3xN (row, column, RGB channel, digit), and ``y``, Nx1,
the digit with 10 standing for 0. The site publishes no checksums; the MD5s
below are the ones torchvision checks the same files against.

Files live raw under ``<root>/svhn/``; each is checked by its MD5 before it
is read (``read_mat``, the MATLAB v5 reader of ``affnist.py``, with its
decompression bounded by the split's size) and downloaded like MNIST when
missing, only into the user cache unless ``download=True``. Labels come out
0..9 (10 -> 0) and images (N, 3, 32, 32), channels first.
"""
from __future__ import annotations

import logging
import os
from typing import NamedTuple, Sequence

import numpy as np
import torch

from .affnist import read_mat
from .download import download_file, file_md5, mirror_list
from .idx import DataError
from .sets import Dataset, download_hint, resolve_root

__all__ = ["SVHN_CLASSES", "SVHN_MIRRORS", "SVHN_FILES", "load_svhn"]

log = logging.getLogger(__name__)

SVHN_CLASSES = tuple(str(d) for d in range(10))
SVHN_MIRRORS = ("http://ufldl.stanford.edu/housenumbers/",)
SIDE, CHANNELS = 32, 3


class _SvhnFile(NamedTuple):
    name: str
    md5: str  # of the .mat file (torchvision's SVHN table)
    size: int  # digits it holds

    @property
    def max_bytes(self) -> int:
        """No file of this split is larger, nor decompresses to more: the pixels, labels as doubles and headers."""
        return self.size * (CHANNELS * SIDE * SIDE + 8) + (1 << 16)


SVHN_FILES = {
    "train": _SvhnFile("train_32x32.mat", "e26dedcc434d2e4c54c9b2d4a06d8373", 73257),
    "test": _SvhnFile("test_32x32.mat", "eb5a983be6a315427106f1b164d9cef3", 26032),
    "extra": _SvhnFile("extra_32x32.mat", "a93ce644f1a588dc4d68dda5feec44a7", 531131),
}


_md5 = file_md5  # the file's MD5 as it lies on disk (capsnet.data.download)


def load_svhn(split: str = "train", *, root: str | os.PathLike | None = None, download: bool | None = None,
              progress: bool = True, mirrors: Sequence[str] | None = None, check: bool = True) -> Dataset:
    """A split of SVHN's cropped digits: images (N, 3, 32, 32) uint8 RGB, labels (N,) int64 in 0..9.

    Args:
        split: "train", "test" or "extra".
        root: folder holding ``svhn/`` (default as for MNIST: ``--data-dir``,
            ``$CAPSNET_DATA``, else the user cache).
        download: fetch the file when missing; None downloads only into the user cache.
        progress: a progress bar while downloading.
        mirrors: base URLs to try instead of ``SVHN_MIRRORS``.
        check: compare the file's MD5 with the known one before reading it.
    """
    if split not in SVHN_FILES:
        raise DataError(f"unknown split {split!r} of svhn; valid splits: {', '.join(SVHN_FILES)}")
    f = SVHN_FILES[split]
    base, source = resolve_root(root)
    folder = base / "svhn"
    path = folder / f.name
    if not path.is_file():
        if not (download if download is not None else source == "cache"):
            raise DataError(f"svhn {split} file {f.name} not found in {folder} (root from {source}). Download "
                            f"{SVHN_MIRRORS[0]}{f.name} into that folder, point --data-dir or CAPSNET_DATA at a folder "
                            f"holding svhn/" + download_hint(source, base))
        log.info("downloading svhn %s to %s", f.name, folder)
        download_file([u + f.name for u in mirror_list(mirrors, SVHN_MIRRORS)], path, md5=f.md5 if check else None,
                      progress=progress, max_size=f.max_bytes)
    elif check and (digest := _md5(path)) != f.md5:  # (a checked download was hashed as it came)
        raise DataError(f"{path}: MD5 is {digest}, expected {f.md5} for SVHN's {f.name} (cropped digits). The file "
                        f"may be corrupt, truncated or another SVHN file; delete it and download it again from "
                        f"{SVHN_MIRRORS[0]}{f.name}")
    if path.stat().st_size > f.max_bytes:  # only unchecked files get here with a wrong size
        raise DataError(f"{path}: {path.stat().st_size:,} bytes, more than SVHN's {f.name} can hold")
    variables = read_mat(path, max_size=f.max_bytes)
    X, y = variables.get("X"), variables.get("y")
    if not isinstance(X, np.ndarray) or not isinstance(y, np.ndarray):
        raise DataError(f"{path} holds {sorted(variables)}, not SVHN's X and y; is it a cropped-digit file "
                        f"({', '.join(s.name for s in SVHN_FILES.values())})?")
    if X.dtype != np.uint8 or X.ndim != 4 or X.shape[:3] != (SIDE, SIDE, CHANNELS):
        raise DataError(f"{path}: X should be uint8 32x32x3xN (row, column, channel, digit), got {X.dtype} "
                        f"{'x'.join(map(str, X.shape))}")
    n = X.shape[3]
    labels = y.reshape(-1)
    if labels.shape != (n,) or min(y.shape, default=0) > 1:
        raise DataError(f"{path}: y should be {n}x1, one label per digit of X, got {'x'.join(map(str, y.shape))}")
    if n and (not np.array_equal(labels, np.round(labels)) or labels.min() < 1 or labels.max() > 10):
        raise DataError(f"{path}: SVHN's labels are the whole numbers 1..10 (10 for the digit 0), got "
                        f"{labels.min()}..{labels.max()}")
    labels = labels.astype(np.int64) % 10  # 10 -> 0
    images = np.ascontiguousarray(X.transpose(3, 2, 0, 1))  # (N, C, H, W): X[r, c, ch, k] -> images[k, ch, r, c]
    return Dataset("svhn", split, torch.from_numpy(images), torch.from_numpy(labels), SVHN_CLASSES)
