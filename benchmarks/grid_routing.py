"""Local routing in the grid's layout: whole training steps of the convolutional-capsule models, with their layers'
dynamic routing on the votes as the convolution lays them out (``DynamicRouting.route_grid``, what ``forward``
runs) against the positions folded into the batch (``ConvCaps2d.route``: the votes permuted to (B*H*W, T, J, D),
routed by ``DynamicRouting.forward``, the poses permuted back), paired in one process.

A step is forward, loss and backward: SegCaps R3 and R1 on batch 8 of 64x64 mnist-segmentation-sized inputs
(its default loss and the masked reconstruction), and the CapsPix2pix generator on batch 16 of 32x32 label maps (its
images' L1 to random targets: the generator's share of a GAN step). Both paths give the same numbers
(tests/test_layers_conv.py); this reports the median ratio folded / grid over paired repeats (above 1: the grid
layout is faster).

    OMP_NUM_THREADS=1 python benchmarks/grid_routing.py [--repeats 7] [--json FILE]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Callable

import torch

from capsnet.bench import alternate, markdown_table, publish, show_spread, spread
from capsnet.layers.conv import _GridCaps
from capsnet.models import create_model


def layers_of(model: torch.nn.Module) -> list[_GridCaps]:
    return [m for m in model.modules() if isinstance(m, _GridCaps)]


def folded(layers: list[_GridCaps], on: bool) -> None:
    """Route every layer with its positions folded into the batch (on) or in the grid's layout (off)."""
    for layer in layers:
        if on:
            layer.routing.route_grid = None  # an instance attribute: forward then falls back to route()
        else:
            layer.routing.__dict__.pop("route_grid", None)


def segcaps_step(name: str, batch: int) -> tuple[torch.nn.Module, Callable[[], None]]:
    from capsnet.models.segcaps import segmentation_model_loss

    torch.manual_seed(0)
    model = create_model(name, input_height=64, input_width=64)
    images = torch.rand(batch, 1, 64, 64)
    masks = (torch.rand(batch, 1, 64, 64) > 0.8).float()

    def step() -> None:
        model.zero_grad(set_to_none=True)
        segmentation_model_loss(model, images, masks)[0].backward()
    return model, step


def generator_step(batch: int) -> tuple[torch.nn.Module, Callable[[], None]]:
    torch.manual_seed(0)
    model = create_model("capspix2pix")
    cfg = model.config
    labels = (torch.rand(batch, cfg.in_channels, cfg.input_height, cfg.input_width) > 0.9).float()
    target = torch.rand(batch, cfg.out_channels, cfg.input_height, cfg.input_width)
    z = torch.randn(batch, cfg.noise_dim)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        (model.generator(labels, z) - target).abs().mean().backward()
    return model.generator, step


def timed(layers: list[_GridCaps], fold: bool, step: Callable[[], None]) -> Callable[[], float]:
    def run() -> float:
        folded(layers, fold)
        start = time.perf_counter()
        step()
        return time.perf_counter() - start
    return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--json", default=None, help="write the table and its context here")
    args = p.parse_args()
    cases = {"segcaps (batch 8, 64x64)": lambda: segcaps_step("segcaps", 8),
             "segcaps-r1 (batch 8, 64x64)": lambda: segcaps_step("segcaps-r1", 8),
             "capspix2pix generator (batch 16, 32x32)": lambda: generator_step(16)}
    rows = []
    for name, make in cases.items():
        model, step = make()
        layers = layers_of(model)
        times = alternate({"grid": timed(layers, False, step), "folded": timed(layers, True, step)}, args.repeats)
        folded(layers, False)
        ratios = [f / g for f, g in zip(times["folded"], times["grid"])]
        rows.append({"model": name, "grid_ms": 1e3 * statistics.median(times["grid"]),
                     "folded_ms": 1e3 * statistics.median(times["folded"]), **spread(ratios)})
        print(f"{name}: folded / grid {rows[-1]['ratio']:.2f}", file=sys.stderr, flush=True)
    table = markdown_table(["model", "grid layout ms", "positions folded ms", "folded / grid, median (min-max)"],
                           ([r["model"], f"{r['grid_ms']:.0f}", f"{r['folded_ms']:.0f}", show_spread(r)] for r in rows))
    publish("benchmarks/grid_routing.py", rows,
            f"\nTraining step (forward, loss, backward), median of {args.repeats} paired repeats:\n\n{table}", args.json)


if __name__ == "__main__":
    main()
