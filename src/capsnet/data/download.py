"""Download one file from a list of mirrors: retried, checked by MD5, atomic, bounded in time.

The bytes stream into ``<dest>.part-<host>-<pid>-<random>`` in the destination
folder, are checked (MD5 of the downloaded bytes, of the gunzipped contents,
or both; a web page or a gzip cut short even unchecked), and only then renamed
onto ``dest`` with os.replace. Whatever goes wrong, the part file is removed,
on Ctrl-C and SIGTERM too (taken as Ctrl-C while the bytes stream, on the main
thread): a folder never holds half a download under either name. Only a kill
that runs no cleanup (SIGKILL, a power cut) leaves one, removed by the next
download of that file: at once when its writer ran on this machine and has
ended, else after an hour. One process downloads a file at a time: the others
wait on an ``flock`` of ``.<name>.lock`` beside it (which its holder removes;
a SIGKILL leaves it, empty and harmless) and then take the file if it passes
their checks. urllib only, so the library needs no HTTP dependency.

Failing fast: a host name that does not resolve, a refused or unreachable
connection, or a server that does not answer within ``timeout`` moves on to
the next mirror at once (asking the same one again would fail the same way);
a dropped connection or a 5xx is retried with backoff. And the whole call
gives up after ``TOTAL_TIMEOUT_S`` seconds without receiving a byte of the
file (a slow download that keeps arriving is never cut), so an unreachable
mirror set fails within a minute with the usual message.
"""
from __future__ import annotations

import contextlib
import errno
import gzip
import hashlib
import http.client
import logging
import os
import secrets
import socket
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Sequence
from pathlib import Path

from .._files import replace_file
from .._signals import sigterm_as_interrupt
from .._progress import progress_bar
from .idx import GZIP_MAGIC, DataError

__all__ = ["download_file", "file_md5", "DiskError", "BACKOFF_S", "TIMEOUT_S", "TOTAL_TIMEOUT_S"]


class DiskError(DataError):
    """A download that this machine's folder cannot take (read-only, full, over a quota or a file-size limit): no
    mirror, and no other file fetched into the same folder, would fare better."""

log = logging.getLogger(__name__)

BACKOFF_S = 1.0  # s, pause before the first retry of a mirror; doubles each retry (tests set ~0)
# s without a byte from a connection (connecting, waiting for the answer, between reads) before it is
# given up. Three silent mirrors cost 3 x 15 s, inside TOTAL_TIMEOUT_S.
TIMEOUT_S = 15.0
# s: the whole call gives up after this long without receiving a byte of the file, whatever is left to
# try; time while the file arrives does not count. Under a minute, as promised for an unreachable mirror set.
TOTAL_TIMEOUT_S = 50.0
# Connection errors that asking the same mirror again will not fix.
_UNREACHABLE_ERRNOS = {errno.ECONNREFUSED, errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EADDRNOTAVAIL,
                       errno.ENETDOWN, errno.EHOSTDOWN}
_CHUNK = 1 << 16  # bytes per read; small enough for a smooth progress bar
_USER_AGENT = "capsnet (python urllib)"  # some mirrors refuse urllib's default agent


class _MirrorFailed(Exception):
    """A failure that retrying the same URL will not fix (404, wrong checksum, too large)."""


class _Clock:
    """The call's deadline: TOTAL_TIMEOUT_S from the start or from the last byte of the file received."""

    def __init__(self, total: float) -> None:
        self.total = total
        self.deadline = time.monotonic() + total

    def progress(self) -> None:
        self.deadline = time.monotonic() + self.total

    def left(self) -> float:
        return self.deadline - time.monotonic()


def download_file(
    urls: str | Sequence[str],
    dest: str | os.PathLike,
    *,
    md5: str | None = None,
    md5_uncompressed: str | None = None,
    retries: int = 3,
    timeout: float | None = None,
    progress: bool = True,
    backoff: float | None = None,
    total_timeout: float | None = None,
    max_size: int | None = None,
) -> Path:
    """Download ``dest`` from the first of ``urls`` that delivers good bytes.

    Args:
        urls: one URL or mirrors to try in turn, each a full URL of the file.
        dest: where the file goes; its folder is created if needed.
        md5: expected MD5 of the downloaded bytes (e.g. of the .gz file).
        md5_uncompressed: expected MD5 of the contents after gunzip (of the
            bytes as they are when the download is not gzip); this one
            survives mirrors that re-compress.
        retries: extra attempts per mirror after a dropped connection or a
            5xx; a 4xx, a checksum mismatch, a name that does not resolve, a
            refused or unreachable connection and a timeout move on to the
            next mirror at once.
        timeout: seconds without progress before a connection is given up;
            None takes the module's ``TIMEOUT_S``.
        progress: show a tqdm bar on stderr.
        backoff: seconds before the first retry, doubling after; None takes
            the module's ``BACKOFF_S``.
        total_timeout: seconds without receiving a byte of the file after
            which the call gives up on every mirror left; None takes the
            module's ``TOTAL_TIMEOUT_S``.
        max_size: refuse a download, or its gunzipped contents, past this
            many bytes (a mirror serving a gzip bomb); None: no limit.

    Returns ``dest``. Raises DataError naming every URL and its error when no
    mirror delivers, with the offline way out.
    """
    url_list = [urls] if isinstance(urls, str) else list(urls)
    if not url_list:
        raise ValueError("download_file needs at least one URL")
    if retries < 0:
        raise ValueError(f"retries must be >= 0, got {retries}")
    pause = BACKOFF_S if backoff is None else backoff
    timeout = TIMEOUT_S if timeout is None else timeout
    dest = Path(dest)
    _writable_folder(dest)
    missing = not dest.exists()
    with _one_download_at_a_time(dest) as waited:
        # the other process fetched it meanwhile: taken if it passes this call's checks (that process may not have
        # checked it), else fetched again
        if waited and missing and dest.is_file() and _passes(dest, md5, md5_uncompressed, max_size):
            log.info("%s was downloaded by another process meanwhile", dest)
            return dest
        clock = _Clock(TOTAL_TIMEOUT_S if total_timeout is None else total_timeout)  # from here: not the wait's time
        return _download(url_list, dest, md5=md5, md5_uncompressed=md5_uncompressed, retries=retries,
                         timeout=timeout, progress=progress, pause=pause, clock=clock, max_size=max_size)


def file_md5(path: str | os.PathLike) -> str:
    """The MD5 of a file's bytes as they are on disk (not gunzipped), read a MiB at a time."""
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _passes(path: Path, md5: str | None, md5_uncompressed: str | None, max_size: int | None) -> bool:
    """Whether the file at ``path`` has the MD5s given (of its bytes, of its gunzipped contents); True given none."""
    try:
        if md5 is not None and file_md5(path) != md5.lower():
            return False
        return md5_uncompressed is None or _content_md5(path, max_size) == md5_uncompressed.lower()
    except (OSError, _MirrorFailed):
        return False


@contextlib.contextmanager
def _one_download_at_a_time(dest: Path):
    """Hold an advisory lock (``flock``) on ``.NAME.lock`` beside ``dest`` while it is downloaded, so two processes
    needing one file (``capsnet experiment --jobs 2`` on a first run, two trainings started together) fetch it once:
    the second waits, then finds it. Yields whether it waited. Where there is no ``flock`` (Windows) or the file
    system refuses it, nothing is locked, as before."""
    try:
        import fcntl
    except ImportError:
        yield False
        return
    lock = dest.with_name(f".{dest.name}.lock")
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield False
        return
    held = waited = False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.warning("waiting for another process downloading %s", dest)
            fcntl.flock(fd, fcntl.LOCK_EX)  # (Ctrl-C while waiting: out through the finally, the lock not held)
            waited = True
        except OSError:  # a file system without locks (some network mounts): download unlocked
            yield False
            return
        held = True
        yield waited
    finally:
        # not left in the data folder: removed by its holder, if the file is still the one it holds (one that opened
        # it meanwhile and waits wakes to find the download; one arriving between the removal and the release makes
        # a lock of its own and at worst downloads the file again, as every process did before the lock). Never by a
        # process that did not get it: a waiter stopped by Ctrl-C removed the holder's lock
        if held:
            with contextlib.suppress(OSError):
                if os.path.samestat(os.fstat(fd), os.stat(lock)):
                    os.unlink(lock)
        os.close(fd)  # closing the descriptor drops the lock


def _download(url_list: list[str], dest: Path, *, md5: str | None, md5_uncompressed: str | None, retries: int,
              timeout: float, progress: bool, pause: float, clock: _Clock, max_size: int | None) -> Path:
    """``download_file``'s mirrors and attempts, under its lock."""
    _clear_stale_parts(dest)
    failures: list[str] = []
    for url in url_list:
        error = ""
        for attempt in range(retries + 1):
            if attempt:
                time.sleep(max(0.0, min(pause * 2 ** (attempt - 1), clock.left())))
            if clock.left() <= 0:
                error = (f"{error}; " if error else "") + \
                    f"not tried{' again' if attempt else ''}: {clock.total:.3g} s passed without a byte of the file"
                break
            wait = min(timeout, clock.left())
            try:
                with sigterm_as_interrupt():  # kill, timeout, a scheduler: the part file removed as on Ctrl-C
                    _fetch(url, dest, md5=md5, md5_uncompressed=md5_uncompressed,
                           timeout=wait, progress=progress, clock=clock, max_size=max_size)
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
                if isinstance(err.reason, TimeoutError):
                    error = f"no connection within {wait:.3g} s ({error})"
                if _unreachable(err.reason):
                    break  # no such host, refused, unreachable, silent: the next mirror, at once
            except TimeoutError as err:  # an answer or the next bytes did not come within the timeout
                error = f"no answer within {wait:.3g} s ({type(err).__name__}: {err})"
                break
            except (OSError, http.client.HTTPException) as err:
                if getattr(err, "errno", None) in _LOCAL_ERRNOS:  # the disk, not the mirror: no retry helps
                    fix = ("raise the file-size limit (ulimit -f) for this shell" if err.errno == errno.EFBIG else
                           "free space there, or download into another folder (XDG_CACHE_HOME, or --data-dir with "
                           "the files put there by hand)")
                    raise DiskError(f"cannot download {dest.name} into {dest.parent}: {err.strerror or err}; "
                                    f"{fix}") from None
                error = f"{type(err).__name__}: {err}"
                if _unreachable(err):
                    break
            except ValueError as err:  # urllib's "unknown url type" and friends
                error = f"{type(err).__name__}: {err}"
                break
            log.warning("download of %s failed (attempt %d of %d): %s",
                        url, attempt + 1, retries + 1, error)
        failures.append(f"  {url}: {error}")
        log.warning("giving up on %s: %s", url, error)

    check = (f" (the MD5 of its uncompressed contents: {md5_uncompressed})" if md5_uncompressed else
             f" (its MD5: {md5})" if md5 else "")
    raise DataError(
        f"could not download {dest.name} from any mirror:\n" + "\n".join(failures) + "\n"
        f"Check the internet connection and the mirrors' answers above, or fetch the file yourself and put it at "
        f"{dest}{check}; "
        "a folder holding the data sets (one sub-folder per set, e.g. mnist/) can be given "
        "with --data-dir or the CAPSNET_DATA environment variable."
    )


# writing the part file failed: no mirror will help (EFBIG: a file-size limit, ulimit -f)
_LOCAL_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EFBIG}

# a part file not written to for this long is a download that was killed (SIGTERM, SIGKILL, a power cut): the
# ``finally`` that removes it never ran; one being written gets a chunk at least every TIMEOUT_S
STALE_PART_S = 3600.0


def _writable_folder(dest: Path) -> None:
    """Make ``dest``'s folder and write a probe file there: a folder capsnet cannot write into (a read-only cache
    in a container) is one DataError at once, not every mirror's every attempt failing on the part file."""
    probe = dest.with_name(f".{dest.name}.probe-{secrets.token_hex(4)}")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        with open(probe, "xb"):
            pass
        probe.unlink()
    except OSError as err:
        raise DiskError(
            f"cannot download {dest.name}: {dest.parent} cannot be written ({err.strerror or err}); download into a "
            f"writable folder (capsnet's cache is $XDG_CACHE_HOME/capsnet, else ~/.cache/capsnet: set XDG_CACHE_HOME), "
            f"or put the data set's files in a folder given with --data-dir or CAPSNET_DATA") from None


def _part_name(dest: Path) -> Path:
    """A part file of ``dest`` named by its writer, HOST-PID, so that one a kill left behind is known at once."""
    return dest.with_name(f"{dest.name}.part-{_HOST}-{os.getpid()}-{secrets.token_hex(4)}")


_HOST = socket.gethostname().replace("/", "_") or "host"


def _writer_gone(part: Path, dest: Path) -> bool:
    """Whether ``part`` was written by a process of this machine that no longer runs (a SIGKILL, an OOM kill: its
    ``finally`` never ran). A part of another machine sharing the folder, or of an older capsnet (no writer in its
    name), is not known to be gone."""
    writer = part.name[len(f"{dest.name}.part-"):].rsplit("-", 2)
    if os.name == "nt" or len(writer) != 3 or writer[0] != _HOST or not writer[1].isdigit():
        return False  # (Windows: os.kill(pid, 0) sends CTRL_C_EVENT, it does not ask whether the process runs)
    try:
        os.kill(int(writer[1]), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):  # another user's process runs under that pid
        return False
    return False


def _clear_stale_parts(dest: Path) -> None:
    """Remove part files of ``dest`` left by downloads killed before they could clean up: those of a writer on this
    machine that has ended, at once (a 450 MB smallNORB part a kill left was kept an hour, and the next download
    wrote a second beside it), and any other once older than ``STALE_PART_S`` (a download in progress keeps writing
    to its own)."""
    now = time.time()
    for part in dest.parent.glob(f"{dest.name}.part-*"):
        try:
            if _writer_gone(part, dest) or now - part.stat().st_mtime > STALE_PART_S:
                part.unlink()
                log.info("removed %s, left by a download that was stopped", part)
        except OSError:  # gone already, or not ours to remove: the download goes on regardless
            pass


def _looks_like_html(path: Path) -> bool:
    with open(path, "rb") as f:
        head = f.read(512).lstrip().lower()
    return head.startswith((b"<!doctype html", b"<html", b"<?xml", b"<head", b"<body"))


def mirror_list(mirrors: str | Sequence[str] | None, default: Sequence[str]) -> tuple[str, ...]:
    """A loader's ``mirrors`` argument as base URLs: ``default`` for None, one URL given as a string as that one
    (``tuple("http://...")`` would be its characters), a list as it is; an empty list is a ValueError."""
    urls = tuple(default) if mirrors is None else (mirrors,) if isinstance(mirrors, str) else tuple(mirrors)
    if not urls or not all(isinstance(u, str) and u for u in urls):
        raise ValueError(f"mirrors must be base URLs (a string or a list of strings), got {mirrors!r}")
    return urls


def _unreachable(err: object) -> bool:
    """True for a connection error that the same URL will give again at once: the next mirror, not a retry."""
    if isinstance(err, (socket.gaierror, ConnectionRefusedError, TimeoutError)):
        return True  # name not resolved (also offline), refused, or a connect that timed out
    return isinstance(err, OSError) and err.errno in _UNREACHABLE_ERRNOS


def _fetch(
    url: str, dest: Path, *, md5: str | None, md5_uncompressed: str | None,
    timeout: float, progress: bool, clock: _Clock | None = None, max_size: int | None = None,
) -> None:
    """One attempt: stream ``url`` to a part file, verify, rename onto ``dest``."""
    part = _part_name(dest)
    try:
        request = urllib.request.Request(url, headers={"User-Agent": _USER_AGENT})
        with urllib.request.urlopen(request, timeout=timeout) as response, open(part, "xb") as out:
            length = response.headers.get("Content-Length")
            size = int(length) if length and length.isdigit() else None
            if max_size is not None and size is not None and size > max_size:
                raise _MirrorFailed(f"the mirror sends {size:,} bytes, more than the {max_size:,} the file has")
            digest = hashlib.md5(usedforsecurity=False)
            received = 0
            with progress_bar(total=size, desc=dest.name, unit="B", unit_scale=True, unit_divisor=1024,
                              progress=progress, leave=False, brief=False) as bar:
                while chunk := response.read(_CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    received += len(chunk)
                    bar.update(len(chunk))
                    if clock is not None:
                        clock.progress()
                    if max_size is not None and received > max_size:
                        raise _MirrorFailed(f"the download passed {max_size:,} bytes, more than the file has")
            out.flush()
            os.fsync(out.fileno())  # on disk before it takes the file's name: a power cut leaves no short file there
        # http.client's read(n) returns b"" on a dropped connection instead of
        # raising IncompleteRead, so the length has to be checked here.
        if size is not None and received != size:
            raise ConnectionError(f"connection closed after {received} of {size} bytes")
        wrong = md5 is not None and digest.hexdigest() != md5.lower()
        # a login, error or moved page sent with status 200: no data file starts so, checked or not (unchecked, it
        # took the file's name, and every later run trusted it)
        if _looks_like_html(part):
            raise _MirrorFailed(f"the mirror sent a web page (HTML, {received:,} bytes), not the file")
        if wrong:
            raise _MirrorFailed(f"MD5 of the download is {digest.hexdigest()}, expected {md5}")
        if md5_uncompressed is None and md5 is None:  # unchecked: a gzip cut short (no Content-Length) is still told
            with open(part, "rb") as f:
                if f.read(2) == GZIP_MAGIC:
                    _content_md5(part, max_size)  # reads it through: a truncated stream is a _MirrorFailed
        if md5_uncompressed is not None:
            content = _content_md5(part, max_size)
            if content != md5_uncompressed.lower():
                raise _MirrorFailed(
                    f"MD5 of the uncompressed contents is {content}, expected {md5_uncompressed}"
                )
        replace_file(part, dest)  # (Windows: a scanner holding the new file is waited for)
        log.info("downloaded %s from %s (%d bytes)", dest, url, received)
    finally:
        part.unlink(missing_ok=True)  # gone already after os.replace


def _content_md5(path: Path, max_size: int | None = None) -> str:
    """MD5 of the file's contents, gunzipped when it starts with the gzip magic (and no further than max_size)."""
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as raw:
        is_gzip = raw.read(2) == GZIP_MAGIC
    total = 0
    try:
        with (gzip.open(path, "rb") if is_gzip else open(path, "rb")) as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
                total += len(chunk)
                if max_size is not None and total > max_size:
                    raise _MirrorFailed(f"the contents run past {max_size:,} bytes, more than the file has "
                                        "(a gzip bomb?); decompression stopped there")
    except (EOFError, gzip.BadGzipFile, zlib.error) as err:
        raise _MirrorFailed(f"corrupt or truncated gzip ({err})") from err
    return digest.hexdigest()
