"""Train a model shipped inside the package and write it with its model card.

    python tools/make_pretrained.py --data-dir ../shared/data                                  # capsnet-mnist-small
    python tools/make_pretrained.py --name capsnet-fashion-small --data-dir ../shared/data     # the Fashion-MNIST one
    python tools/make_pretrained.py --name efficient-capsnet-mnist --data-dir ../shared/data   # Efficient-CapsNet

Step 1 is an ordinary ``capsnet train`` run (printed before it starts, so it
can be read and rerun by hand; an interrupted run resumes when this script is
run again). Step 2 takes the run's *last* checkpoint (the final epoch, never
the best over epochs), keeps the model weights only, in float16, and writes

- ``src/capsnet/pretrained/NAME.safetensors``: a capsnet checkpoint (configs,
  history and weights; no optimizer state), loadable as ``pretrained:NAME``;
- ``src/capsnet/pretrained/NAME.md``: the model card (data, command, weights,
  the final epoch's MNIST test error with the float16 weights, re-measured
  here, and for MNIST the score on the shipped ``mnist-sample`` test digits
  that the test suite checks).
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from capsnet.checkpoint import load_checkpoint
from capsnet.evaluate import evaluate_checkpoint
from capsnet.pretrained import DEFAULT, DIR, pack

# A narrower CapsNet than the paper's (64 conv1 channels, 16 primary types, decoder 256-512): 1,981,360 weights,
# 4 MB in float16, about 8x faster to train on a CPU than the paper's 8.2M-weight model.
CAPSNET_FLAGS = ["--model", "capsnet", "--conv1-channels", "64", "--primary-types", "16",
                 "--model-option", "decoder_hidden=[256, 512]", "--epochs", "8", "--batch-size", "128",
                 "--lr", "1e-3", "--lr-decay", "0.8", "--lr-decay-steps", "469", "--shift", "2", "--seed", "0"]
CAPSNET_MODEL = ("the paper's CapsNet, narrower: conv1 9x9 with 64 channels (paper: 256), 16 primary capsule types\n"
                 "  of 8D (paper: 32), 10 {capsules} capsules of 16D, 3 routing iterations, decoder 160-256-512-784 "
                 "(paper: 512-1024)")
# Efficient-CapsNet at the paper's size (161,824 weights and the 1,411,344-weight decoder), its augmentation, 30 epochs
# of batch 64 with a linear schedule: docs/results/routing-family.md has the run and its curve.
EFFICIENT_FLAGS = ["--model", "efficient-capsnet", "--augment", "efficient-capsnet", "--epochs", "30",
                   "--batch-size", "64", "--lr", "1e-3", "--lr-schedule", "linear", "--warmup-steps", "500",
                   "--seed", "0"]
EFFICIENT_MODEL = ("Efficient-CapsNet (Mazzia et al. 2021) at the paper's size: four convolutions, 16 depthwise\n"
                   "  primary capsules of 8D, 10 {capsules} capsules of 16D by self-attention routing "
                   "(161,824 weights),\n  and CapsNet's decoder 160-512-1024-784 for the reconstruction loss")


@dataclass(frozen=True)
class Recipe:
    """How one shipped model is trained and described on its card."""

    dataset: str
    title: str  # the data set's name on the card
    unit: str  # what the test examples are called: "digits", "images"
    capsules: str  # what the class capsules are called: "digit", "class"
    unseen: str  # the card's limits: what the model has not seen
    paper: str  # the card's first words: "A CapsNet (Sabour et al. 2017)"
    flags: list[str]  # capsnet train flags, without --dataset, --data-dir and --out
    model: str  # the card's Model line ({capsules} filled in)
    augmentation: str  # what the training images went through
    loss: str


MNIST_UNSEEN = "centred MNIST digits; other images (letters, photographs, digits far from the centre)"
CAPSNET_MNIST = Recipe(dataset="mnist", title="MNIST", unit="digits", capsules="digit", unseen=MNIST_UNSEEN,
                       paper="A CapsNet (Sabour et al. 2017)", flags=CAPSNET_FLAGS, model=CAPSNET_MODEL,
                       augmentation="shifted by up to 2 pixels (section 5 of the paper)",
                       loss="margin loss plus 0.0005 x reconstruction")
# name -> its recipe
SHIPPED = {
    DEFAULT: CAPSNET_MNIST,
    "capsnet-fashion-small": replace(  # the same recipe on Fashion-MNIST
        CAPSNET_MNIST, dataset="fashion-mnist", title="Fashion-MNIST", unit="images", capsules="class",
        unseen="centred Fashion-MNIST items (greyscale, 28x28, dark background); other images (photographs, other "
               "garments' datasets)"),
    "efficient-capsnet-mnist": Recipe(
        dataset="mnist", title="MNIST", unit="digits", capsules="digit", unseen=MNIST_UNSEEN,
        paper="An Efficient-CapsNet (Mazzia et al. 2021)", flags=EFFICIENT_FLAGS, model=EFFICIENT_MODEL,
        augmentation="rotated, shifted, squished and partly erased as Efficient-CapsNet's code does "
                     "(`--augment efficient-capsnet`)",
        loss="margin loss plus 0.392 x the per-pixel mean squared reconstruction error"),
}


def schedule(cfg: dict) -> str:
    """The card's words for the learning-rate schedule of train config ``cfg``."""
    if cfg.get("lr_schedule", "exponential") == "linear":
        warm = f"up over {cfg['warmup_steps']} steps to lr {cfg['lr']}, then " if cfg.get("warmup_steps") else \
            f"lr {cfg['lr']}, "
        return f"{warm}linearly down to 0 at the last step"
    return f"lr {cfg['lr']} decayed x{cfg['lr_decay']} every {cfg['lr_decay_steps']}\n  steps"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", choices=list(SHIPPED), default=DEFAULT, help="which shipped model to make")
    parser.add_argument("--data-dir", default=None, help="data root holding mnist/ and fashion-mnist/ (default: "
                                                         "capsnet's own lookup)")
    parser.add_argument("--work", type=Path, default=None,
                        help="the training run directory (default: runs/pretrained-NAME)")
    parser.add_argument("--out", type=Path, default=DIR, help="where the shipped files go")
    args = parser.parse_args(argv)
    NAME = args.name  # noqa: N806 - the name the card and the files carry
    recipe = SHIPPED[NAME]
    dataset, title = recipe.dataset, recipe.title
    args.work = args.work or Path("runs") / f"pretrained-{NAME}"

    data = ["--data-dir", args.data_dir] if args.data_dir else []
    name_flag = [] if NAME == DEFAULT else ["--name", NAME]
    train = ["capsnet", "train", *recipe.flags, "--dataset", dataset, *data, "--out", str(args.work)]
    if (args.work / "last.safetensors").exists():
        train.append("--resume")
    print("step 1:", shlex.join(train), flush=True)
    subprocess.run([sys.executable, "-m", "capsnet", *train[1:]], check=True)

    last = load_checkpoint(args.work, which="last")
    if last.state.get("epoch") != last.train_config["epochs"]:
        raise SystemExit(f"{args.work} stopped at epoch {last.state.get('epoch')} of {last.train_config['epochs']}: "
                         f"run this again to finish it")
    args.out.mkdir(parents=True, exist_ok=True)
    target = pack(args.work, args.out / f"{NAME}.safetensors")
    half = load_checkpoint(target).model_state

    full = evaluate_checkpoint(target, dataset=dataset, root=args.data_dir, progress=False)
    full_acc = full.results[""].accuracy
    sample_acc = evaluate_checkpoint(target, dataset="mnist-sample", progress=False).results[""].accuracy \
        if dataset == "mnist" else None
    t0 = time.perf_counter()
    from capsnet.models import pretrained
    pretrained(NAME)
    load_s = time.perf_counter() - t0
    weights = sum(v.numel() for v in half.values())
    final = last.state["history"][-1]
    sample = (f"""- **Shipped test sample** (`--dataset mnist-sample`, 500 MNIST test digits): accuracy
  {100 * sample_acc:.2f}% ({round(sample_acc * 500)} of 500); the test suite checks this figure.
""" if sample_acc is not None else "")
    measured = {f"{dataset.replace('-', '_')}_test_accuracy": full_acc, "weights": weights} | (
        {"sample_accuracy": sample_acc} if sample_acc is not None else {})
    cfg = last.train_config
    card = f"""# {NAME}

{recipe.paper} trained on {title} by capsnet, shipped in the package.
{"`capsnet viz` opens it when no `--checkpoint` is given; " if NAME == DEFAULT else ""}`capsnet eval --checkpoint pretrained:{NAME}`
scores it; `capsnet.models.pretrained("{NAME}")` loads it.

- **Model**: {recipe.model.format(capsules=recipe.capsules)}.
  {weights:,} weights, stored in float16 ({target.stat().st_size / 2**20:.1f} MiB).
- **Data**: the 60,000 {title} training {recipe.unit}, {recipe.augmentation}; no validation
  split, so the checkpoint is the final epoch's.
- **Training**: {cfg['epochs']} epochs of batch {cfg['batch_size']}, Adam at
  {schedule(cfg)}, {recipe.loss}, seed {cfg['seed']}, on a 2-core CPU.
- **Command**: `{shlex.join(["python", "tools/make_pretrained.py", *name_flag, "--data-dir", "../shared/data"])}`, which runs
  `{shlex.join(train[:-1] if train[-1] == '--resume' else train)}` and then keeps the last checkpoint's weights in
  float16.
- **{title} test error** (final epoch, all 10,000 test {recipe.unit}): {100 * (1 - full_acc):.2f}%
  (accuracy {100 * full_acc:.2f}%) with the float16 weights; the training run measured
  {100 * (1 - final['test_accuracy']):.2f}% in float32.
{sample}- **Load time**: {load_s * 1000:.0f} ms to build and load it here (`capsnet.models.pretrained`).
- **Limits**: trained on {recipe.unseen} get confident wrong answers.

<!-- measured: {json.dumps(measured)} -->
"""
    (args.out / f"{NAME}.md").write_text(card)
    print(card)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
