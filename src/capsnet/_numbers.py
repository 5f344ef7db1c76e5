"""Tests of the numbers a caller passes or a file holds. Python's bool is an int (``True == 1``), and never a size,
count or factor here: each test refuses it, so ``batch_size=True`` is an error, not a batch of one."""

from __future__ import annotations

import math
import sys
from typing import Any

__all__ = ["is_int", "is_count", "is_real", "is_finite", "number_repr"]


def is_int(v: Any) -> bool:
    """A Python int, not a bool."""
    return isinstance(v, int) and not isinstance(v, bool)


def is_count(v: Any, least: int = 1) -> bool:
    """An int (not a bool) of at least ``least``."""
    return is_int(v) and v >= least


def is_real(v: Any) -> bool:
    """An int or a float (NaN and infinities included), not a bool."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def is_finite(v: Any) -> bool:
    """A finite float, or an int within float's range (``math.isfinite`` raises OverflowError on 10**400); not a
    bool."""
    return isinstance(v, float) and math.isfinite(v) or is_int(v) and abs(v) <= sys.float_info.max


def number_repr(v: Any) -> str:
    """``repr(v)`` for a message, an int of 12 digits or more shortened (10**400's repr is 401 digits; Python refuses
    to print one past 4,300): 1e+12, or its first digits and their count past float's range, or only about how many
    digits past 3,900; in a list or tuple each item so (a list's brackets)."""
    if isinstance(v, (list, tuple)):
        return f"[{', '.join(number_repr(x) for x in v)}]"
    if not is_int(v) or abs(v) < 10**12:
        return repr(v)
    if abs(v) < 10**300:
        return f"{v:.3g}"
    sign, bits = "-" if v < 0 else "", abs(v).bit_length()
    if bits > 13_000:  # about 3,913 digits: str() stays within Python's limit below this
        return f"{sign}an integer of about {int(bits * math.log10(2)):,} digits"
    digits = str(abs(v))
    return f"{sign}{digits[:12]}... ({len(digits)} digits)"
