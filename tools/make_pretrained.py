"""Train a model shipped inside the package and write it with its model card.

    python tools/make_pretrained.py --data-dir ../shared/data                                  # capsnet-mnist-small
    python tools/make_pretrained.py --name capsnet-fashion-small --data-dir ../shared/data     # the Fashion-MNIST one
    python tools/make_pretrained.py --name efficient-capsnet-mnist --data-dir ../shared/data   # Efficient-CapsNet
    python tools/make_pretrained.py --name em-capsnet-mnist --data-dir ../shared/data          # EM matrix capsules
    python tools/make_pretrained.py --name segcaps-mnist --data-dir ../shared/data             # SegCaps
    python tools/make_pretrained.py --name capspix2pix-mnist --data-dir ../shared/data         # CapsPix2pix
    python tools/make_pretrained.py --name capspix2pix-fashion --data-dir ../shared/data       # on Fashion-MNIST

Step 1 is an ordinary ``capsnet train`` run (printed before it starts, so it
can be read and rerun by hand; an interrupted run resumes when this script is
run again). Step 2 takes the run's *last* checkpoint (the final epoch, never
the best over epochs), keeps the model weights only, in float16, and writes

- ``src/capsnet/pretrained/NAME.safetensors``: a capsnet checkpoint (configs,
  history and weights; no optimizer state), loadable as ``pretrained:NAME``;
- ``src/capsnet/pretrained/NAME.md``: the model card (data, command, weights,
  the final epoch's test figures with the float16 weights, re-measured here
  on the whole test split, and for MNIST the figures on the shipped
  ``mnist-sample`` test digits that the test suite checks: a classifier's
  accuracy on them, a segmentation model's Dice on the first
  ``SAMPLE_SIZE`` canvases made from them, a synthesis model's L1, SSIM and
  judged accuracy on the first ``SAMPLE_SIZE`` pairs; where no sample of
  the data set ships, the same figures on its first test images or pairs).

SegCaps trains for about 2 h 20 min and CapsPix2pix for about 40 min on one
thread of this project's CPU (on Fashion-MNIST's 60,000 pairs about 2 h 15 min
on two, at the shipped run's fastest epoch's rate); the segmentation and synthesis
cards' full tests take about 10 minutes more (20,000 canvases; 10,000 pairs).
"""
from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from capsnet.checkpoint import Checkpoint, atomic_write_text, load_checkpoint
from capsnet.evaluate import evaluate_checkpoint
from capsnet.models import model_spec
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

# Matrix capsules with EM routing, the small variant (A = 64, B = 8, C = D = 16: 68,444 weights), 2 EM iterations (at
# this budget 3 trail 2: docs/results/routing-family.md), the 8-epoch CPU recipe of that page (Adam 3e-3 as Gritzman's
# code, a 200-step warm-up then a linear decay, batch 32; the spread loss's margin grows over the first half)
EM_FLAGS = ["--model", "em-capsnet-small", "--epochs", "8", "--eval-every", "2", "--batch-size", "32", "--lr", "3e-3",
            "--lr-schedule", "linear", "--warmup-steps", "200", "--routing-iterations", "2", "--seed", "0"]
EM_MODEL = ("matrix capsules with EM routing (Hinton, Sabour and Frosst 2018), the small variant: a 5x5 convolution\n"
            "  (64 channels), 8 primary matrix capsule types, two 3x3 convolutional capsule layers of 16 types, 10 "
            "{capsules}\n  capsules with coordinate addition, 2 EM iterations (68,444 weights); no decoder")

# SegCaps R3 at the paper's size with two of capsnet's options (the capsules normalised per example, the routing
# softmax over the children), the 15,000-digit recipe trained 3 epochs (5,625 steps of batch 8): the best SegCaps
# recorded on this CPU (docs/results.md, "The children's softmax with the norm at 3,750 steps").
SEGCAPS_FLAGS = ["--model", "segcaps", "--train-size", "15000", "--epochs", "3", "--batch-size", "8",
                 "--lr-decay-steps", "100", "--test-size", "2000", "--eval-every", "1", "--seed", "0", "--compile",
                 "--model-option", "capsule_norm=instance", "--model-option", "routing_softmax=children"]
SEGCAPS_MODEL = ("SegCaps R3 (the paper's layers: a 5x5 convolution, primary capsules, convolutional and\n"
                 "  deconvolutional capsules with local dynamic routing, a 16D segmentation capsule whose length is the\n"
                 "  foreground probability), with `capsule_norm=instance` and `routing_softmax=children`")
# CapsPix2pix's deep start, the recipe of docs/results.md "A start that opens the deep path, trained 6,000 steps"
CAPSPIX2PIX_FLAGS = ["--model", "capspix2pix-deep", "--train-size", "24000", "--epochs", "4", "--eval-every", "1",
                     "--batch-size", "16", "--test-size", "1000", "--model-option", "l1_weight=1000",
                     "--compile", "default", "--seed", "0", "--model-option", "upsampling=deconv"]
CAPSPIX2PIX_MODEL = ("CapsPix2pix's generator (SegCaps R3's capsule layers over the skeleton and a noise\n"
                     "  channel made from a 100-d vector, `capspix2pix-deep`'s start with the paper's transposed\n"
                     "  convolutions) and its DCGAN discriminator")
# The same on all 60,000 Fashion-MNIST pairs with the deep start's default resize-then-convolve, 15,000 steps: the
# run of docs/results.md "Resize-then-convolve on all 60,000 Fashion pairs" (seed 0)
CAPSPIX2PIX_FASHION_FLAGS = [*CAPSPIX2PIX_FLAGS[:CAPSPIX2PIX_FLAGS.index("--train-size") + 1], "60000",
                             *CAPSPIX2PIX_FLAGS[CAPSPIX2PIX_FLAGS.index("--train-size") + 2:-1], "upsampling=resize"]
CAPSPIX2PIX_FASHION_MODEL = ("CapsPix2pix's generator (SegCaps R3's capsule layers over the silhouette and a noise\n"
                             "  channel made from a 100-d vector, `capspix2pix-deep`'s start with its default\n"
                             "  resize-then-convolve in the deconvolutional capsules) and its DCGAN discriminator")


@dataclass(frozen=True)
class Recipe:
    """How one shipped model is trained and described on its card."""

    dataset: str
    title: str  # the data set's name on the card
    unit: str  # what the test examples are called: "digits", "images"
    capsules: str  # what the class capsules are called: "digit", "class"
    limits: str  # the card's Limits line: what the model has not seen, and what then
    paper: str  # the card's first words: "A CapsNet (Sabour et al. 2017)"
    flags: list[str]  # capsnet train flags, without --dataset, --data-dir and --out
    model: str  # the card's Model line ({capsules} filled in)
    augmentation: str  # what the training images went through
    loss: str
    data: str = ""  # the card's Data line, where the classifiers' "the 60,000 training images" does not fit
    drawn: str = "digits"  # a synthesis model's: what it draws, and from which label maps
    label_map: str = "skeleton"
    made: str = ""  # the card's words on how the shipped weights were made, where not by one unbroken run


MNIST_UNSEEN = ("trained on centred MNIST digits; other images (letters, photographs, digits far from the centre) get "
                "confident wrong answers")
CAPSNET_MNIST = Recipe(dataset="mnist", title="MNIST", unit="digits", capsules="digit", limits=MNIST_UNSEEN,
                       paper="A CapsNet (Sabour et al. 2017)", flags=CAPSNET_FLAGS, model=CAPSNET_MODEL,
                       augmentation="shifted by up to 2 pixels (section 5 of the paper)",
                       loss="margin loss plus 0.0005 x reconstruction")
# name -> its recipe
SHIPPED = {
    DEFAULT: CAPSNET_MNIST,
    "capsnet-fashion-small": replace(  # the same recipe on Fashion-MNIST
        CAPSNET_MNIST, dataset="fashion-mnist", title="Fashion-MNIST", unit="images", capsules="class",
        limits="trained on centred Fashion-MNIST items (greyscale, 28x28, dark background); other images "
               "(photographs, other garments' datasets) get confident wrong answers"),
    "efficient-capsnet-mnist": Recipe(
        dataset="mnist", title="MNIST", unit="digits", capsules="digit", limits=MNIST_UNSEEN,
        paper="An Efficient-CapsNet (Mazzia et al. 2021)", flags=EFFICIENT_FLAGS, model=EFFICIENT_MODEL,
        augmentation="rotated, shifted, squished and partly erased as Efficient-CapsNet's code does "
                     "(`--augment efficient-capsnet`; these weights were trained on 2026-11-24, when its squish drew "
                     "its factor uniformly, stronger than the official code's half-normal that it draws since "
                     "2026-11-30: the command below now trains under the official squish, which scored 99.66%, "
                     "99.60% and 99.54% on seeds 0, 1 and 2, docs/results/routing-family.md)",
        loss="margin loss plus 0.392 x the per-pixel mean squared reconstruction error"),
    "em-capsnet-mnist": Recipe(
        dataset="mnist", title="MNIST", unit="digits", capsules="digit", limits=MNIST_UNSEEN,
        paper="An EM matrix-capsule network (Hinton et al. 2018)", flags=EM_FLAGS, model=EM_MODEL,
        augmentation="shifted by up to 2 pixels", loss="the spread loss, its margin 0.2 -> 0.9 over the first half"),
    "segcaps-mnist": Recipe(
        dataset="mnist-segmentation", title="mnist-segmentation", unit="canvases", capsules="segmentation",
        limits="trained on 64x64 canvases of one MNIST digit among MNIST clutter, it finds digit-like strokes; other "
               "images (photographs, medical scans, other objects or sizes) need a model trained on them (`--dataset "
               "folder:DIR`, README 'Segmentation')",
        paper="A SegCaps R3 (LaLonde and Bagci 2018)", flags=SEGCAPS_FLAGS, model=SEGCAPS_MODEL,
        augmentation="each placed on a fresh 64x64 canvas every step (turned up to 30 degrees, scaled 1-1.6x, among "
                     "fragments of other digits, noise and a background ramp)",
        loss="binary cross-entropy plus soft Dice, plus 0.0005 x the masked reconstruction",
        data="15,000 MNIST training digits (a seeded subset)"),
    "capspix2pix-mnist": Recipe(
        dataset="mnist-skeleton", title="mnist-skeleton", unit="pairs", capsules="",
        limits="trained on one-pixel-wide skeletons of MNIST digits on 32x32, it draws digit strokes along them; "
               "other label maps (filled shapes, thick strokes, letters) are outside what it learned: train on your "
               "own pairs (`--dataset pairs:DIR`, README 'Synthesis')",
        paper="A CapsPix2pix (Bass et al. 2019) generator with its discriminator", flags=CAPSPIX2PIX_FLAGS,
        model=CAPSPIX2PIX_MODEL,
        augmentation="each turned into a (Zhang-Suen skeleton, digit) pair centred on 32x32",
        loss="betas (0.5, 0.999), the adversarial loss with smoothed labels plus 1,000 x L1 for the generator",
        data="24,000 MNIST training digits (a seeded subset)"),
    "capspix2pix-fashion": Recipe(
        dataset="fashion-silhouette", title="fashion-silhouette", unit="pairs", capsules="",
        limits="trained on the filled silhouettes of Fashion-MNIST items on 32x32, it draws a garment, shoe or bag "
               "of that outline in Fashion-MNIST's greyscale style; other label maps (outlines, skeletons, other "
               "objects or sizes) are outside what it learned: train on your own pairs (`--dataset pairs:DIR`, "
               "README 'Synthesis')",
        paper="A CapsPix2pix (Bass et al. 2019) generator with its discriminator", flags=CAPSPIX2PIX_FASHION_FLAGS,
        model=CAPSPIX2PIX_FASHION_MODEL,
        augmentation="each turned into a (filled silhouette, item) pair centred on 32x32",
        loss="betas (0.5, 0.999), the adversarial loss with smoothed labels plus 1,000 x L1 for the generator",
        data="all 60,000 Fashion-MNIST training items", drawn="items", label_map="silhouette",
        made="The shipped weights are those of docs/results.md's run \"Resize-then-convolve on all 60,000 Fashion "
             "pairs\", read back by this command from a copy of its finished folder: it trained over three sittings "
             "resumed from its own saves (`--save-every 10`), its first 849 steps on the voting code before commit "
             "0d1c7f2 (the same numbers to float rounding), so the command remakes them to float rounding, not bit "
             "for bit."),
}

SAMPLE_SIZE = 100  # the shipped-sample canvases or pairs a segmentation or synthesis card is checked on (fast)
FIRST_SIZE = 1000  # the test images a classifier's card is checked on where no sample of its data set ships


def schedule(cfg: dict) -> str:
    """The card's words for the learning-rate schedule of train config ``cfg``."""
    if cfg.get("lr_schedule", "exponential") == "linear":
        warm = f"lr {cfg['lr']} after a {cfg['warmup_steps']}-step warm-up, then " if cfg.get("warmup_steps") else \
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
    # packed and measured beside the run, then moved in with its card: a measurement stopped (minutes, Ctrl-C) left
    # the package's new weights under the old card, whose figures the tests hold them to
    staged = pack(args.work, args.work / f"{NAME}.safetensors")
    target = args.out / f"{NAME}.safetensors"
    half = load_checkpoint(staged).model_state
    kind = model_spec(last.model_name).kind  # what the card measures
    measured, figures = MEASURE[kind](staged, recipe, last, args.data_dir)
    shutil.move(staged, target)  # the card follows within the second (the load below is timed in milliseconds)
    t0 = time.perf_counter()
    if target.resolve() == (DIR / f"{NAME}.safetensors").resolve():  # the package's own copy: as users load it
        from capsnet.models import pretrained
        model = pretrained(NAME)
    else:  # --out elsewhere: the file just written (pretrained(NAME) would time and count the installed one)
        from capsnet.evaluate import load_model
        model, _ = load_model(target)
    load_s = time.perf_counter() - t0
    weights = sum(v.numel() for v in half.values())  # what is stored: the weights and any batch-norm statistics
    learned = sum(p.numel() for p in model.parameters())
    counted = f"{weights:,} weights" if learned == weights else \
        f"{learned:,} weights ({weights:,} numbers with the batch-norm statistics)"
    # every figure the card prints, recorded with it (an audit found the training run's own figures and the load
    # time in the text alone, their run folders not kept)
    final = last.state["history"][-1]
    measured = measured | {"weights": weights, "load_ms": round(load_s * 1000),
                           "training_final": {k: v for k, v in final.items() if isinstance(v, (int, float))}}
    cfg = last.train_config
    uses = {"classification": f"`capsnet eval --checkpoint pretrained:{NAME}`\nscores it",
            "segmentation": f"`capsnet viz --checkpoint pretrained:{NAME}` opens it on canvases of the\nshipped "
                            f"digits, offline; `capsnet eval --checkpoint pretrained:{NAME}` scores it",
            "synthesis": f"`capsnet generate --checkpoint pretrained:{NAME} --labels LABELS_DIR --out OUT_DIR`\ndraws "
                         f"{recipe.drawn} from your {recipe.label_map} PNGs; "
                         f"`capsnet viz --checkpoint pretrained:{NAME}"
                         + ("` opens it offline" if _sample_of(recipe.dataset) else
                            " --data-dir DIR` opens it on the\ntest pairs made from DIR (none ship)")
            }[kind]
    data_flags = ["--data-dir", args.data_dir] if args.data_dir else []  # the command as it ran, as train's below
    placed = ([] if args.work == Path("runs") / f"pretrained-{NAME}" else ["--work", str(args.work)]) + \
        ([] if args.out.resolve() == DIR.resolve() else ["--out", str(args.out)])
    data = recipe.data or f"the 60,000 {title} training {recipe.unit}"
    card = f"""# {NAME}

{recipe.paper} trained on {title} by capsnet, shipped in the package.
{"`capsnet viz` opens it when no `--checkpoint` is given; " if NAME == DEFAULT else ""}{uses}; `capsnet.models.pretrained("{NAME}")` loads it.

- **Model**: {recipe.model.format(capsules=recipe.capsules)}.
  {counted}, stored in float16 ({target.stat().st_size / 2**20:.1f} MiB).
- **Data**: {data}, {recipe.augmentation}; no validation
  split, so the checkpoint is the final epoch's.
- **Training**: {cfg['epochs']} epochs of batch {cfg['batch_size']}, Adam at
  {schedule(cfg)}, {recipe.loss}, seed {cfg['seed']}, on a 2-core CPU.
- **Command**: `{shlex.join(["python", "tools/make_pretrained.py", *name_flag, *data_flags, *placed])}`, which runs
  `{shlex.join(train[:-1] if train[-1] == '--resume' else train)}` and then keeps the last checkpoint's weights in
  float16.{(chr(10) + "  " + recipe.made) if recipe.made else ""}
{figures}- **Load time**: {load_s * 1000:.0f} ms to build and load it here (`capsnet.models.pretrained`).
- **Limits**: {recipe.limits}.

<!-- measured: {json.dumps(measured)} -->
"""
    atomic_write_text(args.out / f"{NAME}.md", card)
    print(card)
    return 0


def measure_classification(target: Path, recipe: Recipe, last: Checkpoint, data_dir: str | None
                           ) -> tuple[dict, str]:
    """A classifier's card figures: accuracy on the whole test split, and on the shipped sample for MNIST."""
    dataset, title, final = recipe.dataset, recipe.title, last.state["history"][-1]
    full_acc = evaluate_checkpoint(target, dataset=dataset, root=data_dir, progress=False).results[""].accuracy
    sample_acc = evaluate_checkpoint(target, dataset="mnist-sample", progress=False).results[""].accuracy \
        if dataset == "mnist" else None
    # no shipped sample of the other sets: the first FIRST_SIZE test images stand in for it in the default suite
    first_acc = None if sample_acc is not None else evaluate_checkpoint(
        target, dataset=dataset, root=data_dir, test_size=FIRST_SIZE, progress=False).results[""].accuracy
    figures = f"""- **{title} test error** (final epoch, all 10,000 test {recipe.unit}): {100 * (1 - full_acc):.2f}%
  (accuracy {100 * full_acc:.2f}%) with the float16 weights; the training run measured
  {100 * (1 - final['test_accuracy']):.2f}% in float32.
"""
    if sample_acc is not None:
        figures += f"""- **Shipped test sample** (`--dataset mnist-sample`, 500 MNIST test digits): accuracy
  {100 * sample_acc:.2f}% ({round(sample_acc * 500)} of 500); the test suite checks this figure.
"""
    if first_acc is not None:
        figures += f"""- **The first {FIRST_SIZE:,} test {recipe.unit}** (`--test-size {FIRST_SIZE}`): accuracy
  {100 * first_acc:.2f}% ({round(first_acc * FIRST_SIZE)} of {FIRST_SIZE:,}); the test suite checks this figure.
"""
    return {f"{dataset.replace('-', '_')}_test_accuracy": full_acc} | (
        {"sample_accuracy": sample_acc} if sample_acc is not None else {f"first_{FIRST_SIZE}_test_accuracy": first_acc}
    ), figures


def measure_segmentation(target: Path, recipe: Recipe, last: Checkpoint, data_dir: str | None) -> tuple[dict, str]:
    """A segmentation model's card figures: Dice and IoU on all the test and out-of-distribution canvases, and on
    the first ``SAMPLE_SIZE`` canvases of the shipped digits (``mnist-sample-segmentation``)."""
    final, scored = last.state["history"][-1], _scored(last)
    full = evaluate_checkpoint(target, dataset=recipe.dataset, root=data_dir, progress=True, batch_size=64)
    sample = evaluate_checkpoint(target, dataset="mnist-sample-segmentation", test_size=SAMPLE_SIZE, progress=False)
    test, ood = full.results[""], full.results["ood"]
    s_test, s_ood = sample.results[""], sample.results["ood"]
    figures = f"""- **{recipe.title} test Dice** (final epoch, float16 weights, the mask where the probability
  exceeds 0.5): **{test.dice:.4f}** (IoU {test.iou:.4f}) on all {full.images:,} test canvases; out of distribution
  (turned up to 75 degrees, scaled 0.7-2.1x) {ood.dice:.4f} (IoU {ood.iou:.4f}). The training run measured
  {final['test_dice']:.4f} (out of distribution {final['ood_dice']:.4f}) on {scored} in float32.
- **Shipped test sample** (`--dataset mnist-sample-segmentation --test-size {SAMPLE_SIZE}`: canvases of the first
  {SAMPLE_SIZE} of the 500 MNIST test digits that ship with capsnet): Dice {s_test.dice:.4f}, out of distribution
  {s_ood.dice:.4f}; the test suite checks these figures.
"""
    return {"test_dice": test.dice, "test_iou": test.iou, "ood_dice": ood.dice, "ood_iou": ood.iou,
            "sample_dice": s_test.dice, "sample_ood_dice": s_ood.dice}, figures


def measure_synthesis(target: Path, recipe: Recipe, last: Checkpoint, data_dir: str | None) -> tuple[dict, str]:
    """A synthesis model's card figures on all the test pairs and on the first ``SAMPLE_SIZE`` pairs of the shipped
    digits (``mnist-sample-skeleton``), or, where none of its data set ship (Fashion-MNIST), of its test split,
    judged by the shipped classifier of its images."""
    from capsnet.synthesis import SPREAD_SEEDS, SPREAD_SIZE, evaluate_synthesis_checkpoint

    final, scored = last.state["history"][-1], _scored(last)
    things, label = recipe.drawn, recipe.label_map
    full = evaluate_synthesis_checkpoint(target, dataset=recipe.dataset, root=data_dir, progress=True)
    shipped = _sample_of(recipe.dataset)
    sample = evaluate_synthesis_checkpoint(target, dataset=shipped, test_size=SAMPLE_SIZE) if shipped else \
        evaluate_synthesis_checkpoint(target, dataset=recipe.dataset, root=data_dir, test_size=SAMPLE_SIZE)
    r, s = full.results[""], sample.results[""]
    figures = f"""- **{recipe.title} test figures** (final epoch, float16 weights, all {full.pairs:,} test pairs, noise
  seed 0): L1 {r.l1:.4f}, SSIM **{r.ssim:.4f}**, shape IoU {r.iou:.4f}; `{full.judge}` reads
  **{100 * r.judge_accuracy:.2f}%** of the generated {things} as the class of their {label}
  ({100 * r.judge_accuracy_draws:.2f}% over {SPREAD_SEEDS} noise draws of the first {SPREAD_SIZE:,}); the noise moves each pixel by
  {r.spread:.4f} (its standard deviation over the {SPREAD_SEEDS} draws). The training run measured L1 {final['test_l1']:.4f},
  SSIM {final['test_ssim']:.4f} and {100 * final['test_judge_accuracy']:.2f}% on {scored} in float32.
"""
    if shipped:
        given = f"--dataset {shipped} --test-size {SAMPLE_SIZE}"
        figures += f"""- **Shipped test sample** (`{given}`: the {label}s of the first
  {SAMPLE_SIZE} of the 500 MNIST test digits that ship with capsnet): L1 {s.l1:.4f}, SSIM {s.ssim:.4f}, judged
  {100 * s.judge_accuracy:.2f}%; the test suite checks these figures.
"""
    else:
        command = f"capsnet eval --checkpoint pretrained:{target.stem} --test-size {SAMPLE_SIZE} --data-dir DIR"
        figures += f"""- **The first {SAMPLE_SIZE} test pairs** (`{command}`; no {recipe.dataset} pairs
  ship): L1 {s.l1:.4f}, SSIM {s.ssim:.4f}, judged {100 * s.judge_accuracy:.2f}%; the test suite checks these figures.
"""
    return {"test_l1": r.l1, "test_ssim": r.ssim, "test_iou": r.iou, "test_judge_accuracy": r.judge_accuracy,
            "test_judge_accuracy_draws": r.judge_accuracy_draws, "test_spread": r.spread, "sample_l1": s.l1,
            "sample_ssim": s.ssim, "sample_judge_accuracy": s.judge_accuracy}, figures


def _sample_of(dataset: str) -> str | None:
    """The same task on the digits that ship with capsnet (``capsnet.data.tasks.shipped_default``), or None."""
    from capsnet.data.tasks import shipped_default

    sample = shipped_default(dataset)
    return sample if sample != dataset else None


def _scored(last: Checkpoint) -> str:
    """What the training run's own evaluations scored: "the first 2,000" (its --test-size) or "all of them"."""
    size = last.train_config.get("test_size", 0)
    return f"the first {size:,}" if size else "all of them"


MEASURE = {"classification": measure_classification, "segmentation": measure_segmentation,
           "synthesis": measure_synthesis}


if __name__ == "__main__":
    raise SystemExit(main())
