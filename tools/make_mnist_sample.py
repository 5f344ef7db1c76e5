"""Rebuild the ``mnist-sample`` data set shipped in src/capsnet/data/mnist_sample/.

The sample is real MNIST, chosen without randomness so anyone can rebuild it
byte for byte: the first 200 examples of each digit in the MNIST training
file (2,000 digits) and the first 50 of each digit in the test file (500),
each kept in file order. The files are gzipped IDX with the original names.

    python tools/make_mnist_sample.py                # from ../shared/data/mnist
    python tools/make_mnist_sample.py --data-dir DIR --check

The MD5s of the uncompressed files it prints are the ones recorded for
"mnist-sample" in src/capsnet/data/sets.py, which load_dataset checks; --check
exits non-zero when the rebuilt files differ from the recorded MD5s.
"""
from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

import numpy as np

from capsnet.data import load_dataset
from capsnet.data.idx import encode_idx, write_idx
from capsnet.data.sets import SAMPLE_DIR, _SPECS

__all__ = ["sample_indices", "main"]

PER_CLASS = {"train": 200, "test": 50}  # examples per digit: 2,000 train, 500 test
FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
         "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}


def sample_indices(labels: np.ndarray, per_class: int) -> np.ndarray:
    """Indices of the first ``per_class`` examples of each class, in file order."""
    chosen = [np.flatnonzero(labels == k)[:per_class] for k in range(10)]
    if any(len(c) < per_class for c in chosen):
        raise ValueError(f"fewer than {per_class} examples of some class")
    return np.sort(np.concatenate(chosen))


def main(argv: list[str] | None = None) -> int:
    default_dir = Path(__file__).resolve().parents[1].parent / "shared" / "data"
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=default_dir,
                        help="data root holding mnist/ with the four original IDX files")
    parser.add_argument("--out", type=Path, default=SAMPLE_DIR, help="folder to write")
    parser.add_argument("--check", action="store_true",
                        help="fail if the MD5s differ from those recorded in capsnet.data.sets")
    args = parser.parse_args(argv)

    args.out.mkdir(parents=True, exist_ok=True)
    ok = True
    for split, (image_name, label_name) in FILES.items():
        full = load_dataset("mnist", split, root=args.data_dir, download=False)
        labels = full.labels.numpy().astype(np.uint8)
        index = sample_indices(labels, PER_CLASS[split])
        images = full.images[:, 0].numpy()[index]  # (n, 28, 28) uint8
        recorded = {f.name: f.md5 for f in _SPECS["mnist-sample"].files[split]}
        for name, array in ((image_name, images), (label_name, labels[index])):
            write_idx(args.out / f"{name}.gz", array)
            md5 = hashlib.md5(encode_idx(array)).hexdigest()
            match = md5 == recorded[name]
            ok &= match
            print(f"{md5}  {name}  ({len(index)} examples){'' if match else '  != recorded'}")
    if args.check and not ok:
        print("MD5s differ from capsnet.data.sets; update the table there", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
