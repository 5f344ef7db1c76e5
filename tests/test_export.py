"""Export for inference: every registered model as ONNX (run by onnxruntime) and as a torch.export program,
each compared with the PyTorch model at batch sizes 1 and 7 from one file; the graphs' operations; the refusals."""
from __future__ import annotations

import dataclasses
import json
import operator
import re
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import onnxruntime  # a test dependency (pyproject's test extra): a missing one fails here, it is not skipped
import onnxscript
import pytest
import torch
from torch import nn

from capsnet.export import (FORMATS, UNSUPPORTED, ExportError, ExportResult, TOLERANCE, export_model, output_names,
                            trace_model)
from capsnet.models import CapsNetConfig, create_model, list_models
from capsnet.routing import DynamicRouting, plain_routing, routing_is, routing_takes


class _Table(dict):
    """Each model's small sizes by name; a model without an entry is built at its registered sizes, with a warning
    (these tables are a speed-up, not a step of adding a model)."""

    def __missing__(self, name: str) -> Any:
        warnings.warn(f"{name!r} has no entry in tests/test_export.py's SMALL table: its export tests build it at its "
                      f"registered sizes; add the config fields that make it small if they are slow", stacklevel=2)
        return {}


# Small sizes and few routing rounds (every round is written out in the graph): each model traces in seconds.
SMALL = _Table({
    "capsnet": dict(conv1_channels=4, primary_types=2, decoder_hidden=(8,), routing_iterations=2,
                    input_height=20, input_width=20),
    "baseline": dict(channels=(4,), hidden=(8,)),
    # the two EM entries build one class: both route an E-step between two M-steps, one within each window (the
    # default), the other across a child's windows per parent type (a scatter-max and a scatter-add sized by the
    # dynamic batch)
    "em-capsnet": dict(conv1_channels=4, primary_types=2, caps1_types=2, caps2_types=2, routing_iterations=2,
                       input_height=20, input_width=20),
    "em-capsnet-small": dict(conv1_channels=4, primary_types=2, caps1_types=2, caps2_types=2,
                             routing_iterations=2, input_height=20, input_width=20, conv_e_step="child-type"),
    "efficient-capsnet": dict(decoder_hidden=(8,), input_height=14, input_width=14),
    "inverted-capsnet": dict(backbone_channels=4, primary_types=2, caps_types=2, routing_iterations=2,
                             input_height=16, input_width=16),
    # SAME padding and the none-of-the-above (leaky) routing; no decoder
    "capsnet-cifar10": dict(conv1_channels=4, primary_types=2, routing_iterations=2, input_height=12, input_width=12),
    "capsnet-svhn": dict(conv1_channels=4, primary_types=2, decoder_hidden=(8,), routing_iterations=2,
                         input_height=20, input_width=20),
    "segcaps": dict(routing_iterations=2, input_height=16, input_width=16),
    # one round everywhere (the authors' R1 routes 3 in five layers): segcaps, with -m slow, writes the rounds out
    "segcaps-r1": dict(input_height=16, input_width=16, strided_routing_iterations=1),
    "unet": dict(base_channels=4, depth=2, input_height=16, input_width=16),
    # one routing round: the two-input generator path (segcaps above writes the rounds out); a 2x faster export
    "capspix2pix": dict(input_height=8, input_width=8, routing_iterations=1),
    "capspix2pix-deep": dict(input_height=8, input_width=8, routing_iterations=1),
    "pix2pix": dict(input_height=16, input_width=16, disc_layers=2),
})
# what the README and capsnet.export promise each model's export returns (a model left out: what its export names)
OUTPUTS = dict({
    "capsnet": ("lengths", "poses", "reconstruction"), "efficient-capsnet": ("lengths", "poses", "reconstruction"),
    "em-capsnet": ("activations", "poses"), "em-capsnet-small": ("activations", "poses"),
    "inverted-capsnet": ("logits", "poses"), "baseline": ("logits",),
    "capsnet-cifar10": ("lengths", "poses"), "capsnet-svhn": ("lengths", "poses", "reconstruction"),
    "segcaps": ("probabilities", "poses", "reconstruction"), "segcaps-r1": ("probabilities", "poses", "reconstruction"),
    "unet": ("probabilities", "logits"),
    "capspix2pix": ("images",),  # its generator, from label_maps and noise
    "capspix2pix-deep": ("images",),  # the same generator from another start
    "pix2pix": None,  # refused (UNSUPPORTED): its noise is dropout, drawn per image from a seeded stream
})


def test_the_small_and_outputs_tables_name_registered_models_only():
    for table, name in ((SMALL, "SMALL"), (OUTPUTS, "OUTPUTS")):
        stale = sorted(set(table) - set(list_models()))
        assert not stale, f"{stale} are no longer registered: take them out of {name}"


def example_inputs(model: nn.Module, batch: int) -> dict[str, torch.Tensor]:
    """The exported graph's inputs by name: images, or a generator's label maps and its noise z."""
    cfg = model.config
    shape = (batch, cfg.in_channels, cfg.input_height, cfg.input_width)
    if hasattr(model, "generator"):  # pix2pix has no noise input (and is refused)
        return {"label_maps": torch.rand(*shape), "noise": torch.randn(batch, getattr(cfg, "noise_dim", 1))}
    return {"images": torch.rand(*shape)}


def reference(model: nn.Module, inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """The PyTorch model's own outputs, as it evaluates (its fast routing path on), in the export's order."""
    with torch.no_grad():
        if "noise" in inputs:  # a generator's images, as model.generate makes them in eval mode
            return [model.eval().generate(inputs["label_maps"], z=inputs["noise"])]
        out = model.eval()(inputs["images"])
    if isinstance(out, torch.Tensor):
        return [out]
    fields = {"reconstruction": "reconstructions"}
    if type(out).__name__ == "CapsNetOutput":  # CapsNet routed by EM: the lengths field holds its activations
        fields["activations"] = "lengths"
    return [getattr(out, fields.get(n, n)) for n in output_names(model)]


def assert_matches(got, expected, what):
    assert len(got) == len(expected), what
    for g, e in zip(got, expected):
        g = torch.as_tensor(g)
        assert g.shape == e.shape, what
        assert (g - e).abs().max().item() <= TOLERANCE, (what, (g - e).abs().max().item())


def onnx_checks(path, names, batches, model):
    import onnx

    proto = onnx.load(str(path))
    ops = {(n.domain, n.op_type) for n in proto.graph.node}
    assert all(domain in ("", "ai.onnx") for domain, _ in ops), ops  # standard operators only
    assert not any(op in ("PythonOp", "ATen") for _, op in ops) and not proto.functions, ops
    assert [v.name for v in proto.graph.input] == list(batches[0]) and [v.name for v in proto.graph.output] == list(names)
    for value in [*proto.graph.input, *proto.graph.output]:  # one dynamic dimension, named, first everywhere
        assert value.type.tensor_type.shape.dim[0].dim_param == "batch", value
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for inputs in batches:  # one file, two batch sizes
        got = session.run(None, {name: x.numpy() for name, x in inputs.items()})
        assert_matches(got, reference(model, inputs), f"onnx, batch {len(next(iter(inputs.values())))}")


def pt2_checks(path, batches, model):
    program = torch.export.load(str(path))
    if hasattr(model, "generator"):  # a GAN's generator alone: the discriminator's weights were saved in it too
        held = {**program.state_dict, **program.constants}
        assert sum(t.numel() for t in held.values()) == sum(t.numel() for t in model.generator.state_dict().values())
    for node in program.graph.nodes:  # plain aten operations: no autograd function, autocast or other wrapper
        if node.op == "call_function":  # (operator's and torch.sym_*: arithmetic on a dynamic side, not tensors)
            target = node.target
            assert (isinstance(target, torch._ops.OpOverload) and target.namespace == "aten") or \
                getattr(target, "__module__", None) in (operator.__name__, "_operator") or \
                target in (torch.sym_max, torch.sym_min), node.format_node()
    loaded = program.module()
    for inputs in batches:
        with torch.no_grad():
            got = loaded(*inputs.values())
        assert_matches(list(got), reference(model, inputs), f"pt2, batch {len(next(iter(inputs.values())))}")


# segcaps is segcaps-r1 with more routing rounds written out: a later round repeats the first's operations and adds
# the agreement update (a product and a sum, operations of the same kinds); a 20-25 s export against 10 s, so it
# runs with -m slow; capspix2pix-deep is capspix2pix's generator from another start, the same operations;
# em-capsnet-small is em-capsnet's layers at other sizes (10 s); capsnet-svhn is capsnet's layers over three
# channels (6 s; capsnet-cifar10 keeps the three-channel input and SAME padding in the default suite)
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow)
                                  if n in ("segcaps", "capspix2pix-deep", "em-capsnet-small", "capsnet-svhn") else n
                                  for n in list_models()])
@pytest.mark.e2e
def test_every_registered_model_exports_to_both_formats_and_runs_at_any_batch_size(name, tmp_path):
    torch.manual_seed(0)
    model = create_model(name, **SMALL[name])
    promised = OUTPUTS[name] if name in OUTPUTS else output_names(model)
    assert promised is None or output_names(model) == promised
    batches = [example_inputs(model, b) for b in (1, 7)]
    traced = None
    for fmt in FORMATS:
        path = tmp_path / f"{name}{FORMATS[fmt]}"
        if (name, fmt) in UNSUPPORTED:  # a refusal must say which model and why
            with pytest.raises(ExportError, match=name) as info:
                export_model(model, path, format=fmt)
            assert UNSUPPORTED[name, fmt] in str(info.value) and not path.exists()
            continue
        traced = traced or trace_model(model)  # trace once, write both formats
        result = export_model(traced, path, format=fmt)
        assert result.path == path and result.size == path.stat().st_size > 0 and result.model == name
        assert [n for n, _ in result.outputs] == list(promised)
        assert result.inputs == [(n, ("batch", *x.shape[1:])) for n, x in batches[0].items()]
        assert result.max_difference is not None and result.max_difference <= TOLERANCE
        if fmt == "onnx":
            assert result.opset >= 18 and result.checked_with.startswith("onnxruntime")
            onnx_checks(path, promised, batches, model)
            if name.startswith("capspix2pix"):  # `capsnet generate --seed 5`'s images: its z fed to the file (README, Export)
                from capsnet.synthesis import generate

                maps = batches[1]["label_maps"]
                session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
                got, = session.run(None, {"label_maps": maps.numpy(), "noise": model.noise(len(maps), 5).numpy()})
                assert_matches([got], [generate(model.eval(), maps, seed=5, batch_size=3)], "generate's images")
        else:
            pt2_checks(path, batches, model)
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left


@pytest.mark.e2e
@pytest.mark.parametrize("routing", [r for r in CapsNetConfig.probability_routings() if r != "dynamic"])
def test_a_capsnet_routed_otherwise_exports_to_both_formats(routing, tmp_path):
    """CapsNetConfig.routing: the EM and self-attention digit capsules (every routing CapsNet takes, from the
    registry) trace to plain operations as dynamic routing does (EM's routing in float32 inside, its fused backward
    left out), and the files give the model's outputs."""
    torch.manual_seed(0)
    small = {k: v for k, v in SMALL["capsnet"].items()
             if k != "routing_iterations" or routing_takes(routing, "iterations")}  # (self-attention: one pass)
    model = create_model("capsnet", **small, routing=routing)
    batches = [example_inputs(model, b) for b in (1, 7)]
    traced = trace_model(model)
    for fmt in FORMATS:
        path = tmp_path / f"capsnet-{routing}{FORMATS[fmt]}"
        result = export_model(traced, path, format=fmt)
        # EM's activations are not its capsules' lengths; self-attention's are
        names = ("lengths" if routing_is(routing, "length_activations") else "activations", *OUTPUTS["capsnet"][1:])
        assert [n for n, _ in result.outputs] == list(names)
        assert result.max_difference is not None and result.max_difference <= TOLERANCE
        if fmt == "onnx":
            onnx_checks(path, names, batches, model)
        else:
            pt2_checks(path, batches, model)


def test_exported_graphs_route_without_the_autograd_function(monkeypatch):
    """The fast path (one torch.autograd.Function) is what eval runs; tracing for export and plain_routing() avoid it
    and give the same numbers."""
    calls = []  # one entry per call: whether torch.export was tracing
    fast = DynamicRouting.route_linear
    monkeypatch.setattr(DynamicRouting, "route_linear",
                        lambda self, *a, **k: calls.append(torch.compiler.is_exporting()) or fast(self, *a, **k))
    torch.manual_seed(1)
    model = create_model("capsnet", **SMALL["capsnet"]).eval()
    images = torch.rand(3, 1, 20, 20)
    with torch.no_grad():
        out = model(images)
        assert calls == [False]  # the plain eager forward takes the fast path
        with plain_routing():
            plain = model(images)
    assert calls == [False]
    torch.testing.assert_close(plain.lengths, out.lengths, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(plain.poses, out.poses, rtol=1e-5, atol=1e-6)
    traced = trace_model(model)
    assert True not in calls  # never while torch.export traces
    assert "autograd_function" not in str(traced.program.graph)


class Branchy(nn.Module):
    """Decides on its input's values in Python: torch.export cannot trace that."""

    config = SimpleNamespace(in_channels=1, input_height=4, input_width=4)

    def forward(self, images):
        return images.flatten(1) if images.sum() > 0 else -images.flatten(1)


def test_a_model_that_cannot_be_traced_is_a_clear_error(tmp_path):
    with pytest.raises(ExportError, match=r"Branchy cannot be exported: torch.export cannot trace it \(\w+"):
        export_model(Branchy(), tmp_path / "b.pt2", format="torch-export")
    assert list(tmp_path.iterdir()) == []


def test_a_torch_too_old_for_export_is_named_before_tracing(tmp_path, monkeypatch):
    """torch 2.1 (the library's floor) has no torch.export.Dim: export died in an AttributeError traceback, and a
    torch before 2.6 in the ONNX exporter's "unexpected keyword argument" (a review of the declared floors)."""
    monkeypatch.setattr(torch, "__version__", "2.5.1+cpu")
    with pytest.raises(ExportError, match=r"capsnet export needs torch 2\.6 or newer .*this is torch 2\.5\.1: pip "
                                          r"install -U 'torch>=2\.6'"):
        export_model(create_model("baseline", **SMALL["baseline"]), tmp_path / "m.pt2", format="torch-export")
    assert list(tmp_path.iterdir()) == []


def test_refusals_name_the_problem_and_write_nothing(tmp_path, monkeypatch):
    model = create_model("baseline", **SMALL["baseline"])
    with pytest.raises(ExportError, match="unknown export format 'tflite'; valid formats are onnx, torch-export"):
        export_model(model, tmp_path / "m.tflite", format="tflite")
    with pytest.raises(ExportError, match="opset 17 is too old.*18 or newer"):
        export_model(model, tmp_path / "m.onnx", opset=17)
    with pytest.raises(ExportError, match="opset must be an integer, e.g. 18, got str '18'"):  # was "too old"
        export_model(model, tmp_path / "m.onnx", opset="18")
    with pytest.raises(ExportError, match="opset applies to ONNX only"):
        export_model(model, tmp_path / "m.pt2", format="torch-export", opset=18)
    import onnx

    newest = onnx.defs.onnx_opset_version()  # past what onnx knows: refused before the trace and export, not after
    with pytest.raises(ExportError, match=rf"ONNX opset 99 is newer than onnx {re.escape(onnx.__version__)} knows: "
                                          rf"give one from 18 to {newest}$"):
        export_model(model, tmp_path / "m.onnx", opset=99)
    with pytest.raises(ExportError, match="the folder .*missing does not exist"):
        export_model(model, tmp_path / "missing" / "m.pt2", format="pt2")
    # a folder that cannot be written: said before tracing (tens of seconds for the EM model), not after it
    import capsnet.export as export_module

    monkeypatch.setattr(export_module, "unwritable", lambda folder: "Read-only file system")
    monkeypatch.setattr(export_module, "trace_model", lambda *a, **k: pytest.fail("traced first"))
    with pytest.raises(ExportError, match=r"cannot write .*m.pt2: Read-only file system in .*; give another --out"):
        export_model(model, tmp_path / "m.pt2", format="pt2")
    monkeypatch.undo()
    with pytest.raises(ExportError, match="give the path"):
        export_model(model, format="pt2")
    with pytest.raises(ExportError, match=r"m.onnx has the suffix of format 'onnx', not of 'torch-export': name it "
                                          r"m.pt2 or pass format='onnx'"):  # written before, as a .pt2 named .onnx
        export_model(model, tmp_path / "m.onnx", format="pt2")
    with pytest.raises(ExportError, match=r"M.PT2 has the suffix of format 'torch-export', not of 'onnx'"):
        export_model(model, tmp_path / "M.PT2")
    with pytest.raises(ExportError, match=r"baseline holds weights as torch.float64 on cpu; .* model.float\(\).cpu\(\)"):
        export_model(create_model("baseline", **SMALL["baseline"]).double(), tmp_path / "m.pt2", format="pt2")
    monkeypatch.setattr(onnxscript, "__version__", "0.7.1")
    with pytest.raises(ExportError, match=r"onnxscript 0.7.1 is too old: .* pip install -U 'onnxscript>=0.7.2'"):
        export_model(model, tmp_path / "m.onnx")
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # as if not installed: importing it raises ImportError
    with pytest.raises(ExportError, match=r"needs the onnxscript package: pip install 'capsnet\[export\]'"):
        export_model(model, tmp_path / "m.onnx")
    assert list(tmp_path.iterdir()) == []


def test_a_file_that_does_not_match_the_model_is_never_written(tmp_path, monkeypatch):
    model = create_model("baseline", **SMALL["baseline"]).train()
    monkeypatch.setattr("capsnet.export.TOLERANCE", -1.0)  # no difference is small enough
    for fmt, suffix in FORMATS.items():
        target = tmp_path / f"m{suffix}"
        target.write_bytes(b"the previous export")
        with pytest.raises(ExportError, match="differs from the PyTorch model by .* nothing written"):
            export_model(model, target, format=fmt)
        assert target.read_bytes() == b"the previous export"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.pt2"]
    assert model.training  # exporting leaves the model in its own mode


def test_the_torch_export_file_is_checked_as_saved_and_read_back(tmp_path, monkeypatch):
    """The check runs the program read back from the bytes to be written, not the one in memory: a save that loses
    something (here: read back as another model's program) is refused, and nothing is written."""
    import torch

    model = create_model("baseline", **SMALL["baseline"])
    other = create_model("baseline", **SMALL["baseline"])  # other random weights
    other_program = trace_model(other).program
    monkeypatch.setattr(torch.export, "load", lambda f: other_program)
    with pytest.raises(ExportError, match="differs from the PyTorch model by .* nothing written"):
        export_model(model, tmp_path / "m.pt2", format="torch-export")
    monkeypatch.setattr(torch.export, "load", lambda f: (_ for _ in ()).throw(RuntimeError("bad archive")))
    with pytest.raises(ExportError, match=r"does not run once saved and read back: RuntimeError: bad archive; nothing written"):
        export_model(model, tmp_path / "m.pt2", format="torch-export")
    assert list(tmp_path.iterdir()) == []


def test_an_export_says_the_file_it_replaced_and_refuses_another_kind_of_files_name(tmp_path):
    """Any suffix but the other format's was written: --out eval-best.json replaced a run's report with a program,
    and an export over a file said nothing of it (a review, 2026-12-02)."""
    traced = trace_model(create_model("baseline", **SMALL["baseline"]))
    report = tmp_path / "eval-best.json"
    report.write_text('{"accuracy": 0.99}')
    with pytest.raises(ExportError, match=r"eval-best.json has the suffix .json, not the torch-export format's .pt2: "
                                          r"name it eval-best.pt2"):
        export_model(traced, report, format="torch-export")
    assert report.read_text() == '{"accuracy": 0.99}' and sorted(p.name for p in tmp_path.iterdir()) == [report.name]
    fresh = export_model(traced, tmp_path / "m.pt2", format="torch-export")
    again = export_model(traced, tmp_path / "m.pt2", format="torch-export")
    assert not fresh.replaced and "replacing" not in fresh.format_report()
    assert again.replaced and again.format_report().startswith(f"wrote {tmp_path / 'm.pt2'} (")
    assert "torch.export program, replacing the file there) of baseline" in again.format_report().splitlines()[0]


def test_class_names_holding_a_comma_are_quoted_in_the_report():
    """A classes:DIR run with folders "cat" and "dog, big" was reported as "cat, dog, big" (three classes)."""
    result = ExportResult(Path("m.onnx"), "onnx", "capsnet", 10, [("images", ("batch", 1, 28, 28))],
                          [("scores", ("batch", 2))], metadata={"capsnet.classes": json.dumps(["cat", "dog, big"])})
    assert 'classes (index k of scores): "cat", "dog, big" (in the file' in result.format_report()
    plain = dataclasses.replace(result, metadata={"capsnet.classes": json.dumps(["cat", "dog"])})
    assert "classes (index k of scores): cat, dog (in the file" in plain.format_report()


def test_an_older_opset_is_written_as_asked(tmp_path):
    import onnx

    result = export_model(create_model("baseline", **SMALL["baseline"]), tmp_path / "m.onnx", opset=18)
    assert result.opset == 18
    assert [o.version for o in onnx.load(str(tmp_path / "m.onnx")).opset_import if o.domain in ("", "ai.onnx")] == [18]


def test_an_opset_the_exporter_cannot_write_is_refused_not_replaced_by_another(tmp_path, caplog, monkeypatch):
    """onnxscript's version converter fails past the opsets it knows, logs a traceback and keeps its own opset:
    before, the file was written at that other opset and reported as a success. (An opset past what onnx itself
    knows is refused before the export: here onnx is told it knows 2000, so the exporter's own answer is met.)"""
    import onnx

    monkeypatch.setattr(onnx.defs, "onnx_opset_version", lambda: 2000)
    with pytest.raises(ExportError, match=r"cannot write baseline at opset 1000 \(it wrote opset \d+ instead\); give "
                                          r"an opset it supports, e.g. --opset \d+; nothing written"):
        export_model(create_model("baseline", **SMALL["baseline"]), tmp_path / "m.onnx", opset=1000)
    assert list(tmp_path.iterdir()) == []
    assert "Traceback" not in caplog.text


def test_an_onnx_file_keeps_the_norms_epsilon(tmp_path):
    """The ONNX optimizer's 'x + 0 -> x' took safe_norm's float32 1e-8 for 0: the file computed the lengths of zero
    poses as 0, not sqrt(1e-8) = 1e-4, a difference at the whole of TOLERANCE (SegCaps' background: 8.6e-5; a
    review, 2026-11-30)."""
    torch.manual_seed(0)
    model = create_model("capsnet", **SMALL["capsnet"]).eval()
    with torch.no_grad():  # poses of exactly zero: a zero image through zero weights
        for p in model.parameters():
            p.zero_()
    path = tmp_path / "zero.onnx"
    export_model(model, path, format="onnx")
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    c = model.config
    x = torch.zeros(2, c.in_channels, c.input_height, c.input_width)
    got = dict(zip([o.name for o in session.get_outputs()], session.run(None, {"images": x.numpy()})))
    with torch.no_grad():
        want = model(x).lengths
    assert abs(float(want.min()) - 1e-4) < 1e-7  # the epsilon's floor, in eager
    assert abs(got["lengths"] - want.numpy()).max() < 1e-6


# segcaps-r1 traces about six times as long with symbolic sides as with fixed ones (a minute here): -m slow
@pytest.mark.e2e
@pytest.mark.parametrize("name", ["unet", pytest.param("segcaps-r1", marks=pytest.mark.slow)])
def test_any_size_export_runs_at_other_sides_and_refuses_sides_off_the_stride(name, tmp_path):
    """--any-size: one file takes images of any height and width that are multiples of the model's stride (not
    only the traced 16x16), named height and width in both formats; another size is refused by the graph."""
    from capsnet.export import side_multiple

    torch.manual_seed(0)
    model = create_model(name, **SMALL[name]).eval()
    assert side_multiple(model) == 8  # unet's depth 2 would allow 4: SegCaps' 8 is kept, so both take one set
    traced = trace_model(model, any_size=True)
    sizes = [(1, 16, 16), (2, 24, 40), (3, 48, 16)]  # two blocks a side at least; tall, wide
    batches = [{"images": torch.rand(b, 1, h, w)} for b, h, w in sizes]
    for fmt in FORMATS:
        path = tmp_path / f"{name}{FORMATS[fmt]}"
        result = export_model(traced, path, format=fmt)
        assert result.inputs == [("images", ("batch", 1, "height", "width"))]
        assert all(shape[0] == "batch" and shape[-2:] == ("height", "width") for _, shape in result.outputs)
        assert result.checked_sides == (24, 32) and "images of 24x32 within" in result.format_report()
        assert result.side_multiple == 8 and "height and width: any multiples of 8 from 16 (" in result.format_report()
        assert ("does not check them" in result.format_report()) == (fmt == "onnx")
        if fmt == "onnx":
            import onnx

            proto = onnx.load(str(path))
            for value in [*proto.graph.input, *proto.graph.output]:
                dims = [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]
                assert dims[0] == "batch" and dims[-2:] == ["height", "width"], (value.name, dims)
            session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            for inputs in batches:
                got = session.run(None, {"images": inputs["images"].numpy()})
                assert_matches(got, reference(model, inputs), f"onnx at {tuple(inputs['images'].shape)}")
        else:
            pt2_checks(path, batches, model)
            with pytest.raises(Exception, match="% 8 == 0"):  # the program's guard: 20 is no multiple of 8
                torch.export.load(str(path)).module()(torch.rand(1, 1, 20, 16))


def test_any_size_is_refused_for_a_model_of_one_input_size(tmp_path):
    """A classifier's dense layers and CapsPix2pix's noise map fix the input size: said at once, nothing written."""
    for name in ("capsnet", "capspix2pix"):
        with pytest.raises(ExportError, match=f"{name} takes images of one size only .* --any-size, which exports "
                                              f"the segmentation models \\(segcaps, segcaps-r1, unet\\)"):
            export_model(create_model(name, **SMALL[name]), tmp_path / "m.onnx", any_size=True)
    traced = trace_model(create_model("unet", **SMALL["unet"]))  # traced for its own size: cannot become any size
    with pytest.raises(ExportError, match=r"traced for its own image size: .*any_size=True"):
        export_model(traced, tmp_path / "u.onnx", any_size=True)
    assert list(tmp_path.iterdir()) == []


def test_export_cli_any_size(tmp_path, capsys):
    """capsnet export --any-size on a segmentation checkpoint: the file takes other sides; on a classifier: refused
    in one line."""
    from capsnet.checkpoint import Checkpoint, save_checkpoint
    from capsnet.cli import main

    torch.manual_seed(0)
    for name in ("unet", "baseline"):
        model = create_model(name, **SMALL[name])
        save_checkpoint(tmp_path / f"{name}.safetensors", Checkpoint(name, model.config.to_dict(), {},
                                                                     {"epoch": 1, "step": 1}, model.state_dict()))
    assert main(["export", "--checkpoint", str(tmp_path / "unet.safetensors"), "--format", "torch-export",
                 "--any-size"]) == 0
    import re

    assert re.search(r"input +images +float32 \(batch, 1, height, width\)", capsys.readouterr().out)
    from capsnet.evaluate import load_model

    unet, _ = load_model(tmp_path / "unet.safetensors")
    pt2_checks(tmp_path / "unet.pt2", [{"images": torch.rand(2, 1, 32, 16)}], unet)
    assert main(["export", "--checkpoint", str(tmp_path / "baseline.safetensors"), "--any-size"]) == 2
    err = capsys.readouterr().err
    assert "baseline takes images of one size only" in err and "Traceback" not in err
    assert not (tmp_path / "baseline.onnx").exists()


def test_any_size_traces_a_model_whose_own_side_is_one_block():
    """A U-Net of depth 4 (multiple 16) at 16x16: the trace at its own size made the innermost map 1x1, which
    torch.export fixed, and the any-size trace failed (a review, 2026-11-30); it traces at two blocks a side."""
    torch.manual_seed(0)
    model = create_model("unet", base_channels=2, depth=4, input_height=16, input_width=16).eval()
    traced = trace_model(model, any_size=True)
    x = torch.rand(2, 1, 48, 32)  # two blocks a side at least (said in the report)
    with torch.no_grad():
        got, want = traced.program.module()(x), model(x)
    torch.testing.assert_close(got[0], want.probabilities, rtol=1e-5, atol=1e-6)


def test_a_model_of_ones_own_declares_its_exported_outputs_on_its_output_class(tmp_path):
    """export knew the outputs of the shipped models only, from a table in export.py (a review, 2026-11-30: a
    model added as the README says could not be exported without editing it); an output class names its own."""
    from typing import NamedTuple

    class Out(NamedTuple):
        scores: torch.Tensor
        poses: torch.Tensor
        extra: torch.Tensor | None = None

    class Declared(Out):
        EXPORT_FIELDS = (("class_scores", "scores"), ("poses", "poses"), ("extra", "extra"))

    class Own(nn.Module):
        def __init__(self, out: type) -> None:
            super().__init__()
            self.config = SimpleNamespace(in_channels=1, input_height=8, input_width=8)
            self.linear, self.out = nn.Linear(64, 6), out

        def forward(self, x: torch.Tensor) -> Out:
            y = self.linear(x.flatten(1))
            return self.out(y[:, :3].softmax(1), y.view(-1, 3, 2))

    with pytest.raises(ExportError, match=r"returns a Out, whose fields export does not know: give that class "
                                          r"EXPORT_FIELDS"):
        output_names(Own(Out))
    model = Own(Declared).eval()
    assert output_names(model) == ("class_scores", "poses")  # a field that is None is left out
    done = export_model(model, tmp_path / "own.onnx")
    session = onnxruntime.InferenceSession(str(done.path))
    x = torch.rand(3, 1, 8, 8)
    scores, poses = session.run(None, {"images": x.numpy()})
    with torch.no_grad():
        expected = model(x)
    assert torch.allclose(torch.from_numpy(scores), expected.scores, atol=1e-5)
    assert torch.allclose(torch.from_numpy(poses), expected.poses, atol=1e-5)


def test_two_threads_exporting_at_once_both_succeed_and_leave_the_warnings_and_logs_as_they_were(tmp_path):
    """torch.export is not re-entrant across threads: both exports failed "cannot trace it (AssertionError:
    ProxyTorchDispatchMode slot already occupied)", blaming the model, and the overlapping warning filters and log
    levels left FutureWarning ignored and two loggers muted for the rest of the process."""
    import logging
    import threading
    import warnings

    filters, levels = list(warnings.filters), [logging.getLogger(n).level for n in ("torch.onnx", "onnxscript")]
    errors = []

    def go(k):
        try:
            torch.manual_seed(k)
            export_model(create_model("baseline", **SMALL["baseline"]), tmp_path / f"m{k}.pt2", format="torch-export")
        except Exception as e:
            errors.append(e)
    threads = [threading.Thread(target=go, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and sorted(p.name for p in tmp_path.iterdir()) == ["m0.pt2", "m1.pt2"], errors
    assert warnings.filters == filters
    assert [logging.getLogger(n).level for n in ("torch.onnx", "onnxscript")] == levels


def test_the_metadata_says_only_what_the_checkpoint_knows(tmp_path):
    """What an exported file says of its model: the classes only when they are as many as its outputs, the data set
    only when the checkpoint names it, each input as it is (a review found ten digit names on a 5-class model, a
    model with no data set labelled MNIST, and a generator's noise called pixels / 255)."""
    import json

    from capsnet.checkpoint import Checkpoint
    from capsnet.data.tasks import dataset_stem
    from capsnet.export import metadata_of

    def meta(name, dataset=None, **config):
        cfg = create_model(name, **SMALL[name], **config).config.to_dict()
        return metadata_of(name, Checkpoint(name, cfg, {} if dataset is None else {"dataset": dataset}, {}, {}))

    digits = meta("baseline", "mnist")
    assert json.loads(digits["capsnet.classes"]) == [str(k) for k in range(10)] and digits["capsnet.dataset"] == "mnist"
    assert digits["capsnet.input"] == "float32 in [0, 1], as capsnet trains on (the pixels / 255)"
    assert "capsnet.classes" not in meta("baseline", "mnist", num_classes=5)
    assert json.loads(meta("baseline", "fashion-mnist")["capsnet.classes"])[0] == "T-shirt/top"
    assert set(meta("baseline")) == {"capsnet.version", "capsnet.model"}  # no data set: nothing of one guessed
    assert "centre-cropped to 24x24 and standardised" in meta("capsnet-cifar10", "cifar10")["capsnet.input"]
    # the noise capsnet generate makes its images from (it said model.noise(batch, seed): row i for map i, which
    # generate has not used since 2026-11-28; a review, 2026-12-02)
    assert ("noise: float32, standard normal (capsnet generate --seeds S gives every map row 0 of model.noise(1, S)"
            in metadata_of("capspix2pix", None)["capsnet.input"])
    # a run's binary label maps: 0 or 1, as capsnet generate reads a folder of 0/1 PNGs (as 0/255 first: the file's
    # metadata said pixels / 255 alone, which left such maps all but black); graded maps: the pixels / 255
    cfg = create_model("capspix2pix", **SMALL["capspix2pix"]).config.to_dict()
    for state, said in (({"label_maps": "binary"}, "as capsnet generate reads it: binary maps are 0 or 1"),
                        ({"label_maps": "graded"}, "label_maps: float32 in [0, 1] (the pixels / 255); noise")):
        got = metadata_of("capspix2pix", Checkpoint("capspix2pix", cfg, {"dataset": "mnist-skeleton"}, state, {}))
        assert said in got["capsnet.input"], got
    assert "capsnet.classes" not in meta("segcaps-r1", "mnist-segmentation")
    (tmp_path / "cafes").mkdir()
    (tmp_path / "pets").symlink_to(tmp_path / "cafes")
    assert dataset_stem(f"classes:{tmp_path / 'pets'}") == "classes-pets"  # the name given, stable once it is gone


def test_the_reported_difference_is_the_largest_over_every_output():
    """The check's figure is the worst output's difference, not the last output's (which passed every test: mutation
    testing, 2026-12-02); a difference past the tolerance in any output is refused by name."""
    from types import SimpleNamespace

    from capsnet.export import _compare

    traced = SimpleNamespace(module=SimpleNamespace(output_names=("logits", "poses")), label="model")
    expected = (torch.zeros(2, 3), torch.zeros(2, 4))
    got = [torch.full((2, 3), 2e-5), torch.full((2, 4), 1e-6)]
    assert _compare(traced, got, expected, "onnxruntime") == pytest.approx(2e-5)
    with pytest.raises(ExportError, match="differs from the PyTorch model by .* in logits"):
        _compare(traced, [torch.ones(2, 3), got[1]], expected, "onnxruntime")


def test_export_refuses_switches_and_batches_that_read_as_something_else(tmp_path):
    """A review of the Python API (2026-12-02): any_size="no" read as True (refused as "export it without
    --any-size"), example_batch=2.5 met torch's "rand() received an invalid combination of arguments", and
    which="worst" with a model (not a checkpoint) was taken and ignored where a non-default weights is refused."""
    from capsnet.export import ExportError, export_model, trace_model
    from capsnet.models import create_model

    model = create_model("capsnet", conv1_channels=16, primary_types=4)
    for kwargs, message in (({"any_size": "no"}, "any_size must be True or False, got 'no'"),
                            ({"example_batch": 2.5}, r"example_batch must be an integer of at least 2 .* got 2.5"),
                            ({"example_batch": "3"}, "got '3'"), ({"example_batch": True}, "got True")):
        with pytest.raises(ValueError, match=message):
            trace_model(model, **kwargs)
    with pytest.raises(ValueError, match="any_size must be True or False, got 1"):
        export_model(model, tmp_path / "m.onnx", any_size=1)
    with pytest.raises(ExportError, match=r"which='worst' picks a run's checkpoint; this source is not a checkpoint "
                                          r"but CapsNet"):
        export_model(model, tmp_path / "m.onnx", which="worst")
    assert not list(tmp_path.iterdir())
