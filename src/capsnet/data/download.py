"""Download one file from a list of mirrors: retried, checked by MD5, atomic.

The bytes stream into ``<dest>.part-<random>`` in the destination folder, are
checked (MD5 of the downloaded bytes, of the gunzipped contents, or both), and
only then renamed onto ``dest`` with os.replace. Whatever goes wrong, the
part file is removed: a folder never holds half a download under either name.
urllib only, so the library needs no HTTP dependency.
"""
from __future__ import annotations

import gzip
import hashlib
import http.client
import logging
import os
import secrets
import sys
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Sequence
from pathlib import Path

from tqdm import tqdm

from .idx import GZIP_MAGIC, DataError

__all__ = ["download_file", "BACKOFF_S"]

log = logging.getLogger(__name__)

BACKOFF_S = 1.0  # s, pause before the first retry of a mirror; doubles each retry (tests set ~0)
_CHUNK = 1 << 16  # bytes per read; small enough for a smooth progress bar
_USER_AGENT = "capsnet (python urllib)"  # some mirrors refuse urllib's default agent


class _MirrorFailed(Exception):
    """A failure that retrying the same URL will not fix (404, wrong checksum)."""


def download_file(
    urls: str | Sequence[str],
    dest: str | os.PathLike,
    *,
    md5: str | None = None,
    md5_uncompressed: str | None = None,
    retries: int = 3,
    timeout: float = 30.0,
    progress: bool = True,
    backoff: float | None = None,
) -> Path:
    """Download ``dest`` from the first of ``urls`` that delivers good bytes.

    Args:
        urls: one URL or mirrors to try in turn, each a full URL of the file.
        dest: where the file goes; its folder is created if needed.
        md5: expected MD5 of the downloaded bytes (e.g. of the .gz file).
        md5_uncompressed: expected MD5 of the contents after gunzip (of the
            bytes as they are when the download is not gzip); this one
            survives mirrors that re-compress.
        retries: extra attempts per mirror after a network error or a 5xx;
            a 4xx or a checksum mismatch moves on to the next mirror at once.
        timeout: seconds without progress before a connection is given up.
        progress: show a tqdm bar on stderr.
        backoff: seconds before the first retry, doubling after; None takes
            the module's ``BACKOFF_S``.

    Returns ``dest``. Raises DataError naming every URL and its error when no
    mirror delivers, with the offline way out.
    """
    url_list = [urls] if isinstance(urls, str) else list(urls)
    if not url_list:
        raise ValueError("download_file needs at least one URL")
    if retries < 0:
        raise ValueError(f"retries must be >= 0, got {retries}")
    pause = BACKOFF_S if backoff is None else backoff
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)

    failures: list[str] = []
    for url in url_list:
        for attempt in range(retries + 1):
            if attempt:
                time.sleep(pause * 2 ** (attempt - 1))
            try:
                _fetch(url, dest, md5=md5, md5_uncompressed=md5_uncompressed,
                       timeout=timeout, progress=progress)
                return dest
            except _MirrorFailed as err:
                error = str(err)
                break
            except urllib.error.HTTPError as err:
                error = f"HTTP {err.code} {err.reason}"
                if 400 <= err.code < 500 and err.code not in (408, 429):
                    break  # the mirror does not have it; asking again will not help
            except urllib.error.URLError as err:
                error = f"{type(err.reason).__name__}: {err.reason}"
            except (OSError, http.client.HTTPException) as err:
                error = f"{type(err).__name__}: {err}"
            except ValueError as err:  # urllib's "unknown url type" and friends
                error = f"{type(err).__name__}: {err}"
                break
            log.warning("download of %s failed (attempt %d of %d): %s",
                        url, attempt + 1, retries + 1, error)
        failures.append(f"  {url}: {error}")
        log.warning("giving up on %s: %s", url, error)

    raise DataError(
        f"could not download {dest.name} from any mirror:\n" + "\n".join(failures) + "\n"
        f"Check the internet connection, or fetch the file yourself and put it at {dest}; "
        "a folder holding the data sets (one sub-folder per set, e.g. mnist/) can be given "
        "with --data-dir or the CAPSNET_DATA environment variable."
    )


def _fetch(
    url: str, dest: Path, *, md5: str | None, md5_uncompressed: str | None,
    timeout: float, progress: bool,
) -> None:
    """One attempt: stream ``url`` to a part file, verify, rename onto ``dest``."""
    part = dest.with_name(f"{dest.name}.part-{secrets.token_hex(4)}")
    try:
        request = urllib.request.Request(url, headers={"User-Agent": _USER_AGENT})
        with urllib.request.urlopen(request, timeout=timeout) as response, open(part, "xb") as out:
            length = response.headers.get("Content-Length")
            size = int(length) if length and length.isdigit() else None
            digest = hashlib.md5(usedforsecurity=False)
            received = 0
            with tqdm(total=size, desc=dest.name, unit="B", unit_scale=True, unit_divisor=1024,
                      file=sys.stderr, disable=not progress, leave=False) as bar:
                while chunk := response.read(_CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    received += len(chunk)
                    bar.update(len(chunk))
        # http.client's read(n) returns b"" on a dropped connection instead of
        # raising IncompleteRead, so the length has to be checked here.
        if size is not None and received != size:
            raise ConnectionError(f"connection closed after {received} of {size} bytes")
        if md5 is not None and digest.hexdigest() != md5.lower():
            raise _MirrorFailed(f"MD5 of the download is {digest.hexdigest()}, expected {md5}")
        if md5_uncompressed is not None:
            content = _content_md5(part)
            if content != md5_uncompressed.lower():
                raise _MirrorFailed(
                    f"MD5 of the uncompressed contents is {content}, expected {md5_uncompressed}"
                )
        os.replace(part, dest)
        log.info("downloaded %s from %s (%d bytes)", dest, url, received)
    finally:
        part.unlink(missing_ok=True)  # gone already after os.replace


def _content_md5(path: Path) -> str:
    """MD5 of the file's contents, gunzipped when it starts with the gzip magic."""
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as raw:
        is_gzip = raw.read(2) == GZIP_MAGIC
    try:
        with (gzip.open(path, "rb") if is_gzip else open(path, "rb")) as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    except (EOFError, gzip.BadGzipFile, zlib.error) as err:
        raise _MirrorFailed(f"corrupt or truncated gzip ({err})") from err
    return digest.hexdigest()
