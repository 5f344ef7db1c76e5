"""The user's own classification images: one subfolder of PNG files per class, as torchvision's ImageFolder reads.

``DIR/cat/a.png``, ``DIR/dog/b.png``, ...: each subfolder of ``DIR`` is a class, named by the folder, the classes
numbered in the order of their names (sorted, in one Unicode form). Hidden files and folders are passed over. An
image is grey (1 channel) or RGB (3), read as ``capsnet.data.png.opaque_image_array`` reads a segmentation image
(a transparent one is refused: its alpha would be lost); all images of a folder have one size and channel count.
Every file is read and checked before anything is returned; a problem is a ``DataError`` naming the file and the
fix. Nothing is written.
"""
from __future__ import annotations

import unicodedata
from pathlib import Path

import numpy as np
import torch

from .idx import DataError
from .png import opaque_image_array, png_files, refuse_other_shape

__all__ = ["TEST_FOLDER", "class_folders", "load_class_folder"]

TEST_FOLDER = "test"  # DIR/test holds the held-out images, in class folders of its own (so no class may be "test")


def class_folders(root: Path, *, at_least: int = 2) -> dict[str, Path]:
    """The class subfolders of ``root`` by class name, in class order (sorted names): every visible subfolder but
    ``test`` (the held-out split's). ``at_least``: the fewest classes accepted (a classifier of one class learns
    nothing; a test split may hold fewer classes than training: 1)."""
    if root.exists() and not root.is_dir():
        raise DataError(f"{root} is a file, not a folder; give the folder that holds one subfolder of PNG images "
                        f"per class")
    if not root.is_dir():
        raise DataError(f"{root}: no such folder; give a folder holding one subfolder of PNG images per class "
                        f"(DIR/cat/*.png, DIR/dog/*.png, ...)")
    entries = sorted(p for p in root.iterdir() if not p.name.startswith("."))
    loose = [p for p in entries if p.is_file() and p.suffix.lower() == ".png"]
    if loose:  # images outside every class folder would be left out without a word
        shown = ", ".join(p.name for p in loose[:5]) + (", ..." if len(loose) > 5 else "")
        raise DataError(f"{root} holds {len(loose)} PNG file(s) outside the class folders ({shown}); put each image "
                        f"in the subfolder named by its class (DIR/CLASS/NAME.png)")
    by_name: dict[str, Path] = {}
    for p in entries:
        if not p.is_dir() or (p.name == TEST_FOLDER and root.name != TEST_FOLDER):
            continue
        name = unicodedata.normalize("NFC", p.name)
        if name.casefold() in {n.casefold() for n in by_name}:
            other = next(n for n in by_name if n.casefold() == name.casefold())
            raise DataError(f"{root} holds class folders {other}/ and {p.name}/, names that differ in case alone; "
                            f"merge or rename one of them")
        by_name[name] = p
    if len(by_name) < at_least:
        found = f"only the class folder {next(iter(by_name))}/" if by_name else "no class folders"
        raise DataError(f"{root} holds {found}; a classifier needs at least {at_least} classes: put each class's "
                        f"PNG images in a subfolder named by the class (DIR/cat/*.png, DIR/dog/*.png, ...)")
    return dict(sorted(by_name.items()))


def load_class_folder(root: str | Path, classes: tuple[str, ...] | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor, list[str], tuple[str, ...]]:
    """Every image of ``root``'s class folders, checked (see the module docstring).

    ``classes``: the class names the labels index (a test folder's images are numbered by the training folder's
    classes; it may hold fewer, never others); None: ``root``'s own class folders.

    Shapes: -> images (N, C, H, W) uint8, labels (N,) int64, names: the N files as ``CLASS/FILE.png`` in class and
    file-name order, and the class names.
    """
    root = Path(root)
    found = class_folders(root, at_least=1 if classes is not None else 2)
    classes = tuple(found) if classes is None else tuple(classes)
    others = sorted(set(found) - set(classes))
    if others:
        raise DataError(f"{root} holds class folder(s) {', '.join(others)} that the training images have no folder "
                        f"for (its classes: {', '.join(classes)}); give the test images the training images' class "
                        f"folders, or add those classes' images for training")
    images: list[np.ndarray] = []
    labels: list[int] = []
    names: list[str] = []
    first: Path | None = None
    for name, folder in found.items():
        for stem, path in sorted(png_files(folder, f"images of class {name!r}", paired=False).items()):
            a = opaque_image_array(path)
            if images:
                refuse_other_shape(a, path, images[0], first, "images", " (the classifiers here are made for small "
                                   "images, 28x28 to 32x32: CapsNet's weights grow with the image's area)")
            first = first or path
            images.append(a)
            labels.append(classes.index(name))
            names.append(f"{folder.name}/{path.name}")
    return torch.from_numpy(np.stack(images)), torch.tensor(labels, dtype=torch.long), names, classes
