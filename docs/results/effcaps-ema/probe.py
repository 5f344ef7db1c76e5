"""Probe: does an exponential moving average of a classifier's weights score better than its last weights?

Trains one run through ``capsnet train`` unchanged (the same trajectory as without this probe) while keeping
averages of every floating-point weight and buffer at several decays (``capsnet.average.WeightAverage``, what
``--ema-decay`` keeps, with TensorFlow's warm-up), and at every evaluation also scores each average on the same
test split. Writes one JSON
line per evaluation and weights to --jsonl. Usage:

    python probe.py --jsonl OUT.jsonl [--decays 0.999,0.9998] -- capsnet train's arguments
"""
import argparse
import json

import capsnet.train as train
from capsnet.cli import main
from capsnet.average import WeightAverage

p = argparse.ArgumentParser()
p.add_argument("--decays", default="0.999,0.9998")
p.add_argument("--jsonl", required=True)
p.add_argument("train_args", nargs=argparse.REMAINDER)
args = p.parse_args()
decays = [float(d) for d in args.decays.split(",")]
averages: list[WeightAverage] = []
steps = [0]
orig_make, orig_eval = train.make_optimizer, train.evaluate_split
epochs = [0]


def make_optimizer(model, cfg, device):
    opt = orig_make(model, cfg, device)
    averages[:] = [WeightAverage(model, d) for d in decays]

    def after(*_):
        for a in averages:
            a.update(steps[0])
        steps[0] += 1
    opt.register_step_post_hook(after)
    return opt


def evaluate(model, split, **k):
    base = orig_eval(model, split, **k)
    epochs[0] += 1
    rows = [{"epoch": epochs[0], "step": steps[0], "weights": "last", "accuracy": base[""].accuracy}]
    for a in averages:
        with a.applied():
            rows.append({"epoch": epochs[0], "step": steps[0], "weights": f"ema {a.decay}",
                         "accuracy": orig_eval(model, split, **k)[""].accuracy})
    with open(args.jsonl, "a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return base


train.make_optimizer = make_optimizer
train.evaluate_split = evaluate
train_args = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args
raise SystemExit(main(["train", *train_args]))
