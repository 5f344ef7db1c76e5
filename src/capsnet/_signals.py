"""SIGTERM taken as Ctrl-C inside a block: what kill, timeout, docker stop and a scheduler's preemption send."""
from __future__ import annotations

import contextlib
import signal
from typing import Any, Iterator

__all__ = ["handled", "sigterm_as_interrupt"]


@contextlib.contextmanager
def handled(signals: tuple[int, ...], handler: Any) -> Iterator[None]:
    """``handler`` for each of ``signals`` inside the block, the handlers before put back after it: on the main
    thread, for a signal this process was not started ignoring (one ignored stays ignored, as train.SaveThenStop
    leaves it); elsewhere nothing changes."""
    before = {}
    try:
        for s in signals:
            if signal.getsignal(s) is not signal.SIG_IGN:
                before[s] = signal.signal(s, handler)
    except ValueError:  # not the main thread
        pass
    try:
        yield
    finally:
        for s, h in before.items():  # (None: a handler not installed from Python, which Python cannot put back)
            signal.signal(s, signal.SIG_DFL if h is None else h)


def sigterm_as_interrupt() -> contextlib.AbstractContextManager[None]:
    """SIGTERM raises KeyboardInterrupt inside the block (on the main thread, where it is not ignored; elsewhere
    nothing changes), so the block's cleanup runs as on Ctrl-C: every command but train (cli.main) removes its
    temporary files and says one line; an experiment's parent stops its workers, each saving where it is (killed at
    once, it left them to their watchdogs); a download removes its part file (left for good before: the loaders
    download a file only while it is missing, and only a download swept its stale parts)."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    return handled((signal.SIGTERM,), interrupt)
