"""The routing family side by side: training images/s, peak step memory and routing's share of a step.

For each registered capsule model (one per routing algorithm; MNIST-sized,
28x28, 10 classes) this times full training steps (forward, the model's own
loss, backward, Adam) and the same steps with every routing module swapped
for a stand-in that averages the votes (the same call shape, no rounds):
routing's share is 1 - (step with the stand-in) / (step with the routing),
paired repeat by repeat in the same process, so load from other processes
hits both alike. For CapsNet the stand-in also drops the linear fast path,
so its votes are built by the plain path and counted outside routing.
Peak memory is the tensor memory of one training step (capsnet.bench).

    python benchmarks/routing_family.py [--batch-size 64] [--repeats 5] [--models ...] [--device cuda]
                                        [--dtype bf16] [--compile MODE] [--json FILE]

A model written NAME:ROUTING is that model with its ``routing`` field set (CapsNet's digit capsules:
``capsnet:em``, ``capsnet:self-attention``), so one network can be timed under each routing.

--dtype bf16 runs the steps under bfloat16 autocast (as `capsnet train --amp bf16`; the routings run in fp32 inside):
for GPUs, many times slower on a CPU without bfloat16 units; --dtype fp16 under float16 autocast (without
`--amp fp16`'s gradient scaler). --compile MODE adds a row per model with both steps
compiled as `capsnet train --compile MODE` does (every registered classifier's step is one graph:
tests/test_models_registry.py), timed in turn with the eager steps, and its paired speed-up over the eager step.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys

import torch
from torch import nn

from capsnet.bench import COMPILED_WARMUP, _Runner, alternate, default_steps_per_timing, markdown_table, publish, show_spread, spread
from capsnet.memory import keep_freed_memory
from capsnet.experiments import model_entry, model_title
from capsnet.models import MODELS, model_spec, num_weights
from capsnet.routing import ROUTINGS, RoutingResult, routing_name

MODELS_COMPARED = ("capsnet", "em-capsnet-small", "em-capsnet", "efficient-capsnet", "inverted-capsnet")


class MeanVotes(nn.Module):
    """A stand-in for routing: each upper capsule is the mean vote, coupling uniform (no rounds).

    The mean is a sum divided by I: the matrix layers' votes are a transposed view, and torch's ``mean``
    over that strided dimension took 19x as long as ``sum`` here (1.4 s against 74 ms, forward and
    backward, inverted-capsnet's first layer at batch 32), which made the stand-in dearer than some routings.
    """

    def forward(self, votes, activations=None, bias=None, *, record=False):
        B, I, J, D = votes.shape
        poses = votes.sum(dim=1) / I
        return RoutingResult(poses, torch.sigmoid(poses.mean(dim=-1)), votes.new_full((B, I, J), 1 / J))


def without_routing(model: nn.Module) -> nn.Module:
    """A copy of ``model`` with every registered routing module replaced by ``MeanVotes``."""
    model = copy.deepcopy(model)
    kinds = tuple(ROUTINGS.values())
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, kinds):
                setattr(parent, name, MeanVotes())
    return model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(MODELS_COMPARED),
                   help=f"registered models ({', '.join(MODELS)}), each optionally NAME:ROUTING")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32",
                   help="bf16, fp16: steps under bfloat16 or float16 autocast (fp16 without --amp fp16's gradient scaler)")
    p.add_argument("--steps-per-timing", type=int, default=None,
                   help="steps back to back in each timing (default: 1 on a CPU; 10 on CUDA, throughput as in "
                        "training, as capsnet bench)")
    p.add_argument("--compile", default=None, metavar="MODE",
                   help="also time both steps compiled: default, reduce-overhead (CUDA graphs), max-autotune or a "
                        "backend name")
    p.add_argument("--json", default=None, help="write the table and its context here")
    args = p.parse_args()
    for entry in args.models:  # checked as `capsnet experiment` checks its --models
        try:
            model_entry(entry)
        except ValueError as e:
            p.error(f"argument --models: {e}")
    keep_freed_memory()
    dev = torch.device(args.device)
    bf16, fp16 = args.dtype == "bf16", args.dtype == "fp16"
    steps = default_steps_per_timing(dev, args.steps_per_timing)
    fused = dev.type == "cuda"  # as capsnet train's Adam
    kinds = [None] + ([args.compile] if args.compile else [])  # eager, then compiled
    rows = []
    for entry in args.models:
        name, routing = model_entry(entry)
        spec = model_spec(name)
        config = spec.config(input_height=28, input_width=28, in_channels=1, num_classes=10,
                             **({"routing": routing} if routing else {}))
        torch.manual_seed(0)
        model = spec.build(config).to(dev)
        g = torch.Generator().manual_seed(0)
        images = torch.rand(args.batch_size, 1, 28, 28, generator=g).to(dev)
        labels = torch.randint(0, 10, (args.batch_size,), generator=g).to(dev)
        routes = routing_name(model) is not None  # a model without routing (the CNN baseline) has no share to time
        parts = (("full", model), ("bare", without_routing(model))) if routes else (("full", model),)
        runners = {(c, part): _Runner(m, "train", images, labels, 1e-3, bf16=bf16, fp16=fp16, loss_fn=spec.loss, steps=steps,
                                      fused=fused, compile=c or False)
                   for c in kinds for part, m in parts}
        for (c, _), r in runners.items():  # CUDA graphs record in the first calls; their peak kept for peak_bytes
            r.warm_up(COMPILED_WARMUP if c else 1)
        times = alternate({key: r.time_step for key, r in runners.items()}, args.repeats, warmup=0)
        for c in kinds:
            t_full = times[c, "full"]
            shares = [1 - b / f for f, b in zip(t_full, times[c, "bare"])] if routes else None
            row = {"model": entry, "title": model_title(entry), "routing": routing_name(model),
                   "weights": num_weights(config), "batch": args.batch_size,
                   "dtype": args.dtype, "compile": c or "none", "steps_per_timing": steps,
                   "images_per_s": args.batch_size / statistics.median(t_full),
                   "images_per_s_min": args.batch_size / max(t_full), "images_per_s_max": args.batch_size / min(t_full),
                   **(spread(shares, "routing_share") if routes else {"routing_share": None}),
                   "peak_mem_mb": runners[c, "full"].peak_bytes() / 2**20}
            if c:  # paired with the eager step of the same repeat
                row |= spread([e / t for e, t in zip(times[None, "full"], t_full)], "speedup_vs_eager", "speedup")
            rows.append(row)
            share = f"routing {100 * row['routing_share']:.0f}%" if routes else "no routing"
            print(f"{entry}{' compiled ' + c if c else ''}: {row['images_per_s']:.1f} images/s, {share}, "
                  f"{row['peak_mem_mb']:.0f} MB", file=sys.stderr, flush=True)
    publish("benchmarks/routing_family.py", rows, f"{args.dtype}, batch {args.batch_size}, {steps} step(s) a timing:\n\n"
            + markdown_table(["model", "routing", "compile", "weights", "train images/s, median (min-max)",
                              "routing share of a step, median (min-max)", "speed-up over eager", "peak MB"],
                             ([r["model"], r["routing"] or "-", r["compile"], f"{r['weights']:,}",
                               show_spread(r, "images_per_s", fmt=".1f"),
                               f"{100 * r['routing_share']:.0f}% ({100 * r['routing_share_min']:.0f}-"
                               f"{100 * r['routing_share_max']:.0f}%)" if r["routing_share"] is not None else "-",
                               show_spread(r, "speedup_vs_eager", "speedup") if "speedup_vs_eager" in r else "-",
                               f"{r['peak_mem_mb']:.0f}"] for r in rows),
                             align="lllrrrrr"), args.json)


if __name__ == "__main__":
    main()
