"""The learning-rate schedules (``TrainConfig.lr_schedule``, ``lr_at``) and ``capsnet train --preset``.

The linear schedule is checked against values worked out by hand; the preset
through ``capsnet.cli.main`` with ``fit`` replaced (no training), except the
resume, which needs a run on disk (tiny sizes, on the CPU).
"""
from __future__ import annotations

import dataclasses
import json

import pytest

from capsnet import cli
from capsnet import train as train_mod
from capsnet.checkpoint import load_checkpoint, save_checkpoint
from capsnet.models import CapsNetConfig
from capsnet.train import TrainConfig, fit, lr_at, resume_configs

LINEAR = TrainConfig(lr=1e-3, lr_schedule="linear", warmup_steps=4)
TINY = CapsNetConfig(conv1_channels=8, primary_types=2, decoder_hidden=(32, 64))
TINY_FLAGS = ["--conv1-channels", "8", "--primary-types", "2", "--model-option", "decoder_hidden=[32,64]"]


# ------------------------------------------------------------------------------------------ lr_at


@pytest.mark.parametrize("step, expected", [
    (0, 0.25e-3), (1, 0.5e-3), (2, 0.75e-3), (3, 1e-3),  # warm-up: lr * (step + 1) / 4
    (4, 1e-3), (8, 0.75e-3), (12, 0.5e-3), (19, 1e-3 / 16),  # decay: lr * (20 - step) / 16
    (20, 0.0),  # the end of the run
])
def test_linear_schedule_by_hand(step, expected):
    assert lr_at(step, LINEAR, total_steps=20) == pytest.approx(expected, abs=1e-15)


def test_linear_schedule_rises_then_falls_to_zero_at_the_last_step():
    rates = [lr_at(s, LINEAR, total_steps=20) for s in range(21)]
    assert max(rates) == pytest.approx(1e-3) and rates.index(max(rates)) == 3
    assert all(a < b for a, b in zip(rates[:4], rates[1:4]))  # strictly up during the warm-up
    assert all(a > b for a, b in zip(rates[4:], rates[5:]))  # strictly down after it
    assert rates[19] > 0 and rates[20] == 0.0  # the last update still moves the weights; the run ends at 0


def test_linear_schedule_without_warmup_starts_at_lr():
    cfg = TrainConfig(lr=2e-3, lr_schedule="linear")
    assert [lr_at(s, cfg, total_steps=10) for s in (0, 5, 9, 10)] == pytest.approx([2e-3, 1e-3, 2e-4, 0.0])


def test_exponential_default_is_unchanged():
    cfg = TrainConfig()
    assert cfg.lr_schedule == "exponential" and cfg.warmup_steps == 0
    for step, expected in ((0, 1e-3), (2000, 0.96e-3), (1000, 1e-3 * 0.96 ** 0.5), (10000, 1e-3 * 0.96 ** 5)):
        assert lr_at(step, cfg) == pytest.approx(expected)
        assert lr_at(step, cfg, total_steps=50) == lr_at(step, cfg)  # the run's length does not enter it


def test_exponential_schedule_with_a_warmup_by_hand():
    # a ramp (step + 1) / W up to the authors' decaying rate, then that rate alone
    cfg = TrainConfig(lr=1e-3, lr_decay=0.5, lr_decay_steps=4, warmup_steps=4)
    for step, expected in ((0, 1e-3 * 0.5 ** 0 / 4), (1, 1e-3 * 0.5 ** 0.25 * 2 / 4), (3, 1e-3 * 0.5 ** 0.75),
                           (4, 1e-3 * 0.5), (8, 1e-3 * 0.25)):
        assert lr_at(step, cfg) == pytest.approx(expected, rel=1e-12)
    # a run shorter than the warm-up ends on its ramp, refused by nothing
    assert lr_at(1, cfg, total_steps=2) == lr_at(1, cfg)


def test_a_floor_stops_the_decay_of_either_schedule_after_the_warmup_by_hand():
    # Efficient-CapsNet's official recipe: 5e-4 x 0.97 an epoch, never below 5e-5 (from its epoch 75.6 on)
    cfg = TrainConfig(lr=5e-4, lr_decay=0.97, lr_decay_steps=3750, lr_min=5e-5)
    assert lr_at(0, cfg) == 5e-4 and lr_at(3750 * 10, cfg) == pytest.approx(5e-4 * 0.97 ** 10, rel=1e-12)
    assert lr_at(3750 * 75, cfg) == pytest.approx(5e-4 * 0.97 ** 75, rel=1e-12)  # 5.12e-5: still decaying
    assert lr_at(3750 * 76, cfg) == lr_at(3750 * 149, cfg) == 5e-5  # 4.97e-5 and 5.4e-6 without the floor
    # the exponential ramp is left as it is: its first step below the floor
    ramped = TrainConfig(lr=1e-3, lr_decay=0.5, lr_decay_steps=4, warmup_steps=4, lr_min=4e-4)
    assert [lr_at(s, ramped) for s in (0, 4, 8, 12)] == pytest.approx([2.5e-4, 5e-4, 4e-4, 4e-4], rel=1e-12)
    # the linear decay stops at the floor instead of 0: lr * (20 - step) / 16 >= 2.5e-4 until step 16
    floored = TrainConfig(lr=1e-3, lr_schedule="linear", warmup_steps=4, lr_min=2.5e-4)
    assert [lr_at(s, floored, total_steps=20) for s in (0, 12, 16, 17, 20)] == pytest.approx(
        [2.5e-4, 5e-4, 2.5e-4, 2.5e-4, 2.5e-4], abs=1e-15)
    # the default (no floor) is the schedule as before, to the bit
    assert lr_at(19, dataclasses.replace(floored, lr_min=0.0), total_steps=20) == 1e-3 * 1 / 16


def test_linear_schedule_needs_the_run_length_and_a_shorter_warmup():
    with pytest.raises(ValueError, match="total_steps"):
        lr_at(0, LINEAR)
    with pytest.raises(ValueError, match=r"warmup_steps \(4\) must be fewer than the run's 4 optimizer steps; "
                                         r"lower --warmup-steps"):
        lr_at(0, LINEAR, total_steps=4)


@pytest.mark.parametrize("fields, fragment", [
    ({"lr_schedule": "cosine"}, "unknown lr_schedule 'cosine'; valid values are exponential, linear"),
    ({"lr_schedule": "linear", "warmup_steps": -1}, "warmup_steps must be >= 0, got -1"),
    ({"lr_schedule": "linear", "warmup_steps": "10"}, "TrainConfig.warmup_steps must be an integer"),
    ({"lr_min": 2e-3}, "lr_min must lie in [0, lr] (a floor under the decaying rate; lr is 0.001), got 0.002"),
    ({"lr_min": -1e-5}, "lr_min must lie in [0, lr]"),
])
def test_bad_schedule_fields_are_refused_by_name(fields, fragment):
    with pytest.raises(ValueError) as e:
        TrainConfig.from_dict(fields)
    assert fragment in str(e.value)


def test_a_config_saved_before_the_schedule_fields_loads_with_the_defaults():
    old = {k: v for k, v in TrainConfig(epochs=3).to_dict().items()
           if k not in ("lr_schedule", "warmup_steps", "lr_min")}
    cfg = TrainConfig.from_dict(old)
    assert cfg == TrainConfig(epochs=3) and cfg.lr_schedule == "exponential"


# ------------------------------------------------------------------------------------------ fit


def test_fit_follows_the_linear_schedule_and_resumes(tmp_path):
    # 64 examples in batches of 32: 2 steps an epoch, 4 in the run; the lr logged after epoch 1 is the next step's.
    cfg = TrainConfig(dataset="mnist-sample", epochs=2, batch_size=32, train_size=64, test_size=32, lr=1e-3,
                      lr_schedule="linear", warmup_steps=1)
    fit(TINY, dataclasses.replace(cfg, epochs=1), tmp_path, device="cpu", progress=False)
    # a run of 2 steps with a warm-up of 1: both steps at lr (lr * 1/1, then lr * (2 - 1) / (2 - 1)), its end at 0
    ckpt = load_checkpoint(tmp_path, "last")
    assert ckpt.optimizer_state["param_groups"][0]["lr"] == pytest.approx(1e-3)  # the rate of the last step taken
    assert ckpt.state["history"][-1]["lr"] == 0.0
    model_cfg, saved = resume_configs(tmp_path, train_changes={"epochs": 2})
    assert saved == cfg  # the schedule is part of the saved settings
    fit(model_cfg, saved, tmp_path, device="cpu", progress=False, resume=True)
    # resumed to 4 steps: the decay stretched over the new total, steps 2 and 3 at lr * 2/3 and lr * 1/3
    ckpt = load_checkpoint(tmp_path, "last")
    assert ckpt.optimizer_state["param_groups"][0]["lr"] == pytest.approx(1e-3 / 3)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["lr"]) for r in records] == [(2, 0.0), (4, 0.0)]  # each run's own end


def test_a_checkpoint_without_the_schedule_fields_resumes(tmp_path):
    cfg = TrainConfig(dataset="mnist-sample", epochs=1, batch_size=32, train_size=64, test_size=32)
    fit(TINY, cfg, tmp_path, device="cpu", progress=False)
    ckpt = load_checkpoint(tmp_path, "last")
    old = {k: v for k, v in ckpt.train_config.items() if k not in ("lr_schedule", "warmup_steps")}
    save_checkpoint(tmp_path / "last.safetensors", dataclasses.replace(ckpt, train_config=old))
    assert "lr_schedule" not in load_checkpoint(tmp_path, "last").train_config  # as an older capsnet wrote it
    model_cfg, saved = resume_configs(tmp_path, train_changes={"epochs": 2})
    assert saved == dataclasses.replace(cfg, epochs=2)
    final = fit(model_cfg, saved, tmp_path, device="cpu", progress=False, resume=True)
    assert final["epoch"] == 2 and final["lr"] == pytest.approx(lr_at(4, saved))


# ------------------------------------------------------------------------------------------ --preset


@pytest.fixture
def fit_calls(monkeypatch):
    """``capsnet train``'s calls of ``fit``, recorded instead of trained."""
    calls = []
    monkeypatch.setattr(train_mod, "fit", lambda model_cfg, cfg, out, **kw: calls.append((model_cfg, cfg, kw)) or {})
    return calls


FAST = TrainConfig(dataset="mnist", epochs=25, batch_size=512, lr=4e-3, lr_schedule="linear", warmup_steps=235,
                   amp="bf16", val_size=0, eval_every=25)


def test_preset_fast_builds_its_recipe(tmp_path, fit_calls):
    assert cli.main(["train", "--preset", "fast", "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    (model_cfg, cfg, kw), = fit_calls
    assert cfg == FAST and kw["compile"] == "reduce-overhead"
    assert model_cfg == CapsNetConfig()  # the paper's CapsNet


def test_the_baseline_warms_up_unless_told_otherwise(tmp_path, fit_calls):
    assert cli.main(["train", "--model", "baseline", "--out", str(tmp_path / "a"), "--no-progress"]) == 0
    assert fit_calls[-1][1] == TrainConfig(warmup_steps=200)  # its ModelSpec.train_defaults, on the authors' decay
    assert cli.main(["train", "--model", "baseline", "--warmup-steps", "0", "--out", str(tmp_path / "b"),
                     "--no-progress"]) == 0
    assert fit_calls[-1][1] == TrainConfig()
    # on the linear schedule the warm-up must fit the run, which the model cannot know: none unless typed
    assert cli.main(["train", "--model", "baseline", "--lr-schedule", "linear", "--out", str(tmp_path / "d"),
                     "--no-progress"]) == 0
    assert fit_calls[-1][1] == TrainConfig(lr_schedule="linear")
    # any model may ask for a warm-up on the exponential schedule
    assert cli.main(["train", "--warmup-steps", "5", "--out", str(tmp_path / "c"), "--no-progress"]) == 0
    assert fit_calls[-1][1] == TrainConfig(warmup_steps=5)


def test_the_efficient_capsnet_recipe_of_the_readme_sets_its_floor(tmp_path, fit_calls):
    assert cli.main(["train", "--model", "efficient-capsnet", "--lr", "5e-4", "--batch-size", "16", "--augment",
                     "efficient-capsnet", "--lr-decay", "0.97", "--lr-decay-steps", "3750", "--lr-min", "5e-5",
                     "--epochs", "150", "--out", str(tmp_path / "e"), "--no-progress"]) == 0
    assert fit_calls[-1][1] == TrainConfig(lr=5e-4, batch_size=16, augment="efficient-capsnet", lr_decay=0.97,
                                           lr_decay_steps=3750, lr_min=5e-5, epochs=150)


def test_synthesis_models_train_at_the_gan_rate_unless_told(tmp_path, monkeypatch):
    from capsnet import gan

    seen = []
    monkeypatch.setattr(gan, "fit_gan", lambda model_cfg, cfg, out, **kw: seen.append((model_cfg, cfg)) or {})
    for model, extra, lr in (("capspix2pix", [], 2e-4), ("pix2pix", [], 2e-4), ("capspix2pix", ["--lr", "1e-3"], 1e-3)):
        assert cli.main(["train", "--model", model, "--dataset", "mnist-skeleton", *extra, "--out",
                         str(tmp_path / f"{model}{len(extra)}"), "--no-progress"]) == 0
        assert seen[-1][1] == TrainConfig(dataset="mnist-skeleton", lr=lr)


def test_without_preset_nothing_changes(tmp_path, fit_calls):
    assert cli.main(["train", "--dataset", "mnist", "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    (model_cfg, cfg, kw), = fit_calls
    assert cfg == TrainConfig() and kw["compile"] is False and model_cfg == CapsNetConfig()


def test_typed_flags_override_the_preset(tmp_path, fit_calls):
    assert cli.main(["train", "--preset", "fast", "--epochs", "40", "--amp", "none", "--lr", "1e-3", "--compile",
                     "aot_eager", "--warmup-steps", "10", "--routing-iterations", "2", "--out", str(tmp_path / "a"),
                     "--no-progress"]) == 0
    model_cfg, cfg, kw = fit_calls[-1]
    assert cfg == dataclasses.replace(FAST, epochs=40, eval_every=40, amp="none", lr=1e-3, warmup_steps=10)
    assert kw["compile"] == "aot_eager" and model_cfg == CapsNetConfig(routing_iterations=2)
    assert cli.main(["train", "--preset", "fast", "--eval-every", "5", "--out", str(tmp_path / "b"),
                     "--no-progress"]) == 0
    assert fit_calls[-1][1] == dataclasses.replace(FAST, eval_every=5)
    # another schedule typed: the preset's warm-up, which belongs to its linear schedule, is left out
    assert cli.main(["train", "--preset", "fast", "--lr-schedule", "exponential", "--out", str(tmp_path / "c"),
                     "--no-progress"]) == 0
    assert fit_calls[-1][1] == dataclasses.replace(FAST, lr_schedule="exponential", warmup_steps=0)
    # --compile none: the preset's compiling turned off (there was no value for it: a review, 2026-12-02)
    assert cli.main(["train", "--preset", "fast", "--compile", "none", "--out", str(tmp_path / "d"),
                     "--no-progress"]) == 0
    assert fit_calls[-1][1] == FAST and fit_calls[-1][2]["compile"] is False


@pytest.mark.parametrize("argv, fragment", [
    (["--preset", "fast", "--lr-decay", "0.9"], "--lr-decay does not apply to --lr-schedule linear (set by --preset "
                                                "fast)"),
    (["--lr-schedule", "linear", "--lr-decay-steps", "10"], "--lr-decay-steps does not apply to --lr-schedule linear"),
    (["--preset", "fast", "--resume"], "--preset fast sets up a new run; --resume continues with the run's own "
                                       "settings: leave --preset out"),
    (["--preset", "slow"], "argument --preset: invalid choice: 'slow'"),
    # what the preset set is said as its, not as typed (a review, 2026-12-02)
    (["--preset", "fast", "--dataset", "mnist-sample-segmentation"],
     "--model capsnet (set by --preset fast) is a classification model and --dataset mnist-sample-segmentation a "
     "segmentation data set; use --model segcaps, segcaps-r1 or unet, or leave --preset fast out"),
    (["--preset", "fast", "--model", "unet"], "--model unet is a segmentation model and --dataset mnist (set by "
                                              "--preset fast) a classification data set"),
    (["--compile", "nope"], "argument --compile: invalid choice: 'nope' (choose from none, default, "),
])
def test_schedule_and_preset_flags_that_conflict_exit_2(tmp_path, capsys, fit_calls, argv, fragment):
    with pytest.raises(SystemExit) as e:
        cli.main(["train", *argv, "--out", str(tmp_path / "run"), "--no-progress"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and fragment in err and "(`capsnet train --help` lists the options)" in err
    assert fit_calls == []


def test_resume_keeps_the_runs_settings_not_the_presets(tmp_path, data_root, capsys):
    run = tmp_path / "run"
    shared = ["--out", str(run), "--device", "cpu", "--data-dir", str(data_root), "--no-progress"]
    assert cli.main(["train", "--preset", "fast", "--train-size", "64", "--test-size", "32", "--epochs", "1",
                     "--batch-size", "32", "--warmup-steps", "1", "--compile", "eager", *TINY_FLAGS, *shared]) == 0
    assert cli.main(["train", "--resume", "--epochs", "2", *shared]) == 0
    assert "error" not in capsys.readouterr().err
    ckpt = load_checkpoint(run, "last")
    expected = dataclasses.replace(FAST, epochs=2, eval_every=1, batch_size=32, train_size=64, test_size=32,
                                   warmup_steps=1)
    assert TrainConfig.from_dict(ckpt.train_config) == expected  # the preset's values, kept by the resume
    assert ckpt.state["epoch"] == 2 and ckpt.state["history"][-1]["lr"] == 0.0  # the stretched decay's end


def test_a_warm_up_the_preset_set_too_long_for_the_run_is_said_as_the_presets(tmp_path, data_root, capsys):
    """"lower --warmup-steps" alone, for a warm-up the user never typed (a review, 2026-12-02)."""
    run = tmp_path / "run"
    assert cli.main(["train", "--preset", "fast", "--train-size", "64", "--epochs", "1", "--compile", "none",
                     *TINY_FLAGS, "--out", str(run), "--device", "cpu", "--data-dir", str(data_root),
                     "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "warmup_steps (235) must be fewer than the run's 1 optimizer steps; lower " \
        "--warmup-steps or train for more steps (--preset fast set --warmup-steps 235; a value typed beside it " \
        "wins)" in err, err
    assert not run.exists()


def test_a_global_batch_the_preset_set_that_torchruns_processes_do_not_divide_is_said_as_the_presets(
        tmp_path, data_root, capsys, monkeypatch):
    """torchrun --nproc_per_node 3 with --preset fast: "--batch-size 512 ... use a multiple of 3" for a batch the
    user never typed (a bug hunt, 2026-12-04). Refused before the process group forms."""
    for name, value in {"WORLD_SIZE": "3", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "3",
                        "MASTER_ADDR": "localhost", "MASTER_PORT": "29500"}.items():  # as torchrun's first process
        monkeypatch.setenv(name, value)
    run = tmp_path / "run"
    common = ["train", "--preset", "fast", "--train-size", "64", "--epochs", "1", "--compile", "none", *TINY_FLAGS,
              "--out", str(run), "--device", "cpu", "--data-dir", str(data_root), "--no-progress"]
    assert cli.main(common) == 2
    err = capsys.readouterr().err
    assert "--batch-size 512 is the global batch and must divide evenly among the 3 processes; use a multiple of 3, " \
        "e.g. 513 (--preset fast set --batch-size 512; a value typed beside it wins)" in err, err
    assert cli.main([*common, "--batch-size", "32"]) == 2  # typed: no word of the preset
    err = capsys.readouterr().err
    assert "--batch-size 32 is the global batch" in err and "--preset fast set" not in err, err
    assert not (run / "last.safetensors").exists()


def test_a_resume_of_a_linear_run_refuses_the_exponential_flags_as_not_applying(tmp_path, data_root, capsys):
    """--lr-decay on a resume of a linear run was refused as differing from "the run, which trained with --lr-decay
    0.96": a default its schedule never used."""
    run = tmp_path / "run"
    shared = ["--out", str(run), "--device", "cpu", "--data-dir", str(data_root), "--no-progress"]
    assert cli.main(["train", "--lr-schedule", "linear", "--train-size", "64", "--test-size", "32", "--epochs", "1",
                     "--batch-size", "32", *TINY_FLAGS, *shared]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        cli.main(["train", "--resume", "--epochs", "2", "--lr-decay", "0.5", *shared])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"--lr-decay does not apply to --lr-schedule linear (the schedule of the run in " \
                                 f"{run})" in err and "0.96" not in err, err
    assert load_checkpoint(run, "last").state["epoch"] == 1


@pytest.mark.parametrize("model", ["capsnet", "pix2pix"])
def test_a_warmup_as_long_as_the_run_is_refused_before_anything_is_written(tmp_path, capsys, model):
    """It was refused at the first step, after the run folder and its config.json were written."""
    from cli_helpers import in_process

    dataset = "mnist-sample" if model == "capsnet" else "mnist-sample-skeleton"
    r = in_process(capsys, "train", "--model", model, "--dataset", dataset, "--train-size", 16, "--test-size", 8,
                   "--batch-size", 8, "--epochs", 1, "--lr-schedule", "linear", "--warmup-steps", 2,
                   "--out", tmp_path / "run", "--no-progress")
    assert r.returncode != 0 and "warmup_steps (2) must be fewer than the run's 2 optimizer steps" in r.stderr
    assert not (tmp_path / "run").exists()


def test_the_loop_hands_each_step_its_progress_and_the_em_margin_grows_as_the_paper_says(tmp_path, monkeypatch):
    """The loss gets ``progress = step / total_steps``: EM's spread-loss margin grows from 0.2 to 0.9 over the first
    half of training (Hinton et al. 2018, section 4.1) from it. A loop that passed 1.0 throughout (the margin at 0.9
    from the first step) passed every test (found by mutation testing, 2026-11-30)."""
    from capsnet import models
    from capsnet.models import EMCapsNetConfig
    from capsnet.models.em_capsnet import em_capsnet_loss

    seen = []

    def recorded(model, images, targets, *rest, progress=1.0, **kw):
        if model.training:  # a training step's (evaluation scores at the end's margin)
            seen.append((progress, model.config.margin(progress)))
        return em_capsnet_loss(model, images, targets, *rest, progress=progress, **kw)
    name = "em-capsnet"
    monkeypatch.setitem(models.MODELS, name, models.MODELS[name]._replace(loss=recorded))
    config = EMCapsNetConfig(input_height=28, input_width=28, num_classes=10, conv1_channels=4, primary_types=2,
                             caps1_types=2, caps2_types=2, routing_iterations=1)
    fit(config, TrainConfig(dataset="mnist-sample", epochs=2, batch_size=16, train_size=64, test_size=16, seed=0,
                            lr=1e-3), tmp_path / "em", device="cpu", progress=False)
    steps = 8  # 2 epochs of 4 batches
    assert [p for p, _ in seen] == pytest.approx([s / steps for s in range(steps)], abs=1e-12)
    assert [m for _, m in seen] == pytest.approx([0.2 + 0.7 * min(1.0, s / steps / 0.5) for s in range(steps)])


def test_a_runs_steps_count_its_last_partial_batch():
    """70 examples in batches of 32 are 3 steps an epoch (the last of 6): every fit test used a size the batch
    divides, so a count rounded down (the linear schedule at 0 before the run's last steps) passed unnoticed."""
    from capsnet.train import run_steps

    assert run_steps(TrainConfig(epochs=2, batch_size=32), 70) == 6
    assert run_steps(TrainConfig(epochs=1, batch_size=32), 64) == 2
