"""Where a generator's SSIM is lost: Wang et al.'s (2004) three factors, on the same windows as the score.

For each run directory (its last weights, or --which), generates the first --test-size test pairs with noise
seed 0 (as the evaluation's SSIM does) and prints the mean SSIM beside the mean over the same windows of its
factors: luminance l = (2 mu_x mu_y + C1) / (mu_x^2 + mu_y^2 + C1), contrast c = (2 sd_x sd_y + C2) /
(var_x + var_y + C2) and structure s = (cov + C2/2) / (sd_x sd_y + C2/2) (SSIM = l c s per window), the SSIM of
windows that hold ink in the real image (its mean above 0.05) against those that do not, the images' mean
intensity against the real one's, the fraction of pixels that are grey (0.1 to 0.9), and the generated values where
the real image is black (below 0.01): their mean and the share above 0.01; and, per class of the label map, the
mean SSIM and structure of that class's test pairs (``per_class``: which items the score is lost on). Usage:

    python ssim_parts.py RUN_DIR [RUN_DIR ...] [--test-size 1000] [--which last] [--data-dir DIR] [--json OUT]
"""
import argparse
import json
from pathlib import Path

import torch

from capsnet.data.tasks import load_test
from capsnet.evaluate import load_model
from capsnet.image_metrics import SSIM_K1, SSIM_K2, ssim, window_statistics
from capsnet.synthesis import generate

p = argparse.ArgumentParser()
p.add_argument("runs", nargs="+")
p.add_argument("--test-size", type=int, default=1000)
p.add_argument("--which", default="last")
p.add_argument("--data-dir")
p.add_argument("--json")
args = p.parse_args()


def parts(a: torch.Tensor, b: torch.Tensor, labels: torch.Tensor, classes: tuple[str, ...]) -> dict[str, object]:
    """a generated, b real, (N, 1, H, W) in [0, 1]; labels (N,) the classes of the label maps."""
    x, y = a.double(), b.double()
    mu_x, mu_y, var_x, var_y, cov = window_statistics(a, b)
    var_x, var_y = var_x.clamp_min(0), var_y.clamp_min(0)  # rounding can leave -1e-17 under a square root
    c1, c2 = SSIM_K1 ** 2, SSIM_K2 ** 2
    lum = (2 * mu_x * mu_y + c1) / (mu_x ** 2 + mu_y ** 2 + c1)
    con = (2 * var_x.sqrt() * var_y.sqrt() + c2) / (var_x + var_y + c2)
    stru = (cov + c2 / 2) / (var_x.sqrt() * var_y.sqrt() + c2 / 2)
    s = lum * con * stru
    ink = mu_y > 0.05
    bg = x[y < 0.01]  # the generated values where the real image is black
    return {"ssim": s.mean().item(), "luminance": lum.mean().item(), "contrast": con.mean().item(),
            "structure": stru.mean().item(), "ssim_ink_windows": s[ink].mean().item(),
            "ssim_blank_windows": s[~ink].mean().item(), "ink_window_share": ink.double().mean().item(),
            "mean_intensity": x.mean().item(), "real_mean_intensity": y.mean().item(),
            "grey_share": ((x > 0.1) & (x < 0.9)).double().mean().item(),
            "real_grey_share": ((y > 0.1) & (y < 0.9)).double().mean().item(),
            "background_mean": bg.mean().item(), "background_above_0.01": (bg > 0.01).double().mean().item(),
            "ssim_check": ssim(a, b).mean().item(),
            "per_class": {name: {"pairs": int(m.sum()), "ssim": s[m].mean().item(), "structure": stru[m].mean().item()}
                          for k, name in enumerate(classes) if (m := labels == k).any()}}


rows = []
for d in args.runs:
    model, ckpt = load_model(d, which=args.which, device="cpu")
    dataset = ckpt.train_config["dataset"]
    split = load_test(dataset, size=args.test_size, root=args.data_dir, progress=False)
    fake = generate(model, split.images.float(), seed=0, progress=False)
    row = {"run": str(Path(d)), "model": ckpt.model_name, "dataset": dataset, "test_size": len(fake)}
    row |= parts(fake, split.components.float(), split.labels, split.classes)
    rows.append(row)
    print(json.dumps(row))
if args.json:
    Path(args.json).write_text("".join(json.dumps(r) + "\n" for r in rows))
