"""Checkpoints: one safetensors file holding weights, optimizer state and configs.

A checkpoint is a single ``.safetensors`` file: tensors under ``model.*``
(and, for resumable checkpoints, ``optim.*`` and ``rng.*``), with the model
and training configurations, the step, epoch and metric history as JSON in
the file's metadata. Loading parses JSON and raw tensors only, so it never
unpickles code. Writing goes to a temporary file in the same folder, is
fsynced and then renamed over the old file, so a crash or ``kill -9`` at any
moment leaves either the previous checkpoint or the new one, never a broken one.
"""
from __future__ import annotations

import errno
import json
import os
import re
import secrets
import shutil
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from ._files import REPLACE_RETRY_S, replace_file
from ._files import WINDOWS as _WINDOWS
from ._numbers import is_count, is_finite, is_real

__all__ = ["CheckpointError", "Checkpoint", "save_checkpoint", "load_checkpoint", "resolve_checkpoint", "load_weights",
           "check_fits_before_building", "same_path", "atomic_write", "atomic_write_bytes", "atomic_write_text",
           "FORMAT", "FORMAT_VERSION", "saved_point", "tensor_digest", "run_file", "unwritable", "refuse_folders",
           "FolderInTheWay", "WritesInterrupted", "atomic_write_all"]

FORMAT = "capsnet-checkpoint"
FORMAT_VERSION = "1"
WITHIN_EPOCH_VERSION = "2"  # a save inside an epoch (state.within): a capsnet that reads only "1" would resume it
# as if at the epoch's start, with weights already past it, so it is refused there
PENDING_VERSION = "3"  # an epoch trained, its evaluation pending (state.within.evaluation_pending): a capsnet that
# reads only "1" and "2" called it damaged (all the epoch's batches inside it)
READ_VERSIONS = (FORMAT_VERSION, WITHIN_EPOCH_VERSION, PENDING_VERSION)


class CheckpointError(ValueError):
    """A checkpoint is missing, damaged, not ours, or does not fit the model."""


@dataclass
class Checkpoint:
    model_name: str
    model_config: dict[str, Any]
    train_config: dict[str, Any]
    state: dict[str, Any]  # epoch, step (non-negative integers), history (a list of epoch records), best
    # the tensors stay out of the repr (a notebook's bare load_model(...) printed every weight: 80,000 characters)
    model_state: dict[str, torch.Tensor] = field(repr=False)
    optimizer_state: dict[str, Any] | None = field(default=None, repr=False)
    rng_state: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)
    path: Path | None = None


CONFIG_FIX = "restore it, or delete it (the run's checkpoints hold its settings)"  # a run's damaged config.json


def short_repr(value: Any, limit: int = 60) -> str:
    """``repr(value)`` for a message, cut to ``limit`` characters: a damaged file's value can be megabytes long."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def read_json_object(path: Path | str, fix: str) -> dict[str, Any]:
    """The JSON object in ``path`` (a run's config.json and the like), or a CheckpointError naming the file, what
    is wrong with it and ``fix``, for a file cut short, not JSON, or JSON of another shape."""
    path = Path(path)
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise CheckpointError(f"{path} is damaged (not JSON: {e}); {fix}") from None
    except RecursionError:  # nested past Python's limit: no config's shape (found by fuzzing)
        raise CheckpointError(f"{path} is damaged (JSON nested too deep); {fix}") from None
    if not isinstance(found, dict):
        raise CheckpointError(f"{path} is damaged (a JSON {type(found).__name__}, not an object); {fix}")
    return found


ASKERS_S = 5.0  # how long a run's lock waits for processes asking whether a run holds it (RunLock.holder)


def _askers_only(fd: int, fcntl: Any) -> bool:
    """Whether the lock held on ``fd``'s file is shared only (``RunLock.holder``'s askers), not a writer's: a shared
    lock is then granted to ``fd`` too, and let go at once."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return False
    fcntl.flock(fd, fcntl.LOCK_UN)
    return True


class RunLock:
    """One process writing a run directory at a time: an advisory lock (``flock``) on ``RUN/.lock``, taken as the
    run starts (``acquire``) and held until ``release``, which removes the file (or until the process ends: the
    system drops the lock then, a kill included, and leaves the file, which the next run takes over). Two ``capsnet
    train`` into one ``--out`` mixed their files (one run's best, another's last); the second is refused. Where the
    system has no ``flock`` (Windows) or the file system refuses it (some network mounts), nothing is locked and no
    file is left. A context manager: leaving it releases."""

    def __init__(self, run_dir: Path | str, command: str = "train") -> None:
        """``command``: the capsnet command that writes (``train``, ``figures``, ``predict``, ``generate``), written
        in the lock file beside the process id so a refusal names it (a predict refused by a figures call was told
        of "another capsnet run")."""
        self.run_dir, self.fd, self.taken, self.command = Path(run_dir), None, False, command

    def acquire(self) -> None:
        """Take the lock (the run directory exists; a second call does nothing), or a CheckpointError naming the
        holder; then remove the writes a killed process cut short (``.NAME.tmp-*``). Unlocked (no ``flock``), the
        writes are removed all the same, as before the lock."""
        if self.taken:
            return
        self.fd = self._lock()
        self.taken = True
        remove_stale_writes(self.run_dir)  # writes cut short by a crash or a kill

    def _lock(self) -> int | None:
        try:
            import fcntl
        except ImportError:  # Windows
            return None
        path = self.run_dir / ".lock"
        while True:
            try:
                fd, mine = os.open(path, os.O_CREAT | os.O_RDWR, 0o666), True  # the umask decides, as for the rest
            except PermissionError:  # another user's, left by a killed run: flock takes a read-only descriptor
                fd, mine = os.open(path, os.O_RDONLY), False
            try:
                # a holder() asking for a moment (a shared lock) lets go: waited out, up to ASKERS_S when it is asking
                # alone, as a process descheduled while it asks is on a loaded machine (0.19 s refused a resume as
                # "being written by another capsnet run": a review, 2026-12-04); a writer's refusal stays prompt
                waits, patience = iter((0.002, 0.005, 0.01, 0.02, 0.05, 0.1)), time.monotonic() + ASKERS_S
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        wait = next(waits, None)
                        if wait is None:
                            if time.monotonic() > patience or not _askers_only(fd, fcntl):
                                raise
                            wait = 0.05
                        time.sleep(wait)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
                os.close(fd)
                raise self._busy(holder) from None
            except OSError:  # a file system without locks: run unlocked, as before, and leave no file
                os.close(fd)
                if mine:
                    path.unlink(missing_ok=True)
                return None
            try:  # the holder removes the file as it lets go: a lock on a file it removed holds nothing
                if os.stat(path).st_ino == os.fstat(fd).st_ino:
                    break
            except FileNotFoundError:
                pass
            os.close(fd)
        if mine:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {self.command}".encode(), 0)
        return fd

    @staticmethod
    def named(holder: str) -> str:
        """" (process N)" for what a holder wrote in the lock file (``holder``: "PID COMMAND", or a PID alone from an
        older capsnet), "" when it names no process id."""
        pid = holder.split()[0] if holder.split() else ""
        return f" (process {pid})" if pid.isdigit() else ""

    @staticmethod
    def writer(holder: str) -> str:
        """What a holder is, said: "run" for a training run (or a lock file that names no command), else "command
        (capsnet COMMAND)"."""
        words = holder.split()
        command = words[1] if len(words) > 1 and words[1].isidentifier() else "train"
        return "run" if command == "train" else f"command (capsnet {command})"

    def _busy(self, holder: str) -> CheckpointError:
        return CheckpointError(f"{self.run_dir} is being written by another capsnet {self.writer(holder)}"
                               f"{self.named(holder)}; wait for it to finish, or choose another output directory")

    def holder(self) -> str | None:
        """Whether another process holds the lock now: None when none does (no run there, it ended, or nothing can
        be locked), else what the holder wrote in the file ("PID COMMAND", or ''). It asks with a shared lock,
        which other askers share (an exclusive one told two askers at once of a run that was not there, every rank of
        a torchrun resume asking together) and which a run's ``acquire`` waits out (``_lock`` retries)."""
        try:
            import fcntl
        except ImportError:  # Windows: nothing is locked
            return None
        try:
            fd = os.open(self.run_dir / ".lock", os.O_RDONLY)
        except OSError:  # no lock file (no run there, or it ended), or one this user cannot read
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.pread(fd, 32, 0).decode(errors="replace").strip()
        except OSError:  # a file system without locks
            return None
        finally:
            os.close(fd)  # a lock taken here goes with the descriptor
        return None

    def refuse_if_held(self) -> None:
        """The CheckpointError ``acquire`` would raise when another process holds the lock now, without taking it:
        for checks that run before the lock is taken and would otherwise name a lesser cause (a live run's
        TensorBoard folder, refused as an earlier run's logs to remove)."""
        if (holder := self.holder()) is not None:
            raise self._busy(holder)

    def _holds_the_file(self) -> bool | None:
        """Whether ``RUN/.lock`` is still the file this lock holds: False when it was removed or replaced (the run's
        folder deleted, and perhaps made again by another run, which locked a new ``.lock``); None, unlocked."""
        if self.fd is None:
            return None
        try:
            now, held = os.stat(self.run_dir / ".lock"), os.fstat(self.fd)
        except FileNotFoundError:
            return False
        return (now.st_ino, now.st_dev) == (held.st_ino, held.st_dev)

    def check(self) -> None:
        """Before a write into the run: a CheckpointError when the run's folder was removed or replaced since the
        lock was taken (a run whose folder was deleted wrote its next saves into the folder of the run that made it
        again, beside that run's files), so that nothing more is written there."""
        if self._holds_the_file() is False:
            raise CheckpointError(f"{self.run_dir} was removed or replaced while this run trained (its .lock is not "
                                  f"the one this run holds), so nothing more is written there; this run's files "
                                  f"went with the folder")

    def release(self) -> None:
        """Let go, removing ``RUN/.lock`` first (a run's folder holds only its files once it ended) when it is still
        this lock's file (never a later run's, in a folder made again)."""
        if self.fd is not None:
            try:
                if self._holds_the_file():
                    (self.run_dir / ".lock").unlink(missing_ok=True)
            except OSError:  # a folder gone read-only (or its permission taken) mid-run: the error that stopped the
                pass  # run is the one to report, and the lock drops with the descriptor (held, it refused a resume)
            finally:
                os.close(self.fd)  # closing the descriptor drops its flock
                self.fd = None
        self.taken = False

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


# mkstemp's: a new file (never a link followed), binary on Windows
_TEMP_FLAGS = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)


def atomic_write(path: Path | str, write: Callable[[BinaryIO], None]) -> None:
    """Let ``write`` fill a temporary file beside ``path``, then rename it over ``path``.

    Readers see the old file or the new one, whole: a crash or an exception in
    ``write`` leaves no partial file (the temporary one is removed). A
    temporary file of this path that a killed writer left (SIGTERM or kill -9
    inside the write: an export's 7 MB stayed for good) is removed first, once
    it is ``STALE_WRITE_S`` old (``_clear_stale_writes_of``).
    """
    path = Path(path)
    refuse_folders([path])  # os.replace's own error named the temporary file (its folder said "not writable")
    _clear_stale_writes_of(path)
    pid = os.getpid()  # the writer, named in the temporary file: see remove_stale_writes
    prefix, tmp = f".{path.name}.tmp-{pid}-{_start_ticks(pid) or 0}-", None
    try:
        while True:  # as mkstemp makes it, but named before it is made: a Ctrl-C or SIGTERM raised as mkstemp
            tmp = str(path.parent / (prefix + secrets.token_hex(4)))  # returned left its file unnamed here, for good
            try:  # (a review, 2026-12-02: 2 SIGTERMs of 4 to a `capsnet predict`)
                fd = os.open(tmp, _TEMP_FLAGS, 0o600)
                break
            except FileExistsError:  # (a name of this process's pid and start: never another's)
                continue
        os.chmod(tmp, 0o666 & ~_umask())  # 0600 would hide the file from other users; the umask holds
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        _replace(tmp, path)
    except BaseException as e:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError) and not e.filename and e.errno is not None:  # a write or fsync (a full disk):
            raise OSError(e.errno, e.strerror, str(path)) from e  # the file it was for, in the message
        raise
    _fsync_dir(path.parent)


class WritesInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM while a command wrote its many files (``atomic_write_all``): those written are whole, the
    rest not written; the message says how many and what to do (the command line prints it after "interrupted")."""


def atomic_write_all(files: dict[Path, bytes], what: str, *, progress: bool = True) -> None:
    """Write each of ``files`` (path -> contents) with ``atomic_write``, in order, under a progress bar; a stop
    between them is a ``WritesInterrupted`` counting the ``what`` (e.g. "masks") written, where some were (a folder
    of predictions half-written said nothing of it: a review, 2026-12-02); an OSError between them (a full disk)
    is raised with that count in its ``written``, for the message."""
    from ._progress import progress_bar

    written: list[Path] = []
    current: tuple[Path, bytes] | None = None
    try:
        for current in progress_bar(files.items(), desc="write", unit="file", leave=False, progress=progress,
                                    total=len(files)):
            atomic_write(current[0], lambda f, data=current[1]: f.write(data))
            written.append(current[0])
    except (KeyboardInterrupt, OSError) as e:
        if current is not None and written[-1:] != [current[0]]:  # stopped after its rename (as the folder was
            try:  # synced): written all the same
                if current[0].stat().st_size == len(current[1]) and current[0].read_bytes() == current[1]:
                    written.append(current[0])
            except OSError:
                pass
        done = len(written)
        if not done:
            raise
        folders = sorted({str(path.parent) for path in files})
        said = f"{done} of {len(files)} {what} were written (each whole) to {', '.join(folders)} before the "
        if isinstance(e, OSError):  # a full disk: the files before it were said nowhere (a bug hunt, 2026-12-05)
            e.written = f"{said}error, the rest not: run the same command again, once it is mended, to write them all"
            raise
        raise WritesInterrupted(f"{said}stop, the rest not: run the same command again to write them all") from None


def write_into(folder: Path, files: dict[Path, bytes], what: str, *, command: str, progress: bool = True
               ) -> list[Path]:
    """Write ``files`` (path -> contents, all in ``folder``) as ``atomic_write_all`` does, ``folder`` made if
    missing and held with its ``RunLock`` (of ``command``) meanwhile (two commands writing one folder, a training
    run's or another predict's, mixed their files; the second is refused); returns those of ``files`` that were
    there before.
    Refused before the first write (a folder in a file's place, the lock held), the folders made here go again."""
    folder = Path(folder)
    made = [f for f in (folder, *folder.parents) if not f.exists()]  # innermost first
    folder.mkdir(parents=True, exist_ok=True)
    with RunLock(folder, command) as lock:
        try:
            lock.acquire()
            refuse_folders(files)  # before the first file is written
        except BaseException:
            lock.release()  # (its .lock file first)
            for f in made:
                if any(f.iterdir()):
                    break
                f.rmdir()
            raise
        replaced = [path for path in files if path.exists()]
        atomic_write_all(files, what, progress=progress)
        return replaced


class FolderInTheWay(IsADirectoryError):
    """A folder where a file was to be written (``refuse_folders``); its ``filename`` the folder."""


def refuse_folders(paths: Iterable[Path]) -> None:
    """A ``FolderInTheWay`` naming the first of ``paths`` (files about to be written) that is a folder: a command
    that writes several files checks them all before it writes the first."""
    for path in paths:
        if path.is_dir():
            raise FolderInTheWay(errno.EISDIR, "a folder is there, where a file was to be written", str(path))


def _replace(tmp: str, path: Path) -> None:
    """``os.replace``; on Windows, where a file another program holds open (an editor, a reader of metrics.jsonl, a
    virus scanner) cannot be replaced, tried again for up to ``REPLACE_RETRY_S``, then an error naming the file
    (``capsnet._files.replace_file``, by this module's ``_WINDOWS`` and ``REPLACE_RETRY_S``, its settings' names
    here: the tests set them for the checkpoint writes)."""
    replace_file(tmp, path, windows=_WINDOWS, retry_s=REPLACE_RETRY_S)


def same_path(a: Path | str, b: Path | str) -> bool:
    """Whether two paths name one file or folder: by the file system's own identity where both exist (on macOS's and
    Windows' case-insensitive disks ``Images`` is ``images``, which a comparison of names misses), by their resolved
    names otherwise."""
    a, b = Path(a).expanduser(), Path(b).expanduser()
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
    except OSError:
        pass
    return a.resolve() == b.resolve()


STALE_WRITE_S = 600.0  # a temporary file of an unlocked folder this old, of an ended writer, is left by a kill
# per folder (this process's first write there read it once): target name -> the temporary files found for it
_TEMPS_FOUND: dict[str, dict[str, list[str]]] = {}
_TEMPS_LOCK = threading.Lock()


def _clear_stale_writes_of(path: Path) -> None:
    """Remove the temporary files of ``path`` that ended writers left (``remove_stale_writes``'s test), once they
    are ``STALE_WRITE_S`` old: a writer in another pid namespace or on another host sharing the folder (whose pid
    means nothing here) is never cut off mid-write. The folder is read once per process, at its first write (a
    glob per write made 20,000 predictions into one folder 2x slower); temporary files left later are found by the
    next process."""
    folder = os.path.abspath(path.parent)
    with _TEMPS_LOCK:
        found = _TEMPS_FOUND.get(folder)
        if found is None:
            found = _TEMPS_FOUND[folder] = {}
            try:
                with os.scandir(folder) as entries:
                    for entry in entries:
                        if entry.name.startswith(".") and ".tmp-" in entry.name:
                            found.setdefault(entry.name[1:].rpartition(".tmp-")[0], []).append(entry.name)
            except OSError:  # a folder not there yet, or not readable: the write says so
                pass
        temps = found.pop(path.name, [])
    now = time.time()
    for name in temps:
        tmp = Path(folder) / name
        try:
            old = now - tmp.stat().st_mtime >= STALE_WRITE_S
        except OSError:
            continue
        writer = _writer(name)
        if writer is None or writer[2]:  # not a temporary file of capsnet's (a user's own), or a folder's name
            continue
        pid, start, _ = writer
        if (old or not pid) and not (pid and _running(pid, start)):  # an older capsnet's, no writer named: at once
            tmp.unlink(missing_ok=True)


# atomic_write's temporary files are .NAME.tmp-PID-START-XXXXXXXX (8 random characters), capsnet prepare's partial
# folders .NAME.tmp-PID-START-dir; before 2026-11-30 a temporary file was .NAME.tmp-XXXXXXXX. Nothing else is
# capsnet's: a user's own .photos.tmp-2024-06/ in an --out folder was removed as a stale write (a review, 2026-12-02)
_TEMP_NAME = re.compile(r"\.(?P<name>.+)\.tmp-(?:(?P<pid>\d+)-(?P<start>\d+)-)?(?P<tail>[a-z0-9_]{8}|dir)")


def _writer(name: str) -> tuple[int, int, bool] | None:
    """The writer a temporary name of capsnet's gives: its pid (0: none named, a file of a capsnet before
    2026-11-30), start (0: not known) and whether the name is a partial folder's (``-dir``); None for any other
    name, which is never removed."""
    m = _TEMP_NAME.fullmatch(name)
    if m is None or (m["pid"] is None and m["tail"] == "dir"):
        return None
    return (0, 0, False) if m["pid"] is None else (int(m["pid"]), int(m["start"]), m["tail"] == "dir")


def remove_stale_writes(folder: Path | str, pattern: str = ".*.tmp-*") -> None:
    """Remove the temporary files of ``atomic_write`` in ``folder`` (matching ``pattern``) that a killed process
    left. A temporary file names its writer (``.NAME.tmp-PID-START-...``, START its start in clock ticks since boot,
    from /proc): it is left alone while that process still runs (two `capsnet figures` into one folder, an eval
    beside a starting run), and removed once it has ended or its pid belongs to another process now (one started at
    another time: pid 1 in every container). Where a start cannot be read the pid alone decides. A temporary file
    with no pid in its name (a capsnet before 2026-11-30; or a user's own ``.notes.tmp-20240601``) is left here:
    ``atomic_write`` removes it when it writes the file of that name. A temporary folder named the same way
    (``capsnet prepare``'s, ``-dir`` at its end, renamed into place when whole) is removed with what it holds, only
    when it names its writer. Names of any other shape (``_TEMP_NAME``: a user's own ``.notes.tmp-old`` or
    ``.photos.tmp-2024-06/`` in a folder given as --out) are left alone."""
    for tmp in Path(folder).glob(pattern):
        writer = _writer(tmp.name)
        if writer is None:  # not capsnet's: a user's own file or folder
            continue
        pid, start, folder_name = writer
        if not pid:  # an older capsnet's, or a user's .notes.tmp-20240601: left to the write of its own file
            continue
        if tmp.is_dir() and not tmp.is_symlink():
            if folder_name and not _running(pid, start):
                shutil.rmtree(tmp, ignore_errors=True)
        elif not folder_name and not _running(pid, start):
            tmp.unlink(missing_ok=True)


def _running(pid: int, start: int) -> bool:
    """Whether process ``pid`` runs on this machine (ours included: another thread may be writing) and is the one
    that started at ``start`` (clock ticks since boot; 0: not known, the pid alone decides)."""
    if _WINDOWS:  # os.kill there terminates the process whatever the signal: it asks the system instead
        return _running_on_windows(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: another user's process runs with that pid; /proc still tells its start
        pass
    now = _start_ticks(pid)
    return not start or now is None or now == start


def _running_on_windows(pid: int) -> bool:
    """Whether process ``pid`` runs, asked of Windows (OpenProcess, GetExitCodeProcess): never a signal, which
    Windows' os.kill turns into TerminateProcess, ending whatever process holds that pid now."""
    import ctypes

    kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
    handle = kernel32.OpenProcess(0x1000, False, pid)  # PROCESS_QUERY_LIMITED_INFORMATION
    if not handle:
        return ctypes.get_last_error() == 5  # ERROR_ACCESS_DENIED: another user's process runs with it
    try:
        code = ctypes.c_ulong()
        return not kernel32.GetExitCodeProcess(handle, ctypes.byref(code)) or code.value == 259  # STILL_ACTIVE
    finally:
        kernel32.CloseHandle(handle)


def _start_ticks(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (Linux's /proc/PID/stat, field 22), or None where it
    cannot be read. A tick count is the process's own: no clock of a file server or of this machine enters it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
        return int(stat.rpartition(b")")[2].split()[19])  # field 22, counted after the command's ")"
    except (OSError, ValueError, IndexError):
        return None


def _umask() -> int:
    """The process's umask: Linux's /proc/self/status says it; elsewhere read by setting it and back (os has no
    getter), which for that moment gave another thread's new files 0o022's permissions (a process at 0o077 made a
    world-readable file); 0o022 where it cannot be read."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    try:
        mask = os.umask(0o022)
        os.umask(mask)
        return mask
    except OSError:  # pragma: no cover - umask does not fail on POSIX
        return 0o022


def unwritable(folder: Path | str) -> str | None:
    """Why nothing can be written in ``folder`` (a file made there and removed: permission bits, a read-only file
    system, a virtual one such as /sys, whatever root may bypass), or None where it can: asked before long work
    whose result goes there."""
    import tempfile

    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".capsnet-probe-"):
            return None
    except OSError as e:
        return e.strerror or str(e)


def check_out_dir(out: Path | str, written: str, *, flag: str = "--out", error: type[ValueError] = ValueError) -> None:
    """Before long work whose results go to the folder ``out`` (the ``written``): an ``error`` naming the fix when
    it is a file, when a file stands where it or a folder above it was to be made, or when nothing can be written in
    its nearest existing folder (``unwritable``: a read-only disk, permissions, /sys). Found after the work before,
    with an error about a path the user never gave."""
    folder = Path(out).absolute()  # as the writers take it (a ~ is the command line's to expand, cli.main)
    if folder.exists() and not folder.is_dir():
        raise error(f"{flag} {out} is a file; give a folder for the {written}")
    existing = folder
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise error(f"{flag} {out}: {existing} is a file, where a folder was to be made; give another folder")
    why = unwritable(existing)
    if why is not None:
        raise error(f"{flag} {out}: nothing can be written in {existing} ({why}); give a folder you can write to")


def atomic_write_bytes(path: Path | str, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old or the new file, whole."""
    atomic_write(path, lambda f: f.write(data))


def atomic_write_text(path: Path | str, text: str) -> None:
    """``text`` as UTF-8, atomically; a path or argument Python read from bytes that are not UTF-8 (held as
    surrogates) is written back as those bytes, not refused after the work it reports."""
    atomic_write_bytes(path, text.encode("utf-8", "surrogateescape"))


def _fsync_dir(folder: Path) -> None:
    # Make the rename itself durable; not possible on every platform.
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _flatten_optimizer(opt_state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for idx, st in opt_state["state"].items():
        for key, value in st.items():
            if torch.is_tensor(value):
                tensors[f"optim.{idx}.{key}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(idx), {})[key] = value
    return tensors, {"param_groups": opt_state["param_groups"], "scalars": scalars}


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], meta: Any) -> dict[str, Any]:
    """The optimizer's state dict from its tensors and metadata; a ValueError says what is malformed."""
    if not isinstance(meta, dict) or not isinstance(meta.get("param_groups"), list) \
            or not all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in meta["param_groups"]):
        raise ValueError("the optimizer entry needs 'param_groups', a list of groups each with a 'params' list")
    scalars = meta.get("scalars", {})
    if not isinstance(scalars, dict) or not all(isinstance(kv, dict) for kv in scalars.values()):
        raise ValueError("the optimizer's 'scalars' must map parameter indices to objects")
    state: dict[int, dict[str, Any]] = {}
    entries = [(name.split(".", 2), value) for name, value in tensors.items()]
    entries += [((None, idx, None), kv) for idx, kv in scalars.items()]
    for (_, idx, key), value in entries:
        if not str(idx).isdigit():
            raise ValueError(f"optimizer state index {idx!r} is not a parameter index (0, 1, ...)")
        if key is None:
            state.setdefault(int(idx), {}).update(value)
        else:
            state.setdefault(int(idx), {})[key] = value
    return {"state": state, "param_groups": meta["param_groups"]}


DIGEST = "blake2b-128"  # the metadata's "digest": "blake2b-128:HEX" of every tensor, in name order (tensor_digest)


def tensor_digest(tensors: dict[str, torch.Tensor]) -> str:
    """A digest of ``tensors``: each one's name, dtype, shape and bytes, in name order, so any change to a value
    (a flipped bit on disk, a weight edited in place) changes it; the file's layout does not enter it."""
    import hashlib

    h = hashlib.blake2b(digest_size=16)
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
    return f"{DIGEST}:{h.hexdigest()}"


def save_checkpoint(path: Path | str, ckpt: Checkpoint) -> None:
    """Write ``ckpt`` atomically to ``path`` (a ``.safetensors`` file). What ``load_checkpoint`` would call damaged
    (a config that is not a dict, a ``state`` without whole ``epoch`` and ``step`` counts, values JSON cannot hold)
    is a CheckpointError here, before anything is written. (The model's name is not checked: ``load_model``
    rebuilds registered models, and other code may store its own.)"""
    if not isinstance(ckpt.model_name, str) or not ckpt.model_name:
        raise CheckpointError(f"cannot save {path}: model_name must be a model's name (a string), got "
                              f"{short_repr(ckpt.model_name)}")
    for part in ("model_config", "train_config"):
        if hasattr(getattr(ckpt, part), "to_dict"):
            raise CheckpointError(f"cannot save {path}: Checkpoint.{part} is a "
                                  f"{type(getattr(ckpt, part)).__name__}; pass its .to_dict()")
    parts = {}
    for part in ("model_config", "train_config", "state"):
        try:
            parts[part] = json.dumps(getattr(ckpt, part))
        except (TypeError, ValueError) as e:  # a value JSON cannot hold (a tensor, a set), a circular reference
            raise CheckpointError(f"cannot save {path}: Checkpoint.{part} holds what JSON cannot ({e}): give it "
                                  f"numbers, strings, lists and dicts only") from None
    try:  # as load_checkpoint will read them (a tuple is a list in JSON)
        _check_metadata(*(json.loads(parts[part]) for part in ("model_config", "train_config", "state")))
    except ValueError as e:
        hint = ("; a run's state holds at least whole epoch and step counts, e.g. {'epoch': 0, 'step': 0}"
                if str(e).startswith(("state.epoch", "state.step")) else "")
        raise CheckpointError(f"cannot save {path}: {e} (load_checkpoint would refuse the file{hint})") from None
    tensors = {f"model.{k}": v.detach().cpu().contiguous() for k, v in ckpt.model_state.items()}
    metadata = {
        "format": FORMAT,
        "format_version": _format_version(ckpt.state),
        "model": ckpt.model_name,
        **parts,
    }
    if ckpt.optimizer_state is not None:
        opt_tensors, opt_meta = _flatten_optimizer(ckpt.optimizer_state)
        tensors.update(opt_tensors)
        metadata["optimizer"] = json.dumps(opt_meta)
    for k, v in ckpt.rng_state.items():
        tensors[f"rng.{k}"] = v.detach().cpu().contiguous()
    metadata["digest"] = tensor_digest(tensors)  # load_checkpoint checks it: a value changed on disk is not trusted
    atomic_write_bytes(path, st_save(tensors, metadata=metadata))


RUN_FILES = ("config.json", "metrics.jsonl")  # beside a run's checkpoints: what figures, viz and resumes read


def run_file(path: Path | str) -> str | None:
    """What ``path`` is when writing over it would lose a run's own file (an output of eval or export named so by
    mistake): any ``.safetensors`` file name (a checkpoint's), or a run directory's config.json or metrics.jsonl.
    None for every other path."""
    p = Path(path)
    if p.suffix.lower() == ".safetensors":
        return "a checkpoint's name (.safetensors)"
    for name in RUN_FILES:  # by the file system's identity: on a case-insensitive disk Config.json is config.json
        if same_path(p, p.parent / name) and any((p.parent / f"{w}.safetensors").exists() for w in ("best", "last")):
            return f"the {name} of the run in {p.parent}"
    return None


def resolve_checkpoint(path: Path | str, which: str = "best") -> Path:
    """A run directory becomes its ``best`` (or ``last``) checkpoint file; ``pretrained:NAME`` a shipped model's."""
    from . import pretrained

    if which not in ("best", "last"):  # a shipped model's or a file's too: a slip is said, not ignored
        raise CheckpointError(f"which must be 'best' or 'last' (a run directory's best.safetensors or "
                              f"last.safetensors), got {which!r}")
    if not isinstance(path, (str, os.PathLike)):  # a model passed to load_model or predict_folder, say
        raise TypeError(f"a checkpoint is a run directory, a .safetensors file or pretrained:NAME (or a Checkpoint "
                        f"read), got {type(path).__name__}" + (": a model in memory is used as it is, not loaded "
                                                                  "(save_checkpoint writes one)"
                                                                  if isinstance(path, torch.nn.Module) else ""))
    if pretrained.is_shipped(path):
        try:
            return pretrained.path(path)
        except ValueError as e:
            raise CheckpointError(str(e)) from None
    p = Path(path)
    if p.is_dir():
        f = p / f"{which}.safetensors"
        if not f.exists() and which == "best" and (p / "last.safetensors").exists():
            f = p / "last.safetensors"  # said: an explicit --which best scored a mid-epoch save without a word
            best = _saved_best(f)
            why = "yet (the run has not finished evaluating an epoch)" if best is None else \
                f"(its best, epoch {best.get('epoch')}, was saved there and has been removed since)"
            warnings.warn(f"{p} holds no best.safetensors {why}: its last.safetensors is used", UserWarning,
                          stacklevel=2)
        if not f.exists():
            # a run starting there: it is not to be trained again
            if (holder := RunLock(p).holder()) is not None and RunLock.writer(holder) == "run":
                raise CheckpointError(f"no checkpoint in {p} yet: a run is training there{RunLock.named(holder)} "
                                      f"and has not saved its first one; try again once it has")
            raise CheckpointError(f"no checkpoint in {p}: expected {p / (which + '.safetensors')}; "
                                  f"train one with `capsnet train --out {p}` or pass a .safetensors file")
        return f
    if not p.exists():
        tail = re.split(r"[:/=\\]", str(path))[-1]  # Pretrained:NAME, pretrain:NAME, pretrained/NAME
        shipped = f"; did you mean {pretrained.PREFIX}{tail}, a model shipped with capsnet?" \
            if tail in pretrained.names() else ""
        raise CheckpointError(f"checkpoint {p} does not exist: pass a run directory made by `capsnet train` or its "
                              f".safetensors file{shipped}")
    return p


def header_metadata(path: Path | str) -> dict[str, str] | None:
    """The string fields a checkpoint file's header holds (model, model_config, state, ...), read without its
    tensors; None for a header that cannot be read (the file's own load says why)."""
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if n > 100 * 2**20:  # no header of a checkpoint is that large: a damaged file
                return None
            metadata = _read_metadata(n.to_bytes(8, "little") + f.read(n))
    except (OSError, ValueError, AttributeError, TypeError, RecursionError):
        return None
    return metadata if isinstance(metadata, dict) else None


def _saved_best(path: Path) -> dict[str, Any] | None:
    """The ``best`` record of the run state a checkpoint file's header holds (None: none, or a header that cannot
    be read: the file's own load says why), read without its tensors."""
    try:
        best = json.loads(header_metadata(path)["state"]).get("best")
    except (ValueError, KeyError, AttributeError, TypeError, RecursionError):
        return None
    return best if isinstance(best, dict) else None


def _read_metadata(data: bytes) -> dict[str, str]:
    # safetensors layout: 8-byte little-endian header length, then a JSON header
    # whose "__metadata__" holds our string fields.
    n = int.from_bytes(data[:8], "little")
    if len(data) < 8 or n > len(data) - 8:
        raise ValueError("header length exceeds the file")
    return json.loads(data[8:8 + n]).get("__metadata__", {}) or {}


def _instead(p: Path, otherwise: str) -> str:
    """What to do about the damaged checkpoint ``p``: a run's best or last beside a whole copy of the other one names
    that one (a kill mid-write leaves last.safetensors cut short beside an intact best.safetensors), else
    ``otherwise`` (two damaged files pointed at each other)."""
    other = {"best.safetensors": "last", "last.safetensors": "best"}.get(p.name)
    if other is None or not _whole(p.parent / f"{other}.safetensors"):
        return otherwise
    return f"the run's {other}.safetensors beside it is whole: use that one (--which {other} where a command takes " \
           f"a run folder), or retrain"


def _whole(path: Path) -> bool:
    """Whether ``path`` reads as a capsnet checkpoint whose tensors match their digest (if it has one)."""
    try:
        data = path.read_bytes()
        tensors, metadata = st_load(data), _read_metadata(data)
    except (OSError, SafetensorError, ValueError, RuntimeError):
        return False
    return metadata.get("format") == FORMAT and not _digest_differs(tensors, metadata)


def _digest_differs(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> bool:
    """Whether the tensors read differ from the digest saved with them; False for a file without one (written
    before 2026-11-28, the shipped models among them)."""
    saved = metadata.get("digest")
    return saved is not None and saved.startswith(DIGEST + ":") and tensor_digest(tensors) != saved


def load_checkpoint(path: Path | str, which: str = "best") -> Checkpoint:
    """Read a checkpoint file, or the ``best``/``last`` one of a run directory."""
    p = resolve_checkpoint(path, which)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint {p}: {e}") from e
    try:
        tensors = st_load(data)
        metadata = _read_metadata(data)
    except (SafetensorError, ValueError, OSError, RuntimeError) as e:
        if len(data) <= 8:  # not even a header's length: "truncated or corrupt (header too small)" said of any file
            n = len(data)
            size = f"{n} byte{'s' if n > 1 else ''}, too few for a safetensors file" if n else "it is empty"
            raise CheckpointError(f"{p} is not a checkpoint: {size} (one cut short, or another file); " + _instead(
                p, "pass a run directory made by `capsnet train` or its best.safetensors / last.safetensors")) from None
        if data[8:9] != b"{":  # a safetensors file opens with its header's length, then a JSON object
            raise CheckpointError(f"{p} is not a checkpoint: not a safetensors file at all; " + _instead(
                p, "pass a run directory made by `capsnet train` or its best.safetensors / last.safetensors")) from None
        raise CheckpointError(f"checkpoint {p} is truncated or corrupt ({e}); "
                              + _instead(p, "use another checkpoint or retrain")) from e
    if metadata.get("format") != FORMAT:
        raise CheckpointError(f"{p} is a safetensors file but not a capsnet checkpoint (no '{FORMAT}' metadata)")
    if _digest_differs(tensors, metadata):
        raise CheckpointError(f"checkpoint {p} is damaged: its tensors do not match the digest saved with them (the "
                              f"file changed after it was written); {_instead(p, 'use another checkpoint or retrain')} "
                              f"(weights changed on purpose: save them with capsnet.checkpoint.save_checkpoint)")
    if metadata.get("format_version") not in READ_VERSIONS:
        raise CheckpointError(f"{p} has checkpoint format version {metadata.get('format_version')!r}; "
                              f"this capsnet reads versions {', '.join(READ_VERSIONS)}")
    try:
        model_config = json.loads(metadata["model_config"])
        train_config = json.loads(metadata["train_config"])
        state = json.loads(metadata["state"])
        opt_meta = json.loads(metadata["optimizer"]) if "optimizer" in metadata else None
    except (KeyError, json.JSONDecodeError, RecursionError) as e:
        raise CheckpointError(f"checkpoint {p} has damaged metadata ({e}); "
                              + _instead(p, "use another checkpoint or retrain")) from e
    try:
        _check_metadata(model_config, train_config, state)
        model_state = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
        opt_tensors = {k: v for k, v in tensors.items() if k.startswith("optim.")}
        rng = {k[len("rng."):]: v for k, v in tensors.items() if k.startswith("rng.")}
        optimizer_state = _unflatten_optimizer(opt_tensors, opt_meta) if opt_meta is not None else None
        _check_rank_rng(state, rng)
    except ValueError as e:
        raise CheckpointError(f"checkpoint {p} has damaged metadata: {e}; "
                              + _instead(p, "use another checkpoint or retrain")) from None
    return Checkpoint(metadata.get("model", "capsnet"), model_config, train_config, state, model_state,
                      optimizer_state, rng, p)


def _check_metadata(model_config: Any, train_config: Any, state: Any) -> None:
    """The JSON parts have the structure capsnet writes (their fields are checked by the config dataclasses)."""
    for name, value in (("model_config", model_config), ("train_config", train_config), ("state", state)):
        if not isinstance(value, dict):
            raise ValueError(f"{name} must be a JSON object, got {type(value).__name__}")
    for key in ("epoch", "step"):
        value = state.get(key)
        if not is_count(value, 0):
            raise ValueError(f"state.{key} must be a non-negative integer, got {short_repr(value)}")
    history = state.get("history", [])
    if not isinstance(history, list) or not all(isinstance(r, dict) for r in history):
        raise ValueError("state.history must be a list of epoch records")
    best = state.get("best")
    if best is not None and not (isinstance(best, dict) and is_count(best.get("epoch"), 0)
                                 and is_real(best.get("accuracy"))):
        raise ValueError(f"state.best must be null or an object with an integer epoch and a numeric accuracy, "
                         f"got {short_repr(best)}")
    if "within" in state:
        _check_within(state["within"], state["epoch"])
    if "grad_scaler" in state:
        _check_grad_scaler(state["grad_scaler"])


def _check_grad_scaler(saved: Any) -> None:
    """--amp fp16's gradient scaler as GradScaler.state_dict() writes it: a scale that is finite and positive (a
    scale of 0 turns the first gradient into NaN unflagged), factors above and below 1, whole step counts."""
    ok = (isinstance(saved, dict) and is_finite(saved.get("scale")) and saved["scale"] > 0
          and is_finite(saved.get("growth_factor")) and saved["growth_factor"] > 1
          and is_finite(saved.get("backoff_factor")) and 0 < saved["backoff_factor"] < 1
          and is_count(saved.get("growth_interval"), 1) and is_count(saved.get("_growth_tracker"), 0))
    if not ok:
        raise ValueError(f"state.grad_scaler must be a gradient scaler's state (a finite positive scale, a growth "
                         f"factor above 1, a backoff factor in (0, 1), whole step counts), got {short_repr(saved)}")


def _format_version(state: dict[str, Any]) -> str:
    """The oldest format version that can read a checkpoint of ``state``: the one its kind of save needs."""
    within = state.get("within")
    if isinstance(within, dict):
        return PENDING_VERSION if within.get("evaluation_pending") else WITHIN_EPOCH_VERSION
    return FORMAT_VERSION


def saved_point(state: dict[str, Any]) -> str:
    """Where in training a checkpoint's ``state`` was saved, for messages: ``epoch E``, or, for a save inside an
    epoch, ``epoch E + N batches of epoch E+1`` (``..., not yet evaluated`` when they are all of them)."""
    within = state.get("within")
    if isinstance(within, dict):
        n = within.get("batches")
        if within.get("evaluation_pending"):
            return f"epoch {state.get('epoch')} + all {n} batches of epoch {within.get('epoch')}, not yet evaluated"
        return f"epoch {state.get('epoch')} + {n} batch{'' if n == 1 else 'es'} of epoch {within.get('epoch')}"
    return f"epoch {state.get('epoch')}"


def checkpoint_said(ckpt: "Checkpoint") -> str:
    """The head of a report's first line: ``checkpoint FILE (epoch E)``, a shipped model's file as
    ``pretrained:NAME`` (the installed package's path, which differs between installs, showed before, as the JSON
    report does not: a bug hunt, 2026-12-05)."""
    from . import pretrained

    return f"checkpoint {pretrained.named(ckpt.path)} ({saved_point(ckpt.state)})"


def _check_within(within: Any, epoch: int) -> None:
    """A save inside an epoch (``capsnet.train.within_epoch``): the next epoch, a batch count, running sums."""
    if not isinstance(within, dict):
        raise ValueError(f"state.within must be an object, got {short_repr(within)}")
    if within.get("epoch") != epoch + 1 or isinstance(within.get("epoch"), bool):
        raise ValueError(f"state.within.epoch must be {epoch + 1} (the epoch after state.epoch {epoch}), got "
                         f"{short_repr(within.get('epoch'))}")
    for key, least in (("batches", 1), ("seen", 0)):
        if not is_count(within.get(key), least):
            raise ValueError(f"state.within.{key} must be an integer >= {least}, got {short_repr(within.get(key))}")
    sums = within.get("sums")
    if not (isinstance(sums, list) and sums and all(is_finite(x) for x in sums)):
        raise ValueError(f"state.within.sums must be a list of finite numbers, got {short_repr(sums)}")
    if not (is_finite(within.get("seconds")) and within["seconds"] >= 0):
        raise ValueError(f"state.within.seconds must be a number >= 0, got {short_repr(within.get('seconds'))}")
    if not is_count(within.get("processes", 1), 1):
        raise ValueError(f"state.within.processes must be an integer >= 1, got {short_repr(within['processes'])}")
    if not isinstance(within.get("device", ""), str):
        raise ValueError(f"state.within.device must be a device type such as 'cpu', got {short_repr(within['device'])}")
    if not isinstance(within.get("evaluation_pending", False), bool):
        raise ValueError(f"state.within.evaluation_pending must be true or false, got "
                         f"{short_repr(within['evaluation_pending'])}")


def rank_rng_key(rank: int, key: str) -> str:
    """Where a save inside an epoch under torchrun keeps rank ``rank``'s generator ``key`` (rank 0's: the usual)."""
    return key if rank == 0 else f"rank{rank}.{key}"


def _check_rank_rng(state: dict[str, Any], rng: dict[str, torch.Tensor]) -> None:
    """A save inside an epoch by N torchrun processes holds every rank's random states (``rank{r}.torch``, and
    ``rank{r}.cuda`` where rank 0's ``cuda`` is there): without them a resume by N processes would continue ranks
    1..N-1 from the epoch's seeding, not where they stopped."""
    within = state.get("within")
    processes = within.get("processes", 1) if isinstance(within, dict) else 1
    missing = [f"rng.{rank_rng_key(r, k)}" for r in range(1, processes) for k in ("torch", "cuda")
               if k in rng and rank_rng_key(r, k) not in rng]
    if processes > 1 and "torch" not in rng:
        missing.insert(0, "rng.torch")
    if missing:
        raise ValueError(f"state.within.processes is {processes} but the file holds no "
                         f"{', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''} (each rank's random state "
                         f"at the save)")


def _check_names_and_shapes(expected: dict[str, torch.Tensor], ckpt: Checkpoint) -> None:
    """A ``CheckpointError`` unless the checkpoint holds exactly the tensors of ``expected`` (a state dict), each of
    its shape."""
    saved = ckpt.model_state
    where = f"checkpoint {ckpt.path}"
    missing, extra = sorted(set(expected) - set(saved)), sorted(set(saved) - set(expected))
    if missing or extra:
        parts = ([f"missing {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}"] if missing else []) + \
                ([f"unexpected {', '.join(extra[:3])}{' ...' if len(extra) > 3 else ''}"] if extra else [])
        raise CheckpointError(f"{where} does not fit its own configuration ({'; '.join(parts)}); it is damaged")
    for name, want in expected.items():
        got = saved[name]
        if got.shape != want.shape:
            raise CheckpointError(f"{where} holds {name} of shape {tuple(got.shape)} where its configuration needs "
                                  f"{tuple(want.shape)}; it is damaged")


def check_fits_before_building(build: Callable[[], torch.nn.Module], ckpt: Checkpoint) -> None:
    """Check a checkpoint's tensors against the model its configuration describes, built on the meta device (no
    memory, no initialisation), before the model is built for real: a configuration edited or damaged to describe a
    far larger network (a decoder of 40,000 units in a 6 MB file) is a ``CheckpointError`` here, not gigabytes
    allocated and initialised first (or an allocator's traceback). ``build`` makes the model; its draws from torch's
    random generator happen on the meta device, which consumes none."""
    with torch.device("meta"):
        model = build()
    _check_names_and_shapes(model.state_dict(), ckpt)


def load_weights(model: torch.nn.Module, ckpt: Checkpoint) -> None:
    """Copy a checkpoint's weights into ``model``, after checking each against the model's own tensor.

    Every tensor the model has must be there, with its shape, in a floating
    dtype (int8 weights would load silently, and wrongly) and finite, or an
    integer one where the model keeps a count (batch norm's); nothing
    extra may be. A ``CheckpointError`` names the file and the first tensors at fault.
    """
    expected = model.state_dict()
    saved = ckpt.model_state
    where = f"checkpoint {ckpt.path}"
    _check_names_and_shapes(expected, ckpt)
    for name, want in expected.items():
        got = saved[name]
        if not want.is_floating_point():  # a counter such as batch norm's num_batches_tracked: an integer
            if got.is_floating_point() or got.dtype == torch.bool:
                raise CheckpointError(f"{where} holds {name} as {str(got.dtype).replace('torch.', '')} where its "
                                      f"model keeps an integer count; it is damaged")
            continue
        if not got.is_floating_point():
            raise CheckpointError(f"{where} holds {name} as {str(got.dtype).replace('torch.', '')}, not floating "
                                  f"point; save the weights in float32 (or float16/bfloat16)")
        if not torch.isfinite(got).all():
            raise CheckpointError(f"{where} holds NaN or infinite values in {name}: the run diverged or the file is "
                                  f"damaged; use an earlier checkpoint")
    model.load_state_dict(saved)
