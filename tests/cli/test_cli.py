"""The `capsnet` command end to end, as a user runs it: real processes and real data for the runs, the
command's own ``main`` in this process for the many error messages (the same code, without a torch import each)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from capsnet.checkpoint import load_checkpoint
from cli_helpers import in_process

TINY = ["--conv1-channels", "8", "--primary-types", "2", "--batch-size", "32", "--no-progress"]


def capsnet(*args, env=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "capsnet", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def assert_clean_error(r, *fragments):
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    for f in fragments:
        assert f in r.stderr, r.stderr


def test_help_everywhere(capsys):
    r = capsnet("--help")  # the installed entry point, in its own process
    assert r.returncode == 0 and "usage: capsnet" in r.stdout
    for command in ("train", "eval", "bench", "figures", "experiment", "viz", "predict", "generate"):
        r = in_process(capsys, command, "--help")
        assert r.returncode == 0 and f"usage: capsnet {command}" in r.stdout
    r = in_process(capsys, "train", "--help")
    for flag in ("--dataset", "--epochs", "--batch-size", "--lr", "--routing-iterations", "--recon-weight", "--seed",
                 "--device", "--out", "--resume", "--data-dir"):
        assert flag in r.stdout
    shown = " ".join(r.stdout.split())  # defaults are shown (argparse may wrap the line)
    assert "(default: 0.96)" in shown and "(default: 128)" in shown
    # --lr's default is said in its text, the synthesis models' 2e-4 beside it: "(default: 0.001)" appended after
    # contradicted it (a review of the help texts, 2026-12-03)
    assert ("(default 1e-3, the authors' code's; when not given, the EM models 3e-3, efficient-capsnet 5e-4, synthesis "
            "models 2e-4: each model's own, `capsnet models NAME`)") in shown
    assert "(default: 0.001)" not in shown
    # --augment's default is said in its text too: "(default: shift)" was wrong for --model efficient-capsnet
    assert "(default: shift; efficient-capsnet for --model efficient-capsnet on MNIST and Fashion-MNIST)" in shown and \
        "(default: shift)" not in shown
    # --dropout's defaults are each model's own: the help said 0.5, the baseline's, where capspix2pix-deep trains
    # with 0 (a review)
    from capsnet.models import model_spec

    text = " ".join(r.stdout.split())
    assert f"(--model baseline; default: {model_spec('baseline').config().dropout:g})" in text
    assert (f"{model_spec('capspix2pix').config().dropout:g} for capspix2pix and pix2pix, "
            f"{model_spec('capspix2pix-deep').config().dropout:g} for capspix2pix-deep" in text)
    assert model_spec("pix2pix").config().dropout == model_spec("capspix2pix").config().dropout


def test_help_at_80_columns_breaks_no_flag_and_shows_list_defaults_as_typed(capsys, monkeypatch):
    """argparse's wrapping broke flags and values at their hyphens (--lr-decay- / steps, em- / capsnet: 9 breaks in
    train's help) and list defaults printed as Python lists ([128], ['fp32']): a review, 2026-12-02."""
    import re

    monkeypatch.setenv("COLUMNS", "80")
    for command in ("train", "eval", "bench", "figures", "experiment", "viz", "predict", "generate"):
        r = in_process(capsys, command, "--help")
        broken = [line for line in r.stdout.splitlines() if re.search(r"[A-Za-z0-9]-$", line)]
        assert not broken, (command, broken)
        assert not re.search(r"\(default: \[", r.stdout), command
    text = " ".join(in_process(capsys, "bench", "--help").stdout.split())
    assert "(default: 128)" in text and "(default: fp32)" in text
    assert "(default: none)" in " ".join(in_process(capsys, "viz", "--help").stdout.split())  # --allow-host's []


def test_train_then_eval_on_mnist_sample(tmp_path, capsys):
    # both commands through main here (the entry point in a process of its own: test_help_everywhere, and eval's in
    # test_output_into_a_closed_pipe_is_not_a_traceback); a short run: eval scores the whole test split whatever
    # the run's --test-size
    run = tmp_path / "run"
    r = in_process(capsys, "train", "--dataset", "mnist-sample", "--epochs", "1", "--train-size", "64", "--test-size",
                   "32", *TINY, "--out", run)
    assert r.returncode == 0, r.stderr
    assert "test accuracy" in r.stdout
    assert {p.name for p in run.iterdir()} == {"best.safetensors", "last.safetensors", "config.json", "metrics.jsonl"}
    r = in_process(capsys, "eval", "--checkpoint", run, "--no-progress")
    assert r.returncode == 0, r.stderr
    # no validation split: best.safetensors was chosen on the test split, so eval scores the final epoch's weights
    assert "best.safetensors was chosen on the test split" in r.stdout and not (run / "eval-best.json").exists()
    report = json.loads((run / "eval-last.json").read_text())
    assert report["images"] == 500 and report["dataset"] == "mnist-sample"
    confusion = torch.tensor(report["confusion"])
    assert confusion.shape == (10, 10) and int(confusion.sum()) == 500
    assert confusion.sum(1).tolist() == [50] * 10  # the sample holds 50 test digits of each class
    assert report["accuracy"] == pytest.approx(confusion.diag().sum().item() / 500)
    assert report["per_class_accuracy"] == pytest.approx((confusion.diag() / 50.0).tolist())
    assert f"accuracy {report['accuracy']:.4f}" in r.stdout


def test_the_final_epoch_is_reported_once_with_or_without_progress_bars(tmp_path, capsys):
    # with the bars the loop writes each evaluated epoch's line itself; the command adds it only without them, or
    # when a resume found nothing left to train (it printed the last line twice before)
    tiny = [a for a in TINY if a != "--no-progress"]
    args = ("train", "--dataset", "mnist-sample", "--epochs", "1", "--train-size", "64", "--test-size", "32", *tiny)
    for extra in ((), ("--no-progress",)):
        r = in_process(capsys, *args, *extra, "--out", tmp_path / f"run{len(extra)}")
        assert r.returncode == 0, r.stderr
        assert r.stdout.count("epoch 1: test accuracy") == 1, r.stdout
    r = in_process(capsys, *args, "--out", tmp_path / "run0", "--resume")
    assert "has finished its 1 epoch;" in r.stdout and r.stdout.count("epoch 1: test accuracy") == 1, r.stdout
    # without the bars every evaluated epoch has its line, as it ends (a log held the final epoch's alone)
    r = in_process(capsys, *args, "--epochs", "3", "--eval-every", "2", "--no-progress", "--out", tmp_path / "run3")
    lines = [line.split(":")[0] for line in r.stdout.splitlines() if line.startswith("epoch ")]
    assert lines == ["epoch 2", "epoch 3"], r.stdout  # epoch 1 is not evaluated (--eval-every 2)


def test_the_shared_run_learned_and_eval_agrees_with_its_metrics(trained_run, data_root, tmp_path, capsys):
    final = [json.loads(x) for x in (trained_run / "metrics.jsonl").read_text().splitlines()][-1]
    assert final["epoch"] == 2 and final["test_accuracy"] >= 0.80, final  # 2 epochs of 1,000 real digits
    r = in_process(capsys, "eval", "--checkpoint", trained_run, "--which", "last", "--test-size", 200, "--no-progress",
                   "--data-dir", data_root, "--json", tmp_path / "eval.json")
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "eval.json").read_text())
    assert report["accuracy"] == pytest.approx(final["test_accuracy"])
    assert report["epoch"] == 2 and report["saved_at"] == "epoch 2"  # a save inside an epoch: "epoch E + N batches"


def test_evaluate_counts_classes_in_int64_whatever_the_labels_integer_type():
    """uint8 labels wrapped past 255 in y * K + class (a wrong confusion matrix from 17 classes on, silently)."""
    from capsnet.evaluate import evaluate
    from capsnet.models import create_model

    torch.manual_seed(0)
    model = create_model("baseline", channels=(4, 4, 4), hidden=(8, 8), num_classes=30)
    x, y = torch.rand(64, 1, 28, 28), torch.randint(0, 30, (64,))
    want = evaluate(model, x, y, batch_size=16).confusion
    for dtype in (torch.uint8, torch.int32, torch.int16):
        assert torch.equal(evaluate(model, x, y.to(dtype), batch_size=16).confusion, want), dtype
    assert want.sum() == 64 and torch.equal(want.sum(1), torch.bincount(y, minlength=30))


@pytest.mark.slow
def test_short_training_on_real_mnist_reaches_90_percent(tmp_path, data_root):
    """A few thousand real digits and two epochs of a small CapsNet: at least 90% on 1,000 test digits."""
    run = tmp_path / "mnist"
    r = capsnet("train", "--dataset", "mnist", "--data-dir", data_root, "--train-size", "3000", "--test-size", "1000",
                "--epochs", "2", "--batch-size", "32", "--conv1-channels", "64", "--primary-types", "8",
                "--no-progress", "--out", run)
    assert r.returncode == 0, r.stderr
    final = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()][-1]
    assert final["epoch"] == 2 and final["test_accuracy"] >= 0.90, final
    r = capsnet("eval", "--checkpoint", run, "--which", "last", "--test-size", "1000", "--no-progress",
                env={"CAPSNET_DATA": str(data_root)})
    assert r.returncode == 0, r.stderr
    assert json.loads((run / "eval-last-n1000.json").read_text())["accuracy"] == pytest.approx(final["test_accuracy"])


def _metrics(run):
    """Every epoch record but its wall-clock throughput, which no two runs share."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(r.pop("train_images_per_s") > 0 for r in records)
    return records


def _weights(run):
    return load_checkpoint(run, "last").model_state


def _same_weights(a, b):
    wa, wb = _weights(a), _weights(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


RESUMABLE = ["--dataset", "mnist-sample", "--epochs", "3", "--train-size", "640", "--test-size", "64", *TINY]


# The runs stopped by a signal or a kill are subprocesses; the uninterrupted run and every resume run here, as
# the suite's other resume tests do (one torch thread in both: the same numbers to the bit; 2 s of imports saved each)
@pytest.fixture(scope="module")
def straight_run(tmp_path_factory):
    from capsnet.cli import main

    run = tmp_path_factory.mktemp("straight") / "run"
    assert main(["train", *RESUMABLE, "--out", str(run)]) == 0
    return run


def _resume(capsys, run):
    r = in_process(capsys, "train", "--out", run, "--resume", "--no-progress")  # the run's own settings
    assert r.returncode == 0, r.stderr
    return r


def _paused_in_epoch_2(run, **popen):
    """The RESUMABLE run trained into ``run`` in a process of its own, once it waits after its 25th step (the 5th
    of epoch 2's 20): until a stop is asked or for 60 s. The signal then comes at that step, however loaded the
    machine (0.3 s after epoch 1's metrics was the whole run's rest on a busy 2-core machine: a review, 2026-12-04)."""
    marker = run.parent / "paused"
    script = textwrap.dedent(f"""
        import sys, time, torch
        from capsnet import train
        real, calls = torch.optim.Adam.step, []
        def step(self, *args, **kwargs):
            out = real(self, *args, **kwargs)
            calls.append(1)
            if len(calls) == 25:
                open({str(marker)!r}, "w").close()
                deadline = time.monotonic() + 60
                while not train.stop_requested() and time.monotonic() < deadline:
                    time.sleep(0.01)
            return out
        torch.optim.Adam.step = step
        from capsnet.cli import main
        sys.exit(main({["train", *RESUMABLE, "--out", str(run)]!r}))
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], **popen)
    deadline = time.time() + 300
    while not marker.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert marker.exists(), f"the run never reached its 25th step (status {proc.poll()})"
    return proc


@pytest.mark.e2e
def test_kill_9_mid_epoch_then_resume_is_exact(tmp_path, straight_run, capsys):
    run = tmp_path / "run"
    proc = _paused_in_epoch_2(run, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    done = load_checkpoint(run, "last").state["epoch"]
    assert done == 1 and "within" not in load_checkpoint(run, "last").state  # epoch 1's end: killed in epoch 2
    r = _resume(capsys, run)
    assert f"resuming the run in {run} from epoch {done}\n" in r.stdout
    assert _same_weights(run, straight_run)
    assert _metrics(run) == _metrics(straight_run)


@pytest.mark.e2e
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_or_ctrl_c_mid_epoch_saves_where_training_is_and_resume_is_exact(tmp_path, straight_run, sig, capsys):
    """SIGTERM (a scheduler's stop) ended a run silently, and Ctrl-C stopped it, each losing up to --save-every
    minutes of training; now the loop saves at the step it was at, then stops."""
    run = tmp_path / "run"
    proc = _paused_in_epoch_2(run, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    proc.send_signal(sig)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "--resume` continues from the last checkpoint" in err
    state = load_checkpoint(run, "last").state
    # saved inside epoch 2, at the step the signal came in (test_train has the epoch's last batch and its
    # evaluation at set steps)
    assert state["epoch"] == 1 and state["within"]["batches"] == 5, state.get("within")
    _resume(capsys, run)
    assert _same_weights(run, straight_run)
    assert _metrics(run) == _metrics(straight_run)


def test_sigterm_while_a_command_writes_stops_it_as_ctrl_c_and_leaves_no_temporary_file(trained_run, tmp_path, capsys,
                                                                                     monkeypatch, data_root):
    """SIGTERM (kill, timeout, a scheduler) ended every command but train, experiment and bench at once, silently,
    status 143, leaving a half-written temporary file beside its output (a review, 2026-12-02): it now stops the
    command as Ctrl-C does. The signal arrives while eval writes its report (as the file is synced)."""
    from capsnet import checkpoint

    real_fsync = checkpoint.os.fsync

    def fsync_then_sigterm(fd):
        os.kill(os.getpid(), signal.SIGTERM)
        return real_fsync(fd)

    def unhandled(signum, frame):  # the signal's default here would end the test's worker process
        pytest.fail("SIGTERM reached no handler of the command's: the process would have died of it")

    out = tmp_path / "report.json"
    monkeypatch.setattr(checkpoint.os, "fsync", fsync_then_sigterm)
    before = signal.signal(signal.SIGTERM, unhandled)
    try:
        r = in_process(capsys, "eval", "--checkpoint", trained_run, "--test-size", 20, "--json", out, "--data-dir",
                       data_root, "--no-progress")
        after = signal.getsignal(signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, before)
    assert r.returncode == 130 and r.stderr.strip().endswith("capsnet eval: interrupted"), r.stderr
    assert "Traceback" not in r.stderr
    assert list(tmp_path.iterdir()) == []  # neither the report nor its temporary file
    assert after is unhandled  # the command's handler gone with it


@pytest.mark.e2e
def test_kill_9_during_checkpoint_write_then_resume_is_exact(tmp_path, straight_run, capsys):
    """SIGKILL the trainer half-way through writing epoch 2's checkpoint."""
    run = tmp_path / "run"
    script = textwrap.dedent(f"""
        import os, signal, sys
        import capsnet.checkpoint as ck
        real = ck.atomic_write_bytes
        calls = []
        def half_then_die(path, data):
            if str(path).endswith("last.safetensors"):
                calls.append(path)
                if len(calls) == 2:  # epoch 2
                    with open(os.path.join(os.path.dirname(path), ".last.safetensors.tmp-crash123"), "wb") as f:
                        f.write(data[: len(data) // 2]); f.flush(); os.fsync(f.fileno())
                    os.kill(os.getpid(), signal.SIGKILL)
            return real(path, data)
        ck.atomic_write_bytes = half_then_die
        from capsnet.cli import main
        sys.exit(main({["train", *RESUMABLE, "--out", str(run)]!r}))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert load_checkpoint(run, "last").state["epoch"] == 1  # the complete checkpoint survived
    assert (run / ".last.safetensors.tmp-crash123").exists()
    _resume(capsys, run)
    assert not list(run.glob(".*.tmp-*"))
    assert _same_weights(run, straight_run)
    assert _metrics(run) == _metrics(straight_run)


@pytest.mark.parametrize("args", [["models", "pretrained:capsnet-mnist-small"], ["train", "--model", "capsnet-mnist-small"],
                                  ["eval", "--checkpoint", "capsnet-mnist-small"],
                                  ["eval", "--checkpoint", "Pretrained:capsnet-mnist-small"],  # a review, 2026-12-01:
                                  ["eval", "--checkpoint", "pretrained/capsnet-mnist-small"],  # no hint for a prefix
                                  ["eval", "--checkpoint", "pretrain:capsnet-mnist-small"],  # mistyped
                                  ["experiment", "routing", "--models", "pretrained:capsnet-mnist-small"]])
def test_a_shipped_models_name_where_a_model_or_checkpoint_goes_is_told_how_to_give_it(capsys, args):
    """Copied from `capsnet models`' shipped table: "did you mean 'em-capsnet-small'?", an unrelated architecture,
    or "checkpoint capsnet-mnist-small does not exist" with no word of pretrained:NAME."""
    r = in_process(capsys, *args)
    if args[0] == "eval":
        assert_clean_error(r, f"checkpoint {args[2]} does not exist: pass a run directory made by `capsnet "
                              "train` or its .safetensors file; did you mean pretrained:capsnet-mnist-small, a model "
                              "shipped with capsnet?")
    else:
        use = {"train": "`--model capsnet` trains a new one", "experiment": "`--models capsnet` trains new ones",
               "models": "`capsnet models capsnet` lists its fields"}[args[0]]
        assert_clean_error(r, f"; pretrained:capsnet-mnist-small is a trained model shipped with capsnet, not a "
                              f"model's name: its architecture is capsnet ({use}); eval, viz, figures, export and "
                              f"predict take it as --checkpoint pretrained:capsnet-mnist-small")
        assert "did you mean" not in r.stderr
    if args[0] == "train":  # a synthesis model's: generate, where predict refuses it (a review, 2026-12-02)
        assert_clean_error(in_process(capsys, "train", "--model", "capspix2pix-mnist"),
                           "its architecture is capspix2pix-deep (`--model capspix2pix-deep` trains a new one); eval, "
                           "viz, figures, export and generate take it as --checkpoint pretrained:capspix2pix-mnist\n")
    # elsewhere a shipped name is no slip for a model's name: no word of it (--which, --dataset)
    for other in (["figures", "--which", "capsnet-mnist-small"], ["train", "--dataset", "capsnet-mnist-small"],
                  ["routings", "capsnet-mnist-small"]):
        assert "shipped" not in in_process(capsys, *other).stderr


@pytest.mark.parametrize("args, fragment", [
    (["train", "--epochs", "-1"], "--epochs: must be an integer >= 1"),
    (["train", "--epochs", "0"], "--epochs: must be an integer >= 1"),
    (["train", "--batch-size", "0"], "--batch-size: must be an integer >= 1"),
    (["train", "--dataset", "cifar"], "invalid choice: 'cifar'"),
    (["train", "--lr", "nan"], "--lr: must be a finite number > 0"),
    # bench started its benchmark, then said "Overflow when unpacking long long"
    (["bench", "--seed", "99999999999999999999"], "argument --seed: must be below 2**63"),
    (["train", "--seed", str(2**63)], "argument --seed: must be below 2**63"),
    (["experiment", "routing", "--seed", str(2**63)], "argument --seed: must be below 2**63"),
    (["train", "--save-every", "-1"], "--save-every: must be a finite number >= 0"),
    (["eval"], "the following arguments are required: --checkpoint"),
    (["frobnicate"], "invalid choice"),
])
def test_impossible_flags(capsys, args, fragment):
    assert_clean_error(in_process(capsys, *args), fragment)


@pytest.mark.parametrize("args, said, meant", [
    (["train", "--model", "capsnett"], "argument --model: invalid choice: 'capsnett'", "'capsnet'"),
    (["train", "--dataset", "mnsit"], "argument --dataset: invalid choice: 'mnsit'", "'mnist'"),
    (["experiment", "rooting"], "argument name: invalid choice: 'rooting'", "'routing'"),
    (["trian"], "capsnet: error: argument COMMAND: invalid choice: 'trian'", "'train'"),
    (["train", "--lrr", "0.1"], "capsnet train: error: unrecognized arguments: --lrr 0.1", "--lr"),
    (["train", "--batchsize=4"], "capsnet train: error: unrecognized arguments: --batchsize=4", "--batch-size"),
    (["eval", "--checkpoint", "x", "--batch-sise", "8"], "capsnet eval: error: unrecognized arguments: --batch-sise 8",
     "--batch-size"),
])
def test_a_misspelt_flag_is_told_in_two_lines_with_what_it_meant(capsys, args, said, meant):
    # the command's own parser answers (its name, not the top-level one's), names the nearest spelling, and points
    # at --help instead of printing argparse's usage (25 lines for train) above the error
    r = in_process(capsys, *args)
    assert_clean_error(r, said)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0].endswith(f"; did you mean {meant}?"), r.stderr
    command = "capsnet" if args == ["trian"] else f"capsnet {args[0]}"
    assert lines[1] == f"(`{command} --help` lists the options)"


@pytest.mark.parametrize("args, said", [
    (["train", "--foo", "--seedd", "3", "--lrr", "1"], "unrecognized arguments: --foo --seedd 3 --lrr 1; did you mean "
                                                       "--seed (for --seedd), --lr (for --lrr)?"),
    (["train", "-v"], "unrecognized arguments: -v; -v is an option of capsnet itself: put it before the command "
                      "(capsnet -v train ...)"),
    (["train", "--verb"], "unrecognized arguments: --verb; --verbose is an option of capsnet itself: put it before "
                          "the command (capsnet --verbose train ...)"),
    (["--epochs=3", "train"], "unrecognized arguments: --epochs=3; --epochs is an option of capsnet train: put it after "
                              "the command (capsnet train --epochs ...)"),
    (["--epochs", "3", "train"], "invalid choice: '3' (choose from "),  # argparse reads the 3 as the command
    (["--epochs", "3", "train"], "; --epochs is an option of capsnet train, not of capsnet itself: put it after the "
                                 "command (capsnet train --epochs 3 ...)"),
    (["-v", "--lr=1", "--model", "em-capsnet", "train", "--seed", "2"],
     "; --lr, --model are options of capsnet train, not of capsnet itself: put them after the command (capsnet -v "
     "train --lr=1 --model em-capsnet ...)"),
    (["--foo", "3", "train"], "invalid choice: '3' (choose from "),  # not train's option: nothing to say of it
    (["train", "--out", "x", "--", "--lr", "1"], "unrecognized arguments: -- --lr 1; everything after -- is read as "
                                                 "positional (capsnet train takes none there): drop the --"),
    # not "did you mean --routing-iterations?" (a review, 2026-12-02)
    (["experiment", "routing", "--routing", "em"], "unrecognized arguments: --routing em; capsnet experiment routes a "
                                                   "model by another algorithm as --models NAME:ROUTING (--models "
                                                   "capsnet:em)\n"),
    (["experiment", "routing", "--routing-option", "x=1", "--epoch", "3"], "capsnet:em); did you mean --epochs?\n"),
    (["experiment"], "the following arguments are required: name; name is one of multimnist, affine, less-data, "
                     "routing, segmentation, synthesis"),
    # a value without its option: argparse named the missing option alone (stop 101's note)
    (["generate", "labels/", "--checkpoint", "run", "--out", "o"],
     "the following arguments are required: --labels; labels/ has no option before it (capsnet generate takes only "
     "options): did you mean --labels labels/?\n"),
    (["-v", "eval", "--which", "last", "run/"], "required: --checkpoint; run/ has no option before it (capsnet eval "
                                                "takes only options): did you mean --checkpoint run/?\n"),
    (["generate", "--no-progress", "a", "--out=o", "b"], "required: --checkpoint, --labels; a b have no option before "
                                                         "them (capsnet generate takes only options): name the option "
                                                         "each is for (--checkpoint, --labels)\n"),
    (["generate", "--seeds", "1", "2", "--frob", "c", "lab", "--out", "o"],  # --seeds' values, an unknown flag's
     "required: --checkpoint, --labels; lab has no option before it (capsnet generate takes only options): name the "
     "option it is for (--checkpoint, --labels)\n"),
    # past a --, flags are values too: the options typed there were not read (not "no hint at all")
    (["generate", "--out", "o", "--", "--labels", "l", "--checkpoint", "c"],
     "required: --checkpoint, --labels; everything after -- is read as positional (capsnet generate takes none "
     "there): drop the --\n"),
    (["generate", "--out", "o", "--checkpoint", "c", "--", "l"], "required: --labels; l has no option before it "
                                                                  "(capsnet generate takes only options): did you mean "
                                                                  "--labels l?\n"),
])
def test_what_a_bad_command_line_meant_is_said(capsys, args, said):
    r = in_process(capsys, *args)
    assert_clean_error(r, said)
    assert len(r.stderr.strip().splitlines()) == 2


def test_no_guess_for_a_flag_like_none_of_them(capsys):
    r = in_process(capsys, "train", "--foo")
    assert_clean_error(r, "unrecognized arguments: --foo")
    assert "did you mean" not in r.stderr
    r = in_process(capsys, "--foo", "3", "train")  # before the command, and no command's option either
    assert "is an option" not in r.stderr and "did you mean" not in r.stderr


def _copy_run(run: Path, to: Path) -> Path:
    to.mkdir()
    for f in run.iterdir():
        if f.is_file():
            (to / f.name).write_bytes(f.read_bytes())
    return to


def test_bad_checkpoints(tmp_path, trained_run, capsys):
    assert_clean_error(in_process(capsys, "eval", "--checkpoint", tmp_path / "missing"), "does not exist")
    assert_clean_error(in_process(capsys, "eval", "--checkpoint", tmp_path), "no checkpoint in")
    foreign = tmp_path / "foreign.safetensors"
    save_file({"w": torch.zeros(2)}, str(foreign))
    assert_clean_error(in_process(capsys, "eval", "--checkpoint", foreign), "not a capsnet checkpoint")
    run = _copy_run(trained_run, tmp_path / "run")
    data = (run / "best.safetensors").read_bytes()
    (run / "best.safetensors").write_bytes(data[: len(data) // 3])
    assert_clean_error(in_process(capsys, "eval", "--checkpoint", run), "truncated or corrupt")
    # Resuming with flags that contradict the run: the flag named, with capsnet train's usage.
    # Each flag with its value and the run's own, and every flag a resume may change (it named only two).
    saved = load_checkpoint(run, "last")
    iterations, seed = saved.model_config["routing_iterations"], saved.train_config["seed"]
    r = in_process(capsys, "train", "--out", run, "--resume", "--routing-iterations", iterations + 2)
    assert_clean_error(r, f"--routing-iterations {iterations + 2} differs from the run in {run}, which trained with "
                          f"--routing-iterations {iterations}; --resume continues with the run's own settings: leave "
                          f"it out", "(`capsnet train --help` lists the options)")
    assert "--data-dir, --device, --compile, --save-every, --tensorboard, --allocator" in r.stderr
    r = in_process(capsys, "train", "--out", run, "--resume", "--routing-iterations", iterations + 2, "--seed",
                   seed + 3, "--no-decoder", "--epochs", 9)
    assert_clean_error(r, f"--no-decoder, --routing-iterations {iterations + 2}, --seed {seed + 3} differ from the run",
                       f"which trained with decoder=true, --routing-iterations {iterations}, --seed {seed}; "
                       f"--resume continues with the run's own settings: leave them out")
    assert_clean_error(in_process(capsys, "train", "--dataset", "mnist-sample", *TINY, "--out", run),
                       "already holds a run")
    assert_clean_error(in_process(capsys, "train", "--dataset", "mnist-sample", "--resume", "--out", tmp_path / "fresh"),
                       "nothing to resume")


def test_missing_data_directory_is_explained(tmp_path, capsys):
    r = in_process(capsys, "train", "--dataset", "mnist", "--data-dir", tmp_path, "--epochs", "1", *TINY,
                   "--out", tmp_path / "r")
    assert_clean_error(r, "train-images-idx3-ubyte")
    assert not (tmp_path / "r" / "last.safetensors").exists()
    # the ways out are the command line's (it said "pass download=True", a Python argument), with the offline one
    err = r.stderr
    assert "download=True fetches" in err and "leave --data-dir and CAPSNET_DATA unset to download them into" in err
    assert ("Offline: mnist-sample holds MNIST digits that ship with capsnet (the command line's tasks "
            "mnist-sample-segmentation and mnist-sample-skeleton are made from them)") in err
    r = in_process(capsys, "eval", "--checkpoint", "pretrained:capsnet-fashion-small", "--data-dir", tmp_path,
                   "--no-progress")
    assert_clean_error(r, "No Fashion-MNIST items ship with capsnet")
    for dataset, file in (("smallnorb", "smallnorb-5x46789x9x18x6x2x96x96-training-dat.mat"),
                          ("cifar10", "cifar-10-binary.tar.gz"), ("svhn", "train_32x32.mat")):
        r = in_process(capsys, "train", "--dataset", dataset, "--data-dir", tmp_path, "--epochs", "1",
                       "--out", tmp_path / dataset)
        assert_clean_error(r, file)  # these three said "or pass download=True" too (a review, 2026-11-30)
        assert "leave --data-dir and CAPSNET_DATA unset to download them into" in r.stderr
        assert "pass download=True" not in r.stderr and not (tmp_path / dataset).exists()


def test_a_classifier_scored_on_other_classes_is_warned_in_the_table_and_the_report(trained_run, tmp_path, capsys):
    """The shipped Fashion-MNIST model scored on the shipped digits printed 22% accuracy without a word."""
    r = in_process(capsys, "eval", "--checkpoint", "pretrained:capsnet-fashion-small", "--dataset", "mnist-sample",
                   "--test-size", "20", "--json", tmp_path / "f.json", "--no-progress")
    assert r.returncode == 0, r.stderr
    said = "the model was trained on fashion-mnist (T-shirt/top, Trouser, Pullover, ...) but mnist-sample's classes"
    assert r.stdout.splitlines()[1].startswith(f"warning: {said}")
    assert json.loads((tmp_path / "f.json").read_text())["warning"].startswith(said)
    # the digits the digit model trained on: no warning (mnist-sample and mnist share their classes)
    r = in_process(capsys, "eval", "--checkpoint", trained_run, "--dataset", "mnist-sample", "--test-size", "20",
                   "--json", tmp_path / "m.json", "--no-progress")
    assert "warning" not in r.stdout and "warning" not in json.loads((tmp_path / "m.json").read_text())


def test_a_shipped_models_report_names_it_as_pretrained_not_by_the_installed_file(tmp_path, capsys):
    """eval's first line showed the installed package's path (which differs between installs) where the JSON report
    says pretrained:NAME (a bug hunt, 2026-12-05)."""
    for name, dataset in (("capsnet-mnist-small", "mnist-sample"), ("capspix2pix-mnist", "mnist-sample-skeleton")):
        r = in_process(capsys, "eval", "--checkpoint", f"pretrained:{name}", "--dataset", dataset, "--test-size", 4,
                       "--json", tmp_path / f"{name}.json", "--no-progress")
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith(f"checkpoint pretrained:{name} (epoch "), r.stdout
        assert json.loads((tmp_path / f"{name}.json").read_text())["checkpoint"] == f"pretrained:{name}"


def test_an_eval_report_that_cannot_be_written_still_shows_its_figures(trained_run, monkeypatch, capsys):
    import capsnet.checkpoint

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(capsnet.checkpoint, "atomic_write_text", full)
    r = in_process(capsys, "eval", "--checkpoint", trained_run, "--dataset", "mnist-sample", "--test-size", "20",
                   "--no-progress")
    assert r.returncode == 2 and "No space left on device" in r.stderr
    assert "accuracy" in r.stdout and "wrote" not in r.stdout


def test_more_test_examples_than_there_are_is_refused_as_too_many_training_ones_are(trained_run, tmp_path, capsys,
                                                                                    data_root):
    """--test-size 99999 of mnist-sample trained and scored on its 500 without a word."""
    r = in_process(capsys, "train", "--dataset", "mnist-sample", "--test-size", "99999", "--epochs", "1", *TINY,
                   "--out", tmp_path / "r")
    # said with the flags typed (a review, 2026-12-02: the config field's name, never on the command line)
    assert_clean_error(r, "--test-size 99999 exceeds the 500 test examples of mnist-sample; give at most 500, or 0 for "
                          "all")
    assert not (tmp_path / "r").exists()
    r = in_process(capsys, "train", "--dataset", "mnist-sample", "--train-size", "3000", "--epochs", "1", *TINY,
                   "--out", tmp_path / "r")  # named no range (a review, 2026-12-01)
    assert_clean_error(r, "--train-size 3000 exceeds the 2000 training examples of mnist-sample; give at most 2000, or "
                          "0 for all")
    assert not (tmp_path / "r").exists()
    r = in_process(capsys, "eval", "--checkpoint", trained_run, "--dataset", "mnist-sample", "--test-size", "501",
                   "--no-progress", "--json", tmp_path / "e.json")
    assert_clean_error(r, "--test-size 501 exceeds the 500 test examples of mnist-sample")
    assert not (tmp_path / "e.json").exists()
    r = in_process(capsys, "experiment", "routing", "--train-size", "70000", "--data-dir", data_root, "--out",
                   tmp_path / "x", "--no-progress")
    assert_clean_error(r, "--train-size 70000 exceeds the 60000 training examples of mnist (capsnet, seed 0); give at "
                          "most 60000")
    assert not (tmp_path / "x").exists()


def test_a_class_without_test_images_is_not_reported_as_never_right(trained_run, tmp_path, capsys):
    """--test-size 50 of mnist-sample holds no 8: its accuracy was printed as 0.0000 and written as 0.0."""
    r = in_process(capsys, "eval", "--checkpoint", trained_run, "--dataset", "mnist-sample", "--test-size", "50",
                   "--json", tmp_path / "e.json", "--no-progress")
    report = json.loads((tmp_path / "e.json").read_text())
    confusion = torch.tensor(report["confusion"])
    absent = [k for k in range(10) if confusion[k].sum() == 0]
    assert absent == [8]  # the first 50 shipped test digits
    assert report["per_class_accuracy"][8] is None
    present = [k for k in range(10) if k not in absent]
    assert [report["per_class_accuracy"][k] for k in present] == pytest.approx(
        [(confusion[k, k] / confusion[k].sum()).item() for k in present])
    assert r.returncode == 0, r.stderr
    row = next(line for line in r.stdout.splitlines() if line.split()[:1] == ["8"])
    assert row.split()[1] == "n/a"


def test_a_flag_is_taken_in_full_only(tmp_path, capsys):
    """argparse took an abbreviation for the one flag it began: `bench --routing em` was --routing-iterations em
    ("invalid int"), and `train --routing-iter 2` trained; a flag added later would break such a command."""
    r = in_process(capsys, "train", "--routing-iter", "2", "--out", tmp_path / "a")
    assert_clean_error(r, "unrecognized arguments: --routing-iter 2; did you mean --routing-iterations?")
    r = in_process(capsys, "bench", "--routing", "em")
    assert_clean_error(r, "unrecognized arguments: --routing em")
    # the one flag a shortened one begins is named, not the nearest by spelling (--rep: "did you mean --help?")
    r = in_process(capsys, "bench", "--rep", "1")
    assert_clean_error(r, "unrecognized arguments: --rep 1; did you mean --repeats?")
    assert not any(tmp_path.iterdir())


def test_train_routing_flag_builds_the_digit_capsules_routing_and_refuses_what_it_cannot_take(tmp_path, capsys):
    r = in_process(capsys, "train", "--routing", "self-attention", "--routing-iterations", "5", "--out", tmp_path / "a")
    assert_clean_error(r, "--routing-iterations 5 sets the rounds of a routing that iterates, and --routing "
                          "self-attention makes one pass: leave the rounds out")
    r = in_process(capsys, "train", "--model-option", "routing=self-attention", "--model-option", "routing_iterations=2",
                   "--out", tmp_path / "a")
    assert_clean_error(r, "--model-option routing_iterations=2 sets the rounds of a routing that iterates, and "
                          "--model-option routing=\"self-attention\" makes one pass")
    r = in_process(capsys, "train", "--model", "segcaps", "--dataset", "mnist-segmentation", "--routing",
                   "self-attention", "--model-option",
                   "primary_routing_iterations=2", "--out", tmp_path / "a")  # SegCaps' primary layer's rounds too
    assert_clean_error(r, "--model-option primary_routing_iterations=2 sets the rounds of a routing that iterates, "
                          "and --routing self-attention makes one pass")
    r = in_process(capsys, "train", "--routing", "inverted", "--out", tmp_path / "a")
    from capsnet.models import CapsNetConfig

    # refused with its reason (it was argparse's "invalid choice", which said none), the ones CapsNet takes named
    choices = ", ".join(CapsNetConfig.probability_routings())  # a routing added by its file too
    assert_clean_error(r, "--routing inverted: CapsNetConfig.routing: inverted routing's activations are not "
                          "probabilities in [0, 1]", f"use one of {choices}")
    r = in_process(capsys, "train", "--routing", "nope", "--out", tmp_path / "a")  # (argparse's list had inverted)
    assert_clean_error(r, "argument --routing: unknown routing 'nope'; CapsNet's digit capsules take dynamic, ")
    assert "inverted" not in r.stderr
    # a dynamic-routing switch typed for another routing: the fix names the flag typed (it said to set the field false
    # with --model-option, which then clashed with the flag: a review, 2026-11-30)
    for routing, flag in (("self-attention", "--detach-agreement"), ("em", "--leaky-routing")):
        r = in_process(capsys, "train", "--routing", routing, flag, "--out", tmp_path / "a")
        assert_clean_error(r, f"{flag} is an option of dynamic routing, which --routing {routing} is not: leave "
                              f"{flag} out")
    r = in_process(capsys, "train", "--model", "capsnet-cifar10", "--dataset", "cifar10", "--routing", "em",
                   "--model-option", "leaky_routing=true", "--out", tmp_path / "a")  # the config's own check beneath
    assert_clean_error(r, "--model-option leaky_routing=true is an option of dynamic routing, which --routing em")
    r = in_process(capsys, "train", "--model", "em-capsnet-small", "--routing", "em", "--out", tmp_path / "a")
    assert_clean_error(r, "--routing does not apply to --model em-capsnet-small; use it with --model capsnet, "
                          "capsnet-cifar10 or capsnet-svhn")
    r = in_process(capsys, "train", "--routing", "em", "--model-option", 'routing_options={"bogus": 1}',
                   "--out", tmp_path / "a")
    assert_clean_error(r, "em routing takes no option bogus")
    # the option as typed, not the config's dict with EM's start in it ("{'beta_a_init': -25.0, 'bogus': 1}"), which
    # read as if the user had set beta_a_init (a README walkthrough, 2026-12-03)
    r = in_process(capsys, "train", "--routing", "em", "--routing-option", "bogus=1", "--out", tmp_path / "a")
    assert_clean_error(r, "--routing-option bogus=1: em routing takes no option bogus; its options are beta_a_init")
    assert "-25" not in r.stderr
    r = in_process(capsys, "train", "--routing", "em", "--routing-option", "final_lambda=0.02", "--model-option",
                   'routing_options={"final_lambda": 0.03}', "--out", tmp_path / "a")
    assert_clean_error(r, '--routing-option final_lambda=0.02 and --model-option routing_options={"final_lambda": 0.03} '
                          'both set routing_options; keep one')
    r = in_process(capsys, "train", "--model", "baseline", "--routing-option", "final_lambda=0.02", "--out", tmp_path / "a")
    assert_clean_error(r, "--routing-option does not apply to --model baseline; use it with --model capsnet, "
                          "capsnet-cifar10 or capsnet-svhn")
    # a list typed as the flags type theirs: told the JSON it takes
    r = in_process(capsys, "train", "--model-option", "decoder_hidden=512, 1024", "--out", tmp_path / "a")
    assert_clean_error(r, "CapsNetConfig.decoder_hidden must be a list of integers, got '512, 1024'; give a JSON "
                          "list, e.g. decoder_hidden=[512,1024]")
    for typed in ("(512, 1024)", "[512,1024"):  # no list to wrap: no hint that would be wrong JSON again
        r = in_process(capsys, "train", "--model-option", f"decoder_hidden={typed}", "--out", tmp_path / "a")
        assert_clean_error(r, f"must be a list of integers, got {typed!r}\n")
    assert not any(tmp_path.iterdir())


def test_a_capsnet_trained_with_em_routing_is_rebuilt_from_its_checkpoint(tmp_path, capsys, monkeypatch):
    """The routing and its options are in the run's config (--routing-option: a later value of a key over an earlier
    one): eval rebuilds the same network (its figure again), and figures draw its routing and name its scores as what
    they are; a resume holds the options."""
    run = tmp_path / "em"
    r = in_process(capsys, "train", "--routing", "em", "--routing-option", "final_lambda=0.05", "--routing-option",
                   "final_lambda=0.02", "--conv1-channels", "8", "--primary-types", "2", "--dataset", "mnist-sample", "--train-size", "64",
                   "--test-size", "32", "--epochs", "1", "--batch-size", "32", "--out", run, "--no-progress")
    assert r.returncode == 0, r.stderr
    model_config = json.loads((run / "config.json").read_text())["model_config"]
    assert model_config["routing"] == "em" and model_config["digit_init_std"] == 0.3
    assert model_config["routing_options"] == {"beta_a_init": -25.0, "final_lambda": 0.02}  # CapsNet's start written in
    from capsnet.evaluate import load_model
    model, _ = load_model(run)
    assert type(model.digits.routing).__name__ == "EMRouting" and model.digits.routing.final_lambda == 0.02
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    r = in_process(capsys, "train", "--resume", "--out", run, "--routing-option", "final_lambda=0.05")
    assert_clean_error(r, "--routing-option final_lambda=0.05 differs from the run in")
    r = in_process(capsys, "train", "--resume", "--out", run, "--routing-option", "final_lambda=0.02", "--epochs", "1")
    assert r.returncode == 0, r.stderr  # the run's own value, typed again: one key of its options, not all of them
    r = in_process(capsys, "eval", "--checkpoint", run, "--dataset", "mnist-sample", "--test-size", "32",
                   "--json", tmp_path / "e.json", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "e.json").read_text())["accuracy"] == pytest.approx(metrics[-1]["test_accuracy"])
    import capsnet.figures.report as report
    drawn = []
    plot_lengths = report.plot_lengths
    monkeypatch.setattr(report, "plot_lengths", lambda *a, **kw: drawn.append(kw) or plot_lengths(*a, **kw))
    # the class scores and the routing of one input (one pose dimension swept, none misclassified shown, 40 dpi)
    r = in_process(capsys, "figures", "--checkpoint", run, "--dataset", "mnist-sample", "--indices", "0", "--dims", "0",
                   "--misclassified", "0", "--dpi", "40", "--out", tmp_path / "fig", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert drawn[0]["score"] == "class capsule activation (em routing)" and drawn[0]["m_plus"] == 0.9
    assert (tmp_path / "fig" / "routing_0.png").exists()
    from capsnet.viz.engine import load_viewer
    viewer = load_viewer(run, dataset="mnist-sample", progress=False, test_size=4)
    walked = viewer.walk(viewer.test_input(1))
    assert viewer.info()["routing_iterations"] == 3 and walked["coupling"] and walked["reconstruction"]


def test_model_flags_that_do_not_apply_are_refused(tmp_path, capsys):
    r = in_process(capsys, "train", "--model", "baseline", "--routing-iterations", "2", "--out", tmp_path / "a")
    assert_clean_error(r, "--routing-iterations does not apply to --model baseline; use it with --model "
                          "capsnet, capsnet-cifar10, capsnet-svhn, em-capsnet, em-capsnet-small or inverted-capsnet")
    r = in_process(capsys, "train", "--model", "baseline", "--routing-iterations", "2", "--primary-types", "8",
                   "--out", tmp_path / "a")
    assert_clean_error(r, "--primary-types, --routing-iterations do not apply to --model baseline; use them with "
                          "--model capsnet, capsnet-cifar10, capsnet-svhn, em-capsnet, em-capsnet-small or inverted-capsnet")
    r = in_process(capsys, "train", "--dropout", "0.3", "--out", tmp_path / "b")
    assert_clean_error(r, "--dropout does not apply to --model capsnet, the default for --dataset mnist; use it with "
                          "--model baseline")
    r = in_process(capsys, "train", "--model", "unet", "--dataset", "mnist-segmentation", "--routing-iterations", "2",
                   "--out", tmp_path / "b")  # the models of the chosen model's task that take it
    assert_clean_error(r, "--routing-iterations does not apply to --model unet; use it with --model segcaps or "
                          "segcaps-r1")
    r = in_process(capsys, "train", "--model", "segcaps", "--dataset", "mnist-segmentation", "--dropout", "0.3",
                   "--out", tmp_path / "b")  # none of its task takes it
    assert_clean_error(r, "--dropout does not apply to --model segcaps; no segmentation model takes it (--model "
                          "baseline, capspix2pix, capspix2pix-deep or pix2pix do)")
    r = in_process(capsys, "train", "--model", "baseline", "--dropout", "1", "--out", tmp_path / "c")
    assert_clean_error(r, "dropout must be in [0, 1)")
    assert not any(tmp_path.iterdir())


@pytest.mark.e2e
def test_output_into_a_closed_pipe_is_not_a_traceback(trained_run, data_root, tmp_path):
    # `capsnet eval ... | head -1`: the reader goes away before the table is printed.
    proc = subprocess.Popen([sys.executable, "-m", "capsnet", "eval", "--checkpoint", str(trained_run), "--no-progress",
                             "--test-size", "20", "--data-dir", str(data_root), "--json", str(tmp_path / "eval.json")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # long before the command has imported torch
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141 and "Traceback" not in err, err
    assert json.loads((tmp_path / "eval.json").read_text())["images"] == 20  # the report is written all the same


def test_the_version_is_the_one_pyproject_and_the_installed_metadata_give():
    """The version is written in pyproject.toml and in capsnet/__init__.py; nothing tied them (a review of a wheel
    install, 2026-12-02). ``capsnet --version`` prints the package's."""
    import importlib.metadata
    import re

    import capsnet

    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text(encoding="utf-8")
    written = re.search(r'^version = "([^"]+)"$', pyproject, re.MULTILINE).group(1)
    assert capsnet.__version__ == written == importlib.metadata.version("capsnet")


def test_first_minutes_messages(tmp_path, trained_run, capsys, monkeypatch):
    r = in_process(capsys, "--version")
    assert r.returncode == 0 and r.stdout.startswith("capsnet 0.") and "torch" in r.stdout
    junk = tmp_path / "notes.safetensors"
    junk.write_text("not a checkpoint at all")
    assert_clean_error(in_process(capsys, "eval", "--checkpoint", junk), "is not a checkpoint: not a safetensors file")
    # a finished run says so, and Ctrl-C names the exact command that resumes the run
    run = _copy_run(trained_run, tmp_path / "run")
    from capsnet import train

    monkeypatch.setattr(train, "fit", lambda *a, **k: {})
    r = in_process(capsys, "train", "--out", run, "--resume", "--no-progress")
    assert r.returncode == 0 and f"the run in {run} has finished its 2 epochs; pass a larger --epochs" in r.stdout

    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(train, "fit", interrupted)
    r = in_process(capsys, "train", "--dataset", "mnist-sample", "--out", tmp_path / "new", "--no-progress")
    assert r.returncode == 130  # before the first save there is nothing to resume
    assert "interrupted before the run saved anything" in r.stderr and "--resume" not in r.stderr
    # with a checkpoint: the command holds the flags a checkpoint does not keep (before: --data-dir was dropped)
    r = in_process(capsys, "train", "--out", run, "--resume", "--epochs", "3", "--data-dir", tmp_path / "data",
                   "--compile", "--no-progress")
    assert r.returncode == 130
    assert (f"interrupted; `capsnet train --out {run} --resume --data-dir {tmp_path / 'data'} --compile default` "
            f"continues") in r.stderr


@pytest.mark.parametrize("flags, said", [
    (["--model", "baseline", "--dropout", "1.5"], "--dropout 1.5: BaselineCNNConfig.dropout must be in [0, 1)"),
    (["--lr-min", "0.1"], "--lr-min 0.1: lr_min must lie in [0, lr]"),
    (["--routing-option", "final_lambda=0.01"], "--routing-option final_lambda=0.01: dynamic routing takes no option "
                                                "final_lambda"),
    (["--model-option", "routing_iterations=0"], "--model-option routing_iterations=0: CapsNetConfig."
                                                 "routing_iterations must be a positive integer, got 0"),
    # a refusal opening with a field not typed, that names the one typed (it was said without a flag)
    (["--model", "efficient-capsnet", "--model-option", "primary_dim=7"],
     "--model-option primary_dim=7: primary_caps * primary_dim must be the last convolution's 128 channels"),
    # a field's name as a word of the fix is not what was refused (it was opened by --no-decoder: the diff's review)
    (["--conv1-channels", "200000", "--no-decoder"], "this CapsNetConfig would hold "),
])
def test_a_value_the_config_refuses_is_said_with_its_flag(flags, said, tmp_path, capsys):
    """The configs name their fields (BaselineCNNConfig.dropout, lr_min), which no command line shows: the refusal
    opens with the flag as typed (a review, 2026-12-02). Nothing is written."""
    r = in_process(capsys, "train", *flags, "--out", tmp_path / "run", "--no-progress")
    assert_clean_error(r, f"capsnet train: error: {said}")
    assert not (tmp_path / "run").exists()


def test_an_experiments_value_the_config_refuses_is_said_with_its_flag(tmp_path, capsys):
    """As train's (the diff's review, 2026-12-02: the experiment named the field alone). Nothing is written."""
    r = in_process(capsys, "experiment", "multimnist", "--dropout", "1.5", "--out", tmp_path / "x", "--no-progress")
    assert_clean_error(r, "capsnet experiment: error: --dropout 1.5: BaselineCNNConfig.dropout must be in [0, 1)")
    assert not (tmp_path / "x").exists()


def test_unknown_devices_and_unwritable_paths_are_one_line_errors_before_any_work(tmp_path, trained_run, capsys):
    """Before: torch's RuntimeError for --device foo, and FileNotFoundError / FileExistsError tracebacks for an
    output in a missing folder (after the whole evaluation) or an --out that is a file."""
    for command in (["eval", "--checkpoint", trained_run], ["bench", "--repeats", "1"],
                    ["train", "--dataset", "mnist-sample", *TINY, "--out", tmp_path / "r"]):
        r = in_process(capsys, *command, "--device", "foo")
        assert_clean_error(r, "unknown device 'foo'; use auto, cpu, cuda or cuda:N")
        # device types torch knows that this build cannot use, or that hold no numbers: a traceback from inside the
        # work before (bench's timing, train's model), now one line
        for device, said in (("meta", "device 'meta' holds shapes, not numbers"),
                             ("xpu", "device 'xpu' asked for, but this PyTorch cannot use it here")):
            if device == "xpu" and torch.xpu.is_available():
                continue
            r = in_process(capsys, *command, "--device", device)
            assert_clean_error(r, said)
            assert "(--device cpu" in r.stderr and "use 'cpu'" in r.stderr
    r = in_process(capsys, "eval", "--checkpoint", trained_run, "--json", tmp_path / "missing" / "x.json")
    assert_clean_error(r, f"the folder {tmp_path / 'missing'} does not exist")
    assert r.stdout == ""  # refused before the evaluation
    r = in_process(capsys, "bench", "--json", tmp_path, "--repeats", "1")
    assert_clean_error(r, f"--json {tmp_path} is a folder; give a file name")
    # a new folder's name with its slash was written as a file of that name; a file's name as a folder was said not
    # to exist (a review, 2026-12-02)
    r = in_process(capsys, "eval", "--checkpoint", trained_run, "--json", f"{tmp_path / 'results'}/")
    assert_clean_error(r, f"--json {tmp_path / 'results'}/ names a folder (it ends in a slash); give a file name, "
                          f"e.g. {tmp_path / 'results' / 'results.json'}")
    (tmp_path / "plain").write_text("")
    r = in_process(capsys, "eval", "--checkpoint", trained_run, "--json", tmp_path / "plain" / "x.json")
    assert_clean_error(r, f"{tmp_path / 'plain'} is a file, not a folder")
    assert r.stdout == "" and not (tmp_path / "results").exists()
    (tmp_path / "a_file").write_text("")
    r = in_process(capsys, "train", "--dataset", "mnist-sample", *TINY, "--epochs", "1", "--out", tmp_path / "a_file")
    assert_clean_error(r, f"{tmp_path / 'a_file'} is a file, where a folder was to be made; give a folder (--out)")
    # an atomic write's temporary file named the folder it could not write in, not itself (.config.json.tmp-...)
    from capsnet.cli import _path_error

    e = OSError(30, "Read-only file system", str(tmp_path / "ro" / ".config.json.tmp-9866z12_"))
    assert _path_error(e) == (f"cannot write in {tmp_path / 'ro'}: Read-only file system; give a folder you can write "
                              f"to (--out)")
    e = OSError(2, "No such file or directory", str(tmp_path / "x.json"))
    assert _path_error(e) == f"No such file or directory: {tmp_path / 'x.json'}; check the paths given"
    # a file size limit (ulimit -f) and a link to nothing were "File too large: ..." and "File exists: ..." (a review,
    # 2026-11-30)
    e = OSError(27, "File too large", str(tmp_path / "best.safetensors"))
    assert _path_error(e).startswith(f"cannot write {tmp_path / 'best.safetensors'}: File too large (larger than a "
                                     f"file may be here: a file size limit, `ulimit -f`, or the file system's)")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    r = in_process(capsys, "train", "--dataset", "mnist-sample", *TINY, "--epochs", "1", "--out", tmp_path / "dangling")
    assert_clean_error(r, f"{tmp_path / 'dangling'} is a link to {tmp_path / 'nowhere'}, which does not exist; create "
                          f"the folder it points to, or give another (--out)")


@pytest.mark.parametrize("dataset,flag", [("multimnist", ["--shift", "3"]), ("translated-mnist", ["--augment",
                                           "efficient-capsnet"]), ("mnist-segmentation", ["--augment", "shift"])])
def test_flags_for_images_a_data_set_makes_itself_are_refused(dataset, flag, tmp_path, capsys):
    """Before, --augment was accepted there, recorded in config.json and never applied."""
    r = in_process(capsys, "train", "--dataset", dataset, *flag, "--no-progress", "--out", tmp_path / "r")
    assert_clean_error(r, f"{flag[0]} does not apply to --dataset {dataset}, which makes its training images itself")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("flags, fragment", [
    (["--conv1-channels", "8", "--model-option", "conv1_channels=16"],
     "--conv1-channels 8 and --model-option conv1_channels=16 both set conv1_channels; keep one"),
    (["--no-decoder", "--recon-weight", "0.01"],
     "--recon-weight 0.01 weighs the reconstruction loss, and --no-decoder leaves the model without a reconstruction"),
    (["--model-option", "decoder=false", "--recon-weight", "0.01"],
     "and --model-option decoder=false leaves the model without a reconstruction"),
    (["--model", "baseline", "--recon-weight", "0.01"],
     "--recon-weight weighs a reconstruction loss, and --model baseline has none; leave --recon-weight out"),
    (["--model", "segcaps", "--dataset", "mnist-sample-segmentation", "--model-option", "reconstruction=false",
      "--recon-weight", "0.1"], "and --model-option reconstruction=false leaves the model without a reconstruction"),
    (["--augment", "efficient-capsnet", "--shift", "3"],
     "--shift sets how far --augment shift moves the images, and --augment efficient-capsnet makes its own shifts"),
    # the run evaluated on its validation examples and never read the test split, however large the size asked
    (["--train-size", "64", "--val-size", "16", "--test-size", "100000"],
     "--test-size keeps the first test examples a run evaluates on, and --val-size 16 makes the run evaluate on "
     "held-out training examples instead (it never reads the test split); leave --test-size out"),
    # one round is the last: nothing to detach (every gradient the same as without it)
    (["--detach-agreement", "--routing-iterations", "1"], "--detach-agreement stops the gradient through the routing "
     "rounds before the last, and --routing-iterations 1 routes one round, the last: leave --detach-agreement out"),
    (["--model-option", "detach_agreement=true", "--model-option", "routing_iterations=1"],
     "--model-option detach_agreement=true stops the gradient"),
])
def test_flags_that_another_flag_makes_moot_are_refused(flags, fragment, tmp_path, capsys):
    """Each was accepted, recorded in config.json and ignored (the --model-option won, the weight weighed nothing)."""
    r = in_process(capsys, "train", "--dataset", "mnist-sample", *flags, "--no-progress", "--out", tmp_path / "r")
    assert_clean_error(r, fragment)
    assert not (tmp_path / "r").exists()


def test_flags_that_agree_or_weigh_nothing_are_accepted(tmp_path, capsys):
    # the same value twice, and a zero weight beside --no-decoder, ask for nothing contradictory
    r = in_process(capsys, "train", "--dataset", "mnist-sample", "--epochs", "1", "--train-size", "64",
                   "--test-size", "32", *TINY, "--model-option", "conv1_channels=8", "--no-decoder", "--recon-weight",
                   "0", "--out", tmp_path / "r")
    assert r.returncode == 0, r.stderr
    saved = load_checkpoint(tmp_path / "r", "last")
    assert saved.model_config["conv1_channels"] == 8 and saved.model_config["decoder"] is False
    # --test-size 0 (all, the default) beside --val-size asks for no test examples (it was refused: a review,
    # 2026-12-02)
    r = in_process(capsys, "train", "--dataset", "mnist-sample", "--epochs", "1", "--train-size", "64",
                   "--val-size", "16", "--test-size", "0", *TINY, "--out", tmp_path / "v")
    assert r.returncode == 0, r.stderr
    assert load_checkpoint(tmp_path / "v", "last").train_config["val_size"] == 16


def test_a_budget_the_run_cannot_follow_is_warned_in_one_line(tmp_path, capsys):
    r = in_process(capsys, "train", "--dataset", "mnist-sample", "--epochs", "1", "--train-size", "40",
                   "--test-size", "20", *TINY, "--batch-size", "64", "--warmup-steps", "5", "--out", tmp_path / "r")
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert ("capsnet train: warning: --batch-size 64 is more than the 40 training examples: each epoch is one step of "
            "all 40") in lines
    assert any(s.startswith("capsnet train: warning: a warm-up of 5 steps (--warmup-steps, as given or the model's "
                            "default: 200 for --model baseline) is longer than the run's 1 optimizer step:")
               for s in lines), r.stderr
    assert "UserWarning" not in r.stderr and "warnings.warn" not in r.stderr


@pytest.mark.e2e
def test_bench_prints_no_profiler_start_and_stop_lines():
    """torch 2.13's profiler (peak memory) wrote a 'USDT: ... profiler_start' line to stderr per measurement; the
    level KINETO_LOG_LEVEL=5 left them, 6 is above them. In a process of its own: the level is read once."""
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    r = subprocess.run([sys.executable, "-m", "capsnet", "bench", "--batch-size", "2", "--repeats", "1", "--baseline",
                        "", "--device", "cpu"], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr
    assert "| capsnet | cpu | train | 2 |" in r.stdout
    assert "USDT" not in r.stderr and "profiler_start" not in r.stderr, r.stderr


def test_eval_and_export_never_write_over_a_runs_own_files(trained_run, data_root, tmp_path, capsys):
    """`eval --json run/best.safetensors` replaced the checkpoint it had scored with its report, and `export --out
    run/last.safetensors` the resumable checkpoint with ONNX (config.json and metrics.jsonl likewise)."""
    run = _copy_run(trained_run, tmp_path / "run")
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    for target, what in (("best.safetensors", "a checkpoint's name (.safetensors)"),
                         ("config.json", f"the config.json of the run in {run}"),
                         ("metrics.jsonl", f"the metrics.jsonl of the run in {run}")):
        r = in_process(capsys, "eval", "--checkpoint", run, "--json", run / target, "--data-dir", data_root,
                       "--no-progress")
        assert_clean_error(r, f"--json {run / target} is {what}; writing there would lose it")
        assert r.stdout == ""  # refused before the evaluation
        r = in_process(capsys, "export", "--checkpoint", run, "--which", "last", "--format", "torch-export",
                       "--out", run / target)
        assert_clean_error(r, f"{run / target} is {what}")
    r = in_process(capsys, "export", "--checkpoint", run, "--format", "torch-export", "--out", tmp_path / "model")
    assert_clean_error(r, f"{tmp_path / 'model'} has no suffix; name it model.pt2")
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before
    assert not (tmp_path / "model").exists()


def test_eval_reports_on_other_data_or_sizes_keep_the_runs_own_report(trained_run, data_root, tmp_path, capsys):
    """A quick check (--test-size 50, or another data set) wrote eval-best.json over the whole test set's report."""
    run = _copy_run(trained_run, tmp_path / "run")
    saved = load_checkpoint(run, "best").train_config
    assert in_process(capsys, "eval", "--checkpoint", run, "--which", "best", "--data-dir", data_root,
                      "--no-progress").returncode == 0
    full = json.loads((run / "eval-best.json").read_text())
    assert full["images"] == 10_000 and saved["test_size"] == 200  # the whole split, whatever the run scored
    assert in_process(capsys, "eval", "--checkpoint", run, "--which", "best", "--test-size", 50, "--data-dir",
                      data_root, "--no-progress").returncode == 0
    assert json.loads((run / "eval-best-n50.json").read_text())["images"] == 50
    assert in_process(capsys, "eval", "--checkpoint", run, "--which", "best", "--dataset", "mnist-sample",
                      "--test-size", 40, "--no-progress").returncode == 0
    assert json.loads((run / "eval-best-mnist-sample-n40.json").read_text())["dataset"] == "mnist-sample"
    assert json.loads((run / "eval-best.json").read_text()) == full  # untouched
    r = in_process(capsys, "eval", "--checkpoint", run, "--json", "/sys/e.json", "--data-dir", data_root,
                   "--no-progress")  # a folder nobody may write in, root included: said before the evaluation
    assert_clean_error(r, "--json /sys/e.json: cannot write in /sys (")
    assert r.stdout == ""


def test_figures_and_the_viewer_refuse_a_data_set_of_another_shape_before_reading_it(trained_run, tmp_path, capsys):
    """Both went for CIFAR-10 (a 170 MB download) before saying a 1x28x28 model cannot read it; eval said so at once."""
    from capsnet.viz.engine import ViewerError, load_viewer

    empty = tmp_path / "no-data"
    empty.mkdir()
    r = in_process(capsys, "figures", "--checkpoint", trained_run, "--dataset", "cifar10", "--data-dir", empty,
                   "--out", tmp_path / "f", "--no-progress")
    assert_clean_error(r, "cifar10 images are (3, 24, 24) but the checkpoint's model takes (1, 28, 28)")
    with pytest.raises(ViewerError, match=r"cifar10 test images are \(3, 24, 24\) but the model takes \(1, 28, 28\)"):
        load_viewer(trained_run, dataset="cifar10", data_dir=empty, progress=False)
    assert list(empty.iterdir()) == [] and not (tmp_path / "f").exists()


def test_figures_dpi_and_the_viewers_test_size_have_bounds(trained_run, tmp_path, capsys):
    """--dpi 100000 ended in a MemoryError traceback and an empty --out; viz --test-size 99999 opened on 500."""
    from capsnet.viz.engine import ViewerError, load_viewer

    r = in_process(capsys, "figures", "--checkpoint", trained_run, "--dpi", 100000, "--out", tmp_path / "f")
    assert_clean_error(r, "argument --dpi: must be an integer from 10 to 1200 dots per inch")
    assert not (tmp_path / "f").exists()
    # 1 to 5 met FreeType's smallest font size (a traceback), --misclassified 100000 drew 8,055 panels for minutes
    # in 9.7 GB (a review, 2026-11-30)
    for flag, value, said in (("--dpi", 5, "must be an integer from 10 to 1200"),
                              ("--misclassified", 101, "must be at most 100 (one row of panels), got 101")):
        assert_clean_error(in_process(capsys, "figures", "--checkpoint", trained_run, flag, value, "--out",
                                      tmp_path / "f"), said)
        assert not (tmp_path / "f").exists()
    with pytest.raises(ViewerError, match="--test-size 99999 exceeds the 500 test examples of mnist-sample; give at "
                                          "most 500, or 0 for all"):
        load_viewer(trained_run, dataset="mnist-sample", test_size=99999, progress=False)
    assert len(load_viewer(trained_run, dataset="mnist-sample", test_size=500, progress=False).test_images) == 500


def test_which_for_a_checkpoint_file_or_a_shipped_model_is_refused(trained_run, tmp_path, capsys):
    """--which picks a run directory's best or last: with a .safetensors file or pretrained:NAME it was accepted and
    ignored (the file was evaluated, under the name eval-best, whatever --which said)."""
    for checkpoint in (trained_run / "best.safetensors", "pretrained:capsnet-mnist-small"):
        for command in (["eval", "--checkpoint", checkpoint], ["export", "--checkpoint", checkpoint],
                        ["figures", "--checkpoint", checkpoint, "--out", tmp_path / "f"]):
            r = in_process(capsys, *command, "--which", "last")
            assert r.returncode == 2 and f"--which last picks a run directory's best or last checkpoint; {checkpoint} " \
                   f"is one checkpoint (a file or a shipped model): leave --which out" in r.stderr, r.stderr
    assert not (tmp_path / "f").exists()  # a run directory with --which: test_eval_... above and the weights tests


@pytest.mark.parametrize("command", [["train", "--dataset", "mnist-sample", "--epochs", "1"],
                                     ["figures", "--checkpoint", "pretrained:capsnet-mnist-small"],
                                     ["experiment", "routing"]])
def test_an_out_folder_that_cannot_be_made_or_written_is_refused_before_the_work(command, tmp_path, capsys,
                                                                                 monkeypatch):
    """train, figures and experiment found a file above --out, or a read-only disk, at their first write (figures
    after 40 s of work), with 'Not a directory: .../config.json; check the paths given' (a review, 2026-11-30)."""
    import capsnet.checkpoint as checkpoint

    (tmp_path / "a-file").write_text("")
    r = in_process(capsys, *command, "--out", tmp_path / "a-file" / "out")
    assert_clean_error(r, f"--out {tmp_path}/a-file/out: {tmp_path}/a-file is a file, where a folder was to be made; "
                          f"give another folder")
    monkeypatch.setattr(checkpoint, "unwritable", lambda folder: "Read-only file system")
    r = in_process(capsys, *command, "--out", tmp_path / "new" / "out")
    assert_clean_error(r, f"--out {tmp_path}/new/out: nothing can be written in {tmp_path} (Read-only file system); "
                          f"give a folder you can write to")
    assert not (tmp_path / "new").exists()


def test_edge_values_a_review_found_are_refused_in_one_line(tmp_path, capsys):
    """Each gave a traceback, a half-made run folder or a quiet surprise (a review, 2026-11-30)."""
    run = tmp_path / "r"
    # a field the data set sets: 'got multiple values for keyword argument' (a TypeError's traceback)
    r = in_process(capsys, "train", "--dataset", "mnist-sample", "--model-option", "num_classes=12", "--out", run)
    assert_clean_error(r, "--model-option num_classes=12: capsnet train sets num_classes from --dataset mnist-sample "
                          "(10); leave it out")
    # a shift as large as the image: digits out of frame; 2^31: a storage overflow after config.json was written
    for shift in ("28", "2147483648"):
        r = in_process(capsys, "train", "--dataset", "mnist-sample", "--shift", shift, *TINY, "--out", run)
        assert_clean_error(r, f"shift {shift} (--shift) moves images of 28 pixels a side out of their frame; give "
                              f"less than 28")
    assert not run.exists()
    # a shift past half the side empties some images (trained on as blanks of their class): warned (a review,
    # 2026-11-30); the paper's 2 and up to half the side are not
    for shift, warned in (("20", True), ("14", False)):
        r = in_process(capsys, "train", "--dataset", "mnist-sample", "--shift", shift, "--epochs", "1", "--train-size",
                       "32", "--test-size", "16", *TINY, "--out", tmp_path / f"s{shift}")
        assert r.returncode == 0 and (f"--shift {shift} moves some images' ink wholly out of their 28-pixel frame"
                                      in r.stderr) == warned, r.stderr
    # empty paths: --out "" trained into runs/DATASET, predict --out "" wrote into the working folder
    assert_clean_error(in_process(capsys, "train", "--out", ""), "--out needs a path, got an empty one; give one or "
                                                                 "leave the flag out")
    assert_clean_error(in_process(capsys, "predict", "--checkpoint", "x", "--images", "", "--out", run),
                       "--images needs a path, got an empty one; give one")
    # an empty --host bound every interface while the URL printed said 127.0.0.1
    assert_clean_error(in_process(capsys, "viz", "--untrained", "--host", " "), "--host needs an address")
    assert_clean_error(in_process(capsys, "viz", "--untrained", "--which", "last"),
                       "--which last picks a run directory's best or last checkpoint; an untrained model has none")
    # 2^70 images a step reached torch
    assert_clean_error(in_process(capsys, "bench", "--batch-size", str(2 ** 70)),
                       "must be an integer >= 1 and <= 2,147,483,647")


def test_a_model_option_equal_to_what_the_data_set_sets_is_taken(tmp_path, capsys):
    r = in_process(capsys, "train", "--dataset", "mnist-sample", "--model-option", "num_classes=10", "--epochs", "1",
                   "--train-size", "64", "--test-size", "32", *TINY, "--out", tmp_path / "r")
    assert r.returncode == 0, r.stderr


def test_eval_of_a_run_without_validation_scores_its_final_epoch_not_its_best_on_test(trained_run, data_root,
                                                                                      tmp_path, capsys):
    """Trained without --val-size, a run's best.safetensors is the epoch with the best test figure; eval's default
    scored it, so the quick start's eval printed the best test figure over epochs (93.6% against the final 93.4%:
    a review, 2026-11-30). It scores last.safetensors and says why; --which best scores best as asked, with a note
    of what its figures are (it said nothing: a review, 2026-12-02); a run with a validation split keeps its best."""
    run = _copy_run(trained_run, tmp_path / "run")
    assert load_checkpoint(run, "best").state["best"]["split"] == "test"
    r = in_process(capsys, "eval", "--checkpoint", run, "--test-size", 30, "--data-dir", data_root, "--no-progress")
    assert r.returncode == 0 and "scored from last.safetensors, the final epoch's weights" in r.stdout
    report = json.loads((run / "eval-last-n30.json").read_text())
    assert report["epoch"] == 2 and not (run / "eval-best-n30.json").exists()
    r = in_process(capsys, "eval", "--checkpoint", run, "--which", "best", "--test-size", 30, "--data-dir", data_root,
                   "--no-progress")
    assert r.returncode == 0 and (run / "eval-best-n30.json").exists() and "scored from last" not in r.stdout
    epoch = load_checkpoint(run, "best").state["best"]["epoch"]
    assert (f"{run}: best.safetensors (epoch {epoch}), asked for, was chosen on the test split (trained without "
            f"--val-size): its test figures are the best over epochs, not an estimate; --which last is the final "
            f"epoch's") in r.stdout
    from capsnet.checkpoint import save_checkpoint

    best = load_checkpoint(run, "best")
    best.state["best"]["split"] = "val"  # as a run with --val-size saves it
    save_checkpoint(run / "best.safetensors", best)
    (run / "eval-best-n30.json").unlink()
    r = in_process(capsys, "eval", "--checkpoint", run, "--test-size", 30, "--data-dir", data_root, "--no-progress")
    assert r.returncode == 0 and "chosen on the test split" not in r.stdout and (run / "eval-best-n30.json").exists()
    (run / "eval-best-n30.json").unlink()
    r = in_process(capsys, "eval", "--checkpoint", run, "--which", "best", "--test-size", 30, "--data-dir", data_root,
                   "--no-progress")  # asked for and chosen on validation: no note
    assert r.returncode == 0 and "chosen on the test split" not in r.stdout and (run / "eval-best-n30.json").exists()


@pytest.mark.parametrize("how", ["command", "module"])
def test_ctrl_c_while_torch_loads_is_one_line_not_a_traceback(tmp_path, how):
    """Ctrl-C in the first seconds of `capsnet ...` (torch importing) printed a traceback from inside torch's import:
    capsnet's package imports nothing until a name is used, and the entry points guard the CLI's import. The
    interrupt is raised here by a torch that stands in for the real one and raises it on import."""
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "torch.py").write_text("raise KeyboardInterrupt\n")  # found before the real torch (PYTHONPATH first)
    code = "from capsnet._entry import main; raise SystemExit(main())" if how == "command" else None
    argv = [sys.executable, "-c", code, "eval"] if code else [sys.executable, "-m", "capsnet", "eval"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 130 and r.stderr.strip() == "capsnet: interrupted while starting", r.stderr
    import capsnet

    # the package's names load on use, as before
    assert capsnet.create_model("capsnet", conv1_channels=8, primary_types=2).config.conv1_channels == 8
    assert set(capsnet.__all__) <= set(dir(capsnet)) and capsnet.__version__


def test_eval_of_an_unfinished_run_without_validation_keeps_its_best_and_says_what_it_is(trained_run, data_root,
                                                                                       tmp_path, capsys):
    """A run stopped before its last epoch has no final epoch: eval scored its last.safetensors (an unevaluated
    save) and called it 'the final epoch's weights' (a review, 2026-11-30). It scores best and says that figure
    is the best over the epochs so far."""
    from capsnet.checkpoint import save_checkpoint

    run = _copy_run(trained_run, tmp_path / "run")
    for which in ("best", "last"):  # as if it had been training 5 epochs
        ckpt = load_checkpoint(run, which)
        ckpt.train_config["epochs"] = 5
        save_checkpoint(run / f"{which}.safetensors", ckpt)
    r = in_process(capsys, "eval", "--checkpoint", run, "--test-size", 30, "--data-dir", data_root, "--no-progress")
    assert r.returncode == 0 and "has not finished its 5 epochs" in r.stdout and "best over its epochs so far" in \
        r.stdout and "scored last" not in r.stdout
    assert (run / "eval-best-n30.json").exists() and not (run / "eval-last-n30.json").exists()


def test_a_bare_import_reaches_the_subpackages_as_the_docs_spell_them():
    """After the package's names became lazy, `import capsnet; capsnet.models.create_model(...)` (how `capsnet
    models NAME` and the README spell it) was an AttributeError (a review, 2026-11-30); `import capsnet` still
    imports no torch until a name is used."""
    code = ("import sys, capsnet; assert 'torch' not in sys.modules; "
            "m = capsnet.models.create_model('baseline', channels=(4,), hidden=(8,)); "
            "assert type(m).__name__ == 'BaselineCNN' and callable(capsnet.routing.plain_routing); "
            "assert 'models' in dir(capsnet) and capsnet.squash is capsnet.ops.squash; print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_a_tilde_the_shell_left_in_a_path_flag_is_the_home_folder_for_the_check_and_the_write(tmp_path, monkeypatch,
                                                                                             capsys):
    """--out=~/x (no shell expands a ~ after '='): the check looked at $HOME/x and training wrote ./~/x, a folder
    named ~ in the working folder (a review, 2026-11-30)."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    r = in_process(capsys, "train", "--dataset", "mnist-sample", *TINY, "--epochs", "1", "--train-size", "64",
                   "--test-size", "32", "--out=~/run", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert (home / "run" / "last.safetensors").exists() and not (work / "~").exists()
    r = in_process(capsys, "eval", "--checkpoint=~/run", "--json=~/e.json", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert (home / "e.json").exists() and not (work / "~").exists()


def test_each_model_trains_into_a_folder_of_its_own_by_default(tmp_path, monkeypatch, capsys):
    """Without --out, every classifier but the paper's CapsNet shared runs/DATASET with it (only the baseline had a
    folder of its own): `capsnet train --model efficient-capsnet` after `capsnet train` was refused, its folder
    holding another model's run (the stop-93 note)."""
    monkeypatch.chdir(tmp_path)
    small = ["--dataset", "mnist-sample", "--epochs", "1", "--train-size", "64", "--test-size", "32",
             "--batch-size", "32", "--no-progress"]
    r = in_process(capsys, "train", *small, "--conv1-channels", "8", "--primary-types", "2")
    assert r.returncode == 0, r.stderr
    r = in_process(capsys, "train", *small, "--model", "efficient-capsnet")
    assert r.returncode == 0, r.stderr
    assert load_checkpoint(tmp_path / "runs" / "mnist-sample", "last").model_name == "capsnet"
    assert load_checkpoint(tmp_path / "runs" / "mnist-sample-efficient-capsnet", "last").model_name == \
        "efficient-capsnet"
    # a routing of its own too: `--routing em` after the plain run was refused, and its --resume fix refused again
    # (a README walkthrough, 2026-12-03); the model's own routing typed keeps the plain folder
    r = in_process(capsys, "train", *small, "--conv1-channels", "8", "--primary-types", "2", "--routing", "em")
    assert r.returncode == 0, r.stderr
    assert load_checkpoint(tmp_path / "runs" / "mnist-sample-em-routing", "last").model_config["routing"] == "em"
    r = in_process(capsys, "train", *small, "--conv1-channels", "8", "--primary-types", "2", "--routing", "dynamic")
    assert_clean_error(r, "runs/mnist-sample already holds a run")
    # a routing CapsNet cannot take is refused with its reason, not argparse's bare "invalid choice"
    r = in_process(capsys, "train", *small, "--routing", "inverted")
    assert_clean_error(r, "--routing inverted: CapsNetConfig.routing: inverted routing's activations are not "
                          "probabilities in [0, 1]")


def test_a_resume_without_out_points_to_the_older_default_folder_and_a_foreign_flag_is_refused_by_name(
        tmp_path, monkeypatch, capsys):
    """Runs an older capsnet trained into runs/DATASET for every model: `--resume` without --out of such a run said
    "nothing to resume" of the new default folder alone; and a CapsNet flag typed on a resume of another model's run
    was an AttributeError's traceback (a review of the day's changes, 2026-12-03)."""
    monkeypatch.chdir(tmp_path)
    small = ["--dataset", "mnist-sample", "--train-size", "64", "--test-size", "32", "--batch-size", "32",
             "--no-progress"]
    r = in_process(capsys, "train", *small, "--epochs", "1", "--model", "efficient-capsnet", "--out",
                   "runs/mnist-sample")  # where it went before 2026-12-03
    assert r.returncode == 0, r.stderr
    r = in_process(capsys, "train", *small, "--epochs", "2", "--model", "efficient-capsnet", "--resume")
    assert_clean_error(r, "--resume without --out looks in runs/mnist-sample-efficient-capsnet, which holds no run; "
                          "runs/mnist-sample holds a --model efficient-capsnet run", "--out runs/mnist-sample --resume")
    r = in_process(capsys, "train", *small, "--epochs", "2", "--model", "em-capsnet-small", "--resume")
    assert "runs/mnist-sample holds" not in r.stderr  # another model's run is not pointed to
    # no --out: the default run folder (CapsNet's) read only after the flags were checked against CapsNet
    r = in_process(capsys, "train", *small, "--epochs", "2", "--resume", "--conv1-channels", "8")
    assert_clean_error(r, "--conv1-channels 8 does not apply to the run in runs/mnist-sample, a --model "
                          "efficient-capsnet run: leave it out")


def test_a_resume_refused_by_a_running_trainer_says_no_resuming_line_first(trained_run, tmp_path, capsys):
    """`--resume` beside a trainer still writing the folder printed "resuming the run in ... from ..." and then the
    refusal (a review, 2026-11-30): the lock is asked first."""
    from capsnet.checkpoint import RunLock

    run = _copy_run(trained_run, tmp_path / "run")
    with RunLock(run) as other:
        other.acquire()
        r = in_process(capsys, "train", "--out", run, "--resume", "--epochs", "3", "--no-progress")
    assert_clean_error(r, "is being written by another capsnet run")
    assert "resuming" not in r.stdout


def test_a_resume_that_said_resuming_holds_the_run_against_a_second_resume(trained_run, tmp_path, capsys,
                                                                           monkeypatch):
    """Two `--resume` at once both printed "resuming the run in ..." and one was then refused (a review of
    concurrent use, 2026-12-02: the lock was asked, let go, then the line printed and the lock taken again). A
    rival asking for the lock the moment the line is printed is refused, and this run trains on."""
    import builtins

    from capsnet.checkpoint import CheckpointError, RunLock

    run = _copy_run(trained_run, tmp_path / "run")
    rival, real_print = [], builtins.print

    def printed(*a, **k):
        real_print(*a, **k)
        if a and str(a[0]).startswith("resuming the run in") and not rival:
            lock = RunLock(run)
            try:
                lock.acquire()
                rival.append("took the lock")
                lock.release()
            except CheckpointError as e:
                rival.append(str(e))

    monkeypatch.setattr(builtins, "print", printed)
    r = in_process(capsys, "train", "--out", run, "--resume", "--epochs", "3", "--no-progress")
    monkeypatch.undo()
    assert r.returncode == 0, r.stderr
    assert rival and "is being written by another capsnet run" in rival[0]
    assert f"resuming the run in {run} from epoch 2\n" in r.stdout
    assert load_checkpoint(run, "last").state["epoch"] == 3 and not (run / ".lock").exists()


def test_a_resume_from_a_damaged_last_says_the_run_cannot_resume(trained_run, tmp_path, capsys):
    """A last.safetensors cut short beside a whole best: the refusal's "use that one (--which best ...)" is for the
    commands that score a run; a resume, which needs last.safetensors, says it cannot (the diff's review,
    2026-12-02: train has no --which)."""
    run = _copy_run(trained_run, tmp_path / "run")
    last = run / "last.safetensors"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    r = in_process(capsys, "train", "--out", run, "--resume", "--epochs", "3", "--no-progress")
    assert_clean_error(r, f"checkpoint {last} is truncated or corrupt", "best.safetensors beside it is whole",
                       "; --resume continues from last.safetensors alone, so this run cannot resume: train it again "
                       "in a new --out")
    assert "resuming" not in r.stdout


def test_a_path_the_output_stream_cannot_encode_is_written_escaped_not_an_error(tmp_path, monkeypatch):
    """Under PYTHONIOENCODING=ascii (a CI job) or a cp1252 log (Windows), a non-ASCII path on stdout made every
    command end in exit status 2 and a codec's message after its work was done, its table lost (a review of
    encodings, 2026-11-30). The command escapes it, as stderr always did."""
    import io
    import sys

    from capsnet import cli

    out = tmp_path / "José" / "e.json"
    out.parent.mkdir()
    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding="ascii", errors="strict", write_through=True)  # as the program starts
    monkeypatch.setattr(sys, "stdout", stream)
    monkeypatch.setattr(cli, "AS_PROGRAM", True)
    assert cli.main(["eval", "--checkpoint", "pretrained:capsnet-mnist-small", "--dataset", "mnist-sample",
                     "--test-size", "10", "--json", str(out), "--no-progress"]) == 0
    printed = raw.getvalue()
    assert b"accuracy 1.0000" in printed and f"wrote {tmp_path}/Jos\\xe9/e.json".encode() in printed
    assert out.exists()
