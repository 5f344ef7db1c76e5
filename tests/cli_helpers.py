"""What the command-line tests share (importable from any test folder: tests/ is on the path through its conftest)."""
from __future__ import annotations

import subprocess

from capsnet.cli import main


def in_process(capsys, *args) -> subprocess.CompletedProcess:
    """``capsnet ARGS`` through ``capsnet.cli.main`` here; exit status and output as a subprocess would give them."""
    try:
        code = main([str(a) for a in args])
    except SystemExit as e:  # argparse: --help, or a bad flag
        code = e.code
    out = capsys.readouterr()
    return subprocess.CompletedProcess(["capsnet", *map(str, args)], code, out.out, out.err)
