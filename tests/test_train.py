"""fit(): learning-rate schedule, exact resume, configuration checks."""
from __future__ import annotations

import json
import math
import os
import shutil
import warnings

import pytest
import torch
from safetensors import safe_open

from capsnet.checkpoint import CheckpointError, load_checkpoint, save_checkpoint, saved_point
from capsnet.models import CapsNetConfig
from capsnet.evaluate import evaluate, load_model
from capsnet.train import (ResumeError, TrainConfig, finished, fit, lr_at, restore_rng_state, resume_within,
                           rng_state)
from capsnet.pretrained import pack
from cli_helpers import assert_same_run, replace_folder

TINY = CapsNetConfig(conv1_channels=8, primary_types=2, decoder_hidden=(32, 64))
CFG = TrainConfig(dataset="mnist-sample", epochs=2, batch_size=32, train_size=160, test_size=64, seed=3)


def test_lr_schedule_matches_authors_decay():
    cfg = TrainConfig()
    assert lr_at(0, cfg) == pytest.approx(1e-3)
    assert lr_at(2000, cfg) == pytest.approx(0.96e-3)
    assert lr_at(10000, cfg) == pytest.approx(1e-3 * 0.96 ** 5)
    assert lr_at(1000, cfg) == pytest.approx(1e-3 * math.sqrt(0.96))


@pytest.mark.parametrize("bad, message", [
    (dict(epochs=0), "epochs must be at least 1, got 0"),
    (dict(batch_size=0), "batch_size must be at least 1, got 0"),
    (dict(dataset="cifar"), "unknown dataset 'cifar'; valid names are mnist, fashion-mnist, "),
    (dict(lr=-1.0), "lr must be a positive number, got -1.0"),
    # Adam's first step is lr / (1 - beta1): 4e37 overflowed float32 inside it, a traceback (a review)
    (dict(lr=4e37), r"lr 4e\+37 is too large: at most 1e\+30 \(Adam's first float32 update overflows from about "
                    r"3.4e37 on\); the paper's is 1e-3"),
    (dict(lr_decay=1.5), r"lr_decay must lie in \(0, 1\], got 1.5"),
    (dict(val_size=-1), "val_size must be >= 0, got -1"),
    (dict(seed=2**63), "seed must be below 2\\^63, got 9223372036854775808"),
])
def test_bad_train_config(bad, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**bad)


def test_a_lock_handed_to_fit_must_be_a_taken_run_lock_of_its_folder(tmp_path):
    """fit(lock=...) trains under a lock its caller took (capsnet train --resume prints under it); one of another
    folder, one not taken, or not a RunLock is refused before the run's folder or data are touched."""
    from capsnet.checkpoint import RunLock
    from capsnet.gan import fit_gan

    run, other = tmp_path / "run", tmp_path / "other"
    other.mkdir()
    cfg = TrainConfig(dataset="mnist", epochs=1, train_size=64, test_size=32)
    for train in (fit, fit_gan):
        with pytest.raises(ValueError, match="lock must be taken already"):
            train(TINY, cfg, run, lock=RunLock(run))
        with RunLock(other) as held:
            held.acquire()
            with pytest.raises(ValueError, match=f"lock is on {other}, not on the run's folder {run}"):
                train(TINY, cfg, run, lock=held)
        with pytest.raises(TypeError, match="lock must be a capsnet.checkpoint.RunLock"):
            train(TINY, cfg, run, lock=str(run))
    assert not run.exists()


def test_a_large_seed_trains_its_epoch_generators_seeded_modulo_2_to_the_64():
    """--seed 20000000000000: the epochs' generators were seeded with seed * 1,000,003 + epoch, past 2^64 (an
    overflow, after config.json was written); that seed is now taken modulo 2^64, the same seed below it."""
    from capsnet.train import _seeded_generator

    big = _seeded_generator(20_000_000_000_000, 3, torch.device("cpu"))
    assert big.initial_seed() == (20_000_000_000_000 * 1_000_003 + 3) % 2**64
    assert _seeded_generator(7, 3, torch.device("cpu")).initial_seed() == 7 * 1_000_003 + 3  # as before


def _weights(run_dir, which="last"):
    return load_checkpoint(run_dir, which).model_state


def test_resume_reaches_exactly_the_uninterrupted_weights(tmp_path):
    fit(TINY, CFG, tmp_path / "straight", device="cpu", progress=False)
    fit(TINY, TrainConfig(**{**CFG.to_dict(), "epochs": 1}), tmp_path / "split", device="cpu", progress=False)
    assert load_checkpoint(tmp_path / "split", "last").state["epoch"] == 1
    fit(TINY, CFG, tmp_path / "split", device="cpu", progress=False, resume=True)
    a, b = _weights(tmp_path / "straight"), _weights(tmp_path / "split")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    def lines(d):  # every record but its wall-clock throughput
        records = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
        assert all(r.pop("train_images_per_s") > 0 for r in records)
        return records
    assert lines(tmp_path / "straight") == lines(tmp_path / "split")
    assert [r["epoch"] for r in lines(tmp_path / "split")] == [1, 2]


class _Killed(Exception):
    pass


def test_a_run_killed_between_evaluations_resumes_from_its_last_epoch(tmp_path, monkeypatch):
    """eval_every > 1: the epochs without an evaluation still leave a resumable last.safetensors, so a run
    killed before its first evaluation loses one epoch at most and still ends with the uninterrupted weights."""
    cfg = TrainConfig(**{**CFG.to_dict(), "epochs": 3, "eval_every": 3})
    fit(TINY, cfg, tmp_path / "straight", device="cpu", progress=False)

    def killed(*args, **kwargs):
        raise _Killed
    monkeypatch.setattr("capsnet.train.evaluate_split", killed)
    with pytest.raises(_Killed):  # short epochs (the default minute between saves): nothing written before the end
        fit(TINY, cfg, tmp_path / "quick", device="cpu", progress=False)
    assert not (tmp_path / "quick" / "last.safetensors").exists()
    monkeypatch.setattr("capsnet.train.SAVE_AFTER_S", 0.0)  # long epochs: each one saved
    with pytest.raises(_Killed):
        fit(TINY, cfg, tmp_path / "split", device="cpu", progress=False)
    saved = load_checkpoint(tmp_path / "split", "last")
    assert saved.state["epoch"] == 2 and [r["epoch"] for r in saved.state["history"]] == [1, 2]
    assert saved.optimizer_state and not (tmp_path / "split" / "best.safetensors").exists()
    monkeypatch.undo()
    final = fit(TINY, cfg, tmp_path / "split", device="cpu", progress=False, resume=True)
    a, b = _weights(tmp_path / "straight"), _weights(tmp_path / "split")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert final["epoch"] == 3 and "test_accuracy" in final


def _kill_at_step(monkeypatch, at: int) -> None:
    """The training loop dies (``_Killed``) as it asks for step ``at``'s learning rate, after the saves before it."""
    def stopped(step, *args):
        if step == at:
            raise _Killed
        return lr_at(step, *args)
    monkeypatch.setattr("capsnet.train.lr_at", stopped)


def test_a_run_stopped_inside_an_epoch_resumes_there_exactly(tmp_path, monkeypatch):
    """save_every_s: last.safetensors rewritten between batches holds the step, the epoch's running sums and its
    batch generator, so a run stopped in the middle of an epoch resumes at that batch and ends with the weights and
    metrics of the run that never stopped; a resume asking for fewer epochs than the one it stopped in is refused."""
    from capsnet.train import ResumeError

    fit(TINY, CFG, tmp_path / "straight", device="cpu", progress=False, save_every_s=None)
    _kill_at_step(monkeypatch, 7)  # 5 batches an epoch: 2 batches into epoch 2
    with pytest.raises(_Killed):
        fit(TINY, CFG, tmp_path / "split", device="cpu", progress=False, save_every_s=1e-9)  # a save every batch
    monkeypatch.undo()
    saved = load_checkpoint(tmp_path / "split", "last")
    assert saved.state["epoch"] == 1 and saved.state["step"] == 7
    assert saved.state["within"]["epoch"] == 2 and saved.state["within"]["batches"] == 2
    assert saved.state["within"]["seen"] == 64 and "epoch_batches" in saved.rng_state
    assert [json.loads(x)["epoch"] for x in (tmp_path / "split" / "metrics.jsonl").read_text().splitlines()] == [1]
    with pytest.raises(ResumeError, match="saved inside epoch 2, past the 1 asked for; resume with --epochs 2"):
        fit(TINY, TrainConfig(**{**CFG.to_dict(), "epochs": 1}), tmp_path / "split", device="cpu", progress=False,
            resume=True)
    with safe_open(str(tmp_path / "split" / "last.safetensors"), "pt") as f:  # an older capsnet refuses it
        assert f.metadata()["format_version"] == "2"
    assert not finished(saved.state, 1)  # the CLI's "finished" line: not for a run stopped inside epoch 2
    from capsnet.pretrained import pack
    with pytest.raises(ValueError, match="saved 2 batches into epoch 2; finish that epoch"):  # not final weights
        pack(tmp_path / "split", tmp_path / "packed.safetensors")
    assert not (tmp_path / "packed.safetensors").exists()

    def damaged(name, rng=None, **within):
        run = tmp_path / name
        shutil.copytree(tmp_path / "split", run)
        ckpt = load_checkpoint(run, "last")
        ckpt.state["within"] |= within
        ckpt.rng_state |= rng or {}
        save_checkpoint(run / "last.safetensors", ckpt)
        return run
    with pytest.raises(CheckpointError, match=r"inside epoch 2 \(batch 99 of 5, 2 running sums for 2\) does not fit"):
        fit(TINY, CFG, damaged("far", batches=99), device="cpu", progress=False, resume=True)
    with pytest.raises(CheckpointError, match=r"state.within.epoch must be 2 \(the epoch after state.epoch 1\), got 3"):
        fit(TINY, CFG, damaged("later", epoch=3), device="cpu", progress=False, resume=True)
    with pytest.raises(CheckpointError, match=r"state.within.sums must be a list of finite numbers, got '12'"):
        load_checkpoint(damaged("sums", sums="12"), "last")
    with pytest.raises(CheckpointError, match=r"state.within.processes must be an integer >= 1, got 0"):
        load_checkpoint(damaged("nobody", processes=0), "last")
    # as 2 processes save it: rank 1's states sit beside rank 0's
    torchrun_save = damaged("torchrun", {"rank1.torch": torch.get_rng_state()}, processes=2)
    with warnings.catch_warnings():  # no dropout in this model: one process continues it exactly, without a word
        warnings.simplefilter("error")
        fit(TINY, CFG, torchrun_save, device="cpu", progress=False, resume=True)
    a, b = _weights(tmp_path / "straight"), _weights(torchrun_save)
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.warns(RuntimeWarning, match="saved 2 batches into epoch 2 on cuda; on cpu the rest of that epoch"):
        fit(TINY, CFG, damaged("gpu", device="cuda"), device="cpu", progress=False, resume=True)
    fit(TINY, CFG, tmp_path / "split", device="cpu", progress=False, resume=True)
    assert finished(load_checkpoint(tmp_path / "split", "last").state, 2)
    a, b = _weights(tmp_path / "straight"), _weights(tmp_path / "split")
    assert all(torch.equal(a[k], b[k]) for k in a)

    def lines(d):  # every record but its wall-clock throughput
        records = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if k != "train_images_per_s"} for r in records]
    assert lines(tmp_path / "straight") == lines(tmp_path / "split")
    assert "within" not in load_checkpoint(tmp_path / "split", "last").state


def test_a_save_inside_an_epoch_by_more_processes_warns_of_other_dropout_masks(tmp_path, monkeypatch):
    """A save made inside an epoch by 2 torchrun processes (as ``within.processes`` says), resumed by one: the CNN
    baseline's dropout draws other masks for the rest of that epoch than the uninterrupted run, and a warning says
    so; the run finishes."""
    from capsnet.models import BaselineCNNConfig

    model = BaselineCNNConfig(channels=(4, 4, 4), hidden=(8, 8))
    _kill_at_step(monkeypatch, 2)
    cfg = TrainConfig(**{**CFG.to_dict(), "epochs": 1})
    with pytest.raises(_Killed):
        fit(model, cfg, tmp_path, device="cpu", progress=False, save_every_s=1e-9)
    monkeypatch.undo()
    ckpt = load_checkpoint(tmp_path, "last")
    assert ckpt.state["within"]["batches"] == 2
    ckpt.state["within"]["processes"] = 2
    save_checkpoint(tmp_path / "last.safetensors", ckpt)
    with pytest.raises(CheckpointError, match=r"state.within.processes is 2 but the file holds no rng.rank1.torch "
                                              r"\(each rank's random state at the save\)"):
        load_checkpoint(tmp_path, "last")  # rank 1's state is missing: a torchrun save always holds it
    ckpt.rng_state["rank1.torch"] = torch.get_rng_state()
    save_checkpoint(tmp_path / "last.safetensors", ckpt)
    with pytest.warns(RuntimeWarning, match=r"saved inside epoch 1 by 2 process\(es\) and is resumed by 1: the rest "
                                            r"of that epoch draws other dropout masks"):
        fit(model, cfg, tmp_path, device="cpu", progress=False, resume=True)
    assert finished(load_checkpoint(tmp_path, "last").state, 1)


def test_metrics_log_and_best_checkpoint(tmp_path):
    final = fit(TINY, CFG, tmp_path, device="cpu", progress=False)
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 2 and records[-1] == final
    for r in records:
        assert set(r) >= {"epoch", "train_loss", "test_loss", "test_accuracy", "test_error"}
        assert r["test_error"] == pytest.approx(1 - r["test_accuracy"])
    best = load_checkpoint(tmp_path, "best")
    assert best.optimizer_state is None
    assert best.state["best"]["accuracy"] == max(r["test_accuracy"] for r in records)
    # The logged accuracy is what evaluate() gives on the same split.
    model, _ = load_model(tmp_path, which="last")
    from capsnet.data import load_dataset
    test = load_dataset("mnist-sample", "test").subset(range(64))
    r = evaluate(model, test.images.float() / 255, test.labels)
    assert r.accuracy == pytest.approx(records[-1]["test_accuracy"])
    assert int(r.confusion.sum()) == 64


def test_validation_split_is_used_for_the_best_checkpoint(tmp_path):
    final = fit(TINY, TrainConfig(**{**CFG.to_dict(), "epochs": 1, "val_size": 32}), tmp_path, device="cpu", progress=False)
    assert "val_accuracy" in final and "test_accuracy" not in final
    assert load_checkpoint(tmp_path, "best").state["best"]["split"] == "val"


def test_resume_refuses_another_configuration(tmp_path):
    fit(TINY, TrainConfig(**{**CFG.to_dict(), "epochs": 1}), tmp_path, device="cpu", progress=False)
    with pytest.raises(CheckpointError, match="another configuration.*batch_size"):
        fit(TINY, TrainConfig(**{**CFG.to_dict(), "batch_size": 16}), tmp_path, device="cpu", progress=False, resume=True)
    other = CapsNetConfig(conv1_channels=16, primary_types=2, decoder_hidden=(32, 64))
    with pytest.raises(CheckpointError, match="conv1_channels"):
        fit(other, CFG, tmp_path, device="cpu", progress=False, resume=True)
    with pytest.raises(CheckpointError, match="already holds a run"):
        fit(TINY, CFG, tmp_path, device="cpu", progress=False)
    with pytest.raises(CheckpointError, match="nothing to resume"):
        fit(TINY, CFG, tmp_path / "empty", device="cpu", progress=False, resume=True)


def test_a_resume_asking_for_fewer_epochs_than_trained_is_refused_not_answered_with_a_later_epoch(trained_run,
                                                                                                    tmp_path):
    """Before, the epoch loop did not run and fit returned the record of the later, saved epoch as the final one;
    an experiment rerun with a smaller --epochs tabulated those figures under the smaller budget."""
    import dataclasses
    import shutil

    from capsnet.experiments import Run, _finished
    from capsnet.train import ResumeError, resume_configs

    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    model, cfg = resume_configs(run)
    assert cfg.epochs == 2
    before = (run / "last.safetensors").read_bytes()
    with pytest.raises(ResumeError, match=r"has already trained 2 epochs, more than the 1 asked for; resume with "
                                          r"--epochs 2 or more") as info:
        fit(model, dataclasses.replace(cfg, epochs=1), run, device="cpu", progress=False, resume=True)
    assert info.value.fields == ["epochs"] and (run / "last.safetensors").read_bytes() == before
    shorter = Run("routing", "capsnet", cfg.dataset, cfg.seed, model, dataclasses.replace(cfg, epochs=1), run)
    with pytest.raises(CheckpointError, match=r"holds a run of 2 epochs, more than the 1 asked for; give --epochs 2"):
        _finished(shorter)
    assert _finished(dataclasses.replace(shorter, train_config=cfg)) == load_checkpoint(run, "last").state["history"][-1]


def test_a_non_finite_loss_stops_training_naming_the_step_and_keeps_the_last_checkpoint(tmp_path, monkeypatch):
    from capsnet import models
    from capsnet.checkpoint import load_checkpoint
    from capsnet.train import NonFiniteLoss

    spec = models.MODELS["capsnet"]
    calls = []

    def loss_turning_nan(model, images, labels, components=None, **kw):
        calls.extend([1] if model.training else [])  # training steps only, not evaluation batches
        loss, scores = spec.loss(model, images, labels, components, **kw)
        return (loss * float("nan") if model.training and len(calls) == 8 else loss), scores  # the 8th step

    monkeypatch.setitem(models.MODELS, "capsnet", spec._replace(loss=loss_turning_nan))
    cfg = TrainConfig(**{**CFG.to_dict(), "epochs": 3})
    steps_per_epoch = -(-cfg.train_size // cfg.batch_size)
    assert steps_per_epoch < 8 <= 2 * steps_per_epoch  # the bad step falls in epoch 2
    with pytest.raises(NonFiniteLoss, match=r"NaN or infinite at step 8 \(epoch 2\).*still holds epoch 1") as e:
        fit(TINY, cfg, tmp_path, device="cpu", progress=False)
    # the flags named are the run's own: neither --grad-clip nor --amp was given (a review, 2026-11-30)
    assert "--grad-clip" not in str(e.value) and "--amp" not in str(e.value) and "Lower --lr" in str(e.value)
    # a lower --lr is a new run: --resume refuses another --lr, and a plain resume replays the step (a review)
    assert str(e.value).endswith("pixels, in a new run (another --out): --resume keeps this run's settings and would "
                                 "meet the same step again"), str(e.value)
    kept = load_checkpoint(tmp_path, "last")
    assert kept.state["epoch"] == 1
    assert all(torch.isfinite(t).all() for t in kept.model_state.values())


def test_a_resume_may_change_how_often_it_evaluates(trained_run, tmp_path, data_root):
    """--eval-every, like --epochs, changes no step already taken: a resume takes it; other settings still clash."""
    import shutil

    from capsnet.train import ResumeError, resume_configs

    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    model, cfg = resume_configs(run, train_changes={"epochs": 4, "eval_every": 2})
    assert (cfg.epochs, cfg.eval_every) == (4, 2)
    with pytest.raises(ResumeError, match="batch_size differ"):
        resume_configs(run, train_changes={"eval_every": 2, "batch_size": 8})
    final = fit(model, cfg, run, device="cpu", data_root=data_root, progress=False, resume=True)
    history = load_checkpoint(run, "last").state["history"]
    assert [r["epoch"] for r in history] == [1, 2, 3, 4] and final["epoch"] == 4
    assert "test_accuracy" not in history[2] and "test_accuracy" in history[3]  # epoch 3 not evaluated, 4 is
    assert load_checkpoint(run, "last").train_config["eval_every"] == 2


def test_resume_takes_a_setting_typed_again_in_another_spelling(trained_run):
    """--model-option decoder_hidden=[a, b] on a resume is the tuple the run's config holds, not a change."""
    from capsnet.train import ResumeError, resume_configs

    saved, _ = resume_configs(trained_run)
    same = list(saved.decoder_hidden)
    model, _ = resume_configs(trained_run, model_changes={"decoder_hidden": same})
    assert model == saved
    with pytest.raises(ResumeError, match="decoder_hidden differ"):
        resume_configs(trained_run, model_changes={"decoder_hidden": same + [8]})


def test_rng_state_round_trip_on_the_cpu_restores_the_next_draws():
    cpu = torch.device("cpu")
    torch.manual_seed(5)
    saved = rng_state(cpu)
    assert set(saved) == {"torch"}  # no GPU generator on a CPU run
    first = torch.rand(4)
    torch.rand(100)  # the generator moves on
    restore_rng_state(saved, cpu)
    assert torch.equal(torch.rand(4), first)
    here = rng_state(cpu)
    ahead = torch.rand(4)
    restore_rng_state(here, cpu)
    restore_rng_state({}, cpu)  # a checkpoint without random states leaves the generator where it is
    assert torch.equal(torch.rand(4), ahead)


def test_save_then_stop_asks_once_then_stops_at_once_and_restores_the_handlers():
    import signal

    from capsnet.train import SaveThenStop

    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with SaveThenStop(enabled=True) as stop:
        assert signal.getsignal(signal.SIGINT) == before[0]  # not armed yet: an interrupt while loading stops at once
        stop.arm()
        signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)  # the first signal: the loop saves, then stops
        assert stop.asked
        with pytest.raises(KeyboardInterrupt):  # a second one does not wait for the loop
            signal.getsignal(signal.SIGINT)(signal.SIGINT, None)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    off = SaveThenStop(enabled=False)
    off.arm()
    assert signal.getsignal(signal.SIGINT) == before[0] and not off.asked


def test_budget_warnings_name_what_the_run_will_not_do_as_typed():
    from capsnet.train import TrainConfig, budget_warnings

    assert budget_warnings(TrainConfig(batch_size=32, epochs=2, warmup_steps=8), 320) == []  # 20 steps > 8
    said = budget_warnings(TrainConfig(batch_size=500, epochs=3, warmup_steps=12, lr=2e-3), 300)
    assert said == ["--batch-size 500 is more than the 300 training examples: each epoch is one step of all 300",
                    "a warm-up of 12 steps (--warmup-steps, as given or the model's default: 200 for --model baseline) "
                    "is longer than the run's 3 optimizer steps: the rate never reaches --lr 0.002 (it ends at 25% of "
                    "its ramp); lower it (--warmup-steps 0: none) or train longer"]
    # the ramp's last step is lr_at's: 3 of 12 steps of the ramp (decay aside)
    from capsnet.train import lr_at
    cfg = TrainConfig(batch_size=500, epochs=3, warmup_steps=12, lr=2e-3, lr_decay=1.0)
    assert lr_at(2, cfg) == pytest.approx(0.25 * 2e-3)
    # the linear schedule refuses such a warm-up outright (lr_at), so only the batch is said
    assert len(budget_warnings(TrainConfig(batch_size=500, epochs=3, warmup_steps=12, lr_schedule="linear"), 300)) == 1
    assert budget_warnings(TrainConfig(batch_size=10, epochs=1, warmup_steps=1), 10) == []  # exactly one batch


def test_fit_names_every_size_field_a_model_lacks_for_its_data_set(tmp_path):
    """A model for 28x28 digits but 100 classes crashed inside the loss ('Class values must be smaller than
    num_classes') after the size message had been followed; a 3-channel one was told of heights and widths."""
    from capsnet.models import CapsNetConfig, EMCapsNetSmallConfig, create_model, model_name
    from capsnet.train import TrainConfig, fit, input_fields

    cases = [(EMCapsNetSmallConfig(input_height=28, input_width=28, num_classes=5), "num_classes 10", "num_classes 5"),
             (CapsNetConfig(in_channels=3), "in_channels 1", "in_channels 3"),
             (CapsNetConfig(input_height=32, input_width=32, num_classes=4),
              "input_height 28, input_width 28, num_classes 10", "input_height 32, input_width 32, num_classes 4")]
    for config, needs, has in cases:
        with pytest.raises(ValueError, match=f"mnist-sample needs a model with {needs}, and this one has {has}; build "
                                             f"it with those"):
            fit(config, TrainConfig(dataset="mnist-sample"), tmp_path / "r", progress=False)
        assert not (tmp_path / "r").exists()
    name = model_name(cases[0][0])  # the fix it names builds the model that fits
    config = create_model(name, **input_fields(name, "mnist-sample")).config
    assert (config.num_classes, config.input_height, config.in_channels) == (10, 28, 1)


def test_fit_arguments_of_the_wrong_kind_are_named_before_any_work(tmp_path, trained_run):
    """A dict of settings failed with AttributeError, a run directory that is a file with a bare FileExistsError,
    a model in place of its config said only that it was no config; load_model took which='final' as a file name."""
    from capsnet.checkpoint import CheckpointError
    from capsnet.evaluate import load_model
    from capsnet.gan import fit_gan
    from capsnet.models import CapsNetConfig, create_model
    from capsnet.train import TrainConfig, fit

    config = CapsNetConfig(conv1_channels=8, primary_types=2)
    with pytest.raises(ValueError, match=r"the training settings must be a TrainConfig, got dict; pass "
                                         r"TrainConfig\(\*\*settings\)"):
        fit(config, {"dataset": "mnist-sample", "epochs": 1}, tmp_path / "r")
    (tmp_path / "file").write_text("")
    for train in (fit, fit_gan):
        with pytest.raises(ValueError, match=f"run_dir {tmp_path / 'file'} is a file; give a folder"):
            train(config, TrainConfig(dataset="mnist-sample"), tmp_path / "file")
    with pytest.raises(ValueError, match="a CapsNet model was given where its config belongs: pass model.config"):
        fit(create_model("capsnet", conv1_channels=8, primary_types=2), TrainConfig(dataset="mnist-sample"),
            tmp_path / "r")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]
    with pytest.raises(CheckpointError, match="which must be 'best' or 'last'"):
        load_model(trained_run, which="final")
    with pytest.raises(CheckpointError, match="which must be 'best' or 'last'"):
        load_model(trained_run / "best.safetensors", which="Best")


def test_a_run_saved_with_rounds_its_one_pass_routing_never_used_loads_and_resumes(tmp_path):
    """A self-attention run saved before such rounds were refused (routing_iterations 2 in its config): it loads with
    the rounds at their default, and a resume that types them again is not a clash; other fields still are."""
    from capsnet.train import ResumeError, resume_configs

    cfg = CapsNetConfig(conv1_channels=8, primary_types=2, routing="self-attention")
    fit(cfg, TrainConfig(dataset="mnist-sample", epochs=1, batch_size=32, train_size=32, test_size=32), tmp_path / "r",
        device="cpu", progress=False)
    ckpt = load_checkpoint(tmp_path / "r", "last")
    ckpt.model_config = ckpt.model_config | {"routing_iterations": 2}  # as such a run was written
    save_checkpoint(tmp_path / "r" / "last.safetensors", ckpt)
    model, _ = load_model(tmp_path / "r", which="last")
    assert model.config.routing_iterations == 3
    model_cfg, _ = resume_configs(tmp_path / "r", model_changes={"routing_iterations": 2})
    assert model_cfg.routing == "self-attention" and model_cfg.routing_iterations == 3
    with pytest.raises(ResumeError, match="conv1_channels differ from the run"):
        resume_configs(tmp_path / "r", model_changes={"conv1_channels": 16, "routing_iterations": 2})


def _sigterm_before_step(monkeypatch, step: int) -> list:
    """One SIGTERM to this process when the loop looks up step ``step``'s learning rate, before that step, once the
    loop's handler is armed (the optimizer's set-up asks for step 0 before it is); the list holds one entry once
    sent."""
    import os
    import signal

    sent: list = []

    def hooked(at, *args):
        if at == step and signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL and not sent:
            sent.append(os.kill(os.getpid(), signal.SIGTERM))
        return lr_at(at, *args)
    monkeypatch.setattr("capsnet.train.lr_at", hooked)
    return sent


def test_a_signal_inside_an_epoch_saves_at_that_step_and_stops(tmp_path, monkeypatch):
    """SIGTERM in the middle of an epoch: the step finishes, the loop saves inside the epoch and stops."""
    cfg = TrainConfig(dataset="mnist-sample", epochs=2, batch_size=32, train_size=160, test_size=32)  # 5 batches
    monkeypatch.setattr("capsnet.train.SAVE_AFTER_S", 1e9)
    sent = _sigterm_before_step(monkeypatch, 6)  # the second batch of epoch 2
    with pytest.raises(KeyboardInterrupt):
        fit(TINY, cfg, tmp_path / "r", device="cpu", progress=False)
    saved = load_checkpoint(tmp_path / "r", "last")
    assert sent and saved.state["step"] == 7 and saved.state["within"]["batches"] == 2


@pytest.mark.parametrize("eval_every", [1, 3])
def test_a_signal_in_an_epoch_of_one_batch_saves_and_stops_after_that_epoch(tmp_path, monkeypatch, eval_every):
    """Found by a review (2026-11-29): a signal in an epoch's last batch waits for the epoch's save, and nothing
    stopped after it, so with one batch an epoch (a small folder:DIR) SIGTERM was swallowed and every epoch trained.
    Now the run saves at the epoch's end and stops there (an epoch due for evaluation: saved trained, its
    evaluation left to the resume); the resume ends as a straight run."""
    cfg = TrainConfig(dataset="mnist-sample", epochs=3, batch_size=32, train_size=32, test_size=32,
                      eval_every=eval_every)
    fit(TINY, cfg, tmp_path / "straight", device="cpu", progress=False)
    monkeypatch.setattr("capsnet.train.SAVE_AFTER_S", 1e9)  # the epoch's save is the signal's doing
    sent = _sigterm_before_step(monkeypatch, 0)  # the one batch of epoch 1
    with pytest.raises(KeyboardInterrupt):
        fit(TINY, cfg, tmp_path / "split", device="cpu", progress=False)
    monkeypatch.undo()
    saved = load_checkpoint(tmp_path / "split", "last")
    if eval_every == 1:  # epoch 1 trained, not evaluated: a save "inside" it after its one batch
        assert sent and (saved.state["epoch"], saved.state["step"], saved.state["within"]["batches"]) == (0, 1, 1)
    else:
        assert sent and (saved.state["epoch"], saved.state["step"]) == (1, 1) and "within" not in saved.state
    fit(TINY, cfg, tmp_path / "split", device="cpu", progress=False, resume=True)
    assert_same_run(tmp_path / "straight", tmp_path / "split")


@pytest.mark.parametrize("how", ["signal", "inside", "kill"])
def test_an_evaluation_cut_short_keeps_its_epoch_and_the_resume_evaluates_it(tmp_path, monkeypatch, how):
    """A SIGTERM during an epoch's evaluation waited for the evaluation's end (20 minutes, measured on a starved CPU:
    a scheduler's grace period ends in SIGKILL first), and a kill there lost every step since the last save (up to
    --save-every). Now the signal stops the evaluation at once and a save due is written before it: either way the
    epoch is kept trained, not evaluated, and the resume evaluates it and ends as a straight run. "inside": the
    signal comes in the middle of the evaluation's first batch (its loss computed, under inference mode, with the
    weights' average applied in the model: the save and the resume hold the training weights as they were)."""
    import os
    import signal

    from capsnet import models
    from capsnet import train as tr

    cfg = TrainConfig(**{**CFG.to_dict(), "ema_decay": 0.9}) if how == "inside" else CFG
    fit(TINY, cfg, tmp_path / "straight", device="cpu", progress=False)
    real, spec = tr.evaluate_split, models.MODELS["capsnet"]

    def cut(*args, **kwargs):
        if how == "signal":
            os.kill(os.getpid(), signal.SIGTERM)  # as epoch 1's evaluation starts
        elif how == "kill":
            raise SystemExit(137)  # as a SIGKILL: nothing after it runs
        return real(*args, **kwargs)

    def signalled_in_evaluation(model, *args, **kw):
        loss, scores = spec.loss(model, *args, **kw)
        if not model.training:  # the evaluation's first batch, its loss computed
            os.kill(os.getpid(), signal.SIGTERM)
        return loss, scores

    monkeypatch.setattr(tr, "SAVE_AFTER_S", 1e9)
    monkeypatch.setattr(tr, "evaluate_split", cut)
    if how == "inside":
        monkeypatch.setitem(models.MODELS, "capsnet", spec._replace(loss=signalled_in_evaluation))
    with pytest.raises(KeyboardInterrupt if how != "kill" else SystemExit):
        fit(TINY, cfg, tmp_path / "split", device="cpu", progress=False,
            save_every_s=1e-9 if how == "kill" else None)  # a kill: the save is due
    monkeypatch.undo()
    saved = load_checkpoint(tmp_path / "split", "last")
    assert (saved.state["epoch"], saved.state["step"], saved.state["within"]["batches"]) == (0, 5, 5)
    assert saved_point(saved.state) == "epoch 0 + all 5 batches of epoch 1, not yet evaluated"
    with safe_open(str(tmp_path / "split" / "last.safetensors"), "pt") as f:  # an older capsnet refuses it by its
        assert f.metadata()["format_version"] == "3"  # version (it called the save damaged: a review, 2026-12-01)
    assert not (tmp_path / "split" / "best.safetensors").exists()  # nothing of an evaluation was written
    # it is not a final epoch: neither ended there by a resume asking for 1 of the 2 epochs its schedule planned,
    # nor packed (a review, 2026-12-01: both took it, the run called finished)
    with pytest.raises(ResumeError, match=r"stopped after training epoch 1 of the 2 it was training; it cannot end "
                                          r"there .* resume with --epochs 2 or more"):
        fit(TINY, TrainConfig(**{**cfg.to_dict(), "epochs": 1}), tmp_path / "split", device="cpu", progress=False,
            resume=True)
    with pytest.raises(ValueError, match=r"holds epoch 1 trained but not yet evaluated; evaluate it \(capsnet train "
                                         r"--out .* --resume\) and pack the run then"):
        pack(tmp_path / "split", tmp_path / "packed.safetensors")
    # resumed on another device type: no batch is left to draw in another order, so no warning says one is
    g = torch.Generator()
    moved = {**saved.state["within"], "device": "cuda"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resume_within(moved, 1, saved, g, 5, len(moved["sums"]))[0] == 5
    fit(TINY, cfg, tmp_path / "split", device="cpu", progress=False, resume=True)
    assert_same_run(tmp_path / "straight", tmp_path / "split")


def test_a_run_directory_another_process_writes_is_refused_and_released_after(tmp_path):
    """Two runs into one --out both trained, leaving one's best beside the other's last (a review, 2026-11-30). The
    lock is RUN/.lock's flock: held here on a descriptor of its own, as another process would hold it."""
    from capsnet.checkpoint import RunLock

    cfg = TrainConfig(**{**CFG.to_dict(), "epochs": 1})
    tmp_path.mkdir(exist_ok=True)
    with RunLock(tmp_path) as other:
        other.acquire()
        with pytest.raises(CheckpointError, match=rf"{tmp_path} is being written by another capsnet run \(process "
                                                  rf"{os.getpid()}\); wait for it to finish, or choose another"):
            fit(TINY, cfg, tmp_path, device="cpu", progress=False)
        assert not (tmp_path / "config.json").exists() and not (tmp_path / "last.safetensors").exists()
    (tmp_path / ".last.safetensors.tmp-x1y2z3w4").write_bytes(b"cut short by a kill")  # left by a killed save
    fit(TINY, cfg, tmp_path, device="cpu", progress=False)  # the lock was released; the new run removes it
    assert not list(tmp_path.glob(".*.tmp-*")) and (tmp_path / "last.safetensors").exists()
    assert not (tmp_path / ".lock").exists()  # removed as the run let go
    fit(TINY, TrainConfig(**{**CFG.to_dict(), "epochs": 2}), tmp_path, device="cpu", progress=False, resume=True)


@pytest.mark.parametrize("files", [{"metrics.jsonl": "notes\n"}, {"config.json": '{"my": "own"}'},
                                   {"best.safetensors": "x"}])
def test_a_new_run_does_not_replace_files_no_run_left(tmp_path, files):
    """A folder holding config.json or metrics.jsonl of the user's own (no last.safetensors) had them replaced
    without a word (a review, 2026-11-30); the config.json of a run stopped before its first save is replaced."""
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(CheckpointError, match=rf"holds {next(iter(files))} but no last.safetensors, so no run to "
                                              rf"resume: they are not this run's to replace"):
        fit(TINY, TrainConfig(**{**CFG.to_dict(), "epochs": 1}), tmp_path, device="cpu", progress=False)
    assert {p.name: p.read_text() for p in tmp_path.iterdir() if not p.name.startswith(".")} == files


def test_a_new_run_replaces_the_files_of_a_run_stopped_before_its_first_save(tmp_path):
    """A run killed between its first best.safetensors and last.safetensors leaves both beside its config.json:
    they are a run's, so a new run starts over (it was refused for a while: a review, 2026-11-30)."""
    import json

    (tmp_path / "config.json").write_text(json.dumps({"model": "capsnet", "model_config": {}, "train_config": {}}))
    (tmp_path / "best.safetensors").write_text("the killed run's")
    fit(TINY, TrainConfig(**{**CFG.to_dict(), "epochs": 1}), tmp_path, device="cpu", progress=False)
    assert json.loads((tmp_path / "config.json").read_text())["model_config"] == TINY.to_dict()
    assert load_checkpoint(tmp_path, "best").state["epoch"] == 1


def test_a_run_another_process_writes_is_said_so_before_anything_else(trained_run, tmp_path):
    """With the folder's last.safetensors written by a run still going, a new run was told to pass --resume, and
    a --resume loaded the data before it was refused (a review, 2026-11-30)."""
    import shutil

    from capsnet.checkpoint import RunLock

    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    ckpt = load_checkpoint(run, "last")
    model = CapsNetConfig(**ckpt.model_config)
    cfg = TrainConfig(**{**ckpt.train_config, "epochs": ckpt.train_config["epochs"] + 1})
    with RunLock(run) as other:
        other.acquire()
        for resume in (False, True):
            with pytest.raises(CheckpointError, match="is being written by another capsnet run"):
                fit(model, cfg, run, device="cpu", progress=False, resume=resume, data_root="/nowhere")


def test_a_run_written_into_a_new_folder_while_this_one_loaded_its_data_is_refused_not_replaced(
        trained_run, tmp_path, monkeypatch):
    """A folder that did not exist as a run began was locked only at its first write: a second trainer into the
    same new --out, still loading its data as the first finished, replaced the finished run without a word (a
    review, 2026-11-30). Here the other run's files land in the folder while this one loads its data."""
    import capsnet.train as train_module

    run, real = tmp_path / "new", train_module.load_training

    def load_while_another_run_finishes(*args, **kwargs):
        shutil.copytree(trained_run, run)  # another process's run, written and finished meanwhile
        return real(*args, **kwargs)
    monkeypatch.setattr(train_module, "load_training", load_while_another_run_finishes)
    with pytest.raises(CheckpointError, match=rf"another capsnet run wrote {run} while this one prepared its start: "
                                              rf"{run} already holds a run \(last.safetensors\)"):
        fit(TINY, TrainConfig(**{**CFG.to_dict(), "epochs": 1}), run, device="cpu", progress=False)
    assert sorted(p.name for p in run.iterdir()) == sorted(p.name for p in trained_run.iterdir())
    assert all((run / p.name).read_bytes() == p.read_bytes() for p in trained_run.iterdir())


def test_a_folder_locked_as_the_run_began_and_replaced_while_it_loaded_gets_nothing_written(trained_run, tmp_path,
                                                                                           monkeypatch):
    """A folder that existed as the run began is locked then; replaced by another run's while the data loaded, it
    got this run's config.json (and a finished run's --resume rewrote its metrics.jsonl and exited 0): a review of
    torchrun runs, 2026-11-30. Now nothing is written once RUN/.lock is not the file this run holds."""
    import capsnet.train as train_module

    real = train_module.load_training
    other = {".lock": "12345", "config.json": "the other run's", "metrics.jsonl": "the other run's\n"}

    def replaced_while_loading(run):
        def load(*args, **kwargs):
            replace_folder(run, other)
            return real(*args, **kwargs)
        return load

    fresh = tmp_path / "fresh"
    fresh.mkdir()  # made beforehand: the path that locks at the start
    monkeypatch.setattr(train_module, "load_training", replaced_while_loading(fresh))
    with pytest.raises(CheckpointError, match=rf"{fresh} was removed or replaced while this run trained"):
        fit(TINY, TrainConfig(**{**CFG.to_dict(), "epochs": 1}), fresh, device="cpu", progress=False)
    assert {p.name: p.read_text() for p in fresh.iterdir()} == other
    finished = tmp_path / "finished"
    shutil.copytree(trained_run, finished)
    ckpt = load_checkpoint(finished, "last")
    monkeypatch.setattr(train_module, "load_training", replaced_while_loading(finished))
    with pytest.raises(CheckpointError, match="was removed or replaced while this run trained"):
        fit(CapsNetConfig(**ckpt.model_config), TrainConfig(**ckpt.train_config), finished, device="cpu",
            progress=False, resume=True)
    assert {p.name: p.read_text() for p in finished.iterdir()} == other


def test_a_run_whose_folder_is_removed_and_made_again_writes_nothing_more_there(tmp_path):
    """A run whose folder was deleted (and made again by another run, which locked a new .lock) wrote its next
    saves beside the new run's files, and removed the new run's lock as it ended (a review, 2026-11-30)."""
    run = tmp_path / "run"

    def replace_the_folder(record):  # by a run that holds its own .lock
        replace_folder(run, {".lock": "12345", "config.json": "the other run's"})
    with pytest.raises(CheckpointError, match=rf"{run} was removed or replaced while this run trained"):
        fit(TINY, TrainConfig(**{**CFG.to_dict(), "epochs": 2}), run, device="cpu", progress=False,
            on_epoch=replace_the_folder)
    assert {p.name: p.read_text() for p in run.iterdir()} == {".lock": "12345", "config.json": "the other run's"}
    # a save inside the epoch checks too (every step saves here), and a folder removed and not made again
    run.mkdir(exist_ok=True)
    shutil.rmtree(run)
    with pytest.raises(CheckpointError, match=rf"{run} was removed or replaced while this run trained"):
        fit(TINY, TrainConfig(**{**CFG.to_dict(), "epochs": 2}), run, device="cpu", progress=False,
            on_epoch=replace_the_folder, save_every_s=1e-9)
    assert {p.name: p.read_text() for p in run.iterdir()} == {".lock": "12345", "config.json": "the other run's"}
    from capsnet.checkpoint import RunLock

    gone = tmp_path / "gone"
    gone.mkdir()
    with RunLock(gone) as lock:
        lock.acquire()
        shutil.rmtree(gone)
        with pytest.raises(CheckpointError, match="removed or replaced"):
            lock.check()


@pytest.mark.parametrize("how", ["no flock", "flock refused"])
def test_without_a_lock_the_stale_writes_go_and_no_lock_file_stays(tmp_path, monkeypatch, how):
    """Windows (no fcntl) and file systems that refuse flock skipped the removal of writes a kill cut short, and
    the second left RUN/.lock behind (a review, 2026-11-30)."""
    import errno
    import sys

    if how == "no flock":
        monkeypatch.setitem(sys.modules, "fcntl", None)  # import fcntl fails, as on Windows
    else:
        import fcntl

        def refuse(fd, op):
            raise OSError(errno.ENOLCK, "No locks available")
        monkeypatch.setattr(fcntl, "flock", refuse)
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / ".last.safetensors.tmp-x1y2z3w4").write_bytes(b"cut short")
    fit(TINY, TrainConfig(**{**CFG.to_dict(), "epochs": 1}), tmp_path, device="cpu", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.safetensors", "config.json", "last.safetensors",
                                                          "metrics.jsonl"]


def test_a_finite_loss_whose_gradient_is_not_stops_before_nan_weights_are_saved(tmp_path, monkeypatch):
    """Unclipped, an infinite gradient makes Adam's step NaN in every weight while the loss stays finite: the run
    saved and evaluated the NaN weights, and its resume was refused (a review, 2026-11-30)."""
    from capsnet import models
    from capsnet.train import NonFiniteLoss

    spec = models.MODELS["capsnet"]
    calls = []
    cfg = TrainConfig(**{**CFG.to_dict(), "epochs": 3})
    last_of_epoch_2 = 2 * -(-cfg.train_size // cfg.batch_size)  # no later step's loss to show it

    def infinite_gradient(model, images, labels, components=None, **kw):
        calls.extend([1] if model.training else [])
        loss, scores = spec.loss(model, images, labels, components, **kw)
        if model.training and len(calls) == last_of_epoch_2:
            loss.register_hook(lambda g: g * float("inf"))  # the loss stays finite, its gradient does not
        return loss, scores

    monkeypatch.setitem(models.MODELS, "capsnet", spec._replace(loss=infinite_gradient))
    with pytest.raises(NonFiniteLoss, match=r"the weights \(\S+ first\) became NaN or infinite \(a gradient that was "
                                            r"not finite\) in epoch 2, after steps whose loss was finite; .*still "
                                            r"holds epoch 1"):
        fit(TINY, cfg, tmp_path, device="cpu", progress=False)
    kept = load_checkpoint(tmp_path, "last")
    assert kept.state["epoch"] == 1 and all(torch.isfinite(t).all() for t in kept.model_state.values())
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 1


@pytest.mark.parametrize("spoil", ["buffer", "optimizer"])
def test_a_running_statistic_or_optimizer_state_that_is_not_finite_is_never_saved(tmp_path, monkeypatch, spoil):
    """A loss kept finite by BatchNorm left its running variance infinite: the run ended with exit status 0 and a
    last and a best that eval and --resume refuse (efficient-capsnet at --lr 1e7, U-Net, pix2pix); a gradient too
    large to square left Adam's exp_avg_sq infinite, resumed silently with those weights frozen (the baseline at
    --lr 1e6) (a review, 2026-12-02). Both are checked before every save, as the weights are."""
    from capsnet import models, train
    from capsnet.models import EfficientCapsNetConfig
    from capsnet.train import NonFiniteLoss

    spec = models.MODELS["efficient-capsnet"]
    calls, opts = [], []
    cfg = TrainConfig(**{**CFG.to_dict(), "epochs": 3})
    last_of_epoch_2 = 2 * -(-cfg.train_size // cfg.batch_size)
    made = train.make_optimizer

    def recorded(*a, **k):
        opts.append(made(*a, **k))
        return opts[-1]

    def spoiled(model, images, labels, components=None, **kw):
        out = spec.loss(model, images, labels, components, **kw)
        calls.extend([1] if model.training else [])
        if model.training and len(calls) == last_of_epoch_2:
            with torch.no_grad():
                if spoil == "buffer":  # after this step's forward pass updated it
                    model.features[2].running_var.data.fill_(float("inf"))  # (.data: its backward still reads it)
                else:
                    next(iter(opts[0].state.values()))["exp_avg_sq"].fill_(float("inf"))
        return out

    monkeypatch.setattr(train, "make_optimizer", recorded)
    monkeypatch.setitem(models.MODELS, "efficient-capsnet", spec._replace(loss=spoiled))
    said = (r"the model's features.2.running_var became NaN or infinite \(a running statistic, such as BatchNorm's"
            if spoil == "buffer" else r"Adam's exp_avg_sq of \S+ became NaN or infinite \(a gradient too large")
    with pytest.raises(NonFiniteLoss, match=said + r".* in epoch 2, after steps whose loss was finite; stopped without "
                                                   r"saving, .*still holds epoch 1"):
        fit(EfficientCapsNetConfig(decoder=False), cfg, tmp_path, device="cpu", progress=False)
    kept = load_checkpoint(tmp_path, "last")
    assert kept.state["epoch"] == 1 and all(torch.isfinite(t).all() for t in kept.model_state.values())
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 1


def test_a_held_out_loss_that_is_not_finite_stops_training_and_no_file_holds_a_bare_nan(tmp_path, monkeypatch,
                                                                                        trained_run, capsys):
    """Weights that are finite but whose outputs overflow (a diverged last step, --lr 1e6) gave a NaN held-out loss
    beside a meaningless accuracy, written into metrics.jsonl and eval's report as bare NaN, which no strict JSON
    parser reads (a review, 2026-11-30): the run now stops before saving that epoch, and the files write null."""
    from capsnet import cli, models
    from capsnet.train import NonFiniteLoss, write_metrics

    spec = models.MODELS["capsnet"]
    evaluations = []

    def overflowing_in_epoch_2(model, images, labels, components=None, **kw):
        loss, scores = spec.loss(model, images, labels, components, **kw)
        if not model.training:
            evaluations.append(1)
            if len(evaluations) > -(-CFG.test_size // CFG.eval_batch_size):  # epoch 2's evaluation
                return loss * float("nan"), scores
        return loss, scores

    monkeypatch.setitem(models.MODELS, "capsnet", spec._replace(loss=overflowing_in_epoch_2))
    with pytest.raises(NonFiniteLoss, match=r"the held-out figures after epoch 2 are not finite \(test_loss nan\).*"
                                            r"still holds epoch 1. Lower --lr"):
        fit(TINY, CFG, tmp_path / "run", device="cpu", progress=False)
    assert load_checkpoint(tmp_path / "run", "last").state["epoch"] == 1
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 1
    # a save due before the evaluation holds the epoch trained: the message said "stopped without saving this
    # epoch", and its fix a resume would meet again (a review, 2026-12-01)
    evaluations.clear()
    with pytest.raises(NonFiniteLoss, match=r"still holds epoch 1 \+ all 5 batches of epoch 2, not yet evaluated\. "
                                            r"Lower --lr, or bound the gradient with --grad-clip, in a new run"):
        fit(TINY, CFG, tmp_path / "due", device="cpu", progress=False, save_every_s=1e-9)

    def strict(text):
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))

    write_metrics(tmp_path, [{"epoch": 1, "grad_norm": float("inf"), "test_loss": float("nan"), "x": [1.5, -math.inf]}])
    assert strict((tmp_path / "metrics.jsonl").read_text()) == {"epoch": 1, "grad_norm": None, "test_loss": None,
                                                                 "x": [1.5, None]}
    monkeypatch.setitem(models.MODELS, "capsnet", spec._replace(
        loss=lambda *a, **k: (lambda loss, scores: (loss * float("nan"), scores))(*spec.loss(*a, **k))))
    assert cli.main(["eval", "--checkpoint", str(trained_run), "--json", str(tmp_path / "eval.json"), "--test-size",
                     "200", "--no-progress"]) == 0  # an old run's checkpoint, saved before the stop above
    assert strict((tmp_path / "eval.json").read_text())["loss"] is None
    # and says what its figures are: NaN scores count as class 0 by argmax (a review)
    assert ("the model's outputs are NaN or infinite (test loss nan): its weights overflow, as a diverging run's do, "
            "and the figures below mean nothing" in " ".join(capsys.readouterr().err.split()))


def test_a_new_run_does_not_replace_a_runs_best_and_metrics_whose_last_checkpoint_was_removed(trained_run, tmp_path,
                                                                                             capsys):
    """A finished run whose last.safetensors was deleted (it is the big one; the resume's refusal pointed there):
    a new run replaced its best.safetensors and metrics.jsonl without a word (a review, 2026-11-30). metrics.jsonl
    is written after a run's first last.safetensors, so beside it the folder is no run killed before its first
    save."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    (run / "last.safetensors").unlink()
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    with pytest.raises(CheckpointError, match="holds config.json and best.safetensors and metrics.jsonl but no "
                                              "last.safetensors, so no run to resume: they are not this run's to "
                                              "replace"):
        fit(TINY, TrainConfig(**{**CFG.to_dict(), "epochs": 1}), run, device="cpu", progress=False)
    with pytest.raises(CheckpointError, match=r"nothing to resume in .*: no last.safetensors; its best.safetensors "
                                              r"and metrics.jsonl are a run's whose last checkpoint was removed: "
                                              r"train anew in another output directory"):
        fit(TINY, TrainConfig(**{**CFG.to_dict(), "epochs": 1}), run, device="cpu", progress=False, resume=True)
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before
    # a run whose first last.safetensors was never written (its save failed after best's: a full disk): nothing
    # was removed, and a new run there starts again, as the refusal says (a review, 2026-11-30)
    (run / "metrics.jsonl").unlink()
    with pytest.raises(CheckpointError, match=r"nothing to resume in .*: the run there stopped before its first "
                                              r"last.safetensors was written; start it again without --resume"):
        fit(TINY, TrainConfig(**{**CFG.to_dict(), "epochs": 1}), run, device="cpu", progress=False, resume=True)
    fit(TINY, TrainConfig(**{**CFG.to_dict(), "epochs": 1}), run, device="cpu", progress=False)
    assert (run / "last.safetensors").exists()


def test_a_run_stopped_at_an_epochs_end_cannot_be_ended_there_by_a_resume(tmp_path, monkeypatch, capsys):
    """Stopped after epoch 1 of 2 and resumed with --epochs 1: the run was called finished, with epoch 1 never
    evaluated (no best.safetensors, a metrics row without its figures) and its schedule planned for 2 (a review,
    2026-11-30). Refused, in fit and the CLI, naming the epochs that may end it."""
    from capsnet.cli import main

    cfg = TrainConfig(**{**CFG.to_dict(), "epochs": 2, "eval_every": 2})  # 5 steps an epoch, epoch 1 not evaluated
    monkeypatch.setattr("capsnet.train.SAVE_AFTER_S", 1e9)
    sent = _sigterm_before_step(monkeypatch, 4)  # epoch 1's last batch: saved at its end, stopped there
    with pytest.raises(KeyboardInterrupt):
        fit(TINY, cfg, tmp_path, device="cpu", progress=False)
    monkeypatch.undo()
    assert sent
    saved = load_checkpoint(tmp_path, "last")
    assert saved.state["epoch"] == 1 and "within" not in saved.state and saved.train_config["epochs"] == 2
    short = TrainConfig(**{**cfg.to_dict(), "epochs": 1})
    said = r"stopped after epoch 1 of the 2 it was training; .* resume with --epochs 2 or more"
    with pytest.raises(ResumeError, match=said):
        fit(TINY, short, tmp_path, device="cpu", progress=False, resume=True)
    assert main(["train", "--out", str(tmp_path), "--resume", "--epochs", "1", "--no-progress"]) == 2
    assert "stopped after epoch 1 of the 2" in capsys.readouterr().err
    assert not (tmp_path / "best.safetensors").exists()
    fit(TINY, cfg, tmp_path, device="cpu", progress=False, resume=True)  # the run's own epochs end it, evaluated
    assert load_checkpoint(tmp_path, "best").state["epoch"] == 2


@pytest.mark.parametrize("kind", ["classes", "pairs", "masks"])
def test_an_evaluation_that_fails_midway_gives_the_model_back_in_its_own_mode(kind):
    """evaluate, evaluate_pairs and evaluate_segmentation put the model in eval mode; an error inside (here the
    second batch's forward) must not leave a training model with dropout and batch norm frozen."""
    from capsnet.evaluate import evaluate_pairs, evaluate_segmentation
    from capsnet.models import create_model

    name, shape = {"classes": ("capsnet", (4, 1, 28, 28)), "pairs": ("capsnet", (4, 1, 36, 36)),
                   "masks": ("unet", (4, 1, 32, 32))}[kind]
    options = {"input_height": 36, "input_width": 36} if kind == "pairs" else {}
    model = create_model(name, **options).train()
    calls = []

    def second_fails(module, args):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt

    model.register_forward_pre_hook(second_fails)
    x = torch.rand(shape)
    with pytest.raises(KeyboardInterrupt):
        if kind == "classes":
            evaluate(model, x, torch.tensor([0, 1, 2, 3]), batch_size=2)
        elif kind == "pairs":
            evaluate_pairs(model, x, torch.tensor([[0, 1], [2, 3], [4, 5], [6, 7]]), batch_size=2)
        else:
            evaluate_segmentation(model, x, (x > 0.5).float(), batch_size=2)
    assert len(calls) == 2 and model.training and all(m.training for m in model.modules())


def test_fit_leaves_the_callers_random_stream_as_it_was(tmp_path):
    """fit seeds torch's RNG from cfg.seed for the run; a notebook's or a sweep's own stream after it was the run's
    (any two seeds before fit gave the same numbers after it)."""
    from capsnet.bench import measure_training

    cfg = TrainConfig(**{**CFG.to_dict(), "epochs": 1, "train_size": 32, "test_size": 32})
    for s in (111, 222):
        torch.manual_seed(s)
        fit(TINY, cfg, tmp_path / f"r{s}", device="cpu", progress=False)
        after = torch.rand(3)
        torch.manual_seed(s)
        assert torch.equal(after, torch.rand(3)), s
    # a benchmark step too (experiments measure each run's peak memory so), and its profiler's log level is unset
    had = "KINETO_LOG_LEVEL" in os.environ
    torch.manual_seed(7)
    measure_training("capsnet", TINY, batch_size=4, repeats=1)
    after = torch.rand(3)
    torch.manual_seed(7)
    assert torch.equal(after, torch.rand(3)) and ("KINETO_LOG_LEVEL" in os.environ) == had


def test_the_last_epoch_is_evaluated_when_eval_every_does_not_divide_the_epochs(tmp_path):
    """--epochs 3 --eval-every 2: epochs 2 and 3 are evaluated (every second epoch, and always the last), epoch 1
    is not; the run's final figure is epoch 3's. Found by mutation testing (2026-11-30): dropping the "and after the
    last" half of the condition left epoch 3 unevaluated, with no test failing."""
    final = fit(TINY, TrainConfig(**{**CFG.to_dict(), "epochs": 3, "eval_every": 2}), tmp_path, device="cpu",
                progress=False)
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2, 3]
    assert ["test_accuracy" in r for r in records] == [False, True, True]
    assert final["epoch"] == 3 and "test_accuracy" in final and final == records[-1]
    assert load_checkpoint(tmp_path, "best").state["best"]["epoch"] in (2, 3)


def test_best_checkpoint_keeps_the_first_best_epochs_weights_and_a_tie_does_not_replace_it(tmp_path, monkeypatch):
    """best.safetensors holds the weights of the epoch with the highest held-out accuracy; a later epoch that only
    ties it, or scores lower, leaves it alone. The scores are scripted (0.5, 0.5, 0.25) by wrapping evaluate_split,
    so epoch 1 is the best; its weights are those of a 1-epoch run of the same settings (the exponential schedule
    does not depend on the run's length). Found by mutation testing (2026-11-30): saving best.safetensors at every
    evaluated epoch (its weights then the last epoch's) and choosing ties by >= both survived the suite."""
    from scripted import script_held_out_scores

    script_held_out_scores(monkeypatch, [0.5, 0.5, 0.25])
    fit(TINY, TrainConfig(**{**CFG.to_dict(), "epochs": 3}), tmp_path / "three", device="cpu", progress=False)
    monkeypatch.undo()
    best = load_checkpoint(tmp_path / "three", "best")
    assert best.state["best"] == {"epoch": 1, "accuracy": 0.5, "split": "test"}
    fit(TINY, TrainConfig(**{**CFG.to_dict(), "epochs": 1}), tmp_path / "one", device="cpu", progress=False)
    one, last = _weights(tmp_path / "one"), _weights(tmp_path / "three")
    assert all(torch.equal(best.model_state[k], one[k]) for k in one)
    assert not all(torch.equal(best.model_state[k], last[k]) for k in last)  # the last epoch's are other weights


def test_a_resumed_run_keeps_its_best_epoch_until_a_later_one_beats_it(tmp_path, monkeypatch):
    """A resume that started its state with no best (its first evaluated epoch then replacing best.safetensors
    whatever it scored) passed every test (mutation testing, 2026-12-02). Scripted scores 0.5, then 0.25 after the
    resume: the best stays epoch 1's, its weights unchanged."""
    from scripted import script_held_out_scores

    script_held_out_scores(monkeypatch, [0.5, 0.25])
    fit(TINY, TrainConfig(**{**CFG.to_dict(), "epochs": 1}), tmp_path, device="cpu", progress=False)
    first = load_checkpoint(tmp_path, "best")
    fit(TINY, TrainConfig(**{**CFG.to_dict(), "epochs": 2}), tmp_path, device="cpu", progress=False, resume=True)
    best = load_checkpoint(tmp_path, "best")
    assert best.state["best"] == {"epoch": 1, "accuracy": 0.5, "split": "test"}
    assert all(torch.equal(best.model_state[k], v) for k, v in first.model_state.items())
    assert load_checkpoint(tmp_path, "last").state["epoch"] == 2


class _FakeBar:
    """progress_bar's stand-in: each batch (``update``) moves the fake clock on by 0.25 s."""
    def __init__(self, clock):
        self.clock = clock

    def update(self, n=1):
        self.clock[0] += 0.25 * n

    def set_postfix(self, *a, **k):
        pass

    def close(self):
        pass


def _fake_clock(monkeypatch):
    import types

    import capsnet.train as train_mod

    clock = [1000.0]
    monkeypatch.setattr(train_mod, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    monkeypatch.setattr(train_mod, "progress_bar", lambda *a, **k: _FakeBar(clock))
    return clock


def test_train_images_per_s_is_images_over_the_epochs_seconds_with_a_fake_clock(tmp_path, monkeypatch):
    """train_images_per_s is the epoch's training images over its seconds: 160 images in 5 batches of 0.25 s on a
    fake clock (train's time source replaced; each batch advances it) is 160 / 1.25 = 128 images/s, not batches/s
    (4). Found by mutation testing (2026-11-30): a mutant counting batches instead of images survived the suite."""
    _fake_clock(monkeypatch)
    fit(TINY, CFG, tmp_path, device="cpu", progress=False)
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["train_images_per_s"] for r in records] == [pytest.approx(128.0), pytest.approx(128.0)]


def test_a_resumed_epochs_images_per_s_counts_both_parts_seconds(tmp_path, monkeypatch):
    """An epoch saved inside (after 2 of its 5 batches) and resumed: its train_images_per_s is its 160 images over
    both parts' seconds, 5 x 0.25 s on a fake clock (128 images/s), not over the resumed part's 3 batches alone
    (213). Found by mutation testing (2026-11-30): starting the resumed epoch's clock from 0 survived the suite."""
    def stopped(step, *args):
        if step == 7:  # 5 batches an epoch: 2 batches into epoch 2
            raise _Killed
        return lr_at(step, *args)
    _fake_clock(monkeypatch)
    monkeypatch.setattr("capsnet.train.lr_at", stopped)
    with pytest.raises(_Killed):
        fit(TINY, CFG, tmp_path, device="cpu", progress=False, save_every_s=1e-9)
    monkeypatch.undo()
    within = load_checkpoint(tmp_path, "last").state["within"]
    assert within["batches"] == 2
    _fake_clock(monkeypatch)
    fit(TINY, CFG, tmp_path, device="cpu", progress=False, resume=True)
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2]
    assert records[-1]["train_images_per_s"] == pytest.approx(128.0)


def test_evaluate_checkpoint_scores_the_checkpoint_which_asks_for(tmp_path, monkeypatch):
    """evaluate_checkpoint(which="last") (capsnet eval --which last) scores last.safetensors, and "best" the best
    epoch's file, here another epoch (the held-out scores scripted 0.9 then 0.1, so best is epoch 1). Found by
    mutation testing (2026-11-30): scoring best.safetensors whatever --which said survived the suite."""

    from capsnet.evaluate import evaluate_checkpoint

    from scripted import script_held_out_scores

    script_held_out_scores(monkeypatch, [0.9, 0.1])
    fit(TINY, CFG, tmp_path, device="cpu", progress=False)
    monkeypatch.undo()
    for which, epoch in (("last", 2), ("best", 1)):
        got = evaluate_checkpoint(tmp_path, which=which, test_size=64, device="cpu", progress=False)
        assert got.checkpoint.state["epoch"] == epoch and got.images == 64


def test_stop_requested_tells_of_the_last_fit_alone():
    """The flag a Ctrl-C in a run's last epoch leaves (capsnet experiment stops there) was cleared by run_plan alone:
    a fit stopped so in a notebook left it set for a later synthetic_probe_rows (a review of 2026-11-30's change);
    each fit clears it as it starts."""
    from capsnet import train
    from capsnet.train import SaveThenStop, stop_requested

    train._STOP_REQUEST["asked"] = True  # as an earlier fit's last epoch leaves it
    with SaveThenStop(enabled=True) as stop:
        assert not stop_requested()
        stop._handler(2, None)  # the signal, as the armed handler takes it
        assert stop.asked and stop_requested()
    assert stop_requested(clear=True) and not stop_requested()


def test_a_resume_to_more_epochs_warns_where_a_schedule_follows_the_runs_total(tmp_path):
    """A review (2026-12-01): an EM run resumed with a larger --epochs differed from one trained for it from the
    start, without a word: its margin follows step / total steps and fell back (0.9 to 0.67) at the resume."""
    import dataclasses

    from capsnet.models import EMCapsNetConfig
    from capsnet.train import _stretched_schedules, start_or_resume

    cfg = dataclasses.replace(CFG, epochs=1, train_size=64, test_size=32, lr_schedule="linear")
    fit(TINY, cfg, tmp_path, device="cpu", progress=False)
    with pytest.warns(UserWarning, match=r"^--epochs 2 where the run in .* planned 1: the linear schedule's decay "
                                         r"follows the new total from here, so this run will not match one trained "
                                         r"for 2 epochs from the start"):
        start_or_resume(tmp_path, TINY, dataclasses.replace(cfg, epochs=2), True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        start_or_resume(tmp_path, TINY, cfg, True)  # the same total: exact, nothing said
        # under torchrun every process but the first reads the run with warn=False: said once, not once a process
        # (a review, 2026-12-01)
        start_or_resume(tmp_path, TINY, dataclasses.replace(cfg, epochs=2), True, warn=False)
    em = EMCapsNetConfig()
    assert _stretched_schedules(em, CFG) == ["the spread loss's margin (margin_warmup)"]
    assert _stretched_schedules(dataclasses.replace(em, margin_warmup=0.0), CFG) == []
    assert _stretched_schedules(TINY, CFG) == []  # CapsNet under the exponential schedule: a resume is exact


def test_an_epoch_trained_not_evaluated_names_the_epochs_a_resume_may_end_at():
    """A save of epoch 2 trained, its evaluation pending, of a run planned for 3: --epochs 1 said "resume with
    --epochs 2 or more", which was then refused as ending epoch 2 on a schedule planned for 3 (a review,
    2026-12-01); both now name 3. Planned for 2, --epochs 2 ends it there (evaluated by the resume)."""
    from pathlib import Path

    from capsnet.train import check_epochs

    state = {"epoch": 1, "within": {"epoch": 2, "batches": 6, "evaluation_pending": True}}
    with pytest.raises(ResumeError, match=r"x holds epoch 2 trained, not yet evaluated, past the 1 asked for; "
                                          r"resume with --epochs 3 or more"):
        check_epochs(state, 1, Path("x"), planned=3)
    with pytest.raises(ResumeError, match=r"x stopped after training epoch 2 of the 3 it was training; it cannot end "
                                          r"there .*resume with --epochs 3 or more"):
        check_epochs(state, 2, Path("x"), planned=3)
    with pytest.raises(ResumeError, match=r"past the 1 asked for; resume with --epochs 2 or more"):
        check_epochs(state, 1, Path("x"), planned=2)
    check_epochs(state, 2, Path("x"), planned=2)
    check_epochs(state, 3, Path("x"), planned=3)


def test_no_dropout_warning_for_an_epoch_with_no_batch_left():
    """An epoch trained by 2 torchrun processes, its evaluation pending, resumed by one: no batch is left to draw a
    dropout mask, so the warning that the rest of the epoch draws other masks is not said (a review, 2026-12-01)."""
    from capsnet.train import restore_rank_rng

    from types import SimpleNamespace

    saved = SimpleNamespace(path="x/last.safetensors")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        restore_rank_rng(saved, {"epoch": 2, "processes": 2, "evaluation_pending": True}, 0, 1, torch.device("cpu"),
                         True)
    with pytest.warns(RuntimeWarning, match="x/last.safetensors was saved inside epoch 2 by 2 process"):  # batches
        restore_rank_rng(saved, {"epoch": 2, "processes": 2}, 0, 1, torch.device("cpu"), True)  # left: said


class _Buffered:
    """A stdout redirected to a file: what is written waits in a buffer until flushed."""

    def __init__(self) -> None:
        self.pending, self.flushed = "", ""

    def write(self, s: str) -> int:
        self.pending += s
        return len(s)

    def flush(self) -> None:
        self.flushed, self.pending = self.flushed + self.pending, ""


def test_each_epochs_line_is_flushed_to_a_redirected_stdout_as_it_is_written(tmp_path, monkeypatch, caplog):
    """tqdm.write leaves stdout unflushed: with the output in a log (block-buffered), every epoch's result line came
    at the run's end, and none for a run killed outright (a review, 2026-12-02). And -v logs every epoch's record,
    the ones not evaluated too (--eval-every), as the README says."""
    out = _Buffered()
    monkeypatch.setattr("sys.stdout", out)
    with caplog.at_level("INFO", logger="capsnet.train"):
        fit(TINY, TrainConfig(**{**CFG.to_dict(), "epochs": 3, "eval_every": 2}), tmp_path / "run", device="cpu",
            progress=True)
    assert "epoch 2: test accuracy" in out.flushed and "epoch 3: test accuracy" in out.flushed
    assert [r.getMessage().split(":")[0] for r in caplog.records if r.getMessage().startswith("epoch ")] == \
        ["epoch 1", "epoch 2", "epoch 3"]


def test_the_running_sums_make_no_float64_where_the_device_has_none(tmp_path, monkeypatch):
    """Apple's MPS has no float64, and training and evaluation kept their running sums (losses, counts, norms) in
    float64 on the model's device: every run and evaluation on --device mps failed at its first batch (a review
    of portability, 2026-12-02). No MPS here: with ``sum_dtype`` answering as it does for MPS, a CPU run and its
    evaluation make no float64 tensor in the training or evaluation loop, and the figures are the float64 run's to
    float32 rounding."""
    from capsnet import evaluate as evaluate_module
    from capsnet import train as train_module
    from capsnet.runtime import sum_dtype
    from float64_probe import Float64Made

    assert sum_dtype("mps") == torch.float32 and sum_dtype("cpu") == sum_dtype(torch.device("cpu")) == torch.float64
    cfg = TrainConfig(**{**CFG.to_dict(), "epochs": 1, "grad_clip": 5.0})
    wide = fit(TINY, cfg, tmp_path / "wide", device="cpu", progress=False)
    for module in (train_module, evaluate_module):
        monkeypatch.setattr(module, "sum_dtype", lambda device: torch.float32, raising=False)
    with Float64Made("train.py", "evaluate.py") as made:
        narrow = fit(TINY, cfg, tmp_path / "narrow", device="cpu", progress=False)
    assert made.lines == []
    assert (narrow["test_accuracy"], narrow["train_accuracy"]) == (wide["test_accuracy"], wide["train_accuracy"])
    for key in ("train_loss", "test_loss", "grad_norm"):
        assert narrow[key] == pytest.approx(wide[key], rel=1e-5), key


def test_adam_beta1_is_the_optimizers_and_refused_where_the_gan_keeps_its_own(tmp_path, capsys):
    """SegCaps' reference code trains Adam with beta1 0.99, which capsnet could not set (PyTorch's 0.9 always; a
    research reading of the SegCaps probes, 2026-12-03): --adam-beta1 sets it; the GAN loop keeps pix2pix's 0.5."""
    import torch

    from capsnet.cli import main
    from capsnet.gan import fit_gan
    from capsnet.models import Pix2pixConfig, create_model
    from capsnet.train import TrainConfig, make_optimizer

    model = create_model("unet", base_channels=4, depth=2)
    assert make_optimizer(model, TrainConfig(), torch.device("cpu")).param_groups[0]["betas"] == (0.9, 0.999)
    assert make_optimizer(model, TrainConfig(adam_beta1=0.99), torch.device("cpu")).param_groups[0]["betas"] == \
        (0.99, 0.999)
    with pytest.raises(ValueError, match=r"adam_beta1 must lie in \[0, 1\)"):
        TrainConfig(adam_beta1=1.0)
    with pytest.raises(ValueError, match="the GAN loop of pix2pix keeps pix2pix's beta1 of 0.5"):
        fit_gan(Pix2pixConfig(base_channels=4, disc_channels=4),
                TrainConfig(dataset="mnist-sample-skeleton", adam_beta1=0.99), tmp_path / "gan", progress=False)
    with pytest.raises(SystemExit):
        main(["train", "--dataset", "mnist-sample-skeleton", "--model", "pix2pix", "--adam-beta1", "0.99", "--out",
              str(tmp_path / "g")])
    assert "--adam-beta1 does not apply to the GAN loop of --model pix2pix" in capsys.readouterr().err
    assert main(["train", "--dataset", "mnist-sample", "--epochs", "1", "--train-size", "32", "--test-size", "16",
                 "--conv1-channels", "8", "--primary-types", "2", "--batch-size", "32", "--adam-beta1", "0.99",
                 "--no-progress", "--out", str(tmp_path / "run")]) == 0
    last = load_checkpoint(tmp_path / "run", "last")
    assert last.train_config["adam_beta1"] == 0.99
    assert tuple(last.optimizer_state["param_groups"][0]["betas"]) == (0.99, 0.999)
