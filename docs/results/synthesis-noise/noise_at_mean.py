"""Diagnosis: how much of a CapsPix2pix generator's judge accuracy and SSIM its noise costs.

Scores a trained synthesis run's last weights on the first N test pairs three ways: the evaluation's own noise
(seed 0: what metrics.jsonl records), another draw (seed 1), and the noise at its mean (z = 0 for every pair,
BigGAN's "truncation" taken to its limit). Prints one line per data set.

    python docs/results/synthesis-noise/noise_at_mean.py RUN_DIR [RUN_DIR ...] [--test-size 1000] [--data-dir DIR]
"""
import argparse

import torch

from capsnet.data.tasks import load_test
from capsnet.evaluate import load_model
from capsnet.image_metrics import ssim
from capsnet.synthesis import judge_for, judge_predictions, load_judge

p = argparse.ArgumentParser()
p.add_argument("runs", nargs="+")
p.add_argument("--test-size", type=int, default=1000)
p.add_argument("--data-dir", default=None)
args = p.parse_args()
for run in args.runs:
    model, ckpt = load_model(run, which="last", device="cpu")
    if not hasattr(model.config, "noise_dim"):  # pix2pix: its only noise is its dropout, which eval mode turns off
        p.error(f"{run} is a {ckpt.model_name} run, whose generator takes no noise vector; this diagnosis reads "
                f"CapsPix2pix runs (capspix2pix, capspix2pix-deep)")
    dataset = ckpt.train_config["dataset"]
    test = load_test(dataset, size=args.test_size, root=args.data_dir, progress=False).to("cpu")
    judge = load_judge(judge_for(dataset, None, run_dir=run), device="cpu")
    model.eval()
    n, rows = len(test.images), {}
    for name, z in [("noise seed 0", model.noise(n, 0)), ("noise seed 1", model.noise(n, 1)),
                    ("z = 0", torch.zeros(n, model.config.noise_dim))]:
        fake = torch.cat([model.generate(test.images[i:i + 100], z=z[i:i + 100]) for i in range(0, n, 100)])
        accuracy = (judge_predictions(judge, fake) == test.labels).double().mean().item()
        rows[name] = f"judge {100 * accuracy:.1f}%, SSIM {ssim(fake, test.components).mean().item():.4f}"
    print(f"{dataset} ({run}): " + "; ".join(f"{k}: {v}" for k, v in rows.items()), flush=True)
