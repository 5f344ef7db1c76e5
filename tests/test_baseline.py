"""The paper's CNN baseline: its size, its shapes, its config, and that it learns real MNIST."""
from __future__ import annotations

import pytest
import torch

from capsnet.data import load_dataset
from capsnet.models import BaselineCNN, BaselineCNNConfig, create_model, model_name
from capsnet.evaluate import load_model
from capsnet.train import TrainConfig, fit


def test_paper_baseline_has_35_4m_parameters():
    # Counted by hand: three 5x5 'same' convolutions 1->256->256->128 keep 28x28, then 28*28*128 -> 328 -> 192 -> 10.
    convs = (1 * 256 * 25 + 256) + (256 * 256 * 25 + 256) + (256 * 128 * 25 + 128)
    fcs = (28 * 28 * 128 * 328 + 328) + (328 * 192 + 192) + (192 * 10 + 10)
    model = BaselineCNN()
    assert sum(p.numel() for p in model.parameters()) == convs + fcs == 35_445_522  # the paper's 35.4M


def test_forward_shapes_and_dropout_only_in_training():
    torch.manual_seed(0)
    model = BaselineCNN(BaselineCNNConfig(channels=(4, 4, 2), hidden=(8, 6), dropout=0.5))
    x = torch.rand(3, 1, 28, 28)
    assert model(x).shape == (3, 10)
    model.eval()
    torch.testing.assert_close(model(x), model(x))
    model.train()
    assert not torch.allclose(model(x), model(x))  # dropout draws differ
    with pytest.raises(ValueError, match=r"expected images \(B, 1, 28, 28\), got \(3, 1, 32, 32\)"):
        model(torch.rand(3, 1, 32, 32))


def test_every_parameter_gets_a_gradient():
    model = BaselineCNN(BaselineCNNConfig(channels=(4, 4, 2), hidden=(8, 6)))
    torch.nn.functional.cross_entropy(model(torch.rand(2, 1, 28, 28)), torch.tensor([1, 7])).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("kwargs,message", [
    ({"kernel": 4}, "kernel must be odd"),
    ({"channels": ()}, "channels and .hidden must be positive"),
    ({"hidden": (8, 0)}, "channels and .hidden must be positive"),
    ({"dropout": 1.0}, r"dropout must be in \[0, 1\)"),
    ({"num_classes": 0}, "num_classes must be a positive integer"),
])
def test_config_rejects_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BaselineCNNConfig(**kwargs)


def test_registry_and_config_round_trip():
    cfg = BaselineCNNConfig(channels=(4, 4, 2), hidden=(8,), dropout=0.25)
    assert model_name(cfg) == "baseline"
    assert BaselineCNNConfig.from_dict(cfg.to_dict()) == cfg
    model = create_model("baseline", channels=[4, 4, 2], hidden=[8], dropout=0.25)
    assert model.config == cfg
    with pytest.raises(ValueError, match="unknown BaselineCNNConfig keys"):
        BaselineCNNConfig.from_dict({"chanels": [4]})


def test_small_baseline_learns_real_mnist_and_round_trips_its_checkpoint(tmp_path, data_root):
    cfg = BaselineCNNConfig(channels=(16, 16, 8), hidden=(128, 64), dropout=0.25)
    final = fit(cfg, TrainConfig(dataset="mnist", epochs=3, batch_size=32, train_size=2000, test_size=1000, seed=0),
                tmp_path / "run", device="cpu", data_root=data_root, progress=False)
    assert final["test_accuracy"] >= 0.85
    model, ckpt = load_model(tmp_path / "run", which="last")
    assert isinstance(model, BaselineCNN) and ckpt.model_name == "baseline" and model.config == cfg
    test = load_dataset("mnist", "test", root=data_root)  # the loaded weights score what training measured
    with torch.no_grad():
        logits = model.eval()(test.images[:1000].float().div(255))
    assert (logits.argmax(1) == test.labels[:1000]).float().mean().item() == pytest.approx(final["test_accuracy"])


def test_figures_refuse_a_baseline_checkpoint(tmp_path, data_root, capsys):
    from capsnet.cli import main

    cfg = BaselineCNNConfig(channels=(2, 2, 2), hidden=(4,))
    fit(cfg, TrainConfig(dataset="mnist-sample", epochs=1, batch_size=64, train_size=64, test_size=32), tmp_path / "run",
        device="cpu", progress=False)
    assert main(["figures", "--checkpoint", str(tmp_path / "run"), "--no-progress"]) == 2
    said = capsys.readouterr()
    assert "holds a 'baseline' model; capsnet figures look inside a CapsNet" in said.err
    assert said.out == ""  # not first a note on which of its checkpoints would be drawn (a review, 2026-11-30)
    assert not (tmp_path / "run" / "figures").exists()
