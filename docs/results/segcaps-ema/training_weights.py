"""Score an averaged run's training weights (what it would have scored without --ema-decay) beside its average.

A run trained with --ema-decay saves the average as its model and keeps the training weights beside Adam's state
(capsnet.average); training is the same either way, so the training weights are the run without the average. Both
scored on the first N test and out-of-distribution canvases, as the run's own evaluation. (`capsnet eval --which last
--weights training` gives the second figure alone.)

    python docs/results/segcaps-ema/training_weights.py RUN [--test-size 2000] [--data-dir ../shared/data] [--json F]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from capsnet.checkpoint import load_checkpoint
from capsnet.data.tasks import load_test
from capsnet.evaluate import evaluate_split, load_model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", help="a run directory trained with --ema-decay")
    p.add_argument("--test-size", type=int, default=2000)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    ckpt = load_checkpoint(args.run, "last")  # read once: both figures are of this checkpoint
    test = load_test(ckpt.train_config["dataset"], size=args.test_size, root=args.data_dir)
    rows = {}
    for weights, name in (("saved", "average"), ("training", "training")):
        model, _ = load_model(ckpt, weights=weights)  # a checkpoint without training weights: a CheckpointError
        rows[name] = {(split or "test"): r.dice for split, r in evaluate_split(model, test).items()}
        print(name, rows[name], flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"run": args.run, "test_size": args.test_size, "dice": rows}, indent=1))


if __name__ == "__main__":
    main()
