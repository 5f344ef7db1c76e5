"""Training and evaluation: one ``fit()`` that reads top to bottom.

The whole data set lives on the device as one tensor; batches are taken by
index and augmented as batched tensor operations. Each epoch's shuffle and
shifts come from a generator seeded by (seed, epoch), so a run resumed from an
epoch's checkpoint replays exactly what an uninterrupted run would have done.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm  # plain text bars: tqdm.auto warns in notebooks without ipywidgets

from ._config import config_from_dict
from .checkpoint import Checkpoint, CheckpointError, atomic_write_text, load_checkpoint, save_checkpoint
from .data import DATASETS, Dataset, load_dataset, random_shift, split_validation
from .data.affine import random_translate
from .data.multimnist import make_pairs, top2_correct
from .data.tasks import (MULTIMNIST_SHIFT, TASKS, TRANSLATED_SIZE, affine_test, input_shape, multimnist_test,
                         nested_subset, translated_test)
from .losses import margin_loss, reconstruction_loss
from .models import MODELS, BaselineCNN, BaselineCNNConfig, CapsNet, CapsNetConfig, model_name

__all__ = ["TrainConfig", "fit", "evaluate", "evaluate_pairs", "evaluate_split", "lr_at", "resolve_device",
           "load_model", "prepare_data", "make_optimizer", "compile_model", "EvalResult", "PairEvalResult",
           "TRAIN_DATASETS", "AMP_MODES"]

TRAIN_DATASETS = DATASETS + TASKS  # plain image sets, then the paper's experiment sets built from MNIST
AMP_MODES = ("none", "bf16")  # bf16: forward and losses under torch.autocast to bfloat16; weights and Adam stay fp32

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainConfig:
    dataset: str = "mnist"
    epochs: int = 10
    batch_size: int = 128
    lr: float = 1e-3  # authors' code: Adam, 1e-3
    lr_decay: float = 0.96  # authors' code: x0.96 ...
    lr_decay_steps: int = 2000  # ... every 2,000 steps (smooth exponential decay)
    recon_weight: float = 0.0005  # section 4.1: sum of squared errors scaled by 0.0005
    shift: int = 2  # section 5: random shifts of up to 2 pixels (plain data sets; the tasks place digits themselves)
    val_size: int = 0  # examples held out of training to choose the best checkpoint
    train_size: int = 0  # 0: all; else a seeded subset of this many (nested across sizes for one seed)
    test_size: int = 0  # 0: all; else the first this many test examples (multimnist: this many test pairs)
    eval_batch_size: int = 256
    eval_every: int = 1  # evaluate (and checkpoint) every this many epochs, and after the last
    seed: int = 0
    amp: str = "none"  # "bf16": training steps under bfloat16 autocast (for GPUs; evaluation stays fp32)

    def __post_init__(self) -> None:
        if self.dataset not in TRAIN_DATASETS:
            raise ValueError(f"unknown dataset {self.dataset!r}; valid names are {', '.join(TRAIN_DATASETS)}")
        for name in ("epochs", "batch_size", "lr_decay_steps", "eval_batch_size", "eval_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("val_size", "train_size", "test_size", "shift", "seed"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be a positive number, got {self.lr}")
        if not 0 < self.lr_decay <= 1:
            raise ValueError(f"lr_decay must lie in (0, 1], got {self.lr_decay}")
        if self.recon_weight < 0:
            raise ValueError(f"recon_weight must be >= 0, got {self.recon_weight}")
        if self.amp not in AMP_MODES:
            raise ValueError(f"unknown amp {self.amp!r}; valid values are {', '.join(AMP_MODES)}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainConfig":
        return config_from_dict(cls, d)


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate after ``step`` optimizer steps: lr * decay^(step / decay_steps)."""
    return cfg.lr * cfg.lr_decay ** (step / cfg.lr_decay_steps)


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for, but this PyTorch sees no CUDA device; use --device cpu or auto")
    return dev


@dataclass
class _Split:
    images: torch.Tensor  # (N, C, H, W) float in [0, 1], on the device
    labels: torch.Tensor  # (N,) int64, or (N, 2) for MultiMNIST pairs, on the device
    components: torch.Tensor | None = None  # (N, 2, C, H, W): each digit of a MultiMNIST pair alone
    extra: dict[str, "_Split"] = dataclasses.field(default_factory=dict)  # more sets scored alike (affine)


def _source(dataset: str) -> str:
    """The image set a data set is built from."""
    return "mnist" if dataset in TASKS else dataset


def prepare_data(cfg: TrainConfig, device: torch.device, *, data_root: str | os.PathLike | None = None,
                 progress: bool = True) -> tuple[_Split, _Split, str]:
    """Training digits and the split to evaluate on (validation if any, else test).

    For the experiment tasks the training split holds the 28x28 source digits
    (placed on their canvas batch by batch in ``fit``) and the evaluation split
    holds the generated images: MultiMNIST pairs, or translated digits with the
    affine set in ``extra["affine"]``.
    """
    train = load_dataset(_source(cfg.dataset), "train", root=data_root, progress=progress)
    if cfg.train_size:
        if cfg.train_size > len(train):
            raise ValueError(f"train_size {cfg.train_size} exceeds the {len(train)} training examples of {cfg.dataset}")
        train = train.subset(nested_subset(len(train), cfg.train_size, cfg.seed))
    if cfg.val_size:
        train, held = split_validation(train, cfg.val_size, seed=cfg.seed)
        name = "val"
    else:
        held = load_dataset(_source(cfg.dataset), "test", root=data_root, progress=progress)
        if cfg.test_size and cfg.dataset != "multimnist":
            held = held.subset(torch.arange(min(cfg.test_size, len(held))))
        name = "test"
    return _to_device(train, device), held_split(cfg, held, device), name


def held_split(cfg: TrainConfig, digits: Dataset, device: torch.device) -> _Split:
    """The evaluation split made from ``digits`` as ``cfg.dataset`` prescribes (fixed seeds)."""
    if cfg.dataset == "multimnist":
        pairs = multimnist_test(digits.images, digits.labels, cfg.test_size or len(digits))
        return _Split(pairs.images.to(device), pairs.labels.to(device), pairs.components.to(device))
    if cfg.dataset == "translated-mnist":
        affine = _Split(affine_test(digits.images).to(device), digits.labels.to(device).long())
        return _Split(translated_test(digits.images).to(device), digits.labels.to(device).long(),
                      extra={"affine": affine})
    return _to_device(digits, device)


def _to_device(ds: Dataset, device: torch.device) -> _Split:
    images = ds.images.to(device).float()
    return _Split(images if ds.images.is_floating_point() else images.div_(255.0), ds.labels.to(device).long())


def _train_batch(cfg: TrainConfig, train: _Split, idx: torch.Tensor, g: torch.Generator
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Images, labels and (MultiMNIST) components of one training batch, drawn from the epoch's generator."""
    if cfg.dataset == "multimnist":  # section 6: fresh pairs every batch, never stored
        pairs = make_pairs(train.images, train.labels, len(idx), generator=g, max_shift=MULTIMNIST_SHIFT)
        return pairs.images, pairs.labels, pairs.components
    if cfg.dataset == "translated-mnist":  # section 5.2: a random position on the 40x40 canvas
        return random_translate(train.images[idx], TRANSLATED_SIZE, generator=g)[0], train.labels[idx], None
    return random_shift(train.images[idx], cfg.shift, generator=g), train.labels[idx], None  # (B, C, H, W)


def _multi_hot(labels: torch.Tensor, K: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(len(labels), K, dtype=dtype, device=labels.device).scatter_(1, labels, 1.0)  # (B, K)


def _loss(model: CapsNet | BaselineCNN, images: torch.Tensor, labels: torch.Tensor, recon_weight: float,
          components: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The training loss and per-class scores (capsule lengths, or softmax probabilities for the CNN).

    ``labels`` (B,) are class indices; (B, 2) are MultiMNIST pairs: the margin
    loss takes them multi-hot, and each digit is reconstructed from its own
    capsule against its own ``components`` image (section 6), the two squared
    errors summed. The CNN's cross-entropy then targets probability 1/2 on each.
    """
    K = model.config.num_classes
    pairs = labels.dim() == 2
    if isinstance(getattr(model, "_orig_mod", model), BaselineCNN):  # a compiled model wraps the module
        logits = model(images)
        target = _multi_hot(labels, K, logits.dtype) / labels.shape[1] if pairs else labels
        return torch.nn.functional.cross_entropy(logits, target), logits.softmax(dim=1)
    out = model(images, labels)
    # labels were checked when the data set loaded: no range check, which would wait for the GPU every step
    loss = margin_loss(out.lengths, _multi_hot(labels, K, out.lengths.dtype) if pairs else labels, validate=False)
    if out.reconstructions is not None and recon_weight > 0:
        target = images if not pairs else components
        if target is not None:
            loss = loss + reconstruction_loss(out.reconstructions, target, scale=recon_weight)
    return loss, out.lengths


def _correct(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """(B,) bool: argmax right, or for pairs the paper's top-2 rule (both longest capsules are the labels)."""
    return top2_correct(scores, labels) if labels.dim() == 2 else scores.argmax(1) == labels


@dataclass
class EvalResult:
    loss: float
    accuracy: float
    error: float
    confusion: torch.Tensor  # (K, K) int64, rows: true class, columns: predicted

    @property
    def per_class_accuracy(self) -> list[float]:
        totals = self.confusion.sum(dim=1).clamp(min=1)
        return (self.confusion.diag().double() / totals).tolist()


def evaluate(model: CapsNet | BaselineCNN, images: torch.Tensor, labels: torch.Tensor, *, batch_size: int = 256,
             recon_weight: float = 0.0005, progress: bool = False) -> EvalResult:
    """Loss, accuracy and confusion matrix of ``model`` on a split (no augmentation).

    The reconstruction term is computed from the true label's capsule, as in
    training; the CNN baseline's loss is its cross-entropy.
    """
    was_training = model.training
    model.eval()
    K = model.config.num_classes
    n = len(labels)
    # Sums stay on the device until the end: no host sync per batch.
    confusion = torch.zeros(K * K, dtype=torch.int64, device=images.device)
    total_loss = torch.zeros((), dtype=torch.float64, device=images.device)
    with torch.inference_mode():
        for start in tqdm(range(0, n, batch_size), desc="eval", leave=False, disable=not progress, unit="batch"):
            x, y = images[start:start + batch_size], labels[start:start + batch_size]
            loss, lengths = _loss(model, x, y, recon_weight)
            total_loss += loss.double() * len(y)
            cell = y * K + lengths.argmax(dim=1)
            confusion.index_add_(0, cell, torch.ones_like(cell))  # bincount would sync to size its output
    model.train(was_training)
    confusion = confusion.view(K, K).cpu()
    acc = confusion.diag().sum().item() / max(n, 1)
    return EvalResult(total_loss.item() / max(n, 1), acc, 1.0 - acc, confusion)


@dataclass
class PairEvalResult:
    loss: float
    accuracy: float  # fraction of pairs whose two longest capsules are exactly their two labels
    error: float  # the paper's MultiMNIST error, 1 - accuracy


def evaluate_pairs(model: CapsNet | BaselineCNN, images: torch.Tensor, labels: torch.Tensor,
                   components: torch.Tensor | None = None, *, batch_size: int = 256, recon_weight: float = 0.0005,
                   progress: bool = False) -> PairEvalResult:
    """MultiMNIST loss and top-2 exact-match accuracy (section 6) of ``model`` on pairs.

    Shapes: images (N, C, 36, 36), labels (N, 2), components (N, 2, C, 36, 36) or None (no reconstruction term).
    """
    was_training = model.training
    model.eval()
    n = len(labels)
    total_loss = torch.zeros((), dtype=torch.float64, device=images.device)
    right = torch.zeros((), dtype=torch.int64, device=images.device)
    with torch.inference_mode():
        for start in tqdm(range(0, n, batch_size), desc="eval", leave=False, disable=not progress, unit="batch"):
            sl = slice(start, start + batch_size)
            comp = components[sl] if components is not None else None
            loss, scores = _loss(model, images[sl], labels[sl], recon_weight if comp is not None else 0.0, comp)
            total_loss += loss.double() * len(labels[sl])
            right += top2_correct(scores, labels[sl]).sum()
    model.train(was_training)
    acc = right.item() / max(n, 1)
    return PairEvalResult(total_loss.item() / max(n, 1), acc, 1.0 - acc)


def evaluate_split(model: CapsNet | BaselineCNN, split: _Split, *, batch_size: int = 256, recon_weight: float = 0.0005,
                   progress: bool = False) -> dict[str, EvalResult | PairEvalResult]:
    """Score a split and its extra sets: {"": result, "affine": result, ...}."""
    def one(sp: _Split) -> EvalResult | PairEvalResult:
        if sp.labels.dim() == 2:
            return evaluate_pairs(model, sp.images, sp.labels, sp.components, batch_size=batch_size,
                                  recon_weight=recon_weight, progress=progress)
        return evaluate(model, sp.images, sp.labels, batch_size=batch_size, recon_weight=recon_weight, progress=progress)
    return {"": one(split)} | {name: one(sp) for name, sp in split.extra.items()}


def load_model(path: str | os.PathLike, *, which: str = "best", device: str | torch.device = "cpu"
               ) -> tuple[CapsNet | BaselineCNN, Checkpoint]:
    """Rebuild the model saved in a checkpoint (file or run directory)."""
    ckpt = load_checkpoint(path, which)
    if ckpt.model_name not in MODELS:
        raise CheckpointError(f"{ckpt.path} holds a {ckpt.model_name!r} model; this capsnet knows {sorted(MODELS)}")
    config_cls, model_cls = MODELS[ckpt.model_name]
    try:
        model = model_cls(config_cls.from_dict(ckpt.model_config))
        model.load_state_dict(ckpt.model_state)
    except (ValueError, TypeError, RuntimeError) as e:
        raise CheckpointError(f"checkpoint {ckpt.path} does not fit its own configuration ({e}); it is damaged") from e
    return model.to(resolve_device(device)), ckpt


def _seeded_generator(seed: int, epoch: int, device: torch.device) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(seed * 1_000_003 + epoch)
    return g


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.Adam:
    """Adam at ``cfg.lr``; fused into one kernel per step on CUDA, PyTorch's default elsewhere."""
    return torch.optim.Adam(model.parameters(), lr=cfg.lr, fused=True if device.type == "cuda" else None)


_DEVICE_FLAGS = ("fused", "foreach", "capturable")


def _load_optimizer_state(opt: torch.optim.Adam, saved: dict[str, Any]) -> None:
    """Load Adam's state, keeping this device's implementation (fused on CUDA, not elsewhere).

    The flags are swapped into the saved groups before loading, because
    ``load_state_dict`` places each ``step`` by the saved groups' flags: a run
    saved unfused (on CPU) and resumed fused on CUDA would otherwise keep its
    steps on the CPU, where the fused kernel refuses them.
    """
    groups = [{**g, **{k: cur[k] for k in _DEVICE_FLAGS if k in cur}}
              for g, cur in zip(saved["param_groups"], opt.param_groups)]
    opt.load_state_dict({**saved, "param_groups": groups})


def compile_model(model: torch.nn.Module, compile: bool | str) -> torch.nn.Module:
    """``torch.compile(model)`` for the training step, or the model itself when ``compile`` is False.

    ``compile`` is True (TorchInductor, default mode), an Inductor mode
    ("reduce-overhead": CUDA graphs; "max-autotune") or a backend name
    ("aot_eager", ...). Only the model is compiled: the optimizer step, whose
    learning rate changes every step, stays eager, so the graph never changes
    with it. The returned module shares the model's parameters; checkpoints
    are taken from the model itself.
    """
    if compile is False or compile is None:
        return model
    if compile is True or compile == "default":
        return torch.compile(model)
    if compile in ("reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"):
        return torch.compile(model, mode=compile)
    return torch.compile(model, backend=compile)


def fit(model_config: CapsNetConfig | BaselineCNNConfig, cfg: TrainConfig, run_dir: str | os.PathLike, *,
        device: str | torch.device = "auto", data_root: str | os.PathLike | None = None,
        resume: bool = False, progress: bool = True, compile: bool | str = False) -> dict[str, Any]:
    """Train a CapsNet (or, given its config, the CNN baseline), checkpointing into ``run_dir`` every epoch
    (every ``cfg.eval_every`` epochs, and after the last, when that is more than 1).

    ``run_dir`` receives ``last.safetensors`` (resumable: weights, optimizer,
    step), ``best.safetensors`` (best accuracy on the validation split, or on
    the test split when there is none), ``config.json`` and ``metrics.jsonl``
    (one line per epoch). With ``resume=True`` training continues from
    ``last.safetensors`` with the run's saved configuration; only ``cfg.epochs``
    may differ from it. Returns the final epoch's metrics.

    Speed: ``cfg.amp == "bf16"`` runs the training steps under bfloat16
    autocast (evaluation stays fp32); ``compile`` compiles the model for the
    training steps (see ``compile_model``; not part of the saved configuration,
    so a run may resume with or without it, though then not bit for bit). On
    CUDA, Adam is fused. The running loss and accuracy stay on the device and
    reach the progress bar about twice a second; on MNIST and Fashion-MNIST no
    training step waits on the host (the MultiMNIST and translated-MNIST
    generators check their draws, which does).
    """
    run_dir = Path(run_dir)
    name = model_name(model_config)
    shape = (model_config.in_channels, model_config.input_height, model_config.input_width)
    if shape != input_shape(cfg.dataset):
        raise ValueError(f"{cfg.dataset} images are {input_shape(cfg.dataset)} but the model takes {shape}; build it "
                         f"with input_height and input_width {input_shape(cfg.dataset)[1]} (the CLI does so itself)")
    config_cls, model_cls = MODELS[name]
    dev = resolve_device(device)
    last_path, best_path = run_dir / "last.safetensors", run_dir / "best.safetensors"

    # 1. Start or resume.
    state: dict[str, Any] = {"epoch": 0, "step": 0, "history": [], "best": None}
    ckpt = None
    if resume:
        if not last_path.exists():
            raise CheckpointError(f"nothing to resume in {run_dir}: no last.safetensors; start a run without --resume")
        ckpt = load_checkpoint(last_path)
        if ckpt.model_name != name:
            raise CheckpointError(f"{last_path} holds a {ckpt.model_name!r} model, not {name!r}; resume with "
                                  f"--model {ckpt.model_name} or use a new --out")
        saved_model = config_cls.from_dict(ckpt.model_config)
        saved_train = TrainConfig.from_dict(ckpt.train_config)
        if saved_model != model_config or dataclasses.replace(saved_train, epochs=cfg.epochs) != cfg:
            diff = _differences(saved_model.to_dict() | saved_train.to_dict(), model_config.to_dict() | cfg.to_dict())
            raise CheckpointError(f"{last_path} was trained with another configuration ({diff}); "
                                  f"resume with the same settings (only --epochs may change) or use a new --out")
        state = ckpt.state
        for stale in run_dir.glob(".*.tmp-*"):  # a write cut short by a crash
            stale.unlink(missing_ok=True)
    elif last_path.exists():
        raise CheckpointError(f"{run_dir} already holds a run (last.safetensors); pass --resume to continue it "
                              f"or choose another output directory")
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run_dir / "config.json",
                      json.dumps({"model": name, "model_config": model_config.to_dict(), "train_config": cfg.to_dict()}, indent=2))

    # 2. Data, resident on the device.
    train, held, held_name = prepare_data(cfg, dev, data_root=data_root, progress=progress)
    if len(train.labels) == 0:
        raise ValueError("no training examples left; lower val_size or raise train_size")

    # 3. Model and optimizer, same initial weights for the same seed.
    torch.manual_seed(cfg.seed)
    model = model_cls(model_config).to(dev)
    opt = make_optimizer(model, cfg, dev)
    if ckpt is not None:
        model.load_state_dict(ckpt.model_state)
        _load_optimizer_state(opt, ckpt.optimizer_state)
        if "torch" in ckpt.rng_state:
            torch.set_rng_state(ckpt.rng_state["torch"])

    # 4. Epochs.
    N, B = len(train.labels), cfg.batch_size
    step = state["step"]
    train_model = compile_model(model, compile)
    autocast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cfg.amp == "bf16")
    for epoch in range(state["epoch"] + 1, cfg.epochs + 1):
        model.train()
        g = _seeded_generator(cfg.seed, epoch, dev)
        order = torch.randperm(N, generator=g, device=dev)
        bar = tqdm(range(0, N, B), desc=f"epoch {epoch}/{cfg.epochs}", unit="batch", disable=not progress, leave=True)
        run_loss = torch.zeros((), dtype=torch.float64, device=dev)  # sums on the device: no sync per step
        run_correct = torch.zeros((), dtype=torch.int64, device=dev)
        seen, shown = 0, time.monotonic()
        for start in bar:
            idx = order[start:start + B]
            x, y, comp = _train_batch(cfg, train, idx, g)  # (B, C, H, W), (B,) or (B, 2), None or (B, 2, C, H, W)
            for group in opt.param_groups:
                group["lr"] = lr_at(step, cfg)
            with autocast:
                loss, lengths = _loss(train_model, x, y, cfg.recon_weight, comp)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            run_loss += loss.detach().double() * len(y)
            run_correct += _correct(lengths.detach(), y).sum()
            seen += len(y)
            if progress and time.monotonic() - shown > 0.5:
                bar.set_postfix(loss=f"{run_loss.item() / seen:.4f}", acc=f"{run_correct.item() / seen:.4f}")
                shown = time.monotonic()
        train_loss, train_accuracy = run_loss.item() / seen, run_correct.item() / seen
        bar.set_postfix(loss=f"{train_loss:.4f}", acc=f"{train_accuracy:.4f}")
        bar.close()

        record = {"epoch": epoch, "step": step, "lr": lr_at(step, cfg),
                  "train_loss": train_loss, "train_accuracy": train_accuracy}
        if epoch % cfg.eval_every and epoch != cfg.epochs:  # a small training set runs many short epochs
            state = {**state, "epoch": epoch, "step": step, "history": state["history"] + [record]}
            continue
        results = evaluate_split(model, held, batch_size=cfg.eval_batch_size, recon_weight=cfg.recon_weight,
                                 progress=progress)
        result = results[""]
        for extra, r in results.items():  # test_*, then e.g. affine_* (translated MNIST's second test set)
            prefix = extra or held_name
            record |= {f"{prefix}_loss": r.loss, f"{prefix}_accuracy": r.accuracy, f"{prefix}_error": r.error}
        log.info("epoch %d: %s", epoch, record)
        state = {"epoch": epoch, "step": step, "history": state["history"] + [record], "best": state["best"],
                 "eval_split": held_name}
        improved = state["best"] is None or result.accuracy > state["best"]["accuracy"]
        if improved:
            state["best"] = {"epoch": epoch, "accuracy": result.accuracy, "split": held_name}

        # 5. Checkpoints, then the metrics log rewritten from the checkpoint's
        # history, so the two always agree whatever moment a crash strikes.
        base = dict(model_name=name, model_config=model_config.to_dict(), train_config=cfg.to_dict(),
                    state=state, model_state=model.state_dict())
        if improved:
            save_checkpoint(best_path, Checkpoint(**base))
        save_checkpoint(last_path, Checkpoint(**base, optimizer_state=opt.state_dict(),
                                              rng_state={"torch": torch.get_rng_state()}))
        atomic_write_text(run_dir / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in state["history"]))
    if ckpt is not None and state["epoch"] >= cfg.epochs:
        atomic_write_text(run_dir / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in state["history"]))
    return state["history"][-1] if state["history"] else {}


def _differences(a: dict[str, Any], b: dict[str, Any]) -> str:
    keys = sorted(k for k in set(a) | set(b) if k != "epochs" and a.get(k) != b.get(k))
    return ", ".join(f"{k}: saved {a.get(k)!r}, now {b.get(k)!r}" for k in keys) or "unknown difference"
