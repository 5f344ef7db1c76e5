"""The user's PNG files, read and checked: one folder's files by name, an image as (C, H, W) uint8, a binary mask.

Every problem is a ``DataError`` naming the file and the fix; nothing is written.
"""
from __future__ import annotations

import os
import unicodedata
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from .idx import DataError

__all__ = ["png_files", "refuse_case_twins", "read_png", "image_array", "opaque_image_array", "label_map_array", "scale_binary_label_maps", "refuse_mixed_binary_label_maps",
           "transparent_share", "refuse_other_shape", "mask_array", "load_png_pairs"]

# image files capsnet does not read: refused beside PNGs, so none is left out silently (other files are ignored)
_OTHER_IMAGES = {".jpg", ".jpeg", ".jfif", ".tif", ".tiff", ".bmp", ".gif", ".webp", ".ppm", ".pgm", ".pbm", ".pnm",
                 ".heic", ".heif", ".avif", ".jp2", ".j2k", ".tga", ".ico", ".svg", ".dcm"}
_IMAGE_MODES = {"L": "L", "RGB": "RGB", "LA": "L", "RGBA": "RGB", "P": "RGB", "PA": "RGB", "1": "L"}


def png_files(folder: Path, what: str, *, paired: bool = True, convert: str = "convert them to PNG"
              ) -> dict[str, Path]:
    """The PNG files of ``folder`` by file stem (``what`` names them in errors: "images", "masks", ...; ``paired``:
    they are paired by name with another folder's, as the errors say; ``convert``: the fix for image files of other
    formats)."""
    if folder.exists() and not folder.is_dir():
        raise DataError(f"{what} folder {folder} is a file, not a folder; give the folder that holds the {what} "
                        f"as PNG files")
    if not folder.is_dir():
        given, subs = folder.parent, ("images", "masks", "labels")
        twin = next((p.name for p in sorted(given.iterdir()) if p.is_dir() and p.name != folder.name and
                     p.name.lower() == folder.name.lower()), None) if given.is_dir() else None
        if twin is not None:  # Images/ and Masks/ (Windows' and many downloads' spelling): "create it" misled
            raise DataError(f"{what} folder {folder} does not exist, but {twin}/ does: rename it {folder.name}/ "
                            f"(capsnet reads the lower-case names, on every system alike)")
        layout = {"masks": ("labels", "pairs:"), "labels": ("masks", "folder:")}.get(folder.name)
        if layout is not None and (given / layout[0]).is_dir():  # the other kind of user folder
            kind = "synthesis pairs (labels/ and images/)" if layout[1] == "pairs:" else \
                "segmentation images and masks (images/ and masks/)"
            raise DataError(f"{what} folder {folder} does not exist; {given} holds {layout[0]}/, the layout of "
                            f"{kind}: give --dataset {layout[1]}{given}")
        inside = given.name in subs and any((given.parent / n).is_dir() for n in subs if n != given.name)
        raise DataError(f"{what} folder {folder} does not exist; " + (
            f"{given} looks like one of the data set's two folders: give the folder above it, {given.parent}"
            if inside else
            f"create it and put the {what} in it as PNG files" + (" (paired files named alike)" if paired else "")))
    entries = sorted(p for p in folder.iterdir() if not p.name.startswith("."))
    broken = [p for p in entries if p.is_symlink() and not p.exists()]
    if broken:  # skipped, they would leave their pair unpaired or the set smaller without a word
        raise DataError(f"{folder} holds {len(broken)} link(s) to nothing: {', '.join(p.name for p in broken[:5])}; "
                        f"point them at their files or remove them")
    files = [p for p in entries if p.is_file()]
    pngs = [p for p in files if p.suffix.lower() == ".png"]
    if not pngs:
        others = ", ".join(p.name for p in files[:5])
        nested = [d for d in entries if d.is_dir() and any(f.suffix.lower() == ".png" and not f.name.startswith(".")
                                                           for f in d.iterdir())]  # a Mac's ._*.png: metadata
        fix = f" (found {len(files)} other file(s): {others}; {convert})" if files else \
            f" (the PNG files in its subfolder {nested[0].name}/ are not read: put them in {folder} itself)" \
            if nested else f"; put the {what} there as .png files"
        raise DataError(f"no PNG files in {folder}{fix}")
    images = [p for p in files if p.suffix.lower() in _OTHER_IMAGES]
    if images:  # read as a data set they would be left out without a word
        listed = ", ".join(p.name for p in images[:5]) + (", ..." if len(images) > 5 else "")
        raise DataError(f"{folder} holds {len(images)} image file(s) that are not PNG beside its PNG {what} "
                        f"({listed}); capsnet reads PNG only: {convert}, or move them out")
    undecodable = [p for p in pngs if not _utf8(p.name)]
    if undecodable:  # bytes that are not UTF-8 (Latin-1 names from an old zip file): reports, CSVs and the held-out
        # split's hash write names as UTF-8, and failed on them after the work, naming no file
        listed = ", ".join(ascii(p.name) for p in undecodable[:5])
        raise DataError(f"{folder} holds {len(undecodable)} file name(s) that are not UTF-8: {listed}; rename them "
                        f"(e.g. convmv -f latin1 -t utf-8, or by hand)")
    by_stem: dict[str, Path] = {}
    for p in pngs:  # names in one Unicode form: macOS writes 'café' decomposed, most tools composed
        stem = unicodedata.normalize("NFC", p.stem)
        if stem in by_stem:
            raise DataError(f"{by_stem[stem]} and {p} have the same name; rename one of them")
        by_stem[stem] = p
    return by_stem


def _utf8(name: str) -> bool:
    """Whether a file name's bytes on disk are UTF-8 (asked of the bytes: under an ASCII locale with Python's UTF-8
    mode off, a UTF-8 'café' is decoded with surrogates, and refused as Latin-1 with a fix that would garble it)."""
    try:
        os.fsencode(name).decode("utf-8")
    except UnicodeError:
        return False
    return True


def refuse_case_twins(stems, where: str | Path, outputs: str) -> None:
    """A DataError when two of a folder's file ``stems`` differ in case alone: the ``outputs`` written by their
    names would be one file on macOS's and Windows' file systems, one written over the other."""
    folded = {stem.casefold(): stem for stem in stems}
    if len(folded) < len(stems):
        first = sorted(s for s in stems if folded[s.casefold()] != s)[0]
        pair = sorted({first, folded[first.casefold()]})
        raise DataError(f"{where} holds {pair[0]}.png and {pair[1]}.png, names that differ in case alone: their "
                        f"{outputs} would be one file on macOS and Windows; rename one of them")


def read_png(path: Path, orientations: dict[Path, int] | None = None):
    """The PIL image of a PNG file, loaded and turned by its EXIF orientation if it has one (as image viewers and
    ``capsnet viz`` show it); anything else (another format, a damaged file, one too large) is a DataError.
    ``orientations``: where to record the file's EXIF orientation by its path (1: none, as for any value but 2..8,
    which turn or mirror it), read as the file is opened, for ``load_png_pairs`` to compare a pair's files."""
    from PIL import Image, ImageOps

    try:
        with Image.open(path) as img:
            img.load()
            if orientations is not None:
                tag = img.getexif().get(0x0112, 1)  # the values exif_transpose acts on; others leave it as stored
                orientations[path] = tag if tag in range(2, 9) else 1
            fmt, img = img.format, ImageOps.exif_transpose(img)  # a copy, turned as viewers show it (EXIF orientation)
    except Image.DecompressionBombError as e:  # over twice Pillow's pixel cap: refused before its pixels are read
        raise DataError(f"{path} is too large to read safely ({e}); scale it down or crop it") from None
    except PermissionError:  # not a damaged file: "re-save it as PNG" named the wrong fix
        raise DataError(f"{path} cannot be read: permission denied; make it readable (chmod a+r) or move it "
                        f"out") from None
    except Exception as e:  # PIL raises many types on a damaged file
        raise DataError(f"{path} is not a readable PNG image ({type(e).__name__}: {e}); re-save it as PNG") from None
    if fmt != "PNG":
        raise DataError(f"{path} is a {fmt} file, not a PNG; convert it to PNG")
    return img


def _bit_depth(path: Path) -> int:
    """The bit depth a PNG file's header gives (IHDR: 8 bytes of signature, 8 of chunk length and type, width and
    height, then the depth); Pillow loads 16-bit colour and grey+alpha files as 8-bit, keeping the high bytes."""
    with open(path, "rb") as f:
        header = f.read(25)
    return header[24] if len(header) == 25 and header[12:16] == b"IHDR" else 8


def _refuse_16_bit_colour(path: Path, img, example: str, fix: str, what: str = "") -> None:
    """A DataError for a 16-bit colour or grey+alpha PNG (``what``: a word before its path in the message), which
    Pillow loads as 8-bit, keeping each value's high byte: ``example`` would read as empty."""
    if img.mode in ("RGB", "RGBA", "LA") and _bit_depth(path) == 16:
        raise DataError(f"{what}{path} is a 16-bit {img.mode} PNG, which reads as the high byte of each value "
                        f"({example} would read as empty); save it as {fix}")


def image_array(path: Path) -> np.ndarray:
    """An 8-bit grey (1 channel) or RGB (3) image as (C, H, W) uint8; alpha dropped, palettes to RGB (a palette
    whose every entry is grey to grey: such a file looks grey and sits among grey ones; decided by the palette, not
    by the entries a file happens to use, so files sharing a palette read alike), 16/32-bit refused."""
    return _image_array(read_png(path), path)


def _image_array(img, path: Path, example: str = "an image whose values are all below 256") -> np.ndarray:
    if img.mode not in _IMAGE_MODES:
        deep = "16/32-bit" if img.mode.startswith(("I", "F")) else "unsupported"
        raise DataError(f"{path} has mode {img.mode!r} ({deep}); save it as an 8-bit grayscale (L) or RGB PNG")
    _refuse_16_bit_colour(path, img, example, "an 8-bit grayscale (L) or RGB PNG")
    mode = _IMAGE_MODES[img.mode]
    if img.mode in ("P", "PA") and _grey_palette(img):
        mode = "L"
    a = np.asarray(img.convert(mode), dtype=np.uint8)
    return a[None] if a.ndim == 2 else a.transpose(2, 0, 1)  # (C, H, W)


def _widened(a: np.ndarray, channels: int) -> np.ndarray:
    """A PNG's (C, H, W) pixels in a model's ``channels`` where nothing is lost: a grey image widened for a colour
    model, a colour one whose three channels are equal (grey saved in a palette of Pillow's colour web palette, or
    as RGB by MS Paint) as its one grey; else as they are. How ``capsnet predict`` reads images and ``capsnet
    generate`` label maps."""
    if a.shape[0] == 1 and channels == 3:
        return np.repeat(a, 3, axis=0)
    if a.shape[0] == 3 and channels == 1 and (a == a[:1]).all():
        return a[:1]
    return a


def label_map_array(path: Path, *, orientations: dict[Path, int] | None = None) -> np.ndarray:
    """A label map as ``image_array`` reads it, transparency refused as for masks: a label map is its values, and
    one painted as opaque strokes on a transparent canvas holds its shape in the alpha alone (read as all zeros).
    ``orientations``: as for ``read_png``."""
    return opaque_image_array(path, "label map", orientations=orientations)


def opaque_image_array(path: Path, what: str = "image", other: str = "", *,
                       orientations: dict[Path, int] | None = None) -> np.ndarray:
    """``image_array`` of a file with no transparent pixel: one with any is refused, as read by its colours its
    alpha would be lost (a shape drawn in transparency alone reads as empty). ``what`` names the file in the
    message; ``other`` offers another way, after the fix; ``orientations``: as for ``read_png``. How a user's
    images, masks and label maps are read for training, evaluation, ``capsnet predict`` and ``capsnet generate``
    alike."""
    img = read_png(path, orientations)
    a = _image_array(img, path, f"a 0/1 {what}" if what == "label map" else "an image whose values are all below 256")
    if share := transparent_share(img, path):
        article = "an" if what[0] in "aeiou" else "a"
        raise DataError(f"{what} {path} has transparent pixels ({share:.0%} of them); {article} {what} is read by its "
                        f"values, not its alpha (strokes painted on a transparent canvas would read as empty): "
                        f"flatten it onto its background and save it without alpha{other}")
    return a


def transparent_share(img, path: Path | str | None = None) -> float:
    """The share of a PIL image's pixels that are not fully opaque: an alpha channel, or a PNG's tRNS entry (a
    palette's alpha, or a grey or RGB key colour); 0.0 for an image with neither. What refuses a transparent mask or
    label map here, and an uploaded label map in the viewer."""
    if img.mode in ("LA", "RGBA", "PA") or "transparency" in img.info:
        try:
            alpha = np.asarray(img.convert("RGBA"), dtype=np.uint8)[..., 3]
        except (ValueError, OSError) as e:  # a tRNS chunk longer than the palette: "palette index out of range"
            raise DataError(f"{path or 'the image'} has a damaged transparency chunk ({e}); re-save it") from None
        return float((alpha < 255).mean())
    return 0.0


def _grey_palette(img) -> bool:
    """Whether every entry of a P-mode image's palette is a grey (its file then reads as grey)."""
    palette = list(img.getpalette() or [])
    return all(palette[k] == palette[k + 1] == palette[k + 2] for k in range(0, len(palette) - 2, 3))


def _palette_used(img) -> list[tuple[int, int | None]]:
    """The palette indices a P-mode image uses, in order, each with its grey level (None for a colour)."""
    palette = list(img.getpalette() or [])
    used = np.unique(np.asarray(img)).tolist()
    return [(i, c[0] if len(c) == 3 and c[0] == c[1] == c[2] else None)
            for i, c in ((i, palette[3 * i:3 * i + 3]) for i in used)]


def scale_binary_label_maps(maps: np.ndarray) -> np.ndarray:
    """A folder's label maps (N, C, H, W) uint8 as read; if every pixel of every map is 0 or 1 (0/1 maps, as masks may
    be), the same maps as 0/255, which read as 8-bit grey would be all but black. Decided for the whole folder, so a
    folder of class maps (0..K) in which one map happens to hold only 0s and 1s is left as it is."""
    return maps * np.uint8(255) if maps.size and maps.max() == 1 else maps


def refuse_mixed_binary_label_maps(maps, where: str) -> None:
    """A DataError if a user's label maps, ``maps`` (name, (C, H, W) uint8 array) pairs as read, are binary at two
    scales: some holding 0s and 1s, others 0s and 255s, and none any other value. Binary maps are read as 0/255 only
    when all of them are 0/1, so the 0/1 ones would read as all but black beside the others. Class maps (0..K) are
    left alone: one holding only classes 0 and 1 is a class map like the rest."""
    ones = full = None
    for name, a in maps:
        top = int(a.max())
        if top == 1:
            ones = ones or name
        elif top == 255 and not ((a != 0) & (a != 255)).any():
            full = full or name
        elif top > 1:
            return
    if ones is not None and full is not None:
        raise DataError(f"{where}: label map {ones} holds 0s and 1s and {full} 0s and 255s; binary label maps are read "
                        f"as 0/255 only when all of them are 0/1, so the 0/1 ones would read as all but black: save "
                        f"them all at one scale (0/255, or all 0/1)")


def mask_array(path: Path, *, orientations: dict[Path, int] | None = None) -> np.ndarray:
    """A binary mask (1-bit, or grey holding 0/1 or 0/255, or 16-bit grey holding 0/1, 0/255 or 0/65535; RGB with
    equal channels; a palette image whose indices are 0/1 or 0/255, index 0 the background, as many segmentation data
    sets store them, or of greys read as grey) as (1, H, W) uint8 0/1. Transparency is refused: the mask is its
    values, not its alpha. ``orientations``: as for ``read_png``."""
    img = read_png(path, orientations)
    if img.mode == "1":
        return np.asarray(img, dtype=np.uint8)[None]  # (1, H, W) 0/1
    _refuse_16_bit_colour(path, img, "a 0/1 mask", "8-bit grayscale (L), the foreground 255, or as 16-bit "
                          "grayscale without alpha", what="mask ")
    if transparent_share(img, path):
        raise DataError(f"mask {path} has transparent pixels; a mask is read by its values, not its alpha (a shape "
                        f"drawn in transparency alone would read as empty): save it without alpha, the foreground "
                        f"255 (or 1) and the background 0")
    if img.mode == "P":  # by its indices when they are 0/1 or 0/255 (index 0 the background), whatever the colours;
        # other indices by their greys when they are grey, and refused when any is in colour
        used = _palette_used(img)
        if {i for i, _ in used} <= {0, 1} or {i for i, _ in used} <= {0, 255}:
            greys = [grey for _, grey in used if grey is not None]
            if len(used) == 2 and len(greys) == 2 and greys[0] > greys[1]:
                raise DataError(f"mask {path} is a palette image whose index 0 is lighter (grey {greys[0]}) than its "
                                f"index {used[1][0]} (grey {greys[1]}): the indices make the dark pixels the "
                                f"foreground, the greys the light ones; save it as an 8-bit grayscale PNG, the "
                                f"foreground 255")
            return (np.asarray(img, dtype=np.uint8) > 0).astype(np.uint8)[None]
        if any(grey is None for _, grey in used):  # other indices in colour: read by the colours, it was refused as
            # "in colour; save it as grayscale (L)", and saved so (one grey per class) it was refused for its values
            indices = [i for i, _ in used]
            listed = ", ".join(map(str, indices[:-1])) + f" and {indices[-1]}" if 1 < len(indices) <= 5 else \
                ", ".join(map(str, indices[:5])) + (f" ... ({len(indices)} in all)" if len(indices) > 5 else "")
            fix = f"remap index {indices[1]} to 1 (or 255)" if len(indices) == 2 and indices[0] == 0 else \
                "remap the object's indices to 1 and every other index to 0" if indices[0] == 0 else \
                "remap the background's index to 0 and the object's to 1"
            raise DataError(f"mask {path} is a palette image in colour whose indices are {listed}; capsnet reads a "
                            f"colour palette mask by its indices, 0/1 or 0/255 with index 0 the background: {fix}, "
                            f"or save it as an 8-bit grayscale PNG, the foreground 255 and the background 0")
    deep = img.mode in ("I", "I;16", "I;16B", "I;16L")  # 16-bit grey, as medical masks often are (I: 32-bit)
    if img.mode not in ("L", "LA", "RGB", "RGBA", "P") and not deep:
        raise DataError(f"mask {path} has mode {img.mode!r}; save masks as 8-bit grayscale (L) or 1-bit PNG")
    if deep:
        a, on = np.asarray(img), (1, 255, 65535)
    else:
        a, on = np.asarray(img.convert("L" if img.mode in ("L", "LA") else "RGB"), dtype=np.uint8), (1, 255)
    if a.ndim == 3:
        if not ((a[..., 0] == a[..., 1]) & (a[..., 1] == a[..., 2])).all():
            raise DataError(f"mask {path} is in colour (its RGB channels differ); save it as a grayscale (L) PNG")
        a = a[..., 0]
    values, counts = np.unique(a, return_counts=True)
    bad, found = values[~np.isin(values, (0,) + on)], [v for v in on if v in values]
    if len(bad) or len(found) > 1:
        what = f"holds values {bad[:5].tolist()}{' ...' if len(bad) > 5 else ''}" if len(bad) else \
            f"mixes {' and '.join(map(str, found))}"
        allowed = "0/1, 0/255 or 0/65535 (16-bit)" if deep else "0/1 or 0/255"
        raise DataError(f"mask {path} {what}; masks must be binary, {allowed}: "
                        f"{_binary_advice(values[values > 0].tolist(), counts[values > 0].tolist(), on[-1])} "
                        f"and save it again")
    return (a > 0).astype(np.uint8)[None]  # (1, H, W)


def _binary_advice(levels: list[int], counts: list[int], full: int) -> str:
    """How to make binary a mask whose values other than 0 are ``levels`` (sorted, ``counts`` pixels each), its
    foreground to be ``full`` (255, or 65535 for a 16-bit one). A threshold at half the top level only where the
    levels look antialiased: several greys below the top on fewer pixels than the top itself, an edge's blur. A mask
    of one value (0/100: a class value exported as grey) or a few (class values) would lose its objects to it, so
    those are told to keep their values other than 0."""
    top = levels[-1]
    if len(levels) >= 3 and sum(counts[:-1]) < counts[-1]:
        return f"threshold it (for example value > {top // 2} -> {full})"
    if len(levels) == 1:
        return f"make its one value other than 0 the foreground (for example value == {top} -> {full})"
    listed = ", ".join(map(str, levels[:-1])) + f" and {top}"
    return (f"make the object's values {full} and the rest 0 (for example value > 0 -> {full} to keep {listed} as "
            f"the foreground, or value == {levels[0]} -> {full} to keep one class alone)")


_KIND = {1: "grayscale (1 channel)", 3: "RGB (3 channels)"}
# how a viewer shows the stored pixels for each EXIF orientation tag (TIFF 6.0's Orientation; exif_transpose's)
_ORIENTATION = {2: "shown mirrored", 3: "shown turned 180 degrees", 4: "shown flipped upside down",
                5: "shown mirrored and turned 90 degrees counter-clockwise", 6: "shown turned 90 degrees clockwise",
                7: "shown mirrored and turned 90 degrees clockwise", 8: "shown turned 90 degrees counter-clockwise"}


def load_png_pairs(first_dir: str | Path, second_dir: str | Path, *, first: tuple[str, str, Callable] = (
                   "image", "images", opaque_image_array), second: tuple[str, str, Callable] = ("mask", "masks", mask_array)
                   ) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """Two folders of PNG files paired by file name (``first_dir/a.png`` with ``second_dir/a.png``), checked.

    ``first`` and ``second`` are (singular, plural, reader): what the files are called in messages and how one
    is read into (C, H, W) uint8 (``reader(path, orientations=dict)``, recording its EXIF orientation as
    ``read_png`` does). A pair must match pixel for pixel and have one EXIF orientation; every file of a folder
    must have the size and channel count of its first. Every file is read and checked before anything is
    returned; a problem is a ``DataError`` naming the file and the fix. Nothing is written.

    Shapes: -> first (N, C1, H, W) uint8, second (N, C2, H, W) uint8, names: the N file stems, sorted.
    """
    (one, ones, read_a), (other, others, read_b) = first, second
    first_dir, second_dir = Path(first_dir), Path(second_dir)
    a_files, b_files = png_files(first_dir, ones), png_files(second_dir, others)
    lonely, orphan = sorted(set(a_files) - set(b_files)), sorted(set(b_files) - set(a_files))
    if lonely or orphan:
        def listed(names: list[str], where: Path, files: dict[str, Path]) -> str:  # the files' own names (.PNG)
            shown = ", ".join(files[n].name for n in names[:5])
            return f"{len(names)} in {where} ({shown}{', ...' if len(names) > 5 else ''})"
        parts = ([f"{ones} with no {other}: {listed(lonely, first_dir, a_files)}"] if lonely else []) + \
                ([f"{others} with no {one}: {listed(orphan, second_dir, b_files)}"] if orphan else [])
        raise DataError("; ".join(parts) + f"; every {one} needs a{'n' if other[0] in 'aeiou' else ''} {other} of "
                        f"the same file name")
    names = sorted(a_files)
    got: tuple[list[np.ndarray], list[np.ndarray]] = ([], [])
    turned: dict[Path, int] = {}
    for name in names:
        a, b = read_a(a_files[name], orientations=turned), read_b(b_files[name], orientations=turned)
        if turned[a_files[name]] != turned[b_files[name]]:  # each file is turned by its own: a square pair would
            # lie rotated one over the other without a word, another be refused for sizes its files do not have
            said = {path: f"EXIF orientation {turned[path]} ({_ORIENTATION[turned[path]]})" if turned[path] > 1
                    else "no EXIF orientation" for path in (a_files[name], b_files[name])}
            raise DataError(f"{one} {a_files[name]} has {said[a_files[name]]} but its {other} {b_files[name]} has "
                            f"{said[b_files[name]]}; each file is turned as viewers show it, so the two would not "
                            f"line up pixel for pixel: save both as they are displayed, without EXIF orientation")
        if a.shape[1:] != b.shape[1:]:
            raise DataError(f"{one} {a_files[name]} is {a.shape[1]}x{a.shape[2]} (HxW) but its {other} "
                            f"{b_files[name]} is {b.shape[1]}x{b.shape[2]}; a{'n' if other[0] in 'aeiou' else ''} "
                            f"{other} must match its {one} pixel for pixel")
        for arrays, x, files, plural in ((got[0], a, a_files, ones), (got[1], b, b_files, others)):
            if arrays:
                refuse_other_shape(x, files[name], arrays[0], files[names[0]], plural)
            arrays.append(x)
    return torch.from_numpy(np.stack(got[0])), torch.from_numpy(np.stack(got[1])), names


def refuse_other_shape(a: np.ndarray, path: Path, first: np.ndarray, first_path: Path, plural: str,
                       fix: str = "") -> None:
    """A DataError when array ``a`` (C, H, W) read from ``path`` differs in channels or size from ``first``, the
    first of its folder's ``plural`` (read from ``first_path``): all of them go into one tensor. ``fix``: more
    words after the size's fix."""
    if a.shape == first.shape:
        return
    if a.shape[0] != first.shape[0]:
        raise DataError(f"{path} is {_KIND.get(a.shape[0], a.shape[0])} but {first_path} is "
                        f"{_KIND.get(first.shape[0], first.shape[0])}; convert all {plural} to one mode")
    raise DataError(f"{plural} must all be one size: {path} is {a.shape[1]}x{a.shape[2]} (HxW) but {first_path} is "
                    f"{first.shape[1]}x{first.shape[2]}; resize or crop them to one size{fix}")


def check_out_folder(out: str | Path, source: str | Path, *, written: str, source_flag: str, read: str,
                     run_data: str | None = None) -> None:
    """Refuse, before any work, an ``--out`` folder the results cannot go to: a file, the ``source_flag`` folder
    itself (what is ``written`` there would be ``read`` as input next time), a folder of ``run_data`` (the run's own
    folder:DIR or pairs:DIR: one of the folders its pairs are read from, images/, masks/, labels/ and test/'s;
    classes:DIR: any folder inside it, read as a class), whose files the results would replace or join (predictions
    written into the run's own masks/ replaced the user's masks: a bug hunt, 2026-12-05), or a place this process
    cannot write (its nearest existing folder is read-only: found after minutes of work, the results would be
    lost)."""
    from ..checkpoint import check_out_dir, same_path
    from .tasks import user_folder

    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise DataError(f"--out {out} is a file; give a folder for the {written}")
    if same_path(folder, source):  # images/ is Images/ on macOS's and Windows' disks
        raise DataError(f"--out {out} is the {source_flag} folder; give another folder (the {written}, written among "
                        f"the {read}, would be read as {read} next time)")
    data = user_folder(run_data) if isinstance(run_data, str) else None
    if data is not None:
        root, target = Path(data[1]).expanduser().resolve(), folder.expanduser().resolve()
        subs = {"folder:": ("images", "masks"), "pairs:": ("labels", "images")}.get(data[0])
        if subs is None and target.is_relative_to(root) and target != root:  # classes:DIR: a folder is a class
            raise DataError(f"--out {out} is inside {run_data}, the run's own data, whose folders are read as "
                            f"classes; give a folder outside it")
        # folder:DIR, pairs:DIR: the folders its pairs are read from, and test/ (made, it is read as the test split)
        # and anything in it; by the file system's own identity too (a link, Masks/ on a case-insensitive disk)
        read = [root / sub for sub in subs] + [root / "test"] if subs is not None else []
        if any(same_path(target, p) for p in read) or (subs is not None and target.is_relative_to(
                (root / "test").resolve())):
            raise DataError(f"--out {out} is one of the folders {run_data}, the run's own data, is read from "
                            f"({', '.join(f'{s}/' for s in subs)}, test/): the {written} would replace or join its "
                            f"files there; give another folder")
    check_out_dir(out, written, error=DataError)
