"""SIGTERM taken as Ctrl-C inside a block: what kill, timeout, docker stop and a scheduler's preemption send."""
from __future__ import annotations

import contextlib
import signal
from typing import Any, Iterator

__all__ = ["sigterm_as_interrupt"]


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt inside the block (on the main thread, where it is not ignored; elsewhere
    nothing changes), so the block's cleanup runs as on Ctrl-C: every command but train (cli.main) removes its
    temporary files and says one line; an experiment's parent stops its workers, each saving where it is (killed at
    once, it left them to their watchdogs); a download removes its part file (left for good before: the loaders
    download a file only while it is missing, and only a download swept its stale parts)."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    installed, before = False, None
    try:  # a SIGTERM this process was started ignoring stays ignored (as train.SaveThenStop leaves it)
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN:
            before, installed = signal.signal(signal.SIGTERM, interrupt), True
    except ValueError:  # not the main thread
        pass
    try:
        yield
    finally:
        if installed:  # (None: a handler not installed from Python, which Python cannot put back: the default)
            signal.signal(signal.SIGTERM, signal.SIG_DFL if before is None else before)
