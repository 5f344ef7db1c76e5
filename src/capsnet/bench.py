"""Training and inference throughput and peak memory of the MNIST CapsNet.

``run_benchmark`` times capsnet's ``CapsNet`` and, in the same process and
interleaved repeat by repeat, the tutorials' literal implementation kept in
``benchmarks/tutorial_baseline.py`` (weight tiled per batch with
``torch.cat([W] * B)``, inputs stacked per class, routing logits shared by the
batch). That file is not part of the installed package, so it is loaded by
path; without it the baseline rows are left out and the capsnet rows say so.

What is measured:

- a training step is ``zero_grad`` + forward (decoder masked by the labels) +
  margin loss + reconstruction loss + backward + ``Adam.step``; an inference
  step is a forward under ``torch.inference_mode`` (decoder masked by the
  longest capsule). Images are seeded uniform noise in [0, 1] with seeded
  labels: the work per step does not depend on the pixel values.
- ``images_per_s`` is ``batch / step time``: the median over ``repeats`` timings
  after ``warmup`` untimed ones, with min, max and standard deviation. A timing
  runs ``steps_per_timing`` steps back to back between two synchronisations
  and takes their mean: 1 on a CPU, where a step ends when its last operation
  does; 10 on CUDA, where the host queues a step while the GPU runs the one
  before, as in a training loop, so the figure is training throughput rather
  than one step's latency (``--steps-per-timing 1`` measures the latter). No
  step waits for the GPU in its middle: the labels are range-checked on the
  CPU only.
- ``ratio`` is capsnet's throughput over the baseline's, the median of the
  ratios of steps timed back to back (the order alternates every repeat), so
  load from other processes hits both sides alike.
- ``floor`` rows time the two convolutions alone (conv1 + ReLU + primary
  capsules, the same weights, forward and backward of a trivial loss, Adam on
  their weights): no CapsNet can train faster. ``floor_ratio`` on capsnet rows
  is capsnet's throughput over the floor's, paired like ``ratio``.
- ``routing_share`` on capsnet rows: the digit capsule layer alone (votes and
  the routing rounds; forward and backward when training) on the same batch,
  timed right after each capsnet step, over that step's time; the median.
- ``peak_mem_mb`` is the largest amount of tensor memory held during one extra,
  untimed step: parameters, optimizer state and the batch held before it, plus
  the peak of what the step allocates. On CUDA that is
  ``torch.cuda.max_memory_allocated`` (with ``compile="reduce-overhead"``, the
  larger of that and its peak over the warm-up steps, which record the CUDA
  graphs and take their memory: a replay allocates nothing); on CPU the allocations come from the
  torch profiler's memory events (``profile_memory=True``), so it counts what
  goes through torch's CPU allocator and not the interpreter, the allocator's
  cached pages or the libraries' own scratch buffers: tensor memory, not RSS.

The scripts under benchmarks/ share the rest: ``alternate`` (steps timed in
turn, so load hits every side alike), ``spread`` and ``show_spread`` (a
paired ratio's median, min and max), ``markdown_table``, and ``publish``
(the environment line, the tables, and the JSON record with its command).
"""
from __future__ import annotations

import contextlib
import datetime
import importlib.util
import json
import logging
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Hashable, Iterable, Mapping, Sequence, TypeVar

import torch
from torch import nn

from ._config import json_value
from ._numbers import is_count
from .models.capsnet import CapsNet, CapsNetConfig, capsnet_loss
from .runtime import autocast, compile_model, fuses_adam, keeps_rng, parse_device, resolve_device

__all__ = ["BASELINE_FILE", "default_baseline_path", "load_baseline", "environment", "run_benchmark", "run_grid",
           "measure_training", "format_table", "write_record", "alternate", "model_variant", "amp_of"]

log = logging.getLogger(__name__)

BASELINE_FILE = Path("benchmarks") / "tutorial_baseline.py"
CAPSNET, BASELINE, FLOOR = "capsnet", "tutorial baseline", "conv floor"
MODES = ("train", "infer")
DTYPES = ("fp32", "bf16", "fp16")  # fp16: float16 autocast, as --amp fp16 but without its gradient scaler


def amp_of(dtype: str) -> str:
    """The ``runtime.AMP_MODES`` setting (``capsnet train --amp``) of a benchmark dtype: fp32 is "none"."""
    return "none" if dtype == "fp32" else dtype


def default_baseline_path() -> Path | None:
    """``benchmarks/tutorial_baseline.py`` of the source checkout (editable install) or the working directory."""
    for root in (Path(__file__).resolve().parents[2], Path.cwd()):
        path = root / BASELINE_FILE
        if path.is_file():
            return path
    return None


def load_baseline(path: str | os.PathLike[str]) -> ModuleType:
    """Import the baseline file by path (it lives outside the package); a file that is not Python, or that has no
    ``TutorialCapsNet``, is a ValueError naming it (not a traceback)."""
    fix = "give benchmarks/tutorial_baseline.py of a capsnet source checkout, or '' to leave the baseline out"
    if Path(path).suffix != ".py":
        raise ValueError(f"tutorial baseline {path} is not a Python file (.py); {fix}")
    spec = importlib.util.spec_from_file_location("capsnet_tutorial_baseline", path)
    if spec is None or spec.loader is None:
        raise ValueError(f"cannot import the tutorial baseline from {path}; {fix}")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # the file's own error, whatever it is
        raise ValueError(f"tutorial baseline {path} failed to import ({type(e).__name__}: {e}); {fix}") from None
    if not hasattr(module, "TutorialCapsNet"):
        raise ValueError(f"tutorial baseline {path} defines no TutorialCapsNet; {fix}")
    return module


def _git(*args: str) -> str | None:
    """git's answer about capsnet's own checkout; None where capsnet is installed, not checked out (a wheel inside a
    user's own repository answered with that repository's commit)."""
    here = Path(__file__).resolve().parent
    try:  # bytes, decoded as the file system's names are: a checkout under /home/José in a C locale is UTF-8 bytes
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=here, capture_output=True, timeout=10)
        if top.returncode != 0 or Path(os.fsdecode(top.stdout.strip())).resolve() != here.parents[1]:  # a clone's
            return None  # src/capsnet
        done = subprocess.run(["git", *args], cwd=here, capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.decode("utf-8", "replace").strip() if done.returncode == 0 else None


def environment() -> dict[str, Any]:
    """What a benchmark result depends on: versions, devices, threads, commit, date."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    from . import __version__ as capsnet_version

    commit = _git("rev-parse", "--short", "HEAD")
    status = _git("status", "--porcelain") if commit else None
    cuda = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "capsnet": capsnet_version,
        "git_commit": commit,
        "git_dirty": bool(status) if status is not None else None,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda_devices": cuda,
    }


def write_record(path: str | os.PathLike[str], command: str, env: dict[str, Any], rows: Sequence[dict[str, Any]],
                 unfinished: str | None = None) -> None:
    """Record a benchmark as JSON: the command that ran it, its environment and its rows, written atomically;
    ``unfinished`` (a record of the rows finished so far, of a run still going or cut short) says so under that
    key."""
    from .checkpoint import atomic_write_text

    record = {"command": command, "environment": env, "rows": list(rows)} | (
        {"unfinished": unfinished} if unfinished else {})
    atomic_write_text(Path(path), json.dumps(record, indent=1) + "\n")


def model_variant(text: str, names: Sequence[str]) -> tuple[str, dict[str, Any]]:
    """A benchmark's model as typed, ``NAME[:FIELD=VALUE...]``: one of ``names`` and config fields, each VALUE as
    JSON, else a string (``json_value``), e.g. ``segcaps:routing=self-attention``; a colon inside a JSON value stays
    in it. A ValueError names what is wrong; the fields themselves are checked by the model's config."""
    name, *fields = re.split(r":(?=[A-Za-z_]\w*=)", text)
    if name not in names:
        raise ValueError(f"{name!r} is not one of {', '.join(names)}")
    return name, {key: json_value(value) for key, _, value in (item.partition("=") for item in fields)}


def spread(values: Sequence[float], key: str = "ratio", prefix: str | None = None) -> dict[str, float]:
    """A paired benchmark's repeats as row fields: ``{key: median, prefix_min: min, prefix_max: max}`` (``prefix``
    defaults to ``key``)."""
    if not values:
        raise ValueError(f"{key}: no values to summarise; run at least one repeat")
    prefix = key if prefix is None else prefix
    return {key: statistics.median(values), f"{prefix}_min": min(values), f"{prefix}_max": max(values)}


def show_spread(row: Mapping[str, Any], key: str = "ratio", prefix: str | None = None, fmt: str = ".2f") -> str:
    """``spread``'s fields of ``row`` as a table cell: ``median (min-max)``."""
    prefix = key if prefix is None else prefix
    return f"{row[key]:{fmt}} ({row[f'{prefix}_min']:{fmt}}-{row[f'{prefix}_max']:{fmt}})"


def markdown_table(header: Sequence[str], cells: Iterable[Sequence[Any]], align: str | None = None) -> str:
    """A Markdown table: one header row, then a row per sequence of cells; ``align`` has one letter a column, ``l``
    for left and ``r`` for right (default: the first column left, the rest right)."""
    align = align or "l" + "r" * (len(header) - 1)
    if len(align) != len(header) or set(align) - {"l", "r"}:
        raise ValueError(f"align {align!r}: give one of 'l' or 'r' for each of the {len(header)} columns")
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" if a == "l" else "---:" for a in align) + " |"]
    for row in cells:
        row = list(row)
        if len(row) != len(header):
            raise ValueError(f"a row of {len(row)} cells under {len(header)} columns: {row}")
        lines.append("| " + " | ".join(str(c) for c in row) + " |")
    return "\n".join(lines)


def publish(script: str, rows: Sequence[dict[str, Any]], text: str, json_path: str | os.PathLike[str] | None) -> None:
    """A benchmark script's ending: print the environment line and ``text`` (its tables) on stdout, then, given a
    path, record the rows there with the command that made them (``python <script> <this process's arguments>``)."""
    env = environment()
    print(" ".join(f"{k}={v}" for k, v in env.items()))
    print(text)
    if json_path:
        write_record(json_path, shlex.join(["python", script, *sys.argv[1:]]), env, rows)
        print(f"wrote {json_path}", file=sys.stderr)


# --- steps -------------------------------------------------------------------------


def _time_routing(model: CapsNet, images: torch.Tensor, mode: str, steps: int = 1) -> float:
    """Seconds of the digit capsule layer alone (votes and routing; forward, and backward when training): ``steps``
    passes back to back between two synchronisations, their mean, as ``_Runner.time_step`` times whole steps."""
    with torch.no_grad():
        u = model.primary_capsules(images)
    sync = torch.cuda.synchronize if images.device.type == "cuda" else (lambda: None)
    if mode == "train":
        u.requires_grad_(True)
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        if mode == "train":
            model.digits(u).poses.sum().backward()
        else:
            with torch.inference_mode():
                model.digits(u)
    sync()
    elapsed = time.perf_counter() - start
    model.zero_grad(set_to_none=True)
    return elapsed / steps


class ConvFloor(nn.Module):
    """The two convolutions of a CapsNet alone (conv1, ReLU, primary capsules): the floor of any CapsNet's step."""

    def __init__(self, capsnet: CapsNet) -> None:
        super().__init__()
        import copy

        self.conv1, self.primary = copy.deepcopy(capsnet.conv1), copy.deepcopy(capsnet.primary)
        self._pads = capsnet._pads  # SAME padding's, or None: what primary_capsules reads besides the two layers

    conv1_maps = CapsNet.conv1_maps  # what primary_capsules calls for conv1: the CapsNet's own, on these copies

    def forward(self, images: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        return CapsNet.primary_capsules(self, images)  # (B, I, D): the CapsNet's own prefix, on these copies


def default_steps_per_timing(device: torch.device, given: int | None = None) -> int:
    """Steps in one timing: ``given``, else 10 on CUDA (queued back to back: throughput) and 1 elsewhere."""
    return given if given is not None else (10 if device.type == "cuda" else 1)


def _train_step(model: nn.Module, opt: torch.optim.Optimizer, images: torch.Tensor, labels: torch.Tensor,
                loss_fn: Callable[..., Any] | None = None) -> None:
    if isinstance(model, ConvFloor):
        loss = model(images).pow(2).mean()  # a loss that costs next to nothing
    else:  # a registered model's own loss, else capsnet train's (the CapsNet's and the tutorial baseline's): margin
        # and reconstruction, its labels range-checked on the CPU only (on a GPU it would wait in every step)
        loss = (loss_fn or capsnet_loss)(model, images, labels, recon_weight=0.0005)[0]
    loss.backward()
    opt.step()


def _infer_step(model: nn.Module, images: torch.Tensor) -> None:
    with torch.inference_mode():
        model(images)


class _Runner:
    """One implementation in one mode: a step to time and its memory peak."""

    def __init__(self, model: nn.Module, mode: str, images: torch.Tensor, labels: torch.Tensor, lr: float,
                 bf16: bool = False, fused: bool = False, compile: bool | str = False,
                 loss_fn: Callable[..., Any] | None = None, steps: int = 1, fp16: bool = False) -> None:
        if not is_count(steps):
            raise ValueError(f"steps per timing must be a positive integer, got {steps!r}")
        if bf16 and fp16:
            raise ValueError("bf16 and fp16 are two autocasts: give one")
        self.model, self.mode, self.images, self.labels = model, mode, images, labels
        # autocast as --amp bf16 or fp16 (fp16 without its gradient scaler's multiply and check)
        self.amp = "bf16" if bf16 else "fp16" if fp16 else "none"
        self.loss_fn, self.steps = loss_fn, steps
        self.call = compile_model(model, compile)  # the model itself unless compiled; same parameters
        self.device = images.device
        self.opt = torch.optim.Adam(model.parameters(), lr=lr, fused=fused or None) if mode == "train" else None
        model.train(mode == "train")
        self.compile = compile
        self.recording_peak = 0  # bytes: a CUDA graph's peak, taken while it is recorded (warm_up)

    def warm_up(self, steps: int) -> None:
        """``steps`` untimed steps. Compiled with CUDA graphs (``reduce-overhead`` on a GPU), the graph's memory is
        taken while it is recorded, here, and a replay takes none: the peak of these steps, counted from this
        runner's resting tensors (the card's counters count every runner's), is kept for ``peak_bytes``."""
        graphs = self.device.type == "cuda" and self.compile == "reduce-overhead"
        if graphs:
            self._sync()
            torch.cuda.reset_peak_memory_stats(self.device)
            before = torch.cuda.memory_allocated(self.device) - self.resting_bytes()
        for _ in range(steps):
            self.time_step()
        if graphs:
            self.recording_peak = torch.cuda.max_memory_allocated(self.device) - before

    def _prepare(self) -> None:
        if self.opt is not None:  # before the first step of a timing outside the timed region, within it after
            self.opt.zero_grad(set_to_none=True)

    def _run(self) -> None:
        with autocast(self.device, self.amp):
            if self.opt is not None:
                _train_step(self.call, self.opt, self.images, self.labels, self.loss_fn)
            else:
                _infer_step(self.call, self.images)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def time_step(self) -> float:
        """Seconds per step: ``steps`` steps back to back between two synchronisations, over ``steps``.

        With one step the time is a step's latency: on a GPU the host waits for it to finish before the next is
        launched. With several, the host queues each step while the GPU runs the one before, as a training loop
        does, so their mean is the training throughput's step time (on a CPU the two are the same).
        """
        self._prepare()
        self._sync()
        start = time.perf_counter()
        for i in range(self.steps):
            if i:
                self._prepare()
            self._run()
        self._sync()
        return (time.perf_counter() - start) / self.steps

    def resting_bytes(self) -> int:
        """Bytes of the tensors held between steps: parameters, buffers, optimizer state, batch."""
        tensors = [*self.model.parameters(), *self.model.buffers(), self.images, self.labels]
        if self.opt is not None:
            tensors += [v for state in self.opt.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
        return sum(storages.values())

    def peak_bytes(self) -> int:
        """Peak tensor memory of one step, resting tensors included (see the module docstring); with CUDA graphs,
        at least the peak of their recording (``warm_up``)."""
        self._prepare()
        if self.device.type == "cuda":  # the card's counters count every tensor on it: other runners' too
            self._sync()
            torch.cuda.reset_peak_memory_stats(self.device)
            before = torch.cuda.memory_allocated(self.device)
            self._run()
            self._sync()
            return max(torch.cuda.max_memory_allocated(self.device) - before + self.resting_bytes(),
                       self.recording_peak)
        set_here = "KINETO_LOG_LEVEL" not in os.environ  # above USDT (5): the profiler's start/stop lines are noise;
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # the caller's environment as it was after
        try:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
                self._run()
        finally:
            if set_here:
                os.environ.pop("KINETO_LOG_LEVEL", None)
        events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU]
        events.sort(key=lambda e: e.start_ns())
        live = peak = 0
        for e in events:
            live += e.nbytes()  # negative for frees
            peak = max(peak, live)
        return self.resting_bytes() + peak


K = TypeVar("K", bound=Hashable)


COMPILED_WARMUP = 3  # untimed steps of a compiled runner: CUDA graphs record in the first calls, not the first alone


def alternate(steps: Mapping[K, Callable[[], float]], repeats: int, *, warmup: int = 1) -> dict[K, list[float]]:
    """Paired timing: each step ``warmup`` times untimed, then all of them ``repeats`` times, taking turns to go first.

    ``steps`` maps a name to a callable that runs one step and returns its
    seconds (``_Runner.time_step`` is one). In repeat ``r`` the order is the
    names rotated by ``r``, so each goes first equally often and load from
    other processes hits all of them alike; the i-th times of two names were
    taken back to back and their ratio is a paired measurement. Returns each
    name's ``repeats`` times in order.
    """
    if not is_count(repeats):
        raise ValueError(f"repeats must be a positive integer, got {repeats!r}")
    if not is_count(warmup, 0):
        raise ValueError(f"warmup must be a non-negative integer, got {warmup!r}")
    if not steps:
        raise ValueError("alternate needs at least one step to time")
    order = list(steps)
    for name in order:
        for _ in range(warmup):
            steps[name]()
    times: dict[K, list[float]] = {name: [] for name in order}
    for r in range(repeats):
        k = r % len(order)
        for name in order[k:] + order[:k]:
            times[name].append(steps[name]())
    return times


def measure_training(name: str, config: Any, *, batch_size: int = 128, repeats: int = 3, device: str = "cpu",
                     seed: int = 0, bf16: bool = False, compile: bool | str = False,
                     fp16: bool = False) -> dict[str, float]:
    """Training images/s (median of ``repeats`` steps after one untimed) and peak tensor memory (MB) of one step
    of the registered model ``name`` with ``config``, trained by its own loss on seeded noise images (``bf16``,
    ``fp16``: under bfloat16 or float16 autocast; ``compile``: compiled, as ``capsnet.train.compile_model``)."""
    with keeps_rng(device):  # the caller's random stream after, not the benchmark's seed
        return _measure_training(name, config, batch_size=batch_size, repeats=repeats, device=device, seed=seed,
                                 bf16=bf16, fp16=fp16, compile=compile)


def _measure_training(name: str, config: Any, *, batch_size: int, repeats: int, device: str, seed: int, bf16: bool,
                      fp16: bool, compile: bool | str) -> dict[str, float]:
    from .models import model_spec

    spec = model_spec(name)
    torch.manual_seed(seed)
    model = spec.build(config).to(device)
    gen = torch.Generator().manual_seed(seed)
    images = torch.rand(batch_size, config.in_channels, config.input_height, config.input_width, generator=gen)
    if spec.kind == "segmentation":  # masks (B, 1, H, W), about a fifth foreground
        labels = (torch.rand(batch_size, 1, config.input_height, config.input_width, generator=gen) > 0.8).to(torch.uint8)
    else:
        labels = torch.randint(0, config.num_classes, (batch_size,), generator=gen)
    runner = _Runner(model, "train", images.to(device), labels.to(device), 1e-3, loss_fn=spec.loss, bf16=bf16,
                     fp16=fp16, compile=compile)
    runner.warm_up(COMPILED_WARMUP if compile else 1)  # CUDA graphs record in the first calls (their peak kept)
    times = alternate({name: runner.time_step}, repeats, warmup=0)[name]
    return {"images_per_s": batch_size / statistics.median(times), "peak_mem_mb": runner.peak_bytes() / 2**20}


# --- the benchmark -----------------------------------------------------------------


def _summary(throughputs: list[float]) -> dict[str, float]:
    return {
        "images_per_s": statistics.median(throughputs),
        "images_per_s_min": min(throughputs),
        "images_per_s_max": max(throughputs),
        "images_per_s_std": statistics.stdev(throughputs) if len(throughputs) > 1 else 0.0,
    }


def run_benchmark(
    *,
    devices: Sequence[str] | None = None,
    batch_size: int = 128,
    repeats: int = 5,
    warmup: int | None = None,
    modes: Sequence[str] = MODES,
    baseline_path: str | os.PathLike[str] | None = None,
    baseline_share_logits: bool = True,
    seed: int = 0,
    config: CapsNetConfig = CapsNetConfig(),
    lr: float = 1e-3,
    memory: bool = True,
    floor: bool = True,
    dtype: str = "fp32",
    compile: bool | str = False,
    steps_per_timing: int | None = None,
) -> list[dict[str, Any]]:
    """Throughput and peak memory of capsnet's CapsNet and the tutorial baseline.

    Args:
        devices: e.g. ``("cpu", "cuda")``; None: the CPU and, when present, CUDA.
        batch_size, repeats, warmup: images per step, timings (each of ``steps_per_timing`` steps), untimed
            timings first (None: 1, or 2 when compiling, so compilation and any recompile are not timed).
        modes: any of ``"train"`` and ``"infer"``.
        baseline_path: the tutorial baseline file; None looks for
            ``benchmarks/tutorial_baseline.py`` beside the source or in the working
            directory; ``""`` leaves the baseline out. Not found or left out: no
            baseline rows, and a ``note`` on the capsnet rows.
        baseline_share_logits: the tutorials' routing logits shared by the batch
            (True, literal) or kept per example (False, the same maths as capsnet).
        seed: seeds the weights (the baseline copies capsnet's), images and labels.
        config: the model's sizes; the default is the paper's MNIST CapsNet.
        lr: Adam's learning rate.
        memory: also run one untimed, instrumented step per row for ``peak_mem_mb``.
        floor: also time the two convolutions alone (``ConvFloor``) for ``floor_ratio``.
        dtype: ``"fp32"``, or ``"bf16"`` / ``"fp16"`` for every step under ``torch.autocast`` to
            bfloat16 / float16 (weights and optimizer stay fp32; fp16 without ``--amp fp16``'s gradient scaler,
            whose multiply and check per step are not timed), for all implementations alike.
        compile: compile capsnet's model as ``capsnet train --compile`` does
            (``capsnet.train.compile_model``: True, an Inductor mode or a backend
            name); the baseline and the floor stay eager. Each row set starts from
            a fresh ``torch._dynamo.reset()``; ``routing_share`` is None then (the
            layer alone would run eagerly, not as part of the compiled step).
        steps_per_timing: steps run back to back in each timing, their mean time the step time (None: 1 on a
            CPU, 10 on CUDA; see the module docstring). The layer of ``routing_share`` is timed the same way.

    capsnet's Adam, and the conv floor's, are fused where ``capsnet train`` fuses it (``runtime.fuses_adam``: CUDA,
    and the CPU from torch 2.4; each row's ``fused_adam`` says); the baseline's is not.

    Returns:
        one dict per (device, mode, implementation): impl, device, mode, batch, repeats,
        warmup, seed, images_per_s (median), images_per_s_min/max/std, step_s (median),
        peak_mem_mb (None when memory=False), ratio (capsnet / baseline throughput,
        median of paired repeats; 1.0 on baseline rows, None without a baseline),
        ratio_min, ratio_max, floor_ratio (capsnet / conv floor throughput, paired;
        None on other rows or without the floor), routing_share (time of the digit
        capsule layer alone over capsnet's step, timed right after it; capsnet rows),
        note.
    """
    if warmup is None:
        warmup = 2 if compile else 1
    if repeats < 1 or warmup < 0 or batch_size < 1:
        raise ValueError(f"need repeats >= 1, warmup >= 0, batch_size >= 1; got {repeats}, {warmup}, {batch_size}")
    if steps_per_timing is not None and not is_count(steps_per_timing):
        raise ValueError(f"steps_per_timing must be a positive integer or None, got {steps_per_timing!r}")
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        raise ValueError(f"unknown modes {unknown}; valid modes are {list(MODES)}")
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; valid dtypes are {list(DTYPES)}")
    devices = bench_devices(devices)

    note = None
    baseline_module = None
    if baseline_path == "":
        note = "tutorial baseline left out: no baseline rows or ratios"
    else:
        path = Path(baseline_path) if baseline_path is not None else default_baseline_path()
        _check_baseline_path(baseline_path)
        if path is not None and path.is_file():
            baseline_module = load_baseline(path)
        else:
            note = f"tutorial baseline not found at {path or BASELINE_FILE}: baseline rows and ratios left out"
            log.warning(note)

    rows: list[dict[str, Any]] = []
    with contextlib.ExitStack() as kept:  # the caller's random stream after, not the benchmark's seed
        for device_name in devices:
            kept.enter_context(keeps_rng(device_name))
            device = torch.device(device_name)
            torch.manual_seed(seed)
            model = CapsNet(config).to(device)
            models: dict[str, nn.Module] = {CAPSNET: model}
            if baseline_module is not None:
                models[BASELINE] = baseline_module.TutorialCapsNet.from_capsnet(model, share_logits=baseline_share_logits)
            if floor:
                models[FLOOR] = ConvFloor(model).to(device)
            gen = torch.Generator().manual_seed(seed)
            images = torch.rand(batch_size, config.in_channels, config.input_height, config.input_width, generator=gen).to(device)
            labels = torch.randint(0, config.num_classes, (batch_size,), generator=gen).to(device)

            for mode in modes:
                # capsnet runs as capsnet train runs it: Adam fused where train fuses it (CUDA; the CPU from torch 2.4),
                # compiled when asked; the floor takes the same Adam (a bound on capsnet's step must not pay a slower
                # optimizer: with capsnet's alone fused, a review saw capsnet at 95% of the floor, 80% with both
                # unfused); the baseline stays as written.
                if compile:
                    torch._dynamo.reset()  # a fresh graph per row set: no recompile limit reached, no dynamic shapes
                per_timing = default_steps_per_timing(device, steps_per_timing)
                runners = {impl: _Runner(m, mode, images, labels, lr, bf16=dtype == "bf16", fp16=dtype == "fp16",
                                         steps=per_timing,
                                         fused=impl in (CAPSNET, FLOOR) and fuses_adam(device.type),
                                         compile=compile if impl == CAPSNET else False)
                           for impl, m in models.items()}
                for runner in runners.values():  # a CUDA graph's memory is taken while it is recorded, here
                    runner.warm_up(warmup)
                routing_times: list[float] = []

                def capsnet_step(runner: _Runner = runners[CAPSNET]) -> float:
                    seconds = runner.time_step()
                    if not compile:  # the layer alone runs eagerly: no share of a compiled step
                        with autocast(device, amp_of(dtype)):
                            routing_times.append(_time_routing(model, images, mode, runner.steps))
                    return seconds

                # warmed up above, not by alternate: capsnet_step's routing times must pair with timed steps only
                times = alternate({impl: capsnet_step if impl == CAPSNET else runner.time_step
                                   for impl, runner in runners.items()}, repeats, warmup=0)
                log.info("%s %s, %d repeats: %s", device_name, mode, repeats,
                         ", ".join(f"{k} median {statistics.median(v):.3f} s" for k, v in times.items()))
                paired = ([b / c for c, b in zip(times[CAPSNET], times[BASELINE])] if BASELINE in times else [])
                to_floor = ([f / c for c, f in zip(times[CAPSNET], times[FLOOR])] if FLOOR in times else [])
                for impl, runner in runners.items():
                    row: dict[str, Any] = {"impl": impl, "device": device_name, "mode": mode, "batch": batch_size,
                                           "rounds": config.routing_iterations, "dtype": dtype,
                                           "repeats": repeats, "warmup": warmup, "steps_per_timing": per_timing,
                                           "seed": seed}
                    row.update(_summary([batch_size / t for t in times[impl]]))
                    row["step_s"] = statistics.median(times[impl])
                    row["fused_adam"] = bool(runner.opt.defaults.get("fused")) if runner.opt is not None else None
                    row["peak_mem_mb"] = runner.peak_bytes() / 2**20 if memory else None
                    if impl == BASELINE:
                        row.update(ratio=1.0, ratio_min=1.0, ratio_max=1.0)
                    elif impl == CAPSNET and paired:
                        row.update(ratio=statistics.median(paired), ratio_min=min(paired), ratio_max=max(paired))
                    else:
                        row.update(ratio=None, ratio_min=None, ratio_max=None)
                    row["floor_ratio"] = statistics.median(to_floor) if impl == CAPSNET and to_floor else None
                    row["routing_share"] = (statistics.median(r_ / t for r_, t in zip(routing_times, times[CAPSNET]))
                                            if impl == CAPSNET and routing_times else None)
                    row["note"] = note if impl == CAPSNET else None
                    rows.append(row)
                del runners
    return rows


def _check_baseline_path(baseline_path: str | os.PathLike[str] | None) -> None:
    """A baseline asked for by name must exist: a typo must not pass as a choice to leave it out."""
    if baseline_path not in (None, "") and not Path(baseline_path).is_file():
        what = "a folder, not a file" if Path(baseline_path).is_dir() else "no such file"
        raise ValueError(f"tutorial baseline {baseline_path}: {what}; give the path of benchmarks/"
                         f"tutorial_baseline.py of a capsnet source checkout, or '' to leave the baseline out")


def bench_devices(devices: Sequence[str] | None) -> list[str]:
    """The devices a benchmark times (None: the CPU, and CUDA where torch sees it), each checked: a device torch
    cannot use is one ValueError naming it, not a traceback from inside the timing."""
    if devices is None:
        devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for name in devices:
        if parse_device(name).type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {name!r} asked for, but torch sees no CUDA device; use 'cpu' or leave the device out")
        resolve_device(name)  # mps without its build, meta
    return list(devices)


def run_grid(*, batch_sizes: Sequence[int] = (128,), rounds: Sequence[int] = (3,), dtypes: Sequence[str] = ("fp32",),
             on_start: Callable[[int, int, str], None] | None = None,
             on_done: Callable[[list[dict[str, Any]]], None] | None = None, **options: Any) -> list[dict[str, Any]]:
    """``run_benchmark`` for the paper's CapsNet at every (batch size, routing rounds, dtype), one row set each.

    ``on_start(batch, rounds, dtype)`` is called before each row set, ``on_done(rows)`` after it with every row
    measured so far (a grid cut short keeps what it finished); ``options`` go to ``run_benchmark``.
    """
    rows: list[dict[str, Any]] = []
    bench_devices(options.get("devices"))  # before the first row set is announced, as the baseline below
    _check_baseline_path(options.get("baseline_path"))
    if options.get("baseline_path"):  # a file of the wrong kind too (each row set loads it again before measuring)
        load_baseline(options["baseline_path"])
    for batch_size in batch_sizes:
        for r in rounds:
            for dtype in dtypes:
                if on_start is not None:
                    on_start(batch_size, r, dtype)
                rows += run_benchmark(batch_size=batch_size, dtype=dtype, config=CapsNetConfig(routing_iterations=r),
                                      **options)
                if on_done is not None:
                    on_done(list(rows))
    return rows


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """A markdown table of ``run_benchmark``'s rows, with their notes below it."""
    lines = [
        "| impl | device | mode | batch | rounds | dtype | images/s, median (min-max) | peak MB "
        "| x baseline, median (min-max) | of conv floor | routing share |",
        "| --- | --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        speed = f"{r['images_per_s']:.1f} ({r['images_per_s_min']:.1f}-{r['images_per_s_max']:.1f})"
        mem = "-" if r.get("peak_mem_mb") is None else f"{r['peak_mem_mb']:.0f}"
        ratio = "-" if r.get("ratio") is None else f"{r['ratio']:.2f} ({r['ratio_min']:.2f}-{r['ratio_max']:.2f})"
        share = "-" if r.get("floor_ratio") is None else f"{100 * r['floor_ratio']:.0f}%"
        routing = "-" if r.get("routing_share") is None else f"{100 * r['routing_share']:.0f}%"
        lines.append(f"| {r['impl']} | {r['device']} | {r['mode']} | {r['batch']} | {r.get('rounds', '-')} "
                     f"| {r.get('dtype', 'fp32')} | {speed} | {mem} | {ratio} | {share} | {routing} |")
    notes = list(dict.fromkeys(r["note"] for r in rows if r.get("note")))
    if notes:
        lines += [""] + [f"Note: {n}" for n in notes]
    return "\n".join(lines)
