"""How much a capsule U-Net's layers vary with their input: for every layer, the capsules' mean length and the
standard deviation of each capsule's length across the inputs (averaged over capsule types and positions). A
layer whose lengths do not vary across inputs passes nothing about the input on: its output is a constant.

Reads run directories (their last weights) and fresh models at their start (``--start MODEL[:OPTION=VALUE,...]``,
torch seeded with 0 before each is built), on the first --test-size test inputs of --dataset (the run's own for a
run directory; CapsPix2pix: label maps and noise seed 0; SegCaps: images). Usage:

    python capsule_spread.py [RUN_DIR ...] [--start capspix2pix:init_gain=3.0,bias_init=0.01 ...]
        [--dataset mnist-skeleton] [--test-size 64] [--data-dir DIR] [--json OUT]
"""
import argparse
import functools
import json
import warnings

import torch

from capsnet.cli import _model_option
from capsnet.data.tasks import load_test
from capsnet.evaluate import load_model
from capsnet.models import create_model

p = argparse.ArgumentParser()
p.add_argument("runs", nargs="*")
p.add_argument("--start", action="append", default=[], help="MODEL[:OPTION=VALUE,...]: a fresh model at its start")
p.add_argument("--dataset", default="mnist-skeleton", help="the inputs for --start models")
p.add_argument("--test-size", type=int, default=64)
p.add_argument("--data-dir")
p.add_argument("--json")
args = p.parse_args()


@functools.cache
def inputs(dataset: str) -> torch.Tensor:
    """The first --test-size test inputs of ``dataset`` in [0, 1], loaded once per data set."""
    split = load_test(dataset, size=args.test_size, root=args.data_dir, progress=False)
    return split.images.float() if split.images.is_floating_point() else split.images.float() / 255


def grids(model, dataset: str) -> dict[str, torch.Tensor]:
    x = inputs(dataset)
    model.eval()
    with torch.no_grad():
        if hasattr(model, "generator"):
            return model.generator.capsule_grids(x, model.noise(x.shape[0], 0))
        return model.capsule_grids(x)


models = []
for d in args.runs:
    model, ckpt = load_model(d, which="last", device="cpu")
    models.append((d, model, ckpt.train_config["dataset"]))
for spec in args.start:
    name, _, opts = spec.partition(":")
    kw = dict(_model_option(o) for o in opts.split(",") if o)  # each as `capsnet train --model-option` reads it
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # capsule_stack's warning about starts without the routing bias
        model = create_model(name, **kw)
    models.append((f"start {spec}", model, args.dataset))
rows = []
for label, model, dataset in models:
    lengths = {k: g.norm(dim=2) for k, g in grids(model, dataset).items()}  # (N, T, h, w) per layer
    row = {"model": label, **{k: [round(L.mean().item(), 4), round(L.std(0).mean().item(), 4)]
                              for k, L in lengths.items()}}
    rows.append(row)
    print(label)
    print("  " + "  ".join(f"{k} {m:.2f}/{s:.4f}" for k, (m, s) in list(row.items())[1:]), flush=True)
if args.json:
    with open(args.json, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
