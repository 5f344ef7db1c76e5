"""Where a CPU training step goes, capsnet vs the tutorial baseline (batch 128, MNIST CapsNet).

Run from the repository root: python benchmarks/results/profile_train_cpu_b128.py
Writes nothing; prints (1) each part of the step timed alone, interleaved
between the two implementations, median of REPEATS; (2) torch.profiler's op
table of one whole training step of each. Saved beside its output
(profile_train_cpu_b128.txt) so the numbers can be rerun.
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from capsnet import CapsNet, CapsNetConfig, margin_loss, reconstruction_loss
from capsnet.bench import _Runner, environment, load_baseline

REPEATS, B, SEED = 5, 128, 0

tutorial = load_baseline("benchmarks/tutorial_baseline.py")
torch.manual_seed(SEED)
capsnet = CapsNet(CapsNetConfig())
baseline = tutorial.TutorialCapsNet.from_capsnet(capsnet, share_logits=True)
gen = torch.Generator().manual_seed(SEED)
images = torch.rand(B, 1, 28, 28, generator=gen)
labels = torch.randint(0, 10, (B,), generator=gen)


def convs(model):  # conv1 + primary capsules, forward and backward: the same modules in both
    conv1, primary = (model.conv1, model.primary) if model is capsnet else (model.conv1, model.primary_capsules)
    u = primary(F.relu(conv1(images)))  # (B, I, 8)
    u.sum().backward()


u_in = torch.randn(B, 1152, 8).mul_(0.3).requires_grad_()


def digit_caps(model):  # the capsule layer with its routing, forward and backward
    poses = model.digits(u_in)[0] if model is capsnet else model.digit_capsules(u_in)[0]
    poses.sum().backward()


def decoder_and_loss(model):  # decoder, both losses, backward (no capsule layer)
    poses = torch.randn(B, 10, 16, requires_grad=True)
    if model is capsnet:
        rec = model.decoder(poses.reshape(B, -1) * F.one_hot(labels, 10).repeat_interleave(16, 1))
    else:
        rec = model.decoder(poses, labels)
    lengths = poses.pow(2).sum(-1).add(1e-8).sqrt()
    (margin_loss(lengths, labels) + reconstruction_loss(rec, images)).backward()


optimizers = {m: torch.optim.Adam(m.parameters(), lr=1e-3) for m in (capsnet, baseline)}


def adam_step(model):  # on gradients of ones, made before the clock starts
    optimizers[model].step()


parts = {"conv1 + primary caps (fwd+bwd)": convs, "digit caps + routing (fwd+bwd)": digit_caps,
         "decoder + losses (fwd+bwd)": decoder_and_loss, "Adam step": adam_step}
runners = {"capsnet": _Runner(capsnet, "train", images, labels, 1e-3),
           "tutorial baseline": _Runner(baseline, "train", images, labels, 1e-3)}
models = {"capsnet": capsnet, "tutorial baseline": baseline}


def timed(fn, model):
    for p in model.parameters():
        p.grad = torch.ones_like(p) if fn is adam_step else None
    u_in.grad = None
    start = time.perf_counter()
    fn(model)
    return time.perf_counter() - start


print({k: environment()[k] for k in ("date", "git_commit", "git_dirty", "torch", "cpu", "torch_threads")})
print(f"\n(1) parts of a training step alone, seconds, median of {REPEATS} (min-max), batch {B}\n")
print("| part | capsnet | tutorial baseline | baseline / capsnet |\n| --- | ---: | ---: | ---: |")
rows = {**{name: (lambda m, fn=fn: timed(fn, m)) for name, fn in parts.items()},
        "whole step (as capsnet bench)": lambda m: runners["capsnet" if m is capsnet else "tutorial baseline"].time_step()}
for name, fn in rows.items():
    times = {k: [] for k in models}
    for k, m in models.items():
        fn(m)  # warm-up
    for r in range(REPEATS):
        for k in (list(models) if r % 2 == 0 else list(models)[::-1]):
            times[k].append(fn(models[k]))
    med = {k: statistics.median(v) for k, v in times.items()}
    cell = {k: f"{med[k]:.3f} ({min(v):.3f}-{max(v):.3f})" for k, v in times.items()}
    print(f"| {name} | {cell['capsnet']} | {cell['tutorial baseline']} | {med['tutorial baseline'] / med['capsnet']:.2f} |")

print("\n(2) torch.profiler, one training step each (self CPU time; the profiler adds overhead)\n")
for k, runner in runners.items():
    runner._prepare()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        runner._run()
    print(f"## {k}\n")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=45))
