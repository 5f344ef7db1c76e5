"""smallNORB (LeCun, Huang and Bottou 2004): 5 categories of toys, stereo 96x96 images, 24,300 per split.

The data set of "Matrix capsules with EM routing" and of Efficient-CapsNet.
Six files in NYU's binary matrix format (https://cs.nyu.edu/~ylclab/data/norb-v1.0-small/),
each little-endian: int32 magic (0x1E3D4C55 for uint8, 0x1E3D4C54 for int32),
int32 ndim, max(ndim, 3) int32 dimensions (unused ones are padding), then
the data in C order:

- ``*-dat.mat``: uint8 (24300, 2, 96, 96), the left and right camera;
- ``*-cat.mat``: int32 (24300,), the category 0..4 (animal, human, airplane, truck, car);
- ``*-info.mat``: int32 (24300, 4): instance, elevation, azimuth, lighting.

Files are found raw or gzipped under ``<root>/smallnorb/``, checked by the MD5
of their uncompressed contents (published by the loaders that use them; NYU
publishes none), and downloaded like MNIST when missing. The reader stops at
the size the header declares and refuses a wrong magic, rank or size by name.
"""
from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import NamedTuple, Sequence

import numpy as np
import torch

from .download import download_file, mirror_list
from .idx import DataError, open_maybe_gzipped
from .sets import Dataset, download_hint, resolve_root

__all__ = ["SMALLNORB_CLASSES", "SMALLNORB_MIRRORS", "SMALLNORB_FILES", "read_norb", "write_norb", "load_smallnorb"]

log = logging.getLogger(__name__)

SMALLNORB_CLASSES = ("animal", "human", "airplane", "truck", "car")
SMALLNORB_MIRRORS = ("https://cs.nyu.edu/~ylclab/data/norb-v1.0-small/",)
_MAGIC = {0x1E3D4C55: np.dtype("u1"), 0x1E3D4C54: np.dtype("<i4")}  # the two types smallNORB uses
_TYPE_NAMES = {0x1E3D4C51: "float32", 0x1E3D4C52: "packed", 0x1E3D4C53: "float64", 0x1E3D4C56: "int16"}
N = 24300


class _NorbFile(NamedTuple):
    name: str
    md5: str  # of the uncompressed contents
    shape: tuple[int, ...]
    dtype: str


def _files(split: str, instances: str) -> dict[str, _NorbFile]:
    stem = f"smallnorb-5x{instances}x9x18x6x2x96x96-{split}"
    md5 = _MD5[split]
    return {"dat": _NorbFile(f"{stem}-dat.mat", md5["dat"], (N, 2, 96, 96), "u1"),
            "cat": _NorbFile(f"{stem}-cat.mat", md5["cat"], (N,), "<i4"),
            "info": _NorbFile(f"{stem}-info.mat", md5["info"], (N, 4), "<i4")}


_MD5 = {  # uncompressed contents; the training and testing category files are the same sequence
    "training": {"dat": "8138a0902307b32dfa0025a36dfa45ec", "cat": "fd5120d3f770ad57ebe620eb61a0b633",
                 "info": "19faee774120001fc7e17980d6960451"},
    "testing": {"dat": "e9920b7f7b2869a8f1a12e945b2c166c", "cat": "fd5120d3f770ad57ebe620eb61a0b633",
                "info": "7c5b871cc69dcadec1bf6a18141f5edc"},
}
SMALLNORB_FILES = {"train": _files("training", "46789"), "test": _files("testing", "01235")}


def _header(data: bytes, source: str) -> tuple[np.dtype, tuple[int, ...], int]:
    """(dtype, shape, header bytes) of a NORB matrix, checked against what smallNORB uses."""
    if len(data) < 8:
        raise DataError(f"{source}: {len(data)} bytes is too short for a NORB matrix header")
    magic, ndim = (int(x) for x in np.frombuffer(data[:8], "<i4"))
    if magic not in _MAGIC:
        what = f"a {_TYPE_NAMES[magic]} matrix" if magic in _TYPE_NAMES else f"magic number {magic:#x}, not a NORB matrix"
        raise DataError(f"{source}: {what}; smallNORB files hold uint8 images (magic 0x1e3d4c55) or int32 "
                        f"labels (0x1e3d4c54)")
    if not 1 <= ndim <= 4:
        raise DataError(f"{source}: a NORB matrix of rank {ndim}; smallNORB's have rank 1 to 4")
    head = 8 + 4 * max(ndim, 3)
    if len(data) < head:
        raise DataError(f"{source}: the header is cut short ({len(data)} of {head} bytes)")
    dims = tuple(int(x) for x in np.frombuffer(data[8:head], "<i4")[:ndim])
    if any(d < 0 for d in dims):
        raise DataError(f"{source}: negative dimension in {dims}")
    return _MAGIC[magic], dims, head


def read_norb(path: str | os.PathLike, *, max_size: int | None = None, md5: str | None = None) -> np.ndarray:
    """Read a NORB binary matrix (raw or gzipped): the array of the dtype and shape its header declares.

    Reads no further than that size (and ``max_size`` bytes of data, if given);
    a file shorter or longer than its header says is a ``DataError``. ``md5``:
    the uncompressed file's published MD5, checked on the bytes as they are
    read (one pass: a 450 MB smallNORB file was decompressed twice, once for
    its MD5 and once to read it).
    """
    path = Path(path)
    digest = hashlib.md5(usedforsecurity=False)
    with open_maybe_gzipped(path) as f:
        head = f.read(8 + 16)
        digest.update(head)
        dtype, shape, n_head = _header(head, str(path))
        size = int(np.prod(shape, dtype=object)) * dtype.itemsize  # Python ints: (65536,) * 4 wrapped to 0 in int64
        if size > (max_size if max_size is not None else 2**40):  # 2**40: a damaged header, past any NORB file
            raise DataError(f"{path}: its header declares {size:,} bytes of data, more than any smallNORB file")
        data = bytearray(head[n_head:n_head + size])  # a header of fewer data bytes than it holds: read no further
        while len(data) < size:  # in pieces: read(n) takes n bytes of memory at once, so a 20-byte file declaring
            piece = f.read(min(size - len(data), 1 << 24))  # 2**40 bytes was a MemoryError (found by fuzzing)
            if not piece:
                break
            digest.update(piece)
            data += piece
        extra = head[n_head + size:] or f.read(1)
    if len(data) != size:
        raise DataError(f"{path}: truncated, {len(data):,} of the {size:,} data bytes its header declares")
    if extra:
        raise DataError(f"{path}: longer than the {size:,} data bytes its header declares")
    if md5 is not None and digest.hexdigest() != md5.lower():
        raise DataError(f"{path}: MD5 of the uncompressed contents is {digest.hexdigest()}, expected {md5} (the "
                        f"published smallNORB file's). The file may be corrupt, or another file under its name; "
                        f"delete it and download it again")
    return np.frombuffer(data, dtype).reshape(shape)


def write_norb(path: str | os.PathLike, array: np.ndarray) -> Path:
    """Write ``array`` (uint8 or int32) as a NORB binary matrix: for tests and for making smallNORB-format files."""
    a = np.ascontiguousarray(array)
    magic = {np.dtype("u1"): 0x1E3D4C55, np.dtype("i4"): 0x1E3D4C54}.get(a.dtype.newbyteorder("="))
    if magic is None:
        raise ValueError(f"write_norb writes uint8 or int32 arrays, got {a.dtype}")
    dims = list(a.shape) + [1] * max(0, 3 - a.ndim)
    path = Path(path)
    path.write_bytes(np.array([magic, a.ndim, *dims], "<i4").tobytes() + a.astype(a.dtype.newbyteorder("<")).tobytes())
    return path


def _find(folder: Path, name: str) -> Path | None:
    for candidate in (folder / name, folder / (name + ".gz")):
        if candidate.is_file():
            return candidate
    return None


def load_smallnorb(split: str = "train", *, root: str | os.PathLike | None = None, download: bool | None = None,
                   progress: bool = True, mirrors: Sequence[str] | None = None, check: bool = True) -> Dataset:
    """A split of smallNORB: images (24300, 2, 96, 96) uint8 (both cameras), labels (24300,) int64.

    Args:
        split: "train" (instances 4, 6, 7, 8, 9) or "test" (0, 1, 2, 3, 5).
        root: folder holding ``smallnorb/`` (default as for MNIST: ``--data-dir``,
            ``$CAPSNET_DATA``, else the user cache).
        download: fetch missing files; None downloads only into the user cache.
        check: compare each file's uncompressed MD5 with the published one.
    """
    if split not in SMALLNORB_FILES:
        raise DataError(f"unknown split {split!r} of smallnorb; valid splits: {', '.join(SMALLNORB_FILES)}")
    files = SMALLNORB_FILES[split]
    base, source = resolve_root(root)
    folder = base / "smallnorb"
    missing = [f for f in (files["dat"], files["cat"]) if _find(folder, f.name) is None]
    if missing:
        if not (download if download is not None else source == "cache"):
            raise DataError(f"smallnorb {split} file(s) {' and '.join(f.name for f in missing)} not found in {folder} "
                            f"(root from {source}; looked for each raw and with .gz). Download them from "
                            f"{SMALLNORB_MIRRORS[0]} into that folder, point --data-dir or CAPSNET_DATA at a folder "
                            f"holding smallnorb/" + download_hint(source, base))
        for f in missing:
            log.info("downloading smallnorb %s to %s", f.name, folder)
            download_file([u + f.name + ".gz" for u in mirror_list(mirrors, SMALLNORB_MIRRORS)], folder / (f.name + ".gz"),
                          md5_uncompressed=f.md5 if check else None, progress=progress,
                          max_size=int(np.prod(f.shape)) * np.dtype(f.dtype).itemsize + 64)
    arrays = []
    for f in (files["dat"], files["cat"]):
        path = _find(folder, f.name)
        a = read_norb(path, max_size=int(np.prod(f.shape)) * np.dtype(f.dtype).itemsize, md5=f.md5 if check else None)
        if a.shape[1:] != f.shape[1:] or a.dtype != np.dtype(f.dtype):
            raise DataError(f"{path}: expected {f.dtype} of shape (N, {', '.join(map(str, f.shape[1:]))}), "
                            f"got {a.dtype} {a.shape}")
        arrays.append(a)
    images, labels = arrays
    if len(images) != len(labels):
        raise DataError(f"{folder}: {len(images)} images but {len(labels)} labels in the {split} files")
    if len(labels) and (labels.min() < 0 or labels.max() >= len(SMALLNORB_CLASSES)):
        raise DataError(f"{_find(folder, files['cat'].name)}: categories must lie in 0..4, got "
                        f"{labels.min()}..{labels.max()}")
    return Dataset("smallnorb", split, torch.from_numpy(images.copy()), torch.from_numpy(labels.astype(np.int64)),
                   SMALLNORB_CLASSES)
