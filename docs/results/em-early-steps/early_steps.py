"""EM routing's first training steps: where do 3 iterations fall behind 2? (docs/results/routing-family.md)

Trains ``em-capsnet-small`` (28x28, 10 classes) for a few steps of batch 32
on the first 5,000 MNIST training digits (no augmentation; Adam warmed up
linearly over 100 steps to --lr; the spread loss's margin at the
625-step probes' schedule) and prints, every 40 steps, the mean training
loss and accuracy over those steps, the gradient norm (median and max), the
mean activations of ConvCaps1 and ConvCaps2 on the last batch, the class
activations' mean and spread over classes, and the size of ConvCaps2's poses.

    python docs/results/em-early-steps/early_steps.py --iterations 3 [--layer-iterations 3,2,2] \
        [--option var_floor=5e-2 --option conv_e_step=child ...] [--detach-r] [--steps 160] --data-dir ../shared/data
"""
from __future__ import annotations

import argparse
import statistics

import torch

from capsnet.data import load_dataset
from capsnet.models import create_model
from capsnet.models.em_capsnet import em_capsnet_loss
from capsnet.routing import EMRouting


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--layer-iterations", help="caps1,caps2,classes: EM iterations per layer (default: --iterations)")
    p.add_argument("--option", action="append", default=[], help="model config KEY=VALUE (a number or a word)")
    p.add_argument("--detach-r", action="store_true",
                   help="a probe: every E-step's R enters backward as a constant (gradients through the M-steps only)")
    p.add_argument("--steps", type=int, default=160)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", default=None)
    args = p.parse_args()
    options = {k: _value(v) for k, v in (o.split("=", 1) for o in args.option)}
    if args.detach_r:
        e_step = EMRouting._e_step
        EMRouting._e_step = lambda self, *a, **k: e_step(self, *a, **k).detach()
    train = load_dataset("mnist", "train", root=args.data_dir, progress=False)
    torch.manual_seed(args.seed)
    model = create_model("em-capsnet-small", input_height=28, input_width=28, num_classes=10,
                         routing_iterations=args.iterations, **options)
    if args.layer_iterations:
        for layer, n in zip((model.caps1, model.caps2, model.classes), map(int, args.layer_iterations.split(","))):
            layer.routing.iterations = n
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    order = torch.randperm(5000, generator=torch.Generator().manual_seed(args.seed))
    norms, losses, accs = [], [], []
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = args.lr * min(1.0, (step + 1) / 100)
        start = (step * 32) % 4992
        batch = order[start:start + 32]
        x, y = train.images[batch].float() / 255, train.labels[batch]
        loss, scores = em_capsnet_loss(model, x, y, progress=step / 625)
        opt.zero_grad()
        loss.backward()
        norms.append(torch.sqrt(sum(q.grad.pow(2).sum() for q in model.parameters())).item())
        losses.append(loss.item())
        accs.append((scores.argmax(1) == y).float().mean().item())
        opt.step()
        if (step + 1) % 40 == 0:
            with torch.no_grad():
                c1 = model.caps1(model.primary(torch.relu(model.conv1_norm(model.conv1(x)))))  # EMCapsNet's own path
                c2 = model.caps2(c1)
            print(f"step {step + 1}: loss {statistics.mean(losses[-40:]):.3f} "
                  f"accuracy {statistics.mean(accs[-40:]):.3f} "
                  f"grad norm median {statistics.median(norms[-40:]):.1e} max {max(norms[-40:]):.1e} | "
                  f"ConvCaps1 a {c1.activations.mean():.2f} ConvCaps2 a {c2.activations.mean():.2f} "
                  f"class a {scores.mean():.2f} (spread over classes {scores.std(1).mean():.3f}) "
                  f"|ConvCaps2 pose| {c2.poses.pow(2).mean().sqrt():.1e}", flush=True)


def _value(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text


if __name__ == "__main__":
    main()
