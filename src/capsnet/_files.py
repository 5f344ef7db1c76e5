"""Putting a finished temporary file in a file's place, as Windows allows it.

``os.replace`` is atomic everywhere, but Windows refuses it while another program holds the target (or the
temporary file) open: an editor, a reader of metrics.jsonl, a virus scanner looking at a file just written.
``replace_file`` tries again there for a few seconds before it gives up with an error naming the file. Checkpoints,
reports, downloads and written IDX files all go through it.
"""
from __future__ import annotations

import os
import time

__all__ = ["replace_file", "WINDOWS", "REPLACE_RETRY_S"]

WINDOWS = os.name == "nt"
REPLACE_RETRY_S = 5.0  # Windows: how long a file another program holds open is waited for before giving up


def replace_file(tmp: str | os.PathLike, path: str | os.PathLike, *, windows: bool | None = None,
                 retry_s: float | None = None) -> None:
    """``os.replace(tmp, path)``; on Windows (``windows``, default ``WINDOWS``) a PermissionError is tried again for
    up to ``retry_s`` seconds (default ``REPLACE_RETRY_S``), then raised naming ``path`` and what to do."""
    if not (WINDOWS if windows is None else windows):
        os.replace(tmp, path)
        return
    end = time.monotonic() + (REPLACE_RETRY_S if retry_s is None else retry_s)
    wait = 0.05
    while True:
        try:
            os.replace(tmp, path)
            return
        except PermissionError as e:
            if time.monotonic() >= end:
                raise PermissionError(e.errno, f"cannot replace {path}: another program holds it open; close it "
                                               f"and try again", str(path)) from e
            time.sleep(wait)
            wait = min(2 * wait, 0.5)
