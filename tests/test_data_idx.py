"""IDX reading and writing: round trips, a byte-exact reference, every corruption."""
from __future__ import annotations

import gzip
import re
import struct
import subprocess
import sys
import textwrap
import tracemalloc
import zlib

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
    "truncated data": (_good()[:-1], "truncated"),  # each reason is matched with the file's name taken out
    "trailing bytes": (_good() + b"\x00\x00", "2 trailing bytes"),
    "truncated gzip": (gzip.compress(bytes([0, 0, 0x08, 1]) + struct.pack(">I", 700) + bytes(range(100)) * 7)[:-12],
                       "corrupt or truncated gzip file"),
    "gzip runs past its header": (gzip.compress(_good() * 50), "run past the 18 bytes its IDX header declares"),
    # one byte flipped in a stream that decompresses past the header's size before its CRC is reached: the damage
    # named beside the header (a review, 2026-12-01, on a real MNIST file)
    "corrupt gzip past its header": ((lambda g: g[:118] + bytes([g[118] ^ 0xFF]) + g[119:])(gzip.compress(
        bytes([0, 0, 0x08, 1]) + struct.pack(">I", 3000) +
        np.random.default_rng(0).integers(0, 4, 3000, dtype=np.uint8).tobytes())),
        r"run past the 3,008 bytes .* \(or its compressed data is damaged"),
    # a valid header, then one byte of the stream flipped: read to its end, the CRC fails
    "corrupt gzip": ((lambda g: g[:1500] + bytes([g[1500] ^ 0xFF]) + g[1501:])(gzip.compress(
        bytes([0, 0, 0x08, 1]) + struct.pack(">I", 3000) + np.random.default_rng(0).bytes(3000))),
        "corrupt or truncated gzip file"),
}


@pytest.mark.parametrize("case", sorted(CORRUPT))
@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_corrupt_files_raise_data_error_naming_the_file(tmp_path, case, suffix):
    content, words = CORRUPT[case]
    path = tmp_path / f"bad-{case.replace(' ', '-')}{suffix}"
    path.write_bytes(content)
    with pytest.raises(DataError) as info:
        read_idx(path)
    message = str(info.value)
    assert str(path) in message and isinstance(info.value, ValueError)
    assert re.search(words, message.replace(str(path), "")), message  # the reason, not a word of the file's name


def test_corrupt_gzip_contents_are_checked_like_raw(tmp_path):
    path = tmp_path / "x.gz"
    path.write_bytes(gzip.compress(_good()[:-2]))
    with pytest.raises(DataError, match="truncated") as info:
        read_idx(path)
    assert str(path) in str(info.value)


def test_decode_reports_source():
    with pytest.raises(DataError, match="somewhere.idx: not an IDX file"):
        decode_idx(b"abcdefgh", source="somewhere.idx")


# ---------------------------------------------------------------- gzip bombs (issue 18)

GiB = 2**30
MNIST_TEST_IMAGES_HEADER = bytes([0, 0, 0x08, 3]) + struct.pack(">III", 10000, 28, 28)  # 7,840,016 bytes in all


def write_gzip_bomb(path, head: bytes, size: int) -> None:
    """A gzip file of ``head`` and then zeros, ``size`` bytes uncompressed, written in about size / 1000 bytes.

    Deflate blocks ended by a full flush are self-contained, so one compressed MiB of zeros is written
    again and again instead of compressing ``size`` bytes. The CRC and length in the trailer are left
    zero: a reader that gets that far has already decompressed everything, which is what is tested.
    """
    mib = 1 << 20
    first = zlib.compressobj(9, zlib.DEFLATED, -15)
    zeros = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = zeros.compress(bytes(mib)) + zeros.flush(zlib.Z_FULL_FLUSH)
    with open(path, "wb") as f:
        f.write(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff")  # gzip header: deflate, no name, mtime 0
        f.write(first.compress(head + bytes(mib - len(head))) + first.flush(zlib.Z_FULL_FLUSH))
        for _ in range(size // mib - 1):
            f.write(block)
        f.write(zlib.compressobj(9, zlib.DEFLATED, -15).flush())  # an empty final block
        f.write(bytes(8))  # CRC-32 and length: never reached


def test_gzip_bomb_helper_makes_what_it_says(tmp_path):
    path = tmp_path / "small-bomb.gz"
    write_gzip_bomb(path, b"abc", 8 << 20)
    raw = path.read_bytes()
    assert raw[:3] == b"\x1f\x8b\x08" and raw[-8:] == bytes(8)  # gzip header; the trailer left zero on purpose
    inflate = zlib.decompressobj(-15)
    data = inflate.decompress(raw[10:-8])
    assert inflate.eof and inflate.unused_data == b""  # one complete deflate stream
    assert len(data) == 8 << 20 and data[:3] == b"abc" and data.count(0) == len(data) - 3


@pytest.mark.parametrize("head, words", [
    (b"", "unknown IDX dtype code 0x00"),  # 2 GiB of zeros: no IDX header at all
    (MNIST_TEST_IMAGES_HEADER, "run past the 7,840,016 bytes its IDX header declares"),
    (bytes([0, 0, 0x08, 3]) + struct.pack(">III", 3_000_000, 28, 28), "no file here holds more than"),
], ids=["zeros", "mnist-header", "huge-header"])
def test_gzip_bomb_stops_at_the_declared_size(tmp_path, head, words):
    path = tmp_path / "t10k-images-idx3-ubyte.gz"
    write_gzip_bomb(path, head, 2 * GiB)
    assert path.stat().st_size < 3 << 20  # about 2 MB on disk
    tracemalloc.start()
    try:
        with pytest.raises(DataError, match=words) as info:
            read_idx(path, max_size=60000 * 28 * 28 + 16)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert str(path) in str(info.value)
    assert peak < 64 << 20, f"{peak:,} bytes held while reading a bomb"


def test_declared_size_over_the_maximum_is_refused_before_reading(tmp_path):
    path = write_idx(tmp_path / "big.idx", np.zeros((100, 10), np.uint8))
    with pytest.raises(DataError, match="declares shape .100, 10. of uint8, 1,012 bytes; no file here holds more than 1,011"):
        read_idx(path, max_size=1011)
    np.testing.assert_array_equal(read_idx(path, max_size=1012), np.zeros((100, 10), np.uint8))


@pytest.mark.parametrize("compress", [False, True])
def test_a_damaged_dimension_count_is_said_as_one_not_as_pixels_read_for_dimensions(tmp_path, compress):
    """Byte 3 of an image file set to 9: its pixels were read as six more dimensions, and the message spoke of
    "7839976 trailing bytes after the data of shape (10000, 28, 28, 0, 0, 0, 0, 0, 0)" (a review of the data
    paths, 2026-12-03)."""
    path = write_idx(tmp_path / "images.idx", np.zeros((10, 28, 28), np.uint8))
    raw = bytearray(path.read_bytes())
    raw[3] = 9
    path.write_bytes(gzip.compress(bytes(raw)) if compress else bytes(raw))
    with pytest.raises(DataError, match=r"images.idx: .*it is not a valid IDX file \(its header's byte 3 declares 9 "
                                        r"dimensions, where MNIST's and Fashion-MNIST's files have 1 or 3: a damaged "
                                        r"header\); delete it"):
        read_idx(path)
    # a valid file of more dimensions still reads (write_idx writes up to 255)
    many = np.arange(2 * 3 * 1 * 2 * 2, dtype=np.uint8).reshape(2, 3, 1, 2, 2)
    np.testing.assert_array_equal(read_idx(write_idx(tmp_path / "five.idx", many)), many)


def test_header_declaring_more_than_a_raw_file_holds_is_truncated_not_a_memory_error(tmp_path):
    path = tmp_path / "liar.idx"
    path.write_bytes(bytes([0, 0, 0x08, 3]) + struct.pack(">III", 2**32 - 1, 2**32 - 1, 2**32 - 1) + bytes(10))
    with pytest.raises(DataError, match="truncated"):
        read_idx(path)
    path.write_bytes(gzip.compress(path.read_bytes()))
    with pytest.raises(DataError, match="truncated"):
        read_idx(path)


def test_load_dataset_on_a_gzip_bomb_stays_small(tmp_path):
    """`capsnet eval` on a bomb named as MNIST's test images: a clear DataError, peak memory far under 1 GB.

    In a subprocess whose address space may grow by at most 1.5 GiB beyond what it has mapped after
    importing capsnet, so reading the whole bomb fails (MemoryError) instead of taking the machine's memory.
    """
    folder = tmp_path / "mnist"
    folder.mkdir()
    write_gzip_bomb(folder / "t10k-images-idx3-ubyte.gz", MNIST_TEST_IMAGES_HEADER, 2 * GiB)
    (folder / "t10k-labels-idx1-ubyte").write_bytes(bytes([0, 0, 8, 1]) + struct.pack(">I", 10000) + bytes(10000))
    script = textwrap.dedent(f"""
        import re, resource
        from capsnet.data import DataError, load_dataset
        vm = int(re.search(r"VmSize:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (vm + 3 * 2**29, resource.RLIM_INFINITY))
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
            load_dataset("mnist", "test", root={str(tmp_path)!r}, download=False)
            print("LOADED")
        except DataError as err:
            print("DATAERROR", err)
        print("GREW_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "DATAERROR" in out.stdout and "run past the 7,840,016 bytes its IDX header declares" in out.stdout
    grew = int(out.stdout.split("GREW_KB")[1])
    assert grew * 1024 < 256 << 20, f"peak memory grew by {grew:,} kB"  # the bound asked for is 1 GB


@pytest.mark.parametrize("code, payload, want", [
    (0x08, bytes([200, 7]), [200, 7]),
    (0x09, bytes([0xFF, 0x05]), [-1, 5]),
    (0x0B, bytes([0x01, 0x02, 0xFF, 0xFE]), [258, -2]),
    (0x0C, bytes([0x00, 0x01, 0x00, 0x00, 0xFF, 0xFF, 0xFF, 0xFF]), [65536, -1]),
    (0x0D, bytes([0x3F, 0xC0, 0x00, 0x00, 0xC0, 0x20, 0x00, 0x00]), [1.5, -2.5]),
    (0x0E, bytes([0x3F, 0xF8, 0, 0, 0, 0, 0, 0, 0x40, 0x09, 0x21, 0xFB, 0x54, 0x44, 0x2D, 0x18]),
     [1.5, 3.141592653589793]),
])
def test_each_idx_type_code_decodes_hand_written_big_endian_bytes(code, payload, want):
    """The MNIST page's type codes, big-endian, from bytes written by hand (round trips shared the table with the
    encoder, so a little-endian int16 or two float codes swapped passed: mutation testing, 2026-12-01)."""
    data = bytes([0, 0, code, 1]) + (2).to_bytes(4, "big") + payload
    got = decode_idx(data)
    assert got.shape == (2,) and got.tolist() == want
