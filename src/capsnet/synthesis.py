"""Scoring and using a trained synthesis model (CapsPix2pix, pix2pix): held-out metrics, a frozen judge, images
generated from the user's own label maps.

``evaluate_synthesis`` scores the images a generator makes from a split's
label maps, each with its own fixed noise (noise seed 0, drawn for the whole
split at once, so an image does not depend on how the split is batched):

- ``l1``: mean absolute difference from the real image;
- ``ssim``: structural similarity to it (Wang et al. 2004; ``capsnet.image_metrics.ssim``);
- ``iou``: the IoU of the generated image's shape with the real image's,
  the shape taken by the task's rule (``Task.shape``: for fashion-silhouette
  the filled silhouette, so the real image's shape is the label map itself;
  otherwise the pixels above half intensity);
- ``spread``: for the first ``SPREAD_SIZE`` label maps, the per-pixel
  standard deviation over ``SPREAD_SEEDS`` noise seeds, averaged (0 means the
  generator ignores its noise, a known GAN failure);
- ``judge_accuracy`` (given a judge): a frozen classifier trained on real
  images reads each generated image (centre-cropped to its input size) and is
  scored against the label map's class;
- ``l1_draws``, ``ssim_draws``, ``judge_accuracy_draws``: the same scores of
  the spread's images (the first ``SPREAD_SIZE`` label maps, each under
  ``SPREAD_SEEDS`` noise seeds), averaged over the draws, and
  ``judge_accuracy_draws_sd``, the standard deviation of the judge's accuracy
  from one draw to another. One draw's scores move with the noise (on
  fashion-silhouette another seed moved CapsPix2pix's judge accuracy by 1.7
  points on 1,000 pairs, docs/results.md); these are the steadier figures for
  comparing two generators.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn

from . import pretrained
from ._numbers import is_count
from ._progress import progress_bar
from .checkpoint import Checkpoint, checkpoint_said, saved_point
from .data.tasks import Split
from .image_metrics import l1_error, noise_spread, shape_iou, ssim
from .models.capspix2pix import truncate_normal
from .runtime import evaluating, sum_dtype

__all__ = ["SynthesisResult", "evaluate_synthesis", "generate", "samples", "row_noise", "load_judge",
           "judge_predictions", "EVAL_BATCH_SIZE", "SPREAD_SEEDS", "SPREAD_SIZE", "generate_folder", "GeneratedFiles",
           "SynthesisEvaluation", "evaluate_synthesis_checkpoint", "judge_for"]

EVAL_BATCH_SIZE = 64  # label maps a pass when scoring: each holds several generated images (the spread's draws)
SPREAD_SEEDS = 8  # noise draws per label map for the spread
SPREAD_SIZE = 1000  # label maps the spread is measured on (the first ones of the split)


@dataclass
class SynthesisResult:
    l1: float
    ssim: float
    iou: float
    spread: float
    judge_accuracy: float | None = None
    l1_draws: float | None = None  # the scores of the spread's draws (the first SPREAD_SIZE, each SPREAD_SEEDS times)
    ssim_draws: float | None = None
    judge_accuracy_draws: float | None = None
    judge_accuracy_draws_sd: float | None = None  # from one draw to another

    def as_dict(self) -> dict[str, float]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def _dropout_seed(seed: int, index: int) -> int:
    # pix2pix's noise is its dropout: one stream per (seed, image), within torch's seeds (a seed above 9.2e12
    # overflowed them)
    return (seed * 1_000_003 + index) % 2**63


@torch.no_grad()
def generate(model: nn.Module, labels: torch.Tensor, *, seed: int = 0, batch_size: int = 64,
             progress: bool = False, truncation: float | None = None, shared: bool = False) -> torch.Tensor:
    """Images for ``labels`` as at inference, noise seed ``seed``: the same label map, seed and index in ``labels``
    give the same image, whatever else is generated with it (the model's mode is restored after); ``shared=True``
    drops the index.

    A model with a noise vector (CapsPix2pix) gets the vectors of the whole set at once, image i the i-th; one
    whose noise is dropout (pix2pix, an empty z) draws image i's masks from a stream of its own, seeded by
    (seed, i) (its ``generate`` takes ``seeds``). Either way the images run in batches and none depends on the
    batch it came in. ``truncation`` draws the noise vectors from the normal truncated to [-t, t]
    (``ConditionalGAN.noise``; refused by a model without a noise vector). ``shared``: every label map gets image
    0's noise (the seed's first vector, its first dropout stream), so an image depends on its map and the seed
    alone, not on its place in the set (``generate_folder``: a folder's other files change nothing).

    Shapes: labels (N, C, H, W) float in [0, 1] on the model's device -> images (N, C', H, W) in [0, 1].
    """
    if len(labels) == 0:
        raise ValueError("no label maps given")
    if not is_count(batch_size):
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    with evaluating(model):
        if shared:  # image 0's noise for every map
            z = model.noise(1, seed, labels.device, truncation=truncation).expand(len(labels), -1)
        else:
            z = model.noise(len(labels), seed, labels.device, truncation=truncation)  # (N, noise_dim): all at once
        z = z.to(next(model.parameters()).dtype)  # drawn in float32; a float64 or bf16 model takes its own dtype
        out = []
        for start in progress_bar(range(0, len(labels), batch_size), desc="generate", unit="batch", leave=False,
                                  progress=progress):
            stop = min(start + batch_size, len(labels))
            if z.shape[1]:
                out.append(model.generate(labels[start:stop], z=z[start:stop],
                                          seed=_dropout_seed(seed, 0 if shared else start)))
            else:  # the noise is dropout: a stream per image
                out.append(model.generate(labels[start:stop], z=z[start:stop],
                                          seeds=[_dropout_seed(seed, 0 if shared else i) for i in range(start, stop)]))
        return torch.cat(out)


def load_judge(path: str | os.PathLike, *, device: str | torch.device = "cpu", dataset: str | None = None
               ) -> nn.Module:
    """A frozen classifier (a run directory, checkpoint file or ``pretrained:NAME``) to read generated images;
    ``dataset``: the synthesis data set it reads, whose classes it must have been trained on (refused otherwise)."""
    from .data.tasks import input_shape, other_classes, task, trained_classes
    from .evaluate import load_model
    from .models import model_spec

    model, ckpt = load_model(path, device=device)
    if model_spec(ckpt.model_name).kind != "classification":
        raise ValueError(f"the judge must be a classifier; {ckpt.path} holds a {ckpt.model_name!r} "
                         f"({model_spec(ckpt.model_name).kind}) model")
    trained_on = ckpt.train_config.get("dataset")
    if dataset is not None and isinstance(trained_on, str) and other_classes(
            trained_on, task(dataset).source, trained_classes(ckpt.train_config, ckpt.state)):
        # a Fashion-MNIST judge reading digits (or one trained on a folder of other classes): its accuracy against
        # the label maps' classes would count nothing
        raise ValueError(f"the judge {path} was trained on {trained_on}, whose classes are not those of {dataset}'s "
                         f"images ({task(dataset).source}): its accuracy there would mean nothing; give a judge "
                         f"trained on {task(dataset).source}")
    if dataset is not None:  # known now: judge_predictions found it after an epoch of training or a whole generation
        made, cfg = (task(dataset).target_channels, *input_shape(dataset)[1:]), model.config
        if not _judge_reads(cfg, made):
            raise ValueError(f"the judge {path} reads ({cfg.in_channels}, {cfg.input_height}, {cfg.input_width}) "
                             f"images; {dataset}'s generated images {made} cannot be cropped to that: give a judge "
                             f"of {made[0]} channel{'s' if made[0] > 1 else ''} and at most {made[1]}x{made[2]} "
                             f"(one trained on {task(dataset).source})")
    return model.eval().requires_grad_(False)


def _judge_reads(cfg: Any, made: tuple[int, ...]) -> bool:
    """Whether a judge of config ``cfg`` reads images of shape ``made`` (C, H, W): its channels, sides at least its
    own (centre-cropped to them)."""
    return made[0] == cfg.in_channels and cfg.input_height <= made[1] and cfg.input_width <= made[2]


@torch.no_grad()
def judge_predictions(judge: nn.Module, images: torch.Tensor, batch_size: int = 256) -> torch.Tensor:
    """The judge's class for each image, centre-cropped (or refused) to the judge's input size.

    Shapes: images (N, C, H, W) -> (N,) int64.
    """
    cfg = judge.config
    H, W = images.shape[-2:]
    h, w = cfg.input_height, cfg.input_width
    if not _judge_reads(cfg, tuple(images.shape[1:])):
        raise ValueError(f"the judge reads ({cfg.in_channels}, {h}, {w}) images; generated images "
                         f"{tuple(images.shape[1:])} cannot be cropped to that")
    top, left = (H - h) // 2, (W - w) // 2
    x = images[..., top:top + h, left:left + w]
    return torch.cat([_scores(judge(x[s:s + batch_size])).argmax(1) for s in range(0, len(x), batch_size)])


def _scores(out: Any) -> torch.Tensor:
    """A classifier's class scores: its output's ``scores``, or the output itself (the CNN baseline's logits)."""
    return out if isinstance(out, torch.Tensor) else out.scores


@torch.no_grad()
def evaluate_synthesis(model: nn.Module, split: Split, *, judge: nn.Module | None = None,
                       shape: Callable[[torch.Tensor], torch.Tensor] | None = None,
                       batch_size: int = EVAL_BATCH_SIZE,
                       progress: bool = False, truncation: float | None = None) -> dict[str, SynthesisResult]:
    """Score the images ``model`` makes from ``split`` (and its extra sets): {"": result, ...}.

    ``split`` is on the model's device: images the label maps, components the real images, labels the classes
    (for the judge). ``shape`` makes each image's binary shape for the IoU (default: above half intensity).
    ``truncation``: every draw's noise from the normal truncated to [-t, t] (``generate``).
    """
    def shape_of(x: torch.Tensor) -> torch.Tensor:
        return shape(x) if shape is not None else (x.mean(1, keepdim=True) > 0.5).to(torch.uint8)

    def one(sp: Split) -> SynthesisResult:
        if sp.components is None:
            raise ValueError("a synthesis split needs its real images (components)")
        fake = generate(model, sp.images, seed=0, batch_size=batch_size, progress=progress,
                        truncation=truncation)  # (N, C', H, W)
        real = sp.components
        n = min(len(sp), SPREAD_SIZE)
        others = [generate(model, sp.images[:n], seed=s, batch_size=batch_size, truncation=truncation)
                  for s in range(1, SPREAD_SEEDS)]
        l1_each, ssim_each = l1_error(fake, real), ssim(fake, real)  # (N,): seed 0's, whose first n are a draw too
        # per draw, the per-image scores of its n pairs: seed 0's are the first n of the whole split's
        l1_draws = [l1_each[:n], *(l1_error(d, real[:n]) for d in others)]
        ssim_draws = [ssim_each[:n], *(ssim(d, real[:n]) for d in others)]
        result = SynthesisResult(l1=l1_each.mean().item(), ssim=ssim_each.mean().item(),
                                 iou=shape_iou(shape_of(fake), shape_of(real)).mean().item(),
                                 spread=noise_spread(torch.stack([fake[:n], *others])).mean().item(),
                                 l1_draws=float(np.mean([x.mean().item() for x in l1_draws])),
                                 ssim_draws=float(np.mean([x.mean().item() for x in ssim_draws])))
        if judge is not None:
            wide = sum_dtype(fake.device)  # float64 (float32 on MPS)
            right = (judge_predictions(judge, fake) == sp.labels).to(wide)  # (N,)
            accuracies = [x.mean().item() for x in
                          [right[:n], *((judge_predictions(judge, d) == sp.labels[:n]).to(wide) for d in others)]]
            result.judge_accuracy = right.mean().item()
            result.judge_accuracy_draws = float(np.mean(accuracies))
            result.judge_accuracy_draws_sd = float(np.std(accuracies, ddof=1))
        return result

    return {"": one(split)} | {name: one(sp) for name, sp in split.extra.items()}


@dataclass
class GeneratedFiles:
    folder: Path
    files: list[Path]
    replaced: list[Path] = field(default_factory=list)  # files of the same names that were there before


def row_noise(model: nn.Module, row: int, seed: int, device: str | torch.device | None = None, *,
              truncation: float | None = None) -> torch.Tensor:
    """Row ``row`` of seed ``seed``'s noise draw, the noise image ``row`` of a generated set gets (``generate``),
    as (1, noise_dim); truncated after the row is taken (truncation works value by value, so this is row ``row``
    of the truncated draw without truncating the rows before it). A model without a noise vector (pix2pix) gives
    (1, 0), and refuses a truncation."""
    z = model.noise(row + 1, seed)[row:]  # (1, Z), drawn on the CPU
    if truncation is not None:
        model.noise(1, 0, truncation=truncation)  # refuses a bad truncation, or one for a model without noise
        z = truncate_normal(z, truncation)
    return z if device is None else z.to(device)


@torch.no_grad()
def samples(model: nn.Module, label: torch.Tensor, seeds: Sequence[int], *, row: int = 0,
            truncation: float | None = None) -> torch.Tensor:
    """One label map's images under each of ``seeds``: image k is ``generate(model, labels, seed=seeds[k])[row]``
    for any ``labels`` whose row ``row`` is ``label`` (so a test pair's images are ``capsnet eval``'s, and row 0
    gives ``capsnet generate``'s for a folder of that one map), made in one batch (the model's mode restored).

    Shapes: label (C, H, W) float in [0, 1] on the model's device -> (len(seeds), C', H, W) in [0, 1].
    """
    if not is_count(row, 0):
        raise ValueError(f"row must be a non-negative integer, got {row!r}")
    if not seeds:
        raise ValueError("give at least one seed")
    if not isinstance(label, torch.Tensor) or label.dim() != 3:  # a batch was told of a (2, 2, 1, 32, 32) one
        got = tuple(label.shape) if isinstance(label, torch.Tensor) else type(label).__name__
        raise ValueError(f"label must be one label map (C, H, W), got {got}"
                         + (": pass one of the batch, labels[i]" if isinstance(label, torch.Tensor)
                            and label.dim() == 4 else ""))
    with evaluating(model):
        labels = label.unsqueeze(0).expand(len(seeds), *label.shape)  # (K, C, H, W)
        z = torch.cat([row_noise(model, row, s, label.device, truncation=truncation) for s in seeds])  # (K, Z)
        if z.shape[1]:  # in eval mode the generator's dropout is off: the seed is the noise vector alone
            return model.generate(labels, z=z.to(label.dtype), seed=0)
        return model.generate(labels, z=z, seeds=[_dropout_seed(s, row) for s in seeds])  # dropout: a stream each


def generate_folder(checkpoint: str | os.PathLike, labels_dir: str | os.PathLike, out: str | os.PathLike, *,
                    seeds: Sequence[int] = (0,), which: str = "best", weights: str = "saved",
                    device: str | torch.device = "cpu",
                    progress: bool = False, truncation: float | None = None) -> GeneratedFiles:
    """Images from the user's label maps (PNG files in ``labels_dir``), one per label map and seed, written as
    ``out/NAME_seedS.png``. Every label map is read and checked against the model first (size, channels: an RGB
    map of three equal channels is grey to a model of grey maps); only then is anything written, each file
    atomically. ``truncation``: the noise truncated to [-t, t] (``generate``);
    ``weights``: the checkpoint's "saved" generator or an averaged run's "training" one (``load_model``).
    A label map holding only 0s and 1s is read as 0/255, as binary training maps are, unless the run trained on
    graded maps (class indices 0..K of a user's pairs:DIR), whose 0s and 1s are read as they are. Every map of
    one seed gets the same noise (``generate(shared=True)``): its image depends on the map, the seed and the model
    alone, whatever else the folder holds."""
    from .checkpoint import write_into
    from .data.idx import DataError
    from .data.png import (_widened, check_out_folder, label_map_array, png_files, refuse_case_twins,
                           scale_binary_label_maps)
    from .evaluate import load_model
    from .models import model_spec

    import numbers

    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Sequence) or not all(
            isinstance(s, numbers.Integral) and not isinstance(s, bool) and 0 <= s < 2**63 for s in seeds):
        # 3 met "'int' object is not iterable", "0" and 1.5 manual_seed's error, -1 wrote a_seed-1.png
        raise ValueError(f"seeds must be a sequence of integers in 0 .. 2**63 - 1, e.g. (0, 1, 2), got {seeds!r}")
    # numpy's integers as Python's, for torch's generators; a seed given twice once (it made and wrote each image
    # twice, and counted it twice: "wrote 6 images" of 3 files)
    seeds = list(dict.fromkeys(int(s) for s in seeds))
    model, ckpt = load_model(checkpoint, which=which, device=device, weights=weights)
    if model_spec(ckpt.model_name).kind != "synthesis":
        raise ValueError(f"{ckpt.path} holds a {ckpt.model_name!r} model; capsnet generate takes a synthesis model "
                         f"(capspix2pix, capspix2pix-deep, pix2pix)")
    if not seeds:
        raise ValueError("give at least one seed")
    model.noise(1, 0, truncation=truncation)  # refuses a bad truncation, or one for a model without noise, early
    check_out_folder(out, labels_dir, written="images", source_flag="--labels", read="label maps",
                     run_data=ckpt.train_config.get("dataset"))
    cfg = model.config
    want = (cfg.in_channels, cfg.input_height, cfg.input_width)
    files = png_files(Path(labels_dir), "label maps", paired=False)
    arrays = {}
    for stem, path in progress_bar(files.items(), desc="read", unit="label map", leave=False, progress=progress):
        a = label_map_array(path)
        if want[0] == 1:  # an RGB map of three equal channels (MS Paint saves grey so) is its grey, as predict reads
            a = _widened(a, 1)  # an image; a colour map (channels differ) stays 3-channel, refused below
        if a.shape != want:
            raise DataError(f"label map {path} is {a.shape[0]}-channel {a.shape[1]}x{a.shape[2]} (HxW), but the model "
                            f"takes {want[0]}-channel {want[1]}x{want[2]} label maps; "
                            + ("resize or pad it" if a.shape[0] == want[0] else
                               f"save it as {'grayscale' if want[0] == 1 else 'RGB'}"))
        arrays[stem] = a
    refuse_case_twins(list(arrays), labels_dir, "images")
    maps = np.stack(list(arrays.values()))  # (N, C, H, W)
    if ckpt.state.get("label_maps") != "graded":  # each 0/1 map as 0/255, as the run's binary maps read (a run on
        maps = np.stack([scale_binary_label_maps(m) for m in maps])  # class indices 0..K reads them as they are)
    device = next(model.parameters()).device
    folder = Path(out)
    stems = list(arrays)
    # All made, then written, a map's image by its seed alone (not its place in the folder). The maps go to float a
    # chunk at a time and each image straight to PNG bytes, so memory holds one chunk's floats and the PNGs, not
    # the whole folder's maps and every seed's images as float32.
    made = {}
    chunk = _FOLDER_BATCH * _FOLDER_CHUNK_BATCHES
    with progress_bar(total=len(seeds) * len(stems), desc="generate", unit="image", leave=False,
                      progress=progress) as bar:
        for start in range(0, len(stems), chunk):
            labels = torch.from_numpy(maps[start:start + chunk]).to(device).float().div_(255.0)
            for s in seeds:
                images = generate(model, labels, seed=s, batch_size=_FOLDER_BATCH, truncation=truncation,
                                  shared=True).cpu()
                for stem, image in zip(stems[start:start + chunk], images):  # named as the map's own file
                    made[folder / f"{files[stem].stem}_seed{s}.png"] = _png_bytes(image)  # (macOS's 'café' too)
                bar.update(len(images))
    written = [folder / f"{files[stem].stem}_seed{s}.png" for s in seeds for stem in stems]  # seed by seed, as ever
    replaced = write_into(folder, {path: made[path] for path in written}, "images", command="generate",
                          progress=progress)
    return GeneratedFiles(folder, written, replaced)


_FOLDER_BATCH = 64  # generate_folder's batch
_FOLDER_CHUNK_BATCHES = 16  # and the batches of label maps it holds as float at once


def _png_bytes(image: torch.Tensor) -> bytes:
    import io

    from PIL import Image

    a = (image.clamp(0, 1) * 255).round().to(torch.uint8).numpy()  # (C, H, W)
    buffer = io.BytesIO()
    Image.fromarray(a[0] if a.shape[0] == 1 else a.transpose(1, 2, 0)).save(buffer, format="PNG")
    return buffer.getvalue()


@dataclass
class SynthesisEvaluation:
    """What ``capsnet eval`` reports for a synthesis checkpoint: its test split scored (see ``evaluate_synthesis``)."""

    checkpoint: Checkpoint
    dataset: str
    pairs: int
    results: dict[str, SynthesisResult]
    judge: str | None = None
    truncation: float | None = None  # the noise's, when truncated (None: the untruncated normal)
    test_files: tuple[str, ...] | None = None  # a user's pairs:DIR: the test split's files, index k the k-th

    def report(self) -> dict:
        ckpt = self.checkpoint
        out = {"checkpoint": pretrained.named(ckpt.path), "model": ckpt.model_name, "epoch": ckpt.state.get("epoch"),
               "saved_at": saved_point(ckpt.state),
               "dataset": self.dataset, "pairs": self.pairs, "judge": self.judge, "truncation": self.truncation,
               "spread_over": {"seeds": SPREAD_SEEDS, "label_maps": min(self.pairs, SPREAD_SIZE)}}
        if self.test_files is not None:  # which files the figures' and --indices' numbers are
            out["test_files"] = list(self.test_files)
        return out | {name or "test": r.as_dict() for name, r in self.results.items()}

    def format(self) -> str:
        ckpt = self.checkpoint
        lines = [f"{checkpoint_said(ckpt)}, {self.dataset} test set, {self.pairs} "
                 f"label maps" + (f", judged by {self.judge}" if self.judge else "")
                 + (f", noise truncated at {self.truncation:g}" if self.truncation is not None else ""),
                 f"{'test set':<10}  {'L1':>7}  {'SSIM':>7}  {'IoU':>7}  {'spread':>7}  judge accuracy"]
        for name, r in self.results.items():
            judged = f"{r.judge_accuracy:.4f}" if r.judge_accuracy is not None else "-"
            lines.append(f"{name or 'test':<10}  {r.l1:7.4f}  {r.ssim:7.4f}  {r.iou:7.4f}  {r.spread:7.4f}  {judged}")
        n = min(self.pairs, SPREAD_SIZE)
        lines.append(f"(noise seed 0 for L1, SSIM, IoU and the judge; spread: per-pixel std over {SPREAD_SEEDS} seeds "
                     f"on the first {n} label maps)")
        lines.append(f"over those {SPREAD_SEEDS} noise draws of the first {n}, the mean: ")
        lines[-1] += "; ".join(f"{name or 'test'} L1 {r.l1_draws:.4f}, SSIM {r.ssim_draws:.4f}" + (
            f", judge accuracy {r.judge_accuracy_draws:.4f} (sd {r.judge_accuracy_draws_sd:.4f} between draws)"
            if r.judge_accuracy_draws is not None else "") for name, r in self.results.items()
            if r.l1_draws is not None)
        return "\n".join(lines)


def judge_for(dataset: str, given: str | os.PathLike | None = None, *, run_dir: str | os.PathLike | None = None
              ) -> str | None:
    """The classifier that reads ``dataset``'s generated images: ``given``; else the judge recorded in ``run_dir``
    (its config.json) when that run was trained on ``dataset``; else the one capsnet ships for ``dataset``; else
    None. A data set without classes (pairs:DIR) has nothing to judge: ``given`` is then refused."""
    from .checkpoint import CONFIG_FIX, read_json_object
    from .data.tasks import task
    from .pretrained import PREFIX, names

    if task(dataset).num_classes < 2:
        if given is not None:
            raise ValueError(f"{dataset} has no classes, so a judge has nothing to compare its reading with; leave "
                             f"--judge out")
        return None
    if given is not None:  # a path made absolute: the run's config.json records it, to resume from anywhere
        return str(given) if str(given).startswith(PREFIX) else str(Path(given).expanduser().resolve())
    saved = Path(run_dir) / "config.json" if run_dir is not None else None
    if saved is not None and saved.is_file():
        recorded = read_json_object(saved, CONFIG_FIX)
        if recorded.get("judge") and (recorded.get("train_config") or {}).get("dataset") == dataset:
            return recorded["judge"]
    # by the images the pairs are made from: MNIST's digits (also the shipped sample's) or Fashion-MNIST's items
    shipped = {"mnist": "capsnet-mnist-small", "mnist-sample": "capsnet-mnist-small",
               "fashion-mnist": "capsnet-fashion-small"}.get(task(dataset).source)
    return PREFIX + shipped if shipped in names() else None


def pairs_misfit(name: str, cfg) -> str | None:
    """What keeps a synthesis model of config ``cfg`` from data set ``name``'s pairs (label maps of another shape,
    images of another channel count), said for the user; None when they fit."""
    from .data.tasks import input_shape, task

    takes = (cfg.in_channels, cfg.input_height, cfg.input_width)
    if input_shape(name) != takes:
        return f"{name} has label maps {input_shape(name)} (C, H, W) but the checkpoint's model takes {takes}"
    if task(name).target_channels != cfg.out_channels:
        return (f"{name} has {task(name).target_channels}-channel images but the checkpoint's model makes "
                f"{cfg.out_channels}-channel ones")
    return None


def evaluate_synthesis_checkpoint(path: str | os.PathLike | Checkpoint, *, which: str = "best",
                                  dataset: str | None = None, test_size: int = 0, judge: str | os.PathLike | None = None,
                                  root: str | os.PathLike | None = None, device: str | torch.device = "cpu",
                                  batch_size: int | None = None, progress: bool = False,
                                  truncation: float | None = None, weights: str = "saved") -> SynthesisEvaluation:
    """Score a synthesis checkpoint on a data set's test pairs (default: the one it was trained on), judged by
    ``judge`` (default: ``judge_for``: the run's own judge for its own data set, else the shipped one, if any);
    ``batch_size``: pairs a pass (None: ``EVAL_BATCH_SIZE``, 64);
    ``truncation``: the noise truncated to [-t, t] (``generate``); ``weights`` as ``capsnet.evaluate.load_model``
    (an averaged run's training generator)."""
    from .data.tasks import check_test_size, load_test, task, trained_dataset
    from .evaluate import load_model, warn_folder_changed

    model, ckpt = load_model(path, which=which, device=device, weights=weights)
    model.noise(1, 0, truncation=truncation)  # refuses a bad truncation, or one for a model without noise, early
    name = dataset or trained_dataset(ckpt.train_config, "mnist-skeleton")
    if dataset is None:
        warn_folder_changed(ckpt, name)
    if task(name).kind != "synthesis":
        raise ValueError(f"{name} is a {task(name).kind} data set but the checkpoint holds a synthesis model "
                         f"({ckpt.model_name}); evaluate it on mnist-skeleton, fashion-silhouette or pairs:DIR")
    if misfit := pairs_misfit(name, model.config):
        raise ValueError(f"{misfit}; evaluate it on data of the shape it was trained on")
    judge = judge_for(name, judge, run_dir=Path(ckpt.path).parent)
    judge_model = load_judge(judge, device=device, dataset=name) if judge is not None else None
    split = load_test(name, size=test_size, root=root, progress=progress).to(next(model.parameters()).device)
    check_test_size(test_size, len(split), name)
    results = evaluate_synthesis(model, split, judge=judge_model, shape=task(name).shape,
                                 batch_size=EVAL_BATCH_SIZE if batch_size is None else batch_size,
                                 progress=progress, truncation=truncation)
    return SynthesisEvaluation(ckpt, name, len(split), results, None if judge is None else str(judge),
                               None if truncation is None else float(truncation), split.names)
