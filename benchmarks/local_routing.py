"""Local routing (a convolutional capsule layer's votes, positions folded into the batch): DynamicRouting's
broadcast products beside its batched matmuls, at the vote shapes of SegCaps' layers.

``DynamicRouting.forward`` contracts over the few lower capsules of one
position with broadcast products (``(c[..., None] * u).sum(1)``) when there
are at most ``capsnet.routing.dynamic._FEW_CHILDREN`` of them, and with
batched matmuls over (B, J) otherwise (a dense layer's 1,152 primary
capsules). This times 3 rounds, forward and backward, both ways on the same
votes, alternating which goes first, and reports the median ratio
matmul / broadcast per shape (above 1: the broadcast path is faster).

    python benchmarks/local_routing.py [--batch 8] [--repeats 7] [--json FILE]
"""
from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time

import torch

import capsnet.routing.dynamic as dynamic
from capsnet.bench import alternate, markdown_table, publish, show_spread, spread
from capsnet.routing import DynamicRouting

# SegCaps R3 at 64x64 (capsnet.models.segcaps): layer -> (positions per image, child types T, parent types J, D)
SHAPES = {
    "conv_2_1 (32x32)": (32 * 32, 2, 4, 16),
    "conv_3_1 (16x16)": (16 * 16, 4, 8, 32),
    "deconv_1_2 (16x16)": (16 * 16, 16, 4, 32),
    "deconv_2_2 (32x32)": (32 * 32, 8, 4, 16),
    "seg_caps (64x64)": (64 * 64, 3, 1, 16),
}


def step(routing: DynamicRouting, votes: torch.Tensor, bias: torch.Tensor, few: int) -> float:
    """One forward and backward of 3 routing rounds with ``_FEW_CHILDREN = few``; seconds."""
    dynamic._FEW_CHILDREN = few
    votes.grad = bias.grad = None
    start = time.perf_counter()
    routing(votes, None, bias).poses.square().sum().backward()
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=8, help="images; each brings its positions")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--json", default=None, help="write the table and its context here")
    args = p.parse_args()
    default = dynamic._FEW_CHILDREN
    routing = DynamicRouting(3)
    g = torch.Generator().manual_seed(0)
    rows = []
    for name, (P, T, J, D) in SHAPES.items():
        votes = torch.randn(args.batch * P, T, J, D, generator=g).requires_grad_()  # (B*H*W, T, J, D)
        bias = torch.full((J, D), 0.1).requires_grad_()
        ways = {"broadcast": 10**6, "matmul": 0}  # _FEW_CHILDREN: every layer local, or none
        times = alternate({w: functools.partial(step, routing, votes, bias, few) for w, few in ways.items()},
                          args.repeats)
        ratios = [m / b for m, b in zip(times["matmul"], times["broadcast"])]
        rows.append({"layer": name, "votes": [args.batch * P, T, J, D],
                     "broadcast_ms": 1e3 * statistics.median(times["broadcast"]),
                     "matmul_ms": 1e3 * statistics.median(times["matmul"]),
                     **spread(ratios)})
        print(f"{name}: matmul / broadcast {rows[-1]['ratio']:.2f}", file=sys.stderr, flush=True)
    dynamic._FEW_CHILDREN = default
    table = markdown_table(
        ["layer", "votes (B*H*W, T, J, D)", "broadcast ms", "matmul ms", "matmul / broadcast, median (min-max)"],
        ([r["layer"], tuple(r["votes"]), f"{r['broadcast_ms']:.1f}", f"{r['matmul_ms']:.1f}", show_spread(r)]
         for r in rows), align="llrrr")
    publish("benchmarks/local_routing.py", rows, f"\n3 routing rounds, forward and backward, batch {args.batch}, median of "
            f"{args.repeats} paired repeats:\n\n{table}", args.json)


if __name__ == "__main__":
    main()
