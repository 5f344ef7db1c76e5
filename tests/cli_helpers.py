"""What the command-line tests (and others) share (importable from any test folder: tests/ is on the path through its
conftest)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from capsnet.checkpoint import load_checkpoint
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


def assert_same_run(a_dir: Path, b_dir: Path) -> None:
    """Two runs' last checkpoints hold the same weights and the same history (its throughput aside): a run stopped
    and resumed ended as the straight run did."""
    import torch

    a, b = load_checkpoint(a_dir, "last"), load_checkpoint(b_dir, "last")
    assert a.model_state.keys() == b.model_state.keys()
    assert all(torch.equal(a.model_state[k], b.model_state[k]) for k in a.model_state)
    timeless = [{k: v for k, v in r.items() if k != "train_images_per_s"} for r in a.state["history"]]
    assert timeless == [{k: v for k, v in r.items() if k != "train_images_per_s"} for r in b.state["history"]]
