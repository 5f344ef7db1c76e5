"""Where one training step of the paper's CapsNet spends its time on CUDA: torch.profiler's table by kernel.

    PYTHONPATH=src python3 benchmarks/profile_step.py --batch-size 128 [--compile default|none] [--dtype bf16] [--by-op]

The step is `capsnet bench`'s (capsnet.bench._Runner: margin and reconstruction loss, fused Adam), run 5 times
untimed (compiling), then 5 times under the profiler. Compare "Self CUDA time total" with "Self CPU time total": a
step whose CPU time is the larger waits on kernel launches (CUDA graphs, --compile reduce-overhead, help), otherwise
the table's top rows are what limits it. Results: benchmarks/results/gpu-h100-2026-11-25/extra/.
"""
from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from capsnet.bench import _Runner
from capsnet.models.capsnet import CapsNet, CapsNetConfig
from capsnet.runtime import COMPILE_MODES


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--compile", choices=("none", *COMPILE_MODES), default="default",
                   help="none: eager, where every row below is an operation of the model's own code")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="bf16")
    p.add_argument("--rows", type=int, default=25, help="rows listed (kernels, or operations with --by-op)")
    p.add_argument("--by-op", action="store_true",
                   help="list operations with their input shapes instead of kernels (with --compile none, which "
                        "part of the model each is: the votes' bmm is (i, B, 8) x (i, 8, 160) over blocks of i of the 1,152 "
                        "primary capsules (the routing's products have 16 = the output capsule's length), the decoder's "
                        "matrices 160x512, 512x1024 and 1024x784, the convolutions' weights 256x1x9x9 and "
                        "256x256x9x9)")
    p.add_argument("--device", default="cuda", help="cuda, or cpu to try the script (CPU time only)")
    args = p.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda, but torch sees no CUDA device")
    torch.manual_seed(0)
    model = CapsNet(CapsNetConfig()).to(device)
    images = torch.rand(args.batch_size, 1, 28, 28, device=device)
    labels = torch.randint(0, 10, (args.batch_size,), device=device)
    runner = _Runner(model, "train", images, labels, 1e-3, bf16=args.dtype == "bf16", fused=device.type == "cuda",
                     compile=False if args.compile == "none" else args.compile)
    for _ in range(5):
        runner.time_step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities, record_shapes=args.by_op) as prof:
        for _ in range(5):
            runner.time_step()
    print(f"== batch {args.batch_size}, compile {args.compile}, {args.dtype}, {device.type}: 5 steps")
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(prof.key_averages(group_by_input_shape=args.by_op).table(sort_by=sort, row_limit=args.rows,
                                                                    max_name_column_width=70))


if __name__ == "__main__":
    main()
