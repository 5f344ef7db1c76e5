"""Every figure of a trained run, as ``capsnet figures`` writes them: all inputs checked, all arrays made, then the files."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from .. import pretrained
from ..checkpoint import (Checkpoint, CheckpointError, RunLock, check_out_dir, checkpoint_said, load_checkpoint,
                          resolve_checkpoint)
from ..data.tasks import (TEST_PAIRS, absolute_dataset, class_change, classes_beyond, input_shape, load_test,
                          other_classes, shipped_default, trained_classes, trained_dataset)
from ..average import weights_tag
from .._progress import progress_bar
from ..evaluate import load_model, warn_folder_changed
from ..models import LOOK_INSIDE_NEEDS, is_segmentation, model_name, model_spec, reconstructs, segments_size
from ..routing import routing_is
from .arrays import (DEFAULT_DELTAS, FigureError, pair_reconstructions, pose_sweep, predict, read_metrics,
                     reconstructions, routing_trace)
from .plots import (BARELY_MOVES, FORMATS, drawing, plot_lengths, plot_misclassified, plot_multimnist, plot_pose_sweep,
                    plot_reconstructions, plot_routing, plot_training_curves, save_figure, sweep_change)
from .segmentation import Segmentations, capsule_maps, plot_capsule_maps, plot_segmentations, segment
from .synthesis import (generator_maps, interpolate_noise, label_maps_shown, plot_gan_curves, plot_interpolation,
                        plot_samples, plot_truncation, truncate_noise)

__all__ = ["FiguresWritten", "write_figures"]


# the names of the figures this module writes, in any format (a folder's other files, the user's own, are not its)
FIGURE_NAME = re.compile(r"(?:training_curves|multimnist|reconstructions|misclassified|lengths|worst|samples|"
                         r"interpolation|truncation|segmentations(?:_\w+)?|(?:pose_sweep|routing|capsule_maps)_\d+)"
                         rf"\.(?:{'|'.join(FORMATS)})")


@dataclass
class FiguresWritten:
    folder: Path
    files: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what was shown, for the user
    replaced: list[Path] = field(default_factory=list)  # of ``files``, those whose names were in the folder before
    # the figures already in the folder that this call did not draw (an earlier call's: another --which, --indices,
    # --format or --weights), left as they were; by name
    earlier: list[str] = field(default_factory=list)


def _default_out(checkpoint: str | os.PathLike, weights: str = "saved") -> Path:
    """Where the figures go without --out: RUN_DIR/figures, or figures-NAME in the working folder for a shipped
    model (never into the installed package); figures-training-weights for an averaged run's training weights."""
    tag = weights_tag(weights)
    if pretrained.is_shipped(checkpoint):
        return Path(f"figures-{checkpoint[len(pretrained.PREFIX):]}{tag}")
    first = Path(checkpoint)
    return (first if first.is_dir() else first.parent) / f"figures{tag}"


def _labels(run_dirs: Sequence[Path]) -> list[str]:
    """A name for each run in the curves' legend: its folder's name, with as many parent folders as it takes to tell
    runs of the same name apart (mnist/capsnet-seed0 beside fashion-mnist/capsnet-seed0)."""
    parts = [run_dir.resolve().parts[1:] or run_dir.resolve().parts for run_dir in run_dirs]  # no root "/" in a name
    depth = [1] * len(parts)
    while True:
        labels = ["/".join(p[-d:]) for p, d in zip(parts, depth)]
        clash = {label for label in labels if labels.count(label) > 1}
        grow = [i for i, label in enumerate(labels) if label in clash and depth[i] < len(parts[i])]
        if not grow:
            return labels
        for i in grow:
            depth[i] += 1


# a classifier's class scores (its ModelSpec's ``scores``) as a figure names them, and the margins of its loss where
# it has them (the margin loss's m+ and m-: CapsNet and Efficient-CapsNet); EM trains activations with the spread
# loss, the inverted model and the baseline probabilities with cross-entropy
_SCORES = {"lengths": ("capsule length", (0.9, 0.1)), "activations": ("class capsule activation", None),
           "probabilities": ("class probability", None)}


def class_scores(name: str, routing: str = "dynamic") -> tuple[str, tuple[float, float] | None]:
    """What model ``name``'s class scores are called on a figure, and its margin loss's (m+, m-) or None. A CapsNet
    routed otherwise than by dynamic routing keeps its margin loss; its scores are its capsules' lengths or, where
    the routing's activations are not lengths (EM: ``length_activations``), the routing's activations."""
    own = model_spec(name).scores
    score, margins = _SCORES[own]
    if own == "lengths" and routing != "dynamic":  # the registry's lengths under another routing (as scores_are)
        what = "length" if routing_is(routing, "length_activations") else "activation"
        score = f"class capsule {what} ({routing} routing)"
    return score, margins


MISCLASSIFIED = 8  # write_figures' default: misclassified inputs shown (segmentation: the lowest-Dice images)
_SCORED = {"segmentation": ", and Dice", "classification": ", and accuracy, not Dice"}  # what each kind's records score


def _check_indices_early(name: str, chosen: Sequence[int], what: str) -> None:
    """--indices past a generated test set (one canvas or pair per test image of its source set), refused before
    the set is made (10,000 canvases or skeletons took 10-25 s before the same refusal). A user's folder is
    checked once read."""
    from ..data.sets import split_size
    from ..data.tasks import task, user_folder

    if user_folder(name):
        return
    n = split_size(task(name).source, "test")
    bad = [i for i in chosen if not 0 <= i < n]
    if bad:
        raise FigureError(f"--indices {bad} out of range: the {name} test set has {n:,} {what}, 0..{n - 1}")


def _runs(checkpoints: Sequence[str | os.PathLike], kind: str = "classification",
          read: Checkpoint | None = None) -> dict[str, list[dict]]:
    """Each run's epoch records, by a name that tells it from the others (for the training curves). Every run must
    be of ``kind``'s metrics (a GAN's curves and a classifier's do not share axes): one that is not is refused here,
    before any figure is written. ``read``: a checkpoint already loaded, not read again where its history is
    wanted."""

    def history_of(path: Path) -> list[dict]:
        same = read is not None and read.path is not None and Path(read.path).resolve() == path.resolve()
        return (read if same else load_checkpoint(path)).state.get("history") or []

    needed = "train_g_loss" if kind == "synthesis" else "train_loss"
    run_dirs, records = [], []
    for run in checkpoints:
        if pretrained.is_shipped(run):  # a shipped model: its history travels in the checkpoint
            history = history_of(Path(pretrained.path(run)))
            run_dir = Path(run)  # its name, for the legend
        else:
            path = Path(run)
            if not path.exists():
                raise CheckpointError(f"{path} not found: give a run directory written by `capsnet train`, or "
                                      f"pretrained:NAME")
            run_dir = path if path.is_dir() else path.parent
            metrics = run_dir / "metrics.jsonl"
            if metrics.is_file() and metrics.read_text(encoding="utf-8", errors="replace").strip():
                history = read_metrics(run_dir)
            else:  # a checkpoint file on its own, a run stopped before its first epoch's record, or an emptied
                # metrics.jsonl (training writes it whole: a user's edit; every figure was refused by it)
                history = history_of(resolve_checkpoint(path, "last" if (path / "last.safetensors").is_file()
                                                        else "best"))
        scored = [k for r in history for k in r if k.endswith(("_dice", "_accuracy"))]
        dice = any(k.endswith("_dice") for k in scored)  # a segmentation run scores Dice, a classifier accuracy
        if any(needed not in r for r in history) or (scored and kind != "synthesis" and
                                                     dice != (kind == "segmentation")):
            raise FigureError(f"{run_dir} holds another kind of run than {checkpoints[0]} (a {kind} run's metrics "
                              f"have {needed}{_SCORED.get(kind, '')}); overlay the training curves of runs of one "
                              f"kind, or draw it alone")
        if any(run_dir.resolve() == seen.resolve() for seen in run_dirs if not pretrained.is_shipped(str(seen))):
            continue  # the same run given twice (a folder and its checkpoint): one line, not two on each other
        run_dirs.append(run_dir)
        records.append(history)
    return dict(zip(_labels(run_dirs), records))


def _curves(save: Callable[[Any, str], None], plot: Callable[[dict[str, list[dict]]], Any],
            runs: dict[str, list[dict]], done: FiguresWritten) -> None:
    """The training_curves figure of the runs that have finished an epoch; a note when none has."""
    finished = {name: records for name, records in runs.items() if records}
    if finished:
        save(plot(finished), "training_curves")
    else:
        done.notes.append("no training curves: no run given has finished an epoch")


def _check_fits(name: str, model: torch.nn.Module) -> None:
    """A FigureError unless data set ``name``'s images have the (C, H, W) the model reads (a segmentation model: its
    channels, any sides its stride divides): known from the name, so said before its files are read or downloaded."""
    cfg = model.config
    takes = (cfg.in_channels, cfg.input_height, cfg.input_width)
    try:
        other_size = segments_size(model, input_shape(name), name)
    except ValueError as e:
        raise FigureError(str(e)) from None
    if input_shape(name) != takes and not other_size:
        raise FigureError(f"{name} images are {input_shape(name)} but the checkpoint's model takes {takes}")


def write_figures(checkpoints: str | os.PathLike | Sequence[str | os.PathLike], *, which: str = "best",
                  weights: str = "saved",
                  out: str | os.PathLike | None = None, dataset: str | None = None,
                  root: str | os.PathLike | None = None,
                  indices: Sequence[int] | None = None, dims: Sequence[int] | None = None,
                  deltas: Sequence[float] = DEFAULT_DELTAS, misclassified: int = MISCLASSIFIED, fmt: str = "png",
                  dpi: int = 100,
                  device: str | torch.device = "cpu", progress: bool = True,
                  loaded: Checkpoint | None = None) -> FiguresWritten:
    """Look inside the CapsNet of ``checkpoints[0]`` (or of ``checkpoints``, one run dir or file); training curves
    overlay every run given.

    Writes into ``out`` (default: FIRST_RUN_DIR/figures; for a shipped model,
    ``pretrained:NAME``, figures-NAME in the working folder): reconstructions,
    misclassified (inputs decoded from the true and the predicted capsule),
    pose_sweep_INDEX (Figure 4), routing_INDEX (coupling per round and primary
    capsule lengths), lengths and training_curves; for a MultiMNIST run,
    multimnist (Figure 5) and training_curves. For a segmentation model
    (SegCaps, the U-Net): segmentations and segmentations_ood (inputs, true
    masks, probabilities, predicted masks, SegCaps' reconstruction) of the
    chosen test images (default: the first 8), worst (the ``misclassified``
    lowest-Dice images of the first ``WORST_POOL``, or of the run's own smaller test set), capsule_maps_INDEX
    (SegCaps: every layer's capsule lengths per type) and training_curves.
    For a synthesis model (CapsPix2pix, pix2pix): samples (label maps, real
    images, one generated image per noise seed 0-3), interpolation (the noise
    moved between two seeds' vectors), capsule_maps_INDEX (CapsPix2pix: every
    generator layer's capsule lengths per type) and training_curves.
    The inputs come from ``dataset``, by default the run's own; a shipped
    model trained on MNIST (``pretrained:NAME``) draws on the same task made
    from the digits that ship with capsnet (``mnist-sample``,
    ``mnist-sample-segmentation``, ``mnist-sample-skeleton``), offline.
    ``weights``: the checkpoint's "saved" weights or an averaged run's "training" ones (``load_model``; the
    default folder is then FIRST_RUN_DIR/figures-training-weights).
    Every input is checked before the first file is written. ``loaded``: the first checkpoint as the caller read
    it already (``which`` chosen), drawn as read (a training run may replace its file between two reads).
    """
    if isinstance(checkpoints, (str, os.PathLike)):  # one run (a string is a sequence too: of its characters)
        checkpoints = [checkpoints]
    given = {"--dims": dims is not None, "--delta-range/--delta-step": tuple(deltas) != tuple(DEFAULT_DELTAS),
             "--misclassified": misclassified != MISCLASSIFIED}  # flags set away from their defaults

    def unused(*flags: str) -> list[str]:  # of ``flags``, those given: said where a model has nothing they shape
        return [f for f in flags if given[f]]

    if not checkpoints:
        raise FigureError("give at least one checkpoint")
    if fmt not in FORMATS:
        raise FigureError(f"unknown figure format {fmt!r}; use one of {', '.join(FORMATS)}")
    model, ckpt = load_model(checkpoints[0] if loaded is None else loaded, which=which, device=device, weights=weights)
    model.eval()
    if dataset is None and pretrained.is_shipped(checkpoints[0]):  # a shipped MNIST model: the shipped digits, offline
        trained_on = ckpt.train_config.get("dataset", "mnist")
        sample = shipped_default(trained_on)
        dataset = sample if sample != trained_on else None  # none for it: the run's own, as for any run
    out = Path(out) if out else _default_out(checkpoints[0], weights)
    check_out_dir(out, "figures", error=FigureError)  # before the figures' work, not at their first save
    # one writer at a time: two `capsnet figures` into one folder interleaved their files (one run's figures beside
    # another's); the second is refused, as a second run into a run's folder is. A folder made here and left empty
    # by an error goes again.
    made = [f for f in (out, *out.parents) if not f.exists()]  # the folders made here, innermost first
    out.mkdir(parents=True, exist_ok=True)
    try:
        # one bar over the drawing, a figure a tick (16-22 s of it showed nothing, in a terminal or a log)
        with RunLock(out, "figures") as lock, progress_bar(desc="figures", unit=" figures", progress=progress,
                                                           leave=False) as bar, drawing(bar):
            lock.acquire()
            before = {p.name for p in out.iterdir() if FIGURE_NAME.fullmatch(p.name) and p.is_file()}
            done = _draw(model, ckpt, checkpoints, out=out, dataset=dataset, root=root, indices=indices,
                         dims=dims, deltas=deltas, misclassified=misclassified, fmt=fmt, dpi=dpi, progress=progress,
                         unused=unused)
            done.replaced = [f for f in done.files if f.name in before]
            done.earlier = sorted(before - {f.name for f in done.files})
            return done
    except BaseException:
        for folder in made:
            if any(folder.iterdir()):
                break
            folder.rmdir()
        raise


def _draw(model, ckpt, checkpoints, *, out: Path, dataset, root, indices, dims, deltas, misclassified: int,
          fmt: str, dpi: int, progress: bool, unused: Callable[..., list[str]]) -> FiguresWritten:
    """``write_figures``' drawing, once its inputs are checked."""
    if model_spec(model_name(model.config)).kind == "synthesis":
        if dims is not None:
            raise FigureError("--dims chooses class-capsule dimensions to sweep; a synthesis model has no class "
                              "capsules")
        done = _write_synthesis(model, ckpt, _runs(checkpoints, "synthesis", ckpt), out=out, dataset=dataset,
                                root=root, indices=indices, fmt=fmt, dpi=dpi, progress=progress)
        if skipped := unused("--delta-range/--delta-step", "--misclassified"):  # (--dims is refused above)
            done.notes.append(f"{', '.join(skipped)} not used: a synthesis model's figures have no pose sweeps or "
                              f"misclassified inputs")
        return done
    if is_segmentation(model.config):
        if dims is not None:
            raise FigureError("--dims chooses class-capsule dimensions to sweep; a segmentation model has no class "
                              "capsules")
        done = _write_segmentation(model, ckpt, _runs(checkpoints, "segmentation", ckpt), out=out, dataset=dataset,
                                   root=root, indices=indices, worst=misclassified, fmt=fmt, dpi=dpi, progress=progress)
        if unused("--delta-range/--delta-step"):
            done.notes.append("--delta-range/--delta-step not used: a segmentation model's figures have no pose sweeps")
        return done
    decodes = reconstructs(model)  # reconstructions, misclassified inputs, pose sweeps
    routes = hasattr(model, "routing_view")  # routing maps
    if not (decodes or routes):
        raise FigureError(f"{ckpt.path} holds a {ckpt.model_name!r} model; capsnet figures look inside a CapsNet "
                          f"or another capsule model: a classifier with {LOOK_INSIDE_NEEDS}")
    runs = _runs(checkpoints, read=ckpt)
    done = FiguresWritten(out)
    if not decodes:  # what is not drawn, and the flags that would have shaped it, said rather than skipped silently
        skipped = unused("--dims", "--delta-range/--delta-step", "--misclassified")
        why = "decoder" if getattr(model, "decoder", None) is None else "reconstruct(poses, index) method"
        done.notes.append(f"no reconstructions, misclassified inputs or pose sweeps: --model {ckpt.model_name} has no "
                          f"{why}" + (f" ({', '.join(skipped)} not used)" if skipped else ""))

    def save(fig, stem: str) -> None:
        done.files.append(save_figure(fig, done.folder / f"{stem}.{fmt}", dpi=dpi))

    trained_on = ckpt.train_config.get("dataset", "mnist")
    if trained_on == "multimnist":
        if not decodes:
            raise FigureError(f"{ckpt.path}: MultiMNIST's Figure 5 decodes each digit; this {ckpt.model_name} model "
                              f"has no decoder")
        if dataset is not None and dataset != "multimnist":  # drawn on its own pairs only: said, not ignored
            raise FigureError(f"{ckpt.path} holds a MultiMNIST model, whose figure (Sabour et al. 2017, Figure 5) "
                              f"draws MultiMNIST's test pairs: leave --dataset {dataset} out")
        if skipped := unused("--dims", "--delta-range/--delta-step", "--misclassified"):
            done.notes.append(f"MultiMNIST's figure is its pairs' reconstructions ({', '.join(skipped)} not used)")
        chosen = list(range(8)) if indices is None else list(indices)
        bad = [i for i in chosen if not 0 <= i < TEST_PAIRS]
        if bad:
            raise FigureError(f"--indices {bad} out of range: the MultiMNIST test set has {TEST_PAIRS} pairs, "
                              f"0..{TEST_PAIRS - 1}")
        pairs = load_test("multimnist", size=max(chosen) + 1, root=root, progress=progress)  # a prefix of the fixed set
        images, labels = pairs.images[chosen], pairs.labels[chosen]
        rec = pair_reconstructions(model, images)
        save(plot_multimnist(images, rec, labels, pairs.classes), "multimnist")
        _curves(save, plot_training_curves, runs, done)
        done.notes.insert(0, f"{checkpoint_said(ckpt)}, MultiMNIST test pairs {chosen}")
        return done

    name = dataset or trained_dataset(ckpt.train_config, "mnist")  # a user's folder moved: --dataset is the fix
    if dataset is None:  # its folder changed since: said as eval says it (the figures' Dice alone before)
        warn_folder_changed(ckpt, name)
    _check_fits(name, model)  # before reading (or downloading) a data set of another shape
    if (changed := class_change(ckpt.state, name, absolute_dataset(name) == trained_on)) is not None:
        raise FigureError(changed)  # classes:DIR: its class folders are not the model's (the titles would lie)
    if beyond := classes_beyond(name, getattr(model.config, "num_classes", None), trained_on, "draw"):
        raise FigureError(beyond)
    test = load_test(name, extras=False, root=root, progress=progress)
    # a Fashion-MNIST model drawn on digits, an MNIST one on a folder of other classes: said, not refused
    if warning := other_classes(trained_on, name, trained_classes(ckpt.train_config, ckpt.state), test.classes):
        done.notes.append(f"warning: {warning}")
    cfg = model.config
    if indices is None:  # the first test image of each class
        chosen = [int((test.labels == k).nonzero()[0]) for k in range(cfg.num_classes) if (test.labels == k).any()]
    else:
        bad = [i for i in indices if not 0 <= i < len(test)]
        if bad:
            raise FigureError(f"--indices {bad} out of range: the {name} test set has {len(test)} images, "
                              f"0..{len(test) - 1}")
        chosen = list(indices)
    classes = list(test.classes)  # the true labels' names
    # the model's capsules by its own classes: a Fashion-MNIST model drawn on digits predicted "8" for its Bag
    own = trained_classes(ckpt.train_config, ckpt.state)
    model_classes = list(own) if own is not None and len(own) == cfg.num_classes else classes
    images, labels = test.images[chosen], test.labels[chosen]
    poses, scores = predict(model, images)
    D = poses.shape[-1]
    dims = list(range(D)) if dims is None else list(dims)
    bad = [d for d in dims if not 0 <= d < D]
    if bad and decodes:  # without a decoder there are no pose sweeps: --dims is said unused above, not checked
        raise FigureError(f"--dims {bad} out of range: the class capsules have {D} dimensions, 0..{D - 1}")

    # All arrays first, then the files.
    predicted = scores.argmax(dim=1)
    rec = reconstructions(model, images, labels) if decodes else None
    wrong, m_rec = [], None
    if misclassified and decodes:
        _, all_scores = predict(model, test.images, progress=progress)
        errors = (all_scores.argmax(1) != test.labels).nonzero().flatten()
        done.notes.append(f"{name} test set: {len(errors)} of {len(test)} misclassified")
        wrong = errors[:misclassified]
        if len(wrong):
            m_rec = reconstructions(model, test.images[wrong], test.labels[wrong])
    sweeps = pose_sweep(model, images, predicted, dims=dims, deltas=deltas) if decodes else None
    trace = routing_trace(model, images) if routes else None

    if rec is not None:
        save(plot_reconstructions(images, rec, labels, classes, model_classes), "reconstructions")
    if m_rec is not None:
        save(plot_misclassified(test.images[wrong], m_rec, test.labels[wrong], classes, indices=wrong.tolist(),
                                model_classes=model_classes, names=_names(test, wrong.tolist())), "misclassified")
    files = _names(test, chosen)  # a user's folder: its files, where an index alone finds nothing
    for n, index in enumerate(chosen):
        if sweeps is not None:
            label = (f"{files[n] if files else f'test image {index}'} (true {classes[int(labels[n])]}), "
                     f"the capsule of its prediction {model_classes[int(predicted[n])]}")
            save(plot_pose_sweep(sweeps[n], dims, deltas, label=label, image=images[n]), f"pose_sweep_{index}")
            moved = float(sweep_change(sweeps[n], deltas).max())
            if moved < BARELY_MOVES:
                done.notes.append(f"pose_sweep_{index}: the reconstruction barely moves (at most {moved:.3f} mean "
                                  f"pixel change); " + ("its decoder barely responds to the pose yet (it can lag "
                                                        "the classifier: train longer for the paper's Figure 4)"
                                                        if max(map(abs, deltas)) >= 0.25
                                                        else "a wider --delta-range moves it further"))
        if trace is not None:
            save(plot_routing(trace, n, image=images[n], classes=model_classes), f"routing_{index}")
    score, margins = class_scores(ckpt.model_name, getattr(model.config, "routing", "dynamic"))
    save(plot_lengths(scores, labels, classes=model_classes, score=score, m_plus=margins and margins[0],
                      m_minus=margins and margins[1], indices=chosen, names=files), "lengths")
    _curves(save, plot_training_curves, runs, done)
    done.notes.insert(0, f"{checkpoint_said(ckpt)}, {name} test images "
                      f"{_listed(chosen, files)}")
    return done


def _names(data, chosen: Sequence[int]) -> list[str] | None:
    """The file names of a user's folder's ``chosen`` examples (titled "#0" alone before, where the folder names
    them), None for a generated set."""
    return None if getattr(data, "names", None) is None else [data.names[i] for i in chosen]


def _listed(chosen: Sequence[int], files: Sequence[str] | None) -> str:
    """How a note lists ``chosen`` test examples: their indices, and a user's folder's file names beside them (a
    segmentation run's lowest-Dice images were indices alone, where eval names the files: a bug hunt,
    2026-12-05)."""
    return f"{list(chosen)}" + (f" ({', '.join(files)})" if files else "")


WORST_POOL = 1000  # segmentation: the worst canvases are looked for among the first this many test images


def _write_segmentation(model: torch.nn.Module, ckpt, runs: dict[str, list[dict]], *, out: Path, dataset, root, indices,
                        worst: int, fmt: str, dpi: int, progress: bool) -> FiguresWritten:
    """A segmentation run's figures: segmentations (and _ood) of the chosen test images, the ``worst`` of the first
    ``WORST_POOL`` (or of the run's smaller --test-size) by Dice, SegCaps' capsule maps per chosen image, the training curves."""
    done = FiguresWritten(out)
    name = dataset or trained_dataset(ckpt.train_config, "mnist-segmentation")
    if dataset is None:  # its folder changed since: said as eval says it (the figures' Dice alone before)
        warn_folder_changed(ckpt, name)
    chosen = list(range(8)) if indices is None else list(indices)
    run_size = ckpt.train_config.get("test_size") or 0  # the run's own test set (0: all); the worst are looked for there
    pool_size = min(WORST_POOL, run_size) if run_size and not dataset else WORST_POOL
    _check_fits(name, model)
    _check_indices_early(name, chosen, "images")
    test = load_test(name, size=max(max(chosen) + 1, pool_size if worst else 0), root=root, progress=progress)
    if indices is None:  # a small folder of the user's: the images it has
        chosen = chosen[:len(test)]
    if test.labels.dim() != 4:
        raise FigureError(f"{name} is not a segmentation data set; give one with masks (--dataset)")
    bad = [i for i in chosen if not 0 <= i < len(test)]
    if bad:
        raise FigureError(f"--indices {bad} out of range: the {name} test set has {len(test)} images, 0..{len(test) - 1}")

    # All arrays first, then the files.
    sets = {"": test} | test.extra
    shown = {key: (s, segment(model, s.images[chosen], s.labels[chosen])) for key, s in sets.items()}
    worst_idx, worst_seg = [], None
    if worst:
        n = min(len(test), pool_size)
        pool = segment(model, test.images[:n], test.labels[:n], progress=progress)
        order = pool.dice.argsort(stable=True)[:worst]  # lowest Dice first
        worst_idx = order.tolist()
        worst_seg = Segmentations(*(None if v is None else v[order] for v in pool))
        done.notes.append(f"{name} test set, first {n} images: mean Dice {pool.dice.mean():.4f}, IoU "
                          f"{pool.iou.mean():.4f}; the lowest Dice: images "
                          f"{_listed(worst_idx, _names(test, worst_idx))}")
    maps = [capsule_maps(model, test.images[i]) for i in chosen] if hasattr(model, "capsule_grids") else []

    def save(fig, stem: str) -> None:
        done.files.append(save_figure(fig, done.folder / f"{stem}.{fmt}", dpi=dpi))

    for key, (s, seg) in shown.items():
        what = s.title or "test images"
        save(plot_segmentations(s.images[chosen], s.labels[chosen], seg, indices=chosen, names=_names(s, chosen),
                                title=f"{name}, {'test' if not key else key} set ({what}): inputs, true masks, the "
                                      f"model's probabilities and masks"), "segmentations" + (f"_{key}" if key else ""))
    if worst_seg is not None:
        save(plot_segmentations(test.images[worst_idx], test.labels[worst_idx], worst_seg, indices=worst_idx,
                                names=_names(test, worst_idx),
                                title=f"The {len(worst_idx)} lowest-Dice images of the first "
                                      f"{min(len(test), pool_size)} {name} test images"), "worst")
    for index, m in zip(chosen, maps):
        save(plot_capsule_maps(m, test.images[index], title=f"{name} test image {index}: capsule lengths per type, "
                                                            f"layer by layer"), f"capsule_maps_{index}")
    _curves(save, plot_training_curves, runs, done)
    done.notes.insert(0, f"{checkpoint_said(ckpt)}, {name} test images "
                      f"{_listed(chosen, _names(test, chosen))}")
    return done


SAMPLE_SEEDS = (0, 1, 2, 3)  # synthesis: the noise seeds of the samples figure
INTERPOLATION_STEPS = 8
TRUNCATIONS = (0.0, 0.5, 1.0, 1.5, 2.0, None)  # synthesis: the truncation figure's columns (seed 0; None: untruncated)


def _write_synthesis(model: torch.nn.Module, ckpt, runs: dict[str, list[dict]], *, out: Path, dataset, root, indices,
                     fmt: str, dpi: int, progress: bool) -> FiguresWritten:
    """A synthesis run's figures: samples and interpolation of the chosen test label maps (default: the first 8),
    the generator's capsule maps per chosen label map (CapsPix2pix), the GAN's training curves."""
    from ..synthesis import samples as samples_of

    done = FiguresWritten(out)
    name = dataset or trained_dataset(ckpt.train_config, "mnist-skeleton")
    if dataset is None:  # its folder changed since: said as eval says it (the figures' Dice alone before)
        warn_folder_changed(ckpt, name)
    chosen = list(range(8)) if indices is None else list(indices)
    _check_indices_early(name, chosen, "label maps")
    test = load_test(name, size=max(chosen) + 1, extras=False, root=root, progress=progress)
    if indices is None:  # a small folder of the user's: the label maps it has
        chosen = chosen[:len(test)]
    cfg = model.config
    if test.components is None or test.images.dim() != 4 or test.components.dim() != 4:
        raise FigureError(f"{name} is not a synthesis data set; give one of label maps and images (--dataset)")
    if tuple(test.images.shape[1:]) != (cfg.in_channels, cfg.input_height, cfg.input_width):
        raise FigureError(f"{name} label maps are {tuple(test.images.shape[1:])} but the checkpoint's model takes "
                          f"({cfg.in_channels}, {cfg.input_height}, {cfg.input_width})")
    if test.components.shape[1] != cfg.out_channels:  # drawn beside the real images, they must be alike
        raise FigureError(f"{name} has {test.components.shape[1]}-channel images but the checkpoint's model makes "
                          f"{cfg.out_channels}-channel ones; draw it on data of the shape it was trained on "
                          f"(--dataset)")
    bad = [i for i in chosen if not 0 <= i < len(test)]
    if bad:
        raise FigureError(f"--indices {bad} out of range: the {name} test set has {len(test)} label maps, "
                          f"0..{len(test) - 1}")

    # All arrays first, then the files.
    dev = next(model.parameters()).device
    labels = test.images[chosen].float()
    real = test.components[chosen]
    # each label map's noise is its test index's row of a seed's draw, as in `capsnet eval` and the viewer (its place
    # in --indices gave other images for the same pair and seed, depending on the other indices given)
    samples = torch.stack([samples_of(model, label.to(dev), SAMPLE_SEEDS, row=i).cpu()
                           for i, label in zip(chosen, labels)], dim=1)  # (S, N, C, H, W)
    noisy = model.noise(1, 0, dev).shape[1] > 0  # pix2pix's noise is dropout: no vector to interpolate
    rows = torch.stack([interpolate_noise(model, label, INTERPOLATION_STEPS, row=i)
                        for i, label in zip(chosen, labels[:4])]) if noisy else None
    cut = torch.stack([truncate_noise(model, label, TRUNCATIONS, row=i)
                       for i, label in zip(chosen, labels[:4])]) if noisy else None
    maps = [generator_maps(model, label, row=i) for i, label in zip(chosen, labels)] \
        if hasattr(model.generator, "capsule_grids") else []
    spread = samples.std(0).mean().item()
    done.notes.append(f"{name} test label maps {chosen}: mean per-pixel spread over noise seeds "
                      f"{list(SAMPLE_SEEDS)}: {spread:.4f}" + (" (the generator ignores its noise)" if spread < 1e-3
                                                             else ""))

    def save(fig, stem: str) -> None:
        done.files.append(save_figure(fig, done.folder / f"{stem}.{fmt}", dpi=dpi))

    shown = label_maps_shown(labels)  # a user's class maps 0..K drawn 0..1, not black (the model reads them as given)
    save(plot_samples(shown, real, samples, indices=chosen, seeds=SAMPLE_SEEDS,
                      title=f"{name}: label maps, real images and {ckpt.model_name}'s images for noise seeds "
                            f"{', '.join(map(str, SAMPLE_SEEDS))}"), "samples")
    if rows is not None:
        save(plot_interpolation(shown[:4], rows, indices=chosen[:4]), "interpolation")
        save(plot_truncation(shown[:4], cut, indices=chosen[:4], truncations=TRUNCATIONS), "truncation")
    else:  # written without a word before
        done.notes.append(f"{ckpt.model_name}'s noise is its dropout, no vector: no interpolation or truncation "
                          f"figures")
    for index, m, label in zip(chosen, maps, shown):
        save(plot_capsule_maps(m, label, title=f"{name} test label map {index}: generator capsule lengths per type, "
                                               f"layer by layer (noise seed 0)"), f"capsule_maps_{index}")
    _curves(save, plot_gan_curves, runs, done)
    done.notes.insert(0, f"{checkpoint_said(ckpt)}, {name} test label maps "
                      f"{_listed(chosen, _names(test, chosen))}")
    return done
