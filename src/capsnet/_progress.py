"""Progress bars that suit both a terminal and a log file.

On a terminal: tqdm's bar, redrawn in place. Where stderr is not a
terminal (``nohup ... > run.log``, a batch scheduler's log, CI), a redrawn
bar is a stream of carriage returns, ten a second, that buries the log; there
the bar is written as one plain line every ``LOG_INTERVAL_S`` seconds
(its first and last state always, ASCII), and a bar that disappears when done
(``leave=False``: evaluation, generation) shows only if it runs that long (a
download's bar, which disappears too, always shows: a log should say what was fetched).
"""
from __future__ import annotations

import io
import sys
from typing import Any, Iterable

from tqdm import tqdm

__all__ = ["progress_bar", "LOG_INTERVAL_S"]

LOG_INTERVAL_S = 60.0  # seconds between the lines of a bar written to a log


class _Lines(io.TextIOBase):
    """A text stream that turns tqdm's carriage-return redraws into whole lines (blank redraws dropped)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        line = text.replace("\r", "").strip()
        if line:
            self.stream.write(line + "\n")
            self.stream.flush()
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def progress_bar(iterable: Iterable | None = None, *, progress: bool = True, leave: bool = True,
                 brief: bool | None = None, **kw: Any) -> tqdm:
    """``tqdm(iterable, **kw)``, off unless ``progress``; written as lines every ``LOG_INTERVAL_S`` seconds where
    stderr is not a terminal (module docstring). ``brief``: a log gets the bar only once it has run that long
    (default: for a bar that vanishes when done, ``leave=False``). Set a postfix with ``refresh=False`` so it
    waits for the next line."""
    stream = sys.stderr
    if progress and not _is_terminal(stream):
        brief = not leave if brief is None else brief
        kw = {**kw, "file": _Lines(stream), "mininterval": LOG_INTERVAL_S, "maxinterval": LOG_INTERVAL_S,
              "ascii": True, **({"delay": LOG_INTERVAL_S} if brief else {})}
    return tqdm(iterable, disable=not progress, leave=leave, **kw)
