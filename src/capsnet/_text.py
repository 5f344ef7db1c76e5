"""Small pieces of the library's messages, written once."""
from __future__ import annotations

from typing import Iterable

__all__ = ["some_of"]


def some_of(items: Iterable[object], shown: int = 5) -> str:
    """The first ``shown`` of ``items``, comma-separated, then "and N more" for the rest: a long list of files in
    one line of a message (``some_of("abcdefg")`` is "a, b, c, d, e and 2 more")."""
    items = [str(item) for item in items]
    rest = len(items) - shown
    return ", ".join(items[:shown]) + (f" and {rest} more" if rest > 0 else "")
