"""IDX reading and writing: round trips, a byte-exact reference, every corruption."""
from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest

from capsnet.data import DataError, read_idx, write_idx
from capsnet.data.idx import decode_idx


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64])
@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4)])
@pytest.mark.parametrize("compress", [False, True])
def test_round_trip(tmp_path, dtype, shape, compress):
    rng = np.random.default_rng(0)
    array = (rng.standard_normal(shape) * 100).astype(dtype)
    path = write_idx(tmp_path / "a.idx", array, compress=compress)
    assert (path.read_bytes()[:2] == b"\x1f\x8b") == compress
    back = read_idx(path)
    assert back.dtype == np.dtype(dtype) and back.shape == shape
    np.testing.assert_array_equal(back, array)
    assert back.flags.writeable and back.dtype.isnative
    assert [p.name for p in tmp_path.iterdir()] == ["a.idx"]  # no temp file left


def test_bytes_match_the_format_by_hand(tmp_path):
    # Reference written from the spec with struct, independent of write_idx.
    array = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int32)
    expected = bytes([0, 0, 0x0C, 2]) + struct.pack(">II", 2, 3) + struct.pack(">6i", *range(1, 7))
    write_idx(tmp_path / "a", array)
    assert (tmp_path / "a").read_bytes() == expected
    (tmp_path / "b").write_bytes(expected)
    np.testing.assert_array_equal(read_idx(tmp_path / "b"), array)


def test_compression_follows_suffix_and_reading_follows_magic(tmp_path):
    array = np.arange(12, dtype=np.uint8).reshape(3, 4)
    gz = write_idx(tmp_path / "x.gz", array)
    assert gz.read_bytes()[:2] == b"\x1f\x8b"
    # Renamed both ways: detection is by content, not by name.
    (tmp_path / "gz-without-suffix").write_bytes(gz.read_bytes())
    raw = write_idx(tmp_path / "raw-with-suffix.gz", array, compress=False)
    assert raw.read_bytes()[:2] == b"\x00\x00"
    np.testing.assert_array_equal(read_idx(tmp_path / "gz-without-suffix"), array)
    np.testing.assert_array_equal(read_idx(raw), array)


def test_real_mnist_labels(data_root):
    labels = read_idx(data_root / "mnist" / "t10k-labels-idx1-ubyte.gz")
    assert labels.shape == (10000,) and labels.dtype == np.uint8
    assert labels[:5].tolist() == [7, 2, 1, 0, 4]


def test_write_replaces_atomically_and_refuses_bad_arrays(tmp_path):
    path = tmp_path / "a.idx"
    write_idx(path, np.zeros(3, np.uint8))
    write_idx(path, np.ones(4, np.uint8))
    assert read_idx(path).tolist() == [1, 1, 1, 1]
    with pytest.raises(DataError, match="int64"):
        write_idx(tmp_path / "b.idx", np.zeros(3, np.int64))
    with pytest.raises(DataError, match="dimensions"):
        write_idx(tmp_path / "c.idx", np.array(3, np.uint8))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.idx"]


def _good() -> bytes:
    return bytes([0, 0, 0x08, 2]) + struct.pack(">II", 2, 3) + bytes(range(6))


CORRUPT = {
    "empty": (b"", "empty"),
    "wrong magic": (b"\x01\x02" + _good()[2:], "not an IDX file"),
    "png": (b"\x89PNG\r\n\x1a\n" + bytes(50), "not an IDX file"),
    "text": (b"hello, this is not data\n", "not an IDX file"),
    "unknown dtype": (bytes([0, 0, 0x0A, 2]) + _good()[4:], "dtype code 0x0A"),
    "zero dims": (bytes([0, 0, 0x08, 0]), "0 dimensions"),
    "short header": (bytes([0, 0, 0x08, 3]) + struct.pack(">I", 2), "truncated header"),
    "truncated data": (_good()[:-1], "truncated"),
    "trailing bytes": (_good() + b"\x00\x00", "2 trailing bytes"),
    "truncated gzip": (gzip.compress(_good() * 50)[:-12], "gzip"),
    "corrupt gzip": (lambda g: g[:20] + bytes([g[20] ^ 0xFF]) + g[21:])(gzip.compress(bytes(300))),
}


@pytest.mark.parametrize("case", sorted(CORRUPT))
@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_corrupt_files_raise_data_error_naming_the_file(tmp_path, case, suffix):
    content = CORRUPT[case]
    content, words = content if isinstance(content, tuple) else (content, "gzip")
    path = tmp_path / f"bad-{case.replace(' ', '-')}{suffix}"
    path.write_bytes(content)
    with pytest.raises(DataError, match=words) as info:
        read_idx(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value, ValueError)


def test_corrupt_gzip_contents_are_checked_like_raw(tmp_path):
    path = tmp_path / "x.gz"
    path.write_bytes(gzip.compress(_good()[:-2]))
    with pytest.raises(DataError, match="truncated") as info:
        read_idx(path)
    assert str(path) in str(info.value)


def test_decode_reports_source():
    with pytest.raises(DataError, match="somewhere.idx: not an IDX file"):
        decode_idx(b"abcdefgh", source="somewhere.idx")
