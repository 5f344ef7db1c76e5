"""MNIST, Fashion-MNIST and a small MNIST sample, loaded as checked tensors.

Data root: the ``root`` argument, else the ``CAPSNET_DATA`` environment
variable, else the user cache (``$XDG_CACHE_HOME/capsnet`` or
``~/.cache/capsnet``). A root holds one folder per set, named as in
``DATASETS`` (``mnist/``, ``fashion-mnist/``), each with the four original
IDX files, gzip or raw, so ``CAPSNET_DATA=../shared/data`` just works.

Every file is checked against the MD5 of its *uncompressed* contents (the
published ones, as torchvision checks them), so re-compressed or gunzipped
copies pass and a corrupt or misplaced file is refused by name. A process keeps
the last few files it read and checked (``_KEPT_FILES``, about 110 MB for
both sets' four files; ``clear_data_cache`` lets go of them): loading a split again, as the experiments and a
run's evaluation do, copies them instead of decompressing and checking the
file again; a file replaced or touched since is read and checked anew. Missing files
are downloaded only into the user cache, or anywhere when ``download=True``:
a folder you named is never written behind your back.

``mnist-sample`` is real MNIST, shipped in the package (mnist_sample/) so
examples and tests run offline: 2,000 training digits (the first 200 of each
class in the MNIST training file) and 500 test digits (the first 50 of each
class in the test file), both in file order. tools/make_mnist_sample.py
rebuilds them from the real files; their MD5s are recorded below.
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import numbers
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from .download import DiskError, download_file, mirror_list
from .idx import DataError, decode_idx, read_idx_bytes

__all__ = [
    "DATASETS", "MIRRORS", "SAMPLE_DIR", "Dataset", "DataError",
    "load_dataset", "resolve_root", "split_size", "split_validation", "clear_data_cache",
]

log = logging.getLogger(__name__)

DATASETS = ("mnist", "fashion-mnist", "mnist-sample")
SPLITS = ("train", "test")
SAMPLE_DIR = Path(__file__).parent / "mnist_sample"

# Base URLs tried in turn; each + file name + ".gz" is a download. A test or a
# user behind a proxy can replace them here or with load_dataset(mirrors=...).
MIRRORS: dict[str, tuple[str, ...]] = {
    "mnist": (
        "https://ossci-datasets.s3.amazonaws.com/mnist/",
        "https://storage.googleapis.com/cvdf-datasets/mnist/",
        "http://yann.lecun.com/exdb/mnist/",
    ),
    "fashion-mnist": ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",),
}



def unit_float(images: torch.Tensor) -> torch.Tensor:
    """Images as float32 pixels in [0, 1]: uint8 ones (0..255, as the data sets hold them) divided by 255, float ones
    (already in [0, 1]) as they are, in float32. Any shape, on the images' device. Other integer dtypes (16-bit
    images, bool masks) are a ValueError: divided by 255 they would leave [0, 1] or come out near 0."""
    if images.is_floating_point():
        return images.float()
    if images.dtype != torch.uint8:
        raise ValueError(f"images are {images.dtype}; unit_float takes 0-255 bytes (uint8) or floats in [0, 1]: "
                         f"scale them to [0, 1] yourself (16-bit images: / 65535) and pass floats")
    return images.float() / 255.0


def shown_range(image: torch.Tensor) -> tuple[float, float]:
    """The range an image is shown in: (0, 1), or its own (minimum, maximum) where its values leave [0, 1] (inputs
    standardised per image, CIFAR-10's and smallNORB's: clamped to [0, 1], everything below the mean was black).
    The figures and the viewer show inputs by it."""
    lo, hi = float(image.min()), float(image.max())
    return (0.0, 1.0) if lo >= -1e-6 and hi <= 1 + 1e-6 else (lo, hi)

class _File(NamedTuple):
    name: str  # uncompressed file name; ".gz" is appended for the compressed copy
    md5: str  # of the uncompressed contents
    md5_gz: str | None  # of the original .gz download (documentation; mirrors may re-compress)


class _Spec(NamedTuple):
    classes: tuple[str, ...]
    sizes: dict[str, int]  # examples per split
    files: dict[str, tuple[_File, _File]]  # split -> (images, labels)


_SPECS: dict[str, _Spec] = {
    "mnist": _Spec(
        classes=tuple(str(d) for d in range(10)),
        sizes={"train": 60000, "test": 10000},
        files={
            "train": (
                _File("train-images-idx3-ubyte", "6bbc9ace898e44ae57da46a324031adb",
                      "f68b3c2dcbeaaa9fbdd348bbdeb94873"),
                _File("train-labels-idx1-ubyte", "a25bea736e30d166cdddb491f175f624",
                      "d53e105ee54ea40749a09fcbcd1e9432"),
            ),
            "test": (
                _File("t10k-images-idx3-ubyte", "2646ac647ad5339dbf082846283269ea",
                      "9fb629c4189551a2d022fa330f9573f3"),
                _File("t10k-labels-idx1-ubyte", "27ae3e4e09519cfbb04c329615203637",
                      "ec29112dd5afa0611ce80d1b7f02629c"),
            ),
        },
    ),
    "fashion-mnist": _Spec(
        # Xiao, Rasul and Vollgraf (2017), label order of the published files.
        classes=("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                 "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"),
        sizes={"train": 60000, "test": 10000},
        files={
            "train": (
                _File("train-images-idx3-ubyte", "f4a8712d7a061bf5bd6d2ca38dc4d50a",
                      "8d4fb7e6c68d591d4c3dfef9ec88bf0d"),
                _File("train-labels-idx1-ubyte", "9018921c3c673c538a1fc5bad174d6f9",
                      "25c81989df183df01b3e8a0aad5dffbe"),
            ),
            "test": (
                _File("t10k-images-idx3-ubyte", "8181f5470baa50b63fa0f6fddb340f0a",
                      "bef4ecab320f06d8554ea6380940ec79"),
                _File("t10k-labels-idx1-ubyte", "15d484375f8d13e6eb1aabb0c3f46965",
                      "bb300cfdad3c16e7a12a480ee83cd310"),
            ),
        },
    ),
    "mnist-sample": _Spec(
        classes=tuple(str(d) for d in range(10)),
        sizes={"train": 2000, "test": 500},
        # Written by tools/make_mnist_sample.py; run it with --check to compare.
        files={
            "train": (
                _File("train-images-idx3-ubyte", "e759270be404d65c8a350c511678e2ff", None),
                _File("train-labels-idx1-ubyte", "f325a241096e0338fdbd46ea1d7484c3", None),
            ),
            "test": (
                _File("t10k-images-idx3-ubyte", "cfa327d4f42f67ae8d1dde8aa9efe454", None),
                _File("t10k-labels-idx1-ubyte", "6a460557ed80a21701d8ee2b07271948", None),
            ),
        },
    ),
}

# The largest uncompressed file of any set above (60,000 images of 28x28 and the 16-byte header).
# read_idx_bytes reads no further than the size a file's IDX header declares, and refuses a header
# declaring more than this: a gzip bomb under a known name costs at most this much memory. Not the
# size of the one file asked for, so that a file of another set or split is still read whole and
# recognised by its MD5 ("the fashion-mnist files were put in the mnist/ folder", "renamed").
_MAX_FILE_BYTES = max(16 + n * 28 * 28 for spec in _SPECS.values() for n in spec.sizes.values())

# MD5 -> (set, file), to recognise a file that belongs somewhere else.
_KNOWN_MD5: dict[str, tuple[str, str]] = {
    f.md5: (set_name, f.name)
    for set_name, spec in _SPECS.items()
    for pair in spec.files.values()
    for f in pair
}


@dataclass(frozen=True, eq=False, repr=False)
class Dataset:
    """A labelled image set held as two tensors, batched by indexing.

    Shapes:
        images: (N, 1, H, W) uint8, 0..255 (H = W = 28 for the sets here)
        labels: (N,) int64, indices into ``classes``; or masks (N, 1, H, W) uint8 0/1 (a segmentation set)
    """

    name: str
    split: str
    images: torch.Tensor  # (N, 1, 28, 28) uint8
    labels: torch.Tensor  # (N,) int64
    classes: tuple[str, ...]
    names: tuple[str, ...] | None = None  # a user's folder: each example's file stem; None for the sets here

    def __post_init__(self) -> None:
        for what, t in (("images", self.images), ("labels", self.labels)):
            if not isinstance(t, torch.Tensor):  # a numpy array met "'numpy.ndarray' object has no attribute 'dim'"
                raise TypeError(f"{what} must be a torch.Tensor, got {type(t).__name__}: torch.from_numpy({what}) "
                                f"converts an array")
        if self.names is not None and len(self.names) != self.images.shape[0]:
            raise ValueError(f"{len(self.names)} names for {self.images.shape[0]} images")
        if self.images.dim() != 4:
            raise ValueError(f"images must be (N, C, H, W), got shape {tuple(self.images.shape)}")
        N, _, H, W = self.images.shape
        if self.labels.shape[:1] != self.images.shape[:1] or (self.labels.dim() > 1 and (
                self.labels.dim() != 4 or tuple(self.labels.shape[2:]) != (H, W))):
            raise ValueError(f"labels must be ({N},), or masks ({N}, 1, {H}, {W}), to match the images, got shape "
                             f"{tuple(self.labels.shape)}")
        if self.labels.dim() == 1:
            self._check_classes()

    def _check_classes(self) -> None:
        """Class labels: integers indexing ``classes`` (2.5 and True were taken, and labels past the classes)."""
        labels, K = self.labels, len(self.classes)
        if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
            raise ValueError(f"labels must be integer class indices, got {labels.dtype}")
        if isinstance(self.classes, str):  # "abcd" read as four classes named by its letters
            raise ValueError(f"classes must be a tuple of class names, got the string {self.classes!r}")
        if K and labels.numel() and labels.device.type == "cpu" and not 0 <= int(labels.min()) <= int(labels.max()) < K:
            raise ValueError(f"labels must index the {K} classes (0..{K - 1}), got values from {int(labels.min())} to "
                             f"{int(labels.max())}")

    def __len__(self) -> int:
        return self.labels.shape[0]

    def __repr__(self) -> str:
        return (f"Dataset(name={self.name!r}, split={self.split!r}, n={len(self)}, "
                f"images={tuple(self.images.shape)} {self.images.dtype}, "
                f"classes={len(self.classes)})")

    def subset(self, indices: Sequence[int] | np.ndarray | torch.Tensor) -> Dataset:
        """The examples at ``indices`` (integers, or a boolean mask of length N), in that order."""
        index = torch.as_tensor(indices)
        if index.dtype == torch.bool:
            if tuple(index.shape) != (len(self),):  # a mask of 2 for 4 examples picked from the first 2
                raise ValueError(f"a boolean mask must have one entry per example, shape ({len(self)},), got shape "
                                 f"{tuple(index.shape)}")
            index = index.nonzero().flatten()
        elif index.is_floating_point() or index.is_complex():  # 1.7 was example 1, silently
            raise ValueError(f"indices must be integers (or a boolean mask), got {index.dtype}")
        index = index.to(device=self.labels.device, dtype=torch.long)
        names = None if self.names is None else tuple(self.names[k] for k in index.tolist())
        return dataclasses.replace(self, images=self.images[index], labels=self.labels[index], names=names)


def resolve_root(root: str | os.PathLike | None = None) -> tuple[Path, str]:
    """The data root and where it came from: "argument", "CAPSNET_DATA" or "cache"; a root that is a file is a
    DataError (every set's "not found in FILE/NAME" named the wrong problem)."""
    if root is not None:
        base, source = Path(root).expanduser(), "argument"
    elif env := os.environ.get("CAPSNET_DATA"):
        base, source = Path(env).expanduser(), "CAPSNET_DATA"
    else:
        base, source = cache_root(), "cache"
    if base.is_file():
        raise DataError(f"the data folder {base} (root from {source}) is a file, not a folder; give the folder that "
                        f"holds the data sets (--data-dir or CAPSNET_DATA)")
    return base, source


def class_names(name: str) -> tuple[str, ...] | None:
    """The class names of one of ``DATASETS`` (None for any other name), without loading it."""
    return _SPECS[name].classes if name in _SPECS else None


def split_size(name: str, split: str) -> int:
    """How many examples split ``split`` ("train" or "test") of ``name``, one of ``DATASETS``, holds, without
    loading it."""
    if name not in _SPECS or split not in _SPECS[name].sizes:
        raise ValueError(f"no split {split!r} of {name!r} known here; data sets: {', '.join(_SPECS)}, splits: train, "
                         f"test")
    return _SPECS[name].sizes[split]


def _fetch_by_hand(name: str, files: Sequence[_File], folder: Path, mirrors: Sequence[str] | None) -> str:
    """Where each of ``files`` of set ``name`` is downloaded from (the first mirror) and put."""
    url = mirror_list(mirrors, MIRRORS[name])[0]
    return "; ".join(f"{url}{f.name}.gz into {folder}" for f in files)


def download_hint(source: str, base: Path) -> str:
    """The end of a "not found" message: how to have capsnet download a set, for a data root from ``source``
    (``resolve_root``: --data-dir / CAPSNET_DATA, or the user cache) at ``base``; the CLI has no download flag."""
    if source == "cache":  # only where download=False was passed (from Python)
        return ", or allow the download (download=True)"
    try:
        cache = str(cache_root())
    except DataError:  # no home folder: the hint names the usual place
        cache = "~/.cache/capsnet"
    return (f", or leave --data-dir and CAPSNET_DATA unset to download them into {cache} (from Python: "
            f"download=True fetches them into {base})")


def cache_root() -> Path:
    """The user cache the loaders download into when neither a root nor CAPSNET_DATA is given: $XDG_CACHE_HOME/capsnet
    (an absolute one: the XDG spec has a relative value ignored, which made folders in the working folder), else
    ~/.cache/capsnet; a DataError where there is no home folder to find (HOME unset, a user id without an entry
    in the password file: an arbitrary-uid container)."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(os.path.expanduser(xdg)):
        return Path(xdg).expanduser() / "capsnet"
    try:
        return Path.home() / ".cache" / "capsnet"
    except (RuntimeError, KeyError):
        raise DataError("there is no home folder to keep data sets in (HOME is unset and this user has none): set "
                        "CAPSNET_DATA or --data-dir to a folder of data sets, or HOME or XDG_CACHE_HOME to a folder "
                        "to download them into") from None


def load_dataset(
    name: str,
    split: str = "train",
    *,
    root: str | os.PathLike | None = None,
    download: bool | None = None,
    progress: bool = True,
    mirrors: Sequence[str] | None = None,
) -> Dataset:
    """Load a split of one of ``DATASETS``, checked against its published MD5s.

    Args:
        name: "mnist", "fashion-mnist" or "mnist-sample" (shipped, offline;
            ``root``, ``download`` and ``mirrors`` do not apply to it).
        split: "train" or "test".
        root: folder holding ``<name>/``; see the module docstring for the
            default.
        download: fetch missing files. None (default) downloads only into the
            user cache; True also into a root you named; False never.
        progress: tqdm progress bars on stderr while downloading.
        mirrors: base URLs to try instead of ``MIRRORS[name]``.

    Shapes:
        returns images (N, 1, 28, 28) uint8 and labels (N,) int64.
    """
    if name not in _SPECS:
        raise DataError(f"unknown data set {name!r}; valid names: {', '.join(DATASETS)}")
    if split not in SPLITS:
        raise DataError(f"unknown split {split!r} of {name}; valid splits: {', '.join(SPLITS)}")
    if download is not None and not isinstance(download, bool):  # "no" downloaded, as a true value
        raise ValueError(f"download must be True, False or None (download only into the user cache), got {download!r}")
    spec = _SPECS[name]
    image_file, label_file = spec.files[split]

    if name == "mnist-sample":
        folder = SAMPLE_DIR
    else:
        base, source = resolve_root(root)
        folder = base / name
        missing = [f for f in (image_file, label_file) if _find(folder, f) is None]
        if missing:
            if download is None:
                download = source == "cache"
            if not download:
                names = " and ".join(f.name for f in missing)
                offline = {"mnist": " Offline: mnist-sample holds MNIST digits that ship with capsnet (the "
                                    "command line's tasks mnist-sample-segmentation and mnist-sample-skeleton are "
                                    "made from them).",
                           "fashion-mnist": " No Fashion-MNIST items ship with capsnet."}.get(name, "")
                fetch = download_hint(source, base)
                inside = all(_find(base, f) is not None for f in missing)  # the set's own folder was given
                hint = (f" {base} itself holds them: give its parent, {base.parent}, which holds {name}/." if inside
                        else "")
                raise DataError(
                    f"{name} {split} file(s) {names} not found in {folder} (root from {source}; "
                    f"looked for each raw and with .gz).{hint} Put the IDX files there (gzip or raw: "
                    f"{_fetch_by_hand(name, missing, folder, mirrors)}), "
                    f"point --data-dir or CAPSNET_DATA at a folder holding {name}/{fetch}.{offline}"
                )
            urls = mirror_list(mirrors, MIRRORS[name])
            for f in missing:
                log.info("downloading %s %s to %s", name, f.name, folder)
                try:
                    download_file([base_url + f.name + ".gz" for base_url in urls],
                                  folder / (f.name + ".gz"), md5_uncompressed=f.md5,
                                  progress=progress, max_size=_MAX_FILE_BYTES)
                except DataError as e:  # the first file alone was named: fetched by hand, the next failed the same
                    rest = [g for pair in _SPECS[name].files.values() for g in pair  # way, one run at a time
                            if g is not f and _find(folder, g) is None]
                    if not rest or isinstance(e, DiskError):  # (a folder that cannot take them: not the same way)
                        raise
                    raise DataError(f"{e}\nThe set's other missing files, to fetch the same way: "
                                    f"{_fetch_by_hand(name, rest, folder, mirrors)}") from None

    images = _read_checked(folder, image_file, name)
    labels = _read_checked(folder, label_file, name)
    n = spec.sizes[split]
    image_path, label_path = _find(folder, image_file), _find(folder, label_file)
    # The MD5s already pin the contents; these checks guard the tables above
    # and say what is wrong in words if an entry there is ever mistyped.
    if images.dtype != np.uint8 or images.shape != (n, 28, 28):
        raise DataError(f"{image_path}: expected ({n}, 28, 28) uint8 images, "
                        f"got {images.shape} {images.dtype}")
    if labels.dtype != np.uint8 or labels.shape != (n,):
        raise DataError(f"{label_path}: expected ({n},) uint8 labels, "
                        f"got {labels.shape} {labels.dtype}")
    if labels.max() >= len(spec.classes):
        raise DataError(f"{label_path}: label {labels.max()} is outside 0..{len(spec.classes) - 1}")

    return Dataset(
        name=name,
        split=split,
        images=torch.from_numpy(images).unsqueeze(1),  # (N, 1, 28, 28)
        labels=torch.from_numpy(labels).to(torch.int64),  # (N,)
        classes=spec.classes,
    )


def split_validation(dataset: Dataset, n_val: int, *, seed: int, keep: int = 0) -> tuple[Dataset, Dataset]:
    """Hold out ``n_val`` random examples: returns (train, val), disjoint.

    The same seed gives the same split on every machine (torch's CPU
    generator). Both parts keep the original order; the held-out part has
    split "val". ``keep``: of a seeded subset of ``keep`` examples (the
    first ``keep`` of the seed's permutation, as ``tasks.nested_subset``
    draws it), the validation examples are the same whatever ``keep`` is,
    and the training examples nest across sizes (0: every example).
    """
    for name, value in (("n_val", n_val), ("seed", seed), ("keep", keep)):
        if not isinstance(value, numbers.Integral) or isinstance(value, bool):
            raise TypeError(f"split_validation's {name} must be an int, got {value!r}")
    n_val, seed, keep = int(n_val), int(seed), int(keep)  # numpy's integers too (torch's seed takes Python's alone)
    if not 0 <= keep <= len(dataset):
        raise ValueError(f"keep must be in 0..{len(dataset)} (0: every example of the {len(dataset)}), got {keep}")
    n = keep or len(dataset)
    if not 0 <= n_val < n:
        raise ValueError(f"the validation size (--val-size) must be in 0..{n - 1}, leaving at least one of the {n} "
                         f"training examples to train on; got {n_val}")
    perm = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))
    val_idx, _ = perm[:n_val].sort()
    train_idx, _ = perm[n_val:n].sort()
    val = dataclasses.replace(dataset.subset(val_idx), split="val")
    return dataset.subset(train_idx), val


def _find(folder: Path, f: _File) -> Path | None:
    """The file as stored: raw name first, then .gz; None if neither exists."""
    for candidate in (folder / f.name, folder / (f.name + ".gz")):
        if candidate.is_file():
            return candidate
    return None


# Files read and checked in this process, by the file's identity as stored (path, device, inode, size and change
# time: a file replaced, rewritten or touched is another key) and the MD5 it was checked against; the newest last
_KEPT_FILES = 8
_kept: OrderedDict[tuple, np.ndarray] = OrderedDict()
_kept_lock = threading.Lock()


_OTHER_CACHES: list[Callable[[], int]] = []  # what capsnet.data.tasks keeps of a user's folders: each clears its own,
# saying how many folders it held (registered there: tasks imports this module)


def clear_data_cache() -> int:
    """Let go of the data this process keeps: the data files read and checked once (about 110 MB for MNIST and
    Fashion-MNIST) and the user folders read once (classes:DIR, folder:DIR, pairs:DIR: up to gigabytes for a folder
    of large images); the next load reads and checks them again. Returns how many reads it let go of (a data file
    each; a folder's splits, kept apart, each their own)."""
    with _kept_lock:
        n = len(_kept)
        _kept.clear()
    return n + sum(clear() for clear in _OTHER_CACHES)


def _read_checked(folder: Path, f: _File, name: str) -> np.ndarray:
    """Read one IDX file of set ``name`` and check its contents' MD5: a copy of the array kept from an earlier read
    of the same file, unchanged since, else read from disk (and kept)."""
    path = _find(folder, f)
    if path is None:  # only the shipped sample can get here
        raise DataError(f"{folder / (f.name + '.gz')} is missing; reinstall capsnet")
    st = path.stat()
    key = (str(path.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, f.md5)
    with _kept_lock:
        kept = _kept.get(key)
        if kept is not None:
            _kept.move_to_end(key)
            return kept.copy()  # the caller's own: a change to it never reaches the next load
    array = _read_unkept(path, f, name)
    with _kept_lock:
        _kept[key] = array.copy()
        while len(_kept) > _KEPT_FILES:
            _kept.popitem(last=False)
    return array


def _read_unkept(path: Path, f: _File, name: str) -> np.ndarray:
    data = read_idx_bytes(path, max_size=_MAX_FILE_BYTES)  # and never past the size its header declares
    digest = hashlib.md5(data, usedforsecurity=False).hexdigest()
    if digest != f.md5:
        known = _KNOWN_MD5.get(digest)
        if known is not None and known[0] == "mnist-sample":  # read from capsnet's own package, never a data root
            raise DataError(
                f"{path} is not {name}'s {f.name}: its contents are capsnet's shipped sample of MNIST ({known[1]}, "
                f"MD5 {digest}), copied into the {name}/ folder. Put the full {name} files there instead (or use "
                f"--dataset mnist-sample, which reads the sample from capsnet itself)."
            )
        if known is not None and known[0] != name:
            raise DataError(
                f"{path} is not {name}'s {f.name}: its contents are {known[0]}'s {known[1]} "
                f"(MD5 {digest}), so it looks like the {known[0]} files were put in the "
                f"{name}/ folder. Keep each set in its own folder under the data root "
                f"({path.parent.parent}/{known[0]}/)."
            )
        if known is not None:
            raise DataError(
                f"{path} is not {name}'s {f.name}: its contents are {known[1]} of the same set "
                f"(MD5 {digest}); the file was renamed. Restore the original names."
            )
        raise DataError(
            f"{path}: MD5 of the uncompressed contents is {digest}, expected {f.md5} for "
            f"{name}'s {f.name}. The file may be corrupt, truncated or from another data set; "
            "delete it and copy it again (or let capsnet download it again: into its cache, or from Python with "
            "download=True)."
        )
    return decode_idx(data, source=str(path))
