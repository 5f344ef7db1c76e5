"""Small pieces of the library's messages, written once."""
from __future__ import annotations

import json
from typing import Iterable

__all__ = ["some_of", "told_apart"]


def some_of(items: Iterable[object], shown: int = 5) -> str:
    """The first ``shown`` of ``items``, comma-separated, then "and N more" for the rest: a long list of files in
    one line of a message (``some_of("abcdefg")`` is "a, b, c, d, e and 2 more")."""
    items = [str(item) for item in items]
    rest = len(items) - shown
    return ", ".join(items[:shown]) + (f" and {rest} more" if rest > 0 else "")


def told_apart(names: Iterable[str], among: Iterable[str] = ()) -> list[str]:
    """Names to list in a message: as they are, or each in double quotes when one of them (or of ``among``, names
    listed beside them in the same message) holds a comma or starts or ends with a space (a class folder "dog, big"
    beside "cat" read as three classes in "cat, dog, big")."""
    names = [str(n) for n in names]
    if any("," in n or n != n.strip() for n in [*names, *map(str, among)]):
        return [json.dumps(n, ensure_ascii=False) for n in names]
    return names
