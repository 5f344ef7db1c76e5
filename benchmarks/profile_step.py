"""Where one training step of the paper's CapsNet spends its time on CUDA: torch.profiler's table by kernel.

    PYTHONPATH=src python3 benchmarks/profile_step.py --batch-size 128 [--compile default] [--dtype bf16]

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
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--compile", choices=COMPILE_MODES, default="default")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="bf16")
    p.add_argument("--rows", type=int, default=25, help="kernels listed")
    args = p.parse_args()
    if not torch.cuda.is_available():
        p.error("needs a CUDA device")
    torch.manual_seed(0)
    model = CapsNet(CapsNetConfig()).cuda()
    images = torch.rand(args.batch_size, 1, 28, 28, device="cuda")
    labels = torch.randint(0, 10, (args.batch_size,), device="cuda")
    runner = _Runner(model, "train", images, labels, 1e-3, bf16=args.dtype == "bf16", fused=True,
                     compile=args.compile)
    for _ in range(5):
        runner.time_step()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            runner.time_step()
    print(f"== batch {args.batch_size}, compile {args.compile}, {args.dtype}: 5 steps")
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=args.rows, max_name_column_width=70))


if __name__ == "__main__":
    main()
