"""The cost of self-attention routing's overflow guard (2026-11-29): Efficient-CapsNet's training step with the
routing as it is (votes scaled by a power of two where their scores could overflow; ops._scale) against the same
routing written without the guard (the formula before the change), taking turns in one process (paired ratios,
capsnet.bench.alternate). Prints a table and, with --json, writes it.

    python benchmarks/attention_overflow.py [--batch-size 64] [--repeats 30] [--json OUT]
"""
import argparse
import math
import statistics
import time

import torch

from capsnet.bench import alternate, publish
from capsnet.models import create_model
from capsnet.ops import exp_squash, safe_norm
from capsnet.routing import SelfAttentionRouting
from capsnet.routing.result import RoutingResult

p = argparse.ArgumentParser()
p.add_argument("--batch-size", type=int, default=64)
p.add_argument("--repeats", type=int, default=30)
p.add_argument("--json")
args = p.parse_args()

guarded = SelfAttentionRouting.forward


def unguarded(self, votes, activations=None, bias=None, *, record=False):
    """The routing before the guard: scores straight from the votes (NaN from about 1e19)."""
    D = votes.shape[-1]
    total = votes.sum(dim=1, keepdim=True)
    c = torch.softmax((votes * total).sum(dim=-1) / math.sqrt(D), dim=-1)
    s = ((c + self.prior).unsqueeze(-1) * votes).sum(dim=1)
    if bias is not None:
        s = s + bias
    v = exp_squash(s)
    return RoutingResult(v, safe_norm(v, dim=-1), c, c.unsqueeze(1) if record else None)


torch.manual_seed(0)
model = create_model("efficient-capsnet")
x = torch.rand(args.batch_size, 1, 28, 28)


def step(forward):
    def run():
        SelfAttentionRouting.forward = forward
        t = time.perf_counter()
        out = model(x)
        (out.lengths.sum() + (out.reconstructions.sum() if out.reconstructions is not None else 0)).backward()
        return time.perf_counter() - t
    return run


times = alternate({"guarded": step(guarded), "unguarded": step(unguarded)}, args.repeats, warmup=3)
SelfAttentionRouting.forward = guarded
ratio = statistics.median(g / u for g, u in zip(times["guarded"], times["unguarded"]))
rows = {k: statistics.median(v) for k, v in times.items()}
text = "\n".join([f"{torch.get_num_threads()} thread(s), batch {args.batch_size}, {args.repeats} paired steps",
                  "| routing | median step (ms) |", "|---|---|",
                  *(f"| {k} | {1000 * v:.1f} |" for k, v in rows.items()),
                  f"guarded / unguarded, median of paired ratios: {ratio:.3f}"])
# the record names its command, commit and torch version (capsnet.bench.publish); a plain json.dump left them out
publish("benchmarks/attention_overflow.py", [{
    "batch_size": args.batch_size, "repeats": args.repeats, "threads": torch.get_num_threads(), "median_s": rows,
    "paired_ratio": ratio, "times_s": times}], text, args.json)
