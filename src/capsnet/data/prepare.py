"""Photos made into what ``--dataset classes:DIR`` reads: PNG files of one size and mode (``capsnet prepare``).

``SRC/CLASS/*`` (and ``SRC/test/CLASS/*``, if there) may hold images of any size in any format Pillow reads (JPEG,
PNG, BMP, WebP, TIFF, GIF's first frame, ...). Each is turned as its EXIF orientation says, its transparency
flattened onto black, converted to grey or RGB (``mode``), fitted to ``size`` x ``size`` and written as
``OUT/CLASS/STEM.png`` (``OUT/test/CLASS/...``):

- ``fit="crop"`` (the default): scaled so its shorter side is the size, then the centre cut out (as torchvision's
  Resize + CenterCrop);
- ``fit="pad"``: scaled so its longer side is the size, then centred on black (nothing cut off).

Scaling is Lanczos-filtered (anti-aliased when it shrinks). Hidden files are passed over, and files that are not
images (a notes.txt) are named in the result, not read. Two files of one stem in a class folder (a.jpg and a.png)
would be one PNG and are refused, as is a file Pillow cannot read; the folder is written under a temporary name
(one image at a time) and renamed when whole, so ``OUT`` is complete or absent, whatever stops the run. ``OUT``
must be new or an empty folder.
"""
from __future__ import annotations

import errno
import functools
import hashlib
import json
import os
import shutil
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .._numbers import is_int
from .._text import some_of
from .idx import DataError
from .photos import eight_bit as _eight_bit

__all__ = ["MODES", "FITS", "HEIC", "RECORD", "Prepared", "prepare_class_folders", "fit_image", "fit_array", "fit_pil",
           "open_turned", "image_files", "passed_over", "heic_hint", "prepared_fit"]

MODES = {"grey": "L", "rgb": "RGB"}
_INSIDE = ".capsnet-prepare"  # the partial folder's name inside an empty folder given (then .tmp-PID-START-dir)
RECORD = ".capsnet-prepare.json"  # in the folder written: its size, mode and fit (``prepared_fit`` reads it)
FITS = ("crop", "pad")


@dataclass
class Prepared:
    """What ``prepare_class_folders`` wrote: the folder, the images per split ("train", "test"), the classes, and
    the files passed over as not images."""

    out: Path
    counts: dict[str, int]
    classes: tuple[str, ...]
    skipped: list[Path] = field(default_factory=list)


HEIC = (".heic", ".heif")  # phones' photos: Pillow reads them once pillow-heif registers its opener


@functools.cache
def _image_suffixes() -> frozenset[str]:
    """The file suffixes of the formats Pillow opens and reads the pixels of (.jpg, .png, .webp, ...; not those it
    only writes: .pdf; nor those it only recognises: HDF5, GRIB, BUFR and WMF's stubs, MPEG, and EPS where
    Ghostscript is missing, which stopped a whole prepare as "not a readable image"), HEIC too where pillow-heif is
    installed."""
    from PIL import EpsImagePlugin, Image, ImageFile

    try:
        from pillow_heif import register_heif_opener  # optional: pip install pillow-heif
    except ImportError:
        pass
    else:
        register_heif_opener()
    Image.init()
    unread = {fmt for fmt, (factory, _) in Image.OPEN.items()
              if isinstance(factory, type) and issubclass(factory, ImageFile.StubImageFile)}
    unread |= {"MPEG"} | (set() if EpsImagePlugin.has_ghostscript() else {"EPS"})
    return frozenset(ext for ext, fmt in Image.registered_extensions().items() if fmt in Image.OPEN and
                     fmt not in unread)


def passed_over(files: list[Path], show=str) -> str:
    """The line that names the ``files`` a folder held that are not images (``show``: how each is named), with the
    fix for HEIC photos: what ``capsnet prepare`` prints and ``capsnet predict --fit`` notes."""
    shown = ", ".join(show(p) for p in files[:5]) + (", ..." if len(files) > 5 else "")
    return f"passed over {len(files)} file(s) that are not images: {shown}{heic_hint(files)}"


def heic_hint(files: list[Path]) -> str:
    """" (N HEIC photo(s): pip install pillow-heif, ...)" where ``files`` (passed over) hold HEIC photos, else ""."""
    heic = [p for p in files if p.suffix.lower() in HEIC]
    return f" ({len(heic)} HEIC photo(s): pip install pillow-heif, and they are read)" if heic else ""


def image_files(folder: Path, of_a_class: bool = False, by_name: bool = False) -> tuple[dict[str, Path], list[Path]]:
    """The image files in ``folder`` (any format Pillow opens) by NFC stem, and the other files (not images) it
    holds; what ``classes:DIR`` would refuse is refused here, before any work (subfolders of images, links to
    nothing, names that are not UTF-8, two files of one stem). ``of_a_class``: ``folder`` is a class's (the
    messages say so); ``by_name``: keyed by the whole NFC file name (x.jpg and x.png both kept: nothing is written
    by their stems), and subfolders passed over (a folder of images to classify, read as predict reads PNGs)."""
    from .class_folders import nested_image_folders
    from .png import _utf8

    known = _image_suffixes()
    by_stem: dict[str, Path] = {}
    others = []
    entries = sorted(p for p in folder.iterdir() if not p.name.startswith("."))
    broken = [p.name for p in entries if p.is_symlink() and not p.exists()]
    if broken:
        raise DataError(f"{folder} holds {len(broken)} link(s) to nothing ({', '.join(broken[:5])}); point them at "
                        f"their files or remove them")
    if not by_name and (nested := nested_image_folders(folder, known)):  # left out, the class would shrink without
        # a word (and classes:DIR refuses them)
        raise DataError(f"{folder} holds subfolder(s) of images ({', '.join(nested[:5])}), which are not read; move "
                        f"their images into {folder} itself" + (", or make a subfolder a class of its own"
                                                                if of_a_class else ""))
    for p in (p for p in entries if p.is_file()):
        if p.suffix.lower() not in known:
            others.append(p)
            continue
        if not _utf8(p.name):
            raise DataError(f"{folder} holds a file whose name is not UTF-8: {ascii(p.name)}; rename it (e.g. convmv "
                            f"-f latin1 -t utf-8, or by hand)")
        stem = unicodedata.normalize("NFC", p.name if by_name else p.stem)
        if stem in by_stem:
            raise DataError(f"{by_stem[stem]} and {p} have one name ({stem}), which would be one PNG; rename one "
                            f"of them")
        by_stem[stem] = p
    if not by_name:  # Circle0.jpg and circle0.jpg: one PNG on macOS's and Windows' disks, where one image was lost
        folded: dict[str, str] = {}
        for stem in by_stem:
            if (twin := folded.setdefault(stem.casefold(), stem)) != stem:
                raise DataError(f"{by_stem[twin]} and {by_stem[stem]} have names that differ in case alone, which "
                                f"would be one PNG on macOS's and Windows' disks; rename one of them")
    return by_stem, others


def fit_image(path: Path, height: int, width: int, mode: str, fit: str) -> np.ndarray:
    """The image in ``path`` (any format Pillow opens) turned, flattened, converted to ``mode`` and fitted to
    ``height`` x ``width`` (the module docstring): (C, H, W) uint8, C 1 (grey) or 3 (rgb). What ``capsnet prepare``
    writes and ``capsnet predict --fit`` classifies."""
    return _chw(_fitted(path, (height, width), mode, fit))


def fit_array(img, height: int, width: int, mode: str, fit: str, what: str = "the image") -> np.ndarray:
    """``fit_image`` of a PIL image already opened and turned (``fit_pil``): (C, H, W) uint8. The viewer fits
    uploads to a model of a user's class folders with it."""
    return _chw(fit_pil(img, (height, width), mode, fit, what))


def _chw(img) -> np.ndarray:
    """A grey or RGB PIL image as a writable (C, H, W) uint8 array (PIL's own view is read-only)."""
    a = np.asarray(img)
    return np.array(a[None] if a.ndim == 2 else a.transpose(2, 0, 1))


def _fitted(path: Path, size: int | tuple[int, int], mode: str, fit: str):
    """The PIL image of ``path``, turned, flattened, converted and fitted to ``size`` (a side, or (height, width))
    (module docstring): a new image holding the pixels alone (no EXIF, ICC profile or transparency key carried
    into the PNG)."""
    return fit_pil(open_turned(path, max(size) if isinstance(size, tuple) else size), size, mode, fit, str(path))


DRAFT_MARGIN = 8  # a JPEG is decoded at a reduced scale that keeps at least this many pixels per fitted pixel
# (at 4, a detailed photo's fitted pixels moved by 3.4 grey levels on average, 36 at most; at 8, 1.1: a review)


def open_turned(path: Path, side: int | None = None):
    """The PIL image of ``path`` (any format Pillow opens), loaded and turned by its EXIF orientation; a damaged,
    unknown or too large file is a DataError naming it. What ``fit_pil`` is given for a file.

    ``side``: the largest side it will be fitted to. A JPEG many times that size is decoded at 1/2, 1/4 or 1/8
    of its size (libjpeg's own scaling, a mean over each block), still at least ``DRAFT_MARGIN`` times ``side``
    on both sides: a 95-megapixel photo fitted to 28x28 took 707 MB and a full decode."""
    import warnings

    from PIL import Image, ImageOps

    if path.is_file() and path.stat().st_size == 0:  # "cannot identify image file", and "re-save it", said before
        raise DataError(f"{path} is empty (0 bytes): copy the image again, or move it out")
    try:
        with warnings.catch_warnings():  # a photo of 90-180 megapixels is read, without Pillow's raw warning of a
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # "decompression bomb DOS attack"
            with Image.open(path) as img:
                # a square request: the same whichever way it turns; MPO, the JPEG of many phones (and the viewer's)
                if side is not None and img.format in ("JPEG", "MPO"):
                    img.draft(None, (DRAFT_MARGIN * side, DRAFT_MARGIN * side))
                img.load()
                return ImageOps.exif_transpose(img)
    except Image.DecompressionBombError as e:
        raise DataError(f"{path} is too large to read safely ({e}); scale it down first") from None
    except Exception as e:  # Pillow raises many types on a damaged or unknown file
        raise DataError(f"{path} is not a readable image ({type(e).__name__}: {e}); re-save it or move it "
                        f"out") from None


def fit_pil(img, size: int | tuple[int, int], mode: str, fit: str, what: str = "the image"):
    """A PIL image (already turned by its EXIF orientation) flattened onto black, converted to ``mode`` ("grey",
    "rgb") and fitted to ``size`` (a side, or (height, width)) by ``fit`` ("crop", "pad"), as ``capsnet prepare``
    writes it: a new image of the pixels alone. ``what`` names the image in errors."""
    from PIL import Image, ImageOps

    height, width = (size, size) if isinstance(size, int) else size
    try:
        if img.mode.startswith(("I", "F")):  # 16- and 32-bit grey: Pillow's convert would clip past 255
            img = _eight_bit(img, what)
        if img.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in img.info:  # an alpha channel, or a
            rgba = img.convert("RGBA")  # palette's or a key colour's (tRNS): flattened onto black
            img = Image.alpha_composite(Image.new("RGBA", img.size, (0, 0, 0, 255)), rgba)
            alpha, flat = rgba.getchannel("A").getextrema(), img.convert("L").getextrema()
            if alpha[0] != alpha[1] and flat[0] == flat[1]:  # strokes on a transparent canvas: all one level now
                raise DataError(f"{what} holds its shape in its transparency alone (flattened onto black it is "
                                f"one flat level); flatten it onto a background its strokes stand out from and "
                                f"save it without alpha")
        if img.mode not in ("1", "L", "P", "RGB", "RGBA", "CMYK", "YCbCr"):  # LAB, HSV: channels that are not RGB
            raise DataError(f"{what} is a {img.mode!r} image, which is not converted here; save it as RGB or grey")
        img = img.convert(MODES[mode])
        img = ImageOps.fit(img, (width, height), method=Image.Resampling.LANCZOS) if fit == "crop" else \
            ImageOps.pad(img, (width, height), method=Image.Resampling.LANCZOS, color=0)
    except DataError:
        raise
    except Exception as e:  # a mode or a damaged file Pillow cannot convert
        raise DataError(f"{what} is not a readable image ({type(e).__name__}: {e}); re-save it or move it "
                        f"out") from None
    return Image.fromarray(np.asarray(img))  # the pixels alone


def prepared_fit(folder: str | os.PathLike) -> str | None:
    """The fit ("crop", "pad") ``capsnet prepare`` made ``folder`` with, from the record it leaves there; None for a
    folder it did not make (or a record that does not say)."""
    try:
        fit = json.loads((Path(folder) / RECORD).read_text(encoding="utf-8")).get("fit")
    except (OSError, ValueError, AttributeError):
        return None
    return fit if fit in FITS else None


def prepare_class_folders(source: str | os.PathLike, out: str | os.PathLike, size: int, *, mode: str = "rgb",
                          fit: str = "crop", progress: bool = False) -> Prepared:
    """Write ``source``'s class folders into ``out`` as PNGs of ``size`` x ``size`` (the module docstring)."""
    from .._progress import progress_bar
    from ..checkpoint import _start_ticks, check_out_dir, remove_stale_writes

    source, out = Path(os.path.abspath(source)), Path(os.path.abspath(out))  # "." has a name; a link is refused
    if mode not in MODES:
        raise DataError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if fit not in FITS:
        raise DataError(f"fit must be one of {', '.join(FITS)}, got {fit!r}")
    if not (is_int(size) and 1 <= size <= 4096):
        raise DataError(f"size must be a whole number of pixels in 1..4096, got {size!r}")
    if not source.is_dir():
        raise DataError(f"{source}: no such folder; give the folder holding one subfolder of images per class")
    if out.is_symlink():  # renamed into its place, the link would be replaced, not its folder filled
        raise DataError(f"{out} is a link; give the folder it points at, or a new folder (--out)")
    if out.exists() and not out.is_dir():
        raise DataError(f"{out} is a file; give an empty or new folder (--out)")
    if out.is_dir():  # a run killed outright (SIGKILL) inside an empty folder given left its partial folder there
        remove_stale_writes(out, f"{_INSIDE}.tmp-*")
    if out.exists() and any(out.iterdir()):
        raise DataError(f"{out} already holds files; give an empty or new folder (--out)")
    if out.resolve().is_relative_to(source.resolve()):  # written among the photos, read as a class next time
        raise DataError(f"{out} is inside {source}; give a folder outside it (--out)")
    check_out_dir(out, "prepared class folders", error=DataError)
    from .class_folders import TEST_FOLDER, class_folders, refuse_unknown_classes

    plan: list[tuple[Path, Path]] = []  # (source file, PNG to write, relative to out): all known before reading
    skipped: list[Path] = []
    counts: dict[str, int] = {}
    trained: tuple[str, ...] = ()
    held_out = not (source / TEST_FOLDER).is_dir()  # classes:DIR holds out a fifth of each class for testing
    for split, top, target in (("train", source, Path()), ("test", source / TEST_FOLDER, Path(TEST_FOLDER))):
        if not top.is_dir():
            continue
        loose = [p.name for p in sorted(top.iterdir()) if p.is_file() and not p.name.startswith(".") and
                 p.suffix.lower() in _image_suffixes()]
        if loose:  # left out without a word otherwise
            raise DataError(f"{top} holds {len(loose)} image(s) outside the class folders ({', '.join(loose[:5])}"
                            f"{', ...' if len(loose) > 5 else ''}); put each in the subfolder named by its class")
        # the class folders as classes:DIR will read them (at least two; no names differing in case alone or not
        # UTF-8; test/ holding no class training lacks): refused here, not after the work by capsnet train
        found = class_folders(top, at_least=1 if split == "test" else 2, test_split=split == "test")
        if split == "train":
            trained = tuple(found)
        else:
            refuse_unknown_classes(top, found, trained)
        for name, folder in found.items():
            images, others = image_files(folder, of_a_class=True)
            if not images:
                raise DataError(f"{folder} holds no image file Pillow reads{heic_hint(others)}; put the class's "
                                f"images there")
            if held_out and split == "train" and len(images) < 2:  # refused here, not by capsnet train after the work
                raise DataError(f"class {name!r} holds {len(images)} image in {folder}; at least 2 are needed to hold "
                                f"one out for testing (add images, or put the test images in "
                                f"{source / TEST_FOLDER / name})")
            skipped += others
            plan += [(p, target / name / f"{stem}.png") for stem, p in images.items()]
            counts[split] = counts.get(split, 0) + len(images)
    if not trained:
        raise DataError(f"{source} holds no class folders of images")
    # a new folder is written beside it and renamed into place when whole; an empty folder given is filled in place
    # (renamed over, it lost its permissions and inode: the shell standing in it saw nothing, and a mount point was
    # refused after the work), its contents moved in when whole, the record last
    inside = out.is_dir()
    home, stem = (out, _INSIDE) if inside else (out.parent, f".{out.name}")
    home.mkdir(parents=True, exist_ok=True)
    remove_stale_writes(home, f"{stem}.tmp-*")  # a run killed outright (SIGKILL) left its partial folder
    pid = os.getpid()  # named as atomic_write names its files
    partial = home / f"{stem}.tmp-{pid}-{_start_ticks(pid) or 0}-dir"
    moved: list[Path] = []
    try:
        # one image at a time (50,000 photos held at 512x512 would take 39 GB); a file that cannot be read ends
        # the run with the partial folder removed
        trained_pixels: dict[tuple[str, bytes], Path] = {}  # (class, digest of the pixels written) -> its photo
        copied: list[tuple[Path, Path]] = []  # (test photo, the training photo of the same pixels)
        for p, dest in progress_bar(plan, desc="prepare", unit="image", leave=False, progress=progress):
            img = _fitted(p, size, mode, fit)
            (partial / dest).parent.mkdir(parents=True, exist_ok=True)
            img.save(partial / dest, format="PNG")
            key = (dest.parent.name, hashlib.blake2b(np.asarray(img).tobytes(), digest_size=16).digest())
            if len(dest.parts) == 2:  # CLASS/NAME.png, a training photo (TEST/CLASS/NAME.png after them all)
                trained_pixels.setdefault(key, p)
            elif key in trained_pixels:
                copied.append((p, trained_pixels[key]))
        same = [name for name in trained if sum(c == name for c, _ in trained_pixels) < 2] if held_out else []
        if same:  # each one photo saved twice: nothing unseen to test on
            raise DataError(f"the photos of class {same[0]!r} in {source / same[0]} hold the same pixels once fitted: "
                            f"a test image must not be a copy of a training one, so at least 2 different ones are "
                            f"needed (add others, or put the test photos in {source / TEST_FOLDER / same[0]}); nothing "
                            f"written")
        if copied:  # classes:DIR refuses the folder (a test image trained on), naming the PNGs: named by photo here
            shown = some_of(f"{t.relative_to(source)} (= {c.relative_to(source)})" for t, c in copied)
            raise DataError(f"{source / TEST_FOLDER} holds {len(copied)} photo(s) that are also training photos of "
                            f"their class (the same pixels once fitted): {shown}; a test image must not be trained "
                            f"on: keep each in test/ only (remove its twin from the class folder); nothing written")
        # how it was made, hidden from the loaders: a run trained on the folder records it, so predict and the
        # viewer fit new photos the same way
        (partial / RECORD).write_text(json.dumps({"size": size, "mode": mode, "fit": fit}) + "\n", encoding="utf-8")
        taken = DataError(f"{out} was filled by another program while this one worked (two `capsnet prepare` into "
                          f"one --out?); nothing written by this one: give an empty or new folder (--out)")
        if inside:
            if any(e.name != partial.name for e in out.iterdir()):  # files of other names mixed in without a word
                raise taken
            for entry in sorted(partial.iterdir(), key=lambda e: e.name == RECORD):  # the record last
                if os.path.lexists(out / entry.name):  # a rename would replace the other's file without a word
                    raise taken
                entry.rename(out / entry.name)
                moved.append(out / entry.name)
            partial.rmdir()
        else:
            try:
                partial.rename(out)
            except OSError as e:  # made meanwhile, and not empty (an empty one is replaced by the rename)
                if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
                    raise taken from None
                raise
    except BaseException as e:
        shutil.rmtree(partial, ignore_errors=True)
        for done in moved:  # the folder given left empty, as it was
            if done.is_dir():
                shutil.rmtree(done, ignore_errors=True)
            else:
                done.unlink(missing_ok=True)
        if isinstance(e, OSError) and not e.filename and e.errno is not None:  # a PNG's write (a full disk): the
            # CLI said "cannot write the output ... (any earlier file of that name is unchanged)" (a review)
            raise DataError(f"cannot write the prepared images into {out}: {e.strerror or e}; free space there or "
                            f"write elsewhere (--out); nothing was kept") from None
        raise
    return Prepared(out, counts, trained, skipped)
