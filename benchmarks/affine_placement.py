"""Where the translated-MNIST task's test sets place their digits: ink on the 40x40 border and the spread of the ink
boxes' centres, for docs/results.md's table "fixed sets that differ only in how the digits are distorted and where
they are placed".

Not a timing: statistics of the fixed test sets (seed ``TEST_SEED``), made as the runs of that table saw them (each
set drawn for the first 1,000 test digits alone) and as ``capsnet eval`` scores them today (drawn for all 10,000).
"Ink on the border": a nonzero pixel in the outer row or column of the 40x40 image; the centres' spread: the root
mean square deviation of the ink boxes' centres from their mean, both axes pooled (and each axis alone).

    python benchmarks/affine_placement.py [--data-dir ../shared/data] [--json FILE]
"""
from __future__ import annotations

import argparse

import torch

from capsnet.bench import publish
from capsnet.data.sets import load_dataset
from capsnet.data.tasks import affine_centred_test, affine_test, translated_anywhere_test, translated_test

SETS = {"translated": lambda x: translated_test(x), "affine_centred": lambda x: affine_centred_test(x),
        "translated_anywhere": lambda x: translated_anywhere_test(x), "affine": lambda x: affine_test(x)}


def placement(images: torch.Tensor) -> dict[str, float]:
    """Border share (percent) and centre spread (pixels) of (N, 1, H, W) images."""
    ink = images[:, 0] > 0
    border = ink[:, 0].any(1) | ink[:, -1].any(1) | ink[:, :, 0].any(1) | ink[:, :, -1].any(1)
    idx = torch.arange(ink.shape[-1], dtype=torch.float64)
    centres = []
    for along in (ink.any(2), ink.any(1)):  # rows holding ink, columns holding ink
        first = torch.where(along, idx, torch.inf).amin(1)
        last = torch.where(along, idx, -torch.inf).amax(1)
        centres.append((first + last) / 2)
    dev = [c - c.mean() for c in centres]
    return {"ink_on_border_pct": round(100 * border.double().mean().item(), 2),
            "centre_sd_px": round(torch.cat(dev).pow(2).mean().sqrt().item(), 2),
            "centre_sd_rows_px": round(dev[0].pow(2).mean().sqrt().item(), 2),
            "centre_sd_cols_px": round(dev[1].pow(2).mean().sqrt().item(), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=None, help="the folder holding mnist/ (default: capsnet's own)")
    parser.add_argument("--json", default=None, help="also write the rows and the command to this file")
    args = parser.parse_args()
    digits = load_dataset("mnist", "test", root=args.data_dir).images.float() / 255
    rows = [{"digits": n, "set": name, **placement(make(digits[:n]))} for n in (1000, len(digits))
            for name, make in SETS.items()]
    table = ["| digits | set | ink on the border | centre sd (px) |", "| ---: | --- | ---: | ---: |"]
    table += [f"| {r['digits']:,} | {r['set']} | {r['ink_on_border_pct']:.2f}% | {r['centre_sd_px']:.2f} |" for r in rows]
    publish("benchmarks/affine_placement.py", rows, "\n".join(table), args.json)


if __name__ == "__main__":
    main()
