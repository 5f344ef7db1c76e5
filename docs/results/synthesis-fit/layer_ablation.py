"""Which of a capsule U-Net's layers its output depends on: each layer's output replaced by its mean over the test
inputs (position by position: what the layer carries about the particular input removed, its average kept), the
rest of the network run as trained, and the score printed beside the intact network's. A layer whose ablation
costs nothing carries nothing the output uses.

Works on a CapsPix2pix or pix2pix run (the generator; SSIM and L1 of the images against the real ones, noise seed 0
as the evaluation draws it; pix2pix's U-Net by its encoder and decoder layers) and on
a SegCaps run (Dice and IoU of the probabilities cut at 0.5 against the masks). For each run directory (its last
weights, or --which), the first --test-size test examples, eval mode. Usage:

    python layer_ablation.py RUN_DIR [RUN_DIR ...] [--test-size 500] [--which last] [--data-dir DIR] [--json OUT]
"""
import argparse
import json

import torch

from capsnet.data.segmentation import dice_iou
from capsnet.data.tasks import load_test
from capsnet.evaluate import load_model
from capsnet.image_metrics import ssim

p = argparse.ArgumentParser()
p.add_argument("runs", nargs="+")
p.add_argument("--test-size", type=int, default=500)
p.add_argument("--which", default="last")
p.add_argument("--data-dir")
p.add_argument("--json")
args = p.parse_args()


def batch_mean(module, inputs, output):  # a forward hook: the output replaced by its mean over the batch
    return output.mean(0, keepdim=True).expand_as(output)


rows = []
for d in args.runs:
    model, ckpt = load_model(d, which=args.which, device="cpu")
    model.eval()
    split = load_test(ckpt.train_config["dataset"], size=args.test_size, root=args.data_dir, progress=False)
    net = getattr(model, "generator", model)  # CapsPix2pix, pix2pix: the generator; SegCaps: the model
    if hasattr(net, "caps"):
        layers = {"conv1": net.conv1, **({"noise": net.noise} if hasattr(net, "noise") else {}), **dict(net.caps)}
    else:  # pix2pix's U-Net: each encoder layer (its output goes on down and into its skip) and decoder layer
        layers = {**{f"down_{k}": m for k, m in enumerate(net.down)}, **{f"up_{k}": m for k, m in enumerate(net.up)}}
    if hasattr(model, "generator"):
        labels, real = split.images.float(), split.components.float()

        def score() -> dict[str, float]:
            fake = model.generate(labels, seed=0)  # as the evaluation: noise seed 0 (pix2pix: its dropout, seeded)
            return {"ssim": ssim(fake, real).mean().item(), "l1": (fake - real).abs().mean().item()}
    else:
        images = split.images.float() if split.images.is_floating_point() else split.images.float() / 255
        masks = split.labels

        def score() -> dict[str, float]:
            dice, iou = dice_iou(net(images).probabilities > 0.5, masks)  # per image, both 1 when both are empty
            return {"dice": dice.mean().item(), "iou": iou.mean().item()}
    with torch.no_grad():
        for name, module in [("none", None), *layers.items()]:
            handle = module.register_forward_hook(batch_mean) if module is not None else None
            row = {"run": d, "ablated": name, **score()}
            if handle is not None:
                handle.remove()
            rows.append(row)
            print(f"{d}  {name:>11}  " + "  ".join(f"{k} {v:.4f}" for k, v in row.items() if k not in ("run", "ablated")),
                  flush=True)
if args.json:
    with open(args.json, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
