"""SegCaps at its starting weights: how much each capsule layer varies with the image, and how much gradient it gets.

Not a timing: a diagnostic of the start the probes in docs/results.md ("Why
SegCaps trails the U-Net") vary. For each ``--variant`` (model options as
``KEY=VALUE,...``; ``default`` for none) it builds SegCaps with the same seed,
runs one batch of fixed test canvases of the mnist-segmentation task through
it and prints, for every layer: the mean capsule length, the spread of the
lengths across the images (standard deviation over the batch, averaged over
capsules and positions), and the relative gradient |grad| / |weight| of the
layer's vote kernel under the registered loss.

    python benchmarks/segcaps_start.py [--variant default squash=exp init_gain=3,bias_init=0.01] [--batch-size 8]
                                       [--data-dir ../shared/data] [--json FILE]
"""
from __future__ import annotations

import argparse

import torch

from capsnet.bench import markdown_table, publish
from capsnet.data.segmentation import segmentation_test
from capsnet.data.sets import load_dataset
from capsnet.models import MODELS, create_model
from capsnet.cli import _model_option
from capsnet.data.tasks import TEST_SEED


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variant", nargs="+", default=["default", "squash=exp"],
                   help="model options per variant, KEY=VALUE joined by commas (no list values); 'default' for none")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seed", type=int, default=0, help="the weights' seed (the canvases are the fixed test set's)")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--json", default=None, help="write the table and its context here")
    args = p.parse_args()
    torch.set_num_threads(1)
    digits = load_dataset("mnist", "test", root=args.data_dir).images
    images, masks = segmentation_test(digits, args.batch_size, seed=TEST_SEED)  # the test set's first canvases
    rows = []
    for variant in args.variant:
        options = {} if variant == "default" else dict(_model_option(o) for o in variant.split(","))
        torch.manual_seed(args.seed)
        model = create_model("segcaps", **options)
        grids = model.capsule_grids(images)
        MODELS["segcaps"].loss(model, images, masks)[0].backward()
        for name, grid in grids.items():
            lengths = grid.detach().norm(dim=2)  # (B, J, H, W)
            w = model.caps[name].weight if name in model.caps else model.conv1.weight
            rows.append({"variant": variant, "layer": name, "mean_length": lengths.mean().item(),
                         "spread": lengths.std(0).mean().item(), "relative_gradient": (w.grad.norm() / w.norm()).item()})
    text = markdown_table(["variant", "layer", "mean length", "spread across images", "relative gradient"],
                          ([r["variant"], r["layer"], f"{r['mean_length']:.3f}", f"{r['spread']:.4f}",
                            f"{r['relative_gradient']:.1e}"] for r in rows), "llrrr")
    publish("benchmarks/segcaps_start.py", rows, text, args.json)


if __name__ == "__main__":
    main()
