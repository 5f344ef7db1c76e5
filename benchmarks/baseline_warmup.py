"""Does the paper's CNN baseline leave chance on 40x40 translated MNIST, with and without a learning-rate warm-up?

    python benchmarks/baseline_warmup.py --warmup-steps 0   --steps 120 --batch-size 32 --data-dir ../shared/data
    python benchmarks/baseline_warmup.py --warmup-steps 100 --steps 120 --batch-size 32 --data-dir ../shared/data

The full-size baseline (three 5x5 convolutions 256-256-128 without pooling, a 204,800 -> 328 dense layer) trained by
Adam at 1e-3 on translated digits (each 28x28 frame at a random place on the 40x40 canvas, as `translated-mnist`),
from the first 5,000 MNIST training digits, on one CPU thread. Prints the mean training loss of every 10 steps:
ln 10 = 2.303 is chance. About 10 s a step at batch 32 on this project's 2-core CPU. Results and the reading:
docs/results.md, "The CNN baseline on larger inputs"; logs in docs/results/baseline-warmup-cpu/.
"""
from __future__ import annotations

import argparse
import torch
import torch.nn.functional as F

from capsnet.data.affine import random_translate
from capsnet.data import load_dataset
from capsnet.models.baseline import BaselineCNN, BaselineCNNConfig
from capsnet.train import TrainConfig, lr_at


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--warmup-steps", type=int, default=0, help="linear ramp of the rate over this many steps (0: none)")
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--size", type=int, default=40, help="canvas side")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", default=None, help="folder holding mnist/ (default: CAPSNET_DATA, then capsnet's "
                                                     "cache, as the CLI finds it)")
    args = p.parse_args()
    torch.set_num_threads(1)
    train = load_dataset("mnist", "train", root=args.data_dir, download=False)
    images, labels = train.images[:5000, 0], train.labels[:5000]  # (5000, 28, 28) uint8, (5000,) int64
    torch.manual_seed(args.seed)
    model = BaselineCNN(BaselineCNNConfig(input_height=args.size, input_width=args.size))
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    g = torch.Generator().manual_seed(args.seed)
    schedule = TrainConfig(lr=args.lr, lr_decay=1.0, warmup_steps=args.warmup_steps)  # the ramp alone, no decay
    losses: list[float] = []
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, schedule)
        idx = torch.randint(0, len(images), (args.batch_size,), generator=g)
        x = random_translate(images[idx].unsqueeze(1), args.size, generator=g)[0]
        loss = F.cross_entropy(model(x), labels[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if (step + 1) % 10 == 0:
            print(f"size {args.size} lr {args.lr} warm {args.warmup_steps} seed {args.seed} step {step + 1}: "
                  f"mean loss {sum(losses[-10:]) / 10:.3f}", flush=True)


if __name__ == "__main__":
    main()
