"""Write an MNIST-family set as a folder of classes, the layout ``--dataset classes:DIR`` reads.

The first ``--per-class`` training images of each class go to ``OUT/CLASS/NNNNN.png`` (NNNNN: the image's index in
the training file) and the first ``--test-per-class`` test images of each class to ``OUT/test/CLASS/NNNNN.png``,
each kept in file order, so the folder is the same on every machine. Class folders are named by the set's class
names ("/" in a name, as Fashion-MNIST's "T-shirt/top", becomes "-").

    python tools/make_class_folders.py --dataset fashion-mnist --per-class 500 --out runs/fashion-folders \\
        --data-dir ../shared/data
    capsnet train --dataset classes:runs/fashion-folders --epochs 5

Refuses an ``--out`` folder that already holds files: a folder of classes written over another would mix them.
Writes all or nothing: every class's count is checked first, and the folder is renamed into place when whole.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

from capsnet.data import load_dataset

__all__ = ["write_class_folders", "main"]


def write_class_folders(dataset: str, out: Path, per_class: int, test_per_class: int,
                        data_dir: str | None = None) -> dict[str, int]:
    """Write the folder (see the module docstring); returns how many images each split got. Every class's count is
    checked before anything is written, and the folder is written beside ``out`` and renamed into place when
    whole: a failure leaves no folder (a half-written one was refused by the rerun, "already holds files")."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise SystemExit(f"{out} is a file; give a new or empty folder (--out)")
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"{out} already holds files; give an empty or new folder (--out)")
    plan = []  # (data set, the class's folder, the indices of its images)
    for split, n, base in (("train", per_class, Path()), ("test", test_per_class, Path("test"))):
        if n == 0:
            continue
        d = load_dataset(dataset, split, root=data_dir)
        labels = d.labels.numpy()
        for k, name in enumerate(d.classes):
            chosen = np.flatnonzero(labels == k)[:n]
            if len(chosen) < n:
                raise SystemExit(f"{dataset}'s {split} split has {len(chosen)} images of class {name!r}, fewer than "
                                 f"the {n} asked for (--{'per-class' if split == 'train' else 'test-per-class'}); "
                                 f"nothing written")
            plan.append((split, d, base / name.replace("/", "-"), chosen.tolist()))
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        written: dict[str, int] = {}
        for split, d, folder, chosen in plan:
            (partial / folder).mkdir(parents=True)
            for i in chosen:
                Image.fromarray(d.images[i, 0].numpy()).save(partial / folder / f"{i:05d}.png")
            written[split] = written.get(split, 0) + len(chosen)
        if out.exists():
            out.rmdir()  # empty (checked above)
        partial.rename(out)
    except BaseException:  # Ctrl-C or a full disk included: no half-written folder left
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="fashion-mnist", choices=["mnist", "fashion-mnist", "mnist-sample"])
    p.add_argument("--per-class", type=int, default=500, help="training images per class (default: 500)")
    p.add_argument("--test-per-class", type=int, default=100,
                   help="test images per class, in OUT/test (default: 100; 0: none, so capsnet holds out a fifth)")
    p.add_argument("--out", required=True, help="the folder to write (new or empty)")
    p.add_argument("--data-dir", default=None, help="where the IDX files are (default: capsnet's data root)")
    args = p.parse_args(argv)
    if args.per_class < 1 or args.test_per_class < 0:
        p.error("--per-class must be at least 1 and --test-per-class at least 0")
    written = write_class_folders(args.dataset, Path(args.out), args.per_class, args.test_per_class, args.data_dir)
    print(f"wrote {', '.join(f'{n:,} {split}' for split, n in written.items())} images to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
