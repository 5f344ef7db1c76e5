"""Probe: does an exponential moving average of the generator's weights score better than its last weights?

Trains one synthesis run through ``capsnet.gan.fit_gan`` unchanged (the same trajectory as without this probe)
while keeping averages of the generator's parameters at several decays, each with TensorFlow's warm-up
(decay_t = min(decay, (1 + t) / (10 + t))), and at the final evaluation scores the last weights and every
average on the same test pairs. Prints one JSON line per generator and writes them to --json. Usage:

    python probe.py --json OUT.json [--decays 0.99,0.999] -- capsnet train's arguments
"""
import argparse
import json

import torch

import capsnet.gan as gan
import capsnet.synthesis as synthesis
from capsnet.cli import main

p = argparse.ArgumentParser()
p.add_argument("--decays", default="0.99,0.995,0.999")
p.add_argument("--json", required=True)
p.add_argument("train_args", nargs=argparse.REMAINDER)
args = p.parse_args()

decays = [float(d) for d in args.decays.split(",")]
shadows: dict[float, list[torch.Tensor]] = {}
steps = [0]
orig_step, orig_eval = gan.gan_step, synthesis.evaluate_synthesis


def step(model, *a, **k):
    out = orig_step(model, *a, **k)
    params = [q.detach() for q in model.generator.parameters()]
    t = steps[0]
    for d in decays:
        if d not in shadows:
            shadows[d] = [q.clone() for q in params]
        else:
            w = 1 - min(d, (1 + t) / (10 + t))
            torch._foreach_lerp_(shadows[d], params, w)
    steps[0] += 1
    return out


rows = []


def evaluate(model, split, **k):
    base = orig_eval(model, split, **k)
    params = list(model.generator.parameters())
    kept = [q.detach().clone() for q in params]
    rows.append({"weights": "last", **base[""].as_dict()})
    for d, sh in shadows.items():
        with torch.no_grad():
            for q, s in zip(params, sh):
                q.copy_(s)
        rows.append({"weights": f"ema {d}", **orig_eval(model, split, **k)[""].as_dict()})
    with torch.no_grad():
        for q, s in zip(params, kept):
            q.copy_(s)
    for r in rows[-1 - len(shadows):]:
        print(json.dumps(r), flush=True)
    return base


gan.gan_step = step
synthesis.evaluate_synthesis = evaluate
train_args = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args
code = main(["train", *train_args])
with open(args.json, "w") as f:
    json.dump({"train_args": train_args, "steps": steps[0], "rows": rows}, f, indent=1)
raise SystemExit(code)
