"""Diagnosis: where a segmentation run's Dice goes on the mnist-segmentation canvases.

Runs a trained run's last weights on the first N fixed test canvases (and the out-of-distribution ones), takes the
mask as probability > 0.5 (as `capsnet eval` does) and sorts every wrong pixel by where it lies against the target's
mask (r-pixel neighbourhoods by max pooling, 8-connected):

- false positives far from the target (more than 2 px away): clutter taken for the target;
- false positives within 2 px of it: the boundary drawn too wide;
- false negatives on the mask's edge (pixels of the mask within 1 px of the background): drawn too narrow;
- false negatives inside the mask (the rest): parts of the target missed.

Prints, per run and split, the mean Dice, the share of canvases under 0.5 Dice (the target missed or the wrong
object segmented), each kind's wrong pixels per target pixel, and the mean Dice each kind would leave if its pixels
alone were put right (the others kept), which says how much of the shortfall from 1 each kind accounts for.

    python docs/results/segmentation-errors/errors.py RUN_DIR [RUN_DIR ...] [--test-size 2000] [--data-dir DIR] \
        [--json OUT] [--device cuda]
"""
import argparse
import json
import shlex
import sys

import torch
import torch.nn.functional as F

from capsnet.data.segmentation import overlap_scores
from capsnet.data.tasks import load_test
from capsnet.evaluate import load_model
from capsnet.figures.segmentation import segment


def grow(mask: torch.Tensor, r: int) -> torch.Tensor:
    """Pixels within r px (8-connected) of the mask: (N, 1, H, W) bool."""
    return F.max_pool2d(mask.float(), 2 * r + 1, 1, r) > 0


def kinds(pred: torch.Tensor, truth: torch.Tensor) -> dict[str, torch.Tensor]:
    """The wrong pixels of each kind: name -> (N, 1, H, W) bool, disjoint, together all the wrong pixels."""
    near = grow(truth, 2)
    inner = ~grow(~truth, 1)  # mask pixels more than 1 px from the background
    return {"FP far (clutter)": pred & ~near, "FP near (too wide)": pred & ~truth & near,
            "FN edge (too narrow)": ~pred & truth & ~inner, "FN inside (target missed)": ~pred & inner}


def score(model, images: torch.Tensor, masks: torch.Tensor) -> dict:
    pred, truth = segment(model, images, batch_size=64).probabilities > 0.5, masks > 0
    dice = overlap_scores(pred, truth)[0]
    row = {"dice": dice.mean().item(), "share_under_0.5": (dice < 0.5).double().mean().item(),
           "target_pixels": truth.sum().item()}
    for name, wrong in kinds(pred, truth).items():
        fixed = torch.where(wrong, truth, pred)  # this kind's pixels put right, the rest as predicted
        row[name] = {"per_target_pixel": wrong.sum().item() / max(1, truth.sum().item()),
                     "dice_if_fixed": overlap_scores(fixed, truth)[0].mean().item()}
    return row


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("runs", nargs="+")
    p.add_argument("--test-size", type=int, default=2000)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--json", default=None)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    test = load_test("mnist-segmentation", size=args.test_size, root=args.data_dir, progress=False)
    splits = {"test": (test.images, test.labels), "ood": (test.extra["ood"].images, test.extra["ood"].labels)}
    splits = {k: (x.to(args.device), m.to(args.device)) for k, (x, m) in splits.items()}
    out = {}
    for run in args.runs:
        model, ckpt = load_model(run, which="last", device=args.device)
        model.eval()
        for split, (images, masks) in splits.items():
            row = score(model, images, masks)
            out[f"{run} {split}"] = {"model": ckpt.model_name, "split": split, **row}
            print(f"{ckpt.model_name} ({run}), {split}: Dice {row['dice']:.4f}, "
                  f"{100 * row['share_under_0.5']:.1f}% of canvases under 0.5", flush=True)
            for name, v in row.items():
                if isinstance(v, dict):
                    print(f"    {name}: {v['per_target_pixel']:.4f} per target pixel, "
                          f"Dice {v['dice_if_fixed']:.4f} if put right", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": shlex.join(["python", *sys.argv]), "rows": out}, f, indent=1)


if __name__ == "__main__":
    main()
