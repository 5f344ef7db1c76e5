"""Export a model for inference: ONNX (onnxruntime and other runtimes), or ``torch.export``'s program (``.pt2``).

The exported graph takes a batch of images and returns the model's class
scores, its class capsules' poses and, where the model has a decoder, the
reconstruction from the predicted class's capsule (the others masked, as at
inference in ``CapsNet.forward``). The batch size is dynamic: one file runs
any batch; with ``any_size`` a segmentation model's height and width are
dynamic too (multiples of its ``side_multiple``). Outputs, by model (B is the batch, K the classes, D a capsule's
length, (C, H, W) the input image):

====================================  ==============================================================
model                                 outputs
====================================  ==============================================================
capsnet, efficient-capsnet            lengths (B, K), poses (B, K, D), reconstruction (B, C, H, W)
                                      (no reconstruction when built without a decoder; a CapsNet routed
                                      by EM, ``--routing em``: activations in place of lengths)
em-capsnet, em-capsnet-small          activations (B, K), poses (B, K, 16)
inverted-capsnet                      logits (B, K), poses (B, K, 16)
baseline                              logits (B, K)
segcaps, segcaps-r1                   probabilities (B, 1, H, W), poses (B, 1, 16, H, W),
                                      reconstruction (B, C, H, W) (masked by the prediction)
unet                                  probabilities (B, 1, H, W), logits (B, 1, H, W)
capspix2pix, capspix2pix-deep         images (B, C_out, H, W) (its generator alone, in eval mode)
====================================  ==============================================================

The input is ``images`` (B, C, H, W), float32 in [0, 1], as in training (a CIFAR-10 or smallNORB run's:
the standardised crops ``capsnet.data.tasks`` prepares outside the model, as its ``capsnet.input`` says).
The first output's largest entry is the predicted class in every classifier; a segmentation model's first
output is the foreground probability of every pixel (the mask: above 0.5).
CapsPix2pix's generator takes two inputs, ``label_maps`` (B, C_in, H, W) in
[0, 1] and ``noise`` (B, Z), standard normal z (``capsnet generate --seeds
S`` gives every label map row 0 of ``model.noise(1, S)``; ``capsnet eval``
and the viewer give test pair i row i of ``model.noise(N, S)``); in eval
mode its dropout is off, so the same label map and z give the same image.
Every file carries ``metadata_of``'s entries (the model, what its input is, the data set and, for a classifier,
its class names: ONNX ``metadata_props``, a ``.pt2``'s ``capsnet.json`` extra file).
pix2pix is not exported: its noise is dropout kept on at generation, drawn
per image from a seeded stream, which an exported graph cannot reproduce.

The graph holds plain tensor operations: tracing runs inside
``capsnet.routing.plain_routing()``, so ``DenseCaps`` routes its votes
without the hand-written autograd function that speeds up training
(``capsnet.routing.dynamic_linear``). ONNX comes from the dynamo-based
exporter (``torch.onnx.export(..., dynamo=True)``, which needs the ``onnx``
and ``onnxscript`` packages: ``pip install 'capsnet[export]'``), opset 18 or
newer. Before a file is written its graph runs on a batch of random images
and is compared with the PyTorch model (the ONNX file's bytes in onnxruntime,
when installed; the program as ``torch.export.save`` writes it); the file is
written whole, or not at all.
"""
from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import threading
import warnings
from dataclasses import dataclass, field
from importlib import import_module
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch import nn

from ._numbers import is_count, is_int
from ._text import some_of, told_apart
from .checkpoint import Checkpoint, atomic_write_bytes, run_file, unwritable
from .models import CapsNetOutput, EMCapsNetOutput, MODELS, SegCapsOutput, UNetOutput, model_name
from .models.capspix2pix import ConditionalGAN
from .models.inverted_capsnet import InvertedCapsNetOutput
from .routing import plain_routing, routing_is
from .routing.result import check_switch
from .runtime import evaluating

__all__ = ["FORMATS", "MIN_OPSET", "TOLERANCE", "UNSUPPORTED", "ExportError", "InferenceModule", "Traced",
           "ExportResult", "trace_model", "export_model", "output_names"]

FORMATS = {"onnx": ".onnx", "torch-export": ".pt2"}  # format -> the file suffix it gets by default
_ALIASES = {"pt2": "torch-export", "torch.export": "torch-export"}
MIN_OPSET = 18  # the dynamo-based ONNX exporter writes opset 18 and newer
# torch 2.13's exporter imports a module of onnxscript 0.6 on; before 0.7.2 it writes EM routing's arange as a
# Range of non-scalars, which onnxruntime refuses (pyproject's extras ask for the same)
MIN_ONNXSCRIPT = (0, 7, 2)
# torch.export.Dim and dynamic_shapes came in 2.2, derived dimensions (8 * Dim) later, torch.onnx.export of a traced
# program (dynamo=True) in 2.5 and its optimize= in 2.6 (torch 2.13's docstring: "versionchanged 2.7: optimize is now
# True by default"); pyproject's export extra asks for the same
MIN_TORCH = (2, 6)
TOLERANCE = 1e-4  # the largest difference from the PyTorch model an exported file may show, per unit of output scale
BATCH = "batch"  # the name of the dynamic batch dimension, in both formats
SIDES = ("height", "width")  # the names of an any-size export's image sides (trace_model(any_size=True))

# (model, format) pairs that cannot be exported, with the reason: export_model refuses them with it at once.
# tests/test_export.py holds every registered model to exporting in both formats or to its entry here.
_PIX2PIX = ("its noise is dropout kept on at generation, drawn for each image from a seeded stream, which an exported "
            "graph cannot reproduce; make images with `capsnet generate` instead")
UNSUPPORTED: dict[tuple[str, str], str] = {("pix2pix", fmt): _PIX2PIX for fmt in FORMATS}

# The fields of a model's output that an export returns, in order: (exported name, output field). A model of one's
# own declares them on its output class instead: ``EXPORT_FIELDS = (("scores", "scores"), ...)``.
_FIELDS: dict[type, tuple[tuple[str, str], ...]] = {
    CapsNetOutput: (("lengths", "lengths"), ("poses", "poses"), ("reconstruction", "reconstructions")),
    EMCapsNetOutput: (("activations", "activations"), ("poses", "poses")),
    InvertedCapsNetOutput: (("logits", "logits"), ("poses", "poses")),
    SegCapsOutput: (("probabilities", "probabilities"), ("poses", "poses"), ("reconstruction", "reconstructions")),
    UNetOutput: (("probabilities", "probabilities"), ("logits", "logits")),
}


class ExportError(ValueError):
    """A model or checkpoint cannot be exported as asked; the message names the model, the reason and the fix."""


def _label(model: nn.Module) -> str:
    """The registry name of ``model`` (``capsnet``, ...), else its class name."""
    try:
        return model_name(model.config)
    except (AttributeError, ValueError):
        return type(model).__name__


def _inputs(model: nn.Module) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """The exported graph's inputs, (name, shape without the batch): images, or a generator's label maps and noise."""
    cfg = getattr(model, "config", None)
    try:
        image = (int(cfg.in_channels), int(cfg.input_height), int(cfg.input_width))
    except AttributeError:
        raise ExportError(f"{_label(model)} has no config with in_channels, input_height and input_width: export "
                          f"takes the models of capsnet.models ({', '.join(MODELS)})") from None
    if isinstance(model, ConditionalGAN):
        if not hasattr(cfg, "noise_dim"):  # pix2pix: no noise input
            raise ExportError(f"{_label(model)} cannot be exported: {_PIX2PIX}")
        return ("label_maps", image), ("noise", (int(cfg.noise_dim),))
    return (("images", image),)


class InferenceModule(nn.Module):
    """A model for inference: ``images`` (B, C, H, W) in (a synthesis model's generator: ``label_maps`` and
    ``noise``), the tuple of tensors ``output_names`` names out.

    The model runs as at inference (no labels: a decoder reconstructs from
    the longest capsule). Build it with ``InferenceModule(model)``; the model
    should be in eval mode (``trace_model`` sees to it).
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.label = _label(model)
        self.inputs = _inputs(model)
        self.generator = isinstance(model, ConditionalGAN)
        # a GAN's generator alone: the whole model held here put the discriminator's weights in a .pt2 too (a quarter
        # of its bytes; torch.export keeps every parameter of the module, used or not)
        self.model = model.generator if self.generator else model
        with torch.no_grad(), evaluating(model):
            probe = self(*self.example(2, 0)) if self.generator else model(*self.example(2, 0))
        if self.generator:
            self._fields: tuple[tuple[str, str | None], ...] = (("images", None),)
        elif isinstance(probe, torch.Tensor):
            self._fields = (("logits", None),)
        elif (fields := _FIELDS.get(type(probe), getattr(type(probe), "EXPORT_FIELDS", None))) is not None:
            self._fields = tuple((n, f) for n, f in fields if getattr(probe, f) is not None)
            routing = getattr(model.config, "routing", "dynamic")
            if type(probe) is CapsNetOutput and not routing_is(routing, "length_activations"):
                # CapsNet routed by EM: its scores are the routing's activations, not its capsules' lengths
                self._fields = tuple(("activations" if n == "lengths" else n, f) for n, f in self._fields)
        else:
            raise ExportError(f"{self.label} returns a {type(probe).__name__}, whose fields export does not know: "
                              f"give that class EXPORT_FIELDS, a tuple of (exported name, field) pairs, e.g. "
                              f"EXPORT_FIELDS = (('scores', 'scores'), ('poses', 'poses'))")
        self.output_names = tuple(n for n, _ in self._fields)

    def example(self, batch: int, seed: int, sides: tuple[int, int] | None = None) -> tuple[torch.Tensor, ...]:
        """Seeded inputs of ``batch`` examples: images and label maps uniform in [0, 1), noise standard normal;
        ``sides``: images of that (height, width) in place of the model's own."""
        g = torch.Generator().manual_seed(seed)
        return tuple(torch.randn(batch, *shape, generator=g) if name == "noise" else
                     torch.rand(batch, *shape[:1], *(sides or shape[1:]), generator=g) for name, shape in self.inputs)

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Shapes: images (B, C, H, W), or label_maps (B, C, H, W) and noise (B, Z) -> the outputs
        ``output_names`` names (module docstring: shapes per model)."""
        if self.generator:
            return (self.model(*inputs),)
        out = self.model(*inputs)
        return tuple(out if f is None else getattr(out, f) for _, f in self._fields)


def output_names(model: nn.Module) -> tuple[str, ...]:
    """The names of the outputs an export of ``model`` returns, in order (e.g. lengths, poses, reconstruction)."""
    return InferenceModule(model).output_names


@dataclass
class Traced:
    """A model traced once by ``torch.export`` with a dynamic batch (and, ``any_size``, dynamic image sides):
    ``export_model`` writes it in any format."""

    module: InferenceModule
    program: torch.export.ExportedProgram
    any_size: bool = False

    @property
    def label(self) -> str:
        return self.module.label


# held by every tracing and export section: torch.export is not re-entrant across threads (two exports at once
# both failed "ProxyTorchDispatchMode slot already occupied", blamed on the model), and the warning filters and
# log levels _quiet sets are the process's (two overlapping left FutureWarning ignored and the loggers muted)
_EXPORTING = threading.RLock()


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The exporters' notes that say nothing about this model: deprecations inside torch, and the ONNX registry's
    'torchvision is not installed' lines (capsnet uses no torchvision operator); one thread at a time."""
    with _EXPORTING:
        yield from _quieted()


def _quieted() -> Iterator[None]:
    # onnxscript logs a version-conversion failure as a traceback and carries on at its own opset: the caller says
    # that in one line instead (_write_onnx)
    logs = [logging.getLogger("torch.onnx"), logging.getLogger("onnxscript")]
    levels = [log.level for log in logs]
    for log, quiet in zip(logs, (logging.ERROR, logging.CRITICAL)):
        log.setLevel(quiet)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            yield
    finally:
        for log, level in zip(logs, levels):
            log.setLevel(level)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def side_multiple(model: nn.Module) -> int | None:
    """What a fully convolutional model's image sides must be multiples of (SegCaps 8, a U-Net 2^depth and 8), or
    None for a model whose graph fixes its input size (a classifier's dense layers, a generator's noise map)."""
    m = getattr(model, "side_multiple", None)
    return m if isinstance(m, int) and not isinstance(model, ConditionalGAN) else None


def _segmentation_models() -> list[str]:
    return [n for n, spec in MODELS.items() if spec.kind == "segmentation"]


def _refuse_untraceable(model: nn.Module, any_size: bool) -> int | None:
    """An ExportError for a model ``trace_model`` cannot trace as asked (weights other than float32 on the CPU; any
    size for a model whose graph fixes it), before any work; else its ``side_multiple``."""
    check_switch("any_size", any_size)  # "no" read as True: refused as "export it without --any-size"
    odd = sorted({f"{p.dtype} on {p.device}" for p in model.parameters()
                  if p.dtype != torch.float32 or p.device.type != "cpu"})
    if odd:
        raise ExportError(f"{_label(model)} holds weights as {', '.join(odd)}; export traces float32 on the CPU: "
                          f"pass model.float().cpu()")
    multiple = side_multiple(model)
    if any_size and multiple is None:
        raise ExportError(f"{_label(model)} takes images of one size only (its graph fixes it): export it without "
                          f"--any-size, which exports the segmentation models ({', '.join(_segmentation_models())})")
    return multiple


def trace_model(model: nn.Module, *, example_batch: int = 2, any_size: bool = False) -> Traced:
    """Trace ``model`` for inference with ``torch.export``, the batch dimension dynamic, with plain routing.

    ``any_size``: the image's height and width dynamic too, any multiples of the model's ``side_multiple``
    (segmentation models only: SegCaps and the U-Net; tracing takes about five times as long).
    The model is traced in eval mode (its own mode is restored after).
    A model that cannot be traced is an ``ExportError`` naming it and the reason.
    """
    if not is_count(example_batch, 2):
        # 2.5 met torch's "rand() received an invalid combination of arguments", "3" a comparison's TypeError
        raise ValueError(f"example_batch must be an integer of at least 2 (torch.export treats a size of 1 as fixed), "
                         f"got {example_batch!r}")
    return _traced(model, _refuse_untraceable(model, any_size), any_size, example_batch)


def _traced(model: nn.Module, multiple: int | None, any_size: bool, example_batch: int = 2) -> Traced:
    """``trace_model``'s tracing of a model its refusals passed (``multiple``: the model's ``side_multiple``)."""
    _require_torch()
    module = InferenceModule(model)
    # an any-size trace: two blocks a side at least (at one the innermost map is 1x1, which torch.export fixes)
    example = module.example(example_batch, 0, None if not any_size else tuple(
        max(side, 2 * multiple) for side in module.inputs[0][1][1:]))
    batch = torch.export.Dim(BATCH, min=1)  # one dimension for every input: a generator's label maps and noise
    dims: tuple[dict[int, Any], ...] = tuple({0: batch} for _ in example)
    if any_size:  # sides in blocks of the model's multiple, two at least (above): 8 * height_blocks, ...
        dims = ({0: batch, **{2 + k: multiple * torch.export.Dim(f"{side}_blocks", min=2)
                              for k, side in enumerate(SIDES)}},)
    try:
        with evaluating(model), plain_routing(), _quiet():
            program = torch.export.export(module, example, dynamic_shapes=(dims,))
    except Exception as e:
        raise ExportError(f"{module.label} cannot be exported: torch.export cannot trace it ({_first_line(e)})") from e
    return Traced(module, program, any_size)


@dataclass
class ExportResult:
    """What ``export_model`` wrote: the file, its format, inputs and outputs, and how it was checked."""

    path: Path
    format: str  # a key of FORMATS
    model: str  # the registry name
    size: int  # bytes
    inputs: list[tuple[str, tuple[int | str, ...]]]  # (name, shape), "batch" for the dynamic dimension
    outputs: list[tuple[str, tuple[int | str, ...]]]
    opset: int | None = None  # ONNX only
    checked_with: str | None = None  # what ran the exported graph for the check; None: nothing (no onnxruntime)
    max_difference: float | None = None  # the largest |exported - PyTorch| over every output, on the check batch
    checked_sides: tuple[int, int] | None = None  # an any-size export's check images' (height, width)
    side_multiple: int | None = None  # an any-size export's: what height and width must be multiples of
    checkpoint: Path | None = None
    notes: list[str] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)  # written into the file (``metadata_of``)
    replaced: bool = False  # a file was at ``path`` before, and this one took its place

    def format_report(self) -> str:
        """The lines ``capsnet export`` prints."""
        what = f"ONNX, opset {self.opset}" if self.format == "onnx" else "torch.export program"
        source = f", from {self.checkpoint}" if self.checkpoint else ""
        replaced = ", replacing the file there" if self.replaced else ""
        lines = [f"wrote {self.path} ({_size(self.size)}, {what}{replaced}) of {self.model}{source}"]
        width = max(len(n) for n, _ in self.inputs + self.outputs)
        for kind, specs in (("input ", self.inputs), ("output", self.outputs)):
            for name, shape in specs:
                lines.append(f"  {kind}  {name:<{width}}  float32 ({', '.join(map(str, shape))})")
        if self.side_multiple:
            lines.append(f"height and width: any multiples of {self.side_multiple} from {2 * self.side_multiple} (" + (
                "the program refuses others)" if self.format != "onnx" else
                "the ONNX graph does not check them: another size runs to a wrong result or an error)"))
        if classes := self.metadata.get("capsnet.classes"):
            names = told_apart(json.loads(classes))  # "dog, big" read as two classes
            lines.append(f"classes (index k of {self.outputs[0][0]}): {some_of(names, 10)} (in the file's metadata)")
        if self.checked_with:
            sides = f" of {self.checked_sides[0]}x{self.checked_sides[1]}" if self.checked_sides else ""
            lines.append(f"checked: {self.checked_with} runs it on {_CHECK_BATCH} random "
                         f"{'inputs' if len(self.inputs) > 1 else 'images'}{sides} within {self.max_difference:.1e} "
                         f"of PyTorch")
        return "\n".join(lines + self.notes)


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n / 1e3:.1f} kB"


_CHECK_BATCH = 3  # neither the traced example's 2 nor 1: the check shows the batch is dynamic


def _check_batch(traced: Traced, result: ExportResult) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """Random inputs and the PyTorch model's own outputs on them (its fast paths on, as it trains and evaluates);
    an any-size export's at sides other than the traced ones (one block taller, two wider), which ``result`` records
    with the model's multiple."""
    module = traced.module
    sides = None
    if traced.any_size:
        m, (_, height, width) = side_multiple(module.model), module.inputs[0][1]
        sides = (height + m, width + 2 * m)
        result.checked_sides, result.side_multiple = sides, m
    inputs = module.example(_CHECK_BATCH, 1, sides)
    with torch.no_grad(), evaluating(module.model):
        return inputs, tuple(t.detach() for t in module(*inputs))


def _compare(traced: Traced, got: list[Any], expected: tuple[torch.Tensor, ...], what: str) -> float:
    worst = 0.0
    for name, g, e in zip(traced.module.output_names, got, expected):
        g = torch.as_tensor(g)
        if tuple(g.shape) != tuple(e.shape):
            raise ExportError(f"the exported {traced.label} ({what}) gives {name} of shape {tuple(g.shape)}, the model "
                              f"{tuple(e.shape)}; nothing written")
        diff = (g - e).abs().max().item() if e.numel() else 0.0
        if not diff <= TOLERANCE * max(1.0, e.abs().max().item()):
            raise ExportError(f"the exported {traced.label} ({what}) differs from the PyTorch model by {diff:.2g} in "
                              f"{name}, more than {TOLERANCE:g}; nothing written")
        worst = max(worst, diff)
    return worst


def _dim_names(traced: Traced) -> dict[str, str]:
    """The program's symbols for the first input's dynamic dimensions -> their names (batch, height, width)."""
    placeholder = next(n for n in traced.program.graph.nodes
                       if n.op == "placeholder" and n.name in traced.program.graph_signature.user_inputs)
    shape = placeholder.meta["val"].shape
    return {str(shape[k]): name for k, name in zip((0, 2, 3), (BATCH, *SIDES)) if not isinstance(shape[k], int)}


def _shape(dims: Any, names: dict[str, str]) -> tuple[int | str, ...]:
    return tuple(d if isinstance(d, int) else names.get(str(d), str(d)) for d in dims)


def _write_pt2(traced: Traced, path: Path, result: ExportResult) -> bytes:
    buffer = io.BytesIO()
    with _quiet():
        torch.export.save(traced.program, buffer, extra_files={METADATA_FILE: json.dumps(result.metadata)})
    data = buffer.getvalue()
    inputs, expected = _check_batch(traced, result)
    try:
        with torch.no_grad(), _quiet():
            got = torch.export.load(io.BytesIO(data)).module()(*inputs)  # the program as saved, read back
    except Exception as e:
        raise ExportError(f"the torch.export program of {traced.label} does not run once saved and read back: "
                          f"{_first_line(e)}; nothing written (--format onnx may work)") from e
    result.checked_with, result.max_difference = "torch.export", _compare(traced, list(got), expected, "pt2")
    names = _dim_names(traced)
    result.inputs = [(name, (BATCH, shape[0], *SIDES) if traced.any_size and name != "noise" else (BATCH, *shape))
                     for name, shape in traced.module.inputs]
    result.outputs = [(n, _shape(v.meta["val"].shape, names)) for n, v in
                      zip(traced.module.output_names, _program_outputs(traced.program))]
    return data


def _program_outputs(program: torch.export.ExportedProgram) -> list[Any]:
    output = next(n for n in program.graph.nodes if n.op == "output")
    return list(output.args[0])


def _version(text: str) -> tuple[int, ...]:
    """(0, 7, 2) from '0.7.2', '0.7.2.dev1' or '0.7.2rc1': the leading numbers of the first three parts."""
    parts = []
    for piece in text.split(".")[:3]:
        digits = re.match(r"\d+", piece)
        if digits is None:
            break
        parts.append(int(digits.group()))
    return tuple(parts)


def _require_torch() -> None:
    """An ExportError unless this torch has what export uses (``torch.export``'s dynamic dimensions and derived ones,
    torch.onnx's exporter of a traced program with ``optimize=``): torch ``MIN_TORCH`` or newer. The library trains
    and evaluates from torch 2.1."""
    if _version(torch.__version__) < MIN_TORCH:
        need = ".".join(map(str, MIN_TORCH))
        raise ExportError(f"capsnet export needs torch {need} or newer (torch.export's dynamic shapes and ONNX "
                          f"exporter); this is torch {torch.__version__.split('+')[0]}: pip install -U "
                          f"'torch>={need}'")


def _require_onnx() -> None:
    """onnx and onnxscript, new enough for torch.onnx's exporter, or an ExportError saying what to install."""
    missing, modules = [], {}
    for package in ("onnx", "onnxscript"):
        try:
            modules[package] = import_module(package)
        except ImportError:
            missing.append(package)
    if missing:
        raise ExportError(f"ONNX export needs the {' and '.join(missing)} package{'s' if len(missing) > 1 else ''}: "
                          f"pip install 'capsnet[export]' (or pip install {' '.join(missing)}), or use --format "
                          f"torch-export")
    have = getattr(modules["onnxscript"], "__version__", "0")
    if _version(have) < MIN_ONNXSCRIPT:
        need = ".".join(map(str, MIN_ONNXSCRIPT))
        raise ExportError(f"onnxscript {have} is too old: the exporter of torch {torch.__version__.split('+')[0]} "
                          f"writes every capsnet model only with onnxscript {need} or newer: "
                          f"pip install -U 'onnxscript>={need}'")


def _write_onnx(traced: Traced, path: Path, result: ExportResult, opset: int | None) -> bytes:
    _require_onnx()
    names = traced.module.output_names
    try:
        with _quiet():
            program = torch.onnx.export(traced.program, input_names=[n for n, _ in traced.module.inputs],
                                        output_names=list(names),
                                        opset_version=opset, dynamo=True, verbose=False,
                                        # the optimizer's "x + 0 -> x" takes a float32 1e-8 for 0 (its tolerance):
                                        # safe_norm's epsilon went, and lengths of zero poses read 0, not 1e-4
                                        optimize=False)
            proto = program.model_proto
    except Exception as e:
        raise ExportError(f"{traced.label} cannot be exported to ONNX: the exporter failed ({_first_line(e)})") from e
    foreign = sorted({f"{n.domain}::{n.op_type}" for n in proto.graph.node if n.domain not in ("", "ai.onnx")})
    if foreign or proto.functions:
        raise ExportError(f"{traced.label} exports to ONNX only with operators outside the standard set "
                          f"({', '.join(foreign) or 'local functions'}), which runtimes cannot run; nothing written")
    _name_dims(proto, traced.any_size)
    for key, value in result.metadata.items():  # ONNX's own place for it: runtimes read it (modelmeta)
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    try:
        data = proto.SerializeToString()
    except ValueError as e:  # protobuf's 2 GB limit
        raise ExportError(f"{traced.label} is too large for one ONNX file ({e}); use --format torch-export") from e
    result.opset = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    if opset is not None and result.opset != opset:  # the exporter falls back to its own opset with a log line only
        raise ExportError(f"the ONNX exporter cannot write {traced.label} at opset {opset} (it wrote opset "
                          f"{result.opset} instead); give an opset it supports, e.g. --opset {result.opset}; "
                          f"nothing written")
    result.inputs = [(v.name, _onnx_shape(v)) for v in proto.graph.input]
    result.outputs = [(v.name, _onnx_shape(v)) for v in proto.graph.output]
    try:
        import onnxruntime
    except ImportError:
        result.notes.append("not checked: onnxruntime is not installed (pip install onnxruntime runs the file here)")
        return data
    try:
        options = onnxruntime.SessionOptions()
        # errors only: its optimiser's "Could not find a CPU kernel and hence can't constant fold CastLike node" lines
        # (the exporter's casts of constants, run as they are) were printed in yellow on every export
        options.log_severity_level = 3
        session = onnxruntime.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    except Exception as e:
        raise ExportError(f"onnxruntime {onnxruntime.__version__} cannot load the ONNX {traced.label} (opset "
                          f"{result.opset}): {_first_line(e)}; nothing written (pip install -U onnxruntime onnxscript, "
                          f"or another --opset, may help)") from e
    inputs, expected = _check_batch(traced, result)
    got = session.run(list(names), {name: x.numpy() for (name, _), x in zip(traced.module.inputs, inputs)})
    result.checked_with = f"onnxruntime {onnxruntime.__version__}"
    result.max_difference = _compare(traced, got, expected, "ONNX")
    return data


def _name_dims(proto: Any, any_size: bool) -> None:
    """Call the batch dimension ``batch`` (the exporter calls it s0, s77, ...) in the graph's inputs and outputs, and
    an any-size export's sides ``height`` and ``width`` (the exporter's 8*s75, ...)."""
    first = proto.graph.input[0].type.tensor_type.shape.dim
    names = {first[k].dim_param: name for k, name in zip((0, 2, 3), (BATCH, *SIDES) if any_size else (BATCH,))}
    if "" in names or len(names) != (3 if any_size else 1):
        raise ExportError("the ONNX graph's dynamic dimensions came out fixed; this is a bug in capsnet.export")
    for value in [*proto.graph.input, *proto.graph.output, *proto.graph.value_info]:
        for d in value.type.tensor_type.shape.dim:
            if d.dim_param in names:
                d.dim_param = names[d.dim_param]


def _onnx_shape(value: Any) -> tuple[int | str, ...]:
    return tuple(d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim)


def _format(format: str) -> str:
    name = _ALIASES.get(format, format)
    if name not in FORMATS:
        raise ExportError(f"unknown export format {format!r}; valid formats are {', '.join(FORMATS)}")
    return name


METADATA_FILE = "capsnet.json"  # a torch.export program's extra file holding ``metadata_of``'s entries


def metadata_of(model: str, checkpoint: Checkpoint | None) -> dict[str, str]:
    """What an exported file carries about its model (ONNX ``metadata_props``; a ``.pt2``'s ``capsnet.json`` extra
    file), every value a string: ``capsnet.version``, ``capsnet.model`` (the registry name, or the class of a model
    of one's own); where known, ``capsnet.input`` (what the inputs are: a generator's label maps and noise, or, from
    a checkpoint that names its data set, a classifier's or segmenter's images); from such a checkpoint
    ``capsnet.dataset`` (a user's folder by its name alone, not its path) and, for a classifier whose class names
    are known and as many as its outputs, ``capsnet.classes`` (a JSON list: the class of each index of its
    scores)."""
    from . import __version__
    from .data.tasks import TASKS, dataset_stem, task_kind, trained_classes, user_folder
    from .data.tasks import PREPARED

    meta = {"capsnet.version": __version__, "capsnet.model": model}
    kind = MODELS[model].kind if model in MODELS else None
    if kind == "synthesis":  # two inputs, neither the other's kind; binary maps as the run read them (capsnet
        # generate reads a folder of 0/1 PNGs as 0/255: fed as pixels / 255 they were all but black)
        graded = checkpoint is not None and checkpoint.state.get("label_maps") == "graded"
        maps = ("float32 in [0, 1] (the pixels / 255)" if graded else "float32 in [0, 1], the pixels / 255 (a folder "
                "whose every pixel is 0 or 1 as 0/255 first, as capsnet generate reads it: binary maps are 0 or 1)")
        meta["capsnet.input"] = (f"label_maps: {maps}; noise: float32, standard normal (capsnet generate --seeds S "
                                 f"gives every map row 0 of model.noise(1, S); capsnet eval and the viewer give test "
                                 f"pair i row i of model.noise(N, S))")
    if checkpoint is None or "dataset" not in checkpoint.train_config:  # what it trained on is not known
        return meta
    dataset = checkpoint.train_config["dataset"]
    meta["capsnet.dataset"] = dataset_stem(dataset)
    if kind != "synthesis":
        source = None if user_folder(dataset) or task_kind(dataset) != "classification" else TASKS[dataset].source
        meta["capsnet.input"] = (f"float32, {PREPARED[source]} (capsnet.data.tasks prepares {source}'s)"
                                 if source in PREPARED else "float32 in [0, 1], as capsnet trains on (the pixels / 255)")
    classes = trained_classes(checkpoint.train_config, checkpoint.state) if kind == "classification" else None
    if classes is not None and len(classes) == checkpoint.model_config.get("num_classes"):
        meta["capsnet.classes"] = json.dumps(list(classes), ensure_ascii=False)  # 猫 as itself, not \u732b
    return meta


def export_model(source: str | os.PathLike | nn.Module | Traced, path: str | os.PathLike | None = None, *,
                 format: str = "onnx", which: str = "best", opset: int | None = None,
                 weights: str = "saved", any_size: bool = False,
                 say: Callable[[str], None] | None = None) -> ExportResult:
    """Export a model for inference to ``path`` as ONNX or as ``torch.export``'s program (module docstring).

    ``source`` is a checkpoint (a run directory made by ``capsnet train``, with
    ``which`` best or last, or a .safetensors file), a model, or ``trace_model``'s
    result (trace once, write both formats). ``path`` defaults to the checkpoint's
    own name with the format's suffix (best.onnx beside best.safetensors; a
    shipped model's, ``pretrained:NAME``, NAME.onnx or NAME.pt2 in the working
    folder, never inside the installed package).
    ``weights``: a checkpoint's "saved" weights or an averaged run's "training" ones (``load_model``; the default
    name then ends in -training-weights).
    ``format``: "onnx" or "torch-export" ("pt2" too); ``opset``: the ONNX opset,
    18 or newer (default: the exporter's). ``any_size``: a segmentation model's
    graph takes images of any height and width that are multiples of its
    ``side_multiple`` (``trace_model``; a traced source keeps its own). The file is checked against the
    model before it is written (ONNX: when onnxruntime is installed, else the
    result's ``notes`` say so), whole (a temporary file renamed), or not at all;
    every refusal is an ``ExportError`` (a ``ValueError``) saying why.
    """
    format = _format(format)
    if opset is not None:
        if format != "onnx":
            raise ExportError(f"an opset applies to ONNX only, not to format {format!r}")
        if not is_int(opset):  # "18" was called too old
            raise ExportError(f"opset must be an integer, e.g. {MIN_OPSET}, got {type(opset).__name__} {opset!r}")
        if opset < MIN_OPSET:
            raise ExportError(f"ONNX opset {opset!r} is too old: the dynamo-based exporter writes opset {MIN_OPSET} "
                              f"or newer")
    from .average import WEIGHTS, weights_tag

    if weights not in WEIGHTS:
        raise ExportError(f"weights must be one of {', '.join(WEIGHTS)}, got {weights!r}")
    if format == "onnx":
        _require_onnx()  # before loading and tracing: a missing package is said at once
        import onnx

        newest = onnx.defs.onnx_opset_version()
        if opset is not None and opset > newest:  # refused after the whole trace and export before
            raise ExportError(f"ONNX opset {opset} is newer than onnx {onnx.__version__} knows: give one from "
                              f"{MIN_OPSET} to {newest}")
    checkpoint: Checkpoint | None = None
    from . import pretrained

    shipped = pretrained.is_shipped(source)
    given = str(source) if isinstance(source, (str, os.PathLike)) else None  # as named, for ``say``
    if isinstance(source, (str, os.PathLike)):
        from .evaluate import load_model  # evaluate pulls in the data sets: only when a checkpoint is exported

        source, checkpoint = load_model(source, which=which, device="cpu", weights=weights)
    if not isinstance(source, (nn.Module, Traced)):
        raise TypeError(f"source must be a checkpoint path, a model or trace_model's result, "
                        f"got {type(source).__name__}")
    if checkpoint is None and weights != "saved":
        raise ExportError(f"weights={weights!r} picks a checkpoint's weights; this source is not a checkpoint but "
                          f"{type(source).__name__}")
    if checkpoint is None and which != "best":  # taken and ignored, as weights was not
        raise ExportError(f"which={which!r} picks a run's checkpoint; this source is not a checkpoint but "
                          f"{type(source).__name__}")
    label = source.label if isinstance(source, Traced) else _label(source)
    if (label, format) in UNSUPPORTED:
        raise ExportError(f"{label} cannot be exported to {format}: {UNSUPPORTED[label, format]}")
    if path is None:
        if checkpoint is None or checkpoint.path is None:
            raise ExportError("give the path of the file to write (only a checkpoint has a default: its own name)")
        # a shipped model's own name, in the working folder: never into the installed package
        stem = checkpoint.path.stem + weights_tag(weights)
        path = Path(stem + FORMATS[format]) if shipped else checkpoint.path.with_name(stem + FORMATS[format])
    path = Path(path)
    other = next((f for f, suffix in FORMATS.items() if f != format and path.suffix.lower() == suffix), None)
    if other is not None:  # a torch.export program named .onnx (or the reverse) opens nowhere
        raise ExportError(f"{path} has the suffix of format {other!r}, not of {format!r}: name it "
                          f"{path.with_suffix(FORMATS[format]).name} or pass format={other!r}")
    if path.is_dir():
        raise ExportError(f"{path} is a folder: give the path of the file to write, "
                          f"e.g. {path / ('model' + FORMATS[format])}")
    if checkpoint is not None and checkpoint.path is not None and path.resolve() == checkpoint.path.resolve():
        raise ExportError(f"{path} is the checkpoint itself: give another --out")
    if not path.suffix:  # a file named "model" opens in no tool by its name
        raise ExportError(f"{path} has no suffix; name it {path.name}{FORMATS[format]} (the {format} format's)")
    if (lost := run_file(path)) is not None:  # the run's other checkpoint, its config or metrics: never overwritten
        raise ExportError(f"{path} is {lost}; writing the export there would lose it: give another --out, e.g. "
                          f"{path.with_name('model' + FORMATS[format])}")
    if path.suffix.lower() != FORMATS[format]:  # eval-best.json, notes.txt: another file's name, never an export's
        raise ExportError(f"{path} has the suffix {path.suffix}, not the {format} format's {FORMATS[format]}: name it "
                          f"{path.with_suffix(FORMATS[format]).name}")
    if not path.parent.is_dir():
        raise ExportError(f"cannot write {path}: the folder {path.parent} does not exist")
    if (why := unwritable(path.parent)) is not None:  # said before tracing, not after it (tens of seconds)
        raise ExportError(f"cannot write {path}: {why} in {path.parent}; give another --out")
    if isinstance(source, Traced) and any_size and not source.any_size:
        raise ExportError(f"this {label} was traced for its own image size: trace it with "
                          f"trace_model(model, any_size=True)")
    # trace_model's own refusals, before the line below (and checked once: the trace below is trace_model's own)
    multiple = None if isinstance(source, Traced) else _refuse_untraceable(source, any_size)
    if say is not None:  # the seconds to minutes of tracing and checking, once every refusal above has passed
        say(f"exporting {given or label} as {'ONNX' if format == 'onnx' else 'a torch.export program'}: "
            + ("" if isinstance(source, Traced) else "tracing the model, then ") + "checking the file against it ...")
    traced = source if isinstance(source, Traced) else _traced(source, multiple, any_size)
    result = ExportResult(path, format, traced.label, 0, [], [], checkpoint=checkpoint.path if checkpoint else None,
                          metadata=metadata_of(traced.label, checkpoint))
    data = _write_onnx(traced, path, result, opset) if format == "onnx" else _write_pt2(traced, path, result)
    result.replaced = path.exists()
    atomic_write_bytes(path, data)
    result.size = len(data)
    return result
