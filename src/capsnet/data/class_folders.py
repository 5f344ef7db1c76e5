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

from .._text import told_apart
from .idx import DataError
from .png import _utf8, opaque_image_array, png_files, refuse_other_shape

__all__ = ["TEST_FOLDER", "class_folders", "load_class_folder", "nested_image_folders", "passed_over_folder",
           "refuse_unknown_classes"]

TEST_FOLDER = "test"  # DIR/test holds the held-out images, in class folders of its own (so no class may be "test")
# photos of other formats or sizes: the command that makes them into such a folder
PREPARE_FIX = "make the folder from the photos with capsnet prepare --images PHOTOS --out DIR --size N [--mode grey] " \
              "(any format and size in; PNG files of one size out)"


def passed_over_folder(name: str) -> bool:
    """Whether a subfolder ``name`` is passed over as no class: hidden (.git, .ipynb_checkpoints), or the
    ``__MACOSX`` folder of a zip made on a Mac (its ._*.jpg are metadata, not images)."""
    return name.startswith(".") or name == "__MACOSX"


def refuse_test_twin(root: Path, what: str) -> None:
    """A DataError where ``root`` (a user's folder:DIR, pairs:DIR or classes:DIR) holds its held-out split as Test/
    or TEST/, not test/: Linux's disks passed it over without a word (the split then hashed out of the training files,
    or, in classes:DIR, read as a class named Test) where macOS's and Windows' read it as test/ (a bug hunt,
    2026-12-05). ``what``: what the split holds, for the message."""
    if not root.is_dir():
        return
    twin = next((p.name for p in sorted(root.iterdir()) if p.name != TEST_FOLDER and p.name.casefold() == TEST_FOLDER
                 and p.is_dir()), None)
    if twin is not None:
        raise DataError(f"{root} holds {twin}/, where capsnet reads a held-out split from {TEST_FOLDER}/ (the "
                        f"lower-case name, on every system alike): rename it {TEST_FOLDER}/ if it holds the test "
                        f"{what}, else give it another name")


def class_folders(root: Path, *, at_least: int = 2, test_split: bool = False) -> dict[str, Path]:
    """The class subfolders of ``root`` by class name, in class order (sorted names): every visible subfolder but
    ``test`` (the held-out split's) and a Mac zip's ``__MACOSX``. ``at_least``: the fewest classes accepted (a
    classifier of one class learns nothing). ``test_split``: ``root`` is a DIR/test folder (it may hold fewer classes
    than training, at least one)."""
    if root.exists() and not root.is_dir():
        raise DataError(f"{root} is a file, not a folder; give the folder that holds one subfolder of PNG images "
                        f"per class")
    if not root.is_dir():
        raise DataError(f"{root}: no such folder; give a folder holding one subfolder of PNG images per class "
                        f"(DIR/cat/*.png, DIR/dog/*.png, ...)")
    if not test_split:
        refuse_test_twin(root, "images, in class folders of their own")
    entries = sorted(p for p in root.iterdir() if not p.name.startswith("."))
    loose = [p for p in entries if p.is_file() and p.suffix.lower() == ".png"]
    if loose:  # images outside every class folder would be left out without a word
        shown = ", ".join(p.name for p in loose[:5]) + (", ..." if len(loose) > 5 else "")
        raise DataError(f"{root} holds {len(loose)} PNG file(s) outside the class folders ({shown}); put each image "
                        f"in the subfolder named by its class (DIR/CLASS/NAME.png)")
    by_name: dict[str, Path] = {}
    for p in entries:
        if not p.is_dir() or (p.name == TEST_FOLDER and not test_split) or passed_over_folder(p.name):
            continue
        if not _utf8(p.name):  # bytes that are not UTF-8 (a Latin-1 name from an old zip file): the class's name
            raise DataError(f"{root} holds a class folder whose name is not UTF-8: {ascii(p.name)}; rename it (e.g. "
                            f"convmv -f latin1 -t utf-8, or by hand)")
        name = unicodedata.normalize("NFC", p.name)
        if name.casefold() in {n.casefold() for n in by_name}:
            other = next(n for n in by_name if n.casefold() == name.casefold())
            how = "in case alone" if other != name else \
                "in their Unicode form alone (composed and decomposed accents, as macOS and Linux may write one name)"
            raise DataError(f"{root} holds class folders {by_name[other].name}/ and {p.name}/, names that differ "
                            f"{how}; merge or rename one of them")
        by_name[name] = p
    if not by_name and test_split:  # an empty test/: which the user meant is theirs to say
        raise DataError(f"{root} holds no class folders; put the test images in {root}/CLASS (the training images' "
                        f"class folders), or remove the empty {root.name}/ to hold about a fifth of each class out "
                        f"by file name")
    if len(by_name) < at_least:
        found = f"only the class folder {next(iter(by_name))}/" if by_name else "no class folders"
        raise DataError(f"{root} holds {found}; a classifier needs at least {at_least} classes: put each class's "
                        f"PNG images in a subfolder named by the class (DIR/cat/*.png, DIR/dog/*.png, ...)")
    return dict(sorted(by_name.items()))


def nested_image_folders(folder: Path, suffixes: set[str]) -> list[str]:
    """The visible subfolders of ``folder`` holding, at any depth, a visible file whose suffix is one of
    ``suffixes``: images that a loader of ``folder``'s own files would leave out (hidden files and folders passed
    over, as everywhere: macOS's ._*.png)."""
    return sorted(d.name for d in folder.iterdir() if d.is_dir() and not passed_over_folder(d.name) and any(
        f.suffix.lower() in suffixes and not any(part.startswith(".") for part in f.relative_to(d).parts)
        for f in d.rglob("*")))


def refuse_unknown_classes(root: Path, found, classes) -> None:
    """A DataError when ``root`` (a DIR/test folder) holds class folders ``found`` that the training ``classes``
    lack: a test image of a class the model never learned."""
    if others := sorted(set(found) - set(classes)):
        raise DataError(f"{root} holds class folder(s) {', '.join(told_apart(others, classes))} that the training "
                        f"images have no folder for (its classes: {', '.join(told_apart(classes, others))}); give the "
                        f"test images the training images' class folders, or add those classes' images for training")


def load_class_folder(root: str | Path, classes: tuple[str, ...] | None = None, *, test_split: bool = False
                      ) -> tuple[torch.Tensor, torch.Tensor, list[str], tuple[str, ...]]:
    """Every image of ``root``'s class folders, checked (see the module docstring).

    ``classes``: the class names the labels index (a test folder's images are numbered by the training folder's
    classes; it may hold fewer, never others); None: ``root``'s own class folders. ``test_split``: ``root`` is a
    DIR/test folder (``class_folders``).

    Shapes: -> images (N, C, H, W) uint8, labels (N,) int64, names: the N files as ``CLASS/FILE.png`` in class and
    file-name order, and the class names.
    """
    root = Path(root)
    found = class_folders(root, at_least=1 if test_split else 2, test_split=test_split)
    classes = tuple(found) if classes is None else tuple(classes)
    refuse_unknown_classes(root, found, classes)
    images: list[np.ndarray] = []
    labels: list[int] = []
    names: list[str] = []
    first: Path | None = None
    for name, folder in found.items():
        # torchvision's ImageFolder reads them; left out here they would shrink the class without a word
        if nested := nested_image_folders(folder, {".png"}):
            raise DataError(f"{folder} holds subfolder(s) of PNG files ({', '.join(nested[:5])}), which are not "
                            f"read; move their images into {folder} itself (or make a subfolder a class of its own, "
                            f"beside {folder.name}/)")
        for stem, path in sorted(png_files(folder, f"images of class {name!r}", paired=False,
                                           convert=PREPARE_FIX).items()):
            a = opaque_image_array(path)
            if images:
                refuse_other_shape(a, path, images[0], first, "images", f" ({PREPARE_FIX}, N the side of "
                                   f"a trained model's input, or 28 to 32 for a new one)")
            first = first or path
            images.append(a)
            labels.append(classes.index(name))
            names.append(f"{name}/{unicodedata.normalize('NFC', path.name)}")  # one Unicode form, as the
            # held-out split hashes it: a folder copied from macOS (decomposed) to Linux keeps its split
    return torch.from_numpy(np.stack(images)), torch.tensor(labels, dtype=torch.long), names, classes
