"""CapsPix2pix beside pix2pix: images/s of a GAN training step (D step then G step, as capsnet.gan runs it) and of
generation (eval mode), at the same input size and batch, paired repeat by repeat in one process.

A training step: the generator makes the batch's fakes, the discriminator
takes a step on real against fake pairs, then the generator one on the
discriminator's verdict plus L1 (the discriminator frozen for it), each with
Adam. Generation: ``capsnet.synthesis.generate`` on a batch of label maps
(no gradients). Inputs are seeded random label maps and images. Each repeat
times every model back to back, in turns that change which goes first; the ratio
column is the median of the per-repeat ratios pix2pix / the model (above
1: the model is faster).

    python benchmarks/synthesis.py [--size 32] [--batch-size 16] [--repeats 5] [--device cpu] [--dtype bf16]
                                   [--models capspix2pix pix2pix] [--compile MODE] [--json FILE]

A model may carry config fields as ``NAME:FIELD=VALUE`` (``capsnet.bench.model_variant``), e.g. ``--models
capspix2pix capspix2pix:routing=self-attention``: each such variant is a row of its own, timed with the others;
pix2pix, every ratio's reference, is always among them.

``--dtype bf16`` runs both under bfloat16 autocast, as ``capsnet train --amp bf16`` trains them (weights and Adam in
fp32; for GPUs); ``--dtype fp16`` under float16 autocast with ``--amp fp16``'s gradient scaler. ``--compile MODE`` also times each model's training step with its generator compiled, as
``capsnet train --compile MODE`` trains it (the same weights; its rows give the speed-up over the eager step, paired);
generation stays eager.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from capsnet.bench import alternate, amp_of, markdown_table, model_variant, publish, show_spread, spread
from capsnet.gan import GAN_LR, gan_step, make_optimizers
from capsnet.memory import keep_freed_memory
from capsnet.models import create_model
from capsnet.runtime import autocast, compile_model, grad_scaler
from capsnet.synthesis import generate
from capsnet.train import TrainConfig

MODELS = ("capspix2pix", "capspix2pix-deep", "pix2pix")
REFERENCE = "pix2pix"


class Stepper:
    """One model with its optimizers and a fixed batch; ``train()`` and ``generate()`` each time one call."""

    def __init__(self, name: str, size: int, batch: int, device: str = "cpu", dtype: str = "fp32",
                 compile: bool | str = False, options: dict | None = None) -> None:
        torch.manual_seed(0)
        self.device = torch.device(device)
        self.amp_mode = amp_of(dtype)  # bf16, fp16: as capsnet train --amp
        self.scaler = grad_scaler(self.device, self.amp_mode)  # fp16: its gradient scaler, as training has
        self.model = create_model(name, input_height=size, input_width=size, **(options or {})).to(self.device)
        self.opt_g, self.opt_d = make_optimizers(self.model, TrainConfig(lr=GAN_LR))
        g = torch.Generator().manual_seed(0)
        self.labels = (torch.rand(batch, 1, size, size, generator=g) > 0.9).float().to(self.device)
        self.real = torch.rand(batch, 1, size, size, generator=g).to(self.device)
        self.z = self.model.noise(batch, 0, self.device)
        self.generator = compile_model(self.model.generator, compile)  # the generator itself unless compiled

    def _timed(self, work) -> float:
        sync = (lambda: torch.cuda.synchronize(self.device)) if self.device.type == "cuda" else (lambda: None)
        sync()
        start = time.perf_counter()
        work()
        sync()
        return time.perf_counter() - start

    def train(self) -> float:
        self.model.train()
        return self._timed(lambda: gan_step(self.model, self.opt_g, self.opt_d, self.labels, self.real, self.z,
                                            autocast(self.device, self.amp_mode), self.generator, self.scaler))

    def generate(self) -> float:
        def work() -> None:
            with autocast(self.device, self.amp_mode):
                generate(self.model, self.labels, seed=0, batch_size=len(self.labels))
        return self._timed(work)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=32, help="side of the label maps and images")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--models", nargs="+", default=["capspix2pix", REFERENCE], metavar="NAME[:FIELD=VALUE]",
                   help="the models to time (pix2pix, every ratio's reference, is always among them)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32", help="bf16, fp16: both under "
                   "bfloat16 or float16 autocast (as capsnet train --amp bf16 or fp16, its gradient scaler "
                   "included; for GPUs)")
    p.add_argument("--compile", default=None, metavar="MODE",
                   help="also time each model's training step with its generator compiled: default, reduce-overhead "
                        "(CUDA graphs), max-autotune or a backend name, as capsnet train --compile")
    p.add_argument("--json", default=None, help="write the table and its context here")
    args = p.parse_args()
    keep_freed_memory()
    try:  # each model as typed (pix2pix added if missing), a field it lacks or a value it refuses named now
        models = {text: model_variant(text, MODELS) for text in dict.fromkeys([*args.models, REFERENCE])}
        steppers = {m: Stepper(name, args.size, args.batch_size, args.device, args.dtype, options=options)
                    for m, (name, options) in models.items()}
    except (TypeError, ValueError) as e:
        p.error(str(e))
    compiled = {m: Stepper(name, args.size, args.batch_size, args.device, args.dtype, compile=args.compile,
                           options=options) for m, (name, options) in (models.items() if args.compile else ())}
    rows = []
    for mode in ("train", "generate"):
        times = alternate({m: getattr(steppers[m], mode) for m in models}, args.repeats)
        for m in models:
            rows.append({"model": m, "mode": mode, "size": args.size, "batch": args.batch_size, "dtype": args.dtype,
                         "generator_weights": steppers[m].model.config.generator_weights,
                         "weights": steppers[m].model.config.num_weights,
                         "images_per_s": args.batch_size / statistics.median(times[m]),
                         "min_images_per_s": args.batch_size / max(times[m]),
                         "max_images_per_s": args.batch_size / min(times[m])})
            if m != REFERENCE:
                rows[-1] |= spread([ref / t for t, ref in zip(times[m], times[REFERENCE])], "speedup_vs_pix2pix",
                                   "speedup")
        print(f"{mode}: " + ", ".join(f"{r['model']} {r['images_per_s']:.1f}" for r in rows[-len(models):])
              + " images/s", file=sys.stderr, flush=True)
    if compiled:  # each compiled step paired with its eager one
        steps = {(m, c): (compiled if c else steppers)[m].train for m in models for c in (False, True)}
        times = alternate(steps, args.repeats, warmup=3)  # one step a timing: CUDA graphs record in the first calls
        for m in models:
            rows.append({"model": m, "mode": f"train, generator compiled {args.compile}", "size": args.size,
                         "batch": args.batch_size, "dtype": args.dtype, "compile": args.compile,
                         "generator_weights": compiled[m].model.config.generator_weights,
                         "weights": compiled[m].model.config.num_weights,
                         "images_per_s": args.batch_size / statistics.median(times[m, True]),
                         "min_images_per_s": args.batch_size / max(times[m, True]),
                         "max_images_per_s": args.batch_size / min(times[m, True]),
                         **spread([e / c for e, c in zip(times[m, False], times[m, True])], "speedup_vs_eager",
                                  "speedup_eager")})
            print(f"{m} compiled: {rows[-1]['images_per_s']:.1f} images/s, {rows[-1]['speedup_vs_eager']:.2f}x eager",
                  file=sys.stderr, flush=True)
    table = markdown_table(
        ["model", "mode", "generator weights", "weights", "images/s, median (min-max)",
         "pix2pix time / its time", "eager time / compiled time"],
        ([r["model"], r["mode"], f"{r['generator_weights']:,}", f"{r['weights']:,}",
          f"{r['images_per_s']:.1f} ({r['min_images_per_s']:.1f}-{r['max_images_per_s']:.1f})",
          show_spread(r, "speedup_vs_pix2pix", "speedup") if "speedup_vs_pix2pix" in r else "-",
          show_spread(r, "speedup_vs_eager", "speedup_eager") if "speedup_vs_eager" in r else "-"] for r in rows),
        align="llrrrrr")
    publish("benchmarks/synthesis.py", rows, f"\n{args.size}x{args.size}, batch {args.batch_size}, {args.dtype}, median "
            f"of {args.repeats} paired repeats:\n\n{table}", args.json)


if __name__ == "__main__":
    main()
