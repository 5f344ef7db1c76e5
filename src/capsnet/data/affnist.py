"""Real affNIST, read from its MATLAB .mat files without scipy.

affNIST (Tieleman, https://www.cs.toronto.edu/~tijmen/affNIST/) ships its
40x40 digits as MATLAB v5 .mat files, each holding a struct ``affNISTdata``
with ``image`` (1600 x N uint8, one column per digit, the 40x40 pixels row
after row), ``label_int`` (1 x N) and ``label_one_of_n`` (10 x N). The test
set is ``test.mat`` (or ``test_batches/*.mat``), 320,000 digits in all.

``read_mat`` is a small reader of the MATLAB v5 format (the "MAT-File Format"
document of MathWorks): numeric and character arrays, structs and cells,
compressed (zlib) or not, either byte order; sparse arrays, objects and
v7.3 (HDF5) files are refused with a message that says so.
"""
from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .idx import DataError
from .sets import Dataset

__all__ = ["read_mat", "load_affnist", "AFFNIST_SIZE"]

AFFNIST_SIZE = 40

# Data types of v5 data elements (MAT-File Format, table 1-1) and array classes (table 1-3).
_MI = {1: "i1", 2: "u1", 3: "i2", 4: "u2", 5: "i4", 6: "u4", 7: "f4", 9: "f8", 12: "i8", 13: "u8", 16: "u1"}
_MI_MATRIX, _MI_COMPRESSED = 14, 15
_MX_NUMERIC = {6: "f8", 7: "f4", 8: "i1", 9: "u1", 10: "i2", 11: "u2", 12: "i4", 13: "u4", 14: "i8", 15: "u8"}
_MX_CELL, _MX_STRUCT, _MX_OBJECT, _MX_CHAR, _MX_SPARSE = 1, 2, 3, 4, 5


class _Reader:
    """Data elements of one buffer (a memoryview: payloads are views, not copies of a file of hundreds of MB)."""

    def __init__(self, data: bytes | memoryview, order: str, where: str, max_size: int | None = None) -> None:
        self.data, self.order, self.where, self.max_size = memoryview(data), order, where, max_size

    def fail(self, why: str) -> DataError:
        return DataError(f"{self.where} is not a readable MATLAB v5 .mat file: {why}")

    def elements(self, start: int, end: int):
        """(type, payload) of each data element in data[start:end], unpacking compressed ones."""
        pos = start
        while pos + 8 <= end:
            first, second = struct.unpack_from(self.order + "II", self.data, pos)
            if first >> 16:  # small data element: type and size share the first word, data in the second
                mtype, n = first & 0xFFFF, first >> 16
                if n > 4:
                    raise self.fail(f"small data element at byte {pos} claims {n} bytes")
                yield mtype, self.data[pos + 4:pos + 4 + n]
                pos += 8
                continue
            mtype, n = first, second
            if pos + 8 + n > end:
                raise self.fail(f"data element at byte {pos} runs past the end (truncated file?)")
            payload = self.data[pos + 8:pos + 8 + n]
            if mtype == _MI_COMPRESSED:
                inner = self.inflate(payload, pos)
                sub = _Reader(inner, self.order, self.where, self.max_size)
                yield from sub.elements(0, len(inner))
                pos += 8 + n  # compressed elements are not padded
                continue
            yield mtype, payload
            pos += 8 + n + (-n % 8)  # padded to 8 bytes

    def inflate(self, payload: memoryview, pos: int) -> bytes:
        """The contents of the compressed element at ``pos``, decompressed no further than ``max_size`` bytes."""
        z = zlib.decompressobj()
        try:
            inner = z.decompress(payload, 0 if self.max_size is None else self.max_size + 1)
        except zlib.error as e:
            raise self.fail(f"compressed element at byte {pos} is damaged ({e})") from None
        if self.max_size is not None and len(inner) > self.max_size:
            raise self.fail(f"compressed element at byte {pos} holds more than {self.max_size:,} bytes, more than "
                            f"the file can (a zip bomb?); decompression stopped there")
        if not z.eof:
            raise self.fail(f"compressed element at byte {pos} is cut short")
        return inner

    def numbers(self, mtype: int, payload: bytes) -> np.ndarray:
        if mtype not in _MI:
            raise self.fail(f"unsupported data type {mtype}")
        return np.frombuffer(payload, dtype=np.dtype(_MI[mtype]).newbyteorder(self.order))

    def matrix(self, payload: bytes) -> tuple[str, Any]:
        """Name and value of one miMATRIX element."""
        if not payload:
            return "", np.zeros((0, 0))
        sub = _Reader(payload, self.order, self.where)
        parts = sub.elements(0, len(payload))
        try:
            flags = sub.numbers(*next(parts))
            dims = tuple(int(d) for d in sub.numbers(*next(parts)))
            name = bytes(sub.numbers(*next(parts))).decode("ascii", "replace")
        except StopIteration:
            raise self.fail("a matrix lacks its flags, dimensions or name") from None
        cls = int(flags[0]) & 0xFF
        count = int(np.prod(dims, dtype=object)) if dims else 1  # Python's integers: 65535 x 65535 x ... is exact
        if cls in (_MX_STRUCT, _MX_CELL) and count > len(payload) // 8 + 1:  # each item or cell takes an element
            # of 8 bytes at least (a struct of no fields none: 4.3e9 empty items from a 216-byte file)
            raise self.fail(f"{'struct' if cls == _MX_STRUCT else 'cell'} {name!r} declares {count:,} items in "
                            f"{len(payload):,} bytes")
        if cls in _MX_NUMERIC or cls == _MX_CHAR:
            try:
                real = sub.numbers(*next(parts))
            except StopIteration:
                raise self.fail(f"array {name!r} has no data") from None
            if real.size != count:
                raise self.fail(f"array {name!r} holds {real.size} values for dimensions {dims}")
            if cls == _MX_CHAR:
                return name, "".join(map(chr, real.reshape(dims, order="F").T.ravel()))
            value = real.astype(_MX_NUMERIC[cls]).reshape(dims, order="F")  # MATLAB stores columns first
            if int(flags[0]) & 0x800:  # complex
                imag = sub.numbers(*next(parts)).astype(_MX_NUMERIC[cls]).reshape(dims, order="F")
                value = value + 1j * imag
            return name, value
        if cls == _MX_STRUCT:
            length = int(sub.numbers(*next(parts))[0])
            raw = bytes(sub.numbers(*next(parts)))
            if length <= 0:
                raise self.fail(f"struct {name!r} gives its field names a length of {length}")
            fields = [raw[i:i + length].split(b"\0")[0].decode("ascii", "replace") for i in range(0, len(raw), length)]
            items = []
            for _ in range(count):
                item = {}
                for field in fields:
                    mtype, inner = next(parts)
                    if mtype != _MI_MATRIX:
                        raise self.fail(f"field {field!r} of struct {name!r} is not a matrix")
                    item[field] = sub.matrix(inner)[1]
                items.append(item)
            return name, items[0] if count == 1 else items
        if cls == _MX_CELL:
            cells = [sub.matrix(next(parts)[1])[1] for _ in range(count)]
            return name, cells
        kind = {_MX_SPARSE: "sparse arrays", _MX_OBJECT: "objects"}.get(cls, f"array class {cls}")
        raise self.fail(f"{kind} (in {name!r}) are not supported by this reader; install scipy and use scipy.io.loadmat")


def _read(path: Path, size: int | None = None) -> bytes:
    """``path``'s bytes (its first ``size``; None: all), a folder or an unreadable file refused in words."""
    if path.is_dir():  # affNIST's test_batches folder, given whole: its files are what is read
        mats = sorted(p.name for p in path.glob("*.mat"))
        raise DataError(f"{path} is a folder; give its .mat files (" + (f"{path}/*.mat: {', '.join(mats[:3])}"
                        + (", ..." if len(mats) > 3 else "") if mats else "it holds none") + ")")
    try:
        with open(path, "rb") as f:
            return f.read() if size is None else f.read(size)
    except OSError as e:
        raise DataError(f"cannot read {path}: {e}") from e


def _byte_order(path: Path, data: bytes) -> str:
    """The byte order ("<" or ">") a MATLAB v5 file's header (``data``: the file, or its first 516 bytes) names;
    a zip archive, a short file, a v7.3 (HDF5) file or another format refused in words."""
    if data[:4] == b"PK\x03\x04":  # affNIST is published as test.mat.zip and test_batches.zip
        raise DataError(f"{path} is a zip archive, not a .mat file: unzip it (affNIST publishes test.mat.zip and "
                        f"test_batches.zip) and give the .mat file(s) inside")
    if len(data) < 128:
        raise DataError(f"{path} is not a MATLAB .mat file: only {len(data)} bytes, shorter than the 128-byte header")
    if data.startswith(b"\x89HDF") or b"MATLAB 7.3" in data[:128] or data[512:516] == b"\x89HDF":
        raise DataError(f"{path} is a MATLAB v7.3 (HDF5) file; this reader takes v5 files: save it with "
                        f"save(..., '-v7') in MATLAB, or read it with h5py")
    order = {b"IM": "<", b"MI": ">"}.get(data[126:128])
    if order is None:
        raise DataError(f"{path} is not a MATLAB v5 .mat file (no 'MATLAB 5.0 MAT-file' header with its byte-order mark)")
    return order


def read_mat(path: str | os.PathLike, *, max_size: int | None = None) -> dict[str, Any]:
    """The variables of a MATLAB v5 .mat file: numeric arrays as numpy (MATLAB's shape), structs as dicts.

    ``max_size`` bounds each compressed element's decompressed size in bytes (a file that claims more is refused
    as soon as it passes it); None: no bound.
    """
    path = Path(path)
    data = _read(path)
    order = _byte_order(path, data)
    reader = _Reader(data, order, str(path), max_size)
    out = {}
    try:
        for mtype, payload in reader.elements(128, len(data)):
            if mtype == _MI_MATRIX:
                name, value = reader.matrix(payload)
                out[name] = value
    except (StopIteration, RuntimeError, ValueError, IndexError, TypeError, OverflowError, struct.error) as e:
        if isinstance(e, DataError):  # the reader's own, already worded
            raise
        # a header byte damaged: a struct short of its fields, a field-name length of 0, a payload that is not a
        # whole number of its type's values (a generator's StopIteration surfaces as RuntimeError)
        raise reader.fail(f"a malformed element ({type(e).__name__}: {e or 'cut short'}); download it again") from None
    return out


def _real(a: np.ndarray) -> bool:
    """Whether an array holds real numbers (integers, floats or booleans; not characters, complex or objects)."""
    return a.dtype.kind in "biuf"


def load_affnist(path: str | os.PathLike) -> Dataset:
    """Digits and labels of one affNIST .mat file, as a ``Dataset`` of (N, 1, 40, 40) uint8 images.

    Takes the files of https://www.cs.toronto.edu/~tijmen/affNIST/ (e.g.
    ``test.mat`` or ``test_batches/1.mat``), read with ``read_mat``.
    """
    path = Path(path)
    # a bound on each element's decompressed size: 64 times the file's size (digits compress about 6-fold; zlib can
    # reach 1000-fold, and a 622 KB file inflated to 1.2 GB), 64 MiB at least
    try:
        size = path.stat().st_size
    except OSError:
        size = 0  # read_mat says why it cannot read it
    variables = read_mat(path, max_size=max(64 << 20, 64 * size))
    data = variables.get("affNISTdata")
    if not isinstance(data, dict) or "image" not in data:
        raise DataError(f"{path} holds {sorted(variables)} but no affNISTdata struct with an 'image' field; "
                        f"is it an affNIST file (https://www.cs.toronto.edu/~tijmen/affNIST/)?")
    image = np.asarray(data["image"])
    side = AFFNIST_SIZE
    if image.ndim != 2 or image.shape[0] != side * side:
        raise DataError(f"{path}: affNISTdata.image should be {side * side} x N (one 40x40 digit per column), "
                        f"got {image.shape}")
    N = image.shape[1]
    if not _real(image) or (image.dtype.kind == "f" and not np.isfinite(image).all()):
        raise DataError(f"{path}: affNISTdata.image must hold real, finite numbers, got {image.dtype}"
                        + ("" if not _real(image) else " with NaN or infinite values"))
    if "label_int" in data:
        labels = np.asarray(data["label_int"])
        if not _real(labels):
            raise DataError(f"{path}: affNISTdata.label_int must hold numbers, got {labels.dtype}")
        labels = labels.reshape(-1)
    elif "label_one_of_n" in data:
        one_of_n = np.asarray(data["label_one_of_n"])
        if not _real(one_of_n) or one_of_n.ndim != 2 or one_of_n.shape[0] != 10:
            raise DataError(f"{path}: affNISTdata.label_one_of_n must be 10 x N numbers, got {one_of_n.dtype} of "
                            f"shape {one_of_n.shape}")
        labels = one_of_n.argmax(axis=0)
    else:
        raise DataError(f"{path}: affNISTdata has neither label_int nor label_one_of_n")
    whole = labels.size == 0 or bool(np.isfinite(labels).all() and (labels == np.round(labels)).all())
    if labels.shape != (N,) or not whole or (labels.size and (labels.min() < 0 or labels.max() > 9)):
        raise DataError(f"{path}: expected {N} whole-number labels in 0..9, got {labels.shape[0]}"
                        + (f" in {labels.min()}..{labels.max()}" if labels.size and whole else
                           " that are not whole numbers" if labels.size else ""))
    pixels = np.ascontiguousarray(image.T).reshape(N, 1, side, side)  # each column's 1600 values: rows of 40
    if pixels.dtype != np.uint8 and N:
        pixels = np.clip(np.rint(pixels * (255.0 if pixels.max() <= 1.0 else 1.0)), 0, 255).astype(np.uint8)
    pixels = pixels.astype(np.uint8, copy=False)
    return Dataset(name="affnist", split=path.stem, images=torch.from_numpy(pixels.copy()),
                   labels=torch.from_numpy(labels.astype(np.int64)), classes=tuple(str(d) for d in range(10)))
