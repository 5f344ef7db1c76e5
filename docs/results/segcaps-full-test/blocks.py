"""Diagnosis: why the first 2,000 mnist-segmentation test canvases score lower Dice than all 10,000.

Every canvas draws its rotation, scale, clutter, ramp and noise independently of its index (capsnet.data.segmentation:
one generator, i.i.d. draws), and canvas i has MNIST test digit i as its target; so a difference between blocks of
canvases belongs to the digits. MNIST's test set holds 5,000 digits from NIST's SD-3 (Census Bureau staff) and then
5,000 from SD-1 (students). For each checkpoint this scores all 10,000 test canvases (last weights, mask where the
probability exceeds 0.5) and tabulates, per block of 1,000 canvases and per half: the mean Dice, the Otsu
threshold's Dice (no model), the mask's area and its boundary share (mask pixels with a 4-neighbour outside the mask,
over the mask's pixels: thin strokes have a high share, and a segmenter's errors sit on boundaries); then the Dice by
quintile of the boundary share over all 10,000.

    python docs/results/segcaps-full-test/blocks.py [CHECKPOINT ...] [--data-dir DIR] [--json OUT]

CHECKPOINT: run directories (last weights) or pretrained:NAME; default pretrained:segcaps-mnist.
"""
import argparse
import json
import shlex
import sys

import torch
import torch.nn.functional as F

from capsnet.data.segmentation import otsu_masks, overlap_scores
from capsnet.data.tasks import load_test
from capsnet.evaluate import load_model
from capsnet.figures.segmentation import segment

BLOCK = 1000


def boundary_share(masks: torch.Tensor) -> torch.Tensor:
    """(N, 1, H, W) 0/1 -> (N,): the share of mask pixels with a 4-neighbour outside the mask (outside the canvas
    counts as outside)."""
    m = masks.float()
    kernel = torch.tensor([[0, 1, 0], [1, 1, 1], [0, 1, 0]], dtype=m.dtype).view(1, 1, 3, 3)
    inner = F.conv2d(m, kernel, padding=1) == 5  # the pixel and its 4 neighbours all in the mask
    area = m.sum(dim=(1, 2, 3))
    edge = (m.bool() & ~inner).sum(dim=(1, 2, 3)).float()
    return edge / area.clamp(min=1)


def table(columns: dict[str, torch.Tensor], share: torch.Tensor, area: torch.Tensor) -> list[dict]:
    rows = []
    n = len(share)
    spans = [(s, min(s + BLOCK, n)) for s in range(0, n, BLOCK)] + [(0, 2000), (0, n // 2), (n // 2, n), (0, n)]
    for lo, hi in spans:
        row = {"canvases": f"{lo}-{hi - 1}"} | {k: v[lo:hi].mean().item() for k, v in columns.items()}
        rows.append(row | {"mask_area": area[lo:hi].mean().item(), "boundary_share": share[lo:hi].mean().item()})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoints", nargs="*", default=["pretrained:segcaps-mnist"])
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    test = load_test("mnist-segmentation", extras=False, root=args.data_dir, progress=False)
    images, masks = test.images, test.labels
    share, area = boundary_share(masks), masks.float().sum(dim=(1, 2, 3))
    columns = {"otsu": overlap_scores(otsu_masks(images), masks)[0]}
    for ckpt in args.checkpoints:
        model, _ = load_model(ckpt, which="last")
        columns[ckpt] = segment(model, images, masks, batch_size=64, progress=True).dice  # each canvas's Dice
    rows = table(columns, share, area)
    names = list(columns)
    print("| canvases | " + " | ".join(f"Dice, {n}" for n in names) + " | mask area (px) | boundary share |")
    print("|---" * (len(names) + 3) + "|")
    for r in rows:
        print(f"| {r['canvases']} | " + " | ".join(f"{r[n]:.4f}" for n in names) +
              f" | {r['mask_area']:.1f} | {r['boundary_share']:.4f} |")
    q = torch.quantile(share, torch.tensor([0.2, 0.4, 0.6, 0.8]))
    bins = torch.bucketize(share, q)
    quint = []
    print("\n| boundary-share quintile | range | canvases in 0-4999 | " + " | ".join(f"Dice, {n}" for n in names) + " |")
    print("|---" * (len(names) + 3) + "|")
    for k in range(5):
        sel = bins == k
        first = sel[:len(sel) // 2].float().sum().item() / sel.float().sum().item()
        row = {"quintile": k + 1, "low": share[sel].min().item(), "high": share[sel].max().item(),
               "share_in_first_half": first} | {n: columns[n][sel].mean().item() for n in names}
        quint.append(row)
        print(f"| {k + 1} | {row['low']:.3f}-{row['high']:.3f} | {100 * first:.1f}% | " +
              " | ".join(f"{row[n]:.4f}" for n in names) + " |")
    corr = {n: torch.corrcoef(torch.stack([share, columns[n]]))[0, 1].item() for n in names}
    print("\ncorrelation of boundary share and Dice over the 10,000: " +
          ", ".join(f"{n} {c:+.3f}" for n, c in corr.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(shlex.quote(a) for a in sys.argv), "blocks": rows, "quintiles": quint,
                       "correlation": corr}, f, indent=1)


if __name__ == "__main__":
    main()
