"""--amp fp16: training steps under float16 autocast with a gradient scaler (steps whose gradient is not finite are
skipped and counted), saved with the run and resumed, stopped when no scale gives a finite gradient."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import sys

import pytest
import torch

from capsnet import cli
from capsnet.checkpoint import load_checkpoint
from capsnet.models import CapsNetConfig, model_spec
from capsnet.runtime import grad_scaler
from capsnet.train import MIN_LOSS_SCALE, NonFiniteLoss, TrainConfig, fit, lr_at, stop_if_scale_fell

TINY = CapsNetConfig(conv1_channels=8, primary_types=2, decoder_hidden=(32, 64))
CFG = TrainConfig(dataset="mnist-sample", epochs=2, batch_size=32, train_size=160, test_size=64, seed=3, amp="fp16")


def _with(**changes) -> TrainConfig:
    return TrainConfig(**{**CFG.to_dict(), **changes})


def _records(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _steps_taken() -> tuple[list[int], object]:
    """A list that grows by one at every optimizer step taken: one that moved Adam's step count. The scaler calls
    PyTorch's default Adam for no skipped step, and calls the fused one (capsnet's on the CPU too since 2026-12-02)
    for every step, handing it the overflow found, on which it changes no weight and takes its count back."""
    from_optimizer = sys.modules["torch.optim.optimizer"]
    taken: list[int] = []
    counts: dict[int, int] = {}

    def after(opt, *_):
        first = opt.param_groups[0]["params"][0]
        count = int(opt.state[first]["step"]) if "step" in opt.state.get(first, {}) else 0
        if count > counts.get(id(opt), 0):
            taken.append(1)
        counts[id(opt)] = count
    return taken, from_optimizer.register_optimizer_step_post_hook(after)


def test_grad_scaler_is_enabled_for_fp16_only():
    assert grad_scaler(torch.device("cpu"), "fp16").is_enabled()
    assert not grad_scaler(torch.device("cpu"), "bf16").is_enabled()
    assert not grad_scaler(torch.device("cpu"), "none").is_enabled()
    assert grad_scaler(torch.device("cpu"), "fp16").get_scale() == 2.0 ** 16


def test_a_torch_without_torch_amp_grad_scaler_trains_the_same_and_refuses_fp16_off_cuda(tmp_path, monkeypatch):
    """torch.amp.GradScaler came in torch 2.3; pyproject allows 2.1, whose scaler is torch.cuda.amp's alone: every
    run failed on building the scaler, --amp none too (a review of the minimal install, 2026-12-02)."""
    cfg = _with(amp="none", epochs=1, train_size=64, test_size=32)
    fit(TINY, cfg, tmp_path / "now", device="cpu", progress=False)
    monkeypatch.delattr(torch.amp, "GradScaler")
    with pytest.warns(FutureWarning) if hasattr(torch.cuda.amp, "GradScaler") else contextlib.nullcontext():
        fit(TINY, cfg, tmp_path / "old", device="cpu", progress=False)  # (torch.cuda.amp's is deprecated here)
    now, old = (load_checkpoint(tmp_path / run, "last").model_state for run in ("now", "old"))
    assert now.keys() == old.keys() and all(torch.equal(now[k], old[k]) for k in now)
    with pytest.raises(ValueError, match=r"amp 'fp16' on cpu needs torch 2\.3 or newer .* use 'bf16' or 'none'"):
        grad_scaler(torch.device("cpu"), "fp16")


def test_a_scale_below_the_floor_stops_with_the_way_out():
    scaler = torch.amp.GradScaler("cpu", init_scale=MIN_LOSS_SCALE)
    asked = []

    def kept():
        asked.append("kept")
        return "kept X"
    stop_if_scale_fell(scaler, 3, kept, lambda: asked.append("counts") or (5, 9))  # at the floor: passes
    assert asked == []  # its message's parts (a file's state, a read of the device) asked for only when it stops
    scaler = torch.amp.GradScaler("cpu", init_scale=MIN_LOSS_SCALE / 2)
    with pytest.raises(NonFiniteLoss, match=r"loss scale fell to 7.63e-06 in epoch 3: 5 of its 9 steps so far had a "
                                            r"gradient that was not finite.*kept X.*--amp bf16"):
        stop_if_scale_fell(scaler, 3, kept, lambda: (5, 9))
    stop_if_scale_fell(torch.amp.GradScaler("cpu", init_scale=1e-30, enabled=False), 3, kept, lambda: (5, 9))  # off


class _Killed(Exception):
    pass


def _lr_stopping_at(stop: int):
    """The loops' learning-rate lookup, raising ``_Killed`` (a crash, after the saves so far) at step ``stop``."""
    def stopped(step, *args):
        if step == stop:
            raise _Killed
        return lr_at(step, *args)
    return stopped


def test_fp16_skips_overflowing_steps_counts_them_and_resumes_mid_epoch_with_its_scale(tmp_path, monkeypatch):
    # a start at 2^24 with growth every 2 steps: float16's gradients overflow now and then, those steps are skipped
    monkeypatch.setattr("capsnet.train.grad_scaler",
                        lambda dev, amp: torch.amp.GradScaler(dev.type, init_scale=2.0 ** 24, growth_interval=2))
    cfg = _with(grad_clip=0.05)
    taken, hook = _steps_taken()
    try:
        fit(TINY, cfg, tmp_path / "straight", device="cpu", progress=False, save_every_s=None)
    finally:
        hook.remove()
    records = _records(tmp_path / "straight")
    assert sum(r["skipped_steps"] for r in records) == 10 - len(taken) > 0 and len(taken) > 0  # both kinds happened
    saved = load_checkpoint(tmp_path / "straight", "last").state["grad_scaler"]
    assert records[-1]["loss_scale"] == saved["scale"] < 2.0 ** 24
    assert all(0 < r["grad_norm"] < float("inf") for r in records)  # over the steps taken: no inf, no 0 of a skip
    # every step taken is clipped at 0.05: the share is 1 over the steps taken, not taken / steps (the steps skipped
    # counted in: mutation testing, 2026-12-02)
    assert any(r["skipped_steps"] for r in records) and all(r["clipped"] == 1.0 for r in records)

    monkeypatch.setattr("capsnet.train.lr_at", _lr_stopping_at(7))  # 5 batches an epoch: 2 into epoch 2
    with pytest.raises(_Killed):
        fit(TINY, cfg, tmp_path / "split", device="cpu", progress=False, save_every_s=1e-9)
    monkeypatch.setattr("capsnet.train.lr_at", lr_at)
    saved = load_checkpoint(tmp_path / "split", "last")
    within = saved.state["within"]
    assert len(within["sums"]) == 5 and within["sums"][4] > 0  # loss, correct, norms, steps clipped, steps skipped
    # under torchrun rank 0 alone takes the sums (summed over the ranks), but every rank the skipped steps (for the
    # scale's message: every rank skips the same steps)
    from capsnet.train import _seeded_generator, resume_within

    for rank, kept in ((0, within["sums"]), (1, [0.0] * 4 + within["sums"][4:])):
        got = resume_within(within, 2, saved, _seeded_generator(3, 2, torch.device("cpu")), 5, 5, rank, shared=1)
        assert got[1] == kept and got[2] == (within["seen"] if rank == 0 else 0)
    fit(TINY, cfg, tmp_path / "split", device="cpu", progress=False, resume=True)
    a, b = (load_checkpoint(tmp_path / d, "last").model_state for d in ("straight", "split"))
    assert all(torch.equal(a[k], b[k]) for k in a)  # the scale went on where it was: the same steps skipped
    strip = [{k: v for k, v in r.items() if k != "train_images_per_s"} for r in records]
    again = [{k: v for k, v in r.items() if k != "train_images_per_s"} for r in _records(tmp_path / "split")]
    assert [r.pop("grad_norm") for r in again] == pytest.approx([r.pop("grad_norm") for r in strip])
    assert again == strip


def _with_nan_gradient(monkeypatch, every: int = 1) -> list[int]:
    """Every ``every``-th call of a model's loss (counted from 1) plus a term that is 0 but whose gradient is NaN
    (sqrt at 0, times 0); the list of those calls' numbers, filled as they come."""
    calls, spoilt = [0], []

    def spec_of(name):
        spec = model_spec(name)

        def loss(model, *args, **kwargs):
            value, scores = spec.loss(model, *args, **kwargs)
            calls[0] += 1
            if calls[0] % every == 0:
                spoilt.append(calls[0])
                value = value + (0.0 * sum(p.sum() for p in model.parameters())).sqrt()
            return value, scores
        return spec._replace(loss=loss)
    monkeypatch.setattr("capsnet.train.model_spec", spec_of)
    return spoilt


def test_a_gradient_nan_at_every_scale_stops_fp16_by_its_scale_and_saves_nothing(tmp_path, monkeypatch):
    _with_nan_gradient(monkeypatch)
    # the scaler started 5 halvings above the floor (torch's 2^16 is 40: the same stop, 8 times the steps)
    monkeypatch.setattr("capsnet.train.grad_scaler", lambda dev, amp: torch.amp.GradScaler(
        dev.type, init_scale=2.0 ** -19, enabled=amp == "fp16"))
    cfg = _with(epochs=1, batch_size=8, train_size=40)  # 5 steps, each skipped and the scale halved: 2^-19 to 2^-24
    taken, hook = _steps_taken()
    try:
        with pytest.raises(NonFiniteLoss, match=r"under --amp fp16 the loss scale fell to 5.96e-08 in epoch 1: "
                                                r"5 of its 5 steps so far.*stopped without saving.*--amp bf16"):
            fit(TINY, cfg, tmp_path / "fp16", device="cpu", progress=False)
    finally:
        hook.remove()
    assert taken == [] and not (tmp_path / "fp16" / "last.safetensors").exists()
    # the same run without the scaler takes the NaN step: its weights, then its loss, are NaN from there
    with pytest.raises(NonFiniteLoss, match="training loss became NaN or infinite at step 2"):
        fit(TINY, _with(epochs=1, batch_size=8, train_size=40, amp="none"), tmp_path / "none", device="cpu",
            progress=False)


def test_cli_amp_fp16_reaches_the_training_config(tmp_path, monkeypatch):
    seen = {}
    monkeypatch.setattr("capsnet.train.fit", lambda model_cfg, cfg, out, **kw: seen.update(amp=cfg.amp) or {})
    assert cli.main(["train", "--dataset", "mnist-sample", "--amp", "fp16", "--out", str(tmp_path), "--no-progress"]) == 0
    assert seen == {"amp": "fp16"}


GAN = TrainConfig(dataset="mnist-skeleton", epochs=2, batch_size=8, train_size=16, test_size=4, lr=2e-4, amp="fp16")


def _gan(**changes) -> TrainConfig:
    return TrainConfig(**{**GAN.to_dict(), **changes})


def test_a_gan_run_under_fp16_skips_counts_and_resumes_mid_epoch_with_its_scale(tmp_path, data_root, monkeypatch):
    from capsnet.gan import fit_gan
    from capsnet.models import Pix2pixConfig

    # this small pix2pix's gradients overflow float16 at a scale of 2^12 on these pairs, not at 2^11: from 2^12,
    # doubled after every 3 good steps, some steps are skipped and some taken (the stop below is at a scale of 2^11)
    monkeypatch.setattr("capsnet.gan.grad_scaler",
                        lambda dev, amp: torch.amp.GradScaler(dev.type, init_scale=2.0 ** 12, growth_interval=3))
    model = Pix2pixConfig(base_channels=4, disc_channels=4)
    taken, hook = _steps_taken()
    try:
        fit_gan(model, GAN, tmp_path / "straight", device="cpu", data_root=data_root, progress=False,
                save_every_s=None)
    finally:
        hook.remove()
    records = _records(tmp_path / "straight")
    skipped = sum(r["skipped_steps"] for r in records)
    assert 0 < skipped < 4 and 2 * (4 - skipped) <= len(taken) <= 8 - skipped  # 2 optimizers a step; a skip: 1 or 2
    straight = load_checkpoint(tmp_path / "straight", "last")
    assert records[-1]["loss_scale"] == straight.state["grad_scaler"]["scale"]

    monkeypatch.setattr("capsnet.gan.lr_at", _lr_stopping_at(3))  # 2 batches an epoch: 1 into epoch 2
    with pytest.raises(_Killed):
        fit_gan(model, GAN, tmp_path / "split", device="cpu", data_root=data_root, progress=False, save_every_s=1e-9)
    monkeypatch.setattr("capsnet.gan.lr_at", lr_at)
    assert len(load_checkpoint(tmp_path / "split", "last").state["within"]["sums"]) == 9  # 8 figures, steps skipped
    fit_gan(model, GAN, tmp_path / "split", device="cpu", data_root=data_root, progress=False, resume=True)
    split = load_checkpoint(tmp_path / "split", "last")
    assert all(torch.equal(straight.model_state[k], split.model_state[k]) for k in straight.model_state)
    keep = ("skipped_steps", "loss_scale", "train_l1", "train_d_loss")
    assert [[r[k] for k in keep] for r in _records(tmp_path / "split")] == [[r[k] for k in keep] for r in records]


def test_a_gan_run_whose_scale_falls_below_the_floor_stops_and_saves_nothing(tmp_path, data_root, monkeypatch):
    from capsnet.gan import fit_gan
    from capsnet.models import Pix2pixConfig

    # an overflow at 2^16 (as above) and a backoff of 2^-40: the scale is 2^-24 after the first skipped step
    monkeypatch.setattr("capsnet.gan.grad_scaler",
                        lambda dev, amp: torch.amp.GradScaler(dev.type, backoff_factor=2.0 ** -40))
    with pytest.raises(NonFiniteLoss, match=r"loss scale fell to 5.96e-08 in epoch 1: 1 of its 2 steps.*no checkpoint "
                                                r"was written"):
        fit_gan(Pix2pixConfig(base_channels=4, disc_channels=4), GAN, tmp_path / "r", device="cpu",
                data_root=data_root, progress=False)
    assert not (tmp_path / "r" / "last.safetensors").exists()


def test_the_benchmark_runner_steps_under_the_autocast_it_is_given():
    """The experiments' peak memory of an fp16 run is measured under float16 autocast (it was measured in fp32)."""
    from capsnet.bench import _Runner

    class Probe(torch.nn.Linear):
        def forward(self, x):
            seen.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None)
            return super().forward(x.flatten(1))
    seen = []
    images, labels = torch.rand(2, 1, 2, 2), torch.tensor([0, 1])
    for flags in ({}, {"bf16": True}, {"fp16": True}):
        _Runner(Probe(4, 2), "train", images, labels, 1e-3, loss_fn=lambda m, x, y, *a, **k: (m(x).sum(), None),
                **flags).time_step()
    assert seen == [None, torch.bfloat16, torch.float16]
    with pytest.raises(ValueError, match="bf16 and fp16 are two autocasts: give one"):
        _Runner(Probe(4, 2), "train", images, labels, 1e-3, bf16=True, fp16=True)


@pytest.mark.parametrize("name", [n for n, s in __import__("capsnet.models", fromlist=["MODELS"]).MODELS.items()
                                  if s.kind != "synthesis"])
def test_every_classifier_and_segmentation_step_is_finite_under_float16_autocast(name):
    """A forward that overflowed float16 (a sum past 65,504) would give an infinite loss, which --amp fp16 stops on
    rather than skips: every classifier's and segmentation model's loss and gradients are finite under float16
    autocast at a scale of 1 (measured finite at the registered full sizes too, on noise, 2026-12-01)."""
    from capsnet.models import MODELS, create_model
    from test_models_registry import SMALL, _inputs

    torch.manual_seed(0)
    side = 28 if MODELS[name].kind == "classification" else 16
    extra = {"num_classes": 10} if MODELS[name].kind == "classification" else {}
    model = create_model(name, **SMALL[name], **extra, input_height=side, input_width=side).train()
    images, targets = _inputs(model, 4)
    with torch.autocast("cpu", dtype=torch.float16):
        loss, scores = MODELS[name].loss(model, images, targets, recon_weight=0.0005, progress=0.5)
    assert loss.dtype == torch.float32 and torch.isfinite(loss) and torch.isfinite(scores.float()).all()
    loss.backward()
    for n, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), n


def test_a_nan_that_recurs_one_step_in_three_stops_with_the_steps_counted(tmp_path, monkeypatch):
    """Each skipped step halves the scale and only 2,000 finite ones in a row double it: a NaN gradient one batch in
    three lowers it for good. The message counts the skipped steps (counted here as the NaN terms added) rather than
    saying every step was skipped."""
    spoilt = _with_nan_gradient(monkeypatch, every=3)
    with pytest.raises(NonFiniteLoss, match=r"in epoch 1: (\d+) of its 100 steps so far had a gradient") as e:
        fit(TINY, _with(epochs=1, batch_size=8, train_size=800), tmp_path, device="cpu", progress=False)
    probe = 1  # the first call is the loop's probe of which weights the loss reaches, not a step
    assert int(e.value.args[0].split(": ")[1].split(" of")[0]) == len([c for c in spoilt if c > probe]) >= 33
    assert not (tmp_path / "last.safetensors").exists()


def test_an_epoch_whose_every_step_was_skipped_reports_no_norm(tmp_path, monkeypatch):
    from capsnet.train import describe_epoch

    monkeypatch.setattr("capsnet.train.grad_scaler",
                        lambda dev, amp: torch.amp.GradScaler(dev.type, init_scale=2.0 ** 40))
    fit(TINY, _with(epochs=1, train_size=64, grad_clip=1.0), tmp_path, device="cpu", progress=False)
    record = _records(tmp_path)[0]
    assert (record["skipped_steps"], record["grad_norm"], record["clipped"]) == (2, None, None)  # not a norm of 0
    line = describe_epoch(record, "mnist-sample")
    assert "gradient norm" not in line and f"2 steps skipped (loss scale {2.0 ** 38:g})" in line


def test_a_gan_epoch_longer_than_64_steps_checks_its_scale_inside_it(tmp_path, data_root, monkeypatch):
    """The GAN loop asked about the scale only at saves and at the epoch's end: a NaN gradient at every step took
    the scale below float32's smallest number within some 140 steps, where torch's unscaling turns 0 * inf into an
    unflagged NaN and the step is taken (a review, 2026-12-01). It asks every 64 steps, as the classifiers' loop."""
    from capsnet.gan import fit_gan
    from capsnet.models import Pix2pixConfig
    from capsnet.models.capspix2pix import ConditionalGAN

    g_loss = ConditionalGAN.g_loss

    def spoilt(self, *args):
        value, parts = g_loss(self, *args)
        return value + (0.0 * sum(p.sum() for p in self.generator.parameters())).sqrt(), parts
    monkeypatch.setattr(ConditionalGAN, "g_loss", spoilt)
    with pytest.raises(NonFiniteLoss, match=r"fell to 3.55e-15 in epoch 1: 64 of its 64 steps so far"):
        fit_gan(Pix2pixConfig(base_channels=4, disc_channels=4), _gan(epochs=1, batch_size=2, train_size=140),
                tmp_path, device="cpu", data_root=data_root, progress=False)


def test_a_damaged_scaler_state_is_named_on_loading(tmp_path, monkeypatch):
    from capsnet import checkpoint as ck
    from capsnet.checkpoint import CheckpointError, save_checkpoint

    fit(TINY, _with(epochs=1, train_size=64), tmp_path, device="cpu", progress=False)
    ckpt = load_checkpoint(tmp_path, "last")
    assert set(ckpt.state["grad_scaler"]) == {"scale", "growth_factor", "backoff_factor", "growth_interval",
                                              "_growth_tracker"}
    for field, value in (("scale", 0.0), ("scale", "big"), ("backoff_factor", 1.5), ("growth_interval", 0)):
        state = {**ckpt.state, "grad_scaler": {**ckpt.state["grad_scaler"], field: value}}
        bad = dataclasses.replace(ckpt, state=state)
        with pytest.raises(CheckpointError, match=r"cannot save .*: state.grad_scaler must be a gradient scaler's"):
            save_checkpoint(tmp_path / "bad.safetensors", bad)  # refused before it is written (since 2026-12-02)
        with monkeypatch.context() as m:  # written all the same, as a file damaged on disk holds it
            m.setattr(ck, "_check_metadata", lambda *parts: None)
            save_checkpoint(tmp_path / "bad.safetensors", bad)
        with pytest.raises(CheckpointError, match=r"damaged metadata: state.grad_scaler must be a gradient scaler's"):
            load_checkpoint(tmp_path / "bad.safetensors")
