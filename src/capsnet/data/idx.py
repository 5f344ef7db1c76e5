"""Read and write IDX files, the format MNIST and Fashion-MNIST ship in.

An IDX file is a 4-byte magic number, one big-endian uint32 per dimension,
then the values in C order, big-endian (LeCun, Cortes and Burges, the MNIST
page, "file formats")::

    0x00 0x00 <dtype code> <ndim> | dim_0 ... dim_{ndim-1} | data

Files may be gzip-compressed. :func:`read_idx` tells gzip from raw by the
gzip magic bytes, never by the file name, because renamed, re-compressed and
gunzipped copies are common. Every check names the file, says what is wrong
and what to do, and raises :class:`DataError`.
"""
from __future__ import annotations

import contextlib
import gzip
import os
import secrets
import zlib
from pathlib import Path
from typing import BinaryIO, Iterator

import numpy as np

from .._files import replace_file

__all__ = ["DataError", "read_idx", "write_idx", "read_idx_bytes", "decode_idx", "encode_idx"]

GZIP_MAGIC = b"\x1f\x8b"
_READ_CHUNK = 1 << 20  # bytes decompressed per read

# IDX type codes (the MNIST page). Values are stored big-endian.
_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_CODES: dict[np.dtype, int] = {dt.newbyteorder("="): code for code, dt in _DTYPES.items()}


class DataError(ValueError):
    """A data file or data set is missing, corrupt or not what was asked for.

    Defined here, at the bottom of ``capsnet.data``, so that every data module
    can raise it without import cycles; re-exported as ``capsnet.data.DataError``.
    The message names the file, says what is wrong and what to do about it.
    """


def read_idx_bytes(path: str | os.PathLike, *, max_size: int | None = None) -> bytes:
    """The uncompressed contents of an IDX file, gunzipped if it is gzip.

    This is what published MD5s are computed on, so re-compressed copies can
    be checked against them. Nothing past the size the file's IDX header
    declares is read or decompressed: a file whose contents run on (a gzip
    bomb of 2 GiB of zeros under an MNIST name, a file with trailing bytes)
    is refused as soon as its contents pass that size, and one whose header
    declares more than ``max_size`` bytes, or that does not start with an IDX
    header, before anything beyond the header is read. Raises DataError for
    these and for an empty or corrupt gzip file; OSError if the file cannot
    be read at all.
    """
    path = Path(path)
    with open_maybe_gzipped(path) as f:
        if isinstance(f, gzip.GzipFile):
            return _read_declared(f, path, max_size, None)
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise DataError(f"{path}: the file is empty; delete it and download or copy it again")
        return _read_declared(f, path, max_size, size)


@contextlib.contextmanager
def open_maybe_gzipped(path: Path) -> Iterator[BinaryIO]:
    """``path`` open for reading, through gzip when it starts with gzip's magic bytes (whatever its name says); a
    gzip stream cut short or damaged while it is read inside the block is a DataError naming the file and the fix,
    not a raw EOFError or zlib.error."""
    with open(path, "rb") as f:
        gzipped = f.read(2) == GZIP_MAGIC
        f.seek(0)
        if not gzipped:
            yield f
            return
        try:
            with gzip.GzipFile(fileobj=f, mode="rb") as stream:
                yield stream
        except (EOFError, gzip.BadGzipFile, zlib.error) as err:
            # EOFError: cut short; BadGzipFile: bad header or CRC; zlib.error: bad stream.
            raise DataError(f"{path}: corrupt or truncated gzip file ({err}); delete it and download or copy it "
                            f"again") from err


MAX_IDX_DIMS = 4  # MNIST's and Fashion-MNIST's files have 1 or 3; a header past this is likely damaged


def _read_declared(stream: BinaryIO, path: Path, max_size: int | None, file_size: int | None) -> bytes:
    """Read the IDX header, then exactly the data it declares; DataError if the stream holds more.

    ``file_size`` is the size of a raw (not gzip) file, None for a gzip stream,
    whose size is known only by decompressing it.
    """
    head = stream.read(4)
    if len(head) < 4 or head[:2] != b"\x00\x00" or head[2] not in _DTYPES or head[3] == 0:
        decode_idx(head, source=str(path))  # raises: says what is wrong with the header
    ndim = head[3]
    head += stream.read(4 * ndim)
    if len(head) < 4 + 4 * ndim:
        decode_idx(head, source=str(path))  # raises: truncated header
    dims = tuple(int(d) for d in np.frombuffer(head, dtype=">u4", count=ndim, offset=4))
    dtype = _DTYPES[head[2]]
    declared = len(head) + int(np.prod(dims, dtype=object)) * dtype.itemsize
    # a damaged byte 3 reads pixels as dimensions ("trailing bytes after the data of shape (10000, 28, 28, 0, 0, 0,
    # 0, 0, 0)"): said as the likely cause
    damaged = "" if ndim <= MAX_IDX_DIMS else (f" (its header's byte 3 declares {ndim} dimensions, where MNIST's and "
                                               f"Fashion-MNIST's files have 1 or 3: a damaged header)")
    fix = f"it is not a valid IDX file{damaged}; delete it and download or copy it again"
    if max_size is not None and declared > max_size:
        raise DataError(
            f"{path}: the IDX header declares shape {dims} of {dtype.name}, {declared:,} bytes; "
            f"no file here holds more than {max_size:,}, so {fix}"
        )
    if file_size is not None and file_size > declared:  # raw: the size is known without reading
        raise DataError(
            f"{path}: {file_size - declared} trailing bytes after the data of shape {dims}; {fix}"
        )
    want = declared - len(head)
    if file_size is not None:
        want = min(want, file_size - len(head))  # a truncated raw file: decode_idx says so
    # In chunks, not read(want): a header may declare far more than the file holds, and read(n)
    # allocates n bytes before reading any.
    chunks, got = [head], 0
    while got < want:
        chunk = stream.read(min(want - got, _READ_CHUNK))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    data = b"".join(chunks)
    if len(data) == declared and stream.read(1):  # at the end of a gzip stream this also checks its CRC
        # a gzip file's damaged bytes decompress to other, often more, data before its CRC is reached
        damaged = " (or its compressed data is damaged: a changed byte decompresses to other data)" if \
            file_size is None else ""
        raise DataError(
            f"{path}: the uncompressed contents run past the {declared:,} bytes its IDX header "
            f"declares (shape {dims} of {dtype.name}), so decompression stopped there{damaged}: {fix}"
        )
    return data


def decode_idx(data: bytes, *, source: str = "<bytes>") -> np.ndarray:
    """Parse the uncompressed bytes of an IDX file into a native-endian array.

    ``source`` names the file in error messages. The returned array is a
    writable copy in native byte order, with the IDX dimensions as its shape.
    """
    fix = "it is not a valid IDX file; delete it and download or copy it again"
    if len(data) < 4:
        raise DataError(f"{source}: {len(data)} bytes is too short for an IDX header; {fix}")
    zero, code, ndim = data[:2], data[2], data[3]
    if zero != b"\x00\x00":
        raise DataError(
            f"{source}: not an IDX file (starts with {data[:4]!r}, an IDX file starts "
            f"with 0x00 0x00 <dtype> <ndim>); {fix}"
        )
    if code not in _DTYPES:
        known = ", ".join(f"0x{c:02X}" for c in _DTYPES)
        raise DataError(f"{source}: unknown IDX dtype code 0x{code:02X} (known: {known}); {fix}")
    if ndim == 0:
        raise DataError(f"{source}: the IDX header declares 0 dimensions; {fix}")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataError(
            f"{source}: truncated header ({len(data)} bytes, {ndim} dimensions need {header}); {fix}"
        )
    dims = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    dtype = _DTYPES[code]
    expected = int(np.prod(dims, dtype=object)) * dtype.itemsize
    actual = len(data) - header
    if actual < expected:
        raise DataError(
            f"{source}: truncated: shape {dims} of {dtype.name} needs {expected} data bytes, "
            f"the file has {actual}; {fix}"
        )
    if actual > expected:
        raise DataError(
            f"{source}: {actual - expected} trailing bytes after the data of shape {dims}; {fix}"
        )
    values = np.frombuffer(data, dtype=dtype, count=expected // dtype.itemsize, offset=header)
    # astype copies: frombuffer's view is read-only and big-endian, torch wants neither.
    return values.reshape(dims).astype(dtype.newbyteorder("="))


def read_idx(path: str | os.PathLike, *, max_size: int | None = None) -> np.ndarray:
    """Read an IDX file, gzip or raw, into a numpy array.

    ``max_size`` (bytes, uncompressed) refuses a file whose header declares
    more, before reading it (see :func:`read_idx_bytes`).

    Shapes:
        returns the dimensions stored in the file, e.g. (N, 28, 28) uint8 for
        MNIST images and (N,) uint8 for labels.
    """
    return decode_idx(read_idx_bytes(path, max_size=max_size), source=str(path))


def encode_idx(array: np.ndarray, *, source: str = "<array>") -> bytes:
    """The IDX bytes (uncompressed) of ``array``; ``source`` names it in errors."""
    array = np.asarray(array)
    native = array.dtype.newbyteorder("=")
    if native not in _CODES:
        supported = ", ".join(dt.newbyteorder("=").name for dt in _DTYPES.values())
        raise DataError(
            f"{source}: IDX cannot store dtype {array.dtype.name} (supported: {supported}); "
            "convert the array first"
        )
    if array.ndim == 0 or array.ndim > 255:
        raise DataError(f"{source}: IDX stores 1 to 255 dimensions, the array has {array.ndim}")
    if any(d >= 2**32 for d in array.shape):
        raise DataError(f"{source}: IDX dimensions are uint32, shape {array.shape} does not fit")
    code = _CODES[native]
    header = bytes([0, 0, code, array.ndim]) + np.asarray(array.shape, dtype=">u4").tobytes()
    return header + np.ascontiguousarray(array, dtype=_DTYPES[code]).tobytes()


def write_idx(path: str | os.PathLike, array: np.ndarray, compress: bool | None = None) -> Path:
    """Write ``array`` as an IDX file, atomically (temp file, then os.replace).

    ``compress=None`` gzips when the name ends in ``.gz``. The gzip stream has
    no name and mtime 0, so the same array always gives the same bytes (with
    the same zlib), which keeps tools/make_mnist_sample.py reproducible.
    A crash mid-write leaves the old file, or none, never half a file.
    Returns the path written.
    """
    path = Path(path)
    data = encode_idx(array, source=str(path))
    if compress is None:
        compress = path.suffix == ".gz"
    if compress:
        data = gzip.compress(data, compresslevel=9, mtime=0)
    # Same folder as the target so os.replace is a rename, not a copy; "xb"
    # (not mkstemp) so the file gets the usual umask permissions, not 0600.
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        replace_file(tmp, path)  # (Windows: a reader or scanner holding the file is waited for)
    finally:
        tmp.unlink(missing_ok=True)
    return path
