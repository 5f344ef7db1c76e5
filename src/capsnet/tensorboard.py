"""TensorBoard logging for ``capsnet train --tensorboard DIR`` (the optional ``tensorboard`` extra).

Every evaluated epoch writes the same numbers as that epoch's line of
``metrics.jsonl`` (each as a scalar named like its key, at the epoch's
optimizer step) and, for a model that reconstructs from its class capsule
(a decoder and a ``reconstruct`` method; not SegCaps), two images of a fixed set
of held-out examples: ``reconstructions`` (the inputs above their
reconstructions from the predicted capsule) and ``pose_sweep`` (the first
example's predicted capsule, one row per pose dimension moved from -0.25 to
+0.25, as the paper's Figure 4). Only rank 0 of a distributed run writes.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import torch

from .checkpoint import unwritable
from .data.sets import unit_float

__all__ = ["TensorBoardLogger", "EXAMPLES", "check_log_dir", "claim_log_dir", "RUN_MARK"]

EXAMPLES = 8  # held-out examples drawn every epoch


def _writer_class() -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ValueError("--tensorboard needs the tensorboard package: pip install tensorboard "
                         "(or pip install 'capsnet[tensorboard]')") from None
    return SummaryWriter


RUN_MARK = ".capsnet-run"  # in a log folder: the run directory whose logs it holds (its resolved path)


def _mark(log_dir: str | os.PathLike) -> str:
    """The run directory ``log_dir``'s mark names, or "": no mark, or an empty one (a crash between its making and
    its writing), which marks nothing."""
    try:
        return (Path(log_dir) / RUN_MARK).read_text(encoding="utf-8", errors="replace").strip()
    except (FileNotFoundError, NotADirectoryError):
        return ""


def _other_run(log_dir: str | os.PathLike, run_dir: str | os.PathLike, mark: str | None = None) -> str | None:
    """The run directory another run's logs in ``log_dir`` belong to (its mark, or ``mark`` read already), or None:
    no mark, or this run's."""
    mark = _mark(log_dir) if mark is None else mark
    return None if not mark or mark == str(Path(run_dir).resolve()) else mark


def _refuse_other_run(folder: str, other: str, run_dir: str | os.PathLike) -> None:
    # a folder beside the other run's (tb/a, tb/b: README, "TensorBoard"), not inside it, where the other run's
    # events and this one's would be drawn as runs "." and "b"; inside it where the folder has no parent to share,
    # or the one beside it would be the run's own folder or this one
    parent, name = os.path.dirname(os.path.normpath(folder)), Path(run_dir).name
    beside = os.path.join(parent, name) if parent else ""
    if beside and Path(beside).resolve() == Path(folder).resolve():  # two runs of one folder name (runs/a/mnist,
        beside = os.path.join(parent, f"{name}-2")  # runs/b/mnist): beside it under another name, not inside it
    if not beside or Path(beside).resolve() == Path(run_dir).resolve():
        parent, beside = folder, os.path.join(folder, name)
    raise ValueError(f"--tensorboard {folder} holds the TensorBoard logs of another run ({other}): TensorBoard draws "
                     f"the scalars of one folder as one run's, so the two would be interleaved at the same steps; "
                     f"give each run a folder of its own (e.g. --tensorboard {beside}: `tensorboard --logdir "
                     f"{parent}` shows every run under it); if that run is this one, moved since, remove "
                     f"{os.path.join(folder, RUN_MARK)} (its mark) and this run claims the folder")


def claim_log_dir(log_dir: str | os.PathLike, run_dir: str | os.PathLike) -> None:
    """Mark ``log_dir`` as ``run_dir``'s (created only if unmarked, so of two runs starting at once one marks it),
    or the ValueError of ``check_log_dir`` when another run marked it (two runs logged into one folder, and
    TensorBoard drew them as one run). A folder of logs from before the mark is taken as this run's."""
    path = Path(log_dir) / RUN_MARK
    text = str(Path(run_dir).resolve()) + "\n"
    try:
        _create_whole(path, text)
    except FileExistsError:
        mark = _mark(log_dir)
        if (other := _other_run(log_dir, run_dir, mark)) is not None:
            _refuse_other_run(os.fspath(log_dir), other, run_dir)
        if not mark:  # an empty mark (a crash of an older capsnet as it made it): this run's now
            path.write_text(text, encoding="utf-8")


def _create_whole(path: Path, text: str) -> None:
    """Create ``path`` holding ``text``, or a FileExistsError: the file appears whole, by a hard link of a written
    temporary file (an O_EXCL file was empty until written, and a second run starting then read the empty mark as
    nobody's and claimed the folder too); where links fail (some file systems), O_EXCL and a write."""
    temp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{os.urandom(4).hex()}")
    try:
        temp.write_text(text, encoding="utf-8")
        try:
            os.link(temp, path)
            return
        except FileExistsError:
            raise
        except OSError:  # no hard links here
            pass
    finally:
        temp.unlink(missing_ok=True)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


def check_log_dir(log_dir: str | os.PathLike | None, run_dir: str | os.PathLike | None = None,
                  resume: bool = False) -> None:
    """Before any work (data loading, a run's first file): ``log_dir`` names a folder that can be made and
    written, not marked as another run's than ``run_dir`` (``claim_log_dir``), without logs already unless the run
    resumes (a new run at the path of a removed one was drawn as one curve with its logs), and the tensorboard
    package is there; a ValueError naming the fix otherwise. An empty name is refused rather than left to SummaryWriter,
    which logs to ./runs/DATE_HOST for it."""
    if log_dir is None:
        return
    if str(log_dir).strip() == "":
        raise ValueError("--tensorboard needs a folder for the logs, got an empty name; give one, or leave the flag "
                         "out")
    _writer_class()
    folder = os.fspath(log_dir)
    # not made here (a run refused later, for its data, left the empty folder behind): the nearest folder that is
    # there must take it (TensorBoardLogger makes it)
    path = Path(folder).absolute()
    nearest = next(p for p in (path, *path.parents) if p.exists())
    if not nearest.is_dir():
        raise ValueError(f"--tensorboard {folder}: the folder cannot be made ({nearest} is a file); give a folder "
                         f"you can write")
    if (why := unwritable(nearest)) is not None:  # the run files' probe (os.access passes root on a read-only disk)
        raise ValueError(f"--tensorboard {folder}: the folder "
                         f"{'is not writable' if nearest == path else f'cannot be made in {nearest}'} ({why}); give "
                         f"a folder you can write")
    if nearest != path:
        return  # a folder still to make holds no marks or logs
    if run_dir is not None and (other := _other_run(folder, run_dir)) is not None:
        _refuse_other_run(folder, other, run_dir)
    if run_dir is not None and not resume and any(Path(folder).glob("events.out.tfevents.*")):
        raise ValueError(f"--tensorboard {folder} already holds TensorBoard logs (of an earlier run at "
                         f"{Path(run_dir).resolve()}, or another), and TensorBoard would draw this new run's scalars "
                         f"as one curve with theirs; give this run a folder of its own (e.g. --tensorboard "
                         f"{os.path.join(folder, Path(run_dir).name)}-2), or remove {folder} if those logs are not "
                         f"wanted (a resumed run logs on there)")


class TensorBoardLogger:
    """Writes one epoch at a time into ``log_dir`` (created if missing)."""

    def __init__(self, log_dir: str | os.PathLike, images: torch.Tensor,
                 run_dir: str | os.PathLike | None = None) -> None:
        """``images``: the held-out examples drawn every epoch, (N, C, H, W), uint8 or float in [0, 1]; ``run_dir``,
        the run whose logs these are: the folder is marked as its (``claim_log_dir``)."""
        os.makedirs(log_dir, exist_ok=True)
        if run_dir is not None:
            claim_log_dir(log_dir, run_dir)
        self.log_dir, self._writer_made = str(log_dir), _writer_class()
        self._writer: Any = None  # made at the first epoch logged: each SummaryWriter starts an events file, and a
        # run that logged nothing (a finished run resumed, a stop before its first evaluation) left an empty one
        self.images = unit_float(images[:EXAMPLES])

    @property
    def writer(self) -> Any:
        """The SummaryWriter, made when first asked for."""
        if self._writer is None:
            self._writer = self._writer_made(log_dir=self.log_dir)
        return self._writer

    def log_epoch(self, model: torch.nn.Module, record: dict[str, Any]) -> None:
        """The epoch's metrics as scalars, and its reconstructions and pose sweep where the model decodes."""
        step = int(record["step"])
        for key, value in record.items():
            if key not in ("epoch", "step") and isinstance(value, (int, float)) and math.isfinite(value):
                self.writer.add_scalar(key, value, step)
        from .models import reconstructs

        if reconstructs(model):
            from .figures.arrays import pose_sweep, reconstructions
            from .runtime import evaluating

            with evaluating(model):  # its own mode after (the figures keep it too)
                device = next(model.parameters()).device
                x = self.images.to(device)
                done = reconstructions(model, x)
                grid = torch.cat([x.cpu(), done.from_predicted.clamp(0, 1)], dim=0)  # inputs, then reconstructions
                self.writer.add_images("reconstructions", _tile(grid, rows=2), step, dataformats="CHW")
                sweep = pose_sweep(model, x[:1])[0]  # (dims, deltas, H, W) or (dims, deltas, C, H, W)
                if sweep.dim() == 4:
                    sweep = sweep.unsqueeze(2)
                A, K = sweep.shape[:2]
                self.writer.add_images("pose_sweep", _tile(sweep.reshape(A * K, *sweep.shape[2:]).clamp(0, 1), rows=A),
                                       step, dataformats="CHW")
        self.writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def _tile(images: torch.Tensor, rows: int, pad: int = 2) -> torch.Tensor:
    """(N, C, H, W) images in ``rows`` rows (row-major) on a grey grid: (C, rows (H + pad) - pad, cols (W + pad) - pad)."""
    N, C, H, W = images.shape
    cols = -(-N // rows)
    out = torch.full((C, rows * (H + pad) - pad, cols * (W + pad) - pad), 0.5)
    for n in range(N):
        r, c = divmod(n, cols)
        out[:, r * (H + pad):r * (H + pad) + H, c * (W + pad):c * (W + pad) + W] = images[n]
    return out
