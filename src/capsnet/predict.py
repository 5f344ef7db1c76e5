"""A trained classifier or segmentation model applied to the user's own PNG images (``capsnet predict``).

- A classifier reads every PNG of the folder at its input size and channel count (with ``fit``, ``--fit crop|pad``:
  every image Pillow opens, of any size and mode, fitted to its input as ``capsnet prepare`` fits photos; the fit
  ``capsnet prepare`` recorded, when the classifier trained on a folder it made and no fit is given), and writes
  ``OUT/predictions.csv``: each file's predicted class (its name where the data set names its classes), that class's
  score and every class's score, the scores ``capsnet eval`` ranks the classes by (capsule lengths, EM activations,
  the CNN's softmax probabilities).
- A segmentation model reads every PNG of its channel count at any size whose sides are multiples of its stride
  (SegCaps: 8), and writes each file's mask as ``OUT/NAME.png`` (0/255, where the foreground probability exceeds the
  threshold) and, when asked, its probabilities as ``OUT/NAME_probability.png`` (probability x 255). It was trained at
  its run's size; other sizes run because the network is convolutional.

Every image is read and checked, and every prediction made, before anything is written; each file is written
atomically. Synthesis models make images with ``capsnet generate``.
"""
from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TypeVar

import numpy as np
import torch

from ._numbers import is_count
from ._progress import progress_bar
from .checkpoint import Checkpoint, write_into
from .routing.result import check_switch
from .data.idx import DataError
from .data import photos
from .data.png import (_IMAGE_MODES, _image_array, _widened, check_out_folder, opaque_image_array, png_files,
                       refuse_case_twins, transparent_share)
from .data.tasks import PREPARED, saved_folder, task, trained_classes, user_folder
from .evaluate import eval_batch, load_model, pixel_batch
from .models import model_spec

__all__ = ["Predictions", "predict_folder", "PREDICTIONS_FILE"]

PREDICTIONS_FILE = "predictions.csv"  # a classifier's output in --out
_CHANNELS = {1: "grayscale", 3: "RGB"}


@dataclass
class Predictions:
    """What ``predict_folder`` wrote: the folder, the files (the CSV, or one mask per image, and the probability
    images when asked), those of the same names it replaced, and one row per image (a classifier: file, predicted,
    class, score, and every class's score; a segmentation model: file, height, width, the foreground's share of the
    pixels and the mean foreground probability)."""

    kind: str  # "classification" or "segmentation"
    folder: Path
    files: list[Path]
    rows: list[dict] = field(default_factory=list)
    replaced: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the user may want to know (images unlike the training set)


T = TypeVar("T")


def _read(images_dir: Path, channels: int, size: tuple[int, int] | None, styled: bool = False,
          styleable: bool = False, progress: bool = False, fit: str | None = None, fittable: bool = False,
          notes: list[str] | None = None,
          kept: set[str] | None = None) -> tuple[dict[str, np.ndarray], dict[str, Path]]:
    """Every PNG of ``images_dir`` by stem, (C, H, W) uint8, checked: ``channels`` channels and, for a classifier,
    the ``size`` (H, W) it takes; and the files by stem. ``styled``: every image Pillow opens, each made as MNIST
    was, at ``size``, whatever its own size (``capsnet.data.photos.mnist_style``; 8-bit, as MNIST's images are);
    ``styleable``: a wrong size's message points to --mnist-style (a model trained on MNIST's digits). ``fit`` ("crop" or "pad"): every image
    Pillow opens (JPEG, PNG, WebP, ...), of any size, fitted to ``size`` as ``capsnet prepare`` fits photos
    (``capsnet.data.prepare.fit_image``), in ``channels``' mode, the files passed over (not images) said in
    ``notes``, and the stems of those the fit left as they were (``_as_it_is``) added to ``kept``; ``fittable``:
    --fit would apply (a classifier, not --mnist-style), so a refusal of other formats or sizes names it."""
    if fit is not None or styled:  # photos and scans of any format Pillow opens (--mnist-style took PNG alone)
        from .data.prepare import fit_array, heic_hint, image_files, open_turned, passed_over

        if not Path(images_dir).is_dir():
            raise DataError(f"{images_dir}: no such folder; give the folder of images to classify (--images)")
        files, others = image_files(Path(images_dir), by_name=True)
        if not files:
            raise DataError(f"no image files Pillow opens in {images_dir}{heic_hint(others)}; put the images to "
                            f"classify there")
        if others and notes is not None:
            notes.append(passed_over(others, show=lambda p: p.name))
        mode, fitted = "grey" if channels == 1 else "rgb", {}
        for stem, path in progress_bar(files.items(), desc="read", unit="image", leave=False, progress=progress):
            # decoded once (a large JPEG at a reduced scale, not for --mnist-style's own shrink to its working
            # size): fitted, and compared with what the fit made of it
            img = open_turned(path, None if styled else max(size))
            if styled:
                fitted[stem] = _styled(img, path, channels, size)
                continue
            fitted[stem] = fit_array(img, *size, mode, fit, str(path))
            if kept is not None and _as_it_is(img, path, fitted[stem]):
                kept.add(stem)
        return fitted, files
    try:
        arrays, paths = {}, png_files(images_dir, "images", paired=False)
    except DataError as e:  # JPEG or WebP photos beside the PNGs, or in their place: --fit reads them
        if fittable and ("not PNG" in str(e) or "other file(s)" in str(e)):
            raise DataError(f"{e}; or give --fit crop or pad, which reads every format Pillow opens") from None
        raise
    # a bar: 300 photos took 65 s to read with nothing shown
    for stem, path in progress_bar(paths.items(), desc="read", unit="image", leave=False, progress=progress):
        # alpha refused, not dropped: a shape held in the transparency alone read as a blank image, scored anyway
        try:
            a = opaque_image_array(path, "image", " (or, a digit drawn on a transparent canvas: --mnist-style lays it "
                                                  "on a background as MNIST's digits were made)" if styleable else "")
        except DataError as e:  # a JPEG named .png: --fit reads it as it is
            if fittable and "not a PNG" in str(e):
                raise DataError(f"{e}; or give --fit crop or pad, which reads every format Pillow opens") from None
            if fittable and "(16/32-bit)" in str(e):  # --fit reads those as capsnet prepare does
                raise DataError(f"{e}, or give --fit crop or pad, which reads 16-bit and float grey") from None
            raise
        a = _widened(a, channels)
        if a.shape[0] != channels:
            raise DataError(f"image {path} is {_CHANNELS.get(a.shape[0], a.shape[0])} but the model takes "
                            f"{_CHANNELS.get(channels, channels)} images; save it as {_CHANNELS.get(channels)}")
        if size is not None and a.shape[1:] != size:
            raise DataError(f"image {path} is {a.shape[1]}x{a.shape[2]} (HxW) but the classifier takes "
                            f"{size[0]}x{size[1]} images; resize or crop it to that size"
                            + (", or give --fit crop (or pad) to fit each image as capsnet prepare does"
                               if fittable else "")
                            + (" (or, a photo or scan of one digit: --mnist-style makes it as MNIST was made)"
                               if styleable else ""))
        arrays[stem] = a
    return arrays, paths


def _styled(img, path: Path, channels: int, size: tuple[int, int]) -> np.ndarray:
    """The PIL image ``img`` of ``path`` made as MNIST was made (``photos.mnist_style``), (C, H, W) uint8."""
    try:
        x = photos.mnist_style(img, (channels, *size))
    except DataError as e:  # named once (a message naming the file already said "image F: F is too large")
        raise DataError(str(e) if str(path) in str(e) else f"image {path}: {e}") from None
    return x.mul(255).round_().to(torch.uint8).numpy()


def _as_it_is(img, path: Path, fitted: np.ndarray) -> bool:
    """Whether ``fitted`` (the PIL image ``img`` of ``path`` fitted as capsnet prepare fits photos) holds its own
    pixels, as predict reads a PNG of the model's size and mode without a fit: not resized, converted or flattened
    (a JPEG of that size and mode too: its pixels are what it decodes to)."""
    if img.mode not in _IMAGE_MODES or transparent_share(img, path):  # transparency: flattened onto black
        return False
    try:
        plain = _widened(_image_array(img, path), fitted.shape[0])
    except DataError:  # a 16-bit colour PNG, read by its high bytes
        return False
    return plain.shape == fitted.shape and np.array_equal(plain, fitted)


@torch.no_grad()
def _classify(model: torch.nn.Module, ckpt: Checkpoint, arrays: dict[str, np.ndarray],
              paths: dict[str, Path], batch_size: int, progress: bool) -> list[dict]:
    """Each file's class and every class's score, the classes named as the run that trained it names them."""
    loss = model_spec(ckpt.model_name).loss
    dev = next(model.parameters()).device
    x = torch.from_numpy(np.stack(list(arrays.values()))).float().div_(255.0)  # (N, C, H, W)
    scores = []
    for start in progress_bar(range(0, len(x), batch_size), desc="classify", unit="batch", leave=False,
                              progress=progress):
        batch = x[start:start + batch_size].to(dev)
        # the registry's loss gives every classifier's class scores; the labels only weigh the loss, unused here
        scores.append(loss(model, batch, torch.zeros(len(batch), dtype=torch.long, device=dev),
                           recon_weight=0.0)[1].float().cpu())
    scores_ = torch.cat(scores)  # (N, K)
    _refuse_not_finite((~torch.isfinite(scores_)).any(1), [paths[s] for s in arrays], "class scores")
    names = trained_classes(ckpt.train_config, ckpt.state)  # a registered set's, or the class folders recorded
    K = scores_.shape[1]
    names = names if names is not None and len(names) == K else tuple(str(k) for k in range(K))
    rows = []
    for stem, s in zip(arrays, scores_.tolist()):
        k = max(range(K), key=s.__getitem__)
        rows.append({"file": paths[stem].name, "predicted": k, "class": names[k], "score": s[k]}
                    | {f"score_{names[j]}": s[j] for j in range(K)})
    return rows


@torch.no_grad()
def _segment(model: torch.nn.Module, arrays: dict[str, np.ndarray], paths: dict[str, Path], batch_size: int,
             progress: bool, made: Callable[[str, np.ndarray], T]) -> dict[str, T]:
    """``made(stem, probabilities)`` of each image's foreground probabilities (H, W) float32, called as each batch
    is done (what it keeps, not the float maps, is held until the end: the maps of 10,000 512x512 scans were 10 GB);
    images of one size go through together, as many at a time as the model's evaluation batch holds at its
    training size (a 512x512 image is 64 of 64x64)."""
    dev = next(model.parameters()).device
    by_size: dict[tuple[int, ...], list[str]] = {}
    for stem, a in arrays.items():
        by_size.setdefault(a.shape[1:], []).append(stem)
    out: dict[str, T] = {}
    bad: set[str] = set()  # images whose probabilities are not finite: the whole folder's, named once all have run
    bar = progress_bar(total=len(arrays), desc="segment", unit="image", leave=False, progress=progress)
    try:
        for (H, W), stems in by_size.items():
            per_batch = pixel_batch(model, eval_batch(model, batch_size), H, W)
            for start in range(0, len(stems), per_batch):
                chunk = stems[start:start + per_batch]
                x = torch.from_numpy(np.stack([arrays[s] for s in chunk])).float().div_(255.0).to(dev)
                try:
                    p = model(x).probabilities  # (b, 1, H, W)
                except ValueError as e:  # the model's own check of the size (sides multiples of its stride)
                    raise DataError(f"image {paths[chunk[0]]} cannot be segmented: {e}") from None
                except RuntimeError as e:  # torch.OutOfMemoryError too (a RuntimeError)
                    if not _out_of_memory(e):
                        raise
                    raise DataError(f"image {paths[chunk[0]]} ({H}x{W}, HxW) needs more memory than this device can "
                                    f"give ({str(e).splitlines()[0][:160]}); crop it into smaller tiles or scale it "
                                    f"down, or predict on a device with more memory (--device)") from None
                probs = p[:, 0].float().cpu()
                finite = torch.isfinite(probs.flatten(1)).all(1).tolist()
                bad.update(s for s, ok in zip(chunk, finite) if not ok)
                for s, prob, ok in zip(chunk, probs.numpy(), finite):
                    if ok:  # NaN cast to 8 bits is undefined (numpy warns): not made, refused below
                        out[s] = made(s, prob)
                bar.update(len(chunk))
    finally:
        bar.close()
    if bad:
        _refuse_not_finite(torch.tensor([s in bad for s in arrays]), [paths[s] for s in arrays], "probabilities")
    return {s: out[s] for s in arrays}  # the folder's order


def _refuse_not_finite(bad: torch.Tensor, files: list[Path], what: str) -> None:
    """A ValueError, before anything is written, where ``bad`` (bool, one per file of ``files``) says a file's
    outputs hold NaN or infinity: a diverging run's weights, whose NaN scores were written as class 0 (argmax) and
    NaN probabilities as masks of undefined values (a cast of NaN to 8 bits)."""
    if bad.any():
        first = files[int(bad.nonzero()[0])]
        raise ValueError(f"the model's {what} are NaN or infinite for {int(bad.sum())} of {len(files)} images (the "
                         f"first: {first}): its weights overflow, as a diverging run's do; predict with an earlier "
                         f"checkpoint, or train again with a lower --lr")


def _out_of_memory(e: RuntimeError) -> bool:
    """Whether ``e`` is an allocation that failed (the CPU allocator's message, or CUDA's / MPS's out of memory)."""
    text = str(e).lower()
    oom = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)  # torch's own from 2.4, CUDA's before
    return isinstance(e, oom) or "can't allocate memory" in text or "out of memory" in text


def _png_bytes(a: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(a).save(buffer, format="PNG")
    return buffer.getvalue()


def predict_folder(checkpoint: str | os.PathLike | Checkpoint, images_dir: str | os.PathLike,
                   out: str | os.PathLike, *, which: str = "best", weights: str = "saved",
                   device: str | torch.device = "cpu",
                   threshold: float | None = None, probabilities: bool = False, batch_size: int = 64,
                   progress: bool = False, mnist_style: bool = False, fit: str | None = None) -> Predictions:
    """Apply the model of ``checkpoint`` (a run directory, a .safetensors file, pretrained:NAME or a Checkpoint
    read; ``weights`` its "saved" weights or an averaged run's "training" ones, ``load_model``) to every PNG image
    in ``images_dir`` and write the results into ``out`` (see the module docstring).
    ``threshold``: a segmentation mask's cut on the foreground probability (None: ``capsnet eval``'s 0.5);
    ``probabilities``: also write each image's probabilities; ``mnist_style`` (a classifier trained on MNIST's 28x28
    digits): each image, of any size, made as MNIST was made (a photo or scan of one digit: dark ink on light paper
    inverted, its box scaled to 20x20, centred by its centre of mass in the 28x28 field). ``fit`` ("crop" or "pad",
    a classifier): every image Pillow opens (JPEG, WebP, ...), of any size, fitted to the model's input as
    ``capsnet prepare`` fits photos; a classifier trained on a folder ``capsnet prepare`` made fits them as it made
    the folder unless told otherwise (the fit it recorded; a note names the images it changed). A problem with an
    image is a DataError naming it, raised before anything is written."""
    if threshold is not None and not (isinstance(threshold, (int, float)) and 0.0 < threshold < 1.0):
        raise ValueError(f"threshold must lie strictly between 0 and 1, got {threshold!r}")
    if not is_count(batch_size):
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    for name, value in (("probabilities", probabilities), ("progress", progress), ("mnist_style", mnist_style)):
        check_switch(name, value)  # "no" read as True: refused as a flag the user had left out
    model, ckpt = load_model(checkpoint, which=which, device=device, weights=weights)
    kind = model_spec(ckpt.model_name).kind
    if kind == "synthesis":
        raise ValueError(f"{ckpt.path} holds a synthesis model ({ckpt.model_name}); it makes images from label maps: "
                         f"use capsnet generate")
    if probabilities and kind != "segmentation":
        raise ValueError(f"--probabilities are written for segmentation models; {ckpt.model_name} is a classifier, "
                         f"whose scores are all in {PREDICTIONS_FILE}: leave --probabilities out")
    if threshold is not None and kind != "segmentation":  # accepted and ignored before (0.5, the default, still)
        raise ValueError(f"--threshold cuts a segmentation model's probabilities into masks; {ckpt.model_name} is a "
                         f"classifier, which names the class of highest score: leave --threshold out")
    threshold = 0.5 if threshold is None else threshold
    dataset = ckpt.train_config.get("dataset", "mnist")  # a user's folder is not read: it may be elsewhere by now
    trained_on = (dataset if user_folder(dataset) else task(dataset).source) if kind == "classification" else None
    if trained_on in PREPARED:  # its test images are not the pixels / 255: they would be scored wrong
        raise ValueError(f"{ckpt.model_name} trained on {trained_on}, whose images the model takes "
                         f"{PREPARED[trained_on]}; capsnet predict reads PNG pixels / 255 only, so it would score them "
                         f"wrong: use capsnet eval, or the model in Python on images prepared as capsnet.data.tasks "
                         f"prepares {trained_on}'s")
    folder, source = Path(out), Path(images_dir)
    check_out_folder(folder, source, written="predictions", source_flag="--images", read="images", run_data=dataset)
    model.eval()
    segmenting = kind == "segmentation"
    from .data.prepare import FITS

    if fit is not None:
        if fit not in FITS:
            raise ValueError(f"fit must be one of {', '.join(FITS)}, got {fit!r}")
        if segmenting or mnist_style:
            raise ValueError(f"--fit fits each image to a classifier's input; {ckpt.model_name} segments images of "
                             f"any size as they are: leave --fit out" if segmenting else
                             "--fit and --mnist-style each make an image of the model's size: give one of them")
    if mnist_style and segmenting:
        raise ValueError(f"--mnist-style makes one digit or item as MNIST was made; {ckpt.model_name} segments whole "
                         f"scenes, read as they are: leave it out")
    cfg = model.config
    as_mnist = trained_on in ("mnist", "mnist-sample") and (cfg.in_channels, cfg.input_height, cfg.input_width) == (
        1, 28, 28)  # MNIST's own digits: 28x28, each in a 20x20 box, centred by its centre of mass
    if mnist_style and not as_mnist:
        size = f"{cfg.in_channels}x{cfg.input_height}x{cfg.input_width}"
        raise ValueError(f"--mnist-style makes images as MNIST's 28x28 digits were made (each in a 20x20 box); "
                         f"{ckpt.model_name} trained on {trained_on} at {size}, whose images are made otherwise"
                         + (" (a Fashion-MNIST item fills its frame)" if trained_on == "fashion-mnist" else "")
                         + ": give images as that data set's are, without --mnist-style")
    notes: list[str] = []
    prepared = saved_folder(ckpt.state).get("prepared_fit")
    auto_fit = fit is None and prepared in FITS and not segmenting and not mnist_style  # the fit it trained on
    fit = prepared if auto_fit else fit
    kept: set[str] = set()  # the images of the model's size and mode: their pixels as they were, fit or not
    arrays, paths = _read(source, cfg.in_channels, None if segmenting else (cfg.input_height, cfg.input_width),
                          styled=mnist_style, styleable=as_mnist, progress=progress, fit=fit,
                          fittable=not segmenting and not mnist_style, notes=notes, kept=kept)
    if auto_fit:  # said where it changed an image
        other = [paths[stem].name for stem in arrays if stem not in kept]
        if other:
            shown = ", ".join(other[:3]) + (", ..." if len(other) > 3 else "")
            mode = "grey" if cfg.in_channels == 1 else "RGB"
            notes.append(f"{len(other)} of {len(paths)} images ({shown}) were fitted to the model's "
                         f"{cfg.input_height}x{cfg.input_width} {mode} input by --fit {fit} (resized, converted or "
                         f"their transparency flattened onto black), as capsnet prepare made the folder it trained "
                         f"on (give --fit to choose)")
    if kind == "classification" and dataset == "multimnist":  # its digits come in pairs; eval scores the top two
        notes.append(f"{ckpt.model_name} trained on MultiMNIST, two overlapping digits an image: the predicted class "
                     f"is the highest score alone; the second digit is the class of the second-highest score (the "
                     f"score_* columns of {PREDICTIONS_FILE}), as capsnet eval's top-2 reads them")
    if as_mnist and not mnist_style:
        light = [paths[s].name for s, a in arrays.items() if photos.light_background(a[0], padded=fit == "pad")]
        if 2 * len(light) >= len(arrays):  # MNIST's images are light on a black ground
            shown = ", ".join(light[:3]) + (", ..." if len(light) > 3 else "")
            notes.append(f"{len(light)} of {len(arrays)} images ({shown}) are dark on a light background, unlike the "
                         f"{trained_on} images {ckpt.model_name} trained on (light on black); --mnist-style makes "
                         f"each as MNIST was made (inverted, scaled and centred)")
    # NAME_probability.png of one image would be written over the mask of another (told apart by case alone on
    # macOS's and Windows' file systems, as two masks are)
    folded = {stem.casefold(): stem for stem in arrays}
    clash = sorted((stem, folded[f"{stem}_probability".casefold()]) for stem in arrays
                   if f"{stem}_probability".casefold() in folded) if probabilities else []
    if clash:
        stem, other = clash[0]
        raise DataError(f"{source} holds both {stem}.png and {other}.png: the first's probabilities would be written "
                        f"over the second's mask; rename {other}.png or leave out the probabilities")
    if segmenting:  # a classifier writes one predictions.csv
        refuse_case_twins(list(arrays), source, "outputs")
    written: dict[Path, bytes] = {}
    if segmenting:
        def made(stem: str, p: np.ndarray) -> tuple[dict[Path, bytes], dict]:  # as each batch is done
            mask = p > threshold
            own = paths[stem].stem  # the image's own name: macOS's decomposed 'café' stays so (stem is composed)
            files = {folder / f"{own}.png": _png_bytes(mask.astype(np.uint8) * np.uint8(255))}
            if probabilities:
                files[folder / f"{own}_probability.png"] = _png_bytes(np.round(p * 255).astype(np.uint8))
            return files, {"file": paths[stem].name, "height": p.shape[0], "width": p.shape[1],
                           "foreground": float(mask.mean()), "mean_probability": float(p.mean())}

        rows = []
        for files, row in _segment(model, arrays, paths, batch_size, progress, made).values():
            written |= files
            rows.append(row)
    else:
        rows = _classify(model, ckpt, arrays, paths, eval_batch(model, batch_size), progress)
        text = io.StringIO()
        # a field holding a carriage return is quoted by no minimal rule under "\n" lines: a file named so split its
        # row in two for every reader; such a file (rare) has every field quoted, which every reader reads
        odd = any("\r" in v for r in rows for v in (*r, *r.values()) if isinstance(v, str))
        writer = csv.DictWriter(text, fieldnames=list(rows[0]), lineterminator="\n",
                                quoting=csv.QUOTE_ALL if odd else csv.QUOTE_MINIMAL)
        writer.writeheader()
        writer.writerows({k: f"{v:.6f}" if isinstance(v, float) else v for k, v in r.items()} for r in rows)
        written[folder / PREDICTIONS_FILE] = text.getvalue().encode()
    replaced = write_into(folder, written, "files", command="predict", progress=progress)
    return Predictions(kind, folder, list(written), rows, replaced, notes)
