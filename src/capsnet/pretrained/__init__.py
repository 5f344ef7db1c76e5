"""Trained models shipped inside the package, named ``pretrained:NAME`` wherever a checkpoint is taken.

Each is an ordinary capsnet checkpoint (``NAME.safetensors``: configs,
history and float16 weights, no optimizer state) beside its model card
(``NAME.md``), written by tools/make_pretrained.py. ``capsnet viz`` opens
``DEFAULT`` when no ``--checkpoint`` is given; ``capsnet eval --checkpoint
pretrained:NAME`` scores one; ``capsnet.models.pretrained(NAME)`` loads one.
"""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["DIR", "DEFAULT", "PREFIX", "is_shipped", "names", "path", "named", "card", "measured", "pack"]

DIR = Path(__file__).resolve().parent
DEFAULT = "capsnet-mnist-small"
PREFIX = "pretrained:"


def is_shipped(source: object) -> bool:
    """Whether a checkpoint argument names a shipped model (``pretrained:NAME``): loaded from the package, and
    nothing derived from it (a report, an export, figures) may be written beside it."""
    return isinstance(source, str) and source.startswith(PREFIX)


def names() -> list[str]:
    """The shipped models' names, sorted."""
    return sorted(p.stem for p in _dir().glob("*.safetensors"))


def _dir() -> Path:
    return DIR  # looked up at call time, so tests can point it elsewhere


def named(file: str | os.PathLike) -> str:
    """How a report names checkpoint ``file``: ``pretrained:NAME`` for a shipped model's file (its place inside an
    installed package differs from one install to the next), else the path as given."""
    p = Path(file)
    try:
        real = p.resolve()  # a link to a shipped file: the model it holds, by the file's own name
        if real.suffix == ".safetensors" and real.parent == _dir().resolve() and real.stem in names():
            return PREFIX + real.stem
    except OSError:  # an unreadable path is no shipped model
        pass
    return str(p)


def path(name: str) -> Path:
    """The checkpoint file of shipped model ``name`` (``pretrained:`` may lead); a ValueError lists the names."""
    name = os.fspath(name)  # a Path("capsnet-mnist-small") met "'PosixPath' object has no attribute 'startswith'"
    name = name[len(PREFIX):] if name.startswith(PREFIX) else name
    if name not in names():
        import difflib

        shipped = ", ".join(f"{PREFIX}{n}" for n in names()) or "none in this installation"
        # a model's registry name (segcaps) or a slip of the keys: the shipped models it begins or nearly spells
        near = [n for n in names() if name and n.startswith(name)] or difflib.get_close_matches(name, names(), n=1)
        meant = f" (did you mean {' or '.join(PREFIX + n for n in near)}?)" if near else ""
        what = f"no shipped model named {name!r}" if name else f"{PREFIX} names no shipped model (give {PREFIX}NAME)"
        raise ValueError(f"{what}{meant}; the shipped ones are {shipped}")
    return _dir() / f"{name}.safetensors"


def card(name: str) -> str:
    """The model card (Markdown) of shipped model ``name``."""
    return path(name).with_suffix(".md").read_text(encoding="utf-8")


def measured(name: str) -> dict:
    """What tools/make_pretrained.py measured of shipped model ``name`` with its shipped (float16) weights, as its
    card records it (the ``<!-- measured: {...} -->`` line): e.g. ``mnist_test_accuracy`` on the whole test set,
    ``test_dice``, ``test_ssim``; {} for a card without one."""
    import json
    import re

    found = re.search(r"<!-- measured: (\{.*\}) -->", card(name))
    return json.loads(found.group(1)) if found else {}


def pack(run: str | Path, target: str | Path) -> Path:
    """Write the final-epoch weights of training run ``run`` to ``target`` as a shippable checkpoint.

    Keeps the configs and the epoch, step and metric history of the run's
    ``last`` checkpoint (its final epoch, never the best over epochs) and its
    model weights in float16; drops the optimizer and random-number state.
    Returns ``target``; the write is atomic.
    """
    import torch

    from ..checkpoint import Checkpoint, load_checkpoint, same_path, save_checkpoint

    if Path(run).is_file() and Path(run).name != "last.safetensors":  # a file: load_checkpoint takes it as it is
        raise ValueError(f"{run} is not a run's last checkpoint (a best.safetensors is the best epoch, not the "
                         f"final one): give the run directory or its last.safetensors")
    target = Path(target)
    if target.is_dir():
        raise ValueError(f"the target {target} is a folder; give a file path, e.g. {target / 'NAME.safetensors'}")
    if target.suffix.lower() != ".safetensors":  # a run's metrics.jsonl or config.json was written over, silently
        raise ValueError(f"the target {target} is not a .safetensors name; pack writes a checkpoint: give one, e.g. "
                         f"{target.with_suffix('.safetensors').name}")
    if not target.parent.is_dir():
        raise ValueError(f"cannot write {target}: the folder {target.parent} does not exist; make it first")
    run_dir = Path(run) if Path(run).is_dir() else Path(run).parent
    if any(same_path(target, run_dir / f"{w}.safetensors") for w in ("best", "last")):  # Last.safetensors too, on
        # a case-insensitive disk
        raise ValueError(f"{target} is the run's own checkpoint; packing over it would lose its optimizer state (and "
                         f"with it the run's resume): give another target")
    last = load_checkpoint(run, which="last")
    if last.state.get("within", {}).get("evaluation_pending"):  # trained, not evaluated: not yet a final epoch
        raise ValueError(f"{last.path} holds epoch {last.state['within']['epoch']} trained but not yet evaluated; "
                         f"evaluate it (capsnet train --out {run} --resume) and pack the run then")
    if "within" in last.state:  # its weights are part-way through an epoch, not a final epoch's
        raise ValueError(f"{last.path} was saved {last.state['within']['batches']} batches into epoch "
                         f"{last.state['within']['epoch']}; finish that epoch (capsnet train --out {run} --resume) "
                         f"and pack the run then")
    planned = last.train_config.get("epochs")
    if isinstance(planned, int) and last.state.get("epoch", 0) < planned:  # stopped at an epoch's end, not finished
        raise ValueError(f"{last.path} stopped after epoch {last.state.get('epoch', 0)} of the {planned} it was "
                         f"training: its weights are not a final epoch's; finish the run (capsnet train --out "
                         f"{run_dir} --resume) and pack it then")
    half = {k: v.to(torch.float16) if v.is_floating_point() else v for k, v in last.model_state.items()}
    state = {key: last.state[key] for key in ("epoch", "step", "history") if key in last.state}
    save_checkpoint(target, Checkpoint(last.model_name, last.model_config, last.train_config, state, half))
    return target
