"""Diagnosis: does the mask threshold (probability > 0.5) cost a segmentation run Dice, chosen on validation canvases?

For each run: its last weights' probabilities on N validation canvases made from MNIST training digits the run never
trained on (the digits outside its seeded --train-size subset, as `load_training` draws it, with the test split's
canvas rule and seed), on the first N fixed test canvases and on the out-of-distribution ones. Prints Dice at every
threshold of a grid on each split, the threshold that maximises the validation Dice, and the test and OOD Dice at
that threshold beside 0.5's. The test figures play no part in the choice.

    python docs/results/segmentation-threshold/threshold.py RUN_DIR [RUN_DIR ...] [--size 2000] [--data-dir DIR] \
        [--json OUT]
"""
import argparse
import json
import shlex
import sys

import torch

from capsnet.checkpoint import load_checkpoint
from capsnet.data.segmentation import overlap_scores
from capsnet.data.sets import load_dataset
from capsnet.data.tasks import load_test, nested_subset, task
from capsnet.evaluate import load_model
from capsnet.figures.segmentation import segment

GRID = [round(0.05 * k, 2) for k in range(2, 19)]  # 0.10 .. 0.90


def dice_at(p: torch.Tensor, truth: torch.Tensor) -> dict[float, float]:
    return {t: overlap_scores(p > t, truth)[0].mean().item() for t in GRID + [0.5]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--size", type=int, default=2000)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    test = load_test("mnist-segmentation", size=args.size, root=args.data_dir, progress=False)
    train_digits = load_dataset("mnist", "train", root=args.data_dir, progress=False)
    rows = {}
    for run in args.runs:
        ckpt = load_checkpoint(run, "last")
        tc = ckpt.train_config
        n = len(train_digits)
        seen = nested_subset(n, tc["train_size"], tc["seed"]) if tc.get("train_size") else torch.arange(n)
        unseen = torch.ones(n, dtype=torch.bool)
        unseen[seen] = False
        if tc.get("val_size"):
            raise SystemExit(f"{run} held out a validation split of its own; this script expects none")
        val = task("mnist-segmentation").held(train_digits.subset(unseen.nonzero().flatten()[:args.size]), args.size,
                                              False)
        model, _ = load_model(run, which="last")
        model.eval()
        splits = {"val": (val.images, val.labels), "test": (test.images, test.labels),
                  "ood": (test.extra["ood"].images, test.extra["ood"].labels)}
        scores = {k: dice_at(segment(model, x, batch_size=64).probabilities, m > 0) for k, (x, m) in splits.items()}
        best = max(GRID, key=lambda t: scores["val"][t])
        rows[run] = {"model": ckpt.model_name, "seed": tc["seed"], "chosen": best, "dice": scores}
        print(f"{ckpt.model_name} ({run}): validation's best threshold {best:.2f}; "
              + ", ".join(f"{k} Dice {s[0.5]:.4f} at 0.5, {s[best]:.4f} at {best:.2f}" for k, s in scores.items()),
              flush=True)
        print("    " + "  ".join(f"{t:.2f}:{scores['val'][t]:.4f}" for t in GRID), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": shlex.join(["python", *sys.argv]), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
