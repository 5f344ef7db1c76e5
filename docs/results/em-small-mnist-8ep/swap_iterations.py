"""Score EM runs' weights with another number of EM iterations than they trained with.

    python docs/results/em-small-mnist-8ep/swap_iterations.py runs/em-8ep/r2 runs/em-8ep/r3 --iterations 1 2 3 4 \
        --data-dir ../shared/data [--test-size N] [--json FILE]

Each run's last weights are loaded into the same model with ``routing_iterations`` set to each value given (every
EM layer's; the weights do not depend on it) and scored on the MNIST test digits: does a network trained with 3
iterations lose at test time for routing 3 times, or for what training with 3 made of its weights?
"""
from __future__ import annotations

import argparse
import dataclasses
import json

import torch

from capsnet.data import load_dataset
from capsnet.evaluate import evaluate, load_model
from capsnet.memory import keep_freed_memory
from capsnet.models import MODELS


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+")
    p.add_argument("--iterations", type=int, nargs="+", default=[1, 2, 3, 4])
    p.add_argument("--data-dir", default=None, help="folder holding mnist/ (default: CAPSNET_DATA, then capsnet's cache)")
    p.add_argument("--test-size", type=int, default=0, help="the first N test digits (0: all 10,000)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    keep_freed_memory()  # as `capsnet train` and `eval` do: freed memory reused, not faulted in again every batch
    test = load_dataset("mnist", "test", root=args.data_dir, download=False)
    images, labels = test.images.float() / 255, test.labels  # as training scores them: floats in [0, 1]
    if args.test_size:
        images, labels = images[:args.test_size], labels[:args.test_size]
    rows = []
    for run in args.runs:
        model, ckpt = load_model(run, which="last")
        trained = model.config.routing_iterations
        for t in args.iterations:
            swapped = MODELS[ckpt.model_name].build(dataclasses.replace(model.config, routing_iterations=t))
            swapped.load_state_dict(model.state_dict())
            result = evaluate(swapped, images, labels)
            row = {"run": run, "trained_with": trained, "scored_with": t, "test_digits": len(labels),
                   "accuracy": result.accuracy, "loss": result.loss}
            rows.append(row)
            print(f"{run}: trained with {trained}, scored with {t}: {100 * result.accuracy:.2f}% "
                  f"(loss {result.loss:.4f}, {len(labels)} digits)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
