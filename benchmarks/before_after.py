"""Training steps of another checkout's capsnet against this one's, paired in one process: images/s, the step
time ratio and peak step memory, for registered models at MNIST size (28x28, 10 classes).

The other checkout's package (its ``src/capsnet``, e.g. a ``git worktree`` of
an earlier commit) is copied into a temporary folder as ``capsnet_before``
(its imports are all relative) and imported beside this ``capsnet``; the
same seeded weights, batch and loss are built from each, and their
training steps (forward, the model's loss, backward, Adam) alternate step
by step (``capsnet.bench.alternate``), so load from other processes hits
both alike. The ratio is before / after per repeat: above 1, this checkout
is faster.

    git worktree add /tmp/before HEAD~3
    python benchmarks/before_after.py --before /tmp/before/src [--models inverted-capsnet] [--batch-size 32]
                                      [--repeats 15] [--json FILE]
"""
from __future__ import annotations

import argparse
import importlib
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from capsnet.bench import _Runner, alternate, markdown_table, publish, show_spread, spread
from capsnet.memory import keep_freed_memory
from capsnet.models import MODELS, model_spec


def import_before(src: Path, into: Path):
    """The package at ``src``/capsnet imported as ``capsnet_before`` from a copy in ``into``."""
    if not (src / "capsnet" / "__init__.py").is_file():
        raise SystemExit(f"{src} holds no capsnet package (give the other checkout's src folder)")
    shutil.copytree(src / "capsnet", into / "capsnet_before", ignore=shutil.ignore_patterns("__pycache__"))
    sys.path.insert(0, str(into))
    return importlib.import_module("capsnet_before")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", required=True, type=Path, help="the other checkout's src folder")
    p.add_argument("--models", nargs="+", default=["inverted-capsnet"], choices=list(MODELS))
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--json", default=None, help="write the table and its context here")
    args = p.parse_args()
    keep_freed_memory()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        before = import_before(args.before, Path(tmp))
        for name in args.models:
            runners = {}
            for tag, spec_of in (("before", before.models.model_spec), ("after", model_spec)):
                spec = spec_of(name)
                config = spec.config(input_height=28, input_width=28, in_channels=1, num_classes=10)
                torch.manual_seed(0)
                model = spec.build(config)
                g = torch.Generator().manual_seed(0)
                images = torch.rand(args.batch_size, 1, 28, 28, generator=g)
                labels = torch.randint(0, 10, (args.batch_size,), generator=g)
                runners[tag] = _Runner(model, "train", images, labels, 1e-3, loss_fn=spec.loss)
            times = alternate({tag: r.time_step for tag, r in runners.items()}, args.repeats)
            ratios = [b / a for b, a in zip(times["before"], times["after"])]
            row = {"model": name, "batch": args.batch_size,
                   **{f"{tag}_images_per_s": args.batch_size / statistics.median(t) for tag, t in times.items()},
                   **spread(ratios),
                   **{f"{tag}_peak_mb": r.peak_bytes() / 2**20 for tag, r in runners.items()}}
            rows.append(row)
            print(f"{name}: before {row['before_images_per_s']:.1f} images/s, after {row['after_images_per_s']:.1f}, "
                  f"before / after {row['ratio']:.2f}", file=sys.stderr, flush=True)
    publish("benchmarks/before_after.py", rows, markdown_table(
        ["model", "before images/s", "after images/s", "before step / after step, median (min-max)", "before peak MB",
         "after peak MB"],
        ([r["model"], f"{r['before_images_per_s']:.1f}", f"{r['after_images_per_s']:.1f}", show_spread(r),
          f"{r['before_peak_mb']:.0f}", f"{r['after_peak_mb']:.0f}"] for r in rows)), args.json)


if __name__ == "__main__":
    main()
