"""TrainConfig.grad_clip (--grad-clip): the gradient's global norm clipped before each step, its figures per epoch."""
from __future__ import annotations

import json

import pytest
import torch

from capsnet.checkpoint import load_checkpoint
from capsnet.cli import main
from capsnet.models import CapsNetConfig, Pix2pixConfig
from capsnet.train import ResumeError, TrainConfig, fit, lr_at

TINY = CapsNetConfig(conv1_channels=8, primary_types=2, decoder_hidden=(32, 64))
CFG = TrainConfig(dataset="mnist-sample", epochs=2, batch_size=32, train_size=160, test_size=64, seed=3)


def _with(**changes) -> TrainConfig:
    return TrainConfig(**{**CFG.to_dict(), **changes})


def _records(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _norms_seen(monkeypatch) -> list[tuple[float, float]]:
    """Each clip's (norm of the gradients before, norm after), both computed here from the parameters' .grad."""
    seen = []
    clip = torch.nn.utils.clip_grad_norm_

    def norm(params):
        return torch.linalg.vector_norm(torch.stack([p.grad.double().norm() for p in params if p.grad is not None]))

    def recording(parameters, max_norm, *args, **kwargs):
        params = list(parameters)
        before = norm(params).item()
        result = clip(params, max_norm, *args, **kwargs)
        seen.append((before, norm(params).item()))
        return result
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", recording)
    return seen


def test_a_clip_above_every_norm_trains_exactly_as_no_clip_and_reports_the_norms(tmp_path, monkeypatch):
    fit(TINY, CFG, tmp_path / "plain", device="cpu", progress=False)
    seen = _norms_seen(monkeypatch)
    fit(TINY, _with(grad_clip=1e9), tmp_path / "loose", device="cpu", progress=False)
    a, b = (load_checkpoint(tmp_path / d, "last").model_state for d in ("plain", "loose"))
    assert all(torch.equal(a[k], b[k]) for k in a)  # a scale of exactly 1: the same steps
    assert len(seen) == 10 and all(after == pytest.approx(before) for before, after in seen)
    records = _records(tmp_path / "loose")
    assert "grad_norm" not in _records(tmp_path / "plain")[0]
    for epoch, record in enumerate(records):  # 5 steps an epoch, the norms measured here
        assert record["grad_norm"] == pytest.approx(sum(b for b, _ in seen[5 * epoch:5 * epoch + 5]) / 5, rel=1e-5)
        assert record["clipped"] == 0


def test_a_clip_below_some_norms_cuts_those_steps_to_it_and_counts_them(tmp_path, monkeypatch):
    seen = _norms_seen(monkeypatch)
    fit(TINY, _with(grad_clip=1e9), tmp_path / "loose", device="cpu", progress=False)
    norms = sorted(b for b, _ in seen)
    gap = max(range(3, 7), key=lambda k: norms[k + 1] - norms[k])  # the widest gap mid-way: no norm near the limit
    assert norms[gap + 1] - norms[gap] > 1e-4 * norms[gap]
    limit = (norms[gap] + norms[gap + 1]) / 2  # some steps cut, some not
    seen.clear()
    fit(TINY, _with(grad_clip=limit), tmp_path / "clipped", device="cpu", progress=False)
    assert len(seen) == 10
    for before, after in seen:
        assert after == pytest.approx(min(before, limit), rel=1e-5)
    records = _records(tmp_path / "clipped")
    for epoch, record in enumerate(records):
        steps = seen[5 * epoch:5 * epoch + 5]
        assert record["clipped"] == pytest.approx(sum(b > limit for b, _ in steps) / 5)
        assert record["grad_norm"] == pytest.approx(sum(b for b, _ in steps) / 5, rel=1e-5)
    assert 0 < sum(r["clipped"] for r in records) < 2  # both kinds of step happened
    a, b = (load_checkpoint(tmp_path / d, "last").model_state for d in ("loose", "clipped"))
    assert not all(torch.equal(a[k], b[k]) for k in a)


class _Killed(Exception):
    pass


def test_a_clipped_run_stopped_inside_an_epoch_resumes_with_its_norms(tmp_path, monkeypatch):
    cfg = _with(grad_clip=0.05)
    fit(TINY, cfg, tmp_path / "straight", device="cpu", progress=False, save_every_s=None)

    def stopped(step, *args):
        if step == 7:  # 5 batches an epoch: 2 batches into epoch 2
            raise _Killed
        return lr_at(step, *args)
    monkeypatch.setattr("capsnet.train.lr_at", stopped)
    with pytest.raises(_Killed):
        fit(TINY, cfg, tmp_path / "split", device="cpu", progress=False, save_every_s=1e-9)
    monkeypatch.undo()
    within = load_checkpoint(tmp_path / "split", "last").state["within"]
    assert len(within["sums"]) == 4 and within["sums"][2] > 0  # loss, correct, norms, steps clipped
    fit(TINY, cfg, tmp_path / "split", device="cpu", progress=False, resume=True)
    a, b = (load_checkpoint(tmp_path / d, "last").model_state for d in ("straight", "split"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    strip = [{k: v for k, v in r.items() if k != "train_images_per_s"} for r in _records(tmp_path / "straight")]
    again = [{k: v for k, v in r.items() if k != "train_images_per_s"} for r in _records(tmp_path / "split")]
    assert [r.pop("grad_norm") for r in again] == pytest.approx([r.pop("grad_norm") for r in strip])
    assert again == strip


def test_a_resume_with_another_clip_is_refused(tmp_path):
    fit(TINY, _with(epochs=1, grad_clip=1.0), tmp_path, device="cpu", progress=False)
    with pytest.raises(ResumeError, match="grad_clip"):
        fit(TINY, _with(grad_clip=2.0), tmp_path, device="cpu", progress=False, resume=True)


@pytest.mark.parametrize("value, message", [(-1.0, r"grad_clip must be >= 0 \(0: no clipping"),
                                            (float("inf"), "grad_clip must be a finite number, got inf"),
                                            (float("nan"), "grad_clip must be a finite number, got nan")])
def test_a_clip_that_is_not_a_finite_number_at_least_0_is_refused(value, message):
    with pytest.raises(ValueError, match=message):
        _with(grad_clip=value)


@pytest.mark.parametrize("value", ["-1", "inf", "x"])
def test_the_cli_refuses_a_bad_clip_by_name(tmp_path, capsys, value):
    with pytest.raises(SystemExit):
        main(["train", "--dataset", "mnist-sample", "--grad-clip", value, "--out", str(tmp_path / "run")])
    assert "--grad-clip" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_the_gan_loop_refuses_a_clip_before_writing_anything(tmp_path):
    from capsnet.gan import fit_gan

    cfg = TrainConfig(dataset="mnist-sample-skeleton", epochs=1, batch_size=8, train_size=16, test_size=8,
                      grad_clip=1.0)
    with pytest.raises(ValueError, match="the GAN loop of pix2pix steps two optimizers on their own"):
        fit_gan(Pix2pixConfig(), cfg, tmp_path / "run", device="cpu", progress=False)
    assert not (tmp_path / "run").exists()


def test_the_synthesis_experiment_refuses_a_clip_by_name(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["experiment", "synthesis", "--grad-clip", "1", "--out", str(tmp_path / "x")])
    assert "--grad-clip does not apply to `capsnet experiment synthesis`" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_the_epoch_line_shows_the_norm_and_the_share_clipped():
    from capsnet.train import describe_epoch

    record = {"epoch": 3, "train_loss": 0.25, "test_accuracy": 0.9, "test_error": 0.1, "grad_norm": 2.3456,
              "clipped": 0.375}
    assert describe_epoch(record, "mnist") == ("epoch 3: test accuracy 0.9000 (error 10.00%), train loss 0.2500, "
                                               "gradient norm 2.35 (37.5% of steps clipped)")
    del record["grad_norm"], record["clipped"]
    assert describe_epoch(record, "mnist") == "epoch 3: test accuracy 0.9000 (error 10.00%), train loss 0.2500"


def test_a_gradient_that_is_not_finite_stops_a_clipped_run_before_anything_of_it_is_saved(tmp_path, monkeypatch):
    """A finite loss whose gradient is NaN (step 8, in epoch 2) would make every weight NaN: with the norm at hand
    the run stops as for a NaN loss, and the saves made inside epoch 2 before it stay finite and loadable."""
    from capsnet import models
    from capsnet.train import NonFiniteLoss

    spec = models.MODELS["capsnet"]
    calls = []

    def nan_gradient(model, images, labels, components=None, **kw):
        calls.extend([1] if model.training else [])
        loss, scores = spec.loss(model, images, labels, components, **kw)
        if model.training and len(calls) == 8:
            loss.register_hook(lambda g: g * float("nan"))  # the loss stays finite, its gradient does not
        return loss, scores

    monkeypatch.setitem(models.MODELS, "capsnet", spec._replace(loss=nan_gradient))
    with pytest.raises(NonFiniteLoss, match=r"or its gradient\) became NaN or infinite at step 8 \(epoch 2\)"):
        fit(TINY, _with(epochs=3, grad_clip=1.0), tmp_path, device="cpu", progress=False, save_every_s=1e-9)
    kept = load_checkpoint(tmp_path, "last")
    assert kept.state["epoch"] == 1 and kept.state["within"]["batches"] == 2  # saved after step 7, not 8
    assert all(torch.isfinite(t).all() for t in kept.model_state.values())
