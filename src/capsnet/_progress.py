"""Progress bars that suit both a terminal and a log file.

On a terminal: tqdm's bar, redrawn in place. Where stderr is not a
terminal (``nohup ... > run.log``, a batch scheduler's log, CI), a redrawn
bar is a stream of carriage returns, ten a second, that buries the log; there
the bar is written as one plain line every ``LOG_INTERVAL_S`` seconds
(its first and last state always, ASCII), and a bar that disappears when done
(``leave=False``: evaluation, generation) shows only if it runs that long (a
download's bar, which disappears too, always shows, to its end: a log should say
what was fetched). A Jupyter kernel's output counts as a terminal: its front end
redraws the bar in place.
"""
from __future__ import annotations

import io
import re
import sys
from typing import Any, Iterable

from tqdm import tqdm  # plain text bars: tqdm.auto warns in notebooks without ipywidgets

__all__ = ["progress_bar", "LOG_INTERVAL_S", "one_line_warnings", "write_line"]

LOG_INTERVAL_S = 60.0  # seconds between the lines of a bar written to a log
_ESCAPES = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # terminal control sequences (tqdm moves the cursor for nested bars)


class _Lines(io.TextIOBase):
    """A text stream that turns tqdm's carriage-return redraws into whole lines (blank redraws dropped)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        line = _ESCAPES.sub("", text).replace("\r", "").strip()  # a nested bar's cursor moves are not text
        if line:
            self.stream.write(line + "\n")
            self.stream.flush()
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


def _is_terminal(stream: Any) -> bool:
    """Whether a bar redrawn in place shows as one: a terminal, or a Jupyter kernel's output (its streams say they
    are not terminals, but its front end draws carriage returns in place)."""
    if "ipykernel" in sys.modules:
        return True
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
    if stream is None:  # no stderr at all (closed by a daemon's launcher, pythonw): nowhere to draw, so no bar (the
        progress = False  # first line written killed training, without a word, as the traceback had nowhere to go)
    if progress and not _is_terminal(stream):
        brief = not leave if brief is None else brief
        kw = {**kw, "file": _Lines(stream), "mininterval": LOG_INTERVAL_S, "maxinterval": LOG_INTERVAL_S,
              "ascii": True, **({"delay": LOG_INTERVAL_S} if brief else {})}
        # a log's bar is a record: it ends on its last state (a brief bar that ran past the delay too: left
        # unfinished, a 150 s evaluation's log ended at 80%); one done within the delay writes nothing still
        leave = True
    return tqdm(iterable, disable=not progress, leave=leave, **kw)


def write_line(line: str) -> None:
    """``line`` on stdout above the bars (``tqdm.write``), flushed: stdout redirected to a log is block-buffered, and
    each epoch's result line reached the log only when the run ended (none, for a run killed outright)."""
    tqdm.write(line)
    sys.stdout.flush()


def one_line_warnings(prefix):
    """A ``warnings.showwarning`` that prints capsnet's own warnings as one line, ``PREFIX MESSAGE`` (no file path,
    no category), and the rest as the hook it replaces shows them: for the command line, and for an experiment's
    worker processes (a spawned process has not the command line's hook). ``prefix``: a string, or a function
    giving it at each warning (None: shown as the replaced hook shows it)."""
    import warnings
    from pathlib import Path

    package, shown = str(Path(__file__).parent), warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        now = prefix() if callable(prefix) else prefix
        if now is None or not str(filename).startswith(package):
            return shown(message, category, filename, lineno, file, line)
        print(f"{now}{message}", file=file or sys.stderr, flush=True)
    return show
