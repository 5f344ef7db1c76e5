"""The two-optimizer loop of the conditional GANs (CapsPix2pix, Bass et al. 2019; pix2pix, Isola et al. 2017).

A synthesis model (registry kind "synthesis") holds a generator and a
discriminator and says how each is scored (``d_loss``, ``g_loss``: the
adversarial terms with smoothed labels and the L1 term, weights in its
config). Each step draws a batch of (label map, image) pairs and a noise
vector per pair, makes the fakes once, then

1. steps the discriminator on real pairs against fakes (the fakes detached),
2. steps the generator on the discriminator's verdict of the same fakes and
   their L1 distance to the real images (the discriminator's weights frozen
   for that backward pass).

Everything else is ``capsnet.train.fit``'s: Adam (betas from the model's
config, the learning rate and its decay from ``TrainConfig``), seeded batch
order and noise per epoch, a progress bar with both losses, one record per
epoch in ``metrics.jsonl``, held-out scores (``capsnet.synthesis``) every
``eval_every`` epochs, ``last.safetensors`` with both optimizers' state and
the random state at each evaluation (and between them once the last save is
``capsnet.train.SAVE_AFTER_S`` old; inside an epoch once it is
``save_every_s`` old, with the epoch's running sums and batch generator), so
``resume`` continues exactly, and ``best.safetensors`` (highest held-out SSIM).

Collapse to one saturated level: every epoch records the generated and the
real images' pixel standard deviation per image (``train_fake_std``,
``train_real_std``) and the generated pixels' mean distance to the nearer
end of [0, 1] (``train_fake_edge``), means over the epoch, and warns when the
generated images are both flat (their deviation below ``COLLAPSE_RATIO`` of
the real ones') and saturated (``train_fake_edge`` below ``COLLAPSE_EDGE``):
a generator whose last layer gives the same value at every position is
driven by the L1 term to the target's median level (black on MNIST), where
its sigmoid saturates and it rarely recovers (docs/results.md, "What the
capsule generator uses"). A flat grey start (pixels near 0.5) is not one.

With ``TrainConfig.ema_decay`` > 0 the loop also keeps an exponential
moving average of the generator's weights (``capsnet.average``; Yazici et
al., "The unusual effectiveness of averaging in GAN training", ICLR 2019):
the average is what is evaluated and what both checkpoints hold as the
generator's weights (so ``eval``, ``generate``, ``figures`` and the viewer
use it), while training continues from the generator's own weights, kept in
``last.safetensors`` beside the optimizers' state for a resume. Training's
trajectory is the same with or without it; the discriminator is not
averaged.

``compile`` (``capsnet train --compile MODE``) compiles the generator for
the training steps (``capsnet.runtime.compile_model``): the capsule
generator's step is many small routing kernels, which compiling fuses and
CUDA graphs ("reduce-overhead") launch at once. The discriminator stays
eager: its weights are frozen and thawed inside every step, and a graph
would be made again for each. Evaluation, the average and the checkpoints
use the model itself.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from ._progress import progress_bar, write_line
from .average import (WeightAverage, applied, restore_training_weights, with_training_weights,
                      without_training_weights)
from .checkpoint import (CONFIG_FIX, Checkpoint, CheckpointError, RunLock, atomic_write_text,
                         check_fits_before_building, load_weights, read_json_object, save_checkpoint)
from .data.idx import DataError
from .image_metrics import SSIM_WINDOW
from .data.tasks import PAIRS_PREFIX, input_shape, load_training, task
from .models import model_name, model_spec
from .runtime import (autocast, compile_model, grad_scaler, keeps_rng, require_compiler, resolve_device, scale_tensor,
                      sum_dtype)
from . import train as _train
from .train import (SAVE_EVERY_S, LastSave, NonFiniteLoss, TrainConfig, _seeded_generator, budget_warnings,
                    check_optimizer_state, folder_noted, lr_at, restore_rng_state, resume_state_of, resume_within,
                    rng_state, run_steps, save_best, start_or_resume, not_finite, within_epoch, write_metrics)

__all__ = ["fit_gan", "gan_step", "describe_gan_epoch", "make_optimizers", "GAN_LR"]

from .models.capspix2pix import GAN_LR  # the synthesis models' own rate (their ModelSpec.train_defaults)

COLLAPSE_RATIO = 0.05  # generated images this much flatter than the real ones (pixel sd) ...
COLLAPSE_EDGE = 0.01  # ... with their pixels this close to 0 or 1 on average: an epoch's warning

log = logging.getLogger(__name__)


def make_optimizers(model: torch.nn.Module, cfg: TrainConfig) -> tuple[torch.optim.Adam, torch.optim.Adam]:
    """Adam for the generator and for the discriminator, at ``cfg.lr`` with the model's betas (pix2pix: 0.5, 0.999)."""
    betas = (model.config.beta1, model.config.beta2)
    return (torch.optim.Adam(model.generator.parameters(), lr=cfg.lr, betas=betas),
            torch.optim.Adam(model.discriminator.parameters(), lr=cfg.lr, betas=betas))


def _merged(opt_g: torch.optim.Optimizer, opt_d: torch.optim.Optimizer,
            weights: list[torch.Tensor] | None = None) -> dict[str, Any]:
    """Both optimizers' states as one (the checkpoint's single optimizer entry): D's parameter indices after G's,
    then, with ``weights`` (the generator's training weights while the model's entry holds their average), those
    (``capsnet.average.with_training_weights``)."""
    g, d = opt_g.state_dict(), opt_d.state_dict()
    n = sum(len(group["params"]) for group in g["param_groups"])
    groups = g["param_groups"] + [{**group, "params": [i + n for i in group["params"]], "owner": "d"}
                                  for group in d["param_groups"]]
    merged = {"state": {**g["state"], **{i + n: s for i, s in d["state"].items()}}, "param_groups": groups}
    return merged if weights is None else with_training_weights(merged, weights)


def _split_into(merged: dict[str, Any], opt_g: torch.optim.Optimizer, opt_d: torch.optim.Optimizer) -> None:
    """Load a ``_merged`` state back into the two optimizers (the training weights, if any, are not theirs)."""
    merged = without_training_weights(merged)
    g_groups = [g for g in merged["param_groups"] if g.get("owner") != "d"]
    d_groups = [{k: v for k, v in g.items() if k != "owner"} for g in merged["param_groups"] if g.get("owner") == "d"]
    n = sum(len(group["params"]) for group in g_groups)
    state = {int(i): s for i, s in merged["state"].items()}
    opt_g.load_state_dict({"state": {i: s for i, s in state.items() if i < n}, "param_groups": g_groups})
    d_params = {i for g in d_groups for i in g["params"]}  # (a damaged entry's stray indices are nobody's)
    opt_d.load_state_dict({"state": {i - n: s for i, s in state.items() if i in d_params},
                           "param_groups": [{**g, "params": [i - n for i in g["params"]]} for g in d_groups]})


def gan_step(model: torch.nn.Module, opt_g: torch.optim.Optimizer, opt_d: torch.optim.Optimizer,
             labels: torch.Tensor, real: torch.Tensor, z: torch.Tensor, amp: Any = contextlib.nullcontext(),
             generator: Callable[..., torch.Tensor] | None = None, scaler: torch.amp.GradScaler | None = None
             ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """One training step of a conditional GAN: the fakes made once, the discriminator's step on real against fake
    pairs, then the generator's on D's verdict and the L1 term, D's weights frozen for it (and thawed after).
    ``generator`` makes the fakes in place of ``model.generator`` (its compiled form: the same weights). ``scaler``
    (--amp fp16) scales both losses for backward and steps both optimizers through it, then updates its scale once:
    each optimizer's step is skipped when its own gradient is not finite, and the scale halves when either was.

    Shapes: labels (B, C, H, W), real (B, C', H, W), z (B, noise_dim) -> D's loss (), G's loss (), D's parts,
    G's parts (detached scalars; with ``fake_std`` and ``real_std``, the images' pixel standard deviation per
    image, averaged over the batch, and ``fake_edge``, the fakes' mean distance to the nearer end of [0, 1]).
    """
    with amp:
        fake = (model.generator if generator is None else generator)(labels, z)  # (B, C', H, W)
        d_loss, d_parts = model.d_loss(real, fake.detach(), labels)
    if scaler is None:  # a disabled one: plain backward and steps
        scaler = grad_scaler(labels.device, "none")
    opt_d.zero_grad(set_to_none=True)
    scaler.scale(d_loss).backward()
    scaler.step(opt_d)
    model.discriminator.requires_grad_(False)  # the generator's step reads D's verdict but leaves its weights be
    try:
        with amp:
            g_loss, g_parts = model.g_loss(real, fake, labels)
        opt_g.zero_grad(set_to_none=True)
        scaler.scale(g_loss).backward()
        scaler.step(opt_g)
        scaler.update()
    finally:
        model.discriminator.requires_grad_(True)
    f = fake.detach().float()
    g_parts = {**g_parts, "fake_std": f.flatten(1).std(1).mean(), "fake_edge": torch.minimum(f, 1 - f).mean(),
               "real_std": real.detach().float().flatten(1).std(1).mean()}
    return d_loss, g_loss, d_parts, g_parts


def _stop_if_bad(bad: torch.Tensor, epoch: int, last: LastSave, model: torch.nn.Module,
                 scaler: torch.amp.GradScaler | None = None,
                 skipped_of: Callable[[], tuple[int, int]] = lambda: (0, 0),
                 optimizers: Sequence[torch.optim.Optimizer] = ()) -> None:
    """Raise ``NonFiniteLoss`` when a step of this epoch had a loss that was not finite (``bad``: a device tensor,
    the run's step, 1-based, where it first was, else -1), or when ``model``'s weights or buffers or ``optimizers``'
    state are not (``capsnet.train.not_finite``: a finite loss whose gradient was not), or (--amp fp16) ``scaler``'s
    scale fell below ``MIN_LOSS_SCALE`` (``skipped_of()``: the epoch's skipped steps and steps so far); asked before
    every save and every ``_CHECK_EVERY`` steps."""
    first = int(bad)
    if first < 0 and scaler is not None:  # the scale's own message: gradients, steps skipped
        _train.stop_if_scale_fell(scaler, epoch, last.kept, skipped_of)
    if first >= 0:
        raise NonFiniteLoss(f"a GAN loss became NaN or infinite at step {first} (epoch {epoch}); stopped without "
                            f"saving, {last.kept()}. Lower --lr or check the label maps and images for NaN or infinite "
                            f"pixels, {_train._NEW_RUN}")
    if (spoilt := not_finite(model, *optimizers)) is not None:
        raise NonFiniteLoss(f"in the GAN, {spoilt} in epoch {epoch}, after steps whose losses "
                            f"were finite; stopped without saving, {last.kept()}. Lower --lr, {_train._NEW_RUN}")


def describe_gan_epoch(record: dict[str, Any]) -> str:
    """One line for an epoch of a GAN: the held-out scores when it was evaluated, and both training losses."""
    losses = f"D loss {record['train_d_loss']:.4f}, G loss {record['train_g_loss']:.4f} (L1 {record['train_l1']:.4f})"
    split = "val" if "val_l1" in record else "test"
    if f"{split}_l1" not in record:
        return f"epoch {record['epoch']}: {losses} (not evaluated)"
    judged = f", {split} judge accuracy {record[f'{split}_judge_accuracy']:.4f}" \
        if f"{split}_judge_accuracy" in record else ""
    return (f"epoch {record['epoch']}: {split} L1 {record[f'{split}_l1']:.4f} SSIM {record[f'{split}_ssim']:.4f} "
            f"IoU {record[f'{split}_iou']:.4f} spread {record[f'{split}_spread']:.4f}{judged}; {losses}")


def resumed_judge(run_dir: Path, dataset: str, given: str | os.PathLike | None) -> str | None:
    """The judge a resume of the run in ``run_dir`` (trained on ``dataset``) scores its epochs with: ``given``, else
    the run's own (none, if it trained without)."""
    from .synthesis import judge_for

    return judge_for(dataset, given, run_dir=run_dir) if given is not None or _judged(run_dir) else None


def load_run_judge(judge: str | None, *, given: str | os.PathLike | None, run_dir: Path, dataset: str,
                   device: str | torch.device = "cpu") -> torch.nn.Module | None:
    """``load_judge(judge)`` (None: None), with a judge recorded in the run's config.json (``given`` None) that
    cannot be read said as such: "checkpoint X does not exist" alone did not say which checkpoint, or the fix."""
    from .synthesis import load_judge

    if judge is None:
        return None
    try:
        return load_judge(judge, device=device, dataset=dataset)
    except CheckpointError as e:
        if given is not None or not (run_dir / "config.json").is_file():
            raise
        raise CheckpointError(f"the judge recorded in {run_dir / 'config.json'}, which scored the run's epochs so "
                              f"far, cannot be read ({e}); give --judge with where it is now (or another classifier "
                              f"trained on {task(dataset).source})") from None


def _judged(run_dir: Path) -> bool:
    """Whether the run in ``run_dir`` trained with a judge: its config.json names one (a run made without one says
    null, and its resume stays without; a config.json without the entry, the run's judge as judge_for finds it)."""
    saved = run_dir / "config.json"
    return not saved.is_file() or read_json_object(saved, CONFIG_FIX).get("judge", "") is not None


def fit_gan(model_config: Any, cfg: TrainConfig, run_dir: str | os.PathLike, *, device: str | torch.device = "auto",
            data_root: str | os.PathLike | None = None, resume: bool = False, progress: bool = True,
            judge: str | os.PathLike | None = None, compile: bool | str = False,
            save_every_s: float | None = SAVE_EVERY_S, on_epoch: Callable[[dict[str, Any]], None] | None = None,
            lock: RunLock | None = None) -> dict[str, Any]:
    """Train the synthesis model ``model_config`` configures on ``cfg.dataset``'s pairs (see the module docstring).

    ``judge``: a classifier checkpoint (or ``pretrained:NAME``) that reads the
    generated test images at every evaluation; its accuracy against the label
    maps' classes is recorded as ``*_judge_accuracy`` (a resume keeps the
    run's judge unless given another; a finished run's is neither loaded
    nor replaced). ``compile``: the generator compiled for
    the training steps (see the module docstring). ``save_every_s``: seconds
    between saves inside an epoch (None or 0: at epoch ends only; see
    ``capsnet.train.fit``). ``on_epoch(record)``: called with each evaluated epoch's record. ``lock``: a
    ``RunLock`` on ``run_dir`` the caller has taken, as ``capsnet.train.fit`` takes it. Returns the final epoch's
    record.
    """
    _train.check_held_lock(lock, run_dir)
    from .distributed import DistributedError, launcher

    try:
        launch = launcher()
    except DistributedError:  # some of torchrun's variables alone (a cluster's MASTER_ADDR): one process, as fit
        launch = None  # (distributed=False) takes it in the experiments
    if launch is not None and launch.world_size > 1:  # each process trained the GAN whole, and all but one met the
        raise DistributedError("fit_gan trains the GAN in one process; run it without torchrun")  # lock (a review)
    require_compiler(compile, device)  # before the run's folder and data: Inductor's own error came at the first step
    with _train.SaveThenStop(enabled=True) as stop, lock or RunLock(run_dir) as lock, keeps_rng(resolve_device(device)):
        return _fit_gan(model_config, cfg, run_dir, device=device, data_root=data_root, resume=resume,
                        progress=progress, judge=judge, compile=compile, save_every_s=save_every_s, stop=stop,
                        on_epoch=on_epoch, lock=lock)


def _fit_gan(model_config: Any, cfg: TrainConfig, run_dir: str | os.PathLike, *, device: str | torch.device,
             data_root: str | os.PathLike | None, resume: bool, progress: bool, judge: str | os.PathLike | None,
             compile: bool | str, save_every_s: float | None, stop: "_train.SaveThenStop",
             on_epoch: Callable[[dict[str, Any]], None] | None = None, lock: RunLock) -> dict[str, Any]:
    """``fit_gan``, with ``stop`` the interrupt handling its caller armed and restores, and ``lock`` the run
    directory's, taken when the run starts to write."""
    from .synthesis import EVAL_BATCH_SIZE, evaluate_synthesis, judge_for

    _train.check_fit_arguments(cfg, run_dir)
    dev = resolve_device(device)
    run_dir = Path(run_dir)
    name = model_name(model_config)
    spec = model_spec(name)
    kind = task(cfg.dataset).kind
    if spec.kind != "synthesis" or kind != "synthesis":
        raise ValueError(f"{name} is a {spec.kind} model and {cfg.dataset} a {kind} data set; the GAN loop trains "
                         f"a synthesis model (capspix2pix, capspix2pix-deep, pix2pix) on a synthesis data set (mnist-skeleton, "
                         f"fashion-silhouette, pairs:DIR)")
    if cfg.grad_clip:
        raise ValueError(f"grad_clip (--grad-clip) applies to the classifier and segmentation loop; the GAN loop of "
                         f"{name} steps two optimizers on their own and clips neither: train without it")
    if cfg.adam_beta1 != TrainConfig.adam_beta1:
        raise ValueError(f"adam_beta1 (--adam-beta1) applies to the classifier and segmentation loop; the GAN loop of "
                         f"{name} keeps pix2pix's beta1 of 0.5 for both its optimizers: train without it")
    shape = (model_config.in_channels, model_config.input_height, model_config.input_width)
    wanted = dict(zip(("in_channels", "input_height", "input_width"), input_shape(cfg.dataset))) | {
        "out_channels": task(cfg.dataset).target_channels}
    off = {f: getattr(model_config, f) for f, v in wanted.items() if getattr(model_config, f) != v}
    if off and resume and cfg.dataset.startswith(PAIRS_PREFIX) and _train.saved_with(run_dir, off):  # the run's
        # own model, and the user's pairs changed since it trained
        raise DataError(_train.folder_refit(cfg.dataset, wanted, off))
    if off:
        raise ValueError(f"{cfg.dataset} pairs {input_shape(cfg.dataset)} label maps with "
                         f"{task(cfg.dataset).target_channels}-channel images, but the model takes {shape} and makes "
                         f"{model_config.out_channels}-channel images; build it for this data (the CLI does so itself)")
    if min(shape[1:]) < SSIM_WINDOW:  # found at the first evaluation before, after its training was done and lost
        raise ValueError(f"{cfg.dataset} holds {shape[1]}x{shape[2]} (HxW) images, and every evaluation scores SSIM, "
                         f"whose {SSIM_WINDOW}x{SSIM_WINDOW} window (Wang et al. 2004) needs sides of at least "
                         f"{SSIM_WINDOW}: use images of at least 16x16 (the networks take multiples of 8)")
    last_path, best_path = run_dir / "last.safetensors", run_dir / "best.safetensors"

    # 1. Start or resume.
    if run_dir.is_dir():  # a folder another process writes: said first, as such
        lock.acquire()
    state, ckpt = start_or_resume(run_dir, model_config, cfg, resume)
    within = state.pop("within", None)  # saved inside an epoch: where in it the run stopped
    scaled = state.pop("grad_scaler", None)  # --amp fp16: the gradient scaler's state, saved with last.safetensors
    last = LastSave(last_path, None if ckpt is None else ckpt.state)

    def save_last(state: dict[str, Any], g: torch.Generator | None = None) -> None:
        """``last.safetensors``: what a resume continues from (weights, both optimizers, random states; inside an
        epoch, ``g``, the epoch's batch generator, too)."""
        lock.check()  # the folder still this run's
        with applied(average) as kept:  # the model's entry: the average, if any; its training weights beside
            saved = state | ({"grad_scaler": scaler.state_dict()} if scaler.is_enabled() else {})
            save_checkpoint(last_path, Checkpoint(model_name=name, model_config=model_config.to_dict(),
                                                  train_config=cfg.to_dict(), state=saved,
                                                  model_state=model.state_dict(),
                                                  optimizer_state=_merged(opt_g, opt_d, kept),
                                                  rng_state=rng_state(dev) | ({} if g is None else
                                                                              {"epoch_batches": g.get_state()})))
        last.wrote(state)

    # a finished run evaluates nothing more: the judge that scored its epochs stays in config.json, not loaded (a
    # resume of one whose judge had moved failed; one given --judge recorded a judge its figures were not made by)
    finished = ckpt is not None and within is None and state["epoch"] >= cfg.epochs
    given = None if finished else judge
    if ckpt is not None:  # a resume keeps the run's own judge unless given another (none, if it trained without)
        judge = resumed_judge(run_dir, cfg.dataset, given)
    elif judge is not None:
        judge = judge_for(cfg.dataset, judge)  # refused for a data set without classes
    # refused before anything is written
    judge_model = None if finished else load_run_judge(judge, given=given, run_dir=run_dir, device=dev,
                                                       dataset=cfg.dataset)

    # 2. Data, resident on the device.
    train, held, held_name = load_training(cfg.dataset, train_size=cfg.train_size, val_size=cfg.val_size,
                                           test_size=cfg.test_size, seed=cfg.seed, root=data_root, progress=progress)
    if len(train) == 0:
        raise ValueError("no training pairs left; lower val_size or raise train_size")
    state = folder_noted(state, cfg.dataset)
    if "label_maps" not in state:  # how the training label maps read: capsnet generate reads the user's alike
        # on the bytes as read (a 0/1 folder's are 0/255 by now), before .to() makes them floats in [0, 1]
        binary = not cfg.dataset.startswith(PAIRS_PREFIX) or bool(((train.images == 0) | (train.images == 255)).all())
        state = {**state, "label_maps": "binary" if binary else "graded"}
    train, held = train.to(dev), held.to(dev)
    make_batch = task(cfg.dataset).batch

    # 3. Model and optimizers, the same initial weights for the same seed.
    if ckpt is not None:  # its tensors against its configuration before gigabytes a damaged one may ask for
        check_fits_before_building(lambda: spec.build(model_config), ckpt)
    torch.manual_seed(cfg.seed)
    model = spec.build(model_config).to(dev)
    opt_g, opt_d = make_optimizers(model, cfg)
    scaler = grad_scaler(dev, cfg.amp)  # fp16: both losses scaled for backward (disabled: plain steps)
    average = None
    if ckpt is not None:
        load_weights(model, ckpt)  # with an average: the average (the training weights follow)
        with resume_state_of(ckpt):
            _split_into(ckpt.optimizer_state, opt_g, opt_d)
            check_optimizer_state(opt_g)
            check_optimizer_state(opt_d)
            restore_rng_state(ckpt.rng_state, dev)
            if scaled is not None and scaler.is_enabled():  # the scale the run had reached, continued
                scaler.load_state_dict(scaled)
    if cfg.ema_decay:
        average = WeightAverage(model.generator, cfg.ema_decay)  # from the start, or the saved average
        if ckpt is not None:
            restore_training_weights(ckpt, average)
    N, B = len(train), cfg.batch_size
    total_steps = run_steps(cfg, N)  # a schedule that cannot run refused before any file is written
    # made once the run is known to start (a refused resume changes nothing); one process writes a run at a time
    _train.lock_new_run(lock, run_dir, model_config, cfg, resume)
    atomic_write_text(run_dir / "config.json", json.dumps({"model": name, "model_config": model_config.to_dict(),
                                                           "train_config": cfg.to_dict(),
                                                           "judge": None if judge is None else str(judge)}, indent=2))

    # 4. Epochs.
    step = state["step"]
    for said in budget_warnings(cfg, N, len(held) if held_name == "test" else 0) if step == 0 else ():
        warnings.warn(said, UserWarning, stacklevel=2)
    amp = autocast(dev, cfg.amp)
    fp16 = scaler.is_enabled()
    generator = compile_model(model.generator, compile)  # the generator itself unless compiled; same weights
    stop.arm()  # from here Ctrl-C or SIGTERM saves where training is, then stops
    for epoch in range(state["epoch"] + 1, cfg.epochs + 1):
        model.train()
        g = _seeded_generator(cfg.seed, epoch, dev)  # batch order, label maps and noise: replayed by a resume
        order = torch.randperm(N, generator=g, device=dev)
        starts = range(0, N, B)
        done, sums, seen, before = resume_within(within, epoch, ckpt, g, len(starts), 8 + fp16)  # 0s mostly
        bar = progress_bar(total=len(starts), initial=done, desc=f"epoch {epoch}/{cfg.epochs}", unit="batch",
                           progress=progress)
        # D, G loss, L1, D(real), D(fake), 2 sds, edge; fp16: the steps skipped
        wide = sum_dtype(dev)  # float64 (float32 on MPS)
        sums = torch.tensor(sums, dtype=wide, device=dev)
        bad = torch.full((), -1, dtype=torch.long, device=dev)  # the first step whose loss was not finite
        shown = time.monotonic()
        started = shown - before
        for start in starts[done:]:  # the bar is advanced by hand: left open after the loop, it shows the figures
            idx = order[start:start + B]
            labels, _, real = make_batch(train, idx, g, None)  # (B, C, H, W) label maps, (B, C', H, W) images
            z = torch.randn(len(idx), getattr(model_config, "noise_dim", 0), generator=g, device=dev)  # (B, noise_dim)
            for opt in (opt_g, opt_d):
                for group in opt.param_groups:
                    group["lr"] = lr_at(step, cfg, total_steps)
            scale_before = scale_tensor(scaler, dev).clone() if fp16 else None  # it falls exactly at a skipped step
            d_loss, g_loss, d_parts, g_parts = gan_step(model, opt_g, opt_d, labels, real, z, amp, generator,
                                                        scaler)
            if average is not None:
                average.update(step)
            step += 1
            n = len(idx)
            sums[:8] += torch.stack([t.detach().to(wide) for t in (
                d_loss, g_loss, g_parts["l1"], d_parts["d_real"], d_parts["d_fake"], g_parts["fake_std"],
                g_parts["real_std"], g_parts["fake_edge"])]) * n
            if fp16:
                sums[8] += (scale_tensor(scaler, dev) < scale_before).to(wide)  # a count, not times n
            finite = torch.isfinite(d_loss.detach()) & torch.isfinite(g_loss.detach())
            bad = torch.where(finite | (bad >= 0), bad, step)  # no sync: read every _CHECK_EVERY steps
            seen += n
            if progress and time.monotonic() - shown > 0.5:
                d, gl, l1 = (sums[:3] / seen).tolist()
                bar.set_postfix(d=f"{d:.3f}", g=f"{gl:.3f}", l1=f"{l1:.4f}", refresh=False)
                shown = time.monotonic()
            bar.update()
            so_far = _train._skipped_of(sums[8] if fp16 else sums, start // B + 1, fp16)  # read when asked
            if step % _train._CHECK_EVERY == 0:  # a NaN step (it trained on to the epoch's end, or the next save,
                # 5 minutes on) and, under fp16, the scale before it can reach 0 and a NaN step be taken
                _stop_if_bad(bad, epoch, last, model, scaler, so_far, (opt_g, opt_d))
            stopping = stop.asked and start + B < N  # an epoch's last batch goes on to the epoch's end
            if stopping or (save_every_s and start + B < N and last.older_than(save_every_s)):
                _stop_if_bad(bad, epoch, last, model, scaler, so_far, (opt_g, opt_d))  # nothing non-finite saved
                save_last(within_epoch({**state, "step": step}, epoch, start // B + 1, sums.tolist(), seen,
                                       time.monotonic() - started, dev), g)
                if stopping:
                    bar.close()
                    raise KeyboardInterrupt
        trained_s = time.monotonic() - started  # a resumed epoch: its two parts' seconds
        d, gl, l1, d_real, d_fake, fake_std, real_std, fake_edge = (sums[:8] / seen).tolist()
        bar.set_postfix(d=f"{d:.3f}", g=f"{gl:.3f}", l1=f"{l1:.4f}", refresh=False)
        bar.close()  # its last state, with the epoch's figures
        _stop_if_bad(bad, epoch, last, model, scaler,
                     _train._skipped_of(sums[8] if fp16 else sums, len(starts), fp16), (opt_g, opt_d))
        record = {"epoch": epoch, "step": step, "lr": lr_at(step, cfg, total_steps),
                  "train_d_loss": d, "train_g_loss": gl,
                  "train_l1": l1, "train_d_real": d_real, "train_d_fake": d_fake,
                  "train_fake_std": fake_std, "train_real_std": real_std, "train_fake_edge": fake_edge,
                  "train_images_per_s": seen / max(trained_s, 1e-9)}
        if fp16:  # the steps the scaler skipped (a gradient not finite) and the scale it ended the epoch at
            record |= {"skipped_steps": int(sums[8].item()), "loss_scale": scaler.get_scale()}
        # (a resumed epoch with no batch left, its evaluation pending, said it before it was saved)
        if done < len(starts) and fake_std < COLLAPSE_RATIO * real_std and fake_edge < COLLAPSE_EDGE:
            message = (f"epoch {epoch}: the generator's images are nearly flat (pixel standard deviation "
                       f"{fake_std:.4f} per image against the real images' {real_std:.4f}, L1 {l1:.4f}) and "
                       f"saturated (pixels {fake_edge:.4f} from 0 or 1 on average): it has collapsed to one level, "
                       f"which the L1 term rarely undoes once the output saturates; restart "
                       f"with another --seed or a lower --lr, or undo the change to the model's start that made its "
                       f"last layer the same at every position")
            warnings.warn(message, RuntimeWarning, stacklevel=3)  # the caller of fit_gan
        if epoch % cfg.eval_every and epoch != cfg.epochs:  # not evaluated, but resumable from here
            log.info("epoch %d: %s", epoch, record)
            state = {**state, "epoch": epoch, "step": step, "history": state["history"] + [record]}
            if last.older_than(_train.SAVE_AFTER_S) or stop.asked:
                save_last(state)
            if stop.asked:  # asked in the epoch's last batch (an epoch of one batch has no other)
                raise KeyboardInterrupt
            continue
        # a stop asked by now, or a save due, keeps the epoch's steps before it is evaluated (as capsnet.train.fit)
        # (every batch of the epoch trained, its evaluation not yet: a resume evaluates it)
        pending = stop.asked or bool(save_every_s and last.older_than(save_every_s))
        results = _train.evaluate_or_keep(
            stop, average, pending,
            lambda: save_last(within_epoch({**state, "step": step}, epoch, len(starts), sums.tolist(), seen, trained_s,
                                           dev, pending=True), g),
            lambda: evaluate_synthesis(model, held, judge=judge_model, shape=task(cfg.dataset).shape,
                                       batch_size=min(cfg.eval_batch_size, EVAL_BATCH_SIZE), progress=progress))
        for extra, r in results.items():
            record |= {f"{_train.held_key(extra, held_name)}_{k}": v for k, v in r.as_dict().items()}
        _train.stop_if_held_out_not_finite(record, epoch, last)  # before anything of this epoch is written
        log.info("epoch %d: %s", epoch, record)
        if progress:
            write_line(describe_gan_epoch(record))
        state = {"epoch": epoch, "step": step, "history": state["history"] + [record], "best": state["best"],
                 "eval_split": held_name} | {k: state[k] for k in ("data", "label_maps") if k in state}
        score = results[""].ssim
        improved = state["best"] is None or score > state["best"]["accuracy"]
        if improved:  # "accuracy" is the held-out SSIM: what chooses best.safetensors
            state["best"] = {"epoch": epoch, "accuracy": score, "split": held_name}

        # 5. Checkpoints, then the metrics log rewritten from the checkpoint's history.
        lock.check()  # the folder still this run's
        if improved:
            with applied(average):
                save_best(best_path, name, model_config, cfg, state, model)
        save_last(state)
        write_metrics(run_dir, state["history"])
        if on_epoch is not None:  # each evaluated epoch's record (the CLI's --no-progress prints it), after the saves:
            on_epoch(record)  # a callback that stops the run keeps the epoch it was shown
        if stop.asked and epoch < cfg.epochs:  # asked after the evaluation, as the epoch was saved: stopped here
            raise KeyboardInterrupt
    if ckpt is not None and state["epoch"] >= cfg.epochs:
        lock.check()  # the folder still this run's
        write_metrics(run_dir, state["history"])
    return state["history"][-1] if state["history"] else {}
