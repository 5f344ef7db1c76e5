"""Block size of capsnet's CPU routing: the digit capsule layer's time against lower capsules per block.

``DynamicRouting.route_linear`` walks the votes in blocks of lower capsules
(``routing.chunk``; None picks ``capsnet.routing.dynamic_linear.default_chunk``: about 4 MiB
of votes but at least 256 capsules; the "4 MiB rule" rows are the rule before
that floor). For each
batch size this times the paper's digit capsule layer alone, forward and
backward (votes and 3 routing rounds, the part of a training step that the
block size changes), for the default and for fixed block sizes. The block
sizes take turns within each repeat, so load from other processes hits them
alike. Prints a table of medians and each size's time over the best one's;
--json records it with the command, commit, torch version and machine.

    python benchmarks/routing_blocks.py [--batch-size 32 128 512] [--repeats 7] [--json FILE]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from capsnet.bench import markdown_table, publish, show_spread
from capsnet.memory import keep_freed_memory
from capsnet.models import CapsNet, CapsNetConfig
from capsnet.routing.dynamic_linear import default_chunk

BLOCKS = (16, 32, 64, 144, 288, 576, 1152)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch-size", type=int, nargs="+", default=[32, 128, 512])
    p.add_argument("--blocks", type=int, nargs="+", default=list(BLOCKS), help="fixed block sizes to time beside the default")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--json", default=None, help="write the table and its context here")
    args = p.parse_args()
    keep_freed_memory()  # as capsnet train runs
    torch.manual_seed(0)
    model = CapsNet(CapsNetConfig())
    digits = model.digits
    rows = []
    for B in args.batch_size:
        with torch.no_grad():
            u = model.primary(torch.relu(model.conv1(torch.rand(B, 1, 28, 28))))  # (B, 1152, 8)
        u.requires_grad_(True)
        default = default_chunk(u, 10, 16)
        old_rule = max(1, min(1152, (4 << 20) // (B * 10 * 16 * 4)))  # before MIN_CHUNK: about 4 MiB of votes
        sizes = [None, *sorted(set(args.blocks) | {old_rule})]
        times: dict[int | None, list[float]] = {k: [] for k in sizes}
        for r in range(args.repeats + 1):  # the first round warms up
            for k in sizes[r % len(sizes):] + sizes[:r % len(sizes)]:
                digits.routing.chunk = k
                start = time.perf_counter()
                digits(u).poses.sum().backward()
                elapsed = time.perf_counter() - start
                u.grad = None
                digits.zero_grad(set_to_none=True)
                if r:
                    times[k].append(elapsed)
        medians = {k: statistics.median(v) for k, v in times.items()}
        best = min(medians.values())
        for k in sizes:
            rows.append({"batch": B, "block": k if k is not None else default, "is_default": k is None,
                         "is_old_rule": k == old_rule,
                         "ms": 1000 * medians[k], "ms_min": 1000 * min(times[k]), "ms_max": 1000 * max(times[k]),
                         "over_best": medians[k] / best, "repeats": args.repeats})
        print(f"batch {B} done", file=sys.stderr, flush=True)
    publish("benchmarks/routing_blocks.py", rows, markdown_table(
        ["batch", "lower capsules per block", "digit caps fwd+bwd, ms median (min-max)", "over the best"],
        ([r["batch"], f"{r['block']} (default)" if r["is_default"] else
          f"{r['block']}" + (" (4 MiB rule)" if r["is_old_rule"] else ""), show_spread(r, "ms", fmt=".1f"),
          f"{r['over_best']:.2f}"] for r in rows), align="rrrr"), args.json)


if __name__ == "__main__":
    main()
