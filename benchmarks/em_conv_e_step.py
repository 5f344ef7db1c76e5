"""EM's convolutional E-step modes against each other: training images/s and peak step memory.

``--model-option conv_e_step=...`` (capsnet/models/em_capsnet.py) chooses how
a convolutional capsule layer's E-step normalises a child's R: ``window``
(each window on its own, the default), ``child`` (over every parent of every
window holding the child) or ``child-type`` (over those windows for each
parent type, the official code's). The shared modes add a scatter-max and a
scatter-add over the E-step's (windows x parents x children) entries. This
times full training steps (forward, spread loss, backward, Adam) of an EM
model at MNIST size (28x28, 10 classes) in each mode, the modes taking turns
repeat by repeat in one process, and reports each mode's step time as a
paired ratio to ``window``'s.

    python benchmarks/em_conv_e_step.py [--model em-capsnet-small] [--iterations 2 3] [--batch-size 32]
                                        [--repeats 5] [--json FILE]
"""
from __future__ import annotations

import argparse
import statistics
import sys

import torch

from capsnet.bench import _Runner, alternate, markdown_table, publish, show_spread, spread
from capsnet.memory import keep_freed_memory
from capsnet.models import model_spec
from capsnet.models.em_capsnet import CONV_E_STEPS


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="em-capsnet-small", choices=["em-capsnet-small", "em-capsnet"])
    p.add_argument("--iterations", type=int, nargs="+", default=[2, 3])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", default=None, help="write the table and its context here")
    args = p.parse_args()
    keep_freed_memory()
    spec, rows = model_spec(args.model), []
    g = torch.Generator().manual_seed(0)
    images = torch.rand(args.batch_size, 1, 28, 28, generator=g)
    labels = torch.randint(0, 10, (args.batch_size,), generator=g)
    for iterations in args.iterations:
        runners = {}
        for mode in CONV_E_STEPS:
            config = spec.config(input_height=28, input_width=28, in_channels=1, num_classes=10,
                                 routing_iterations=iterations, conv_e_step=mode)
            torch.manual_seed(0)
            runners[mode] = _Runner(spec.build(config), "train", images, labels, 1e-3, loss_fn=spec.loss)
        times = alternate({mode: r.time_step for mode, r in runners.items()}, args.repeats)
        for mode in CONV_E_STEPS:
            ratios = [t / w for t, w in zip(times[mode], times["window"])]
            rows.append({"model": args.model, "iterations": iterations, "conv_e_step": mode, "batch": args.batch_size,
                         "images_per_s": args.batch_size / statistics.median(times[mode]),
                         **spread(ratios),
                         "peak_mb": runners[mode].peak_bytes() / 2**20})
            print(f"{iterations} iterations, {mode}: {rows[-1]['images_per_s']:.1f} images/s", file=sys.stderr,
                  flush=True)
    publish("benchmarks/em_conv_e_step.py", rows, markdown_table(
        ["model", "iterations", "conv_e_step", "images/s", "step / window's step, median (min-max)", "peak MB"],
        ([r["model"], r["iterations"], r["conv_e_step"], f"{r['images_per_s']:.1f}", show_spread(r),
          f"{r['peak_mb']:.0f}"] for r in rows), align="lrlrrr"), args.json)


if __name__ == "__main__":
    main()
