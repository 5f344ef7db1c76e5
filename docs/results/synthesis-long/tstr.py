"""Train on synthetic, test on real, for finished synthesis runs of one data set (trained by `capsnet train`).

The experiment's own probe (``capsnet.experiments.synthetic_probe_rows``, what `capsnet experiment synthesis
--probe-epochs N` runs) over run directories trained outside the experiment: a CapsNet of the probe's sizes
trained for --epochs on the runs' own training images (their --train-size subset, seed and order), once on the
real images and once on each run's generated images (its last weights, noise seed 0, from the same images' label
maps), each scored on the runs' --test-size real test images after its final epoch. Every run must share the data
set, training subset and seed. Prints a JSON line per probe and writes them to --json. Usage:

    python tstr.py RUN_DIR [RUN_DIR ...] --out PROBES_DIR [--epochs 2] [--data-dir DIR] [--json OUT.json]
"""
import argparse
import json
from pathlib import Path

from capsnet.checkpoint import load_checkpoint
from capsnet.experiments import Run, synthetic_probe_rows
from capsnet.train import saved_configs

p = argparse.ArgumentParser()
p.add_argument("runs", nargs="+")
p.add_argument("--out", required=True, help="the probes' run directories go under OUT/probes")
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--data-dir")
p.add_argument("--json")
args = p.parse_args()

runs = []
for d in args.runs:
    ckpt = load_checkpoint(d, "last")
    model_config, train = saved_configs(ckpt)
    runs.append(Run("synthesis", ckpt.model_name, train.dataset, train.seed, model_config, train, Path(d)))
shared = {(r.dataset, r.train_config.train_size, r.train_config.seed, r.train_config.test_size) for r in runs}
if len(shared) != 1:
    raise SystemExit(f"the runs differ in data set, --train-size, --seed or --test-size: {sorted(shared)}")
if len({r.model for r in runs}) != len(runs):
    raise SystemExit("one run per model: the probes are named by the model")

rows = synthetic_probe_rows(runs, args.out, epochs=args.epochs, data_root=args.data_dir)
for row in rows:
    print(json.dumps(row))
if args.json:
    Path(args.json).write_text("".join(json.dumps(row) + "\n" for row in rows))
