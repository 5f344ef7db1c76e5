"""Training: one ``fit()`` that reads top to bottom, for every registered model and task.

The model's loss comes from its registry entry (``capsnet.models``), its
training batches and evaluation splits from its task (``capsnet.data.tasks``);
evaluation is ``capsnet.evaluate``. The whole data set lives on the device as
one tensor; batches are taken by index and augmented as batched tensor
operations. Each epoch's shuffle and
shifts come from a generator seeded by (seed, epoch), so a run resumed from an
epoch's checkpoint replays exactly what an uninterrupted run would have done.

Under torchrun every process runs ``fit``: each makes the same global batch
and trains on its slice of it through ``DistributedDataParallel``
(``capsnet.distributed``); rank 0 alone evaluates, writes and shows progress.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
import logging
import math
import os
import signal
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ._config import JsonConfig, OutOfRange, check_types
from ._numbers import is_finite
from ._progress import progress_bar, write_line
from .average import (WeightAverage, applied, restore_training_weights, with_training_weights,
                      without_training_weights)
from .checkpoint import (Checkpoint, CheckpointError, RunLock, atomic_write_text, check_fits_before_building,
                         header_metadata, load_checkpoint, load_weights, rank_rng_key, read_json_object,
                         save_checkpoint, saved_point, short_repr)
from .data.augment import AUGMENTATIONS, augmentation
from .data.multimnist import top2_correct
from .data.segmentation import overlap_scores
from .data.idx import DataError
from .data.tasks import (CLASSES_PREFIX, EXAMPLE_NOUN, FOLDER_PREFIX, PAIRS_PREFIX, PREPARED, TASKS, Split,
                         absolute_dataset, class_change, dataset_stem, folder_change, folder_contents, input_shape,
                         load_training, task, saved_folder, user_folder)
from .distributed import (DistributedError, Launch, PeerLostError, agree, barrier, identified, join, launcher, leave,
                          shard, share_weight)
from .evaluate import SEGMENTATION_BATCH_SIZE, evaluate_split
from .losses import WEIGHTED_SEGMENTATION_LOSSES, batch_foreground_weight
from .models import MODELS, model_name, model_spec
from .models.rounds import unused_rounds
from .routing import ROUTINGS, list_routings
from .runtime import (AMP_MODES, autocast, compile_model, fuses_adam, grad_scaler, keeps_rng, require_compiler,
                      resolve_device, scale_tensor, sum_dtype)

__all__ = ["TrainConfig", "LR_SCHEDULES", "budget_warnings", "check_fit_arguments", "fit", "lr_at", "run_steps", "make_optimizer",
           "NonFiniteLoss", "ResumeError", "restarted_run",
           "resume_configs", "saved_configs", "finished", "describe_epoch", "start_or_resume", "input_fields"]

log = logging.getLogger(__name__)

LR_SCHEDULES = ("exponential", "linear")  # lr_at: the authors' smooth decay, or warm-up then straight down to 0


MAX_LR = 1e30  # --lr above this: Adam's first update overflows float32 (a RuntimeError from inside the step)


@dataclass(frozen=True)
class TrainConfig(JsonConfig):
    """How a run trains: ``fit(model_config, TrainConfig(...), run_dir)``; ``capsnet train``'s flags of the same names.

    Attributes:
        dataset: a task name (``capsnet.data.tasks.TASKS``) or a user's folder (``folder:DIR``, ``pairs:DIR``).
        epochs, batch_size, seed: the run's length, its training batch and the seed of all its randomness.
        lr, lr_decay, lr_decay_steps: Adam's rate, decayed by ``lr_decay`` every ``lr_decay_steps`` steps
            (Sabour et al.'s code: 1e-3, 0.96, 2,000); ``lr_schedule`` "linear" decays to 0 at the run's end
            instead; ``warmup_steps``: a linear ramp up to the schedule first (0: none); ``lr_min``: a floor
            under the rate after the ramp (0: none; Efficient-CapsNet's code: 5e-5). ``lr_at`` gives the rate.
        recon_weight: the decoder's loss weight (section 4.1: 0.0005).
        shift, augment: random shifts of up to ``shift`` pixels, or "efficient-capsnet"'s recipe.
        val_size: examples held out of training to choose the best checkpoint (0: the final epoch is the result).
        train_size, test_size: a seeded subset of the training set, the first examples of the test set (0: all).
        eval_batch_size, eval_every: evaluation's batch, and evaluate every this many epochs and after the last.
        amp: "bf16" trains under bfloat16 autocast, "fp16" under float16 autocast with a gradient scaler (steps
            whose gradient is not finite skipped); evaluation stays float32; "none".
        ema_decay: evaluate and save a moving average of the weights (0: off; e.g. 0.999).
        grad_clip: clip the gradient's global norm to this before each step (0: off).
    """

    dataset: str = "mnist"
    epochs: int = 10
    batch_size: int = 128
    # Sabour et al.'s code: Adam, 1e-3 (SegCaps' code used 1e-4); `capsnet train` and the experiments give a model
    # its registry entry's own (ModelSpec.train_defaults: EM 3e-3, Efficient-CapsNet 5e-4, the GANs 2e-4)
    lr: float = 1e-3
    lr_decay: float = 0.96  # Sabour et al.'s code: x0.96 ...
    lr_decay_steps: int = 2000  # ... every 2,000 steps (smooth exponential decay)
    lr_schedule: str = "exponential"  # or "linear": warm-up, then down to 0 at the run's end (lr_decay* unused)
    warmup_steps: int = 0  # steps of a linear ramp from lr / warmup_steps up to the schedule's rate (0: none)
    lr_min: float = 0.0  # after the warm-up the rate never falls below this (0: no floor; Efficient-CapsNet: 5e-5)
    recon_weight: float = 0.0005  # section 4.1: sum of squared errors scaled by 0.0005
    shift: int = 2  # section 5: random shifts of up to 2 pixels (plain data sets; the tasks place digits themselves)
    augment: str = "shift"  # or "efficient-capsnet": that paper's rotate, shift, squish and erase (its model's own)
    val_size: int = 0  # examples held out of training to choose the best checkpoint
    train_size: int = 0  # 0: all; else a seeded subset of this many (nested across sizes for one seed)
    test_size: int = 0  # 0: all; else the first this many test examples (multimnist: this many test pairs)
    eval_batch_size: int = 256
    eval_every: int = 1  # evaluate every this many epochs, and after the last (checkpoints: see SAVE_AFTER_S)
    seed: int = 0
    amp: str = "none"  # "bf16"/"fp16": training steps under bfloat16/float16 autocast (for GPUs; evaluation fp32)
    ema_decay: float = 0.0  # evaluate and save a moving average of the weights (GANs: the generator's; 0: off)
    grad_clip: float = 0.0  # the gradient's global norm clipped to this before each step (0: off; not for GANs)
    # Adam's first-moment decay, beta1 (PyTorch's 0.9; SegCaps' reference code trains with 0.99; not for GANs, whose
    # loop keeps pix2pix's 0.5)
    adam_beta1: float = 0.9

    def __post_init__(self) -> None:
        check_types(self)  # a checkpoint's "epochs": "10" or "lr": null is refused by name
        if self.dataset not in TASKS and not user_folder(self.dataset):
            raise ValueError(f"unknown dataset {self.dataset!r}; valid names are {', '.join(TASKS)}, or "
                             f"{FOLDER_PREFIX}DIR, {PAIRS_PREFIX}DIR or {CLASSES_PREFIX}DIR (your own folders)")
        # a user's folder by its absolute path (one saved relative by an older capsnet: against this directory)
        object.__setattr__(self, "dataset", absolute_dataset(self.dataset))
        for name in ("epochs", "batch_size", "lr_decay_steps", "eval_batch_size", "eval_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("val_size", "train_size", "test_size", "shift", "seed", "warmup_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.seed >= 2**63:  # torch's generators take seeds below 2^64; the run's are made from this one
            raise ValueError(f"seed must be below 2^63, got {self.seed}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be a positive number, got {self.lr}")
        if self.lr > MAX_LR:  # Adam's first step, lr / (1 - beta1), past float32's 3.4e38: a traceback from the step
            raise ValueError(f"lr {self.lr:g} is too large: at most {MAX_LR:g} (Adam's first float32 update "
                             f"overflows from about 3.4e37 on); the paper's is 1e-3")
        if not 0 < self.lr_decay <= 1:
            raise ValueError(f"lr_decay must lie in (0, 1], got {self.lr_decay}")
        if not 0 <= self.lr_min <= self.lr:
            raise ValueError(f"lr_min must lie in [0, lr] (a floor under the decaying rate; lr is {self.lr:g}), got "
                             f"{self.lr_min:g}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"unknown lr_schedule {self.lr_schedule!r}; valid values are {', '.join(LR_SCHEDULES)}")
        if self.recon_weight < 0:
            raise ValueError(f"recon_weight must be >= 0, got {self.recon_weight}")
        if self.augment not in AUGMENTATIONS:
            raise ValueError(f"unknown augment {self.augment!r}; valid values are {', '.join(AUGMENTATIONS)}")
        if self.amp not in AMP_MODES:
            raise ValueError(f"unknown amp {self.amp!r}; valid values are {', '.join(AMP_MODES)}")
        if not 0 <= self.adam_beta1 < 1:
            raise ValueError(f"adam_beta1 must lie in [0, 1) (PyTorch's 0.9; SegCaps' reference code: 0.99), got "
                             f"{self.adam_beta1}")
        if not 0 <= self.ema_decay < 1:
            raise ValueError(f"ema_decay must lie in [0, 1) (0: no average; e.g. 0.999), got {self.ema_decay}")
        if self.grad_clip < 0:  # (not finite: refused by check_types)
            raise ValueError(f"grad_clip must be >= 0 (0: no clipping; e.g. 1.0), got {self.grad_clip}")


def lr_at(step: int, cfg: TrainConfig, total_steps: int | None = None) -> float:
    """Learning rate after ``step`` optimizer steps, for the step that follows.

    ``"exponential"`` (the authors' code): lr * lr_decay^(step / lr_decay_steps), times (step + 1) / W while
    step < W = ``warmup_steps`` (a ramp up to the decaying rate; none when W is 0; a run shorter than W ends on it).
    ``"linear"``, with W = ``warmup_steps`` and T = ``total_steps``, the run's
    steps: lr * (step + 1) / W while step < W (the first step at lr / W, the
    W-th at lr), then lr * (T - step) / (T - W), which reaches 0 at step T,
    the end of the run (its last step at lr / (T - W)). A resume with more
    epochs has a larger T: the decay is stretched over the new total.
    Either way, from step W on the rate is at least ``lr_min`` (the decay
    stops there; the ramp is left as it is).
    """
    if cfg.lr_schedule == "exponential":
        if step < cfg.warmup_steps:
            return cfg.lr * cfg.lr_decay ** (step / cfg.lr_decay_steps) * ((step + 1) / cfg.warmup_steps)
        return max(cfg.lr_min, cfg.lr * cfg.lr_decay ** (step / cfg.lr_decay_steps))
    if total_steps is None:
        raise ValueError("lr_schedule 'linear' decays to 0 at the run's end: lr_at needs the run's total_steps")
    W, T = cfg.warmup_steps, total_steps
    if W >= T:
        raise ValueError(f"warmup_steps ({W}) must be fewer than the run's {T} optimizer steps; lower --warmup-steps "
                         f"or train for more steps")
    if step < W:
        return cfg.lr * (step + 1) / W
    return max(cfg.lr_min, cfg.lr * max(0, T - step) / (T - W))


def run_steps(cfg: TrainConfig, examples: int) -> int:
    """The optimizer steps of the whole run, ``cfg.epochs`` epochs of ``examples`` in batches of ``cfg.batch_size``
    (the linear schedule's T); a schedule that cannot run over them (a linear warm-up as long as the run) is a
    ValueError now, before the loop writes any file."""
    total = cfg.epochs * math.ceil(examples / cfg.batch_size)
    lr_at(0, cfg, total)
    return total


def _seeded_generator(seed: int, epoch: int, device: torch.device) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed((seed * 1_000_003 + epoch) % 2**64)  # the same seed as before for every seed below 2^44
    return g


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.Adam:
    """Adam at ``cfg.lr`` with beta1 ``cfg.adam_beta1``; fused into one kernel per step where ``fuses_adam`` says,
    PyTorch's default elsewhere."""
    return torch.optim.Adam(model.parameters(), lr=cfg.lr, betas=(cfg.adam_beta1, 0.999),
                            fused=True if fuses_adam(device.type) else None)


_DEVICE_FLAGS = ("fused", "foreach", "capturable")


def _load_optimizer_state(opt: torch.optim.Adam, saved: dict[str, Any]) -> None:
    """Load Adam's state, keeping this device's implementation (fused or not: ``fuses_adam``).

    The flags are swapped into the saved groups before loading, because
    ``load_state_dict`` places each ``step`` by the saved groups' flags: a run
    saved unfused (on CPU) and resumed fused on CUDA would otherwise keep its
    steps on the CPU, where the fused kernel refuses them.
    """
    groups = [{**g, **{k: cur[k] for k in _DEVICE_FLAGS if k in cur}}
              for g, cur in zip(saved["param_groups"], opt.param_groups)]
    opt.load_state_dict({**saved, "param_groups": groups})


def _correct(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """(B,) how right each example is, 0..1: argmax right, or for pairs the paper's top-2 rule (both longest
    capsules are the labels), or for masks (B, 1, H, W) the Dice of the mask predicted at probability > 0.5."""
    if labels.dim() == 4:
        return overlap_scores(scores > 0.5, labels > 0)[0]  # the Dice
    return top2_correct(scores, labels) if labels.dim() == 2 else scores.argmax(1) == labels


class NonFiniteLoss(ValueError):
    """Training stopped at a loss that is NaN or infinite; the last good checkpoint is kept."""


SAVE_AFTER_S = 60.0  # an epoch without an evaluation still checkpoints when the last save is this old (seconds):
# a long run killed between evaluations loses about a minute, a fast one (many short epochs) spends no time saving
SAVE_EVERY_S = 300.0  # inside an epoch, last.safetensors is rewritten when the last save is this old (seconds; fit's
# save_every_s, `capsnet train --save-every MINUTES`): a run whose epochs outlast a sitting resumes mid-epoch
_CHECK_EVERY = 64  # steps between checks that the loss stayed finite (each waits for the device once)
# --amp fp16: a loss scale below this (2^-16, from 2^16 at the start: 32 skipped steps more than 2,000-step growths)
# stops the run: a NaN or infinity in the backward pass that recurs, which no scale mends, and float16's gradients
# vanish at such a scale (``stop_if_scale_fell``)
MIN_LOSS_SCALE = 2.0 ** -16


class LastSave:
    """A run's last.safetensors as its loop wrote it: the state it holds (None: none written yet) and when it was
    written, for the clock of saves inside an epoch and for what a stop says is kept."""

    def __init__(self, path: Path, state: dict[str, Any] | None) -> None:
        self.path, self.state, self.at = path, state, time.monotonic()

    def wrote(self, state: dict[str, Any]) -> None:
        self.state, self.at = state, time.monotonic()

    def older_than(self, seconds: float) -> bool:
        return time.monotonic() - self.at >= seconds

    def kept(self) -> str:
        """``PATH still holds epoch E`` (or ``epoch E + N batches of epoch E+1``), or that there is none."""
        if self.state is None:
            return "no checkpoint was written"
        return f"{self.path} still holds {saved_point(self.state)}"


# set in an experiment's worker process (capsnet.experiments), whose parent stops it: repeated signals are one stop
STOPPED_BY_PARENT = False


_STOP_REQUEST = {"asked": False}  # set by every SaveThenStop's handler; read by a caller of several fits


def stop_requested(*, clear: bool = False) -> bool:
    """Whether Ctrl-C or SIGTERM reached the last ``fit`` / ``fit_gan`` of this process (each clears the flag as it
    starts): one that came as a run's last epoch was saved (after its evaluation) let the run finish, and ``fit``
    returned as usual; a caller running fits one after another (``capsnet experiment``) stops on it there instead
    of training the next run (it went on, and exited 0)."""
    asked = _STOP_REQUEST["asked"]
    if clear:
        _STOP_REQUEST["asked"] = False
    return asked


class EvaluationStopped(KeyboardInterrupt):
    """A stop asked during an epoch's evaluation (``SaveThenStop.interruptible``): the evaluation ends there, and
    the loop saves the epoch as trained but not yet evaluated, which a resume evaluates."""


class SaveThenStop:
    """Ctrl-C (SIGINT) or SIGTERM while one process trains: the loop saves where it is (a save inside the epoch,
    resumed exactly; after an epoch's last batch or during its evaluation, the epoch trained and its evaluation left
    to the resume) and then stops as an interrupt; a second signal stops at once (but in an experiment's worker,
    ``STOPPED_BY_PARENT``, whose parent kills it if the save never comes). ``arm`` installs the handlers
    (at the first epoch, so an interrupt while the data loads stops at once), leaving the block restores the
    previous ones. Off under torchrun (the launcher owns the signals) and off the main thread."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.asked = False
        self.escalate = True  # a second signal stops at once
        self._old: dict[int, Any] = {}
        self._now = False  # inside ``interruptible``: a signal raises EvaluationStopped there

    def arm(self) -> None:
        if self.enabled and not self._old:
            # a signal this process was started ignoring stays ignored (an experiment's worker: a terminal's Ctrl-C
            # reaches the whole group, and the parent's SIGTERM that follows was the second signal, which stopped
            # the worker before its save). A worker takes every SIGTERM as the one stop: a scheduler's SIGTERM to
            # the whole group and the parent's that follows are one request; its parent, not a second signal, ends
            # it if the save never comes
            self.escalate = not STOPPED_BY_PARENT
            self._old = {s: signal.signal(s, self._handler) for s in (signal.SIGINT, signal.SIGTERM)
                         if signal.getsignal(s) is not signal.SIG_IGN}

    def _handler(self, signum: int, frame: Any) -> None:
        if self.asked and self.escalate:
            raise KeyboardInterrupt
        self.asked = True
        _STOP_REQUEST["asked"] = True
        if self._now:
            self._now = False  # once
            raise EvaluationStopped

    @contextlib.contextmanager
    def interruptible(self) -> Any:
        """A block that changes nothing a checkpoint keeps (an epoch's evaluation): a stop asked before it or inside
        it raises EvaluationStopped at once, rather than waiting for the block's end (an evaluation of a large
        held-out set on a busy CPU took 20 minutes: a scheduler's grace period ends in SIGKILL long before)."""
        if self.asked:
            raise EvaluationStopped
        self._now = self.enabled
        try:
            yield
        finally:
            self._now = False

    def __enter__(self) -> "SaveThenStop":
        _STOP_REQUEST["asked"] = False  # stop_requested() tells of this fit, not of an earlier one in the process
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old = {}


def evaluate_or_keep(stop: SaveThenStop, average: WeightAverage | None, pending: bool,
                     save_trained: Callable[[], None], evaluate: Callable[[], Any]) -> Any:
    """``evaluate()``, an epoch's evaluation, under the weights' average (if any), the epoch first saved as trained
    but not evaluated by ``save_trained()`` when ``pending`` (a stop asked, or a save due); a stop during the
    evaluation ends it and saves so (unless done already), then raises ``EvaluationStopped`` on (both loops)."""
    if pending:
        save_trained()
    try:
        with applied(average), stop.interruptible():
            return evaluate()
    except EvaluationStopped:
        if not pending:
            save_trained()
        raise


def _save_now(last: LastSave, save_every_s: float, step: int, launch: Launch | None, dev: torch.device) -> bool:
    """Whether to save inside the epoch after ``step``: the last save is ``save_every_s`` old. Under torchrun
    rank 0's clock decides for every rank (the save is collective), asked every ``_CHECK_EVERY`` steps, where the
    ranks meet anyway for the finite-loss check, not at every step."""
    if launch is not None and step % _CHECK_EVERY:
        return False
    return _save_due(last, save_every_s, launch, dev)


def _save_due(last: LastSave, save_every_s: float, launch: Launch | None, dev: torch.device) -> bool:
    """Whether the last save is ``save_every_s`` old; under torchrun by rank 0's clock, for every rank (collective:
    every rank calls it)."""
    if launch is None:
        return last.older_than(save_every_s)
    due = torch.tensor(int(launch.is_main and last.older_than(save_every_s)), device=dev)
    dist.broadcast(due, 0)
    return bool(due.item())


def _summed(loss: torch.Tensor, correct: torch.Tensor, seen: int, launch: Launch | None
            ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """An epoch's running (loss sum, correct count, examples) so far, over every rank under torchrun (collective)."""
    if launch is None:
        return loss, correct, seen
    totals = torch.stack([loss, correct.to(loss.dtype),
                          torch.tensor(float(seen), dtype=loss.dtype, device=loss.device)])
    dist.all_reduce(totals)
    return totals[0], totals[1], int(totals[2].item())


def _saved_tensors(model: torch.nn.Module, optimizers: Sequence[torch.optim.Optimizer]
                   ) -> Iterator[tuple[str, torch.Tensor]]:
    """(said, tensor) for every floating tensor a save writes: ``model``'s parameters and buffers (BatchNorm's running
    statistics) and the state of ``optimizers`` (Adam's moments), ``said`` what a stop says of it when it is not
    finite."""
    names = {}
    for name, p in model.named_parameters():
        names[p] = name
        yield f"the weights ({name} first) became NaN or infinite (a gradient that was not finite)", p
    for name, b in model.named_buffers():
        if b.is_floating_point():
            yield (f"the model's {name} became NaN or infinite (a running statistic, such as BatchNorm's, of "
                   f"activations that overflowed: the loss, normalised, stayed finite)"), b
    for opt in optimizers:
        for p, state in opt.state.items():
            for key, t in state.items():
                if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel():
                    yield (f"{type(opt).__name__}'s {key} of {names.get(p, 'a weight')} became NaN or infinite (a "
                           f"gradient too large for the optimizer's sums)"), t


def not_finite(model: torch.nn.Module, *optimizers: torch.optim.Optimizer) -> str | None:
    """What a stop says of the first tensor a save writes that is not finite ("the model's features.8.running_var
    became NaN or infinite (...)", "Adam's exp_avg_sq of fc.weight became ..."), or None when all are finite:
    ``model``'s parameters and floating buffers and the state of ``optimizers`` (one wait for the device; the
    tensors are read one by one only when some is not finite). Asked before a save, since a
    finite loss whose gradient was not (unclipped) makes Adam's step NaN in every weight, and a loss kept finite by
    BatchNorm left its running variance infinite (a run ended with exit status 0 and two checkpoints that eval and
    --resume refuse: a review, 2026-12-02)."""
    flags = [torch.isfinite(t).all() for _, t in _saved_tensors(model, optimizers)]
    if not flags or bool(torch.stack([f.to(flags[0].device) for f in flags]).all()):
        return None
    return next(what for what, t in _saved_tensors(model, optimizers) if not bool(torch.isfinite(t).all()))


def _stop_if_not_finite(first_bad: torch.Tensor, epoch: int, last: LastSave, launch: Launch | None = None,
                        cfg: TrainConfig | None = None, model: torch.nn.Module | None = None,
                        scaler: torch.amp.GradScaler | None = None,
                        skipped_of: Callable[[], tuple[int, int]] = lambda: (0, 0),
                        optimizer: torch.optim.Optimizer | None = None) -> None:
    """Raise ``NonFiniteLoss`` when a step's loss was not finite; ``first_bad`` holds that step, or -1; the message
    names the flags of ``cfg`` that bear on it, where they are set. With ``model`` (before a save), also when its
    weights, its buffers or ``optimizer``'s state are not finite (``not_finite``). With an enabled ``scaler`` (--amp
    fp16, whose steps with a gradient that is not finite are skipped), also when its scale fell below
    ``MIN_LOSS_SCALE`` (``skipped_of()``: the epoch's skipped steps and its steps so far, for the message); every
    rank holds the same scale.

    Under torchrun the first bad step of any rank counts, so every rank stops together.
    """
    if launch is not None:
        none = torch.iinfo(torch.int64).max
        first = torch.where(first_bad < 0, none, first_bad)
        dist.all_reduce(first, op=dist.ReduceOp.MIN)
        first_bad = torch.where(first == none, -1, first)
    bad = int(first_bad)
    spoilt = None  # what is not finite
    if bad < 0 and model is not None:
        spoilt = not_finite(model, *([optimizer] if optimizer is not None else []))
        if launch is not None:  # agreed: each rank keeps BatchNorm's statistics of its own shard (no SyncBatchNorm
            anywhere = torch.tensor([int(spoilt is not None)], device=first_bad.device)  # on CPUs); all stop
            dist.all_reduce(anywhere, op=dist.ReduceOp.MAX)
            if int(anywhere) and spoilt is None:
                spoilt = ("another process's weights, buffers or optimizer state became NaN or infinite (each "
                          "process keeps its own BatchNorm statistics)")
    def kept() -> str:
        return last.kept() if launch is None or launch.is_main else RANK0_KEPT
    if bad < 0 and not spoilt:
        if scaler is not None:
            stop_if_scale_fell(scaler, epoch, kept, skipped_of)
        return
    if spoilt:
        raise NonFiniteLoss(f"{spoilt} in epoch {epoch}, after steps whose loss was finite; stopped "
                            f"without saving, {kept()}. Lower --lr, or bound the gradient with --grad-clip, {_NEW_RUN}")
    clipped = cfg is None or bool(cfg.grad_clip)  # the flags in play (all of them where not told)
    amp = cfg is None or cfg.amp != "none"
    raise NonFiniteLoss(f"the training loss{' (with --grad-clip, or its gradient)' if clipped else ''} became NaN or "
                        f"infinite at step {bad + 1} (epoch {epoch}); stopped without saving, {kept()}. Lower --lr"
                        + (", check the images for NaN or infinite pixels, or train without --amp" if amp else
                           " or check the images for NaN or infinite pixels") + f", {_NEW_RUN}")


# a resume keeps the run's settings and, on the CPU, replays its steps exactly: the same step diverges again
_NEW_RUN = "in a new run (another --out): --resume keeps this run's settings and would meet the same step again"


def stop_if_scale_fell(scaler: torch.amp.GradScaler, epoch: int, kept: Callable[[], str],
                       skipped_of: Callable[[], tuple[int, int]]) -> None:
    """Raise ``NonFiniteLoss`` when an enabled ``scaler`` (--amp fp16) has a scale below ``MIN_LOSS_SCALE``: so many
    steps skipped for a gradient that was not finite that float16's gradients at that scale vanish (for the message,
    called only then: ``kept()``, which checkpoint stays; ``skipped_of()``, the epoch's skipped steps and its steps
    so far). A disabled scaler, or one whose scale is at the floor or above, passes.

    Each skipped step halves the scale and only 2,000 finite steps in a row double it, so a NaN that recurs (every
    step, or one batch in a few) lowers it for good; float16 has 5 exponent bits, float32's range is never the
    cause at such a scale."""
    if not scaler.is_enabled() or (scale := scaler.get_scale()) >= MIN_LOSS_SCALE:
        return
    skipped, steps = skipped_of()
    raise NonFiniteLoss(f"under --amp fp16 the loss scale fell to {scale:.3g} in epoch {epoch}: {skipped} of its "
                        f"{steps} steps so far had a gradient that was not finite and were skipped, each halving the "
                        f"scale (only 2,000 finite steps in a row double it), and float16's gradients vanish at such "
                        f"a scale: a NaN or infinity in the backward pass that recurs, which no scale mends; stopped "
                        f"without saving, {kept()}. Train with --amp bf16 (float32's range) or --amp none, or lower "
                        f"--lr")


def _skipped_of(skipped: torch.Tensor, steps: int, fp16: bool) -> Callable[[], tuple[int, int]]:
    """(steps skipped, steps) of an epoch so far, for the loss scale's message, when called (it reads the device,
    under fp16 only): a check that passes never waits for it."""
    return lambda: ((int(skipped.item()) if fp16 else 0), steps)


def stop_if_held_out_not_finite(record: dict[str, Any], epoch: int, last: LastSave) -> None:
    """Raise ``NonFiniteLoss`` when an evaluated epoch's held-out figures (``record``'s ``*_loss``, a synthesis run's
    ``*_l1`` and ``*_ssim``) are not finite: weights that are finite but whose outputs overflow (the last steps
    diverged) gave a NaN loss beside a meaningless accuracy, written into metrics.jsonl as a bare NaN, no JSON."""
    import math

    bad = {k: v for k, v in record.items() if k.endswith(("_loss", "_l1", "_ssim")) and not k.startswith("train_")
           and isinstance(v, float) and not math.isfinite(v)}
    if bad:
        shown = ", ".join(f"{k} {v}" for k, v in bad.items())
        raise NonFiniteLoss(f"the held-out figures after epoch {epoch} are not finite ({shown}): the weights are, but "
                            f"their outputs overflow (the last steps diverged); stopped before anything of this "
                            f"epoch's evaluation was written, {last.kept()}. Lower --lr, or bound the gradient with "
                            f"--grad-clip, {_NEW_RUN}")


def strict_json(value: Any) -> Any:
    """``value`` with every float that is NaN or infinite made None (null), so json.dumps writes strict JSON, which
    every parser reads (Python's json writes NaN and Infinity, tokens JSON has not)."""
    import math

    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value


def within_epoch(ckpt_state: dict[str, Any], epoch: int, batches: int, sums: list[float], seen: int,
                 seconds: float, device: torch.device, processes: int = 1, *, pending: bool = False
                 ) -> dict[str, Any]:
    """A checkpoint's state for a save inside ``epoch`` after ``batches`` of its batches: the last complete epoch's
    state with the steps taken since, and under ``within`` where the epoch stands (its running sums, the examples
    and seconds they cover, the device type whose generator drew its batches, and under torchrun the number of
    processes, whose random states are saved one per rank), which ``resume_within`` reads back
    (``capsnet.checkpoint`` checks its fields on loading). ``pending``: every batch of the epoch trained, its
    evaluation not yet (``evaluation_pending``: a resume evaluates it first)."""
    return {**ckpt_state, "within": {"epoch": epoch, "batches": batches, "sums": sums, "seen": seen,
                                     "seconds": seconds, "device": torch.device(device).type}
                                    | ({"processes": processes} if processes > 1 else {})
                                    | ({"evaluation_pending": True} if pending else {})}


def ranks_rng_state(dev: torch.device, launch: Launch) -> dict[str, torch.Tensor]:
    """Every rank's random states (their dropout draws differ), gathered for rank 0's save inside an epoch, keyed
    by ``rank_rng_key``; collective: every rank calls it."""
    states: list[Any] = [None] * launch.world_size
    dist.all_gather_object(states, {k: v.cpu() for k, v in rng_state(dev).items()})
    return {rank_rng_key(r, k): v for r, state in enumerate(states) for k, v in state.items()}


def restore_rank_rng(ckpt: Checkpoint, within: dict[str, Any], rank: int, processes: int, dev: torch.device,
                     dropout: bool) -> None:
    """A resume inside an epoch under torchrun (or of a save torchrun made): saved by as many processes, this rank's
    random state at the save, after the epoch's own seeding (its dropout masks continue as they would have; a
    generator the save did not hold, e.g. CUDA's for a CPU save, keeps the seeding's). Saved by another number: a
    warning, for a model with dropout, that the rest of the epoch draws other masks (nothing else differs)."""
    saved_by = within.get("processes", 1)
    if saved_by != processes:
        if rank == 0 and dropout and not within.get("evaluation_pending"):  # no batch left: no mask to draw
            warnings.warn(f"{ckpt.path} was saved inside epoch {within['epoch']} by {saved_by} process(es) and is "
                          f"resumed by {processes}: the rest of that epoch draws other dropout masks than the "
                          f"uninterrupted run would have (the same batches, in the same order)", RuntimeWarning,
                          stacklevel=3)
        return
    saved = {k: ckpt.rng_state[key] for k in rng_state(dev) if (key := rank_rng_key(rank, k)) in ckpt.rng_state}
    with resume_state_of(ckpt):
        restore_rng_state(saved, dev)


def resume_within(within: dict[str, Any] | None, epoch: int, ckpt: Checkpoint | None, g: torch.Generator,
                  n_batches: int, width: int, rank: int = 0, shared: int = 0) -> tuple[int, list[float], int, float]:
    """Where ``epoch`` starts: (batches already trained, the running sums, examples and seconds they cover), from a
    save inside it (``within_epoch``), else from nothing. The epoch's generator ``g`` (batch order drawn) is set to
    its saved state, so the remaining batches draw what an uninterrupted run would have. Under torchrun only rank 0
    takes the saved sums (they are summed over the ranks), but for the last ``shared``, which every rank counts
    alike (fp16's skipped steps: every rank skips the same steps), taken by all. Saved on another device type
    (whose generator draws other numbers): a warning, and the rest of the epoch in this device's order from the
    same batch on."""
    if within is None or within.get("epoch") != epoch:
        return 0, [0.0] * width, 0, 0.0
    batches, sums, seen = within["batches"], [float(x) for x in within["sums"]], within["seen"]
    with resume_state_of(ckpt):
        pending = bool(within.get("evaluation_pending"))  # all of them trained, the epoch's evaluation left
        if not ((0 < batches < n_batches or pending and batches == n_batches) and len(sums) == width):
            raise ValueError(f"its place inside epoch {epoch} (batch {batches} of {n_batches}, {len(sums)} running "
                             f"sums for {width}) does not fit this run")
        if "epoch_batches" not in ckpt.rng_state:
            raise ValueError(f"it was saved inside epoch {epoch} but holds no rng.epoch_batches")
        saved_on = within.get("device", g.device.type)
        if saved_on == g.device.type:
            g.set_state(ckpt.rng_state["epoch_batches"])
    if saved_on != g.device.type and not rank and not pending:  # the first process says it for all (no batch left:
        # nothing to say)
        warnings.warn(f"{ckpt.path} was saved {batches} batches into epoch {epoch} on {saved_on}; on "
                      f"{g.device.type} the rest of that epoch follows this device's shuffle, not the one it began "
                      f"with (some of its examples twice, others not at all); later epochs are whole again",
                      RuntimeWarning, stacklevel=3)
    if rank:
        sums, seen = [0.0] * (width - shared) + sums[width - shared:], 0
    return batches, sums, seen, within["seconds"]


class ResumeError(CheckpointError):
    """A resume asked for settings other than the run's; ``fields`` names them, ``saved`` holds the run's own
    value of each (where known)."""

    def __init__(self, message: str, fields: list[str], saved: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.fields = fields
        self.saved = saved or {}


# The settings a resume may change: how long the run trains and how often it evaluates (and checkpoints), neither of
# which changes the steps already taken.
RESUMABLE_CHANGES = ("epochs", "eval_every")


def _differences(saved: dict[str, Any], given: dict[str, Any]) -> list[str]:
    """The keys whose values differ, ``RESUMABLE_CHANGES`` aside (a resume may train longer, evaluate more often)."""
    return sorted(k for k in set(saved) | set(given) if k not in RESUMABLE_CHANGES and saved.get(k) != given.get(k))


def saved_configs(ckpt: Checkpoint) -> tuple[Any, TrainConfig]:
    """The model and training configurations a checkpoint records, checked field by field (its file named on error)."""
    spec = model_spec(ckpt.model_name) if ckpt.model_name in MODELS else None
    if spec is None:
        raise CheckpointError(f"{ckpt.path} holds a {short_repr(ckpt.model_name)} model; this capsnet knows "
                              f"{', '.join(MODELS)}")
    routing = ckpt.model_config.get("routing") if isinstance(ckpt.model_config, dict) else None
    if isinstance(routing, str) and routing not in ROUTINGS:  # the run is whole: this install lacks its routing
        raise CheckpointError(f"{ckpt.path} holds a {ckpt.model_name} routed by {short_repr(routing)}, a routing this "
                              f"capsnet does not know (it knows {', '.join(list_routings())}); open it with the "
                              f"capsnet that trained it, or register that routing (capsnet.routing.ROUTINGS)")
    try:
        return spec.config.from_saved(ckpt.model_config), TrainConfig.from_saved(ckpt.train_config)
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"checkpoint {ckpt.path} has a bad configuration: {e}; use another checkpoint or "
                              f"retrain") from None


def resume_configs(run_dir: str | os.PathLike | Checkpoint, *, model: str | None = None, model_changes: dict[str, Any] | None = None,
                   train_changes: dict[str, Any] | None = None) -> tuple[Any, TrainConfig]:
    """The model and training configurations saved with the run in ``run_dir``, for ``fit(..., resume=True)``.

    ``model_changes`` and ``train_changes`` are settings asked for again (flags
    typed on a resume): each must equal the saved one, except ``epochs`` (the
    new total) and ``eval_every``. Otherwise a ``ResumeError`` names the fields
    that differ. ``run_dir`` may be the run's last checkpoint, loaded already.
    """
    ckpt = run_dir if isinstance(run_dir, Checkpoint) else load_checkpoint(run_dir, "last")
    run_dir = Path(ckpt.path).parent
    if model is not None and model != ckpt.model_name:
        raise ResumeError(f"{ckpt.path} holds a {ckpt.model_name!r} model, not {model!r}", ["model"],
                          {"model": ckpt.model_name})
    saved_model, saved_train = saved_configs(ckpt)
    model_changes, train_changes = model_changes or {}, train_changes or {}
    foreign = sorted(k for k in model_changes if not hasattr(saved_model, k))  # CapsNet's --conv1-channels typed on
    if foreign:  # an Efficient-CapsNet run's resume: an AttributeError's traceback (a review, 2026-12-03)
        raise ResumeError(f"{', '.join(foreign)}: not settings of the run's model, {ckpt.model_name!r}, in {run_dir}",
                          foreign, {})
    # rounds under a one-pass routing route nothing: a run saved with them (read back at their defaults) resumes
    # with the flags it was first typed with
    unused = unused_rounds(saved_model, getattr(saved_model, "routing", "dynamic"))
    clashes = ([k for k, v in model_changes.items() if k not in unused and _differs(saved_model, k, v)]
               + [k for k, v in train_changes.items() if k not in RESUMABLE_CHANGES and _differs(saved_train, k, v)])
    if clashes:
        saved = {k: getattr(saved_model if k in model_changes else saved_train, k) for k in clashes}
        raise ResumeError(f"{', '.join(sorted(clashes))} differ from the run in {run_dir} (it trained with "
                          f"{', '.join(f'{k}={saved[k]!r}' for k in sorted(clashes))}); a resume continues with the "
                          f"run's own settings (only epochs and eval_every may change)", sorted(clashes), saved)
    return saved_model, dataclasses.replace(saved_train, **{k: v for k, v in train_changes.items()
                                                            if k in RESUMABLE_CHANGES})


def _differs(saved: Any, field: str, value: Any) -> bool:
    """Whether ``value`` differs from config ``saved``'s ``field`` once the config has normalised it (a JSON
    list typed with --model-option is the tuple the config holds). A dict (CapsNet's routing_options, typed key by key
    with --routing-option) differs where one of its keys does: the keys not typed keep the run's values."""
    kept = getattr(saved, field, None)
    if isinstance(value, dict) and isinstance(kept, dict):
        return any(k not in kept or kept[k] != v for k, v in value.items())
    try:
        return getattr(dataclasses.replace(saved, **{field: value}), field) != getattr(saved, field)
    except (TypeError, ValueError):
        return True


def input_fields(model: str, dataset: str) -> dict[str, int]:
    """The config fields that size registered model ``model`` for ``dataset``: its input (channels, height, width)
    and its output (the classes of a classifier or segmenter, the image channels of a generator)."""
    C, H, W = input_shape(dataset)
    t = task(dataset)
    made = {"out_channels": t.target_channels} if model_spec(model).kind == "synthesis" else {"num_classes": t.num_classes}
    return {"in_channels": C, "input_height": H, "input_width": W} | made


def unfitting_images(e: ValueError, dataset: str, model: str, sized: dict[str, int], *,
                     dataset_said: str = "--dataset", model_said: str = "--model") -> ValueError | None:
    """A model config's refusal of the input size ``input_fields`` gave it for ``dataset`` (a user's folder of
    images the network cannot take), said as whose size it is and how to fit it; None for another refusal."""
    if not any(f"input_{side}" in str(e) for side in ("height", "width")):
        return None
    height, width = sized["input_height"], sized["input_width"]
    fix = "" if not isinstance(e, OutOfRange) else f"; pad them to at least {e.lo:,} a side" \
        if min(height, width) < e.lo else f"; crop or scale them to at most {e.hi:,} a side"  # out of the range
    return ValueError(f"{dataset_said} {dataset} holds {height}x{width} (HxW) images, which {model_said} {model} "
                      f"cannot take: {e}{fix}")


def rng_state(dev: torch.device) -> dict[str, torch.Tensor]:
    """The random states a resume restores: the CPU generator's, and the GPU's when the run trains on one (dropout
    there draws from the GPU's own generator)."""
    return {"torch": torch.get_rng_state()} | ({"cuda": torch.cuda.get_rng_state(dev)} if dev.type == "cuda" else {})


def restore_rng_state(state: dict[str, torch.Tensor], dev: torch.device) -> None:
    """Set the generators ``rng_state`` saved (a checkpoint without one leaves them as they are)."""
    current = {"torch": torch.get_rng_state} | ({"cuda": lambda: torch.cuda.get_rng_state(dev)}
                                                if dev.type == "cuda" else {})
    for key in current.keys() & state.keys():
        saved, now = state[key], current[key]()
        if saved.dtype != now.dtype or saved.shape != now.shape:
            raise ValueError(f"its random state rng.{key} is {saved.dtype} of shape {tuple(saved.shape)} where "
                             f"this PyTorch's is {now.dtype} of shape {tuple(now.shape)}")
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if dev.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], dev)


def check_optimizer_state(opt: torch.optim.Optimizer) -> None:
    """Each loaded tensor of a parameter's state (Adam's moments) has that parameter's shape: a damaged checkpoint
    is refused here, not by the first step's arithmetic."""
    for k, group in enumerate(opt.param_groups):  # the settings a step reads: a damaged one failed inside Adam's step
        for key in ("lr", "eps", "weight_decay"):
            v = group.get(key, 0.0)
            if not (is_finite(v) and v >= 0):  # the settings come from the checkpoint's JSON: Python numbers
                raise ValueError(f"its optimizer's parameter group {k} has {key} {short_repr(v)} where a finite "
                                 f"number >= 0 belongs")
        betas = group.get("betas", (0.9, 0.999))
        if not isinstance(betas, (list, tuple)) or len(betas) != 2 or any(
                not (is_finite(b) and 0 <= b < 1) for b in betas):
            raise ValueError(f"its optimizer's parameter group {k} has betas {short_repr(betas)} where Adam takes "
                             f"two numbers in [0, 1)")
        odd = [key for key in ("amsgrad", "maximize", "foreach", "capturable", "differentiable", "fused",
                               "decoupled_weight_decay") if group.get(key) is not None and
               not isinstance(group.get(key), bool)]
        if odd:
            raise ValueError(f"its optimizer's parameter group {k} has {odd[0]} {short_repr(group[odd[0]])} where "
                             f"true, false or null belongs")
    names = {id(p): f"parameter {i}" for i, p in enumerate(p for g in opt.param_groups for p in g["params"])}
    for p, entry in opt.state.items():
        for key, value in entry.items():
            want = () if key == "step" else p.shape  # Adam's step count: one number (a tensor on fused and CPU Adam)
            if isinstance(value, torch.Tensor) and value.shape != want:
                where = "a step count is one number" if key == "step" else f"the parameter has {tuple(p.shape)}"
                raise ValueError(f"its optimizer state {key} of {names.get(id(p), 'a parameter')} has shape "
                                 f"{tuple(value.shape)} where {where}")


@contextlib.contextmanager
def resume_state_of(ckpt: Checkpoint):
    """Loading ``ckpt``'s optimizer and random state in this block: a checkpoint without optimizer state, or
    whatever does not load, is raised as one ``CheckpointError`` naming the file, before any training step."""
    try:
        if ckpt.optimizer_state is None:
            raise ValueError("it holds no optimizer state (a best.safetensors, or a file saved for inference: only "
                             "last.safetensors resumes)")
        yield
    except CheckpointError:
        raise
    except (RuntimeError, ValueError, KeyError, IndexError, TypeError) as e:
        raise CheckpointError(f"checkpoint {ckpt.path} cannot be resumed: {e}; the file is damaged or was not written "
                              f"by capsnet's training. Resume from a copy that is whole, or start the run again in "
                              f"a new directory") from None


def write_metrics(run_dir: Path, history: list[dict[str, Any]]) -> None:
    """``metrics.jsonl``, one epoch a line (an epoch not evaluated, ``--eval-every``, has no held-out figures),
    rewritten atomically from the checkpoint's history; strict JSON (a value that is not finite is null)."""
    atomic_write_text(run_dir / "metrics.jsonl", "".join(json.dumps(strict_json(r), allow_nan=False) + "\n"
                                                        for r in history))


def save_best(path: Path, name: str, model_config: Any, cfg: TrainConfig, state: dict[str, Any],
              model: torch.nn.Module) -> None:
    """``best.safetensors``: the weights of the epoch with the best held-out score (no optimizer or random state)."""
    save_checkpoint(path, Checkpoint(model_name=name, model_config=model_config.to_dict(), train_config=cfg.to_dict(),
                                     state=state, model_state=model.state_dict()))


def check_epochs(state: dict[str, Any], epochs: int, last_path: Path, planned: int | None = None) -> None:
    """A ``ResumeError`` when the run whose ``last_path`` holds ``state`` is past the ``epochs`` a resume asks for:
    trained more whole epochs, or saved inside a later epoch; or, ``planned`` (the epochs it was started or last
    resumed with) more than it has done, stopped after exactly ``epochs``, the last of which it did not finish as a
    last epoch (no final evaluation, its schedule planned for more)."""
    done = state.get("epoch", 0)
    if isinstance(done, int) and done > epochs:  # the loop would not run and return a later epoch's figures
        raise ResumeError(f"{last_path} has already trained {done} epochs, more than the {epochs} asked for; "
                          f"resume with --epochs {done} or more, or train the shorter run in a new --out",
                          ["epochs"])
    within = state.get("within")
    part = within.get("epoch") if isinstance(within, dict) else None
    trained = part if isinstance(part, int) and within.get("evaluation_pending") else None  # every batch of it
    if isinstance(planned, int) and (within is None and done == epochs < planned or trained == epochs < planned):
        # the loop would not run (or only evaluate): the run would be called finished with its last epoch's steps
        # taken on a schedule planned for more
        done = trained or done
        raise ResumeError(f"{last_path} stopped after {'training ' if trained else ''}epoch {done} of the {planned} "
                          f"it was training; it cannot end there (epoch {done} was not trained and evaluated as a "
                          f"last epoch: its schedule was planned for {planned}): resume with --epochs {done + 1} or "
                          f"more, or train the shorter run in a new --out", ["epochs"])
    if isinstance(part, int) and part > epochs:  # its weights are past the last epoch asked for
        # (trained: --epochs part ends it on a schedule planned for more, refused above, unless part is its last)
        least = part + 1 if trained and isinstance(planned, int) and part < planned else part
        where = f"holds epoch {part} trained, not yet evaluated" if trained else f"was saved inside epoch {part}"
        raise ResumeError(f"{last_path} {where}, past the {epochs} asked for; resume with --epochs {least} or more, "
                          f"or train the shorter run in a new --out", ["epochs"])


def budget_warnings(cfg: TrainConfig, examples: int, tested: int = 0) -> list[str]:
    """What in ``cfg`` a run over ``examples`` training examples will not do as typed: a batch larger than the
    training set (each epoch one step of all of them), a warm-up of the exponential schedule longer than the run
    (the rate never reaches --lr; the linear schedule refuses it in ``lr_at``); a user's folder without a test/
    folder whose pairs held out by name (``tested`` of them) are far more than the usual fifth (a few pairs)."""
    steps = cfg.epochs * math.ceil(examples / cfg.batch_size)
    said = []
    folder = user_folder(cfg.dataset)
    total = examples + tested
    # (the counts of subsets when --train-size or --test-size cut them: 615 of 871 was the usual fifth of 3,000)
    if folder and tested > max(1, 0.4 * total) and not (cfg.val_size or cfg.train_size or cfg.test_size) and \
            not (Path(folder[1]).expanduser() / "test").is_dir():
        noun = EXAMPLE_NOUN[folder[0]]
        said.append(f"--dataset {cfg.dataset}: {tested} of its {total} {noun}s are held out for testing (chosen by "
                    f"file name: one in five on average, unevenly for a few {noun}s), so the run trains on "
                    f"{examples}; put the test {noun}s in {Path(folder[1]) / 'test'} to choose them")
    if cfg.batch_size > examples:
        said.append(f"--batch-size {cfg.batch_size} is more than the {examples} training examples: each epoch is "
                    f"one step of all {examples}")
    if cfg.lr_schedule == "exponential" and cfg.warmup_steps > steps:
        # the warm-up may be the model's own default (the baseline's 200), which the user never typed
        said.append(f"a warm-up of {cfg.warmup_steps} steps (--warmup-steps, as given or the model's default: 200 "
                    f"for --model baseline) is longer than the run's {steps} optimizer "
                    f"step{'' if steps == 1 else 's'}: the rate never reaches --lr {cfg.lr:g} (it ends at "
                    f"{steps / cfg.warmup_steps:.0%} of its ramp); lower it (--warmup-steps 0: none) or train longer")
    return said


def saved_with(run_dir: Path, fields: dict[str, Any]) -> bool:
    """Whether ``run_dir`` holds a run (its last.safetensors, the header alone read) whose model config has these
    ``fields``' values: the model given is the run's own (else a new run's, or one built wrong: not a folder that
    changed under the run)."""
    metadata = header_metadata(Path(run_dir) / "last.safetensors")
    try:
        saved = json.loads(metadata["model_config"])
    except (TypeError, KeyError, ValueError):
        return False
    return isinstance(saved, dict) and all(saved.get(f) == v for f, v in fields.items())


def folder_refit(dataset: str, needed: dict[str, Any], had: dict[str, Any]) -> str:
    """Why a run on a user's folder ``dataset`` cannot be resumed: its files now need a model of ``needed`` (field
    -> value) where the run's has ``had`` (its images turned grey <-> colour, or another size, since it trained),
    said with the fix (a bug hunt, 2026-12-05: the message was the Python API's "build it with those")."""
    return (f"{dataset} now holds files for a model with {', '.join(f'{f} {needed[f]}' for f in had)}, and the run's "
            f"model has {', '.join(f'{f} {v}' for f, v in had.items())}: its files changed since the run trained on "
            f"them (grey and colour, or their size), so the run cannot go on; put the folder back as it was, or train "
            f"a new run (another --out)")


def folder_noted(state: dict[str, Any], dataset: str, warn: bool = True) -> dict[str, Any]:
    """``state`` with what the user's folder of ``dataset`` (folder:DIR, pairs:DIR, classes:DIR) holds now under
    ``data``; a resume whose folder changed since the save (files added, removed or rewritten) is warned: its
    remaining epochs train and test on the folder as it is (each pair or image keeps its split, ``held_out_names``).
    Other data sets: as is."""
    now = folder_contents(dataset)
    if now is None:
        return state
    if (changed := class_change(state, dataset)) is not None:
        raise DataError(changed)
    if warn and (count := folder_change(state, dataset, now)) is not None:
        noun = EXAMPLE_NOUN[user_folder(dataset)[0]]
        warnings.warn(f"--dataset {dataset} holds {count}: the rest of the run trains and tests on the folder as it is "
                      f"now (each {noun} keeps its split), so its test figures are not those of the earlier epochs' "
                      f"{noun}s; put the folder back as it was to continue the same run", UserWarning, stacklevel=3)
    if "prepared_fit" not in now and "prepared_fit" in saved_folder(state):  # capsnet prepare's record gone (the
        now = {**now, "prepared_fit": saved_folder(state)["prepared_fit"]}  # PNGs copied alone): the fit they had
    return {**state, "data": now}


def _a_runs_config(path: Path) -> bool:
    """Whether ``path`` is the config.json a capsnet run writes as it starts (a run stopped before its first save
    leaves one, which its rerun replaces): False for no file, or one of anything else."""
    try:
        found = read_json_object(path, "")
    except (OSError, CheckpointError):
        return False
    return {"model", "model_config", "train_config"} <= found.keys()


def check_held_lock(lock: Any, run_dir: str | os.PathLike) -> None:
    """A lock handed to ``fit`` or ``fit_gan`` is a taken ``RunLock`` on ``run_dir``, or a ValueError."""
    if lock is None:
        return
    if not isinstance(lock, RunLock):
        raise TypeError(f"lock must be a capsnet.checkpoint.RunLock (or None), got {type(lock).__name__}")
    if Path(lock.run_dir).absolute() != Path(run_dir).absolute():
        raise ValueError(f"lock is on {lock.run_dir}, not on the run's folder {run_dir}: pass a RunLock of {run_dir}")
    if not lock.taken:
        raise ValueError("lock must be taken already (lock.acquire()); or pass none and the run takes its own")


def lock_new_run(lock: RunLock, run_dir: Path, model_config: Any, cfg: TrainConfig, resume: bool) -> None:
    """Make ``run_dir`` and hold ``lock`` on it before the run's first write. A folder locked as the run began must
    still be the one locked (one removed meanwhile is not made again, nor another run's written into). A folder
    that did not exist as the run began was not locked then, and another run may have been written there since (a
    second trainer into the same new ``--out``, still loading its data as the first one finished, replaced the
    finished run): what ``start_or_resume`` found is asked again under the lock, and such a run refused, not
    replaced."""
    early = lock.taken
    if early:
        lock.check()
    run_dir.mkdir(parents=True, exist_ok=True)
    lock.acquire()
    if early:
        return
    try:
        start_or_resume(run_dir, model_config, cfg, resume)
    except CheckpointError as e:
        lock.release()
        raise CheckpointError(f"another capsnet run wrote {run_dir} while this one prepared its start: {e}") from None


def check_batch_divides(cfg: TrainConfig, launch: Launch, run_dir: str | os.PathLike, resume: bool) -> None:
    """A DistributedError naming the fix unless ``launch``'s processes divide the global batch evenly (a resume: the
    run's batch holds, so the process count must change)."""
    if not cfg.batch_size % launch.world_size:
        return
    if resume and (Path(run_dir) / "last.safetensors").exists():
        counts = [n for n in range(1, min(cfg.batch_size, 64) + 1) if cfg.batch_size % n == 0]
        raise DistributedError(f"the run's --batch-size {cfg.batch_size} is the global batch and must divide "
                               f"evenly among the processes, and {launch.world_size} do not divide it; resume "
                               f"with --nproc_per_node (times --nnodes) one of {', '.join(map(str, counts))}")
    raise DistributedError(f"--batch-size {cfg.batch_size} is the global batch and must divide evenly among the "
                           f"{launch.world_size} processes; use a multiple of {launch.world_size}, e.g. "
                           f"{cfg.batch_size + launch.world_size - cfg.batch_size % launch.world_size}")


def start_or_resume(run_dir: Path, model_config: Any, cfg: TrainConfig, resume: bool, warn: bool = True
                    ) -> tuple[dict[str, Any], Checkpoint | None]:
    """A run's starting state and, for a resume, its ``last.safetensors`` (checked: the same model and settings but
    ``epochs``); a new run must not overwrite one, nor files of the run's names that no run of capsnet left.
    ``warn``: say what a resume changes (under torchrun, the first process alone)."""
    name, last_path = model_name(model_config), run_dir / "last.safetensors"
    if not resume:
        if last_path.exists():
            raise CheckpointError(f"{run_dir} already holds a run (last.safetensors); pass --resume to continue it "
                                  f"or choose another output directory")
        # a run's config.json and no metrics.jsonl (written after a run's first last.safetensors): the files beside it
        # are that run's, killed before its first last.safetensors, to start again; without one, beside one of the
        # user's own, or beside a run's metrics (a run whose last.safetensors was removed), not a run's to replace
        others = [] if _a_runs_config(run_dir / "config.json") and not (run_dir / "metrics.jsonl").exists() else \
            [n for n in ("config.json", "best.safetensors", "metrics.jsonl") if (run_dir / n).exists()]
        if others:  # a new run writes these names: another's files (or the user's own) would be lost unasked
            raise CheckpointError(f"{run_dir} holds {' and '.join(others)} but no last.safetensors, so no run to "
                                  f"resume: they are not this run's to replace; choose another output directory, or "
                                  f"remove them if they are not wanted")
        return {"epoch": 0, "step": 0, "history": [], "best": None}, None
    if not last_path.exists():
        if _a_runs_config(run_dir / "config.json") and not (run_dir / "metrics.jsonl").exists():
            # a run stopped before its first last.safetensors (a save that failed after best's): nothing removed
            raise CheckpointError(f"nothing to resume in {run_dir}: the run there stopped before its first "
                                  f"last.safetensors was written; start it again without --resume (its files "
                                  f"there are replaced)")
        kept = [n for n in ("best.safetensors", "metrics.jsonl") if (run_dir / n).exists()]
        raise CheckpointError(f"nothing to resume in {run_dir}: no last.safetensors; " +
                              (f"its {' and '.join(kept)} are a run's whose last checkpoint was removed: train anew "
                               f"in another output directory" if kept else "start a run without --resume"))
    ckpt = load_checkpoint(last_path)
    if ckpt.model_name != name:
        raise CheckpointError(f"{last_path} holds a {ckpt.model_name!r} model, not {name!r}; resume with "
                              f"--model {ckpt.model_name} or use a new --out")
    saved_model, saved_train = saved_configs(ckpt)
    saved = saved_model.to_dict() | saved_train.to_dict()
    given = model_config.to_dict() | cfg.to_dict()
    diff = _differences(saved, given)
    if diff:
        listed = ", ".join(f"{k}: saved {saved.get(k)!r}, now {given.get(k)!r}" for k in diff)
        raise ResumeError(f"{last_path} was trained with another configuration ({listed}); resume with the "
                          f"same settings (only --epochs and --eval-every may change) or use a new --out", diff)
    check_epochs(ckpt.state, cfg.epochs, last_path, saved_train.epochs)
    if warn and cfg.epochs != saved_train.epochs and (stretched := _stretched_schedules(model_config, cfg)):
        # the schedules read step / total steps: a new total moves them back (EM's margin fell from 0.9 to 0.67),
        # where a resume to the same total is exact (a review, 2026-12-01)
        verb = "follow" if len(stretched) > 1 else "follows"
        warnings.warn(f"--epochs {cfg.epochs} where the run in {run_dir} planned {saved_train.epochs}: "
                      f"{' and '.join(stretched)} {verb} the new total from here, so this run will not match one "
                      f"trained for {cfg.epochs} epochs from the start (resumes to the same --epochs are exact)",
                      UserWarning, stacklevel=2)
    return {"history": [], "best": None, **ckpt.state}, ckpt


def _stretched_schedules(model_config: Any, cfg: TrainConfig) -> list[str]:
    """What in a run follows its planned total of steps (its step over the total): the linear learning-rate
    schedule's decay, and a loss's margin schedule (EM's spread loss, ``margin_warmup``)."""
    found = ["the linear schedule's decay"] if cfg.lr_schedule == "linear" else []
    if getattr(model_config, "margin_warmup", 0) and getattr(model_config, "margin_start", None) != getattr(
            model_config, "margin_end", None):
        found.append("the spread loss's margin (margin_warmup)")
    return found


class _DDP(DistributedDataParallel):
    """``DistributedDataParallel`` that lends the wrapped model's attributes (the losses read ``model.config``)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "module":
                raise
            return getattr(self.module, name)


def _freeze_unreached(model: torch.nn.Module, loss_fn: Any, batch: Any, cfg: TrainConfig, dev: torch.device) -> list[str]:
    """Stop requiring gradients of the parameters the training loss never reaches; their names.

    The model computes outputs the loss may leave out (CapsNet's decoder when
    recon_weight is 0). One process simply gives them no gradient; DDP would
    wait for theirs forever. Which parameters those are is fixed by the model
    and training configurations, so one backward pass of a copy on a small
    batch finds them (the model, its buffers and the random state untouched).
    """
    probe = copy.deepcopy(model)
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
        x, y, comp = batch
        loss, _ = loss_fn(probe, x, y, comp, recon_weight=cfg.recon_weight, progress=0.0)
        loss.backward()
    unreached = [n for n, p in probe.named_parameters() if p.requires_grad and p.grad is None]
    for n, p in model.named_parameters():
        if n in unreached:
            p.requires_grad_(False)
    return unreached


def _from_main(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (torch.distributed's object broadcast); every rank waits for rank 0."""
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


LAUNCH_KEY = "torchrun_launch"  # a run's state under torchrun: the id of the launch that last wrote it


def restarted_run(run_dir: str | os.PathLike, launch: Launch | None) -> bool:
    """Whether this process is one of torchrun's restarts (``--max-restarts``, after a process of the run failed) of
    the run whose ``last.safetensors`` is in ``run_dir``: a restart of a launch with an id (``Launch.launch_id``,
    from torchrun's agent store: ``distributed.identified``) whose checkpoint that same launch wrote. Such a run
    resumes without ``--resume``; another launch's checkpoint (a folder reused by mistake, its own start refused:
    whatever its --rdzv-id, another launch has another id) is left to the usual refusal, as is a launch with no
    id, which no checkpoint can be told apart by, and one over several machines, whose agents each count their own
    restarts (a machine whose processes were well starts them again as restart 0: the machines would disagree)."""
    if not _known_restart(launch):
        return False
    last = Path(run_dir) / "last.safetensors"
    if not last.is_file():
        return False
    try:
        state = load_checkpoint(last).state
    except CheckpointError:  # a damaged file: the start says so, as for any run
        return False
    return state.get(LAUNCH_KEY) == launch.launch_id


def _known_restart(launch: Launch | None) -> bool:
    """Whether ``launch`` is one of torchrun's restarts that its run's files can be told as its own by: a restart
    (not the launch's first attempt) of a launch with an id, on one machine (over several, the agents count restarts
    apart: a well machine's processes come back as restart 0)."""
    return launch is not None and bool(launch.restart) and launch.launch_id is not None and launch.one_machine


STOPPED_FILE = ".capsnet-restart-stop.json"  # a torchrun launch's NaN stop, which its restarts would meet again
RANK0_KEPT = "rank 0 says which checkpoint is kept"  # another rank's part of a NaN stop's message


def _last_stamp(run_dir: str | os.PathLike) -> list[int] | None:
    """last.safetensors' size and modification time (None: none yet): a save since changes it."""
    try:
        st = (Path(run_dir) / "last.safetensors").stat()
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns]


def note_restart_stop(run_dir: str | os.PathLike, launch: Launch | None, error: NonFiniteLoss) -> None:
    """A process of a torchrun launch that torchrun will restart (``--max-restarts`` left, one machine, an id):
    record that the run stopped on ``error`` from its present last checkpoint. A restart resumes exactly from that
    checkpoint, so it would train to the same NaN again (up to N times, a long run's hours on a GPU):
    ``repeated_restart_stop`` has it stop at once instead. Every rank that stops writes it (the same launch and
    checkpoint; one whole file wins): torchrun stops the others once the first has exited."""
    if launch is None or launch.launch_id is None or not launch.one_machine or launch.restart >= launch.max_restarts:
        return
    with contextlib.suppress(OSError):  # the error itself is what matters: said whatever this write does
        atomic_write_text(Path(run_dir) / STOPPED_FILE, json.dumps(
            {"launch": launch.launch_id, "checkpoint": _last_stamp(run_dir), "error": str(error)}))


def _forget_restart_stop(run_dir: str | os.PathLike) -> None:
    """The record of ``note_restart_stop`` removed once the run has trained to its end: that stop is past."""
    with contextlib.suppress(OSError):
        (Path(run_dir) / STOPPED_FILE).unlink(missing_ok=True)


def repeated_restart_stop(run_dir: str | os.PathLike, launch: Launch | None) -> str | None:
    """The error a restart of this launch would meet again (``note_restart_stop``: the same launch stopped on it,
    and the run has saved nothing since), else None."""
    if not _known_restart(launch):
        return None
    try:
        record = json.loads((Path(run_dir) / STOPPED_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("launch") != launch.launch_id \
            or record.get("checkpoint") != _last_stamp(run_dir):
        return None
    return str(record.get("error"))


def check_fit_arguments(cfg: Any, run_dir: str | os.PathLike) -> None:
    """A ValueError naming the fix for ``fit``'s (and ``fit_gan``'s) arguments of the wrong kind, before any work:
    settings as a dict (or anything but a TrainConfig), a run directory that is a file."""
    if not isinstance(cfg, TrainConfig):
        hint = "TrainConfig(**settings)" if isinstance(cfg, dict) else "a capsnet.train.TrainConfig"
        raise ValueError(f"the training settings must be a TrainConfig, got {type(cfg).__name__}; pass {hint}")
    if Path(run_dir).exists() and not Path(run_dir).is_dir():
        raise ValueError(f"run_dir {run_dir} is a file; give a folder for the run's checkpoints and metrics")


def fit(model_config: Any, cfg: TrainConfig, run_dir: str | os.PathLike, *, device: str | torch.device = "auto",
        data_root: str | os.PathLike | None = None, resume: bool = False, progress: bool = True,
        compile: bool | str = False, distributed: bool | None = None,
        tensorboard: str | os.PathLike | None = None, data: tuple[Split, Split] | None = None,
        save_every_s: float | None = SAVE_EVERY_S, on_epoch: Callable[[dict[str, Any]], None] | None = None,
        lock: RunLock | None = None) -> dict[str, Any]:
    """Train the registered model ``model_config`` configures, evaluating and checkpointing into ``run_dir`` every
    ``cfg.eval_every`` epochs and after the last (an epoch between evaluations still writes a resumable
    ``last.safetensors`` once the last save is ``SAVE_AFTER_S`` seconds old, and inside an epoch once it is
    ``save_every_s`` old: None or 0 saves at epoch ends only). ``on_epoch(record)`` is called with each
    evaluated epoch's record (rank 0; the CLI's --no-progress prints a line for each).

    A save inside an epoch holds the weights, optimizer and random state after
    that batch, the epoch's running sums and its batch generator's state, so a
    resume trains the epoch's remaining batches exactly as the uninterrupted
    run would have (the same weights, the same metrics but the epoch's
    images/s); ``metrics.jsonl`` and ``best.safetensors`` change only at epoch
    ends. Under torchrun the save is collective (rank 0's clock decides, asked
    every 64 steps) and holds every rank's random state (each draws its own
    dropout), so a resume by as many processes continues each rank's draws.

    ``run_dir`` receives ``last.safetensors`` (resumable: weights, optimizer,
    step), ``best.safetensors`` (best accuracy on the validation split, or on
    the test split when there is none), ``config.json`` and ``metrics.jsonl``
    (one line per epoch). With ``resume=True`` training continues from
    ``last.safetensors`` with the run's saved configuration (``resume_configs``
    reads it); only ``cfg.epochs`` may differ from it. With ``tensorboard``
    (a folder), every evaluated epoch is also written there for TensorBoard:
    the same numbers as metrics.jsonl, reconstructions and a pose sweep
    (``capsnet.tensorboard``). Returns the final epoch's metrics.

    Speed: ``cfg.amp == "bf16"`` runs the training steps under bfloat16
    autocast, ``"fp16"`` under float16 autocast with a gradient scaler saved
    with the run (evaluation stays fp32); ``compile`` compiles the model for the
    training steps (see ``capsnet.runtime.compile_model``; not part of the saved
    configuration, so a run may resume with or without it, though then not bit
    for bit). Adam is fused where ``fuses_adam`` says (CUDA; the CPU from torch 2.4). The process's C library
    allocator is left as it is: ``capsnet train`` first calls ``capsnet.memory.keep_freed_memory()`` (its
    ``--allocator keep``), which a Python caller on Linux calls once for the same speed (an ``em-capsnet-small``
    step, whose votes are large, ran 1.64x faster with it on a 2-core CPU: benchmarks/allocator_steps.py). The
    running loss and accuracy stay on the
    device and reach the progress bar about twice a second; on MNIST and
    Fashion-MNIST no training step waits on the host (the MultiMNIST and
    translated-MNIST generators check their draws, which does).

    Several processes: started by torchrun (``torchrun --nproc_per_node N -m
    capsnet train ...``, its variables in the environment), every process
    calls ``fit`` and they train as one run with ``DistributedDataParallel``
    (NCCL on CUDA, each on ``cuda:LOCAL_RANK``; gloo on the CPU).
    ``cfg.batch_size`` is the global batch: each optimizer step takes the
    same examples, with the same augmentation draws, as one process would,
    split into one contiguous slice per rank, so the weights follow the
    one-process run to float rounding (for models with dropout, and with
    BatchNorm on the CPU, only in distribution: see the README). Rank 0 alone evaluates,
    writes ``run_dir`` and shows progress; every rank resumes from the same
    checkpoint. ``distributed``: None uses the launcher when its variables are
    set, True demands it (a ``DistributedError`` without it), False ignores
    it. A process group the caller initialised is used and left to them;
    one ``fit`` creates, it destroys.

    torch's global random state is seeded from ``cfg.seed`` for the run and
    the caller's restored after. Ctrl-C and SIGTERM are caught (a save, then
    a stop; one in an epoch's last batch or its evaluation saves the epoch
    trained, not evaluated, which the resume evaluates) when ``fit`` runs on
    the main thread; on another thread, where
    Python delivers no signal, the run goes on to its end (a process killed
    meanwhile resumes from its last save).

    ``data``: (training split, test split) to train and score on instead of
    ``cfg.dataset``'s own, which then only names the task whose batches and
    augmentation they take (the synthesis experiment trains classifiers on
    generated images this way); one process only, and a resume must pass the
    same splits again.

    ``lock``: a ``capsnet.checkpoint.RunLock`` on ``run_dir`` that the caller
    has taken already (``acquire``; on rank 0 under torchrun), so that nothing
    it says about the run comes before the lock decides (``capsnet train
    --resume`` prints "resuming" under it: two at once printed it, and one was
    refused after); ``fit`` trains under it and releases it at the end. None:
    ``fit`` takes its own.
    """
    check_fit_arguments(cfg, run_dir)
    check_held_lock(lock, run_dir)
    require_compiler(compile, device)  # a library call too: Inductor's own error came at the first step
    launch = launcher(required=bool(distributed)) if distributed is not False else None
    if launch is not None:
        launch = identified(launch)  # its id from torchrun's agent store: the same in each of its restarts
        if (stopped := repeated_restart_stop(run_dir, launch)) is not None:  # every rank, before the group forms
            saved = _last_stamp(run_dir) is not None
            start = "the same checkpoint" if saved else "the same start (it saved nothing)"
            # the record may be another rank's message, whose "rank 0 says" rank 0 of this restart does not
            kept = f"{Path(run_dir) / 'last.safetensors'} is kept" if saved else "no checkpoint was written"
            stopped = stopped.replace(RANK0_KEPT, kept)
            raise NonFiniteLoss(f"torchrun restarted this run (restart {launch.restart} of at most "
                                f"{launch.max_restarts}), but its last attempt stopped on an error that a run from "
                                f"{start} meets again, so it stops at once: {stopped}")
        if not resume and restarted_run(run_dir, launch):  # every rank reads the same file before any writes it
            resume = True
            if launch.is_main:
                log.warning("torchrun restarted this run (restart %d of at most %d, after a process stopped); it "
                            "resumes from %s", launch.restart, launch.max_restarts, Path(run_dir) / "last.safetensors")
    # the package and a folder that can be written, before the data loads or a file of the run is written; by the
    # processes on rank 0's machine (Launch.on_main_machine), since rank 0 alone writes the logs: a
    # folder on that machine's own disk need not be on the others (a bug hunt, 2026-12-04); its other processes check
    # too, so that a refusal comes from each of them at once rather than after torchrun stops them
    if tensorboard is not None and (launch is None or launch.on_main_machine):
        from .tensorboard import check_log_dir

        # a live run's folder: said as such, not as its logs to remove (a lock the caller holds is this run's; every
        # rank checks before the group forms, so none holds the lock yet, except rank 0 of a resume, which
        # `capsnet train --resume` takes before fit: the other ranks leave that check to rank 0, which refused a
        # torchrun resume with --tensorboard as "being written by another capsnet run", its own: a review,
        # 2026-12-04)
        if lock is None and not (resume and launch is not None and not launch.is_main):
            RunLock(run_dir).refuse_if_held()
        check_log_dir(tensorboard, run_dir, resume)
    dev = resolve_device(device)
    if launch is None:
        with SaveThenStop(enabled=True) as stop, lock or RunLock(run_dir) as lock, keeps_rng(dev):  # caller's RNG after
            final = _fit(model_config, cfg, run_dir, dev, data_root, resume, progress, compile, None, tensorboard,
                         data, save_every_s, stop, on_epoch, lock)
        _forget_restart_stop(run_dir)
        return final
    if data is not None:
        raise DistributedError("fit(data=...) trains in one process; run it without torchrun")
    check_batch_divides(cfg, launch, run_dir, resume)
    dev, created = join(launch, dev)
    ended = None  # the device, once this rank's training ended without an error
    lock = lock or RunLock(run_dir)  # taken by the rank that writes
    try:
        with keeps_rng(dev):
            final = _fit(model_config, cfg, run_dir, dev, data_root, resume, progress, compile, launch, tensorboard,
                         save_every_s=save_every_s, on_epoch=on_epoch, lock=lock)
        ended = dev
        if launch.is_main:
            _forget_restart_stop(run_dir)
        return final
    except NonFiniteLoss as e:
        note_restart_stop(run_dir, launch, e)
        raise
    except (dist.DistError, RuntimeError) as e:
        # a collective that lost its peers (gloo: "Connection closed by peer"): another rank stopped on its own error,
        # which it prints; this one says so in a line rather than a traceback of the library's internals
        if not isinstance(e, dist.DistError) and not _lost_peer(e):
            raise
        if "timed out" in str(e).lower() or "timeout" in str(e).lower():  # no process stopped: one waited too long
            from .distributed import TIMEOUT_ENV, process_group_timeout

            if created:  # capsnet's group: its timeout is the one waited
                waited = process_group_timeout().total_seconds() / 60
                go_on = "resume" if (Path(run_dir) / "last.safetensors").exists() else \
                    "run the command again (the run had saved nothing to resume)"
                after, fix = f" after {waited:g} minutes", f"set {TIMEOUT_ENV} to more minutes and {go_on}"
                longer = "that"
            else:  # the caller's own group, made with the timeout they gave it
                after, fix = "", "give init_process_group a longer timeout and resume"
                longer = "the process group's timeout (the one its init_process_group was given)"
            raise DistributedError(f"a collective timed out{after}: another process of this run took longer than "
                                   f"{longer} alone (an evaluation or a download on the first rank); {fix} "
                                   f"({type(e).__name__}: {str(e).splitlines()[0][:160]})") from e
        raise PeerLostError(f"another process of this run stopped (its own error, above or in its log, says why; "
                            f"a process killed says nothing), and this one could not go on without it "
                            f"({type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else 'no message'})") from e
    finally:
        lock.release()
        leave(created, ended)


def _lost_peer(e: BaseException) -> bool:
    """Whether a RuntimeError is a collective's failure to reach another rank (gloo and NCCL raise plain
    RuntimeErrors for some of these)."""
    text = str(e)
    return any(s in text for s in ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
                                   "gloo/transport"))


def _fingerprint(model_config: Any, cfg: TrainConfig, state: dict[str, Any], within: dict[str, Any] | None,
                 train: Split, held: Split, save_every_s: float | None = None) -> dict[str, Any]:
    """What every rank of one run must share (``distributed.agree``): its settings field by field, how many
    examples it trains and scores, a digest of its training images and labels, and where it resumes."""
    digest = hashlib.sha256()
    for t in (train.images, train.labels):
        digest.update(str((t.dtype, tuple(t.shape))).encode())
        digest.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    settings = cfg.to_dict()
    if user_folder(cfg.dataset):  # a user's folder by its name: machines may hold it at other paths (the data's
        settings["dataset"] = dataset_stem(cfg.dataset)  # digest below says whether they hold the same files)
    return ({f"model_config.{k}": v for k, v in model_config.to_dict().items()}
            | {f"train_config.{k}": v for k, v in settings.items()}
            # saves inside an epoch or not: the ranks that do meet in a collective every 64 steps, which the others
            # never reach (a --save-every 0 on one machine hung the run)
            | {"saves inside epochs (--save-every)": bool(save_every_s)}
            | {"training examples": len(train), "held-out examples": len(held),
               "training data (sha256)": digest.hexdigest()[:16],
               "resumed at": saved_point(state | ({"within": within} if within else {}))})


def _fit(model_config: Any, cfg: TrainConfig, run_dir: str | os.PathLike, dev: torch.device,
         data_root: str | os.PathLike | None, resume: bool, progress: bool, compile: bool | str,
         launch: Launch | None, tensorboard: str | os.PathLike | None = None,
         data: tuple[Split, Split] | None = None, save_every_s: float | None = None,
         stop: SaveThenStop | None = None, on_epoch: Callable[[dict[str, Any]], None] | None = None,
         lock: RunLock | None = None) -> dict[str, Any]:
    """``fit`` on ``dev``, alone (``launch`` None) or as one rank of the process group already joined; ``lock``
    the run directory's, taken when the run starts to write."""
    main = launch is None or launch.is_main  # the one process that writes, evaluates and shows progress
    progress = progress and main
    run_dir = Path(run_dir)
    name = model_name(model_config)
    spec = model_spec(name)
    kind = task(cfg.dataset).kind
    if spec.kind == "synthesis":
        raise ValueError(f"{name} is a GAN: train it with capsnet.gan.fit_gan (capsnet train does so itself)")
    if spec.kind != kind:
        raise ValueError(f"{name} is a {spec.kind} model but {cfg.dataset} is a {kind} data set; choose a "
                         f"{spec.kind} data set or a {kind} model")
    needed = {f: v for f, v in input_fields(name, cfg.dataset).items() if hasattr(model_config, f)}
    off = {f: getattr(model_config, f) for f, v in needed.items() if getattr(model_config, f) != v}
    if off.keys() == {"num_classes"} and user_folder(cfg.dataset) and resume and saved_with(run_dir, off):  # a
        # user's folder (classes:DIR) whose class folders changed since the run saved (a new run of the wrong classes,
        # or a model built wrong, gets the message below)
        raise DataError(f"{cfg.dataset} holds {needed['num_classes']} class folders and the model scores "
                        f"{off['num_classes']} classes: a run trained on this folder before a class folder was added "
                        f"or removed cannot go on; put the folder back as it was, or train a new run (another --out)")
    if off and user_folder(cfg.dataset) and resume and saved_with(run_dir, off):  # the run's own model, and its
        # folder's images turned grey <-> colour, or another size, since (the advice below is no way to go on)
        raise DataError(folder_refit(cfg.dataset, needed, off))
    if off:  # its input (channels, height, width) or its output (classes)
        raise ValueError(f"{cfg.dataset} needs a model with {', '.join(f'{f} {needed[f]}' for f in off)}, and this one "
                         f"has {', '.join(f'{f} {v}' for f, v in off.items())}; build it with those, e.g. "
                         f"create_model({name!r}, **capsnet.train.input_fields({name!r}, {cfg.dataset!r})).config "
                         f"(the CLI does so itself)")
    side = min(getattr(model_config, "input_height", 0), getattr(model_config, "input_width", 0))
    if cfg.shift and side and cfg.shift >= side:  # a digit shifted out of its frame (or, for 2^31, a crash)
        raise ValueError(f"shift {cfg.shift} (--shift) moves images of {side} pixels a side out of their frame; "
                         f"give less than {side} (the paper's: 2)")
    if cfg.shift and side and cfg.shift > side // 2 and main:  # MNIST's ink sits in the middle 20x20 of 28x28
        warnings.warn(f"--shift {cfg.shift} moves some images' ink wholly out of their {side}-pixel frame (MNIST's "
                      f"10,000 first training digits: 0.25% blank at 16, 5% at 20, 38% at 27), trained on as blanks "
                      f"of their class; the paper's is 2", UserWarning, stacklevel=2)
    if main and cfg.recon_weight > 0 and getattr(model_config, "decoder", False) is True and cfg.dataset in PREPARED:
        # a review, 2026-12-01: half the targets below 0, a sixth above 1
        warnings.warn(f"--dataset {cfg.dataset}'s inputs are standardised per image (mean 0, standard "
                      f"deviation 1), and the decoder's sigmoid reconstructs in [0, 1]: its loss cannot reach "
                      f"the values below 0 or above 1, which it then weighs against the margin loss; train "
                      f"with --no-decoder (the authors' CIFAR-10 model has none) or --recon-weight 0 unless "
                      f"that is meant", UserWarning, stacklevel=2)
    last_path, best_path = run_dir / "last.safetensors", run_dir / "best.safetensors"

    # 1. Start or resume. Under torchrun rank 0 first: its lock and the folder decide, and the other ranks read the
    # folder after it (they read a folder another run was writing as a run stopped before its first save, and said
    # so before rank 0's refusal)
    refused: Exception | None = None
    if main:
        try:
            if lock is not None and run_dir.is_dir():  # a folder another process writes: said first, as such
                lock.acquire()
            state, ckpt = start_or_resume(run_dir, model_config, cfg, resume)
        except Exception as e:  # told to the other ranks before it is raised: they would wait for rank 0
            refused = e
    if launch is not None:
        said = _from_main(None if refused is None else str(refused))
        if said is not None and not main:
            raise DistributedError(f"the first process of this run could not start, so this one stops too: {said}")
    if refused is not None:
        raise refused
    if not main:
        state, ckpt = start_or_resume(run_dir, model_config, cfg, resume, warn=False)  # rank 0 said it
    within = state.pop("within", None)  # saved inside an epoch: where in it the run stopped
    scaled = state.pop("grad_scaler", None)  # --amp fp16: the gradient scaler's state, saved with last.safetensors
    # this launch's id in every save, so its restarts know the checkpoint as theirs (one process, or no id: none)
    state = {k: v for k, v in state.items() if k != LAUNCH_KEY} | (
        {} if launch is None or launch.launch_id is None else {LAUNCH_KEY: launch.launch_id})
    last = LastSave(last_path, None if ckpt is None else ckpt.state)

    def save_last(state: dict[str, Any], g: torch.Generator | None = None,
                  ranks_rng: dict[str, torch.Tensor] | None = None) -> None:
        """``last.safetensors``: what a resume continues from (weights, optimizer, random state; inside an epoch,
        ``g``, the epoch's batch generator, too, and under torchrun ``ranks_rng``, every rank's random state)."""
        if lock is not None:
            lock.check()  # the folder still this run's
        with applied(average) as kept:  # the model's entry: the average, if any; its training weights beside Adam's
            opt_state = opt.state_dict() if kept is None else with_training_weights(opt.state_dict(), kept)
            saved = state | ({"grad_scaler": scaler.state_dict()} if scaler.is_enabled() else {})
            save_checkpoint(last_path, Checkpoint(model_name=name, model_config=model_config.to_dict(),
                                                  train_config=cfg.to_dict(), state=saved,
                                                  model_state=model.state_dict(), optimizer_state=opt_state,
                                                  rng_state=rng_state(dev) | (ranks_rng or {}) |
                                                  ({} if g is None else {"epoch_batches": g.get_state()})))
        last.wrote(state)

    # 2. Data, resident on the device. Under torchrun each machine's local rank 0 loads first (and downloads
    # what is missing), then the others read what it left.
    first_here = launch is None or launch.local_rank == 0
    if not first_here:
        barrier(dev)
    if data is None:
        train, held, held_name = load_training(cfg.dataset, train_size=cfg.train_size, val_size=cfg.val_size,
                                               test_size=cfg.test_size, seed=cfg.seed, root=data_root, progress=progress)
    else:
        (train, held), held_name = data, "test"
    if launch is not None and first_here:
        barrier(dev)
    if launch is not None:  # every rank on the same settings, data and resumed point, before any work together
        agree(_fingerprint(model_config, cfg, state, within, train, held, save_every_s), launch)
    train, held = train.to(dev), held.to(dev)
    # a segmenter's evaluation passes hold its capsule grids: at most 64 masks at a time, as before evaluate_split
    # honoured the batch it was given (cfg.eval_batch_size is 256 unless set)
    eval_batch = min(cfg.eval_batch_size, SEGMENTATION_BATCH_SIZE) if held.labels.dim() == 4 else cfg.eval_batch_size
    if len(train) == 0:
        raise ValueError("no training examples left; lower val_size or raise train_size")
    state = folder_noted(state, cfg.dataset, warn=main)
    make_batch, augment = task(cfg.dataset).batch, augmentation(cfg.augment, cfg.shift)

    # 3. Model and optimizer, same initial weights for the same seed.
    if ckpt is not None:  # its tensors against its configuration before gigabytes a damaged one may ask for
        check_fits_before_building(lambda: spec.build(model_config), ckpt)
    torch.manual_seed(cfg.seed)
    model = spec.build(model_config).to(dev)
    if launch is not None:
        probe_batch = make_batch(train, torch.arange(min(len(train), 2), device=dev),
                                 _seeded_generator(cfg.seed, 0, dev), augment)
        unreached = _freeze_unreached(model, spec.loss, probe_batch, cfg, dev)
        if unreached and main:
            log.info("parameters the loss does not reach, left out of DDP: %s", ", ".join(unreached))
        if dev.type == "cuda":  # batch statistics over the global batch, as one process computes them
            model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
        elif main and launch.world_size > 1 and any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
                                                     for m in model.modules()):
            log.warning("%s has BatchNorm layers; on the CPU (no SyncBatchNorm) each process normalises over its own "
                        "share of the batch, so training is not step for step that of one process", name)
    opt = make_optimizer(model, cfg, dev)
    scaler = grad_scaler(dev, cfg.amp)  # fp16: the loss scaled for backward (disabled: plain steps)
    average = None
    if ckpt is not None:
        load_weights(model, ckpt)  # with an average: the average (the training weights follow)
        with resume_state_of(ckpt):
            _load_optimizer_state(opt, without_training_weights(ckpt.optimizer_state))
            check_optimizer_state(opt)
            restore_rng_state(ckpt.rng_state, dev)
            if scaled is not None and scaler.is_enabled():  # the scale the run had reached, continued
                scaler.load_state_dict(scaled)
    if cfg.ema_decay:
        average = WeightAverage(model, cfg.ema_decay)  # from the start, or the saved average
        if ckpt is not None:
            restore_training_weights(ckpt, average)
    N, B = len(train), cfg.batch_size
    total_steps = run_steps(cfg, N)  # also for losses with a schedule: progress = step / total_steps
    if main:  # written once the run is known to start: a refused resume leaves the run's files as they were
        if lock is not None:  # one process writes a run at a time; it removes the writes a kill cut short
            lock_new_run(lock, run_dir, model_config, cfg, resume)  # and makes the folder
        else:
            run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(run_dir / "config.json", json.dumps({"model": name, "model_config": model_config.to_dict(),
                                                               "train_config": cfg.to_dict()}, indent=2))

    # 4. Epochs.
    step = state["step"]
    save_inside = bool(save_every_s)
    for said in budget_warnings(cfg, N, len(held) if held_name == "test" else 0) if main and step == 0 else ():
        warnings.warn(said, UserWarning, stacklevel=2)
    W, rank = (1, 0) if launch is None else (launch.world_size, launch.rank)
    board = None
    if tensorboard is not None and main:  # the same scalars as metrics.jsonl, and images, every evaluated epoch
        from .tensorboard import TensorBoardLogger

        board = TensorBoardLogger(tensorboard, held.images, run_dir)
    try:  # the board's writer thread ends with the run (a notebook's fit after fit kept one each)
        train_model = compile_model(model if launch is None else
                                    _DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None), compile)
        amp = autocast(dev, cfg.amp)
        fp16 = scaler.is_enabled()
        # several processes: a weighted loss's foreground weight is counted on the whole batch, not a slice
        seg_loss = getattr(model_config, "seg_loss", None)
        whole_batch_weight = launch is not None and seg_loss in WEIGHTED_SEGMENTATION_LOSSES
        shown_as = "dice" if kind == "segmentation" else "acc"  # the running accuracy's name on the progress bar
        stop = stop or SaveThenStop(enabled=False)
        stop.arm()  # from here an interrupt saves where training is, then stops
        for epoch in range(state["epoch"] + 1, cfg.epochs + 1):
            model.train()
            if W > 1:  # dropout: each rank its own masks, seeded by (seed, epoch, rank), so a resume replays them
                torch.manual_seed(((cfg.seed * 1_000_003 + epoch) * 4099 + rank + 1) % 2**64)
            g = _seeded_generator(cfg.seed, epoch, dev)  # the same on every rank: one order, one set of draws
            order = torch.randperm(N, generator=g, device=dev)
            starts = range(0, N, B)
            # running sums: loss and correct answers, and with grad_clip the pre-clip norms and the steps clipped
            done, sums, seen, before = resume_within(within, epoch, ckpt, g, len(starts),
                                                     2 + 2 * bool(cfg.grad_clip) + fp16, rank, fp16)  # mostly 0s
            if done and max(W, within.get("processes", 1)) > 1:  # after the seeding above: each rank's dropout draws
                restore_rank_rng(ckpt, within, rank, W, dev,
                                 any(isinstance(m, torch.nn.modules.dropout._DropoutNd) for m in model.modules()))
            bar = progress_bar(total=len(starts), initial=done, desc=f"epoch {epoch}/{cfg.epochs}", unit="batch",
                               progress=progress)
            wide = sum_dtype(dev)  # float64 (float32 on MPS)
            run_loss = torch.tensor(sums[0], dtype=wide, device=dev)  # sums on the device: no sync per step
            run_correct = torch.tensor(sums[1], dtype=wide, device=dev)
            norms = torch.tensor(sums[2:4 if cfg.grad_clip else 2], dtype=wide, device=dev)  # (2,): grad_clip
            skipped = torch.tensor(sums[-1] if fp16 else 0.0, dtype=wide, device=dev)  # fp16: steps skipped
            first_bad = torch.full((), -1, dtype=torch.int64, device=dev)  # the first step with a non-finite loss
            shown = time.monotonic()
            started = shown - before
            for start in starts[done:]:  # the bar is advanced by hand: left open after the loop, it shows the figures
                idx = order[start:start + B]
                x, y, comp = make_batch(train, idx, g, augment)  # (B, C, H, W), (B,) or (B, 2), None or (B, 2, C, H, W)
                weight, own, whole = 1.0, len(y), contextlib.nullcontext()
                if launch is not None:  # this rank's slice of the global batch, its mean loss weighted by its share
                    if whole_batch_weight:  # the weighted cross-entropy weighs as the whole batch does
                        whole = batch_foreground_weight(y)
                    lo, hi = shard(len(y), rank, W)
                    weight, own = share_weight(lo, hi, len(y), W), hi - lo
                    # a last batch smaller than the ranks: a stand-in example of weight 0 keeps DDP in step
                    if own == 0:
                        lo, hi = 0, 1
                    x, y, comp = x[lo:hi], y[lo:hi], None if comp is None else comp[lo:hi]
                for group in opt.param_groups:
                    group["lr"] = lr_at(step, cfg, total_steps)
                with amp, whole:
                    loss, scores = spec.loss(train_model, x, y, comp, recon_weight=cfg.recon_weight,
                                             progress=min(1.0, step / total_steps))
                first_bad = torch.where((first_bad < 0) & ~torch.isfinite(loss.detach()), step, first_bad)  # no sync
                opt.zero_grad(set_to_none=True)
                scaler.scale(loss if weight == 1.0 else loss * weight).backward()  # fp16: times the loss scale
                if cfg.grad_clip:  # the norm before clipping (a device tensor: no sync), summed with the steps it cut
                    scaler.unscale_(opt)  # fp16: the gradient as it is, for its norm and the clip
                    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip).to(wide)
                    if fp16:  # a norm that is not finite: the scaler skips the step; counted apart, not stopped
                        norm = torch.where(torch.isfinite(norm), norm, 0.0)
                    norms += torch.stack([norm, (norm > cfg.grad_clip).to(wide)])
                    # a finite loss with a gradient that is not (the step would make every weight NaN): stopped too
                    first_bad = torch.where((first_bad < 0) & ~torch.isfinite(norm), step, first_bad)
                if fp16:  # the scale (a device tensor: no sync) falls exactly when a step is skipped
                    scale_before = scale_tensor(scaler, dev).clone()
                    scaler.step(opt)
                    scaler.update()
                    skipped += (scale_tensor(scaler, dev) < scale_before).to(wide)
                else:
                    opt.step()
                if average is not None:
                    average.update(step)
                step += 1
                if own:
                    run_loss += loss.detach().to(wide) * len(y)
                    run_correct += _correct(scores.detach(), y).sum()
                    seen += len(y)
                if progress and time.monotonic() - shown > 0.5:
                    bar.set_postfix({"loss": f"{run_loss.item() / seen:.4f}",
                                     shown_as: f"{run_correct.item() / seen:.4f}"}, refresh=False)
                    shown = time.monotonic()
                bar.update()
                if step % _CHECK_EVERY == 0:  # fp16: the scale too, before it can reach 0 (2^-126 in 110 steps)
                    _stop_if_not_finite(first_bad, epoch, last, launch, cfg, scaler=scaler,
                                        skipped_of=_skipped_of(skipped, start // B + 1, fp16))
                stopping = stop.asked and start + B < N  # an epoch's last batch goes on to the epoch's end and save
                if stopping or (save_inside and start + B < N and _save_now(last, save_every_s, step, launch, dev)):
                    # nothing non-finite is saved: every rank together (the save is decided collectively); the check
                    # every _CHECK_EVERY steps sees the loss and the gradient, not the weights or Adam's state, which
                    # torchrun saved not finite (a review, 2026-12-04)
                    _stop_if_not_finite(first_bad, epoch, last, launch, cfg=cfg, model=model, scaler=scaler,
                                        skipped_of=_skipped_of(skipped, start // B + 1, fp16), optimizer=opt)
                    loss_sum, correct_sum, seen_all = _summed(run_loss, run_correct, seen, launch)  # resumed by rank 0
                    ranks_rng = {} if launch is None else ranks_rng_state(dev, launch)  # every rank's dropout
                    if main:
                        save_last(within_epoch({**state, "step": step}, epoch, start // B + 1,
                                               [loss_sum.item(), correct_sum.item(), *norms.tolist(),
                                                *([skipped.item()] if fp16 else [])], seen_all,
                                               time.monotonic() - started, dev, W), g, ranks_rng)
                    if stopping:
                        bar.close()
                        raise KeyboardInterrupt
            _stop_if_not_finite(first_bad, epoch, last, launch, cfg, model, scaler,  # before this epoch is saved
                                _skipped_of(skipped, len(starts), fp16), opt)
            run_loss, run_correct, seen = _summed(run_loss, run_correct, seen, launch)  # the one-process figures
            train_loss, train_accuracy = run_loss.item() / seen, run_correct.item() / seen  # waits for the device
            trained_s = time.monotonic() - started  # a resumed epoch: its two parts' seconds
            images_per_s = seen / max(trained_s, 1e-9)
            bar.set_postfix({"loss": f"{train_loss:.4f}", shown_as: f"{train_accuracy:.4f}"}, refresh=False)
            bar.close()  # its last state, with the epoch's figures

            record = {"epoch": epoch, "step": step, "lr": lr_at(step, cfg, total_steps),
                      "train_loss": train_loss, "train_accuracy": train_accuracy, "train_images_per_s": images_per_s}
            taken = len(starts) - (int(skipped.item()) if fp16 else 0)  # fp16: the steps not skipped
            if cfg.grad_clip:  # the epoch's mean gradient norm before clipping, and the share of its steps clipped
                # (None, null in JSON, when fp16's scaler skipped every step: no step had a gradient to measure)
                record |= dict(zip(("grad_norm", "clipped"), (norms / taken).tolist() if taken else (None, None)))
            if fp16:  # the steps the scaler skipped (a gradient not finite) and the scale it ended the epoch at
                record |= {"skipped_steps": len(starts) - taken, "loss_scale": scaler.get_scale()}
            if epoch % cfg.eval_every and epoch != cfg.epochs:  # a small training set runs many short epochs
                if main:  # (every rank logged it, the others' with their own images/s)
                    log.info("epoch %d: %s", epoch, record)
                state = {**state, "epoch": epoch, "step": step, "history": state["history"] + [record]}
                if main and (last.older_than(SAVE_AFTER_S) or stop.asked):  # not evaluated, but resumable
                    save_last(state)
                if stop.asked:  # asked in the epoch's last batch (an epoch of one batch has no other)
                    raise KeyboardInterrupt
                continue
            # a stop asked by now (one process), or a save due, keeps the epoch's steps before it is evaluated (a
            # kill during a long evaluation lost them; a stop waited for the evaluation's end), saved as every batch
            # of the epoch trained, its evaluation not yet: a resume evaluates it (under torchrun: collective)
            pending = stop.asked or (save_inside and _save_due(last, save_every_s, launch, dev))
            ranks_rng = ranks_rng_state(dev, launch) if pending and launch is not None else {}  # every rank's dropout
            if main:  # rank 0 alone evaluates and writes; the others wait for its state below
                def save_trained() -> None:
                    save_last(within_epoch({**state, "step": step}, epoch, len(starts),
                                           [run_loss.item(), run_correct.item(), *norms.tolist(),
                                            *([skipped.item()] if fp16 else [])], seen, trained_s, dev, W,
                                           pending=True), g, ranks_rng)

                # the average, if any, is what is scored and saved as the model; a stop ends the evaluation
                results = evaluate_or_keep(stop, average, pending, save_trained, lambda: evaluate_split(
                    model, held, batch_size=eval_batch, recon_weight=cfg.recon_weight, progress=progress))
                result = results[""]
                for extra, r in results.items():  # test_*, then e.g. affine_* (translated MNIST's other test sets)
                    prefix = held_key(extra, held_name)
                    record |= {f"{prefix}_loss": r.loss, f"{prefix}_accuracy": r.accuracy, f"{prefix}_error": r.error}
                    if hasattr(r, "iou"):  # segmentation: accuracy is the Dice
                        record |= {f"{prefix}_dice": r.dice, f"{prefix}_iou": r.iou}
                stop_if_held_out_not_finite(record, epoch, last)  # before anything of this epoch is written
                log.info("epoch %d: %s", epoch, record)
                if progress:  # one readable line per epoch, with the bars
                    write_line(describe_epoch(record, cfg.dataset))
                state = {"epoch": epoch, "step": step, "history": state["history"] + [record], "best": state["best"],
                         "eval_split": held_name} | {k: state[k] for k in ("data", LAUNCH_KEY) if k in state}
                improved = state["best"] is None or result.accuracy > state["best"]["accuracy"]
                if improved:
                    state["best"] = {"epoch": epoch, "accuracy": result.accuracy, "split": held_name}

                # 5. Checkpoints, then the metrics log rewritten from the checkpoint's
                # history, so the two always agree whatever moment a crash strikes.
                if lock is not None:
                    lock.check()  # the folder still this run's
                if improved:
                    with applied(average):
                        save_best(best_path, name, model_config, cfg, state, model)
                save_last(state)
                write_metrics(run_dir, state["history"])
                if board is not None:
                    with applied(average):
                        board.log_epoch(model, record)
                if on_epoch is not None and main:  # after the saves: a callback that stops the run (a sweep's
                    on_epoch(record)  # pruning raises) keeps the epoch it was shown
            if launch is not None:  # every rank carries on with rank 0's state, once its checkpoint is complete
                state = _from_main(state)
                last.state = state  # what rank 0 wrote
            if stop.asked and epoch < cfg.epochs:  # asked after the evaluation, as the epoch was saved: stopped here
                raise KeyboardInterrupt
        if main and ckpt is not None and state["epoch"] >= cfg.epochs:
            if lock is not None:
                lock.check()  # the folder still this run's
            write_metrics(run_dir, state["history"])
        return state["history"][-1] if state["history"] else {}
    finally:
        if board is not None:
            board.close()


def finished(state: dict[str, Any], epochs: int) -> bool:
    """Whether a run whose last.safetensors holds ``state`` has trained ``epochs`` whole epochs and stopped there (not
    inside a later one)."""
    return state["epoch"] == epochs and "within" not in state  # more epochs: the resume is refused (fit says why)


def describe_epoch(record: dict[str, Any], dataset: str) -> str:
    """One line for an epoch's metrics record: the held-out accuracy and error, extra test sets, the train loss
    (and with --grad-clip the mean gradient norm before clipping and the share of steps clipped)."""
    line = _describe_epoch(record, dataset)
    if record.get("grad_norm") is not None:
        line += f", gradient norm {record['grad_norm']:.3g} ({100 * record['clipped']:.1f}% of steps clipped)"
    if record.get("skipped_steps"):  # --amp fp16
        line += f", {record['skipped_steps']} step{'s' if record['skipped_steps'] > 1 else ''} skipped " \
                f"(loss scale {record['loss_scale']:g})"
    return line


def held_key(extra: str, held_name: str) -> str:
    """The metrics' prefix of a held-out set: ``held_name`` ("test", "val") for the split itself, an extra set's own
    name ("ood", "affine") after the test split, and "val_" before it after the validation split, whose digits make
    it then: "ood_dice" of a --val-size run was a validation figure under a test set's name."""
    if not extra:
        return held_name
    return f"{held_name}_{extra}" if held_name == "val" else extra


def _describe_epoch(record: dict[str, Any], dataset: str) -> str:
    split = "val" if "val_accuracy" in record else "test"
    if f"{split}_accuracy" not in record:
        return f"epoch {record['epoch']}: train loss {record['train_loss']:.4f} (not evaluated)"
    what = task(dataset).metric
    if f"{split}_dice" in record:  # segmentation: Dice and IoU of each split
        sets = [split] + [k[:-len("_dice")] for k in record if k.endswith("_dice") and k != f"{split}_dice"]
        scored = ", ".join(f"{name} Dice {record[f'{name}_dice']:.4f} IoU {record[f'{name}_iou']:.4f}" for name in sets)
        return f"epoch {record['epoch']}: {scored}, train loss {record['train_loss']:.4f}"
    others = [k[:-len("_accuracy")] for k in record if k.endswith("_accuracy") and k not in
              (f"{split}_accuracy", "train_accuracy")]  # extra test sets, e.g. translated MNIST's affine ones
    extra = "".join(f", {name} {record[f'{name}_accuracy']:.4f}" for name in others)
    return (f"epoch {record['epoch']}: {split} {what} {record[f'{split}_accuracy']:.4f} "
            f"(error {100 * record[f'{split}_error']:.2f}%){extra}, train loss {record['train_loss']:.4f}")
