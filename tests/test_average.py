"""The moving average of the weights (capsnet.average, TrainConfig.ema_decay) in both training loops: its formula
against values computed by hand, a run's trajectory unchanged by it, the average in both checkpoints, the training
weights kept for an exact resume, and the refusals."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from torch import nn

from capsnet import gan
from capsnet import train as train_module
from capsnet.average import WeightAverage, training_weights, with_training_weights, without_training_weights
from capsnet.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from capsnet.cli import main
from capsnet.gan import fit_gan
from capsnet.models import CapsNetConfig, Pix2pixConfig, create_model
from capsnet.train import TrainConfig, fit
from cli_helpers import in_process

TINY = TrainConfig(dataset="mnist-skeleton", epochs=2, batch_size=8, train_size=16, test_size=4, lr=2e-4)
SMALL = Pix2pixConfig(base_channels=4, disc_channels=4)  # batch norm in the generator: buffers are averaged too


def test_the_average_follows_tensorflows_warm_up_by_hand():
    layer = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        layer.weight.fill_(2.0)
    average = WeightAverage(layer, 0.9)
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
    average = WeightAverage(layer, 0.5)
    with torch.no_grad():
        layer.weight.fill_(1.0)
    average.update(1000)  # (1 + t) / (10 + t) = 0.991 > 0.5: the decay holds
    assert average.average[0].item() == pytest.approx(0.5)


def test_applied_swaps_the_average_in_and_the_weights_back_even_after_an_error():
    net = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    average = WeightAverage(net, 0.99)
    own = {k: v.clone() for k, v in net.state_dict().items()}
    with torch.no_grad():
        for t in average.average:
            t.add_(1.0)
    inside = []
    with pytest.raises(RuntimeError, match="the body failed"):
        with average.applied():
            assert torch.equal(net[0].weight, own["0.weight"] + 1)
            assert torch.equal(net[1].running_var, own["1.running_var"] + 1)  # float buffers are averaged
            inside.append(True)
            raise RuntimeError("the body failed")
    assert inside  # the error was the body's, raised with the average in place
    for k, v in net.state_dict().items():
        assert torch.equal(v, own[k]), k
    assert len(average.tensors) == 6  # weight, bias, BN weight, bias, running mean, var; not num_batches_tracked


def test_a_decay_outside_0_1_is_refused():
    with pytest.raises(ValueError, match="decay must lie in"):
        WeightAverage(nn.Linear(1, 1), 1.0)
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
    kept = training_weights(avg.optimizer_state)
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
    # load_model(weights="training") (eval --weights training): the generator the run trained, the plain run's
    from capsnet.evaluate import load_model

    trained, _ = load_model(tmp_path / "avg", which="last", weights="training")
    assert all(torch.equal(t, plain.model_state[k]) for k, t in trained.state_dict().items())


def test_an_averaged_run_resumes_exactly(tmp_path, data_root):
    cfg = replace(TINY, ema_decay=0.9)
    fit_gan(SMALL, cfg, tmp_path / "straight", device="cpu", data_root=data_root, progress=False)
    fit_gan(SMALL, replace(cfg, epochs=1), tmp_path / "split", device="cpu", data_root=data_root, progress=False)
    fit_gan(SMALL, cfg, tmp_path / "split", device="cpu", data_root=data_root, progress=False, resume=True)
    a, b = load_checkpoint(tmp_path / "straight", "last"), load_checkpoint(tmp_path / "split", "last")
    for k in a.model_state:
        assert torch.equal(a.model_state[k], b.model_state[k]), k
    for x, y in zip(training_weights(a.optimizer_state), training_weights(b.optimizer_state), strict=True):
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
    with pytest.raises(CheckpointError, match="holds no training weights that fit this model"):
        fit_gan(SMALL, replace(TINY, epochs=2, ema_decay=0.9), run, device="cpu", data_root=data_root,
                progress=False, resume=True)
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before


CAPS = CapsNetConfig(conv1_channels=8, primary_types=2, decoder_hidden=(32, 64))
CLASSIFY = TrainConfig(dataset="mnist-sample", epochs=2, batch_size=32, train_size=96, test_size=64, seed=3)


def test_an_averaged_classifier_trains_as_a_plain_one_and_saves_the_average(tmp_path, monkeypatch, capsys):
    fit(CAPS, CLASSIFY, tmp_path / "plain", device="cpu", progress=False)
    seen: list[list[torch.Tensor]] = []
    make = train_module.make_optimizer

    def recording(model, cfg, device):  # the weights after every optimizer step, as the loop leaves them
        opt = make(model, cfg, device)
        opt.register_step_post_hook(lambda *_: seen.append([p.detach().clone() for p in model.parameters()]))
        return opt
    monkeypatch.setattr(train_module, "make_optimizer", recording)
    fit(CAPS, replace(CLASSIFY, ema_decay=0.7), tmp_path / "avg", device="cpu", progress=False)
    plain, avg = load_checkpoint(tmp_path / "plain", "last"), load_checkpoint(tmp_path / "avg", "last")
    assert [r["train_loss"] for r in plain.state["history"]] == [r["train_loss"] for r in avg.state["history"]]
    assert len(seen) == 6  # 3 steps an epoch
    torch.manual_seed(CLASSIFY.seed)
    model = create_model("capsnet", **CAPS.to_dict())
    names = [n for n, _ in model.named_parameters()]
    expected = [p.detach().double() for p in model.parameters()]
    for t, weights in enumerate(seen):
        d = min(0.7, (1 + t) / (10 + t))
        expected = [d * e + (1 - d) * w.double() for e, w in zip(expected, weights)]
    for name, e, last in zip(names, expected, seen[-1]):
        assert torch.allclose(avg.model_state[name].double(), e, atol=1e-6), name
        assert torch.equal(plain.model_state[name], last), name  # the plain run saved its last weights
    kept = training_weights(avg.optimizer_state)
    assert all(torch.equal(w, plain.model_state[n]) for n, w in zip(names, kept))
    # the scores are the average's: eval of the saved checkpoint gives the recorded test figure
    from capsnet.data.tasks import load_test
    from capsnet.evaluate import evaluate_split, load_model

    test = load_test("mnist-sample", size=CLASSIFY.test_size, progress=False).to("cpu")
    saved, _ = load_model(tmp_path / "avg", which="last", device="cpu")
    assert evaluate_split(saved, test)[""].accuracy == avg.state["history"][-1]["test_accuracy"]
    # its training weights (eval --weights training) are the plain run: its weights, and its recorded test figure
    trained, _ = load_model(tmp_path / "avg", which="last", device="cpu", weights="training")
    assert all(torch.equal(t, plain.model_state[k]) for k, t in trained.state_dict().items())
    r = in_process(capsys, "eval", "--checkpoint", tmp_path / "avg", "--which", "last", "--weights", "training",
                   "--test-size", CLASSIFY.test_size, "--no-progress")
    assert r.returncode == 0, r.stderr
    assert "(the run's training weights, not the average it saved as its model)" in r.stdout
    report = json.loads((tmp_path / "avg" / f"eval-last-n{CLASSIFY.test_size}-training-weights.json").read_text())
    assert report["weights"] == "training" and report["accuracy"] == plain.state["history"][-1]["test_accuracy"]
    assert report["accuracy"] != avg.state["history"][-1]["test_accuracy"]  # so the two figures are told apart
    # a checkpoint without them says why: the best one keeps no optimizer state; a plain run has only its own
    for run, which, why in (("avg", "best", "only a run's last checkpoint keeps them (pass its last.safetensors, or "
                                            "the run directory with --which last)"),
                            ("plain", "last", "its run was not trained with --ema-decay, so the weights it holds "
                                              "are its training weights (leave out --weights training)")):
        r = in_process(capsys, "eval", "--checkpoint", tmp_path / run, "--which", which, "--weights", "training",
                       "--no-progress")
        assert r.returncode != 0 and why in r.stderr and "holds no training weights beside an average" in r.stderr
    # a packed copy: the advice was --which last, which a file refuses; packing keeps the average alone
    from capsnet.pretrained import pack

    packed = pack(tmp_path / "avg", tmp_path / "packed.safetensors")
    r = in_process(capsys, "eval", "--checkpoint", packed, "--weights", "training", "--no-progress")
    assert r.returncode != 0 and "a packed or shipped checkpoint keeps the average alone; score the run's " \
        "last.safetensors" in r.stderr, r.stderr
    assert sorted(p.name for p in (tmp_path / "plain").glob("eval-*")) == []


def test_an_averaged_classifier_resumes_exactly(tmp_path):
    cfg = replace(CLASSIFY, ema_decay=0.9)
    fit(CAPS, cfg, tmp_path / "straight", device="cpu", progress=False)
    fit(CAPS, replace(cfg, epochs=1), tmp_path / "split", device="cpu", progress=False)
    fit(CAPS, cfg, tmp_path / "split", device="cpu", progress=False, resume=True)
    a, b = load_checkpoint(tmp_path / "straight", "last"), load_checkpoint(tmp_path / "split", "last")
    for k in a.model_state:
        assert torch.equal(a.model_state[k], b.model_state[k]), k
    for x, y in zip(training_weights(a.optimizer_state), training_weights(b.optimizer_state), strict=True):
        assert torch.equal(x, y)
    assert [r["test_accuracy"] for r in a.state["history"]] == [r["test_accuracy"] for r in b.state["history"]]


def test_the_training_weights_round_trip_beside_an_optimizers_state():
    net = nn.Linear(3, 2)
    opt = torch.optim.Adam(net.parameters())
    net(torch.ones(1, 3)).sum().backward()
    opt.step()
    weights = [torch.randn(2, 3), torch.randn(2)]
    both = with_training_weights(opt.state_dict(), weights)
    assert [torch.equal(a, b) for a, b in zip(training_weights(both), weights)] == [True, True]
    assert training_weights(opt.state_dict()) is None
    own = without_training_weights(both)
    assert own["param_groups"] == opt.state_dict()["param_groups"] and own["state"].keys() == {0, 1}
    torch.optim.Adam(net.parameters()).load_state_dict(own)  # loads as Adam's own


def test_a_decay_of_1_is_refused_by_the_cli(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["train", "--model", "capsnet", "--ema-decay", "1", "--out", str(tmp_path / "c")])
    assert "--ema-decay: must be a number in [0, 1) (e.g. 0.999), got 1" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("damage, message", [
    ("missing", "lacks the training weights' entry optim.{i}.value beside its average: the file is damaged"),
    ("nan", "holds NaN or infinite values in training weight 0: the run diverged or the file is damaged"),
    ("int8", "holds training weight 0 as int8 where the model has floating point values: the file is damaged"),
])
def test_damaged_training_weights_are_refused_as_the_models_own_are(tmp_path, capsys, damage, message):
    """Found by a review (2026-11-29): the training weights beside an average skipped load_weights' checks: an entry
    missing raised a bare KeyError through the CLI, NaN or int8 ones loaded without a word."""
    run = tmp_path / "avg"
    fit(CAPS, replace(CLASSIFY, epochs=1, ema_decay=0.9), run, device="cpu", progress=False)
    ckpt = load_checkpoint(run, "last")
    first = next(g for g in ckpt.optimizer_state["param_groups"] if g.get("owner") == "weights")["params"][0]
    entry = ckpt.optimizer_state["state"][first]
    if damage == "missing":
        del ckpt.optimizer_state["state"][first]
    else:
        entry["value"] = entry["value"].mul(float("nan")) if damage == "nan" else entry["value"].to(torch.int8)
    save_checkpoint(run / "last.safetensors", ckpt)
    r = in_process(capsys, "eval", "--checkpoint", run, "--which", "last", "--weights", "training", "--no-progress")
    assert r.returncode == 2 and message.format(i=first) in r.stderr and "Traceback" not in r.stderr
    with pytest.raises(CheckpointError, match="damaged"):  # a resume of the run, too
        fit(CAPS, replace(CLASSIFY, epochs=2, ema_decay=0.9), run, device="cpu", progress=False, resume=True)
