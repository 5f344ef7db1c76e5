"""The ``capsnet`` command: parse, call the library, print. Nothing imports this."""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import shlex
import sys
from pathlib import Path
from typing import Sequence

__all__ = ["main", "build_parser"]

DATASET_NAMES = ("mnist", "fashion-mnist", "mnist-sample")  # capsnet.data.DATASETS, without importing torch
TASK_NAMES = ("multimnist", "translated-mnist")  # capsnet.data.tasks.TASKS: the paper's sets built from MNIST
EXPERIMENT_NAMES = ("multimnist", "affine", "less-data")  # capsnet.experiments.EXPERIMENTS
AMP_MODES = ("none", "bf16")  # capsnet.train.AMP_MODES


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each default, except None: the help text itself says what an absent value means."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default is None:
            return action.help or ""
        return super()._get_help_string(action)


def _number(kind: type, *, minimum: float, strict: bool = False):
    """An argparse type: a finite ``kind`` that is >= minimum (or > it when strict)."""
    what = "an integer" if kind is int else "a number"
    bound = f"{'>' if strict else '>='} {minimum:g}"

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what} {bound}, got {text!r}") from None
        if not (value > minimum if strict else value >= minimum) or value == float("inf"):
            raise argparse.ArgumentTypeError(f"must be {'an integer' if kind is int else 'a finite number'} {bound}, got {text}")
        return value
    return parse


_positive_int = _number(int, minimum=1)
_nonneg_int = _number(int, minimum=0)
_positive_float = _number(float, minimum=0, strict=True)
_nonneg_float = _number(float, minimum=0)


# Flags of `train` that map onto the two configs: dest -> (config, field).
_MODEL_FLAGS = {"routing_iterations": "routing_iterations", "conv1_channels": "conv1_channels",
                "primary_types": "primary_types", "no_decoder": "decoder", "no_routing_bias": "routing_bias",
                "leaky_routing": "leaky_routing", "detach_agreement": "detach_agreement"}
_BASELINE_FLAGS = {"dropout": "dropout", "cnn_channels": "channels", "cnn_hidden": "hidden"}


def _flags_of(config) -> dict[str, str]:
    return _BASELINE_FLAGS if type(config).__name__ == "BaselineCNNConfig" else _MODEL_FLAGS


_TRAIN_FLAGS = ("dataset", "epochs", "batch_size", "lr", "lr_decay", "lr_decay_steps", "recon_weight", "shift",
                "val_size", "train_size", "test_size", "eval_every", "seed", "amp")


def build_parser() -> argparse.ArgumentParser:
    fmt = _HelpFormatter
    p = argparse.ArgumentParser(prog="capsnet", formatter_class=fmt,
                                description="Capsule networks (Sabour, Frosst and Hinton, NIPS 2017): train, evaluate, benchmark.")
    p.add_argument("-v", "--verbose", action="store_true", help="log progress details to stderr")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    t = sub.add_parser("train", formatter_class=fmt, help="train a CapsNet, checkpointing every epoch",
                       description="Train the paper's CapsNet. Writes last.safetensors, best.safetensors, "
                                   "config.json and metrics.jsonl into --out.")
    t.add_argument("--model", choices=("capsnet", "baseline"), default="capsnet",
                   help="capsnet: the paper's CapsNet; baseline: the paper's CNN (35.4M weights, cross-entropy)")
    t.add_argument("--dataset", choices=DATASET_NAMES + TASK_NAMES, default="mnist",
                   help="data set (mnist-sample ships with capsnet, offline); multimnist: overlapping digit pairs on "
                        "36x36, made from MNIST on the fly (section 6); translated-mnist: MNIST digits at random "
                        "positions on 40x40, scored on translated and affNIST-like affine test sets (section 5.2)")
    t.add_argument("--data-dir", default=None, help="folder holding mnist/ and fashion-mnist/ (default: $CAPSNET_DATA, else a user cache, downloading when missing)")
    t.add_argument("--epochs", type=_positive_int, default=10, help="epochs to train (with --resume: the new total)")
    t.add_argument("--batch-size", type=_positive_int, default=128, help="examples per optimizer step")
    t.add_argument("--lr", type=_positive_float, default=1e-3, help="Adam learning rate at step 0 (authors' code: 1e-3)")
    t.add_argument("--lr-decay", type=_positive_float, default=0.96, help="learning rate factor per --lr-decay-steps (authors' code: 0.96)")
    t.add_argument("--lr-decay-steps", type=_positive_int, default=2000, help="steps over which the rate decays by --lr-decay")
    t.add_argument("--routing-iterations", type=_positive_int, default=3, help="rounds of routing by agreement (paper: 3)")
    t.add_argument("--recon-weight", type=_nonneg_float, default=0.0005, help="scale of the reconstruction loss (paper: 0.0005; 0 turns it off)")
    t.add_argument("--shift", type=_nonneg_int, default=2, help="random shift augmentation in pixels (paper: 2; 0 turns it off; "
                                                                 "multimnist and translated-mnist place digits themselves)")
    t.add_argument("--val-size", type=_nonneg_int, default=0, help="training examples held out to choose the best checkpoint (0: choose on test)")
    t.add_argument("--train-size", type=_nonneg_int, default=0,
                   help="train on a seeded subset of this many examples (0: all); for one --seed smaller subsets "
                        "are nested in larger ones")
    t.add_argument("--test-size", type=_nonneg_int, default=0,
                   help="evaluate on the first this many test examples (0: all; multimnist: the first this many "
                        "of the 10,000 fixed test pairs)")
    t.add_argument("--eval-every", type=_positive_int, default=1,
                   help="evaluate and checkpoint every this many epochs, and after the last (many short epochs "
                        "of a small --train-size)")
    t.add_argument("--conv1-channels", type=_positive_int, default=256, help="channels of Conv1 (paper: 256; smaller trains faster on CPU)")
    t.add_argument("--primary-types", type=_positive_int, default=32, help="primary capsule types (paper: 32)")
    t.add_argument("--no-decoder", action="store_true", help="train without the reconstruction decoder")
    t.add_argument("--no-routing-bias", action="store_true", help="leave out the learned bias on s_j (the paper's 8,215,568 weights)")
    t.add_argument("--leaky-routing", action="store_true", help="add the authors' zero 'orphan' logit to the routing softmax")
    t.add_argument("--detach-agreement", action="store_true", help="no gradient through the routing rounds before the last")
    _baseline_arguments(t)
    t.add_argument("--seed", type=_nonneg_int, default=0, help="seed of the initial weights, shuffles and shifts")
    t.add_argument("--device", default="auto", help="auto (CUDA when present, else CPU), cpu, cuda or cuda:N")
    t.add_argument("--amp", choices=AMP_MODES, default="none",
                   help="bf16: training steps under bfloat16 autocast, weights and Adam in fp32 (for GPUs; on a CPU "
                        "without bf16 units it is many times slower); evaluation stays fp32")
    _compile_argument(t, "compile the model for the training steps with torch.compile (the optimizer stays eager, so "
                         "the decaying learning rate never recompiles it). MODE: default, reduce-overhead (CUDA graphs), "
                         "max-autotune, or a backend such as aot_eager. Pays off on CUDA; on this CPU it is slower")
    t.add_argument("--allocator", choices=("keep", "default"), default="keep",
                   help="keep: glibc keeps freed memory for reuse, about 20%% faster CPU training "
                        "(capsnet.memory; a no-op off glibc); default: the C library's own behaviour")
    t.add_argument("--out", default=None, help="run directory (default: runs/DATASET)")
    t.add_argument("--resume", action="store_true", help="continue the run in --out from its last complete checkpoint")
    t.add_argument("--no-progress", action="store_true", help="no progress bars")

    e = sub.add_parser("eval", formatter_class=fmt, help="test accuracy, per-class accuracy and confusion matrix",
                       description="Evaluate a checkpoint on its data set's test split; prints a table and writes JSON.")
    e.add_argument("--checkpoint", required=True, help="run directory made by `capsnet train`, or a .safetensors checkpoint file")
    e.add_argument("--which", choices=("best", "last"), default="best", help="which checkpoint of a run directory")
    e.add_argument("--dataset", choices=DATASET_NAMES + TASK_NAMES, default=None, help="test set (default: the one it was trained on)")
    e.add_argument("--data-dir", default=None, help="folder holding mnist/ and fashion-mnist/ (default: $CAPSNET_DATA or the user cache)")
    e.add_argument("--test-size", type=_nonneg_int, default=0,
                   help="evaluate on the first this many test examples (0: all; multimnist: the first this many "
                        "of the 10,000 fixed test pairs)")
    e.add_argument("--affnist", nargs="+", default=None, metavar="MAT_FILE",
                   help="also score a 40x40 (translated-mnist) model on real affNIST .mat files, e.g. test.mat from "
                        "https://www.cs.toronto.edu/~tijmen/affNIST/")
    e.add_argument("--batch-size", type=_positive_int, default=256, help="examples per forward pass")
    e.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    e.add_argument("--json", default=None, help="where to write the results (default: eval-WHICH.json beside the checkpoint)")
    e.add_argument("--no-progress", action="store_true", help="no progress bar")

    b = sub.add_parser("bench", formatter_class=fmt, help="training and inference throughput and peak memory",
                       description="Throughput (images/s) and peak memory of the MNIST CapsNet, with the tutorial-style "
                                   "baseline measured in the same run when its file is found.")
    b.add_argument("--batch-size", type=_positive_int, nargs="+", default=[128], help="images per step; several: one row set each")
    b.add_argument("--routing-iterations", type=_positive_int, nargs="+", default=[3], help="routing rounds; several: one row set each")
    b.add_argument("--dtype", choices=("fp32", "bf16"), nargs="+", default=["fp32"],
                   help="fp32, or bf16 autocast (weights stay fp32); several: one row set each")
    b.add_argument("--repeats", type=_positive_int, default=5, help="timed steps per measurement (median reported)")
    b.add_argument("--device", default="auto", help="auto (CPU, plus CUDA when present), cpu or cuda")
    b.add_argument("--baseline", default="benchmarks/tutorial_baseline.py", help="file of the tutorial-style baseline ('' to skip)")
    _compile_argument(b, "compile capsnet's model as capsnet train --compile does (the baseline and the floor stay eager)")
    b.add_argument("--seed", type=_nonneg_int, default=0, help="seed of the weights and inputs")
    b.add_argument("--json", default=None, help="also write the environment and every row to this JSON file")
    b.add_argument("--allocator", choices=("keep", "default"), default="keep",
                   help="keep: glibc keeps freed memory for reuse, as capsnet train does (capsnet.memory); "
                        "default: the C library's own behaviour. Applies to every implementation in the run")

    f = sub.add_parser("figures", formatter_class=fmt, help="reconstructions, pose sweeps, routing maps, lengths, curves",
                       description="Look inside a trained CapsNet. Writes into --out: reconstructions, misclassified "
                                   "(inputs decoded from the true and the predicted capsule), pose_sweep_INDEX "
                                   "(the paper's Figure 4), routing_INDEX (coupling per round and primary capsule "
                                   "lengths), lengths (digit capsule lengths) and training_curves. For a "
                                   "MultiMNIST run: multimnist (the paper's Figure 5: each pair of overlapping "
                                   "digits above its two reconstructions in red and green) and training_curves.")
    f.add_argument("--checkpoint", required=True, nargs="+", metavar="RUN_DIR",
                   help="run directory or checkpoint file; the model figures use the first, the training curves "
                        "overlay all")
    f.add_argument("--which", choices=("best", "last"), default="best", help="which checkpoint of a run directory")
    f.add_argument("--out", default=None, help="folder for the figures (default: FIRST_RUN_DIR/figures)")
    f.add_argument("--dataset", choices=DATASET_NAMES, default=None, help="test set the inputs come from (default: the run's)")
    f.add_argument("--data-dir", default=None, help="data root (default: $CAPSNET_DATA, else ~/.cache/capsnet)")
    f.add_argument("--indices", type=_nonneg_int, nargs="+", default=None,
                   help="test-set indices of the inputs (default: the first test image of each class; MultiMNIST: "
                        "the first 8 pairs of the fixed test set)")
    f.add_argument("--dims", type=_nonneg_int, nargs="+", default=None, help="pose dimensions to sweep (default: all)")
    f.add_argument("--delta-range", type=_positive_float, default=0.25, help="sweep each dimension from -R to +R")
    f.add_argument("--delta-step", type=_positive_float, default=0.05, help="step of the sweep")
    f.add_argument("--misclassified", type=_nonneg_int, default=8,
                   help="misclassified test inputs to show, found by classifying the whole test set (0: skip)")
    f.add_argument("--format", choices=("png", "svg", "pdf"), default="png", help="file format of the figures")
    f.add_argument("--dpi", type=_positive_int, default=100, help="resolution of PNG figures")
    f.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    f.add_argument("--no-progress", action="store_true", help="no progress bar")

    x = sub.add_parser("experiment", formatter_class=fmt, help="rerun one of the paper's experiments for both models",
                       description="Train CapsNet and the CNN baseline through the same loop, data and budget, and "
                                   "tabulate their final-epoch test figures. multimnist: top-2 exact error on 36x36 "
                                   "overlapping pairs (section 6); affine: train on translated MNIST (40x40), accuracy "
                                   "on translated and affNIST-like affine test digits (section 5.2); less-data: MNIST "
                                   "test error from nested training subsets, every run with the same --steps. Each "
                                   "run is a `capsnet train` run directory under --out (finished runs are read back, "
                                   "interrupted ones resume); results.md, results.json (and less_data.png) go there too.")
    x.add_argument("name", choices=EXPERIMENT_NAMES, help="which experiment")
    x.add_argument("--out", default=None, help="folder for the runs and the results (default: runs/experiment-NAME)")
    x.add_argument("--models", nargs="+", choices=("capsnet", "baseline"), default=["capsnet", "baseline"],
                   help="models to train")
    x.add_argument("--epochs", type=_positive_int, default=10, help="epochs per run (less-data: unless --steps is given)")
    x.add_argument("--steps", type=_nonneg_int, default=0,
                   help="less-data: optimizer steps per run, the same for every size and model "
                        "(epochs = ceil(steps / ceil(size / batch)); 0: --epochs for every size)")
    x.add_argument("--sizes", type=_positive_int, nargs="+", default=[500, 1000, 5000, 10000, 60000],
                   help="less-data: training-set sizes (nested subsets for one --seed)")
    x.add_argument("--train-size", type=_nonneg_int, default=0,
                   help="multimnist, affine: train on a seeded subset of this many MNIST digits (0: all 60,000)")
    x.add_argument("--test-size", type=_nonneg_int, default=0,
                   help="first this many test digits (0: all 10,000); multimnist: the first this many of the 10,000 "
                        "fixed test pairs")
    x.add_argument("--batch-size", type=_positive_int, default=128, help="examples per optimizer step")
    x.add_argument("--lr", type=_positive_float, default=1e-3, help="Adam learning rate at step 0 (authors' code: 1e-3)")
    x.add_argument("--conv1-channels", type=_positive_int, default=256, help="CapsNet Conv1 channels (paper: 256)")
    x.add_argument("--primary-types", type=_positive_int, default=32, help="CapsNet primary capsule types (paper: 32)")
    x.add_argument("--routing-iterations", type=_positive_int, default=3, help="CapsNet routing rounds (paper: 3)")
    _baseline_arguments(x)
    x.add_argument("--seed", type=_nonneg_int, default=0, help="seed of the weights, subsets, shuffles and placements "
                                                              "(test sets have their own fixed seed)")
    x.add_argument("--data-dir", default=None, help="folder holding mnist/ (default: $CAPSNET_DATA, else the user cache)")
    x.add_argument("--device", default="auto", help="auto (CUDA when present, else CPU), cpu, cuda or cuda:N")
    x.add_argument("--amp", choices=AMP_MODES, default="none",
                   help="bf16: every run's training steps under bfloat16 autocast, as capsnet train --amp (for GPUs)")
    _compile_argument(x, "compile every run's model for its training steps, as capsnet train --compile (for GPUs)")
    x.add_argument("--no-progress", action="store_true", help="no progress bars")

    v = sub.add_parser("viz", formatter_class=fmt, help="local web viewer: walk an image through the network, move its pose",
                       description="Serve the interactive viewer on a local web server (loopback by default).")
    from .viz import add_arguments as _viz_arguments
    _viz_arguments(v)
    return p


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "aot_eager", "eager")


def _compile_argument(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument("--compile", nargs="?", const="default", default=None, choices=COMPILE_MODES, metavar="MODE",
                        help=help + f" ({', '.join(COMPILE_MODES)}; the flag alone: default)")


def _baseline_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dropout", type=_nonneg_float, default=0.5,
                        help="dropout before the CNN baseline's last layer (--model baseline)")
    parser.add_argument("--cnn-channels", type=_positive_int, nargs="+", default=[256, 256, 128],
                        help="channels of the CNN baseline's 5x5 convolutions (paper: 256 256 128)")
    parser.add_argument("--cnn-hidden", type=_positive_int, nargs="+", default=[328, 192],
                        help="sizes of the CNN baseline's fully connected layers (paper: 328 192)")


def _sweep_deltas(delta_range: float, step: float) -> list[float]:
    half = delta_range / step  # steps on each side of 0
    if abs(half - round(half)) > 1e-6 or not 1 <= round(half) <= 100:
        raise ValueError(f"--delta-range {delta_range:g} is not a whole number of --delta-step {step:g} (1 to 100 "
                         f"steps each side, so the sweep passes through 0); e.g. --delta-range 0.25 --delta-step 0.05")
    return [round(k * step, 10) for k in range(-round(half), round(half) + 1)]


def _cmd_figures(args: argparse.Namespace) -> int:
    from . import figures as fg
    from .checkpoint import CheckpointError, load_checkpoint
    from .data import load_dataset
    from .train import TrainConfig, load_model, resolve_device

    # Everything is checked before the first file is written.
    device = resolve_device(args.device)
    deltas = _sweep_deltas(args.delta_range, args.delta_step)
    model, ckpt = load_model(args.checkpoint[0], which=args.which, device=device)
    model.eval()
    if ckpt.model_name != "capsnet":
        raise ValueError(f"{ckpt.path} holds a {ckpt.model_name!r} model; capsnet figures look inside a CapsNet")
    if model.decoder is None:
        raise ValueError(f"{ckpt.path} is a CapsNet without decoder: reconstructions and pose sweeps need one")
    runs = {}
    for run in args.checkpoint:
        path = Path(run)
        run_dir = path if path.is_dir() else path.parent
        if not path.exists():
            raise CheckpointError(f"{path} not found: give a run directory written by `capsnet train`")
        runs[run_dir.name or str(run_dir)] = fg.read_metrics(run_dir)
    train_cfg = TrainConfig.from_dict(ckpt.train_config)
    if train_cfg.dataset == "multimnist":
        return _figures_multimnist(args, fg, model, ckpt, runs)
    name = args.dataset or train_cfg.dataset
    if name == "translated-mnist":  # the fixed translated test set, 40x40
        from .data.tasks import translated_test

        digits = load_dataset("mnist", "test", root=args.data_dir, progress=not args.no_progress)
        test = dataclasses.replace(digits, name=name, images=translated_test(digits.images))
    else:
        test = load_dataset(name, "test", root=args.data_dir, progress=not args.no_progress)
    cfg = model.config
    if tuple(test.images.shape[1:]) != (cfg.in_channels, cfg.input_height, cfg.input_width):
        raise ValueError(f"{name} images are {tuple(test.images.shape[1:])} but the checkpoint's model takes "
                         f"({cfg.in_channels}, {cfg.input_height}, {cfg.input_width})")
    if args.indices is None:
        indices = [int((test.labels == k).nonzero()[0]) for k in range(cfg.num_classes) if (test.labels == k).any()]
    else:
        bad = [i for i in args.indices if i >= len(test)]
        if bad:
            raise ValueError(f"--indices {bad} out of range: the {name} test set has {len(test)} images, 0..{len(test) - 1}")
        indices = list(args.indices)
    dims = list(range(cfg.digit_dim)) if args.dims is None else args.dims
    bad = [d for d in dims if d >= cfg.digit_dim]
    if bad:
        raise ValueError(f"--dims {bad} out of range: the digit capsules have {cfg.digit_dim} dimensions, "
                         f"0..{cfg.digit_dim - 1}")

    out = Path(args.out) if args.out else (Path(args.checkpoint[0]) if Path(args.checkpoint[0]).is_dir()
                                             else Path(args.checkpoint[0]).parent) / "figures"
    classes = list(test.classes)
    images, labels = test.images[indices], test.labels[indices]
    written = []

    def save(fig, stem: str) -> None:
        written.append(fg.save_figure(fig, out / f"{stem}.{args.format}", dpi=args.dpi))

    # All arrays first, then the files.
    rec = fg.reconstructions(model, images, labels)
    wrong, m_rec = [], None
    if args.misclassified:
        _, lengths = fg.predict(model, test.images) if args.no_progress else _predict_with_bar(fg, model, test.images)
        errors = (lengths.argmax(1) != test.labels).nonzero().flatten()
        print(f"{name} test set: {len(errors)} of {len(test)} misclassified")
        wrong = errors[: args.misclassified]
        if len(wrong):
            m_rec = fg.reconstructions(model, test.images[wrong], test.labels[wrong])
    sweeps = fg.pose_sweep(model, images, rec.predicted, dims=dims, deltas=deltas)
    trace = fg.routing_trace(model, images)

    save(fg.plot_reconstructions(images, rec, labels, classes), "reconstructions")
    if m_rec is not None:
        save(fg.plot_misclassified(test.images[wrong], m_rec, test.labels[wrong], classes), "misclassified")
    for n, index in enumerate(indices):
        label = (f"test image {index} (true {classes[int(labels[n])]}), "
                 f"the capsule of its prediction {classes[int(rec.predicted[n])]}")
        save(fg.plot_pose_sweep(sweeps[n], dims, deltas, label=label, image=images[n]), f"pose_sweep_{index}")
        save(fg.plot_routing(trace, n, image=images[n], classes=classes), f"routing_{index}")
    save(fg.plot_lengths(rec.lengths, labels, classes=classes), "lengths")
    save(fg.plot_training_curves(runs), "training_curves")
    print(f"checkpoint {ckpt.path} (epoch {ckpt.state.get('epoch')}), {name} test images {indices}")
    print(f"wrote {len(written)} figures to {out}:")
    for p in written:
        print(f"  {p.name}")
    return 0


def _figures_multimnist(args: argparse.Namespace, fg, model, ckpt, runs: dict) -> int:
    """Figure 5 for a MultiMNIST checkpoint: pairs of the fixed test set and their two reconstructions."""
    from .data import load_dataset
    from .data.tasks import multimnist_test

    digits = load_dataset("mnist", "test", root=args.data_dir, progress=not args.no_progress)
    indices = list(range(8)) if args.indices is None else list(args.indices)
    bad = [i for i in indices if i >= len(digits)]
    if bad:
        raise ValueError(f"--indices {bad} out of range: the MultiMNIST test set has {len(digits)} pairs, "
                         f"0..{len(digits) - 1}")
    pairs = multimnist_test(digits.images, digits.labels, max(indices) + 1)  # a prefix of the fixed test set
    images, labels = pairs.images[indices], pairs.labels[indices]
    rec = fg.pair_reconstructions(model, images)
    out = Path(args.out) if args.out else (Path(args.checkpoint[0]) if Path(args.checkpoint[0]).is_dir()
                                             else Path(args.checkpoint[0]).parent) / "figures"
    written = [fg.save_figure(fg.plot_multimnist(images, rec, labels, digits.classes), out / f"multimnist.{args.format}",
                              dpi=args.dpi),
               fg.save_figure(fg.plot_training_curves(runs), out / f"training_curves.{args.format}", dpi=args.dpi)]
    print(f"checkpoint {ckpt.path} (epoch {ckpt.state.get('epoch')}), MultiMNIST test pairs {indices}")
    print(f"wrote {len(written)} figures to {out}:")
    for p in written:
        print(f"  {p.name}")
    return 0


def _predict_with_bar(fg, model, images, batch_size: int = 256):
    import torch
    from tqdm import tqdm

    poses, lengths = [], []
    for start in tqdm(range(0, len(images), batch_size), desc="classify test set", unit="batch", leave=False):
        p, l = fg.predict(model, images[start:start + batch_size], batch_size)
        poses.append(p)
        lengths.append(l)
    return torch.cat(poses), torch.cat(lengths)


def _explicit_flags(parser: argparse.ArgumentParser, argv: Sequence[str]) -> set[str]:
    """The dests the user typed, told apart from defaults by parsing without any."""
    bare = build_parser()
    for action in bare._actions:  # noqa: SLF001 - argparse offers no public way
        action.default = argparse.SUPPRESS
    for sp in bare._subparsers._group_actions[0].choices.values():  # noqa: SLF001
        for action in sp._actions:
            action.default = argparse.SUPPRESS
    return set(vars(bare.parse_args(argv)))


def _verb(items: list, one: str, many: str) -> str:
    return one if len(items) == 1 else many


def _cmd_train(args: argparse.Namespace, explicit: set[str], parser: argparse.ArgumentParser) -> int:
    from .checkpoint import load_checkpoint
    from .models import MODELS, BaselineCNNConfig, CapsNetConfig
    from .train import TrainConfig, fit

    out = Path(args.out or f"runs/{args.dataset}" + ("-baseline" if args.model == "baseline" else ""))
    if args.allocator == "keep":
        from .memory import keep_freed_memory

        keep_freed_memory()
    capsule_flags = sorted(f"--{k.replace('_', '-')}" for k in explicit & set(_MODEL_FLAGS))
    if args.model == "baseline" and capsule_flags:
        parser.error(f"{', '.join(capsule_flags)} {_verb(capsule_flags, 'sets', 'set')} the CapsNet; "
                     f"{_verb(capsule_flags, 'it does', 'they do')} not apply to --model baseline")
    baseline_flags = sorted(f"--{k.replace('_', '-')}" for k in explicit & set(_BASELINE_FLAGS))
    if args.model == "capsnet" and baseline_flags:
        parser.error(f"{', '.join(baseline_flags)} {_verb(baseline_flags, 'sets', 'set')} the CNN baseline; "
                     f"use {_verb(baseline_flags, 'it', 'them')} with --model baseline")
    if args.dataset in TASK_NAMES and "shift" in explicit:
        parser.error(f"--shift does not apply to --dataset {args.dataset}, which places its digits itself")
    from .data.tasks import input_shape

    _, H, W = input_shape(args.dataset)
    if args.model == "baseline":
        model_cfg = BaselineCNNConfig(dropout=args.dropout, channels=tuple(args.cnn_channels),
                                      hidden=tuple(args.cnn_hidden), input_height=H, input_width=W)
    else:
        model_cfg = CapsNetConfig(input_height=H, input_width=W,
                                  routing_iterations=args.routing_iterations, conv1_channels=args.conv1_channels,
                                  primary_types=args.primary_types, decoder=not args.no_decoder,
                                  routing_bias=not args.no_routing_bias, leaky_routing=args.leaky_routing,
                                  detach_agreement=args.detach_agreement)
    train_cfg = TrainConfig(**{k: getattr(args, k) for k in _TRAIN_FLAGS})
    if args.resume and (out / "last.safetensors").exists():
        # The run's saved settings hold; flags typed now must agree with them.
        saved = load_checkpoint(out, "last")
        if saved.model_name != args.model and "model" in explicit:
            parser.error(f"--model {args.model} differs from the run in {out}, a {saved.model_name!r} model")
        if saved.model_name not in MODELS:
            raise ValueError(f"{out} holds a {saved.model_name!r} model; this capsnet knows {sorted(MODELS)}")
        saved_model = MODELS[saved.model_name][0].from_dict(saved.model_config)
        saved_train = TrainConfig.from_dict(saved.train_config)
        clashes = [f"--{k.replace('_', '-')}" for k in explicit & set(_TRAIN_FLAGS) - {"epochs"}
                   if getattr(train_cfg, k) != getattr(saved_train, k)]
        if type(model_cfg) is type(saved_model):
            clashes += [f"--{k.replace('_', '-')}" for k, field in _flags_of(saved_model).items()
                        if k in explicit and getattr(model_cfg, field) != getattr(saved_model, field)]
        if clashes:
            parser.error(f"{', '.join(sorted(clashes))} differ from the run in {out}; --resume continues with the "
                         f"run's own settings (only --epochs may change)")
        model_cfg = saved_model
        train_cfg = dataclasses.replace(saved_train, epochs=args.epochs if "epochs" in explicit else saved_train.epochs)
    final = fit(model_cfg, train_cfg, out, device=args.device, data_root=args.data_dir, resume=args.resume,
                progress=not args.no_progress, compile=args.compile or False)
    split = "val" if train_cfg.val_size else "test"
    if final:
        what = "top-2 exact accuracy" if train_cfg.dataset == "multimnist" else "accuracy"
        affine = (f", affine {split} accuracy {final[f'affine_accuracy']:.4f}" if "affine_accuracy" in final else "")
        print(f"epoch {final['epoch']}: {split} {what} {final[f'{split}_accuracy']:.4f} "
              f"(error {100 * final[f'{split}_error']:.2f}%){affine}, train loss {final['train_loss']:.4f}")
    print(f"run directory: {out}")
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    from .checkpoint import atomic_write_text
    from .data import load_dataset
    from .data.tasks import input_shape
    from .train import TrainConfig, _to_device, evaluate, evaluate_split, held_split, load_model, resolve_device

    device = resolve_device(args.device)
    model, ckpt = load_model(args.checkpoint, which=args.which, device=device)
    train_cfg = TrainConfig.from_dict(ckpt.train_config)
    name = args.dataset or train_cfg.dataset
    cfg = model.config
    shape = (cfg.in_channels, cfg.input_height, cfg.input_width)
    if name in TASK_NAMES and input_shape(name) != shape:
        raise ValueError(f"{name} images are {input_shape(name)} but the checkpoint's model takes {shape}")
    if args.affnist and shape != (1, 40, 40):
        raise ValueError(f"--affnist scores 40x40 models (trained with --dataset translated-mnist); this one takes {shape}")
    digits = load_dataset("mnist" if name in TASK_NAMES else name, "test", root=args.data_dir,
                          progress=not args.no_progress)
    if args.test_size and name != "multimnist":
        digits = digits.subset(range(min(args.test_size, len(digits))))
    split = held_split(dataclasses.replace(train_cfg, dataset=name, test_size=args.test_size), digits, device)
    if tuple(split.images.shape[1:]) != shape:
        raise ValueError(f"{name} images are {tuple(split.images.shape[1:])} but the checkpoint's model takes {shape}")
    results = evaluate_split(model, split, batch_size=args.batch_size, recon_weight=train_cfg.recon_weight,
                             progress=not args.no_progress)
    for path in args.affnist or []:
        from .data.affnist import load_affnist

        real = load_affnist(path)
        results[f"affnist:{Path(path).name}"] = evaluate(model, _to_device(real, device).images, real.labels.to(device),
                                                         batch_size=args.batch_size, recon_weight=train_cfg.recon_weight,
                                                         progress=not args.no_progress)
    r = results[""]
    print(f"checkpoint {ckpt.path} (epoch {ckpt.state.get('epoch')}), {name} test set, {len(split.labels)} "
          f"{'pairs' if name == 'multimnist' else 'images'}")
    report = {"checkpoint": str(ckpt.path), "model": ckpt.model_name, "epoch": ckpt.state.get("epoch"), "dataset": name,
              "images": len(split.labels), "accuracy": r.accuracy, "error": r.error, "loss": r.loss}
    if name == "multimnist":
        print(f"top-2 exact accuracy {r.accuracy:.4f}   error {100 * r.error:.2f}%   loss {r.loss:.4f}")
        print("(right when the two highest-scoring classes are exactly the pair's two labels, section 6)")
        report["metric"] = "top-2 exact match"
    else:
        K = r.confusion.shape[0]
        label = "translated test " if name == "translated-mnist" else ""
        print(f"{label}accuracy {r.accuracy:.4f}   error {100 * r.error:.2f}%   loss {r.loss:.4f}")
        for extra, er in results.items():
            if extra:
                n = int(er.confusion.sum())
                print(f"{extra} test accuracy {er.accuracy:.4f}   error {100 * er.error:.2f}%   ({n} images)")
                report[extra] = {"images": n, "accuracy": er.accuracy, "error": er.error, "loss": er.loss,
                                 "per_class_accuracy": er.per_class_accuracy}
        print(f"\n{label}class  accuracy   " + " ".join(f"{j:>5}" for j in range(K)) + "   <- predicted")
        for i, acc in enumerate(r.per_class_accuracy):
            print(f"{i:>5}  {acc:8.4f}   " + " ".join(f"{int(v):>5}" for v in r.confusion[i]))
        report |= {"per_class_accuracy": r.per_class_accuracy, "confusion": r.confusion.tolist()}
    out = Path(args.json) if args.json else ckpt.path.parent / f"eval-{ckpt.path.stem}.json"
    atomic_write_text(out, json.dumps(report, indent=2))
    print(f"\nwritten {out}")
    return 0


def _cmd_experiment(args: argparse.Namespace, explicit: set[str], parser: argparse.ArgumentParser) -> int:
    from . import experiments as ex
    from .models import BaselineCNNConfig, CapsNetConfig
    from .train import TrainConfig

    less = args.name == "less-data"
    misplaced = ([f for f in ("steps", "sizes") if f in explicit] if not less
                 else [f for f in ("train_size",) if f in explicit])
    if misplaced:
        parser.error(f"{', '.join('--' + f.replace('_', '-') for f in misplaced)} does not apply to "
                     f"`capsnet experiment {args.name}`")
    if less and "steps" in explicit and "epochs" in explicit:
        parser.error("--steps and --epochs conflict: less-data takes one budget, give one of them")
    out = Path(args.out or f"runs/experiment-{args.name}")
    train = TrainConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, train_size=args.train_size,
                        test_size=args.test_size, seed=args.seed, amp=args.amp)
    capsnet = CapsNetConfig(conv1_channels=args.conv1_channels, primary_types=args.primary_types,
                            routing_iterations=args.routing_iterations)
    baseline = BaselineCNNConfig(dropout=args.dropout, channels=tuple(args.cnn_channels), hidden=tuple(args.cnn_hidden))
    runs = ex.plan(args.name, out, train=train, capsnet=capsnet, baseline=baseline, models=args.models,
                   sizes=args.sizes, steps=args.steps)

    def started(k: int, run) -> None:
        print(f"[{k + 1}/{len(runs)}] {run.model}, {run.train_config.train_size or 60000} training digits, "
              f"{run.train_config.epochs} epochs -> {run.run_dir}", flush=True)

    rows = ex.run_plan(runs, device=args.device, data_root=args.data_dir, progress=not args.no_progress,
                       on_start=started, on_done=lambda rows: ex.write_results(rows, out, args.command_line),
                       compile=args.compile or False)
    written = out / "results.md"
    print(ex.format_table(rows))
    if less:
        from .figures import save_figure

        print(f"wrote {save_figure(ex.plot_less_data(rows), out / 'less_data.png')}")
    print(f"wrote {written} and {out / 'results.json'}")
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # the memory profiler's start/stop lines are noise here
    from .bench import environment, format_table, run_benchmark, write_record
    from .models import CapsNetConfig

    from .memory import keep_freed_memory

    allocator = "keep" if args.allocator == "keep" and keep_freed_memory() else "default"
    devices = None if args.device == "auto" else (args.device,)  # auto: CPU, plus CUDA when present
    rows = []
    for batch_size in args.batch_size:
        for rounds in args.routing_iterations:
            for dtype in args.dtype:
                print(f"capsnet bench: batch {batch_size}, {rounds} routing rounds, {dtype} ...", file=sys.stderr, flush=True)
                rows += run_benchmark(devices=devices, batch_size=batch_size, repeats=args.repeats,
                                      baseline_path=args.baseline, seed=args.seed, dtype=dtype,
                                      compile=args.compile or False,
                                      config=CapsNetConfig(routing_iterations=rounds))
    env = environment() | {"allocator": allocator}
    print(" ".join(f"{k}={v}" for k, v in env.items()))
    print(format_table(rows))
    if args.json:
        write_record(args.json, args.command_line, env, rows)
        print(f"wrote {args.json}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    args.command_line = shlex.join(["capsnet", *argv])
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    from .checkpoint import CheckpointError
    from .data import DataError

    try:
        if args.command == "train":
            return _cmd_train(args, _explicit_flags(parser, argv), parser)
        if args.command == "eval":
            return _cmd_eval(args)
        if args.command == "experiment":
            return _cmd_experiment(args, _explicit_flags(parser, argv), parser)
        if args.command == "figures":
            return _cmd_figures(args)
        if args.command == "viz":
            from .viz import run_command
            return run_command(args)
        return _cmd_bench(args)
    except (CheckpointError, DataError, ValueError) as e:
        print(f"capsnet {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"capsnet {args.command}: interrupted; `capsnet train --resume` continues from the last checkpoint",
              file=sys.stderr)
        return 130
