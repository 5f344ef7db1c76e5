"""What the command-line tests (and others) share (importable from any test folder: tests/ is on the path through its
conftest)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from capsnet.cli import main


def in_process(capsys, *args) -> subprocess.CompletedProcess:
    """``capsnet ARGS`` through ``capsnet.cli.main`` here; exit status and output as a subprocess would give them."""
    try:
        code = main([str(a) for a in args])
    except SystemExit as e:  # argparse: --help, or a bad flag
        code = e.code
    out = capsys.readouterr()
    return subprocess.CompletedProcess(["capsnet", *map(str, args)], code, out.out, out.err)


def replace_folder(folder: Path, files: dict[str, str]) -> None:
    """Another run's folder in ``folder``'s place, as a user or another run makes it: the folder removed and made
    again holding ``files`` (name -> text; a ``.lock`` among them is the other run's)."""
    shutil.rmtree(folder)
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
