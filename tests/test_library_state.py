"""capsnet inside someone else's long-lived program (a notebook, a sweep, a service): what a call leaves behind.

Found by a review of leftover state (2026-11-30); each case failed before its fix.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import warnings

import pytest
import torch

from capsnet import cli


def _draws_after(call) -> torch.Tensor:
    torch.manual_seed(1234)
    call()
    return torch.rand(4)


def test_loading_a_checkpoint_leaves_the_callers_random_stream_as_it_was():
    """load_model built the network with fresh random weights (then replaced by the checkpoint's): every eval,
    predict, generate, export, figures and viewer call moved the caller's torch stream."""
    from capsnet.evaluate import load_model

    torch.manual_seed(1234)
    expected = torch.rand(4)
    assert torch.equal(_draws_after(lambda: load_model("pretrained:capsnet-mnist-small")), expected)


def test_a_benchmark_leaves_the_callers_random_stream_as_it_was():
    """run_benchmark seeded torch for its models and left the caller's stream reseeded (measure_training kept it)."""
    from capsnet.bench import run_benchmark
    from capsnet.models import CapsNetConfig

    small = CapsNetConfig(conv1_channels=8, primary_types=2, decoder_hidden=(16, 32))
    torch.manual_seed(1234)
    expected = torch.rand(4)
    got = _draws_after(lambda: run_benchmark(devices=["cpu"], batch_size=4, repeats=1, baseline_path="",
                                             config=small, memory=False, floor=False, modes=("train",)))
    assert torch.equal(got, expected)


def test_a_server_in_a_thread_frees_its_port_when_shut_down():
    """server.shutdown() (as serve_in_thread's docstring says) left the socket listening: connections were accepted
    and never answered, and a second server on the port (a notebook cell run again) failed "Address in use"."""
    from capsnet.viz import load_viewer, serve_in_thread

    viewer = load_viewer(progress=False)
    server, _ = serve_in_thread(viewer)
    port = server.server_address[1]
    server.shutdown()
    assert server.socket.fileno() == -1  # closed when shutdown returns, not by the serving thread a moment after
    with pytest.raises(ConnectionRefusedError):  # (56 of 200 rebinds at once failed "Address in use")
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    server, _ = serve_in_thread(viewer, port=port)  # the same port again, at once, no join
    server.shutdown()


def _with_handler(monkeypatch, command: str, handler) -> None:
    arguments, _, help_, description = cli._COMMANDS[command]
    monkeypatch.setitem(cli._COMMANDS, command, (arguments, handler, help_, description))


def test_a_call_logs_for_its_own_length_and_leaves_the_programs_loggers_alone(monkeypatch, capsys):
    """cli.main called logging.basicConfig: a root handler for the whole process, so a later call's -v did nothing
    and an earlier -v left every library of the program logging at INFO."""
    root, ours = logging.getLogger(), logging.getLogger("capsnet")
    monkeypatch.setattr(root, "handlers", [])  # a program that set no logging up (pytest's handlers aside)
    before = (list(root.handlers), root.level, list(ours.handlers), ours.level)

    def logs(args):
        logging.getLogger("capsnet.train").info("an epoch's line")
        logging.getLogger("capsnet.train").warning("a warning")
        return 0
    _with_handler(monkeypatch, "routings", logs)
    assert cli.main(["routings"]) == 0
    err = capsys.readouterr().err
    assert "capsnet.train: a warning" in err and "an epoch's line" not in err
    assert cli.main(["-v", "routings"]) == 0  # -v on a second call
    assert "capsnet.train: an epoch's line" in capsys.readouterr().err
    assert (list(root.handlers), root.level, list(ours.handlers), ours.level) == before
    # a program that set logging up shows the records through its own handler, once (a second handler of capsnet's
    # printed each twice)
    seen = []

    class Program(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())
    monkeypatch.setattr(root, "handlers", [Program()])
    assert cli.main(["-v", "routings"]) == 0
    assert seen == ["an epoch's line", "a warning"] and "a warning" not in capsys.readouterr().err


def test_a_call_from_a_program_leaves_its_warnings_and_stdout_as_they_were(monkeypatch, capsys):
    """Two cli.main calls in two threads set warnings.showwarning and restored it out of order: a command's prefix
    stayed on every later warning of the program. Each thread's command now prefixes its own warnings alone; a
    BrokenPipeError pointed the program's own stdout at /dev/null."""

    here = str(cli.__file__)  # a warning "from capsnet" is one its files raise

    def warn(text):
        warnings.warn_explicit(text, UserWarning, here, 1)
    barrier = threading.Barrier(2, timeout=30)

    def each(args):
        barrier.wait()  # both commands running at once
        warn(f"from {args.command}")
        barrier.wait()
        return 0
    _with_handler(monkeypatch, "routings", each)
    _with_handler(monkeypatch, "models", each)
    programs = []  # the program's own hook

    def mine(message, *rest, **kw):
        programs.append(str(message))
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = mine
        threads = [threading.Thread(target=cli.main, args=([c],)) for c in ("routings", "models")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert warnings.showwarning is mine
        warn("from the program")
    err = capsys.readouterr().err
    assert "capsnet routings: warning: from routings" in err and "capsnet models: warning: from models" in err
    assert programs == ["from the program"] and "from the program" not in err

    def broken(args):
        raise BrokenPipeError(32, "Broken pipe")
    _with_handler(monkeypatch, "routings", broken)
    fd_before = os.fstat(1)
    opened = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
    assert cli.main(["routings"]) == 141
    after = os.fstat(1)
    assert (after.st_dev, after.st_ino) == (fd_before.st_dev, fd_before.st_ino)
    if opened is not None:
        assert len(os.listdir("/proc/self/fd")) == opened


def test_allocator_default_after_keep_in_one_process_is_said_and_recorded_as_keep(monkeypatch):
    """glibc's tuning lasts for the process: a bench with --allocator default after a training run in the same
    program recorded "default" while the allocator was still tuned."""
    from capsnet import memory

    monkeypatch.setattr(memory, "_KEPT", False)
    assert cli._keep_memory("default") == "default"
    monkeypatch.setattr(memory, "_KEPT", True)
    with pytest.warns(UserWarning, match="an earlier command in this process kept freed memory"):
        assert cli._keep_memory("default") == "keep"


def test_the_umask_is_read_without_changing_it_where_the_system_says_it():
    """_umask set the process umask to 0o022 and back to read it: another thread's file made in between got 0o022's
    permissions (a process at 0o077 wrote a world-readable file)."""
    from capsnet import checkpoint

    if not os.path.exists("/proc/self/status"):
        pytest.skip("no /proc/self/status here")
    old = os.umask(0o077)
    try:
        changes = []
        real = os.umask
        os.umask = lambda mask: changes.append(mask) or real(mask)
        try:
            assert checkpoint._umask() == 0o077
        finally:
            os.umask = real
        assert changes == []
    finally:
        os.umask(old)


def test_a_callback_that_stops_the_run_keeps_the_epoch_it_was_shown(tmp_path):
    """on_epoch ran before the epoch's saves: a sweep's pruning (raising in the callback) lost that epoch, and a
    one-epoch run left a folder with config.json alone."""
    import json

    from capsnet.checkpoint import load_checkpoint
    from capsnet.models import CapsNetConfig
    from capsnet.train import TrainConfig, fit

    class Pruned(Exception):
        pass

    def prune(record):
        raise Pruned(record["epoch"])
    cfg = TrainConfig(dataset="mnist-sample", epochs=3, batch_size=32, train_size=64, test_size=32, seed=0)
    with pytest.raises(Pruned):
        fit(CapsNetConfig(conv1_channels=8, primary_types=2, decoder_hidden=(16, 32)), cfg, tmp_path / "run",
            device="cpu", progress=False, on_epoch=prune)
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == [1]
    assert load_checkpoint(tmp_path / "run", which="last").state["epoch"] == 1
    assert (tmp_path / "run" / "best.safetensors").exists()


def test_fit_gan_keeps_the_epoch_a_stopping_callback_was_shown(tmp_path, data_root):
    from capsnet.gan import fit_gan
    from capsnet.models import Pix2pixConfig
    from capsnet.train import TrainConfig

    class Pruned(Exception):
        pass

    def prune(record):
        raise Pruned(record["epoch"])
    cfg = TrainConfig(dataset="mnist-skeleton", epochs=2, batch_size=8, train_size=16, test_size=4, lr=2e-4)
    with pytest.raises(Pruned):
        fit_gan(Pix2pixConfig(base_channels=4, disc_channels=4), cfg, tmp_path / "gan", device="cpu",
                data_root=data_root, progress=False, on_epoch=prune)
    assert (tmp_path / "gan" / "metrics.jsonl").read_text().count("\n") == 1
    assert (tmp_path / "gan" / "last.safetensors").exists()

