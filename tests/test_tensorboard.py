"""capsnet train --tensorboard: the metrics.jsonl numbers as scalars, and images, every evaluated epoch."""
from __future__ import annotations

import json

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from capsnet.cli import main
from capsnet.tensorboard import _tile
from cli_helpers import in_process

TINY_FLAGS = ["--dataset", "mnist-sample", "--epochs", "2", "--batch-size", "50", "--train-size", "200",
              "--test-size", "100", "--conv1-channels", "16", "--primary-types", "4", "--no-progress"]


def _events(folder):
    acc = EventAccumulator(str(folder), size_guidance={"images": 0, "scalars": 0})
    acc.Reload()
    return acc


def test_tensorboard_holds_the_metrics_and_images_of_every_epoch(tmp_path, capsys):
    run, board = tmp_path / "run", tmp_path / "tb"
    assert main(["train", *TINY_FLAGS, "--out", str(run), "--tensorboard", str(board)]) == 0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    acc = _events(board)
    tags = acc.Tags()
    for key in ("train_loss", "train_accuracy", "test_loss", "test_accuracy", "test_error", "lr"):
        events = acc.Scalars(key)
        assert [e.step for e in events] == [r["step"] for r in records]
        assert [e.value for e in events] == pytest.approx([r[key] for r in records], rel=1e-6)
    assert set(tags["images"]) == {"reconstructions", "pose_sweep"}
    shots = acc.Images("pose_sweep")
    assert [s.step for s in shots] == [r["step"] for r in records]
    # 16 pose dimensions by 11 deltas of 28x28 digits, 2 pixels apart
    assert (shots[-1].height, shots[-1].width) == (16 * 30 - 2, 11 * 30 - 2)
    recon = acc.Images("reconstructions")[-1]
    assert (recon.height, recon.width) == (2 * 30 - 2, 8 * 30 - 2)  # 8 inputs above their reconstructions


def test_a_model_without_decoder_gets_scalars_only(tmp_path, capsys):
    import threading

    writers = lambda: [t for t in threading.enumerate() if "Writer" in type(t).__name__]  # noqa: E731
    before = len(writers())
    board = tmp_path / "tb"
    assert main(["train", *TINY_FLAGS, "--epochs", "1", "--no-decoder", "--out", str(tmp_path / "run"),
                 "--tensorboard", str(board)]) == 0
    tags = _events(board).Tags()
    assert "test_accuracy" in tags["scalars"] and tags["images"] == []
    # the run's event writer ended with it: fit after fit in a notebook left one thread each (a review, 2026-11-30)
    assert len(writers()) == before


def test_a_decoder_without_a_reconstruct_method_gets_scalars_only(tmp_path):
    """The logger asked hasattr(model, "reconstruct"), so a model whose decoder has no reconstruct method (None)
    went on to figures and failed there; it now asks models.reconstructs, as figures and the viewer do."""
    from capsnet.models import CapsNet, CapsNetConfig
    from capsnet.tensorboard import TensorBoardLogger

    class NoMethod(CapsNet):
        reconstruct = None

    logger = TensorBoardLogger(tmp_path / "tb", torch.rand(4, 1, 28, 28))
    logger.log_epoch(NoMethod(CapsNetConfig(conv1_channels=8, primary_types=2)), {"epoch": 1, "step": 3, "x": 0.5})
    logger.writer.close()
    tags = _events(tmp_path / "tb").Tags()
    assert tags["scalars"] == ["x"] and tags["images"] == []


def test_a_resume_that_trains_nothing_starts_no_events_file(tmp_path, capsys):
    """Each resume of a finished run with --tensorboard left an empty events file (88 bytes) in the log folder: the
    writer, made as the run started, starts one (a review of long-running use, 2026-12-02). It is made at the first
    epoch logged."""
    run, board = tmp_path / "run", tmp_path / "tb"
    flags = [*TINY_FLAGS, "--epochs", "1", "--no-decoder", "--out", str(run), "--tensorboard", str(board)]
    assert main(["train", *flags]) == 0
    first = sorted(board.glob("events.out.tfevents.*"))
    assert len(first) == 1
    for _ in range(2):
        assert main(["train", *flags, "--resume"]) == 0
        assert "has finished its 1 epoch" in capsys.readouterr().out
    assert sorted(board.glob("events.out.tfevents.*")) == first


def test_tile_places_images_row_major_on_a_grey_grid():
    images = torch.arange(6, dtype=torch.float32).view(6, 1, 1, 1) / 10  # six 1x1 images
    grid = _tile(images, rows=2, pad=1)
    assert grid.shape == (1, 3, 5)
    torch.testing.assert_close(grid[0, 0, ::2], torch.tensor([0.0, 0.1, 0.2]))
    torch.testing.assert_close(grid[0, 2, ::2], torch.tensor([0.3, 0.4, 0.5]))
    assert grid[0, 1].eq(0.5).all() and grid[0, 0, 1] == 0.5


def test_a_file_where_the_tensorboard_folder_goes_is_named_before_anything_is_written(tmp_path, capsys):
    """--tensorboard FILE was blamed on --out, after config.json had been written into the run folder."""
    (tmp_path / "afile").write_text("")
    for board in (tmp_path / "afile", tmp_path / "afile" / "below"):
        assert main(["train", *TINY_FLAGS, "--out", str(tmp_path / "run"), "--tensorboard", str(board)]) == 2
        err = capsys.readouterr().err
        assert f"--tensorboard {board}: a file stands where its folder was to be made" in err and "(--out)" not in err
        assert not (tmp_path / "run").exists()


def test_tensorboard_trouble_is_named_before_the_data_loads_or_a_file_is_written(tmp_path, capsys, monkeypatch):
    """A missing tensorboard package, a folder that cannot be made, or an empty name were found after the data had
    loaded (a download, for some) and config.json had been written; an empty name logged to ./runs/DATE_HOST."""
    import sys

    from capsnet import train as train_mod
    from capsnet.train import TrainConfig, fit
    from capsnet.models import CapsNetConfig

    monkeypatch.setattr(train_mod, "load_training", lambda *a, **k: pytest.fail("the data loaded first"))
    monkeypatch.chdir(tmp_path)
    r = in_process(capsys, "train", *TINY_FLAGS, "--out", tmp_path / "run", "--tensorboard", "")
    assert r.returncode == 2 and "--tensorboard needs a folder for the logs, got an empty name" in r.stderr
    with pytest.raises(ValueError, match="--tensorboard needs a folder for the logs, got an empty name"):
        fit(CapsNetConfig(conv1_channels=16, primary_types=4), TrainConfig(dataset="mnist-sample"), tmp_path / "run",
            tensorboard="")
    blocked = tmp_path / "ro"
    blocked.mkdir(mode=0o500)
    if not __import__("os").access(blocked, __import__("os").W_OK):  # root writes anywhere: nothing to test then
        assert main(["train", *TINY_FLAGS, "--out", str(tmp_path / "run"), "--tensorboard", str(blocked / "tb")]) == 2
        assert f"--tensorboard {blocked / 'tb'}: the folder cannot be made" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # the package missing
    assert main(["train", *TINY_FLAGS, "--out", str(tmp_path / "run"), "--tensorboard", str(tmp_path / "tb")]) == 2
    assert ("--tensorboard needs the tensorboard package: pip install tensorboard (or pip install "
            "'capsnet[tensorboard]')") in capsys.readouterr().err
    assert not (tmp_path / "run").exists() and not (tmp_path / "runs").exists()


def test_a_run_refused_after_the_log_folder_was_checked_leaves_no_empty_log_folder(tmp_path, capsys, monkeypatch):
    """The check made the folder (and its parents) before anything else: a run then refused for its data left the
    empty folder behind (a review, 2026-12-01). A folder still to make, in one that cannot be written, is named."""
    import capsnet.tensorboard as tb

    board = tmp_path / "tb" / "deeper" / "run"
    assert main(["train", "--dataset", "fashion-mnist", "--data-dir", str(tmp_path / "nowhere"), "--no-progress",
                 "--out", str(tmp_path / "run"), "--tensorboard", str(board)]) == 2
    assert "--data-dir" in capsys.readouterr().err  # refused for its data, after the log folder was checked
    assert not (tmp_path / "tb").exists() and not (tmp_path / "run").exists()
    monkeypatch.setattr(tb, "unwritable", lambda folder: "Read-only file system")
    with pytest.raises(ValueError, match=rf"--tensorboard {board}: the folder cannot be made in {tmp_path} "
                                         r"\(Read-only file system\); give a folder you can write"):
        tb.check_log_dir(board)


def test_a_log_folder_the_probe_cannot_write_in_is_refused_even_for_root(tmp_path, monkeypatch):
    """os.access said yes to root on a folder it could not write (/sys, a read-only disk); the check is now the
    run files' own probe, which tries a file there."""
    import capsnet.tensorboard as tb

    monkeypatch.setattr(tb, "unwritable", lambda folder: "Read-only file system")
    (tmp_path / "tb").mkdir()
    with pytest.raises(ValueError, match=r"--tensorboard .*tb: the folder is not writable \(Read-only file system\); "
                                         r"give a folder you can write"):
        tb.check_log_dir(tmp_path / "tb")


def test_a_log_folder_of_another_run_is_refused_and_the_runs_own_resume_logs_on(tmp_path, capsys):
    """Two runs given one --tensorboard DIR both logged there, and TensorBoard drew their scalars as one run's,
    interleaved at the same steps (a review, 2026-11-30): the folder is marked as its run's, another run is refused
    before anything is written, and the run's own resume carries on there."""
    from capsnet.tensorboard import RUN_MARK, claim_log_dir

    board, a, b = tmp_path / "tb", tmp_path / "a", tmp_path / "b"
    flags = [*TINY_FLAGS, "--epochs", "1", "--no-decoder", "--tensorboard", str(board)]
    assert main(["train", *flags, "--out", str(a)]) == 0
    assert (board / RUN_MARK).read_text().strip() == str(a.resolve())
    capsys.readouterr()
    from capsnet.checkpoint import RunLock

    with RunLock(a) as live:  # run a training (its lock held): another run into its folder is refused as such, not
        live.acquire()  # told its logs are an earlier run's, to remove (a review under torchrun, 2026-11-30)
        assert main(["train", *flags, "--out", str(a)]) == 2
        err = capsys.readouterr().err
        assert f"{a} is being written by another capsnet run" in err and "remove" not in err
    assert main(["train", *flags, "--out", str(b)]) == 2
    err = capsys.readouterr().err
    assert f"--tensorboard {board} holds the TensorBoard logs of another run ({a.resolve()})" in err
    # (tmp_path/b, beside the other run's logs, is this run's own folder: inside them, then)
    assert f"(e.g. --tensorboard {board / 'b'}: `tensorboard --logdir {board}` shows every run under it)" in err
    assert not b.exists()
    assert main(["train", *flags, "--epochs", "2", "--out", str(a), "--resume"]) == 0
    assert [e.step for e in _events(board).Scalars("test_accuracy")] == [4, 8]  # 200 digits / 50 a step
    import shutil  # a new run at the removed run's path: the mark matches, its logs are not this run's
    shutil.rmtree(a)
    capsys.readouterr()
    assert main(["train", *flags, "--out", str(a)]) == 2
    assert f"--tensorboard {board} already holds TensorBoard logs" in capsys.readouterr().err and not a.exists()
    with pytest.raises(ValueError, match="holds the TensorBoard logs of another run"):  # marked since the check
        claim_log_dir(board, b)
    assert f"if that run is this one, moved since, remove {board / RUN_MARK} (its mark)" in err
    unmarked = tmp_path / "old"  # logs from before the mark: taken as the run's
    unmarked.mkdir()
    claim_log_dir(unmarked, b)
    assert (unmarked / RUN_MARK).read_text().strip() == str(b.resolve())
    (unmarked / RUN_MARK).write_text("")  # a mark cut short by a crash marks nothing (every run was refused)
    claim_log_dir(unmarked, a)
    assert (unmarked / RUN_MARK).read_text().strip() == str(a.resolve())


def test_a_run_claiming_the_log_folder_as_another_makes_its_mark_finds_the_mark_whole(tmp_path, monkeypatch):
    """The mark was made empty (O_EXCL) and written after: a second run claiming in between read the empty mark as
    nobody's and claimed the folder too (a review of concurrent use, 2026-12-02). Here the rival claims the moment
    the mark first exists, however it is made."""
    import os

    from capsnet.tensorboard import RUN_MARK, claim_log_dir

    board = tmp_path / "tb"
    board.mkdir()
    mark, rival = board / RUN_MARK, []
    real_open, real_link = os.open, os.link

    def the_rival_claims():
        if mark.exists() and not rival:
            rival.append(None)
            try:
                claim_log_dir(board, tmp_path / "b")
            except ValueError as e:
                rival[0] = e

    def opened(path, *a, **k):
        fd = real_open(path, *a, **k)
        the_rival_claims()
        return fd

    def linked(src, dst, *a, **k):
        real_link(src, dst, *a, **k)
        the_rival_claims()

    monkeypatch.setattr(os, "open", opened)
    monkeypatch.setattr(os, "link", linked)
    claim_log_dir(board, tmp_path / "a")
    monkeypatch.undo()
    assert rival and "holds the TensorBoard logs of another run" in str(rival[0])
    assert mark.read_text().strip() == str((tmp_path / "a").resolve())
    assert [p.name for p in board.iterdir()] == [RUN_MARK]  # no temporary file left
    other = tmp_path / "tb2"  # a file system without hard links: made as before
    other.mkdir()

    def no_links(src, dst, *a, **k):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    claim_log_dir(other, tmp_path / "a")
    assert [p.name for p in other.iterdir()] == [RUN_MARK]
    assert (other / RUN_MARK).read_text().strip() == str((tmp_path / "a").resolve())


def test_a_relative_log_folder_and_run_folder_are_the_same_run_from_where_they_are_given(tmp_path, monkeypatch):
    """The mark holds the run's resolved path: the same run named relatively is itself, not another run."""
    from capsnet.tensorboard import check_log_dir, claim_log_dir

    monkeypatch.chdir(tmp_path)
    (tmp_path / "tb").mkdir()
    claim_log_dir("tb", "a")
    check_log_dir("tb", "a")
    claim_log_dir("tb", "a")
    with pytest.raises(ValueError, match="holds the TensorBoard logs of another run"):
        check_log_dir("tb", "b")


def test_a_refused_log_folder_suggests_one_beside_it_as_the_readme_lays_them_out():
    """The refusal suggested a folder inside the other run's (--tensorboard tb/ema/b), where TensorBoard draws the two
    as runs "." and "b"; the README lays runs out side by side, tb/NAME (a README walkthrough, 2026-12-03)."""
    from capsnet.tensorboard import _refuse_other_run

    with pytest.raises(ValueError, match=r"\(e\.g\. --tensorboard tb/b: `tensorboard --logdir tb` shows every run"):
        _refuse_other_run("tb/ema", "/elsewhere/ema", "runs/b")
    # no parent to share (the logs in ./tb itself): inside it
    with pytest.raises(ValueError, match=r"\(e\.g\. --tensorboard tb/b: `tensorboard --logdir tb` shows every run"):
        _refuse_other_run("tb", "/elsewhere/ema", "runs/b")
    # the folder beside it would be the run's own: inside it
    with pytest.raises(ValueError, match=r"--tensorboard x/tb/b: `tensorboard --logdir x/tb`"):
        _refuse_other_run("x/tb", "/elsewhere/ema", "x/b")
    # the other run's folder has this run's name (two runs/.../mnist): beside it under another name, not inside it
    with pytest.raises(ValueError, match=r"--tensorboard tb/mnist-2: `tensorboard --logdir tb`"):
        _refuse_other_run("tb/mnist", "/elsewhere/runs/mnist", "runs/mnist")
