"""The generator's moving average in the GAN loop (capsnet.gan.GeneratorAverage, TrainConfig.ema_decay): its
formula against values computed by hand, a run's trajectory unchanged by it, the average in both checkpoints,
the training weights kept for an exact resume, and the refusals."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import nn

from capsnet import gan
from capsnet.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from capsnet.cli import main
from capsnet.gan import GeneratorAverage, _training_weights, fit_gan
from capsnet.models import Pix2pixConfig
from capsnet.train import TrainConfig, fit

TINY = TrainConfig(dataset="mnist-skeleton", epochs=2, batch_size=8, train_size=16, test_size=4, lr=2e-4)
SMALL = Pix2pixConfig(base_channels=4, disc_channels=4)  # batch norm in the generator: buffers are averaged too


def test_the_average_follows_tensorflows_warm_up_by_hand():
    layer = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        layer.weight.fill_(2.0)
    average = GeneratorAverage(layer, 0.9)
    expected = 2.0
    for t, w in enumerate([4.0, -1.0, 3.0, 0.5, 7.0, 7.0, 7.0, 7.0, 7.0, 7.0, 7.0, 7.0, 7.0, 7.0, 7.0, 7.0, 7.0]):
        with torch.no_grad():
            layer.weight.fill_(w)
        average.update(t)
        d = min(0.9, (1 + t) / (10 + t))  # 0.1, 0.18, 0.25, ... (the cap, reached at t = 80: the next test)
        expected = d * expected + (1 - d) * w
        assert average.average[0].item() == pytest.approx(expected, rel=1e-6), t
    assert layer.weight.item() == 7.0  # the module keeps its own weights


def test_the_decay_caps_the_warm_up():
    layer = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        layer.weight.fill_(0.0)
    average = GeneratorAverage(layer, 0.5)
    with torch.no_grad():
        layer.weight.fill_(1.0)
    average.update(1000)  # (1 + t) / (10 + t) = 0.991 > 0.5: the decay holds
    assert average.average[0].item() == pytest.approx(0.5)


def test_applied_swaps_the_average_in_and_the_weights_back_even_after_an_error():
    net = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    average = GeneratorAverage(net, 0.99)
    own = {k: v.clone() for k, v in net.state_dict().items()}
    with torch.no_grad():
        for t in average.average:
            t.add_(1.0)
    with pytest.raises(RuntimeError):
        with average.applied():
            assert torch.equal(net[0].weight, own["0.weight"] + 1)
            assert torch.equal(net[1].running_var, own["1.running_var"] + 1)  # float buffers are averaged
            raise RuntimeError
    for k, v in net.state_dict().items():
        assert torch.equal(v, own[k]), k
    assert len(average.tensors) == 6  # weight, bias, BN weight, bias, running mean, var; not num_batches_tracked


def test_a_decay_outside_0_1_is_refused():
    with pytest.raises(ValueError, match="decay must lie in"):
        GeneratorAverage(nn.Linear(1, 1), 1.0)
    with pytest.raises(ValueError, match=r"ema_decay must lie in \[0, 1\)"):
        TrainConfig(ema_decay=-0.1)


def _record_weights(monkeypatch) -> list[list[torch.Tensor]]:
    """The generator's averaged tensors after every step of the runs that follow, as the loop leaves them."""
    seen: list[list[torch.Tensor]] = []
    step = gan.gan_step

    def recording(model, *args, **kwargs):
        out = step(model, *args, **kwargs)
        g = model.generator
        seen.append([t.detach().clone() for t in (*g.parameters(), *g.buffers()) if t.is_floating_point()])
        return out
    monkeypatch.setattr(gan, "gan_step", recording)
    return seen


def test_an_averaged_run_trains_as_a_plain_one_and_saves_the_average(tmp_path, data_root, monkeypatch):
    fit_gan(SMALL, TINY, tmp_path / "plain", device="cpu", data_root=data_root, progress=False)
    seen = _record_weights(monkeypatch)
    cfg = replace(TINY, ema_decay=0.8)
    fit_gan(SMALL, cfg, tmp_path / "avg", device="cpu", data_root=data_root, progress=False)
    plain, avg = load_checkpoint(tmp_path / "plain", "last"), load_checkpoint(tmp_path / "avg", "last")
    assert [r["train_l1"] for r in plain.state["history"]] == [r["train_l1"] for r in avg.state["history"]]
    assert len(seen) == 4  # 2 steps an epoch

    # the average by hand, from the initial weights (those of the plain run's start: the same seed)
    from capsnet.models import create_model
    torch.manual_seed(cfg.seed)
    g = create_model("pix2pix", **SMALL.to_dict()).generator
    names = [n for n, t in (*g.named_parameters(), *g.named_buffers()) if t.is_floating_point()]
    expected = [t.detach().clone().double() for t in (*g.parameters(), *g.buffers()) if t.is_floating_point()]
    for t, weights in enumerate(seen):
        d = min(0.8, (1 + t) / (10 + t))
        expected = [d * e + (1 - d) * w.double() for e, w in zip(expected, weights)]
    for name, e in zip(names, expected):
        saved = avg.model_state[f"generator.{name}"]
        assert torch.allclose(saved.double(), e, atol=1e-6), name
        if "running" not in name and name.endswith("weight"):  # the average is not the last weights
            assert not torch.allclose(saved, plain.model_state[f"generator.{name}"]), name
    # the training weights beside the optimizers' state are the plain run's last weights
    kept = _training_weights(avg.optimizer_state)
    assert len(kept) == len(names)
    for name, w in zip(names, kept):
        assert torch.equal(w, plain.model_state[f"generator.{name}"]), name
    # the discriminator is not averaged; the best checkpoint (one evaluation) holds the same average
    for k, v in plain.model_state.items():
        if k.startswith("discriminator."):
            assert torch.equal(v, avg.model_state[k]), k
    best = load_checkpoint(tmp_path / "avg", "best")
    for k, v in avg.model_state.items():
        assert torch.equal(v, best.model_state[k]), k


def test_an_averaged_run_resumes_exactly(tmp_path, data_root):
    cfg = replace(TINY, ema_decay=0.9)
    fit_gan(SMALL, cfg, tmp_path / "straight", device="cpu", data_root=data_root, progress=False)
    fit_gan(SMALL, replace(cfg, epochs=1), tmp_path / "split", device="cpu", data_root=data_root, progress=False)
    fit_gan(SMALL, cfg, tmp_path / "split", device="cpu", data_root=data_root, progress=False, resume=True)
    a, b = load_checkpoint(tmp_path / "straight", "last"), load_checkpoint(tmp_path / "split", "last")
    for k in a.model_state:
        assert torch.equal(a.model_state[k], b.model_state[k]), k
    for x, y in zip(_training_weights(a.optimizer_state), _training_weights(b.optimizer_state), strict=True):
        assert torch.equal(x, y)
    assert [r["test_l1"] for r in a.state["history"]] == [r["test_l1"] for r in b.state["history"]]


def test_a_resume_without_the_training_weights_is_refused_and_writes_nothing(tmp_path, data_root):
    run = tmp_path / "r"
    fit_gan(SMALL, replace(TINY, epochs=1, ema_decay=0.9), run, device="cpu", data_root=data_root, progress=False)
    ckpt = load_checkpoint(run, "last")
    opt = ckpt.optimizer_state
    ckpt.optimizer_state = {"state": opt["state"], "param_groups": [g for g in opt["param_groups"]
                                                                    if g.get("owner") != "weights"]}
    save_checkpoint(run / "last.safetensors", ckpt)
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    with pytest.raises(CheckpointError, match="holds no training weights that fit this generator"):
        fit_gan(SMALL, replace(TINY, epochs=2, ema_decay=0.9), run, device="cpu", data_root=data_root,
                progress=False, resume=True)
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before


def test_the_average_is_for_gans_only(tmp_path, capsys):
    with pytest.raises(ValueError, match="applies to the synthesis models' loop"):
        fit(None, TrainConfig(ema_decay=0.9), tmp_path / "r", device="cpu")
    with pytest.raises(SystemExit):
        main(["train", "--model", "capsnet", "--ema-decay", "0.9", "--out", str(tmp_path / "c")])
    assert "--ema-decay averages a GAN's generator" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["experiment", "multimnist", "--ema-decay", "0.9", "--out", str(tmp_path / "m")])
    assert "--ema-decay does not apply to `capsnet experiment multimnist`" in capsys.readouterr().err
    assert not (tmp_path / "c").exists() and not (tmp_path / "m").exists()
