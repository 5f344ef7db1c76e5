"""Where and how fast a model runs: the device, bfloat16 and float16 autocast (with float16's gradient scaler) and
torch.compile, for training and benchmarks."""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import threading
import weakref
from typing import Any, Callable, Iterator, TypeVar

import torch
from torch import nn

__all__ = ["AMP_MODES", "COMPILE_MODES", "resolve_device", "autocast", "grad_scaler", "scale_tensor", "compile_model",
           "fuses_adam", "sum_dtype", "evaluating", "keeps_mode", "keeps_rng"]

T = TypeVar("T")

# bf16, fp16: forward and losses under torch.autocast to bfloat16 or float16; weights and Adam stay fp32; fp16's
# losses are scaled before backward and its steps with a non-finite gradient skipped (``grad_scaler``)
AMP_MODES = ("none", "bf16", "fp16")
# Inductor modes ("default", "reduce-overhead": CUDA graphs, "max-autotune"), then backends
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "aot_eager", "eager")
_INDUCTOR_MODES = ("reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


# the models inside ``evaluating`` blocks: how many blocks hold each, and the mode the first found it in
_EVALUATING: "weakref.WeakKeyDictionary[nn.Module, list]" = weakref.WeakKeyDictionary()
_EVALUATING_LOCK = threading.Lock()


@contextlib.contextmanager
def evaluating(model: nn.Module) -> Iterator[None]:
    """``model`` in eval mode for the block (batch norm's running statistics, no dropout), its own mode after.

    Blocks on one model in several threads (two evaluations of one model in a service) share the switch: the first
    in switches to eval, the last out restores the mode the first found (each restoring its own left a model in
    eval mode, or one thread scoring in training mode while another had restored it, moving batch norm's saved
    statistics)."""
    try:
        hash(model)
    except TypeError:  # a user's module defining __eq__ alone: no table entry, its own switch as before
        was_training = model.training
        model.eval()
        try:
            yield
        finally:
            model.train(was_training)
        return
    with _EVALUATING_LOCK:
        held = _EVALUATING.get(model)
        if held is None:
            held = _EVALUATING[model] = [0, model.training]
            model.eval()
        held[0] += 1
    try:
        yield
    finally:
        with _EVALUATING_LOCK:
            held[0] -= 1
            if held[0] == 0:
                del _EVALUATING[model]
                model.train(held[1])


def keeps_rng(device: str | torch.device) -> contextlib.AbstractContextManager:
    """torch's global random state restored after the block (the CPU's, and on CUDA ``device``'s own): a training
    run or a benchmark seeds it from its own seed, which replaced the stream of the program that called it."""
    dev = torch.device(device)
    devices = [dev.index if dev.index is not None else torch.cuda.current_device()] if dev.type == "cuda" else []
    return torch.random.fork_rng(devices=devices)


def keeps_mode(fn: Callable[..., T]) -> Callable[..., T]:
    """A function of a model (its first argument) that puts it in eval mode: the caller's mode is restored after,
    so a figure drawn mid-training leaves dropout and batch norm training."""
    @functools.wraps(fn)
    def wrapper(model: nn.Module, *args: Any, **kwargs: Any) -> T:
        with evaluating(model):
            return fn(model, *args, **kwargs)
    return wrapper


def parse_device(device: str | torch.device) -> torch.device:
    """``torch.device(device)``, a name torch does not know being a ValueError that lists the usual ones."""
    try:
        return torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"unknown device {device!r}; use auto, cpu, cuda or cuda:N (or another device type torch "
                         f"knows, such as mps)") from None


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"``: CUDA when present, else the CPU; a CUDA device asked for without CUDA is a clear ValueError."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = parse_device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for, but this PyTorch sees no CUDA device; use 'cpu' or 'auto' "
                         f"(--device cpu or auto)")
    if dev.type == "cuda" and dev.index is not None and dev.index >= (count := torch.cuda.device_count()):
        # torch's own "invalid device ordinal" comes later, from the first tensor moved there, as a traceback
        raise ValueError(f"device {device!r} asked for, but this machine has {count} CUDA device"
                         f"{'s' if count != 1 else ''} (cuda:0{f' to cuda:{count - 1}' if count > 1 else ''}); use "
                         f"one of those, or 'cuda' (--device cuda)")
    if dev.type == "meta":
        raise ValueError(f"device {device!r} holds shapes, not numbers: nothing trains, scores or is timed there; use "
                         f"'cpu', 'cuda' or 'auto' (--device cpu, cuda or auto)")
    if dev.type not in ("cpu", "cuda"):  # mps, xpu, ...: known to torch, but maybe not built in or not on this machine
        try:
            torch.empty(1, device=dev)
        except (RuntimeError, AssertionError) as e:
            said = str(e).strip().splitlines()[0].split(". ")[0][:160] if str(e).strip() else type(e).__name__
            raise ValueError(f"device {device!r} asked for, but this PyTorch cannot use it here ({said}); use "
                             f"'cpu' or 'auto' (--device cpu or auto)") from None
    return dev


def sum_dtype(device: torch.device | str) -> torch.dtype:
    """The dtype of the running sums that training and evaluation keep on ``device`` (losses, counts, norms): float64,
    except on Apple's MPS, which has no float64 (every run and evaluation failed there at its first batch: "Cannot
    convert a MPS Tensor to float64"); float32 there keeps about 7 significant digits of an epoch's sums."""
    return torch.float32 if torch.device(device).type == "mps" else torch.float64


@functools.cache
def fuses_adam(device_type: str) -> bool:
    """Whether capsnet's Adam is fused on ``device_type`` ("cuda", "cpu", ...): on CUDA, and on the CPU where this
    torch has the fused kernel there (2.4 and later). PyTorch's default on the CPU loops over the tensors in Python:
    on this project's CPU 4-5x slower for CapsNet's weights, a training step 2-8% slower (benchmarks/README.md,
    "Fused Adam on the CPU"). Elsewhere (mps, xpu): PyTorch's default."""
    if device_type != "cpu":
        return device_type == "cuda"
    try:
        torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], fused=True)
    except (RuntimeError, ValueError):  # "`fused=True` requires all the params to be ... cuda" before 2.4
        return False
    return True


def autocast(device: torch.device, amp: str) -> torch.autocast:
    """The autocast context of an ``AMP_MODES`` setting (``"none"``: a disabled one)."""
    if amp not in AMP_MODES:
        raise ValueError(f"unknown amp {amp!r}; valid values are {', '.join(AMP_MODES)}")
    return torch.autocast(device.type, dtype=torch.float16 if amp == "fp16" else torch.bfloat16, enabled=amp != "none")


def grad_scaler(device: torch.device, amp: str) -> torch.amp.GradScaler:
    """The gradient scaler of an ``AMP_MODES`` setting: torch's dynamic loss scaling under "fp16" (the loss times
    2^16 at first, halved at each step whose gradient is not finite, which is then skipped, and doubled after
    2,000 steps without one: float16's gradients below 6e-8 would otherwise be lost to 0), a disabled one (its
    ``scale``, ``step`` and ``update`` plain pass-throughs) under "none" and "bf16", whose range is fp32's.
    torch before 2.3 has CUDA's scaler alone (torch.cuda.amp.GradScaler): disabled, it passes through on any
    device; "fp16" elsewhere than CUDA is refused there (nor does that torch's CPU autocast take float16)."""
    if amp not in AMP_MODES:
        raise ValueError(f"unknown amp {amp!r}; valid values are {', '.join(AMP_MODES)}")
    if hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler(device.type, enabled=amp == "fp16")
    if amp == "fp16" and device.type != "cuda":
        raise ValueError(f"amp 'fp16' on {device.type} needs torch 2.3 or newer (its loss scaling, "
                         f"torch.amp.GradScaler); this is torch {torch.__version__}: upgrade torch, or use 'bf16' or "
                         f"'none' (--amp bf16 or none)")
    return torch.cuda.amp.GradScaler(enabled=amp == "fp16")


def scale_tensor(scaler: torch.amp.GradScaler, device: torch.device) -> torch.Tensor:
    """An enabled ``scaler``'s scale as a device tensor, read without waiting for the device (``get_scale`` waits
    for it, once a step): it falls exactly at a skipped step, so ``scale_tensor(...).clone()`` before a step and a
    comparison after count the skipped steps on the device. Made at its starting value if no loss was scaled yet.
    Reads GradScaler's private ``_scale`` (the tests count skipped steps by the optimizer steps not taken)."""
    if scaler._scale is None:
        scaler._lazy_init_scale_growth_tracker(device)
    return scaler._scale


GRAPH_LIMIT = 64  # compiled graphs per function before torch falls back to running it uncompiled (its default: 8)


def require_compiler(compile: bool | str | None, device: str | torch.device) -> None:
    """A ValueError, before any work, where ``compile`` asks TorchInductor to compile for the CPU and no C++ compiler
    is on PATH (a slim container image): Inductor's own error came at the first training step, 154 lines of
    traceback. Backends that generate no C++ (aot_eager, eager) and other devices are left to torch."""
    import shutil

    if compile is False or compile is None or (isinstance(compile, str) and compile not in ("default",
                                                                                         *_INDUCTOR_MODES)):
        return
    try:  # "auto" resolved, any other as typed (a cuda typed on a CPU machine is said by the device's own check)
        dev = resolve_device(device) if str(device) == "auto" else parse_device(device)
    except ValueError:  # not a device: said by the device's own check
        return
    if dev.type != "cpu":
        return
    if os.name == "nt":
        candidates = [os.environ.get("CXX") or "cl"]
    else:  # Inductor's own search list ($CXX or g++, clang++ on macOS, unless the program set another)
        import torch._inductor.config as inductor

        cxx = inductor.cpp.cxx
        candidates = [c for c in (cxx if isinstance(cxx, (list, tuple)) else (cxx,)) if c]
    if candidates and not any(shutil.which(c) for c in candidates):
        raise ValueError(f"--compile {compile if isinstance(compile, str) else 'default'} (TorchInductor) on the CPU "
                         f"needs a C++ compiler, and {' or '.join(candidates)} "
                         f"({'CXX' if os.environ.get('CXX') else 'its default'}) is not on PATH: install one "
                         f"({compiler_hint(sys.platform)}) or point CXX at it, use --compile aot_eager, or --compile "
                         f"none")


def compiler_hint(platform: str) -> str:
    """How a C++ compiler is installed on ``platform`` (``sys.platform``), for ``require_compiler``'s message (it said
    "apt install g++" on Windows and macOS too)."""
    if platform.startswith("win"):
        return ("Visual Studio's Build Tools with C++, then run from a Developer Command Prompt, where cl is on "
                "PATH")
    if platform == "darwin":
        return "xcode-select --install"
    return "e.g. apt install g++"


PROFILER_NOTICE = "Profiler record function"  # Dynamo's notice that it traces through a record_function


def _drop_profiler_notice(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(PROFILER_NOTICE)


def _quiet_profiler_notice() -> None:
    """Drop Dynamo's "Profiler record function ... will be ignored", which DistributedDataParallel's forward (a
    record_function) printed on every rank of a compiled run: it says only that a profiler's trace will not hold
    the label. Installed once per process, however often called, and for the rest of the process (a profiled
    compiled run here loses that notice too, nothing else)."""
    logger = logging.getLogger("torch._dynamo.variables.ctx_manager")
    if _drop_profiler_notice not in logger.filters:
        logger.addFilter(_drop_profiler_notice)


def compile_model(model: nn.Module, compile: bool | str | None) -> nn.Module:
    """``torch.compile(model)`` for the training step, or the model itself when ``compile`` is False or None.

    ``compile`` is True (TorchInductor, default mode), an Inductor mode
    ("reduce-overhead": CUDA graphs; "max-autotune") or a backend name
    ("aot_eager", ...). Only the model is compiled: the optimizer step, whose
    learning rate changes every step, stays eager, so the graph never changes
    with it. The returned module shares the model's parameters; checkpoints
    are taken from the model itself.

    Shapes are static (``dynamic=False``): an epoch's last, smaller batch gets
    a graph of its own, and the full batches keep the graph made for their
    size. With torch's default (automatic dynamic shapes) that smaller batch
    recompiles the model for any batch size, and since Dynamo tries its most
    recent graph first, every full batch after it, from the second epoch on,
    runs the batch-size-generic graph instead of the one ``capsnet bench``
    times. Dynamo's graphs are kept per code object and shared by every
    model of a class, so several runs in one process (``capsnet experiment
    less-data``: one more last-batch size a training-set size) add up: the
    limit on graphs per function, past which torch runs the model uncompiled
    with no more than a warning, is raised to ``GRAPH_LIMIT``.
    """
    if compile is False or compile is None:
        return model
    _quiet_profiler_notice()
    dynamo_config = torch._dynamo.config
    dynamo_config.cache_size_limit = max(dynamo_config.cache_size_limit, GRAPH_LIMIT)
    kind = ({} if compile is True or compile == "default" else {"mode": compile} if compile in _INDUCTOR_MODES
            else {"backend": compile})
    return torch.compile(model, dynamic=False, **kind)
