"""Resize-then-convolve (``upsampling=resize``) made over the grid itself against the enlarged grid's convolution,
paired in one process: each resize layer's votes (forward and backward) and whole eager training steps.

``capsnet.layers.conv.resize_conv2d`` makes a deconvolutional capsule layer's
votes as one transposed convolution of stride S over the child grid, the 4x4
kernel flipped and summed over each 2x2 shift into a 5x5 one; the path it
replaced enlarged the grid by nearest neighbour, then ran the 4x4 kernel over
it at stride 1 (``same_conv2d(F.interpolate(...), w, 1)``). Both give the same
numbers to float rounding (tests/test_layers_conv.py). Timed here for the
layers of ``capspix2pix-deep`` (32x32, its default since 2026-12-04) and of
``segcaps`` with ``upsampling=resize`` (64x64), with the grids each layer
meets in a forward pass, and for a training step of each model: the GAN step
(``capsnet.gan.gan_step``, D then G, Adam) and SegCaps' loss, backward and
Adam. "enlarged" runs the same model with ``resize_conv2d`` swapped for the
old path during its step. Each repeat times both back to back, taking turns
to go first; the ratio column is the median of enlarged / transposed per
repeat (above 1: the transposed form is faster).

    python benchmarks/resize_conv.py [--batch-size 16] [--seg-batch-size 4] [--repeats 9] [--json FILE]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from capsnet.bench import alternate, markdown_table, publish, show_spread, spread
from capsnet.gan import GAN_LR, gan_step, make_optimizers
from capsnet.layers import conv
from capsnet.layers.conv import ConvTransposeCaps2d, same_conv2d
from capsnet.models import MODELS, create_model
from capsnet.runtime import autocast
from capsnet.train import TrainConfig

FAST = conv.resize_conv2d


def enlarged(c: torch.Tensor, w: torch.Tensor, stride: int) -> torch.Tensor:
    """The path ``resize_conv2d`` replaced: the grid enlarged S times, then the kernel over it at stride 1."""
    return same_conv2d(F.interpolate(c, scale_factor=stride, mode="nearest") if stride > 1 else c, w, 1)


def timed(work, path) -> float:
    conv.resize_conv2d = path
    try:
        start = time.perf_counter()
        work()
        return time.perf_counter() - start
    finally:
        conv.resize_conv2d = FAST


def layer_grids(model: torch.nn.Module, run) -> list[tuple[str, ConvTransposeCaps2d, torch.Tensor]]:
    """Each resize layer of ``model`` with the child grid it meets when ``run()`` runs the model once."""
    layers = [(n, m) for n, m in model.named_modules()
              if isinstance(m, ConvTransposeCaps2d) and m.upsampling == "resize"]
    grids: dict[str, torch.Tensor] = {}
    def keep(name: str):
        def hook(module, inputs, output) -> None:  # returns None: the layer's output unchanged
            grids.setdefault(name, inputs[0].detach())
        return hook
    hooks = [m.register_forward_hook(keep(n)) for n, m in layers]
    with torch.no_grad():
        run()
    for h in hooks:
        h.remove()
    return [(n, m, grids[n]) for n, m in layers]


def votes_step(layer: ConvTransposeCaps2d, grid: torch.Tensor):
    c = grid.flatten(0, 1).clone().requires_grad_()
    w = layer.weight.detach().clone().requires_grad_()

    def work() -> None:
        c.grad = w.grad = None
        conv.resize_conv2d(c, w, layer.stride).square().sum().backward()
    return work


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch-size", type=int, default=16, help="capspix2pix-deep's batch (its training recipe's)")
    p.add_argument("--seg-batch-size", type=int, default=4, help="segcaps' batch")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--json", default=None, help="write the table and its context here")
    args = p.parse_args()

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    B, Bs = args.batch_size, args.seg_batch_size
    gan = create_model("capspix2pix-deep")  # 32x32, upsampling=resize by default
    labels = (torch.rand(B, 1, 32, 32, generator=g) > 0.9).float()
    real = torch.rand(B, 1, 32, 32, generator=g)
    z = gan.noise(B, 0, torch.device("cpu"))
    opt_g, opt_d = make_optimizers(gan, TrainConfig(lr=GAN_LR))
    seg = create_model("segcaps", upsampling="resize")  # 64x64
    images = torch.rand(Bs, 1, 64, 64, generator=g)
    masks = (images > 0.7).float()
    opt_s = torch.optim.Adam(seg.parameters(), lr=1e-3)

    def gan_work() -> None:
        gan.train()
        gan_step(gan, opt_g, opt_d, labels, real, z, autocast(torch.device("cpu"), "none"), gan.generator, None)

    def seg_work() -> None:
        seg.train()
        opt_s.zero_grad(set_to_none=True)
        loss, _ = MODELS["segcaps"].loss(seg, images, masks, recon_weight=0.0005)
        loss.backward()
        opt_s.step()

    work: list[tuple[str, str, object]] = []
    for name, model, run in (("capspix2pix-deep", gan.generator, lambda: gan.generator(labels, z)),
                             ("segcaps:upsampling=resize", seg, lambda: seg(images))):
        model.eval()
        for layer_name, layer, grid in layer_grids(model, run):
            shape = f"{tuple(grid.shape[1:3])} x {grid.shape[3]}x{grid.shape[4]} -> {layer.out_types}x{layer.out_dim}"
            work.append((name, f"{layer_name} votes, {shape}", votes_step(layer, grid)))
    work += [("capspix2pix-deep", f"GAN step, batch {B}", gan_work),
             ("segcaps:upsampling=resize", f"training step, batch {Bs}", seg_work)]

    rows, cells = [], []
    for model_name, what, fn in work:
        times = alternate({"transposed": lambda fn=fn: timed(fn, FAST), "enlarged": lambda fn=fn: timed(fn, enlarged)},
                          args.repeats)
        ratios = [e / t for e, t in zip(times["enlarged"], times["transposed"])]
        row = {"model": model_name, "what": what, "transposed_ms": 1e3 * statistics.median(times["transposed"]),
               "enlarged_ms": 1e3 * statistics.median(times["enlarged"]), **spread(ratios)}
        rows.append(row)
        cells.append([model_name, what, f"{row['enlarged_ms']:.1f}", f"{row['transposed_ms']:.1f}", show_spread(row)])
        print(" | ".join(map(str, cells[-1])), flush=True)
    text = markdown_table(["model", "timed", "enlarged grid, ms", "transposed, ms", "enlarged / transposed"], cells,
                          "llrrr")
    publish("benchmarks/resize_conv.py", rows, text, args.json)


if __name__ == "__main__":
    main()
