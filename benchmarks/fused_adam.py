"""Adam fused or PyTorch's default, in the training steps of registered models on the CPU: images/s and the step
time ratio, paired in one process.

``capsnet train`` fuses Adam where ``capsnet.runtime.fuses_adam`` says (CUDA, and the CPU from torch 2.4). On the
CPU PyTorch's default Adam loops over the tensors in Python; the fused one is a kernel per step. This times the
same seeded model, batch and loss under each (forward, the model's loss, backward, Adam), alternating step by step
(``capsnet.bench.alternate``), so load from other processes hits both alike. The ratio is default / fused per
repeat: above 1, the fused step is faster. Also printed: the largest weight difference between the two after the
timed steps, which started from the same weights (float rounding, which Adam's division magnifies for weights
whose gradients are near zero).

    python benchmarks/fused_adam.py [--models capsnet efficient-capsnet] [--batch-size 32] [--repeats 15]
                                    [--json FILE]
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys

import torch

from capsnet.bench import _Runner, alternate, markdown_table, publish, show_spread, spread
from capsnet.memory import keep_freed_memory
from capsnet.models import MODELS, model_spec

# the README's quick-start CapsNet (64 conv1 channels, 8 primary types) beside the paper's full one
SIZES = {"capsnet-small": ("capsnet", {"conv1_channels": 64, "primary_types": 8})}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["capsnet-small", "capsnet", "efficient-capsnet"],
                   choices=[*SIZES, *(n for n, s in MODELS.items() if s.kind == "classification")])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--json", default=None, help="write the table and its context here")
    args = p.parse_args()
    keep_freed_memory()  # as capsnet train does
    rows = []
    for label in args.models:
        name, overrides = SIZES.get(label, (label, {}))
        spec = model_spec(name)
        config = spec.config(**{**overrides, "input_height": 28, "input_width": 28, "in_channels": 1,
                                "num_classes": 10})
        torch.manual_seed(0)
        model = spec.build(config)
        g = torch.Generator().manual_seed(0)
        images = torch.rand(args.batch_size, 1, 28, 28, generator=g)
        labels = torch.randint(0, 10, (args.batch_size,), generator=g)
        runners = {tag: _Runner(copy.deepcopy(model), "train", images, labels, 1e-3, fused=tag == "fused",
                                loss_fn=spec.loss) for tag in ("default", "fused")}
        times = alternate({tag: r.time_step for tag, r in runners.items()}, args.repeats)
        ratios = [d / f for d, f in zip(times["default"], times["fused"])]
        apart = max((a - b).abs().max().item() for a, b in zip(runners["default"].model.parameters(),
                                                                 runners["fused"].model.parameters()))
        row = {"model": label, "batch": args.batch_size, "weights": sum(t.numel() for t in model.parameters()),
               **{f"{tag}_images_per_s": args.batch_size / statistics.median(t) for tag, t in times.items()},
               **spread(ratios), "max_weight_difference": apart}
        rows.append(row)
        print(f"{label}: default {row['default_images_per_s']:.1f} images/s, fused {row['fused_images_per_s']:.1f}, "
              f"default / fused {row['ratio']:.3f}", file=sys.stderr, flush=True)
    publish("benchmarks/fused_adam.py", rows, markdown_table(
        ["model", "weights", "default Adam images/s", "fused Adam images/s",
         "default step / fused step, median (min-max)", "largest weight difference"],
        ([r["model"], f"{r['weights']:,}", f"{r['default_images_per_s']:.1f}", f"{r['fused_images_per_s']:.1f}",
          show_spread(r, fmt=".3f"), f"{r['max_weight_difference']:.1e}"] for r in rows)), args.json)


if __name__ == "__main__":
    main()
