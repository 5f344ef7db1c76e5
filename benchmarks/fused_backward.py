"""The fused backward of EM and inverted dot-product attention routing, and the block copy of the matrix
capsule votes, each against the plain operations: training images/s and peak step memory.

EMRouting and InvertedDotProductRouting (capsnet/routing/_fused.py) take the
votes' gradient from all their iterations in one batched product; with
``fused_backward=False`` they run plain autograd, which builds one
vote-sized outer product per matrix-vector product and adds them up.
ConvMatrixCaps lays its votes out with ``capsnet._eager.permute_contiguous``,
which moves each 4-entry pose row as one element; "entrywise copy" turns
that off (PyTorch's own copy, one entry at a time). All variants give the
same values and gradients (tests/test_routing_em.py,
tests/test_routing_inverted.py, tests/test_eager.py). This times full
training steps (forward, the model's loss, backward, Adam) of the
registered models at MNIST size (28x28, 10 classes) each way, the variants
alternating repeat by repeat in one process (so load from other processes
hits all alike), and reports the paired ratio of each step time to the
default's (fused, block copy) and each one's peak tensor memory.

    python benchmarks/fused_backward.py [--models em-capsnet-small em-capsnet inverted-capsnet]
                                        [--iterations 2 3] [--batch-size 32] [--repeats 5] [--json FILE]

(Before inverted attention's fused backward this script was benchmarks/em_backward.py, EM only.)
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import sys

import torch

from capsnet import _eager
from capsnet.bench import _Runner, alternate, markdown_table, publish, show_spread, spread
from capsnet.memory import keep_freed_memory
from capsnet.models import model_spec
from capsnet.routing import EMRouting, InvertedDotProductRouting

MODELS = ("em-capsnet-small", "em-capsnet", "inverted-capsnet")
VARIANTS = ("fused", "plain", "entrywise copy")  # the default; fused_backward=False; the votes' copy entry by entry


def with_fused_backward(model: torch.nn.Module, fused: bool) -> torch.nn.Module:
    """A copy of ``model`` whose EM or inverted attention routing modules take the fused (or the plain) backward."""
    model = copy.deepcopy(model)
    found = [m for m in model.modules() if isinstance(m, (EMRouting, InvertedDotProductRouting))]
    if not found:
        raise SystemExit(f"{type(model).__name__} has no routing with a fused backward: nothing to compare")
    for m in found:
        m.fused_backward = fused
    return model


@contextlib.contextmanager
def entrywise_copies():
    """``permute_contiguous`` without its block copy: PyTorch's permute and copy, one entry at a time."""
    saved = dict(_eager._BLOCKS)
    _eager._BLOCKS.clear()
    try:
        yield
    finally:
        _eager._BLOCKS.update(saved)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--iterations", type=int, nargs="+", default=[2, 3])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", default=None, help="write the table and its context here")
    args = p.parse_args()
    keep_freed_memory()
    rows = []
    for name in args.models:
        for iterations in args.iterations:
            spec = model_spec(name)
            config = spec.config(input_height=28, input_width=28, in_channels=1, num_classes=10,
                                 routing_iterations=iterations)
            torch.manual_seed(0)
            model = spec.build(config)
            g = torch.Generator().manual_seed(0)
            images = torch.rand(args.batch_size, 1, 28, 28, generator=g)
            labels = torch.randint(0, 10, (args.batch_size,), generator=g)
            runners = {v: _Runner(with_fused_backward(model, v != "plain"), "train", images, labels, 1e-3,
                                  loss_fn=spec.loss) for v in VARIANTS}
            copies = {v: entrywise_copies if v == "entrywise copy" else contextlib.nullcontext for v in VARIANTS}

            def step(v: str):
                def run() -> float:
                    with copies[v]():
                        return runners[v].time_step()
                return run

            times = alternate({v: step(v) for v in VARIANTS}, args.repeats)
            for v in VARIANTS:
                ratios = [t / f for t, f in zip(times[v], times["fused"])]
                with copies[v]():
                    peak = runners[v].peak_bytes() / 2**20
                rows.append({"model": name, "iterations": iterations, "variant": v, "batch": args.batch_size,
                             "weights": config.num_weights, "images_per_s": args.batch_size / statistics.median(times[v]),
                             **spread(ratios),
                             "peak_mb": peak})
                print(f"{name}, {iterations} iterations, {v}: {rows[-1]['images_per_s']:.1f} images/s, "
                      f"step / fused step {rows[-1]['ratio']:.2f}", file=sys.stderr, flush=True)
    publish("benchmarks/fused_backward.py", rows, markdown_table(
        ["model", "iterations", "variant", "images/s", "step / fused step, median (min-max)", "peak MB"],
        ([r["model"], r["iterations"], r["variant"], f"{r['images_per_s']:.1f}", show_spread(r), f"{r['peak_mb']:.0f}"]
         for r in rows), align="lrlrrr"), args.json)


if __name__ == "__main__":
    main()
