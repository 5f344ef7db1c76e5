"""The paper's experiments as runs of ``fit``: both models through the same loop, data and budget.

Sabour, Frosst and Hinton (NIPS 2017):

- ``multimnist`` (section 6): overlapping digit pairs on 36x36; the metric is
  the top-2 exact error (paper: 5.2% CapsNet, 8.1% CNN baseline).
- ``affine`` (section 5.2): train on translated MNIST (40x40), test on the
  translated test digits and on affine-transformed ones, each placed within
  the training range (+-6 px) and anywhere in the frame (the affNIST-like set:
  paper 79% vs 66% on affNIST at about 99.2% translated-MNIST accuracy).
- ``routing``: every registered capsule model (one per routing algorithm:
  dynamic, EM, self-attention, inverted dot-product attention) through the
  same loop, epochs and batch size on MNIST and Fashion-MNIST, each with its
  paper's learning rate and augmentation (its ``ModelSpec.train_defaults``,
  as in every experiment and ``capsnet train``), over several seeds:
  final-epoch test error (mean and spread), weights, training images/s and
  the peak tensor memory of a training step.
- ``segmentation`` (LaLonde and Bagci 2018, on ``mnist-segmentation``):
  SegCaps and the U-Net through the same loop, data and budget: final-epoch
  Dice and IoU on the fixed test canvases and on the out-of-distribution set,
  weights, training images/s and the peak memory of a training step, beside
  an Otsu threshold of each test image (no training), which shows the task
  is not trivial.
- ``synthesis`` (Bass et al. 2019, on ``mnist-skeleton`` and
  ``fashion-silhouette``): CapsPix2pix and pix2pix through the same GAN loop,
  data and budget: final-epoch L1, SSIM, shape IoU, noise spread and the
  accuracy of a frozen classifier reading the generated test images (the
  shipped one for the data set, when capsnet ships one), generator and total
  weights, training and generation images/s; then "train on synthetic, test
  on real": a small CapsNet trained only on the images each generator makes
  from the training label maps, scored on the real test images, beside the
  same CapsNet trained on the real training images.
- ``less-data``: MNIST test error from nested training subsets of 500, 1,000,
  5,000, 10,000 and 60,000 digits under one seed. Budget rule: every run, of
  either model, takes the same budget of optimizer steps (``steps``) rounded up
  to whole epochs, so a small subset is seen for more epochs: epochs =
  ceil(steps / ceil(size / batch)), at most one epoch's steps above ``steps``.

Each run is a plain ``capsnet train`` run directory under ``out/``; a run
already finished is read back, not retrained, and one cut short resumes. The
figures reported are the final epoch's, never the best over epochs.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import sys
import time
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Collection, Mapping, Sequence, TypeVar

from ._numbers import is_count
from ._signals import sigterm_as_interrupt
from .checkpoint import CheckpointError, atomic_write_text, load_checkpoint, read_json_object, short_repr
from .data.idx import DataError
from .data.tasks import TASKS, absolute_dataset, dataset_stem, folder_change, input_shape, task, task_kind
from .models import MODELS, default_routing, model_spec, num_weights, train_defaults
from .models.rounds import unused_rounds
from .models.capsnet import ROUTING_STARTS, unused_switches
from .routing import list_routings
from .train import TrainConfig, _differences, fit, input_fields, stop_requested, unfitting_images

if TYPE_CHECKING:
    import torch

T = TypeVar("T")

__all__ = ["EXPERIMENTS", "LESS_DATA_SIZES", "PAPER", "ROUTING_MODELS", "DEFAULT_MODELS", "planned_models", "Run",
           "model_entry", "model_title", "plan", "run_plan", "train_run", "training_examples",
           "format_table", "format_routing_table", "plot_less_data", "SEGMENTATION_MODELS", "otsu_row",
           "format_segmentation_table", "SYNTHESIS_MODELS", "format_synthesis_table", "synthetic_probe_rows"]

# name -> data sets
EXPERIMENTS = {"multimnist": ("multimnist",), "affine": ("translated-mnist",), "less-data": ("mnist",),
               "routing": ("mnist", "fashion-mnist"), "segmentation": ("mnist-segmentation",),
               "synthesis": ("mnist-skeleton", "fashion-silhouette")}
# one model per routing algorithm (em-capsnet, the paper's smallNORB size, is several times slower on a CPU)
ROUTING_MODELS = ("capsnet", "em-capsnet-small", "efficient-capsnet", "inverted-capsnet")
LESS_DATA_SIZES = (500, 1000, 5000, 10000, 60000)
COMPARED = ("capsnet", "baseline")  # the paper compares CapsNet with its CNN baseline; any registered model can run
SEGMENTATION_MODELS = ("segcaps", "unet")  # LaLonde and Bagci compare SegCaps with the U-Net
SYNTHESIS_MODELS = ("capspix2pix", "pix2pix")  # Bass et al. compare CapsPix2pix with pix2pix
# each experiment's models when none are given (the others: COMPARED)
DEFAULT_MODELS = {"routing": ROUTING_MODELS, "segmentation": SEGMENTATION_MODELS, "synthesis": SYNTHESIS_MODELS}
# the classifier of "train on synthetic, test on real": the shipped small CapsNet's sizes (src/capsnet/pretrained)
PROBE = {"conv1_channels": 64, "primary_types": 16, "decoder_hidden": (256, 512)}

# The paper's figures, for the tables (percent).
PAPER = {
    ("multimnist", "capsnet"): "5.2% error", ("multimnist", "baseline"): "8.1% error",
    ("affine", "capsnet"): "79% affNIST, 99.23% translated", ("affine", "baseline"): "66% affNIST, 99.22% translated",
    ("less-data", "capsnet"): "0.25% error at 60,000", ("less-data", "baseline"): "0.39% error at 60,000",
}


@dataclass(frozen=True)
class Run:
    experiment: str
    model: str  # a registered model name
    dataset: str
    seed: int
    model_config: Any
    train_config: TrainConfig
    run_dir: Path
    routing: str | None = None  # the routing model_config trains with, where it is not its model's default

    @property
    def label(self) -> str:
        """The network the run trains: NAME, or NAME:ROUTING for a routing other than its model's default."""
        return self.model if self.routing is None else f"{self.model}:{self.routing}"


def model_entry(entry: str) -> tuple[str, str | None]:
    """A plan's model: a registered name, or NAME:ROUTING for a model whose config has a ``routing`` field (CapsNet's
    digit capsules: ``capsnet:em``), so one network can be compared under each routing. Returns (name, routing or
    None); a ValueError names what is wrong and the valid choices."""
    name, colon, routing = entry.partition(":")
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    if not colon:
        return name, None
    routable = [m for m in MODELS if "routing" in {f.name for f in dataclasses.fields(MODELS[m].config)}]
    if name not in routable:
        raise ValueError(f"{entry}: {name} has no routing to set; NAME:ROUTING takes {', '.join(routable)}")
    choices = getattr(MODELS[name].config, "probability_routings", list_routings)()
    if routing not in choices:
        raise ValueError(f"{entry}: {name} takes the routings {', '.join(choices)}, not {routing!r}")
    return name, routing


def model_title(label: str) -> str:
    """The title of a plan's model (``Run.label``): its registered title, with its routing when one was set."""
    name, _, routing = label.partition(":")
    return "" if name not in MODELS else MODELS[name].title + (f", {routing} routing" if routing else "")


def plan(name: str, out: str | os.PathLike, *, train: TrainConfig, configs: Mapping[str, Any] | None = None,
         models: Sequence[str] | None = None, sizes: Sequence[int] = LESS_DATA_SIZES, steps: int = 0,
         seeds: Sequence[int] = (), datasets: Sequence[str] | None = None, typed: Collection[str] = ()) -> list[Run]:
    """The runs of experiment ``name``, each model's input sized to the experiment's images.

    ``train`` gives everything shared (epochs, batch, seed, test size, ...);
    its dataset is replaced by the experiment's. ``configs`` maps a model name
    to its config (a registered model left out gets its defaults, the paper's).
    For ``less-data`` each of ``sizes`` is one run per model, with ``steps``
    optimizer steps (0: ``train.epochs`` epochs for every size). For ``routing``
    each model (default ``ROUTING_MODELS``) runs on each of ``datasets``
    (default MNIST and Fashion-MNIST) for each of ``seeds`` (default
    ``train.seed``). ``segmentation`` and ``synthesis`` run on each of
    ``datasets`` (default the experiment's; the user's folder:DIR and pairs:DIR
    too): the default segmentation set's runs in ``out/MODEL`` (where they
    always were), every other in ``out/DATA/MODEL``, DATA the set's name
    (folder-NAME, pairs-NAME for a user's). Every model gets its
    ``ModelSpec.train_defaults`` (the CNN baseline's warm-up, EM's and
    Efficient-CapsNet's papers' rates, the latter's augmentation, the GAN's
    rate); a field named in ``typed`` (settings the user
    gave, such as ``lr``) keeps ``train``'s value for every model.
    """
    runs = _planned(name, out, train=train, configs=configs, models=models, sizes=sizes, steps=steps, seeds=seeds,
                    datasets=datasets, typed=typed)
    folders: dict[Path, Run] = {}
    for run in runs:  # two data sets of one name (folder:a/data and folder:b/data) would share their run folders
        other = folders.setdefault(run.run_dir, run)
        if other is not run:
            raise ValueError(f"{other.dataset} and {run.dataset} would both train in {run.run_dir} (their folders "
                             f"share the name {run.run_dir.parent.name!r}); run them with different --out, or rename "
                             f"one folder")
    return runs


def planned_models(name: str, models: Sequence[str] | None = None) -> list[str]:
    """The models an experiment trains: ``models`` (each name once, in its order), or the experiment's own
    (``DEFAULT_MODELS``; the others compare ``COMPARED``) when none are given."""
    return list(dict.fromkeys(models if models is not None else DEFAULT_MODELS.get(name, COMPARED)))


def _planned(name: str, out: str | os.PathLike, *, train: TrainConfig, configs: Mapping[str, Any] | None = None,
             models: Sequence[str] | None = None, sizes: Sequence[int] = LESS_DATA_SIZES, steps: int = 0,
             seeds: Sequence[int] = (), datasets: Sequence[str] | None = None, typed: Collection[str] = ()
             ) -> list[Run]:
    """``plan``'s runs, before their folders are checked."""
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; valid names are {', '.join(EXPERIMENTS)}")
    # a name given twice is one run, not two
    models = planned_models(name, models)
    seeds = tuple(dict.fromkeys(seeds))  # a user's folder named two ways (DIR, ./DIR) is one data set
    datasets = None if datasets is None else list(dict.fromkeys(absolute_dataset(d) for d in datasets))
    if not models:
        raise ValueError(f"no models; choose from {', '.join(MODELS)}")
    entries = {m: model_entry(m) for m in models}  # entry -> (registered name, routing or None)
    out = Path(out)
    given = dict(configs or {})

    def own(m: str, dataset: str) -> dict[str, Any]:  # the model's own training settings (its paper's), unless typed
        m = entries[m][0]
        # with the run's task's (MultiMNIST's decay period), and as capsnet train gives them on that data set (a
        # user's classes:DIR of the routing experiment: not Efficient-CapsNet's MNIST augmentation, which the
        # experiment's first data set's defaults gave it)
        mine = train_defaults(m, train.lr_schedule, dataset)
        return {k: v for k, v in mine.items() if k not in typed}

    def routed(m: str) -> str | None:  # the routing a run trains with, where it is not its model's default
        model, routing = entries[m]
        default = default_routing(model)
        routing = routing or getattr(given.get(model), "routing", default)
        return None if routing == default else routing

    def sized(m: str, dataset: str) -> Any:
        model, routing = entries[m]
        config = given.get(model) or model_spec(model).config()
        # NAME:ROUTING over a given config routed otherwise: that routing's options and start do not carry over
        swap = {} if routing is None or routing == config.routing else \
            {"routing": routing} | ({"routing_options": {}} if hasattr(config, "routing_options") else {})
        # CapsNet's start for the routing it was given goes too, unless the user set it (it differs from that
        # routing's start): capsnet train --routing em keeps a typed digit_init_std
        if swap and hasattr(config, "digit_init_std") and \
                config.digit_init_std == ROUTING_STARTS.get(config.routing, ({}, None))[1]:
            swap["digit_init_std"] = None
        if swap:  # rounds set for the given config's routing route nothing under a one-pass one: their defaults;
            # dynamic routing's switches (capsnet-cifar10's leaky routing) nothing under another routing: off
            swap |= unused_rounds(config, routing) | unused_switches(config, routing)
        fields = input_fields(model, dataset)
        try:
            return replace(config, **fields, **swap)
        except ValueError as e:  # a user's images of a size the network cannot take: whose size it is, and the fix
            raise unfitting_images(e, dataset, m, fields, dataset_said="--datasets", model_said="--models") or e \
                from None

    def stem(m: str) -> str:  # a run folder's name: NAME:ROUTING trains in NAME-ROUTING-routing (no colon)
        model, routing = entries[m][0], routed(m)
        return model if routing is None else f"{model}-{routing}-routing"

    def make(m: str, dataset: str, seed: int, train_config: TrainConfig, run_dir: Path) -> Run:
        return Run(name, entries[m][0], dataset, seed, sized(m, dataset), train_config, run_dir, routed(m))

    # one run per network trained: capsnet and capsnet:dynamic are one (with a config routed otherwise, two)
    networks = {}
    for m in models:
        networks.setdefault((entries[m][0], routed(m)), m)
    models = list(networks.values())
    kind = task(EXPERIMENTS[name][0]).kind
    wrong = [m for m in models if model_spec(entries[m][0]).kind != kind]
    if wrong:
        fitting = [n for n, spec in MODELS.items() if spec.kind == kind]
        raise ValueError(f"the {name} experiment needs {kind} models; {', '.join(wrong)} "
                         f"{'is' if len(wrong) == 1 else 'are'} not: give --models from {', '.join(fitting)}")
    if datasets is not None and name not in ("routing", "segmentation", "synthesis"):
        raise ValueError(f"the {name} experiment runs on {EXPERIMENTS[name][0]} alone; it takes no data sets")
    datasets = list(datasets or EXPERIMENTS[name])
    other = [d for d in datasets if task_kind(d) != kind]
    if other:
        yours = {"segmentation": "folder:DIR (your images and masks)", "synthesis": "pairs:DIR (your label maps "
                 "and images)", "classification": "classes:DIR (your images, a folder per class)"}[kind]
        known = [n for n in TASKS if task_kind(n) == kind and (name != "routing" or input_shape(n) == (1, 28, 28))]
        raise ValueError(f"the {name} experiment needs {kind} data sets; {', '.join(other)} "
                         f"{'is' if len(other) == 1 else 'are'} not: give --datasets from "
                         f"{', '.join(known)} or {yours}")

    if name == "synthesis":
        return [make(m, d, train.seed, replace(train, dataset=d, **own(m, d)), out / dataset_stem(d) / stem(m))
                for d in datasets for m in models]

    if name == "routing":
        bad = [d for d in datasets if input_shape(d) != (1, 28, 28)]
        if bad:
            raise ValueError(f"the routing experiment compares on 28x28 grey image sets (its models' recipes are "
                             f"the papers' MNIST ones); not {', '.join(bad)}, whose images are "
                             f"{'x'.join(map(str, input_shape(bad[0])))} (C x H x W): train each model on it with "
                             f"capsnet train --dataset {bad[0]} --model NAME")
        return [make(m, d, seed, replace(train, dataset=d, seed=seed, **own(m, d)),
                     out / dataset_stem(d) / f"{stem(m)}-seed{seed}")
                for d in datasets for m in models for seed in (seeds or (train.seed,))]
    if name == "segmentation":  # the default data set's runs in out/MODEL (as recorded), any other's in out/DATA/MODEL
        return [make(m, d, train.seed, replace(train, dataset=d, **own(m, d)),
                     out / stem(m) if d == EXPERIMENTS[name][0] else out / dataset_stem(d) / stem(m))
                for d in datasets for m in models]
    dataset = EXPERIMENTS[name][0]
    base = replace(train, dataset=dataset)
    runs = []
    if name != "less-data":  # multimnist, affine
        for m in models:
            runs.append(make(m, dataset, base.seed, replace(base, **own(m, dataset)), out / stem(m)))
        return runs
    bad = [s for s in sizes if not 1 <= s <= 60000]
    if bad or not sizes:
        raise ValueError(f"less-data sizes must lie in 1..60000 (MNIST's training set), got {list(sizes) or 'none'}")
    for size in sorted(set(sizes)):
        epochs = max(1, math.ceil(steps / math.ceil(size / train.batch_size))) if steps else train.epochs
        cfg = replace(base, train_size=0 if size == 60000 else size, epochs=epochs,
                      eval_every=max(1, epochs // 10))  # about ten evaluations a run, the last one reported
        for m in models:
            runs.append(make(m, dataset, cfg.seed, replace(cfg, **own(m, dataset)), out / f"{stem(m)}-{size}"))
    return runs


def training_examples(run: Run) -> int:
    """How many training examples ``run`` trains on: its ``train_size`` subset, else the whole training split of
    its data set (mnist-sample's 2,000, MNIST's 60,000; a user's folder: its training pairs, read), less the
    ``val_size`` held out for validation."""
    cfg = run.train_config
    return (cfg.train_size or _split_count(task(run.dataset).source, "train", None)) - cfg.val_size


def _split_count(source: str, split: str, data_root: str | os.PathLike | None) -> int:
    """How many examples split ``split`` of a task's source holds: a registered image set's known size (nothing
    read or downloaded), a user's folder's or another set's by reading it."""
    from .data.sets import DATASETS, split_size
    from .data.tasks import load_source

    if source in DATASETS:
        return split_size(source, split)
    return len(load_source(source, split, data_root, False))


# training flags of the experiments whose defaults have changed (the baseline's warm-up, MultiMNIST's decay period,
# EM's and Efficient-CapsNet's rates and the latter's augmentation in less-data, 2026-12-03)
_READ_BACK = ("warmup_steps", "lr_decay_steps", "lr", "augment")


def _finished(run: Run) -> dict[str, Any] | None:
    """The final record of a run directory that already completed exactly this run, else None."""
    try:
        ckpt = load_checkpoint(run.run_dir, "last")
    except CheckpointError:
        return None
    try:  # the saved settings as today's configs read them: a field added since takes its default
        saved_train = TrainConfig.from_saved(ckpt.train_config).to_dict()
        saved_model = type(run.model_config).from_saved(ckpt.model_config).to_dict()
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{run.run_dir} holds a run whose settings this capsnet cannot read ({e}); remove it or "
                              f"choose another --out") from None
    planned_train, planned_model = run.train_config.to_dict(), run.model_config.to_dict()
    differ = _differences(saved_train, planned_train) + _differences(saved_model, planned_model)
    if differ:
        said = [f"{k}: {short_repr((saved_train if k in saved_train else saved_model).get(k))} there, "
                f"{short_repr((planned_train if k in planned_train else planned_model).get(k))} planned" for k in differ]
        # the settings whose defaults changed (the baseline's warm-up, MultiMNIST's decay period): typed, they read
        # back a folder made before
        # A flag typed applies to every model of the plan: where the run has its model's own default, the way back
        # is to leave the flag out ("give --warmup-steps 0" for one model's run, "200" for the other's, in turn)
        own = {**TrainConfig().to_dict(), **train_defaults(run.model, run.train_config.lr_schedule, run.dataset)}
        back = [k for k in differ if k in _READ_BACK and k in saved_train]
        typed = [f"--{k.replace('_', '-')} {saved_train[k]}" for k in back if saved_train[k] != own.get(k)]
        left = [f"--{k.replace('_', '-')}" for k in back if saved_train[k] == own.get(k)]
        hint = ""
        if len(back) == len(differ):
            ways = ([f"give {' '.join(typed)}"] if typed else []) + (
                [f"leave {' and '.join(left)} out (each model then takes its own default, the run's)"] if left else [])
            hint = f"{' and '.join(ways)} to read it back, or "
        raise CheckpointError(f"{run.run_dir} holds a run with other settings ({'; '.join(said)}); {hint}remove it or "
                              f"choose another --out")
    done = ckpt.state.get("epoch")
    if isinstance(done, int) and done > run.train_config.epochs:  # its final figures are of a later epoch
        more = ("a larger --steps (each size's epochs follow from it)" if run.experiment == "less-data"
                else f"--probe-epochs {done}" if run.experiment == "synthesis-probe" else f"--epochs {done}")
        raise CheckpointError(f"{run.run_dir} holds a run of {done} epochs, more than the {run.train_config.epochs} "
                              f"asked for; give {more}, or remove it or choose another --out")
    planned = saved_train.get("epochs")
    if done == run.train_config.epochs and planned != done:  # stopped early in a longer run: not this run's end
        more = ("the --steps it ran with" if run.experiment == "less-data" else f"--probe-epochs {planned}"
                if run.experiment == "synthesis-probe" else f"--epochs {planned}")
        raise CheckpointError(f"{run.run_dir} holds a run of {planned} epochs that stopped after {done}: its last "
                              f"epoch is not the end of a {done}-epoch run (its schedule and evaluations were those of "
                              f"{planned} epochs); give {more} to finish it, or remove it or choose another --out")
    if done == run.train_config.epochs and ckpt.state.get("history") and "within" not in ckpt.state:
        # a user's folder changed since: its figures are of other pairs than the table's other rows (a baseline
        # scored now, a run trained now)
        if (change := folder_change(ckpt.state, run.train_config.dataset)) is not None:
            raise CheckpointError(f"{run.run_dir} was trained on {run.train_config.dataset} as it was: it holds "
                                  f"{change}, so the run's figures are of other pairs than this table's; remove the "
                                  f"run (or choose another --out) to train on the folder as it is, or put the folder "
                                  f"back")
        return ckpt.state["history"][-1]
    return None


def train_run(run: Run, *, device: str = "auto", data_root: str | os.PathLike | None = None, progress: bool = True,
              compile: bool | str = False, on_epoch: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Train one run of a plan, resuming where its directory holds a checkpoint; its final epoch's record.
    ``on_epoch(record)``: called with each evaluated epoch's record (the CLI's lines without progress bars)."""
    resume = (run.run_dir / "last.safetensors").exists()
    if model_spec(run.model).kind == "synthesis":
        from .gan import fit_gan
        from .synthesis import judge_for

        return fit_gan(run.model_config, run.train_config, run.run_dir, device=device, data_root=data_root,
                       resume=resume, progress=progress, judge=None if resume else judge_for(run.dataset),
                       compile=compile, on_epoch=on_epoch)
    return fit(run.model_config, run.train_config, run.run_dir, device=device, data_root=data_root, resume=resume,
               progress=progress, compile=compile, distributed=False,  # one process trains a plan's runs in turn
               on_epoch=on_epoch)


def _train_in_worker(task: tuple[int, Run, str, str | os.PathLike | None, bool | str, int, bool]) -> int:
    """A worker process's run (``run_plan`` with ``jobs``): its share of the threads, the parent's allocator; the
    run's index, or an error that names the run."""
    k, run, device, data_root, compile, threads, keep_memory = task
    import warnings

    import torch

    from ._progress import one_line_warnings

    # capsnet's own warnings: one line naming the run
    warnings.showwarning = one_line_warnings(f"warning, run {k + 1} ({run.label} on {run.dataset}, seed {run.seed}): ")

    torch.set_num_threads(threads)
    if keep_memory:
        from .memory import keep_freed_memory

        keep_freed_memory()
    try:
        train_run(run, device=device, data_root=data_root, progress=False, compile=compile)
    except KeyboardInterrupt:  # stopped by the parent's SIGTERM (or its watchdog's), saved where it was: the
        sys.stdout.flush()  # process ends (the pool's worker would wait for another call, and its parent 120 s)
        os._exit(130)
    except Exception as e:  # the message crosses back to the parent; the worker's traceback does not
        failed = f"run {k + 1} ({run.label} on {run.dataset}, seed {run.seed}, {run.run_dir}) failed: "
        if isinstance(e, (CheckpointError, DataError)):  # the kinds the CLI says in a line, as with one job
            raise type(e)(f"{failed}{e}") from None
        if isinstance(e, (ValueError, OSError)):
            raise ValueError(f"{failed}{e}") from None
        raise RuntimeError(f"{failed}{type(e).__name__}: {e}") from None
    return k


_ORPHAN_GRACE_S = 60.0  # how long a worker whose parent was killed may take to save before it leaves
STOP_GRACE_S = 120.0  # how long a stopped worker may take to reach its next step and save before it is killed


def _worker_start(parent: int) -> None:
    """A worker process's first act: leave when its parent does (killed with SIGKILL, the workers were adopted by
    init, finished their run and waited on their pipe for ever, 400 MB each)."""
    import threading

    from . import train

    train.STOPPED_BY_PARENT = True  # a scheduler's SIGTERM to the group and the parent's after it: one stop
    # tqdm's lock for its bars (a worker draws none) as a thread lock: its default, a multiprocessing lock, is a POSIX
    # semaphore that a stopped worker's os._exit left behind ("resource_tracker: There appear to be 2 leaked
    # semaphore objects" on every stopped --jobs 2)
    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())
    def watch() -> None:
        import signal

        while os.getppid() == parent:
            time.sleep(1.0)
        # the parent is gone (killed): a SIGTERM lets a training run save where it is, as a stop from the parent
        # does; a worker still there after a grace period leaves as it is (its last checkpoint resumes next time)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(_ORPHAN_GRACE_S)
        os._exit(1)
    threading.Thread(target=watch, name="capsnet-parent-watch", daemon=True).start()


def _as_completed_bounded(executor, todo: Sequence[T], jobs: int, job: Callable[[T], tuple[Callable, tuple]],
                          on_launch: Callable[[T], None] | None = None):
    """Run ``todo`` on ``executor`` with at most ``jobs`` in flight: ``job(item)`` gives the (function, arguments)
    to submit, ``on_launch(item)`` is called as each is submitted. Yields ``(item, future, in_flight)`` as each
    finishes, in the order they finish (``in_flight``: the items still running), and submits the next item as soon
    as one finishes, not when the whole batch in flight has."""
    queue, pending = list(todo), {}

    def launch() -> None:
        while queue and len(pending) < jobs:
            item = queue.pop(0)
            if on_launch is not None:
                on_launch(item)
            function, arguments = job(item)
            pending[executor.submit(function, arguments)] = item

    launch()
    while pending:
        done, _ = wait(pending, return_when=FIRST_COMPLETED)
        for future in done:
            item = pending.pop(future)
            yield item, future, list(pending.values())
        launch()


class _FreshProcesses:
    """An executor whose every ``submit`` runs in a new process of its own: a one-worker pool per call, shut down
    once its call is done (``release``) or stopped (``stop``). Not ProcessPoolExecutor(max_tasks_per_child=1): on
    Python 3.11 its worker replacement can leave a spawned worker that shutdown waits on for ever (cpython
    gh-115634; seen here after the last run of a 24-run experiment)."""

    def __init__(self, context) -> None:
        self.context = context
        self.pools: dict[Any, Any] = {}

    def submit(self, function: Callable, *args: Any):
        import signal
        from concurrent.futures import ProcessPoolExecutor

        try:
            pool = ProcessPoolExecutor(1, mp_context=self.context, initializer=_worker_start, initargs=(os.getpid(),))
        except OSError as e:  # its locks are POSIX semaphores in /dev/shm: read-only or missing in some sandboxes
            raise ValueError(f"cannot start worker processes for --jobs ({e.strerror or e}: Python's multiprocessing "
                             f"needs a writable /dev/shm here); run with --jobs 1") from None
        try:  # the process is started here: started ignoring Ctrl-C (a disposition it keeps across exec, and its
            # fit leaves so), so a terminal's Ctrl-C, which reaches the whole group, is no traceback or stop of its
            # own; the parent stops it (``stop``: SIGTERM, which its fit takes as one stop: save, then stop)
            before = signal.signal(signal.SIGINT, signal.SIG_IGN)
        except ValueError:  # not the main thread: as it is
            before = None
        try:
            future = pool.submit(function, *args)
        finally:
            if before is not None:
                signal.signal(signal.SIGINT, before)
        self.pools[future] = pool
        return future

    def release(self, future) -> None:
        """Join the process of a finished call."""
        pool = self.pools.pop(future, None)
        if pool is not None:
            pool.shutdown(wait=True)

    def stop(self) -> None:
        """Stop every call still running (SIGTERM: a training run saves where it is, then stops; a worker takes
        repeated SIGTERMs as one, so a process still there after ``STOP_GRACE_S`` is killed) and join them."""
        processes = [p for pool in self.pools.values() for p in list(getattr(pool, "_processes", {}).values())]
        for process in processes:  # no public API to stop a running call
            process.terminate()
        deadline = time.monotonic() + STOP_GRACE_S
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
        for future, pool in list(self.pools.items()):
            pool.shutdown(wait=True, cancel_futures=True)
            del self.pools[future]


def _train_in_parallel(todo: Sequence[tuple[int, Run]], *, jobs: int, device: str,
                       data_root: str | os.PathLike | None, compile: bool | str, keep_memory: bool, on_trained,
                       on_launch=None) -> None:
    """Train ``todo`` (index, run) ``jobs`` at a time, each in a fresh process (spawned: no forked OpenMP state)
    with 1/jobs of this process's threads (1/len(todo) where fewer runs are left); ``on_launch(k, run)`` as each
    is handed to a process (no more than ``jobs`` are in flight, the next one started as soon as one finishes),
    ``on_trained(k, run)`` as each finishes. A run that fails, or a worker that dies without a word (killed for
    memory, say), stops the others at once (checkpoints are written atomically: they resume next time), raised
    here naming the run or the runs in progress."""
    import multiprocessing
    from concurrent.futures.process import BrokenProcessPool

    import torch

    # fewer runs left than --jobs (an interrupted experiment resumed): the threads are shared among those alone
    threads = max(1, torch.get_num_threads() // max(1, min(jobs, len(todo))))
    processes = _FreshProcesses(multiprocessing.get_context("spawn"))

    def job(item: tuple[int, Run]) -> tuple[Callable, tuple]:
        k, run = item
        return _train_in_worker, (k, run, device, data_root, compile, threads, keep_memory)

    try:
        with sigterm_as_interrupt():  # SIGTERM (kill, timeout, a scheduler) stops the workers as Ctrl-C does
            for (k, run), future, in_flight in _as_completed_bounded(
                    processes, todo, jobs, job,
                    on_launch=None if on_launch is None else lambda item: on_launch(*item)):
                try:
                    future.result()
                except BrokenProcessPool:
                    names = ", ".join(f"{r.label} on {r.dataset}, seed {r.seed}"
                                      for r in [run, *(r for _, r in in_flight)])
                    raise CheckpointError(f"a worker process died while training (killed from outside, or for lack "
                                          f"of memory: see `dmesg`); runs in progress: {names}. Finished runs are "
                                          f"kept and interrupted ones resume: run the command again, with fewer "
                                          f"--jobs if memory ran out") from None
                processes.release(future)
                if on_trained is not None:
                    on_trained(k, run)
    finally:
        processes.stop()


def check_sizes(runs: Sequence[Run], data_root: str | os.PathLike | None = None) -> None:
    """A ValueError, before any run trains, for a run that asks for more training or test examples than its data
    set holds (found as that run started, after the runs before it had trained and rewritten the results): the
    same rule and words as ``load_training``'s, from each data set's sizes (``_split_count``)."""
    from .data.tasks import check_test_size

    counts: dict[str, tuple[int, int] | None] = {}
    for run in runs:
        cfg = run.train_config
        if not (cfg.train_size or cfg.test_size):
            continue
        if run.dataset not in counts:
            source = task(run.dataset).source
            try:
                counts[run.dataset] = tuple(_split_count(source, split, data_root) for split in ("train", "test"))
            except DataError:  # a folder not there, a set not on disk: said as the run that needs it starts
                counts[run.dataset] = None
        if counts[run.dataset] is None:
            continue
        n_train, n_test = counts[run.dataset]
        if cfg.train_size > n_train:
            raise ValueError(f"train_size {cfg.train_size} exceeds the {n_train} training examples of {run.dataset} "
                             f"({run.label}, seed {run.seed}); give at most {n_train}, or 0 for all")
        if not cfg.val_size:  # (with one, the test split is not read)
            check_test_size(cfg.test_size, n_test, run.dataset)


def run_plan(runs: Sequence[Run], *, device: str = "auto", data_root: str | os.PathLike | None = None,
             progress: bool = True, on_start=None, on_done=None, compile: bool | str = False, jobs: int = 1,
             keep_memory: bool = False, on_trained=None, on_launch=None, on_epoch=None,
             on_parallel=None) -> list[dict[str, Any]]:
    """Train each run (or read back a finished one) and return one row per run with its final epoch's metrics.

    ``on_start(k, run, done)`` is called before run k is trained or read back (``done``: it had finished before this
    call, so its figures are read back from its run directory), ``on_done(rows)`` after each run with the
    rows so far; ``compile`` is passed to ``fit`` (``capsnet.train.compile_model``). With ``jobs`` above 1 the
    runs still to train are first trained that many at a time, each in a process of its own with 1/jobs of the
    threads (``keep_memory``: with the allocator kept as ``capsnet.memory.keep_freed_memory`` keeps it), without
    progress bars, ``on_parallel(n)`` called first with the number of those runs (none: not called),
    ``on_launch(k, run)`` as each starts and ``on_trained(k, run)`` as each finishes; then
    every run is read back in order (``done`` true for those too). ``on_epoch(run, record)``: called with each
    evaluated epoch's record of a run trained in this process.
    """
    if not is_count(jobs):
        raise ValueError(f"jobs must be a positive integer, got {jobs!r}")
    stop_requested(clear=True)
    check_sizes(runs, data_root)
    # every run directory checked before any run trains: one holding another run is refused before the first run
    # rewrites the results (each checkpoint read once)
    finished = {k: _finished(run) for k, run in enumerate(runs)}
    todo = [(k, run) for k, run in enumerate(runs) if finished[k] is None] if jobs > 1 else []
    if todo:
        if on_parallel is not None:
            on_parallel(len(todo))
        _train_in_parallel(todo, jobs=jobs, device=device, data_root=data_root, compile=compile,
                           keep_memory=keep_memory, on_trained=on_trained, on_launch=on_launch)
    rows = []
    memory: dict[tuple, float] = {}  # (model, data set, amp) -> peak MB of a training step as the runs trained
    for k, run in enumerate(runs):
        final = finished[k] if finished[k] is not None or not todo else _finished(run)  # read again if trained above
        if on_start is not None:  # read back: finished before, or just now in a process of its own
            on_start(k, run, final is not None)
        synthesis = model_spec(run.model).kind == "synthesis"
        trained_now = final is None
        if final is None:
            try:
                final = train_run(run, device=device, data_root=data_root, progress=progress, compile=compile,
                                  on_epoch=None if on_epoch is None else functools.partial(on_epoch, run))
            except ValueError as e:  # named as with --jobs above 1 (the error alone, its run known from the line
                if len(e.args) == 1 and isinstance(e.args[0], str):  # above it): the same exception, its type,
                    e.args = (f"run {k + 1} ({run.label} on {run.dataset}, seed {run.seed}, {run.run_dir}) "
                              f"failed: {e.args[0]}",)  # attributes and traceback kept
                raise
        size = training_examples(run)
        row = {"experiment": run.experiment, "model": run.label, "dataset": run.dataset, "seed": run.seed,
               "train_size": size, "epochs": run.train_config.epochs, "weights": num_weights(run.model_config),
               "run_dir": str(run.run_dir)}
        if synthesis:
            from .runtime import resolve_device

            row |= {"generator_weights": run.model_config.generator_weights,
                    "generate_images_per_s": _measured_once(
                        run, "generate_images_per_s", {"device": str(resolve_device(device)),
                                                       "images": GENERATION_SPEED_IMAGES},
                        lambda: _generation_speed(run, device, data_root))}
        elif run.experiment in ("routing", "segmentation"):
            from .runtime import resolve_device

            key = (run.label, run.dataset, run.train_config.amp)
            dev = str(resolve_device(device))

            def peak() -> float:  # under the run's autocast and compilation (fp32 eager before, whatever it trained)
                if key not in memory:
                    from .bench import measure_training

                    memory[key] = measure_training(run.model, run.model_config,
                                                   batch_size=run.train_config.batch_size, repeats=1, device=dev,
                                                   bf16=run.train_config.amp == "bf16",
                                                   fp16=run.train_config.amp == "fp16",
                                                   compile=compile)["peak_mem_mb"]
                return memory[key]
            row["peak_mem_mb"] = _measured_once(run, "peak_mem_mb", {
                "device": dev, "batch_size": run.train_config.batch_size, "amp": run.train_config.amp,
                "compile": compile or False}, peak)
        rows.append(row | final)
        if on_done is not None:
            on_done(rows)
        # a stop asked after its final evaluation: it finished and saved, and is in the tables (it was left out of
        # them, and the last run's tables stayed "unfinished": a bug hunt, 2026-12-05); the next does not start
        if trained_now and stop_requested() and k < len(runs) - 1:
            raise KeyboardInterrupt
    return rows


# The affine experiment's columns: (record key, header). Placement within the training range first, then
# anywhere in the frame; in each pair untransformed digits first: across a pair the distortion changes, between
# the pairs the placement (data/tasks.py has the rules).
AFFINE_COLUMNS = (("test", "translated +-6 px (as trained)"), ("affine_centred", "affine +-6 px"),
                  ("translated_anywhere", "translated anywhere"), ("affine", "affine anywhere (affNIST-like)"))


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """A markdown table of the final-epoch test figures, one line per run.

    The affine experiment shows test accuracy on each of its test sets; a run
    recorded before a set existed shows "-" for it.
    """
    head = ["model", "train size", "epochs", "steps", "test error"]
    multimnist = any(r["experiment"] == "multimnist" for r in rows)
    affine = any("affine_accuracy" in r for r in rows)
    if affine:
        head = head[:-1] + [f"accuracy, {title}" for _, title in AFFINE_COLUMNS]
    elif multimnist:
        head[-1] = "top-2 exact error"
    cited = any((r["experiment"], r["model"]) in PAPER for r in rows)  # the README's "beside the paper's"
    if cited:
        head.append("the paper's (Sabour et al. 2017: Table 1; affNIST: section 5.2)")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["model"], f"{r['train_size']:,}", str(r["epochs"]), f"{r['step']:,}"]
        if affine:
            cells += [f"{100 * r[f'{key}_accuracy']:.2f}%" if f"{key}_accuracy" in r else "-"
                      for key, _ in AFFINE_COLUMNS]
        else:
            cells.append(f"{100 * r['test_error']:.2f}%")
        if cited:
            cells.append(PAPER.get((r["experiment"], r["model"]), "-"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def otsu_row(dataset: str, *, test_size: int = 0, root: str | os.PathLike | None = None) -> dict[str, Any]:
    """The Otsu-threshold baseline on ``dataset``'s test split and its extra sets: each image's own threshold
    (Otsu 1979), no training; the same Dice and IoU as the models' (means over the images)."""
    from .data.segmentation import dice_iou, otsu_masks
    from .data.tasks import load_test

    split = load_test(dataset, size=test_size, root=root, progress=False).to("cpu")
    row: dict[str, Any] = {"experiment": "segmentation", "model": "otsu", "dataset": dataset, "weights": 0}
    for key, sp in {"test": split, **split.extra}.items():
        dice, iou = dice_iou(otsu_masks(sp.images), sp.labels)
        row |= {f"{key}_dice": dice.mean().item(), f"{key}_iou": iou.mean().item()}
    return row


def format_segmentation_table(rows: Sequence[dict[str, Any]]) -> str:
    """The segmentation experiment's table: final-epoch Dice and IoU on the test and out-of-distribution canvases,
    weights, training images/s and peak MB of a step, one line per model (Otsu's threshold: no training)."""
    shown = any(r["dataset"] != EXPERIMENTS["segmentation"][0] for r in rows)  # a data column for other data sets
    head = ["model", *(["data"] if shown else []), "weights", "epochs", "steps", "test Dice", "test IoU", "OOD Dice",
            "OOD IoU", "train images/s", "peak MB"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def cell(r: dict[str, Any], key: str) -> str:
        return f"{r[key]:.4f}" if key in r else "-"

    for r in rows:
        title = model_title(r["model"]) or "Otsu threshold (no training)"  # NAME:ROUTING with its routing
        lines.append("| " + " | ".join([
            title, *([dataset_stem(r["dataset"])] if shown else []), f"{r['weights']:,}", str(r.get("epochs", "-")),
            f"{r['step']:,}" if "step" in r else "-",
            cell(r, "test_dice"), cell(r, "test_iou"), cell(r, "ood_dice"), cell(r, "ood_iou"),
            f"{r['train_images_per_s']:.1f}" if "train_images_per_s" in r else "-",
            f"{r['peak_mem_mb']:.0f}" if r.get("peak_mem_mb") is not None else "-"]) + " |")
    return "\n".join(lines)


# how many test label maps the synthesis table's generation speed is timed on (after an untimed call on 64)
GENERATION_SPEED_IMAGES = 256


MEASURED = "measured.json"  # in a run's folder: its row's memory or speed, measured once with what it depends on


def _measured_once(run: Run, what: str, identity: dict[str, Any], measure: Callable[[], float]) -> float:
    """A figure of ``run``'s row (a training step's peak memory, the generator's images/s), measured the first time
    the row is made and kept in RUN/measured.json with ``identity`` (the device, batch, autocast, compilation it was
    measured under): a read-back of a finished run takes it from there (each measured it again, silently: 12 s a
    SegCaps row, minutes at full size, and a speed that moved between two read-backs of one table)."""
    path = run.run_dir / MEASURED
    try:
        kept = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):  # unreadable: measured again, and written whole
        kept = {}
    kept = kept if isinstance(kept, dict) else {}
    entry = kept.get(what)
    if isinstance(entry, dict) and entry.get("identity") == identity and isinstance(entry.get("value"), (int, float)) \
            and not isinstance(entry.get("value"), bool):
        return float(entry["value"])
    value = float(measure())
    kept[what] = {"identity": identity, "value": value}
    atomic_write_text(path, json.dumps(kept, indent=2, sort_keys=True))
    return value


def _generation_speed(run: Run, device: str, data_root: str | os.PathLike | None) -> float:
    """Images/s of the trained generator making ``GENERATION_SPEED_IMAGES`` images from test label maps (noise
    seed 0, eval mode, as ``capsnet.synthesis.generate`` makes them), after one untimed call."""
    import time

    import torch

    from .data.tasks import load_test
    from .evaluate import load_model
    from .synthesis import generate

    model, _ = load_model(run.run_dir, which="last", device=device)
    dev = next(model.parameters()).device
    labels = load_test(run.dataset, size=GENERATION_SPEED_IMAGES, extras=False, root=data_root,
                       progress=False).images.float().to(dev)
    generate(model, labels[:64])

    def sync() -> None:
        if dev.type == "cuda":  # the kernels run asynchronously: wait for them before reading the clock
            torch.cuda.synchronize(dev)

    sync()
    start = time.perf_counter()
    generate(model, labels)
    sync()
    return len(labels) / (time.perf_counter() - start)


def synthetic_probe_rows(runs: Sequence[Run], out: str | os.PathLike, *, epochs: int, device: str = "auto",
                         data_root: str | os.PathLike | None = None, progress: bool = True,
                         say: Callable[[str], None] | None = None,
                         on_epoch: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Train on synthetic, test on real: for each data set of ``runs``, a CapsNet of ``PROBE``'s sizes trained on
    the real training images, and one trained only on the images each run's generator makes (noise seed 0) from
    the label maps of the same training images; each scored on the real test images after its final epoch. A data
    set without classes (the user's pairs:DIR) has no probes.

    The training images are the runs' own (their ``train_size`` subset); every probe takes the same epochs, batch
    size and seed, with the plain task's shift augmentation, the classifier's rate (``TrainConfig.lr``: a ``--lr``
    typed is the generators') and no weight average, and the runs' schedule and warm-up. Each probe is a run directory under
    ``out/probes/DATASET``: ``real``, and ``RUN-Eep`` for the images of the generator of the run in folder RUN (its
    model's name, or NAME-ROUTING-routing for NAME:ROUTING) after its E epochs (a finished one is read back, and then
    neither its images are generated nor the data sets read). ``say(line)``: told which probe starts or is read
    back (its bars alone read as the generator training again); ``on_epoch(record)``: each evaluated epoch's record.
    """
    import functools

    import torch

    from .data.sets import split_size
    from .data.tasks import Split, load_test, load_training
    from .models import CapsNetConfig

    rows = []
    for dataset in dict.fromkeys(r.dataset for r in runs if task(r.dataset).num_classes > 1):  # pairs:DIR: no classes
        first = next(r for r in runs if r.dataset == dataset)
        source = task(dataset).source  # the plain image set: mnist or fashion-mnist
        cfg = replace(first.train_config, dataset=source, epochs=epochs, lr=TrainConfig.lr, eval_every=epochs,
                      ema_decay=0.0)  # a classifier: no generator to average

        @functools.cache
        def data() -> tuple[Split, torch.Tensor, Split]:  # read when a probe is to be trained, once
            pairs, _, _ = load_training(dataset, train_size=cfg.train_size, seed=cfg.seed, test_size=1, root=data_root,
                                        progress=progress)  # the runs' 28x28 training images, in order (test unused)
            labels, _, _ = task(dataset).batch(pairs.to("cpu"), torch.arange(len(pairs)), torch.Generator(), None)
            return pairs, labels, load_test(source, size=cfg.test_size, root=data_root, progress=progress)

        def generated(run: Run, identity: dict[str, Any]) -> torch.Tensor:
            return probe_images(run.run_dir, identity, data()[1], device=device, progress=progress)

        # each generator its own probe (NAME:ROUTING beside NAME), named as its run folder is, with its epochs: a
        # generator trained on (a larger --epochs) makes other images, so its probe from before is not read back
        made = {"real": ("real", lambda: data()[0].images, None, None)}
        for run in (r for r in runs if r.dataset == dataset):
            ckpt = load_checkpoint(run.run_dir, "last")
            identity = _generator_identity(ckpt)
            made[run.label] = (f"{run.run_dir.name}-{ckpt.state.get('epoch')}ep",
                               functools.partial(generated, run, identity), identity, run.run_dir)
        for n, (trained_on, (folder, images, identity, generator_dir)) in enumerate(made.items()):
            probe_dir = Path(out) / "probes" / dataset / folder
            probe = Run("synthesis-probe", "capsnet", source, cfg.seed, CapsNetConfig(**PROBE), cfg, probe_dir)
            _check_probe_generator(probe_dir, identity, generator_dir)
            final = _finished(probe)
            if say is not None:
                what = "the real training images" if trained_on == "real" else f"{trained_on}'s generated images"
                say(f"probe [{n + 1}/{len(made)}] a CapsNet trained on {what} of {dataset}, tested on real ones -> "
                    f"{probe_dir}" + (" (finished: its figures read back)" if final is not None else ""))
            if final is None:
                if identity is not None:  # which generator's images it learns from, checked when it is read back
                    probe_dir.mkdir(parents=True, exist_ok=True)
                    atomic_write_text(probe_dir / PROBE_GENERATOR, json.dumps(identity, indent=2, sort_keys=True))
                pairs, _, test = data()
                final = fit(probe.model_config, cfg, probe_dir, device=device, progress=progress,
                            resume=(probe_dir / "last.safetensors").exists(), distributed=False,
                            data=(Split(images(), pairs.labels, pairs.classes), test), on_epoch=on_epoch)
                if stop_requested():  # asked after its final evaluation: finished and saved; the next does not start
                    raise KeyboardInterrupt
            rows.append({"experiment": "synthesis-probe", "dataset": dataset, "trained_on": trained_on,
                         "train_size": cfg.train_size or split_size(source, "train"), "epochs": epochs,
                         "test_accuracy": final["test_accuracy"], "run_dir": str(probe_dir)})
    return rows


PROBE_GENERATOR = "generator.json"  # in a train-on-synthetic probe's folder: the generator whose images it learns


def probe_images(run_dir: Path, identity: dict[str, Any], labels: torch.Tensor, *, device: str = "auto",
                 progress: bool = False) -> torch.Tensor:
    """The images the generator of ``run_dir`` (its last.safetensors) makes from ``labels`` for a train-on-synthetic
    probe, cropped to 28x28 (N, 1, 28, 28): the generator ``identity`` names (``_generator_identity``), the one the
    probe's folder is named after, read minutes earlier; a run trained on since (its file replaced) is a
    CheckpointError, not a probe of another generator's images under its name."""
    from .data.tasks import SYNTHESIS_SIDE
    from .evaluate import load_model
    from .synthesis import generate

    model, ckpt = load_model(run_dir, which="last", device=device)
    if _generator_identity(ckpt) != identity:
        raise CheckpointError(f"{run_dir} was trained on while this experiment ran: its last.safetensors is no longer "
                              f"the generator its probe is named after; run the experiment again once that training "
                              f"has ended")
    fake = generate(model, labels.to(next(model.parameters()).device), progress=progress).cpu()
    crop = slice((SYNTHESIS_SIDE - 28) // 2, (SYNTHESIS_SIDE + 28) // 2)
    return fake[..., crop, crop]


def _generator_identity(ckpt) -> dict[str, Any]:
    """What makes a generator's images for a probe: its settings and epochs (a run directory removed and trained
    again with other settings keeps its folder name, and so its probe's)."""
    return {"epoch": ckpt.state.get("epoch"), "model_config": ckpt.model_config, "train_config": ckpt.train_config}


def _check_probe_generator(probe_dir: Path, identity: dict[str, Any] | None, generator_dir: Path | None) -> None:
    """A CheckpointError if ``probe_dir`` learnt from the images of another generator than ``identity``'s, the one
    now in ``generator_dir`` (its run trained again since with other settings); a probe from before this record (no
    file) is taken as it is."""
    saved = probe_dir / PROBE_GENERATOR
    if identity is None or not saved.is_file():
        return
    if read_json_object(saved, f"remove {probe_dir} to train its probe again") != json.loads(json.dumps(identity)):
        raise CheckpointError(f"{probe_dir} holds a probe trained on the images of another generator than the one "
                              f"now in {generator_dir} (trained again since, with other settings): remove "
                              f"{probe_dir} to train its probe again, or choose another --out")


def format_synthesis_table(rows: Sequence[dict[str, Any]]) -> str:
    """The synthesis experiment's tables: per data set and model, the final-epoch held-out scores, weights and
    speeds; then the train-on-synthetic probes' real test accuracy."""
    head = ["data", "model", "generator weights", "weights", "epochs", "L1", "SSIM", "shape IoU", "noise spread",
            "judge accuracy", "L1, 8 draws", "SSIM, 8 draws", "judge accuracy, 8 draws (sd)", "train images/s",
            "generate images/s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def cell(r: dict[str, Any], key: str, fmt: str = ".4f") -> str:
        return format(r[key], fmt) if key in r else "-"

    for r in (r for r in rows if r["experiment"] == "synthesis"):
        lines.append("| " + " | ".join([
            dataset_stem(r["dataset"]), model_title(r["model"]), f"{r['generator_weights']:,}", f"{r['weights']:,}",
            str(r["epochs"]), cell(r, "test_l1"), cell(r, "test_ssim"), cell(r, "test_iou"), cell(r, "test_spread"),
            cell(r, "test_judge_accuracy", ".2%"), cell(r, "test_l1_draws"), cell(r, "test_ssim_draws"),
            f"{cell(r, 'test_judge_accuracy_draws', '.2%')} ({cell(r, 'test_judge_accuracy_draws_sd', '.2%')})"
            if "test_judge_accuracy_draws" in r else "-",
            cell(r, "train_images_per_s", ".1f"), cell(r, "generate_images_per_s", ".1f")]) + " |")
    probes = [r for r in rows if r["experiment"] == "synthesis-probe"]
    if probes:
        lines += ["", "| data | classifier trained on | training images | epochs | real test accuracy |",
                  "|---|---|---|---|---|"]
        for r in probes:
            what = "the real images" if r["trained_on"] == "real" else f"{model_title(r['trained_on'])}'s images"
            lines.append(f"| {dataset_stem(r['dataset'])} | {what} | {r['train_size']:,} | {r['epochs']} | "
                         f"{r['test_accuracy']:.2%} |")
    return "\n".join(lines)


def format_routing_table(rows: Sequence[dict[str, Any]]) -> str:
    """The routing experiment's table: per model and data set, weights, epochs and optimizer steps, the final-epoch
    test error over the seeds (mean, and the spread min-max), training images/s (final epoch, mean) and peak MB of
    a step."""
    head = ["model", "algorithm", "data", "weights", "epochs", "steps", "seeds", "test error, mean (min-max)",
            "train images/s", "peak MB"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["dataset"]), []).append(r)
    for (model, dataset), rs in groups.items():
        errors = [100 * r["test_error"] for r in rs]
        speed = [r["train_images_per_s"] for r in rs if "train_images_per_s" in r]
        steps = sorted({r["step"] for r in rs if "step" in r})
        cells = [model, model_title(model), dataset_stem(dataset), f"{rs[0]['weights']:,}",
                 "/".join(sorted({str(r["epochs"]) for r in rs if "epochs" in r}, key=int)) or "-",
                 "/".join(f"{n:,}" for n in steps) or "-", str(len(rs)),
                 f"{sum(errors) / len(errors):.2f}% ({min(errors):.2f}-{max(errors):.2f})",
                 f"{sum(speed) / len(speed):.0f}" if speed else "-",
                 f"{rs[0]['peak_mem_mb']:.0f}" if rs[0].get("peak_mem_mb") is not None else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def check_results_folder(out: str | os.PathLike, name: str) -> None:
    """A ValueError when ``out`` holds another experiment's results.json (its table would be replaced by this one's,
    without a word, beside its run folders); none, this experiment's own (a rerun) or one that does not read is
    fine."""
    try:
        rows = json.loads((Path(out) / "results.json").read_text(encoding="utf-8"))["rows"]
        other = rows[0]["experiment"]
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return
    if isinstance(other, str) and other != name:
        raise ValueError(f"--out {out} holds the {other} experiment's results (results.json, results.md), which this "
                         f"{name} experiment would replace; give it another --out")


def write_results(rows: Sequence[dict[str, Any]], out: str | os.PathLike, command: str, *,
                  unfinished: str | None = None) -> Path:
    """results.json (the rows and the command) and results.md (the table) in ``out``. ``unfinished``: what the
    experiment has still to do ("1 of 2 runs finished"), said in both files (``unfinished``), as a stopped
    experiment leaves them (they read as the whole experiment's: a review, 2026-12-02); None once done."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    kind = rows[0]["experiment"] if rows else ""
    table = (format_routing_table(rows) if kind == "routing" else format_segmentation_table(rows)
             if kind == "segmentation" else format_synthesis_table(rows) if kind == "synthesis" else format_table(rows))
    record: dict[str, Any] = {"command": command, "rows": list(rows)}
    note = ""
    if unfinished:
        record["unfinished"] = unfinished
        note = (f"\n**Unfinished**: {unfinished}; the command above, run again, does the rest (finished runs are "
                f"read back).\n")
    atomic_write_text(out / "results.json", json.dumps(record, indent=1) + "\n")
    atomic_write_text(out / "results.md", f"`{command}`\n\n{table}\n{note}")
    return out / "results.md"


def plot_less_data(rows: Sequence[dict[str, Any]]):
    """Test error against training-set size, one line per model (log-log), as a matplotlib Figure."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.0, 3.6), layout="constrained")
    ax = fig.subplots()
    for model in dict.fromkeys(r["model"] for r in rows):
        pts = sorted((r["train_size"], 100 * r["test_error"]) for r in rows if r["model"] == model)
        ax.plot(*zip(*pts), marker="o", label=model_title(model) or model)  # capsnet:em: its title and routing
    from matplotlib.ticker import FuncFormatter

    ax.set_xscale("log")
    errors = [100 * r["test_error"] for r in rows]
    if min(errors, default=1) > 0:
        ax.set_yscale("log")
    else:  # an error of 0 (a small --test-size) has no place on a log axis: its model's line was left out
        ax.set_yscale("symlog", linthresh=min([e for e in errors if e > 0], default=1.0), linscale=0.5)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}%"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}%" if f"{v:g}"[0] in "2345" else ""))
    ax.set_xlabel("training examples (nested subsets of MNIST)")
    ax.set_ylabel("MNIST test error, final epoch")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return fig
