"""The ``capsnet`` command's entry point: the CLI imported inside a guard, so a Ctrl-C while torch loads (seconds on
a cold start) ends in one line, exit status 130, not a traceback from inside torch's import."""
from __future__ import annotations

import sys


def main() -> int:
    try:
        from . import cli
    except KeyboardInterrupt:
        print("capsnet: interrupted while starting", file=sys.stderr)
        return 130
    cli.AS_PROGRAM = True
    return cli.main()
