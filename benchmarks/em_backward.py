"""EM routing's fused backward against plain autograd: training images/s and peak step memory.

EMRouting (capsnet/routing/em.py, "Fast backward") takes the votes' gradient
from all its iterations in one batched product of rank 2T - 1; with
``fused_backward=False`` it runs plain autograd, which builds one vote-sized
outer product per matrix-vector product and adds them up. Both give the same
values and gradients (tests/test_routing_em.py). This times full training
steps (forward, spread loss, backward, Adam) of the registered EM models at
MNIST size (28x28, 10 classes) both ways, the two alternating repeat by
repeat in one process (so load from other processes hits both alike), and
reports the paired ratio of step times and each one's peak tensor memory.

    python benchmarks/em_backward.py [--models em-capsnet-small em-capsnet] [--iterations 2 3]
                                     [--batch-size 32] [--repeats 5] [--json FILE]
"""
from __future__ import annotations

import argparse
import copy
import shlex
import statistics
import sys

import torch

from capsnet.bench import _Runner, alternate, environment, write_record
from capsnet.memory import keep_freed_memory
from capsnet.models import model_spec
from capsnet.routing import EMRouting


def with_fused_backward(model: torch.nn.Module, fused: bool) -> torch.nn.Module:
    """A copy of ``model`` whose EM routing modules take the fused (or the plain) backward."""
    model = copy.deepcopy(model)
    found = [m for m in model.modules() if isinstance(m, EMRouting)]
    if not found:
        raise SystemExit(f"{type(model).__name__} has no EMRouting module: nothing to compare")
    for m in found:
        m.fused_backward = fused
    return model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["em-capsnet-small", "em-capsnet"],
                   choices=["em-capsnet-small", "em-capsnet"])
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
            runners = {fused: _Runner(with_fused_backward(model, fused), "train", images, labels, 1e-3,
                                      loss_fn=spec.loss) for fused in (True, False)}
            times = alternate({fused: r.time_step for fused, r in runners.items()}, args.repeats)
            ratios = [f / p_ for f, p_ in zip(times[True], times[False])]
            row = {"model": name, "iterations": iterations, "batch": args.batch_size, "weights": config.num_weights,
                   "fused_images_per_s": args.batch_size / statistics.median(times[True]),
                   "plain_images_per_s": args.batch_size / statistics.median(times[False]),
                   "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
                   "fused_peak_mb": runners[True].peak_bytes() / 2**20,
                   "plain_peak_mb": runners[False].peak_bytes() / 2**20}
            rows.append(row)
            print(f"{name}, {iterations} iterations: fused {row['fused_images_per_s']:.1f} images/s, plain "
                  f"{row['plain_images_per_s']:.1f}, step ratio {row['ratio']:.2f}", file=sys.stderr, flush=True)
    env = environment()
    print(" ".join(f"{k}={v}" for k, v in env.items()))
    print("| model | iterations | fused images/s | plain images/s | fused step / plain step, median (min-max) "
          "| fused peak MB | plain peak MB |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['model']} | {r['iterations']} | {r['fused_images_per_s']:.1f} | {r['plain_images_per_s']:.1f} | "
              f"{r['ratio']:.2f} ({r['ratio_min']:.2f}-{r['ratio_max']:.2f}) | {r['fused_peak_mb']:.0f} | "
              f"{r['plain_peak_mb']:.0f} |")
    if args.json:
        write_record(args.json, shlex.join(["python", "benchmarks/em_backward.py", *sys.argv[1:]]), env, rows)


if __name__ == "__main__":
    main()
