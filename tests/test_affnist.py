"""Reading real affNIST .mat files: a MATLAB v5 file written here from the format's spec, and every bad case."""
from __future__ import annotations

import re
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from capsnet.data.affnist import load_affnist, read_mat
from capsnet.data.idx import DataError

# MAT-File Format (MathWorks): data types and array classes used below.
MI_INT8, MI_UINT8, MI_INT32, MI_UINT32, MI_DOUBLE, MI_MATRIX, MI_COMPRESSED = 1, 2, 5, 6, 9, 14, 15
MX_STRUCT, MX_DOUBLE, MX_UINT8 = 2, 6, 9


def _element(mtype: int, payload: bytes, order: str) -> bytes:
    return struct.pack(order + "II", mtype, len(payload)) + payload + b"\0" * (-len(payload) % 8)


def _header(order: str) -> bytes:
    text = b"MATLAB 5.0 MAT-file, written by capsnet's tests".ljust(116, b" ")
    return text + b"\0" * 8 + struct.pack(order + "H", 0x0100) + (b"IM" if order == "<" else b"MI")


def _matrix(name: str, value: np.ndarray | dict, order: str) -> bytes:
    """One miMATRIX element: a numeric array (stored column-major) or a 1x1 struct of such arrays."""
    if isinstance(value, dict):
        cls, dims = MX_STRUCT, (1, 1)
    else:
        cls, dims = {np.dtype("uint8"): MX_UINT8, np.dtype("float64"): MX_DOUBLE}[value.dtype], value.shape
    body = _element(MI_UINT32, struct.pack(order + "II", cls, 0), order)
    body += _element(MI_INT32, struct.pack(order + f"{len(dims)}i", *dims), order)
    body += _element(MI_INT8, name.encode(), order)
    if isinstance(value, dict):
        width = 32
        body += _element(MI_INT32, struct.pack(order + "i", width), order)
        body += _element(MI_INT8, b"".join(k.encode().ljust(width, b"\0") for k in value), order)
        body += b"".join(_matrix("", v, order) for v in value.values())
    else:
        data = value.ravel(order="F").astype(value.dtype.newbyteorder(order)).tobytes()
        body += _element(MI_UINT8 if cls == MX_UINT8 else MI_DOUBLE, data, order)
    return _element(MI_MATRIX, body, order)


def write_affnist(path: Path, digits: np.ndarray, labels: np.ndarray, *, order: str = "<", compress: bool = False,
                  one_of_n: bool = False) -> Path:
    """affNIST's layout: image 1600 x N (each column one digit, its 40x40 pixels row after row), labels 1 x N."""
    fields = {"image": digits.reshape(len(digits), 1600).T.copy()}
    if one_of_n:
        fields["label_one_of_n"] = np.eye(10, dtype=np.float64)[labels].T.copy()
    else:
        fields["label_int"] = labels.astype(np.uint8).reshape(1, -1)
    element = _matrix("affNISTdata", fields, order)
    if compress:
        packed = zlib.compress(element)
        element = struct.pack(order + "II", MI_COMPRESSED, len(packed)) + packed
    path.write_bytes(_header(order) + element)
    return path


@pytest.fixture
def digits():
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, size=(7, 40, 40), dtype=np.uint8), rng.integers(0, 10, size=7)


@pytest.mark.parametrize("order, compress, one_of_n", [("<", False, False), ("<", True, False), (">", False, True),
                                                        (">", True, False)])
def test_affnist_round_trip(tmp_path, digits, order, compress, one_of_n):
    images, labels = digits
    path = write_affnist(tmp_path / "test.mat", images, labels, order=order, compress=compress, one_of_n=one_of_n)
    ds = load_affnist(path)
    assert ds.images.shape == (7, 1, 40, 40) and str(ds.images.dtype) == "torch.uint8"
    assert np.array_equal(ds.images[:, 0].numpy(), images)  # upright: row r of the digit is row r of the image
    assert ds.labels.tolist() == labels.tolist()
    assert ds.split == "test"


def test_read_mat_gives_matlab_shapes(tmp_path, digits):
    images, labels = digits
    variables = read_mat(write_affnist(tmp_path / "a.mat", images, labels))
    data = variables["affNISTdata"]
    assert data["image"].shape == (1600, 7) and data["label_int"].shape == (1, 7)
    assert np.array_equal(data["image"][:, 2], images[2].ravel())


def test_bad_files_are_explained(tmp_path, digits):
    images, labels = digits
    good = write_affnist(tmp_path / "good.mat", images, labels).read_bytes()
    cases = {
        "short.mat": (b"MATLAB", "shorter than the 128-byte header"),
        "text.mat": (b"x" * 200, "no 'MATLAB 5.0 MAT-file' header"),
        "hdf5.mat": (b"MATLAB 7.3 MAT-file".ljust(512, b" ") + b"\x89HDF\r\n\x1a\n" + b"\0" * 64, "v7.3 (HDF5)"),
        "truncated.mat": (good[: len(good) - 100], "runs past the end (truncated file?)"),
    }
    for name, (content, message) in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(DataError, match=re.escape(message)):
            load_affnist(tmp_path / name)
    packed = bytearray(write_affnist(tmp_path / "z.mat", images, labels, compress=True).read_bytes())
    packed[140:150] = b"\xff" * 10
    (tmp_path / "z.mat").write_bytes(bytes(packed))
    with pytest.raises(DataError, match="compressed element at byte 128 is damaged"):
        load_affnist(tmp_path / "z.mat")
    with pytest.raises(DataError, match="cannot read"):
        load_affnist(tmp_path / "missing.mat")
    # affNIST as published (test.mat.zip, test_batches.zip), and its batches' folder given whole: said what to give
    # (they were "no 'MATLAB 5.0 MAT-file' header" and "[Errno 21] Is a directory": a review, 2026-12-03)
    import zipfile

    with zipfile.ZipFile(tmp_path / "test.mat.zip", "w") as z:
        z.writestr("test.mat", good)
    with pytest.raises(DataError, match=r"test.mat.zip is a zip archive, not a .mat file: unzip it"):
        load_affnist(tmp_path / "test.mat.zip")
    (tmp_path / "test_batches").mkdir()
    for k in (1, 2):
        (tmp_path / "test_batches" / f"{k}.mat").write_bytes(good)
    with pytest.raises(DataError, match=r"test_batches is a folder; give its .mat files \(.*test_batches/\*\.mat: "
                                        r"1\.mat, 2\.mat\)"):
        load_affnist(tmp_path / "test_batches")


def test_every_damaged_header_byte_is_a_data_error(tmp_path, digits):
    """A struct short of a field, a field name of latin-1 bytes or a header byte flipped escaped as StopIteration,
    UnicodeDecodeError or a bare ValueError, a traceback from capsnet eval --affnist (a review, 2026-11-30)."""
    import random

    images, labels = digits
    good = write_affnist(tmp_path / "good.mat", images[:2], labels[:2]).read_bytes()
    draw, seen = random.Random(0), 0
    for k in range(400):
        data = bytearray(good)
        data[draw.randrange(128, 400)] = draw.randrange(256)
        (tmp_path / "x.mat").write_bytes(bytes(data))
        try:
            load_affnist(tmp_path / "x.mat")
        except DataError as e:
            seen += 1
            assert str(tmp_path / "x.mat") in str(e)
    assert seen > 100  # most flips in the headers are found out, each as a DataError naming the file
    order = "<"
    struct = _matrix("affNISTdata", {"image": np.zeros((1600, 1), np.uint8), "label_int": np.zeros((1, 1), np.uint8)},
                     order)
    (tmp_path / "short.mat").write_bytes(_header(order) + struct[:-40])  # the struct cut at its last element
    with pytest.raises(DataError, match="is not a readable MATLAB v5 .mat file"):
        load_affnist(tmp_path / "short.mat")


def test_files_that_are_not_affnist(tmp_path, digits):
    order = "<"
    other = _header(order) + _matrix("x", np.zeros((3, 4)), order)
    (tmp_path / "other.mat").write_bytes(other)
    with pytest.raises(DataError, match=r"holds \['x'\] but no affNISTdata struct"):
        load_affnist(tmp_path / "other.mat")
    small = np.zeros((2, 28, 28), np.uint8)
    (tmp_path / "mnist.mat").write_bytes(_header(order) + _matrix(
        "affNISTdata", {"image": small.reshape(2, 784).T.copy(), "label_int": np.zeros((1, 2), np.uint8)}, order))
    with pytest.raises(DataError, match=r"should be 1600 x N .* got \(784, 2\)"):
        load_affnist(tmp_path / "mnist.mat")
    images, _ = digits
    (tmp_path / "labels.mat").write_bytes(_header(order) + _matrix(
        "affNISTdata", {"image": images.reshape(7, 1600).T.copy(), "label_int": np.full((1, 7), 12, np.uint8)}, order))
    with pytest.raises(DataError, match=r"expected 7 whole-number labels in 0..9, got 7 in 12..12"):
        load_affnist(tmp_path / "labels.mat")


def test_hostile_files_are_refused_quickly_with_one_line(tmp_path):
    """Found by fuzzing (2026-11-30): a 216-byte file declaring a 65535 x 65535 struct of no fields looped 4.3e9
    times and grew by gigabytes (eval --affnist hung); character labels, NaN or fractional labels, complex or NaN
    images and an empty image ended in numpy's tracebacks or loaded as wrong labels (NaN as -2**63)."""
    import resource
    import time

    order = "<"
    body = _element(MI_UINT32, struct.pack(order + "II", MX_STRUCT, 0), order)
    body += _element(MI_INT32, struct.pack(order + "2i", 65535, 65535), order)
    body += _element(MI_INT8, b"affNISTdata", order)
    body += _element(MI_INT32, struct.pack(order + "i", 32), order)
    body += _element(MI_INT8, b"", order)  # no field names
    (tmp_path / "nofields.mat").write_bytes(_header(order) + _element(MI_MATRIX, body, order))
    peak, start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.monotonic()
    with pytest.raises(DataError, match=r"struct 'affNISTdata' declares 4,294,836,225 items in \d+ bytes"):
        load_affnist(tmp_path / "nofields.mat")
    assert time.monotonic() - start < 30 and resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 200_000
    images = np.zeros((1600, 3), np.uint8)
    for name, fields, said in (
            ("nan.mat", {"image": images, "label_int": np.array([[np.nan, 2.0, 3.0]])}, "not whole numbers"),
            ("frac.mat", {"image": images, "label_int": np.array([[2.5, 2.0, 3.0]])}, "not whole numbers"),
            ("nanimage.mat", {"image": np.full((1600, 3), np.nan), "label_int": np.array([[1.0, 2.0, 3.0]])},
             "NaN or infinite"),
            ("empty.mat", {"image": np.zeros((1600, 0)), "label_int": np.zeros((1, 0))}, None)):
        (tmp_path / name).write_bytes(_header(order) + _matrix("affNISTdata", fields, order))
        if said is None:
            assert len(load_affnist(tmp_path / name)) == 0  # an empty set: no max() of nothing
        else:
            with pytest.raises(DataError, match=said):
                load_affnist(tmp_path / name)
