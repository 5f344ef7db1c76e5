"""Progress bars: redrawn in place on a terminal, one plain line a minute in a log (capsnet._progress)."""
from __future__ import annotations

import io
import sys

import pytest

from capsnet import _progress
from capsnet._progress import progress_bar


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _run(n: int, **kw) -> None:
    bar = progress_bar(range(n), desc="epoch 1/1", unit="batch", **kw)
    for k in bar:
        bar.set_postfix(loss=f"{1 / (k + 1):.3f}", refresh=False)
    bar.close()


def test_a_log_gets_whole_ascii_lines_at_the_interval(monkeypatch, capsys):
    monkeypatch.setattr(_progress, "LOG_INTERVAL_S", 0.0)  # every update a line
    _run(4)
    err = capsys.readouterr().err  # pytest's capture is not a terminal
    lines = err.splitlines()
    assert "\r" not in err and err.endswith("\n") and err.isascii()
    assert lines[0].startswith("epoch 1/1:   0%") and "0/4" in lines[0]
    assert "100%" in lines[-1] and "4/4" in lines[-1] and "loss=0.250" in lines[-1]  # the last postfix shows
    assert len(lines) >= 3  # updates in between, each on its own line


def test_a_log_gets_only_the_first_and_last_state_of_a_short_bar(capsys):
    _run(50)  # well inside the minute
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and "0/50" in lines[0] and "50/50" in lines[1]
    _run(50, leave=False)  # a bar that vanishes when done (evaluation) leaves nothing in a log
    _run(50, progress=False)
    assert capsys.readouterr().err == ""


def test_a_terminal_keeps_tqdms_redrawn_bar(monkeypatch):
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    _run(3)
    assert "\r" in terminal.getvalue() and "3/3" in terminal.getvalue()


def test_a_training_run_logs_its_progress_as_lines(tmp_path, capsys, monkeypatch):
    from capsnet.models import CapsNetConfig
    from capsnet.train import TrainConfig, fit

    monkeypatch.setattr(_progress, "LOG_INTERVAL_S", 0.0)
    fit(CapsNetConfig(conv1_channels=8, primary_types=2, decoder_hidden=(32, 64)),
        TrainConfig(dataset="mnist-sample", epochs=1, batch_size=32, train_size=96, test_size=32, seed=0),
        tmp_path / "run", device="cpu", progress=True)
    err = capsys.readouterr().err
    assert "\r" not in err
    epoch = [line for line in err.splitlines() if line.startswith("epoch 1/1")]
    assert "0/3" in epoch[0] and "3/3" in epoch[-1] and "loss=" in epoch[-1]  # the epoch's figures at its end


def test_a_gan_run_logs_both_losses_at_the_end_of_its_epoch(tmp_path, capsys, data_root):
    from capsnet.gan import fit_gan
    from capsnet.models import CapsPix2pixConfig
    from capsnet.train import TrainConfig

    fit_gan(CapsPix2pixConfig(noise_dim=8, disc_channels=4), TrainConfig(dataset="mnist-skeleton", epochs=1,
            batch_size=8, train_size=16, test_size=4), tmp_path / "gan", device="cpu", data_root=data_root,
            progress=True)
    err = capsys.readouterr().err
    epoch = [line for line in err.splitlines() if line.startswith("epoch 1/1")]
    assert "\r" not in err and len(epoch) == 2 and "2/2" in epoch[-1]
    assert all(f"{k}=" in epoch[-1] for k in ("d", "g", "l1"))


@pytest.mark.parametrize("stream", [None, object()])
def test_streams_without_isatty_count_as_logs(stream):
    assert not _progress._is_terminal(stream)


def test_a_long_vanishing_bar_shows_in_a_log_and_a_download_shows_its_end(monkeypatch, capsys):
    monkeypatch.setattr(_progress, "LOG_INTERVAL_S", 0.0)  # every bar runs "long"
    _run(3, leave=False)
    assert "3/3" in capsys.readouterr().err
    monkeypatch.setattr(_progress, "LOG_INTERVAL_S", 3600.0)
    with progress_bar(total=10, desc="t10k.gz", leave=False, brief=False) as bar:  # as capsnet.data.download
        bar.update(10)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and "0/10" in lines[0] and "10/10" in lines[1]


def test_nested_bars_leave_no_control_sequences_in_a_log(monkeypatch, capsys):
    monkeypatch.setattr(_progress, "LOG_INTERVAL_S", 0.0)
    outer = progress_bar(range(2), desc="outer")
    for _ in outer:
        _run(2)  # a bar inside a bar: tqdm moves the cursor between them
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\r" not in err and err.isascii()
    assert any(line.startswith("outer") and "2/2" in line for line in err.splitlines())


def test_a_jupyter_kernel_counts_as_a_terminal(monkeypatch):
    monkeypatch.setitem(sys.modules, "ipykernel", object())
    assert _progress._is_terminal(io.StringIO())


def test_a_closed_stream_counts_as_a_log():
    stream = io.StringIO()
    stream.close()
    assert not _progress._is_terminal(stream)


def test_a_vanishing_bar_that_runs_past_the_delay_ends_its_log_on_its_last_state(monkeypatch, capsys):
    """A log got a brief bar's states at the interval but never its last: a 150 s evaluation's log ended at 80%,
    as if it had stopped there. One done within the delay still writes nothing."""
    import time

    monkeypatch.setattr(_progress, "LOG_INTERVAL_S", 0.2)
    bar = progress_bar(range(8), desc="eval", unit="batch", leave=False)
    for k in bar:
        if k < 5:
            time.sleep(0.1)  # past the delay; the last three steps come at once, within one interval
    bar.close()
    lines = capsys.readouterr().err.splitlines()
    assert lines and "8/8" in lines[-1], lines
    monkeypatch.setattr(_progress, "LOG_INTERVAL_S", 60.0)  # a stall of 0.2 s would have been past the delay
    _run(3, leave=False)  # done at once: nothing in the log
    assert capsys.readouterr().err == ""
