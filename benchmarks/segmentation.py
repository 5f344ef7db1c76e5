"""SegCaps beside the U-Net: training step time (as a ratio, paired in one process) and peak memory, and the
memory of one 512x512 image, training and inference (and the time of its second step; the first allocates).

Part 1 times full training steps (forward, the model's own loss with the
reconstruction term, backward, Adam) of each model at the same input size
and batch, alternating the models repeat by repeat, so load from other
processes hits both alike; the ratio is SegCaps' step over the U-Net's,
median over the paired repeats. Part 2 measures the peak tensor memory
(capsnet.bench: the profiler's allocations plus the resting tensors) of one
512x512 image, a training step and an inference pass. The issue's bars:
SegCaps' step at most 2x the U-Net's (the public code: 3.3x), one 512x512
image under 4 GB.

With ``--compile MODE`` part 1 also times each model compiled
(``capsnet.runtime.compile_model``, as ``capsnet train --compile MODE``;
"reduce-overhead" records CUDA graphs on a GPU), the same weights, paired
with the eager steps: its rows give the compiled step's speed-up over the
eager one and its ratio to the compiled U-Net's step. SegCaps' eager step is
many small kernels (local routing at every layer), so on a GPU it waits on
their launches (3.36x the U-Net's step on an H100, 2026-11-25).

    python benchmarks/segmentation.py [--size 64] [--batch-size 8] [--repeats 5] [--big 512] [--device cpu] [--dtype bf16]
                                      [--models segcaps unet] [--compile MODE] [--json FILE]

A model may carry config fields as ``NAME:FIELD=VALUE`` (VALUE as JSON, else a string; several joined by ``:``),
e.g. ``--models segcaps segcaps:routing=self-attention``: each such variant is a row of its own.
"""
from __future__ import annotations

import argparse
import statistics
import sys

import torch

from capsnet.bench import (COMPILED_WARMUP, _Runner, alternate, default_steps_per_timing, markdown_table,
                           model_variant, publish, show_spread, spread)
from capsnet.memory import keep_freed_memory
from capsnet.models import model_spec

MODELS = ("segcaps", "segcaps-r1", "unet")



def runner(name: str, size: int, batch: int, mode: str, device: str = "cpu", bf16: bool = False,
           steps: int = 1, compile: bool | str = False, options: dict | None = None, fp16: bool = False) -> _Runner:
    spec = model_spec(name)
    config = spec.config(input_height=size, input_width=size, **(options or {}))
    torch.manual_seed(0)
    model = spec.build(config).to(device)
    g = torch.Generator().manual_seed(0)
    images = torch.rand(batch, 1, size, size, generator=g).to(device)
    masks = (torch.rand(batch, 1, size, size, generator=g) > 0.8).to(torch.uint8).to(device)
    return _Runner(model, mode, images, masks, 1e-3, bf16=bf16, fp16=fp16, loss_fn=spec.loss, steps=steps, compile=compile,
                   fused=torch.device(device).type == "cuda")  # as capsnet train's Adam


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(MODELS), metavar="NAME[:FIELD=VALUE]",
                   help="the models to time (the U-Net, every ratio's reference, is always among them)")
    p.add_argument("--size", type=int, default=64, help="image side of the step-time comparison")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--big", type=int, default=512, help="image side of the one-image memory measurement (0: skip)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32", help="bf16, fp16: steps under "
                   "bfloat16 or float16 autocast (as capsnet train --amp bf16; fp16 without its gradient scaler; "
                   "for GPUs)")
    p.add_argument("--steps-per-timing", type=int, default=None,
                   help="steps back to back in each timing of part 1 (default: 1 on a CPU; 10 on CUDA, throughput as "
                        "in training, as capsnet bench)")
    p.add_argument("--compile", default=None, metavar="MODE",
                   help="also time each model compiled: default, reduce-overhead (CUDA graphs), max-autotune or a "
                        "backend name, as capsnet train --compile")
    p.add_argument("--json", default=None, help="write the table and its context here")
    args = p.parse_args()
    keep_freed_memory()
    # each model as typed (the U-Net, every ratio's reference, added if missing), with its config fields
    try:
        models = {text: model_variant(text, MODELS) for text in dict.fromkeys([*args.models, "unet"])}
        for name, options in models.values():  # a field the model lacks, or a value it refuses, named now
            model_spec(name).config(**options)
    except (TypeError, ValueError) as e:
        p.error(str(e))
    bf16, fp16 = args.dtype == "bf16", args.dtype == "fp16"
    steps = default_steps_per_timing(torch.device(args.device), args.steps_per_timing)
    kinds = [None] + ([args.compile] if args.compile else [])  # eager, then compiled
    runners = {(m, c): runner(*models[m][:1], args.size, args.batch_size, "train", args.device, bf16, steps,
                              compile=c or False, options=models[m][1], fp16=fp16) for c in kinds for m in models}
    for (m, c), r in runners.items():  # CUDA graphs record in the first calls; their peak kept for peak_bytes
        r.warm_up(COMPILED_WARMUP if c else 1)
    times = alternate({key: r.time_step for key, r in runners.items()}, args.repeats, warmup=0)
    rows = []
    for (m, c), r in runners.items():
        ratios = [t / u for t, u in zip(times[m, c], times["unet", c])]
        row = {"model": m, "compile": c or "none", "part": "step", "size": args.size, "batch": args.batch_size,
               "dtype": args.dtype, "steps_per_timing": steps, "weights": r.model.config.num_weights,
               "images_per_s": args.batch_size / statistics.median(times[m, c]),
               **spread(ratios, "step_ratio_to_unet", "step_ratio"), "peak_mem_mb": r.peak_bytes() / 2**20}
        if c:  # paired with the same model's eager step
            row.update(spread([e / t for e, t in zip(times[m, None], times[m, c])], "speedup_vs_eager", "speedup"))
        rows.append(row)
        print(f"{m}{' compiled ' + c if c else ''}: {row['images_per_s']:.1f} images/s, "
              f"{row['step_ratio_to_unet']:.2f}x the U-Net's step", file=sys.stderr, flush=True)
    del runners
    if args.big:
        for m in models:
            for mode in ("train", "infer"):
                r = runner(models[m][0], args.big, 1, mode, args.device, bf16, options=models[m][1], fp16=fp16)
                r.time_step()  # the first step allocates (Adam's state, the allocator's pages): untimed
                rows.append({"model": m, "part": f"{args.big}x{args.big}, {mode}", "size": args.big, "batch": 1,
                             "dtype": args.dtype,
                             "seconds": r.time_step(), "peak_mem_mb": r.peak_bytes() / 2**20})
                print(f"{m} {mode} {args.big}x{args.big}: {rows[-1]['peak_mem_mb']:.0f} MB", file=sys.stderr, flush=True)
                del r
    text = (f"\n{args.size}x{args.size}, batch {args.batch_size}, {args.dtype}, {steps} step(s) a timing, training "
            f"steps paired with the U-Net's (compiled with the compiled U-Net's):\n\n") + markdown_table(
        ["model", "compile", "weights", "train images/s", "step / U-Net step, median (min-max)",
         "speed-up over eager", "peak MB of a step"],
        ([r["model"], r["compile"], f"{r['weights']:,}", f"{r['images_per_s']:.1f}",
          show_spread(r, "step_ratio_to_unet", "step_ratio"),
          show_spread(r, "speedup_vs_eager", "speedup") if "speedup_vs_eager" in r else "-",
          f"{r['peak_mem_mb']:.0f}"] for r in rows if r["part"] == "step"))
    if args.big:
        text += f"\n\none {args.big}x{args.big} image:\n\n" + markdown_table(
            ["model", "step", "seconds (the second step)", "peak MB"],
            ([r["model"], r["part"].split(", ")[1], f"{r['seconds']:.2f}", f"{r['peak_mem_mb']:.0f}"]
             for r in rows if r["part"] != "step"), align="llrr")
    publish("benchmarks/segmentation.py", rows, text, args.json)


if __name__ == "__main__":
    main()
