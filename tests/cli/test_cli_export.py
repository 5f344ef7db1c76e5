"""`capsnet export`: the shared trained CapsNet as ONNX (run by onnxruntime on real MNIST test digits) and as a
torch.export program, each equal to the PyTorch model at batch sizes 1 and 7; the command's refusals."""
from __future__ import annotations

import json
import shutil
import sys

import onnxruntime  # a test dependency (pyproject's test extra): a missing one fails here, it is not skipped
import pytest
import torch

from capsnet.data.tasks import load_test
from capsnet.evaluate import load_model
from cli_helpers import in_process


def assert_clean_error(r, *fragments):
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    for f in fragments:
        assert f in r.stderr, r.stderr


@pytest.fixture(scope="module")
def digits(data_root):
    """The first 7 real MNIST test digits, as the model takes them: (7, 1, 28, 28) float in [0, 1]."""
    return load_test("mnist", size=7, extras=False, root=data_root, progress=False).to("cpu").images


def expected(run, which, images):
    model, _ = load_model(run, which=which)
    with torch.no_grad():
        out = model.eval()(images)
    return [out.lengths, out.poses, out.reconstructions]


def assert_close(got, want):
    for g, w in zip(got, want, strict=True):
        g = torch.as_tensor(g)
        assert g.shape == w.shape and (g - w).abs().max().item() <= 1e-4, (g - w).abs().max().item()


@pytest.mark.e2e
def test_export_onnx_runs_in_onnxruntime_like_the_model(trained_run, digits, tmp_path, capfd):
    out = tmp_path / "capsnet.onnx"
    r = in_process(capfd, "export", "--checkpoint", trained_run, "--format", "onnx", "--out", out)
    assert r.returncode == 0, r.stderr
    # read at the descriptors: onnxruntime's check printed its optimiser's warnings ("Could not find a CPU kernel and
    # hence can't constant fold CastLike node") in yellow on every export
    assert "onnxruntime" not in r.stderr and "CastLike" not in r.stderr, r.stderr
    size = out.stat().st_size
    assert f"wrote {out} ({size / 1e6:.1f} MB, ONNX, opset " in r.stdout and "of capsnet, from " in r.stdout
    for line in ("input   images          float32 (batch, 1, 28, 28)", "output  lengths         float32 (batch, 10)",
                 "output  poses           float32 (batch, 10, 16)",
                 "output  reconstruction  float32 (batch, 1, 28, 28)", "checked: onnxruntime"):
        assert line in r.stdout, r.stdout
    session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    meta = session.get_modelmeta().custom_metadata_map  # what a runtime reads of the file: the model and its classes
    assert (meta["capsnet.model"], meta["capsnet.dataset"]) == ("capsnet", "mnist")
    assert json.loads(meta["capsnet.classes"]) == [str(k) for k in range(10)]
    assert meta["capsnet.input"].startswith("float32 in [0, 1]")
    assert "classes (index k of lengths): 0, 1, 2, 3, 4, 5, 6, 7, 8, 9 (in the file's metadata)" in r.stdout
    assert [i.name for i in session.get_inputs()] == ["images"]
    assert [o.name for o in session.get_outputs()] == ["lengths", "poses", "reconstruction"]
    for images in (digits[:1], digits):  # one file, batches of 1 and 7
        got = session.run(None, {"images": images.numpy()})
        want = expected(trained_run, "best", images)
        assert_close(got, want)
        assert (torch.from_numpy(got[0]).argmax(1) == want[0].argmax(1)).all()


@pytest.mark.e2e
def test_export_torch_program_beside_the_checkpoint(trained_run, digits, tmp_path, capsys):
    shutil.copy(trained_run / "last.safetensors", tmp_path)  # the shared run stays read-only
    r = in_process(capsys, "export", "--checkpoint", tmp_path, "--which", "last", "--format", "torch-export")
    assert r.returncode == 0, r.stderr
    assert f"wrote {tmp_path / 'last.pt2'} (" in r.stdout and "torch.export program" in r.stdout
    # seconds of tracing and checking are said first, on stderr (the report alone on stdout)
    assert r.stderr.startswith(f"exporting {tmp_path} as a torch.export program: tracing the model, then checking")
    # a refusal is said alone: the line came first, then "error: ..." as if the export had begun
    r = in_process(capsys, "export", "--checkpoint", tmp_path, "--which", "last", "--out", tmp_path / "no" / "x.onnx")
    assert r.returncode == 2 and "exporting" not in r.stderr and "the folder" in r.stderr, r.stderr
    r = in_process(capsys, "export", "--checkpoint", tmp_path, "--which", "last", "--any-size", "--out",
                   tmp_path / "x.onnx")  # trace_model's refusal too
    assert r.returncode == 2 and "exporting" not in r.stderr and "takes images of one size only" in r.stderr, r.stderr
    extra = {"capsnet.json": ""}
    program = torch.export.load(str(tmp_path / "last.pt2"), extra_files=extra).module()
    assert json.loads(json.loads(extra["capsnet.json"])["capsnet.classes"]) == [str(k) for k in range(10)]
    for images in (digits[:1], digits):
        with torch.no_grad():
            assert_close(program(images), expected(trained_run, "last", images))


def test_a_shipped_model_exports_into_the_working_folder_not_into_the_package(trained_run, tmp_path, capsys,
                                                                              monkeypatch):
    from capsnet import pretrained

    shelf, work = tmp_path / "package", tmp_path / "work"
    work.mkdir()
    shelf.mkdir()
    pretrained.pack(trained_run, shelf / "tiny.safetensors")
    monkeypatch.setattr(pretrained, "_dir", lambda: shelf)  # the installed package's folder, here a copy
    monkeypatch.chdir(work)
    r = in_process(capsys, "export", "--checkpoint", "pretrained:tiny", "--format", "torch-export")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in work.iterdir()) == ["tiny.pt2"] and sorted(p.name for p in shelf.iterdir()) == [
        "tiny.safetensors"]


def test_export_refusals(trained_run, tmp_path, capsys, monkeypatch):
    r = in_process(capsys, "export", "--checkpoint", trained_run, "--format", "tflite", "--out", tmp_path / "m")
    assert_clean_error(r, "invalid choice: 'tflite'", "'onnx'", "'torch-export'")
    r = in_process(capsys, "export", "--checkpoint", trained_run, "--opset", "17", "--out", tmp_path / "m.onnx")
    assert_clean_error(r, "--opset: must be an integer >= 18, got 17")
    r = in_process(capsys, "export", "--checkpoint", trained_run, "--format", "torch-export", "--opset", "18",
                   "--out", tmp_path / "m.pt2")
    assert_clean_error(r, "--opset applies to --format onnx only")
    # a file named for the other format was written in this one (x.pt2 holding ONNX), readable as neither
    r = in_process(capsys, "export", "--checkpoint", trained_run, "--out", tmp_path / "m.pt2")
    assert_clean_error(r, "--out", "m.pt2 has the suffix of --format torch-export (.pt2), not of onnx: use --format "
                       "torch-export, or name the file m.onnx")
    r = in_process(capsys, "export", "--checkpoint", trained_run, "--format", "torch-export", "--out", tmp_path / "m.ONNX")
    assert_clean_error(r, "has the suffix of --format onnx (.onnx), not of torch-export")
    r = in_process(capsys, "export", "--checkpoint", tmp_path / "nothing-here", "--out", tmp_path / "m.onnx")
    assert_clean_error(r, "capsnet export: error: checkpoint", "does not exist")
    r = in_process(capsys, "export", "--checkpoint", trained_run, "--out", trained_run / "best.safetensors")
    assert_clean_error(r, "best.safetensors is the checkpoint itself: give another --out")
    monkeypatch.setitem(sys.modules, "onnx", None)  # as if not installed
    r = in_process(capsys, "export", "--checkpoint", trained_run, "--out", tmp_path / "m.onnx")
    assert_clean_error(r, "capsnet export: error: ONNX export needs the onnx package: pip install 'capsnet[export]'")
    assert list(tmp_path.iterdir()) == []
    r = in_process(capsys, "export", "--help")
    assert r.returncode == 0 and "--format {onnx,torch-export}" in r.stdout
