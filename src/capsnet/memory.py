"""Keep freed memory in the process: glibc malloc tuned for training loops on the CPU.

PyTorch's CPU tensors come from the C library's ``malloc``. glibc serves every
block above its mmap threshold (128 KiB to 32 MiB, adjusted on the fly) with a
fresh ``mmap`` and gives it back to the kernel on ``free``. A training step
allocates and frees the same large activations every time, so every step
faults hundreds of megabytes of pages in again, kernel time that can be a large
share of a CapsNet step on a CPU (benchmarks/README.md, "The allocator",
measures it).

``keep_freed_memory`` tells glibc to take every block from its heap
(``M_MMAP_MAX = 0``) and to return freed memory to the kernel only when more
than ``trim_threshold`` bytes sit free at the top of the heap. The process then
keeps roughly its peak footprint and reuses it step after step. It is the
same as starting Python with ``MALLOC_MMAP_MAX_=0`` and
``MALLOC_TRIM_THRESHOLD_=...`` in the environment, done from inside.

It changes nothing but speed and resident memory. It only applies where the C
library is glibc (Linux); elsewhere it does nothing and returns False.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import platform
from typing import Any

from ._numbers import is_count

__all__ = ["keep_freed_memory", "kept", "limit_arenas", "release_freed", "ALLOCATORS"]

log = logging.getLogger(__name__)

ALLOCATORS = ("keep", "default")  # the choices of the CLI's --allocator

# mallopt parameters, from glibc's <malloc.h>
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8


def keep_freed_memory(*, trim_threshold: int = 2**31 - 1, top_pad: int = 64 << 20) -> bool:
    """Make glibc keep freed memory for reuse; True when applied, False where the C library is not glibc.

    Args:
        trim_threshold: bytes free at the top of the heap above which glibc
            gives memory back to the kernel (default and most: 2 GiB,
            the largest value mallopt takes).
        top_pad: extra bytes requested from the kernel each time the heap grows.
    """
    for name, value in (("trim_threshold", trim_threshold), ("top_pad", top_pad)):  # before any mallopt: a float
        if not is_count(value, 0):  # failed between two of them
            raise ValueError(f"{name} must be an integer >= 0 (bytes), got {value!r}")
    mallopt = _mallopt()
    if mallopt is None:
        log.info("keep_freed_memory: the C library is not glibc; allocator left as it is")
        return False
    limit = 2**31 - 1  # mallopt takes a C int
    ok = (mallopt(_M_MMAP_MAX, 0) == 1
          and mallopt(_M_TRIM_THRESHOLD, min(trim_threshold, limit)) == 1
          and mallopt(_M_TOP_PAD, min(top_pad, limit)) == 1)
    if not ok:
        log.warning("keep_freed_memory: glibc refused a mallopt setting; the allocator may be partly tuned")
    global _KEPT
    _KEPT = _KEPT or ok
    return ok


_KEPT = False  # keep_freed_memory applied in this process: it lasts as long as the process does


def kept() -> bool:
    """Whether ``keep_freed_memory`` was applied in this process (by a training run of a program that imported
    capsnet, say): the allocator stays tuned for good, whatever a later command asks."""
    return _KEPT


def _glibc(name: str) -> Any:
    """glibc's function ``name``, or None where the C library is not glibc (or lacks it)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):
        return None


def _mallopt() -> Any:
    """glibc's ``mallopt`` (argument types set), or None where the C library is not glibc."""
    mallopt = _glibc("mallopt")
    if mallopt is not None:
        mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt


def limit_arenas(arenas: int = 2) -> bool:
    """At most ``arenas`` glibc malloc pools for the process (``MALLOC_ARENA_MAX``), for a server whose handler
    threads each run the model: glibc gives each thread a pool of its own and keeps what is freed in it, so a viewer
    under 16 clients grew from 429 to 753 MiB and on (SegCaps), and stayed near 366 MiB with two pools. True when
    applied; False where the C library is not glibc."""
    if not is_count(arenas):
        raise ValueError(f"arenas must be an integer >= 1, got {arenas!r}")
    mallopt = _mallopt()
    return mallopt is not None and mallopt(_M_ARENA_MAX, arenas) == 1


def release_freed() -> bool:
    """Give the memory glibc holds freed back to the kernel (``malloc_trim(0)``), for a server after work of a shape
    it had not done before: the viewer's SegCaps walked at 80 upload sizes grew from 357 to 2,039 MB of RSS, the
    freed part of it kept by malloc (404 MB after a trim). True when applied; False where the C library is not
    glibc."""
    trim = _glibc("malloc_trim")
    if trim is None:
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
    return True
