"""Checkpoints whose metadata or tensors were tampered with: `capsnet eval` and the viewer refuse each in one line."""
from __future__ import annotations

import json
import time

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from capsnet.checkpoint import CheckpointError
from capsnet.cli import main
from capsnet.routing import list_routings
from capsnet.viz import load_viewer


def _tamper(src, dst, *, model_config=None, train_config=None, metadata=None, tensors=None, drop=()):
    """A copy of checkpoint ``src`` at ``dst`` with config fields, metadata entries or tensors replaced, metadata
    entries in ``drop`` left out, as a tool that knows nothing of capsnet's digest writes it (without one: the
    checks below the digest's are what these cases test; test_a_changed_tensor_is_caught_by_the_digest the digest)."""
    with safe_open(str(src), "pt") as f:
        meta, ts = dict(f.metadata()), {k: f.get_tensor(k) for k in f.keys()}
    meta = {k: v for k, v in meta.items() if k not in drop and k != "digest"}
    for key, changes in (("model_config", model_config), ("train_config", train_config)):
        if changes:
            meta[key] = json.dumps(json.loads(meta[key]) | changes)
    meta |= metadata or {}
    save_file(tensors(ts) if tensors else ts, str(dst), metadata=meta)
    return dst


def _replace(name, make):
    return lambda ts: {k: (make(v) if k == name else v) for k, v in ts.items()}


CASES = [  # (which file, changes, what the message must name)
    ("best", {"train_config": {"epochs": "10"}}, "TrainConfig.epochs must be an integer, got '10'"),
    ("best", {"train_config": {"lr": "x"}}, "TrainConfig.lr must be a finite number, got 'x'"),
    ("best", {"train_config": {"lr": None}}, "TrainConfig.lr must be a finite number, got None"),
    # an integer past float's range: an OverflowError traceback before
    ("best", {"train_config": {"lr": 10**400}}, "TrainConfig.lr must be a finite number, got 1000000000"),
    # a newer capsnet's model, or one registered by a user's code: eval said "unknown model 'foo'", as if typed
    ("best", {"metadata": {"model": "foo"}}, "holds a 'foo' model; this capsnet knows capsnet, "),
    # a routing registered by a user's code (or a newer capsnet): "routing must be one of ...; use another
    # checkpoint or retrain", as if the run were damaged (a review, 2026-12-02)
    ("best", {"model_config": {"routing": "mean"}}, "holds a capsnet routed by 'mean', a routing this capsnet does "
     f"not know (it knows {', '.join(list_routings())}); open it with the capsnet that trained it"),
    ("best", {"metadata": {"state": "null"}}, "state must be a JSON object"),
    ("best", {"metadata": {"state": '{"epoch": "2", "step": 7}'}}, "state.epoch must be a non-negative integer"),
    ("best", {"metadata": {"state": '{"epoch": 2, "step": 7, "best": {}}'}},
     "state.best must be null or an object with an integer epoch and a numeric accuracy"),
    ("last", {"metadata": {"optimizer": "{}"}}, "the optimizer entry needs 'param_groups'"),
    ("last", {"tensors": lambda ts: {(k.replace("optim.0.", "optim.x.") if k.startswith("optim.0.") else k): v
                                     for k, v in ts.items()}}, "optimizer state index 'x' is not a parameter index"),
    ("best", {"model_config": {"routing_iterations": 10**9}}, "CapsNetConfig.routing_iterations must be in 1..100"),
    ("best", {"model_config": {"conv1_channels": 10**100}}, "CapsNetConfig.conv1_channels must be in 1..1,048,576"),
    ("best", {"model_config": {"routing_bias": "yes"}}, "CapsNetConfig.routing_bias must be true or false, got 'yes'"),
    ("best", {"tensors": lambda ts: {k: v for k, v in ts.items() if k != "model.conv1.weight"}}, "missing conv1.weight"),
    ("best", {"tensors": _replace("model.conv1.weight", lambda v: v[:, :, :5].contiguous())},
     "holds conv1.weight of shape (16, 1, 5, 9) where its configuration needs (16, 1, 9, 9)"),
    ("best", {"tensors": lambda ts: {k: (v.to(torch.int8) if k.startswith("model.") else v) for k, v in ts.items()}},
     "as int8, not floating point"),
    ("best", {"tensors": _replace("model.digits.weight", lambda v: torch.full_like(v, float("nan")))},
     "NaN or infinite values in digits.weight"),
]


@pytest.mark.parametrize("which,changes,message", CASES, ids=[c[2][:40] for c in CASES])
def test_eval_and_the_viewer_refuse_a_tampered_checkpoint_in_one_line(trained_run, data_root, tmp_path, capsys,
                                                                       which, changes, message):
    bad = _tamper(trained_run / f"{which}.safetensors", tmp_path / "bad.safetensors", **changes)
    start = time.monotonic()
    assert main(["eval", "--checkpoint", str(bad), "--data-dir", str(data_root), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert message in err and str(bad) in err, err
    assert err.startswith("capsnet eval: error:") and err.count("\n") == 1  # one line
    with pytest.raises(CheckpointError, match="bad.safetensors") as info:
        load_viewer(bad, data_dir=data_root, progress=False)
    assert message in str(info.value)
    assert time.monotonic() - start < 30  # refused before any long work (a billion routing rounds, 1e100 channels)
    assert not (tmp_path / "eval-bad.json").exists()


def test_the_viewer_command_exits_2_on_a_tampered_checkpoint(trained_run, tmp_path, capsys):
    bad = _tamper(trained_run / "best.safetensors", tmp_path / "bad.safetensors",
                  model_config={"routing_iterations": 10**9})
    assert main(["viz", "--checkpoint", str(bad), "--port", "0"]) == 2
    assert "routing_iterations must be in 1..100" in capsys.readouterr().err


RESUME_CASES = [  # (the run fixture, changes to last.safetensors as _tamper takes them, what the message must name)
    ("trained_run", {"tensors": _replace("rng.torch", lambda v: v[:100].contiguous())},
     "random state rng.torch is torch.uint8 of shape (100,) where this PyTorch's is torch.uint8 of shape (5056,)"),
    ("trained_run", {"tensors": _replace("rng.torch", lambda v: v.float())}, "random state rng.torch is torch.float32"),
    ("trained_run", {"tensors": _replace("optim.0.exp_avg", lambda v: v.flatten()[:5].contiguous())},
     "optimizer state exp_avg of parameter 0 has shape (5,) where the parameter has (16, 1, 9, 9)"),
    ("gan_run", {"tensors": _replace("optim.3.exp_avg_sq", lambda v: torch.zeros(7))},
     "optimizer state exp_avg_sq of parameter 3"),
    ("trained_run", {"tensors": _replace("optim.0.exp_avg", lambda v: v.flatten()[0].clone())},
     "optimizer state exp_avg of parameter 0 has shape () where the parameter has (16, 1, 9, 9)"),
    ("trained_run", {"tensors": _replace("optim.0.step", lambda v: torch.zeros(2))},
     "optimizer state step of parameter 0 has shape (2,) where a step count is one number"),
    ("trained_run", {"tensors": lambda ts: {k: v for k, v in ts.items() if not k.startswith("optim.")},
                     "drop": ("optimizer",)},
     "it holds no optimizer state (a best.safetensors, or a file saved for inference: only last.safetensors resumes)"),
]


@pytest.mark.parametrize("fixture,changes,message", RESUME_CASES, ids=[c[2][:40] for c in RESUME_CASES])
def test_a_resume_refuses_a_damaged_optimizer_or_random_state_before_training(request, data_root, tmp_path, capsys,
                                                                              fixture, changes, message):
    """Before: the random state raised PyTorch's own RuntimeError or TypeError, a missing optimizer state a
    TypeError, and a moment of the wrong shape was only found by the first step's arithmetic, after the data was
    loaded."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(request.getfixturevalue(fixture), run)
    _tamper(run / "last.safetensors", run / "damaged.safetensors", **changes)
    (run / "damaged.safetensors").replace(run / "last.safetensors")
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    assert main(["train", "--resume", "--epochs", "3", "--out", str(run), "--device", "cpu",
                 "--data-dir", str(data_root), "--no-progress"]) == 2
    said = capsys.readouterr()
    err = said.err
    assert message in err and f"checkpoint {run / 'last.safetensors'} cannot be resumed" in err, err
    if "no optimizer state" in message:  # a best copied over last: refused before "resuming the run in" is printed
        assert "resuming" not in said.out, said.out  # (a review, 2026-12-01)
    assert err.startswith("capsnet train: error:") and err.count("\n") == 1
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before  # nothing written


def test_a_changed_tensor_is_caught_by_the_digest(trained_run, data_root, tmp_path, capsys):
    """A finite change to one weight (a bit flipped on disk, a weight edited in place) loaded and scored as if
    nothing had happened; the digest saved with the tensors finds it. Files without a digest still load."""
    import shutil

    from capsnet.checkpoint import load_checkpoint, tensor_digest

    good = trained_run / "best.safetensors"
    with safe_open(str(good), "pt") as f:
        meta = dict(f.metadata())
        assert meta["digest"] == tensor_digest({k: f.get_tensor(k) for k in f.keys()})  # independently recomputed
    bad = tmp_path / "bad.safetensors"
    shutil.copy(good, bad)
    data = bytearray(bad.read_bytes())
    data[-3] ^= 0x01  # one bit of the last tensor's last bytes: a finite value still
    bad.write_bytes(bytes(data))
    with safe_open(str(bad), "pt") as f:
        assert all(torch.isfinite(f.get_tensor(k).float()).all() for k in f.keys())
    assert main(["eval", "--checkpoint", str(bad), "--data-dir", str(data_root), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err == (f"capsnet eval: error: checkpoint {bad} is damaged: its tensors do not match the digest saved with "
                   f"them (the file changed after it was written); use another checkpoint or retrain (weights changed "
                   f"on purpose: save them with capsnet.checkpoint.save_checkpoint)\n")
    assert not (tmp_path / "eval-bad.json").exists()
    # without the digest (a file from before it, the shipped models) the same tensors load
    unchecked = _tamper(bad, tmp_path / "unchecked.safetensors")
    assert load_checkpoint(unchecked).model_state.keys() == load_checkpoint(good).model_state.keys()
    # saved again through capsnet: a new digest, and it loads
    from capsnet.checkpoint import save_checkpoint

    ckpt = load_checkpoint(unchecked)
    save_checkpoint(tmp_path / "resaved.safetensors", ckpt)
    assert load_checkpoint(tmp_path / "resaved.safetensors").model_state.keys() == ckpt.model_state.keys()


def test_a_configuration_describing_a_far_larger_network_is_refused_before_it_is_built(trained_run, data_root,
                                                                                       tmp_path, capsys):
    """A 6 MB checkpoint whose config asks for a decoder of 30,000 x 30,000 units (3.6 GB of weights): eval, the
    viewer and a resume allocated and initialised all of it before the shapes were compared (or died in the
    allocator under a memory limit). Its tensors are now checked against the model built on the meta device."""
    import resource
    import shutil

    bad = _tamper(trained_run / "best.safetensors", tmp_path / "bad.safetensors",
                  model_config={"decoder_hidden": [30000, 30000]})
    message = "holds decoder.net.0.weight of shape (64, 160) where its configuration needs (30000, 160)"
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    assert main(["eval", "--checkpoint", str(bad), "--data-dir", str(data_root), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    with pytest.raises(CheckpointError, match="needs \\(30000, 160\\)"):
        load_viewer(bad, data_dir=data_root, progress=False)
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    _tamper(trained_run / "last.safetensors", run / "last.safetensors", model_config={"decoder_hidden": [30000, 30000]})
    assert main(["train", "--resume", "--epochs", "3", "--out", str(run), "--device", "cpu",
                 "--data-dir", str(data_root), "--no-progress"]) == 2
    assert message in capsys.readouterr().err
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 1_000_000  # not 3.6 GB more (KiB)


@pytest.mark.parametrize("key, value, said", [
    ("betas", ["a", "b"], "has betas ['a', 'b'] where Adam takes two numbers in [0, 1)"),
    ("betas", [2], "has betas [2] where Adam takes two numbers in [0, 1)"),
    ("eps", None, "has eps None where a finite number >= 0 belongs"),
    ("weight_decay", "x", "has weight_decay 'x' where a finite number >= 0 belongs"),
    ("amsgrad", "yes", "has amsgrad 'yes' where true, false or null belongs"),
    ("lr", 10 ** 400, "has lr 1000000000"),  # past float's range: an OverflowError while checking it
])
def test_a_resume_refuses_damaged_optimizer_settings_before_training(trained_run, data_root, tmp_path, capsys, key,
                                                                     value, said):
    """An optimizer's param_groups settings in last.safetensors replaced by wrong types: resume began and Adam's
    step raised TypeError tracebacks (or "not enough values to unpack", naming no file) (found by fuzzing)."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    with safe_open(str(trained_run / "last.safetensors"), "pt") as f:
        optimizer = json.loads(f.metadata()["optimizer"])
    for group in optimizer["param_groups"]:
        group[key] = value
    _tamper(trained_run / "last.safetensors", run / "last.safetensors", metadata={"optimizer": json.dumps(optimizer)})
    assert main(["train", "--resume", "--epochs", "3", "--out", str(run), "--device", "cpu",
                 "--data-dir", str(data_root), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"checkpoint {run / 'last.safetensors'} cannot be resumed: its optimizer's parameter group 0 {said}" \
        in err and err.count("\n") == 1, err
