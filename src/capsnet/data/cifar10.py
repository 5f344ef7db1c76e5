"""CIFAR-10 (Krizhevsky 2009): 60,000 32x32 colour images of 10 classes, read from the official binary version.

https://www.cs.toronto.edu/~kriz/cifar.html publishes ``cifar-10-binary.tar.gz``
(the "binary version suitable for C programs", MD5 ``CIFAR10_MD5``) holding
``cifar-10-batches-bin/``: ``data_batch_1.bin`` .. ``data_batch_5.bin`` (the
50,000 training images), ``test_batch.bin`` (10,000) and ``batches.meta.txt``
(the class names). Each batch file is 10,000 records of 3,073 bytes: the label
(one byte, 0..9), then the image's 1,024 red, 1,024 green and 1,024 blue
values, each plane row after row; so a record is the image in (C, H, W) order.

The archive lives at ``<root>/cifar10/cifar-10-binary.tar.gz``, as downloaded:
its MD5 is checked before anything is read, and the batches are read out of
it as it streams. Nothing is extracted, so no name inside the archive ever
reaches the file system (no path traversal), and a member is read only if it
is a regular file of the expected name and no larger than a batch.
Downloaded like MNIST when missing (``download_file``: mirrors, checksum,
atomic rename), only into the user cache unless ``download=True``.
"""
from __future__ import annotations

import gzip
import logging
import os
import tarfile
import zlib
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from .download import download_file, file_md5, mirror_list
from .idx import DataError
from .sets import Dataset, download_hint, resolve_root

__all__ = ["CIFAR10_CLASSES", "CIFAR10_MIRRORS", "CIFAR10_ARCHIVE", "CIFAR10_MD5", "CIFAR10_MEMBERS", "RECORD_BYTES",
           "decode_cifar_batch", "encode_cifar_batch", "read_cifar_batch", "load_cifar10"]

log = logging.getLogger(__name__)

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
CIFAR10_MIRRORS = ("https://www.cs.toronto.edu/~kriz/",)
CIFAR10_ARCHIVE = "cifar-10-binary.tar.gz"
CIFAR10_MD5 = "c32a1d4ab5d03f1284b67883e8d87530"  # published on the CIFAR page, of the .tar.gz as downloaded
_FOLDER = "cifar-10-batches-bin"
CIFAR10_MEMBERS = {"train": tuple(f"{_FOLDER}/data_batch_{k}.bin" for k in range(1, 6)),
                   "test": (f"{_FOLDER}/test_batch.bin",)}
SIDE, CHANNELS = 32, 3
RECORD_BYTES = 1 + CHANNELS * SIDE * SIDE  # 3,073: the label byte, then 3 planes of 32x32
BATCH_RECORDS = 10000
# The archive is the six batches and a few tar headers, compressed: never more than this (bounds a download).
_MAX_ARCHIVE_BYTES = 6 * BATCH_RECORDS * RECORD_BYTES + (1 << 20)


def decode_cifar_batch(data: bytes, *, source: str = "<bytes>") -> tuple[np.ndarray, np.ndarray]:
    """The images (N, 3, 32, 32) uint8 and labels (N,) int64 of one CIFAR-10 binary batch's bytes.

    Refuses, naming ``source``: no bytes, a size that is not a whole number
    of 3,073-byte records (a truncated file), a label outside 0..9.
    """
    fix = "delete it and download CIFAR-10's binary version again"
    if not data:
        raise DataError(f"{source}: empty; a CIFAR-10 batch holds 3,073-byte records; {fix}")
    n, rest = divmod(len(data), RECORD_BYTES)
    if rest:
        raise DataError(f"{source}: truncated or not a CIFAR-10 batch: {len(data):,} bytes is not a whole number of "
                        f"{RECORD_BYTES:,}-byte records (a label byte and 3x32x32 pixels), but {n:,} records and "
                        f"{rest:,} bytes over; {fix}")
    records = np.frombuffer(data, np.uint8).reshape(n, RECORD_BYTES)
    labels = records[:, 0]
    if labels.max() >= len(CIFAR10_CLASSES):
        bad = int(np.argmax(labels >= len(CIFAR10_CLASSES)))
        raise DataError(f"{source}: record {bad} has label {labels[bad]}, outside CIFAR-10's 0..9 (a CIFAR-100 "
                        f"batch has two label bytes per record); {fix}")
    images = records[:, 1:].reshape(n, CHANNELS, SIDE, SIDE).copy()  # each record is (C, H, W) already
    return images, labels.astype(np.int64)


def encode_cifar_batch(images: np.ndarray, labels: np.ndarray) -> bytes:
    """The bytes of a CIFAR-10 binary batch of ``images`` (N, 3, 32, 32) uint8 and ``labels`` (N,) in 0..9.

    For tests and for making CIFAR-format files; ``decode_cifar_batch`` inverts it.
    """
    images, labels = np.asarray(images), np.asarray(labels)
    if images.dtype != np.uint8 or images.shape[1:] != (CHANNELS, SIDE, SIDE) or labels.shape != images.shape[:1]:
        raise ValueError(f"need uint8 images (N, 3, 32, 32) and labels (N,), got {images.dtype} {images.shape} and "
                         f"{labels.shape}")
    if labels.size and not (0 <= labels.min() and labels.max() < len(CIFAR10_CLASSES)):
        raise ValueError(f"labels must lie in 0..9, got {labels.min()}..{labels.max()}")
    return np.concatenate([labels.astype(np.uint8)[:, None], images.reshape(len(images), -1)], axis=1).tobytes()


def read_cifar_batch(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """Images and labels of one extracted CIFAR-10 batch file (``data_batch_1.bin``, ...), as ``decode_cifar_batch``.

    A file larger than a batch (10,000 records) is refused before it is read.
    """
    path = Path(path)
    size = path.stat().st_size
    if size > BATCH_RECORDS * RECORD_BYTES:
        raise DataError(f"{path}: {size:,} bytes, more than a CIFAR-10 batch's {BATCH_RECORDS * RECORD_BYTES:,}; "
                        f"not a CIFAR-10 binary batch")
    return decode_cifar_batch(path.read_bytes(), source=str(path))


_archive_md5 = file_md5  # the file's MD5 as it lies on disk (capsnet.data.download)


def _read_members(path: Path, names: Sequence[str]) -> dict[str, bytes]:
    """The bytes of ``names`` in the gzipped tar at ``path``, streamed in one pass; nothing is written to disk.

    Reads no member past the size of CIFAR-10's archive, and no wanted member larger than a batch.
    """
    wanted, found = set(names), {}
    limit = BATCH_RECORDS * RECORD_BYTES
    again = "delete it and download it again"
    try:
        with open(path, "rb") as raw, gzip.GzipFile(fileobj=raw, mode="rb") as gz, \
                tarfile.open(fileobj=gz, mode="r|") as tar:  # a stream: members in order, no seeking, no extraction
            for member in tar:
                if member.offset_data + member.size > _MAX_ARCHIVE_BYTES:
                    raise DataError(f"{path}: {member.name} ends past {_MAX_ARCHIVE_BYTES:,} bytes, further than "
                                    f"anything in CIFAR-10's binary archive; not that archive, {again}")
                if member.name not in wanted:
                    continue
                if not member.isfile():
                    raise DataError(f"{path}: {member.name} is not a regular file in the archive (a link or a "
                                    f"folder); not CIFAR-10's binary archive, {again}")
                if member.size > limit:
                    raise DataError(f"{path}: {member.name} holds {member.size:,} bytes, more than a CIFAR-10 "
                                    f"batch's {limit:,}; not CIFAR-10's binary archive, {again}")
                found[member.name] = tar.extractfile(member).read()
                if len(found) == len(wanted):
                    break
            if len(found) < len(wanted):  # tarfile stops quietly where a cut archive ends: gzip tells
                while gz.read(1 << 20):
                    pass
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as err:
        raise DataError(f"{path}: not a readable gzipped tar archive, or cut short ({type(err).__name__}: {err}); "
                        f"{again}") from err
    missing = [n for n in names if n not in found]
    if missing:
        raise DataError(f"{path} holds no {', '.join(missing)}: not CIFAR-10's binary version (the python and "
                        f"MATLAB versions hold other files); download {CIFAR10_MIRRORS[0]}{CIFAR10_ARCHIVE}")
    return found


def load_cifar10(split: str = "train", *, root: str | os.PathLike | None = None, download: bool | None = None,
                 progress: bool = True, mirrors: Sequence[str] | None = None, check: bool = True) -> Dataset:
    """A split of CIFAR-10: images (N, 3, 32, 32) uint8 (RGB planes), labels (N,) int64; N = 50,000 or 10,000.

    Args:
        split: "train" (data_batch_1..5, in order) or "test" (test_batch).
        root: folder holding ``cifar10/`` (default as for MNIST: ``--data-dir``,
            ``$CAPSNET_DATA``, else the user cache).
        download: fetch the archive when missing; None downloads only into the user cache.
        progress: a progress bar while downloading.
        mirrors: base URLs to try instead of ``CIFAR10_MIRRORS``.
        check: compare the archive's MD5 with the published one before reading it.
    """
    if split not in CIFAR10_MEMBERS:
        raise DataError(f"unknown split {split!r} of cifar10; valid splits: {', '.join(CIFAR10_MEMBERS)}")
    base, source = resolve_root(root)
    folder = base / "cifar10"
    path = folder / CIFAR10_ARCHIVE
    if not path.is_file():
        if not (download if download is not None else source == "cache"):
            extracted = (f" ({folder / _FOLDER} is there, but capsnet reads the archive itself, so that its "
                         f"checksum can be checked: put the .tar.gz beside it)") if (folder / _FOLDER).is_dir() else ""
            raise DataError(f"cifar10: {CIFAR10_ARCHIVE} not found in {folder} (root from {source}){extracted}. "
                            f"Download {CIFAR10_MIRRORS[0]}{CIFAR10_ARCHIVE} into that folder as it is (not "
                            f"extracted), point --data-dir or CAPSNET_DATA at a folder holding cifar10/"
                            + download_hint(source, base))
        log.info("downloading cifar10 %s to %s", CIFAR10_ARCHIVE, folder)
        download_file([u + CIFAR10_ARCHIVE for u in mirror_list(mirrors, CIFAR10_MIRRORS)], path,
                      md5=CIFAR10_MD5 if check else None, progress=progress, max_size=_MAX_ARCHIVE_BYTES)
    elif check and (digest := _archive_md5(path)) != CIFAR10_MD5:  # (a checked download was hashed as it came)
        raise DataError(f"{path}: MD5 is {digest}, expected {CIFAR10_MD5} for CIFAR-10's binary version "
                        f"({CIFAR10_ARCHIVE}). The file may be corrupt, truncated or another version of CIFAR-10 (the "
                        f"python or MATLAB archive); delete it and download it again")
    members = _read_members(path, CIFAR10_MEMBERS[split])
    parts = [decode_cifar_batch(members[name], source=f"{path}:{name}") for name in CIFAR10_MEMBERS[split]]
    images = np.concatenate([p[0] for p in parts])
    labels = np.concatenate([p[1] for p in parts])
    return Dataset("cifar10", split, torch.from_numpy(images), torch.from_numpy(labels), CIFAR10_CLASSES)
