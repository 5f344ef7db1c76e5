"""capsnet where the process's environment is unusual: no stderr, no home folder, no C++ compiler, too little memory,
no shared memory for worker processes (found by a review of hostile environments, 2026-11-30; each failed before
its fix)."""
from __future__ import annotations

import errno
import importlib
import sys
from pathlib import Path

import pytest
import torch

from capsnet import cli


def test_a_bar_with_no_stderr_at_all_is_no_bar(monkeypatch):
    """A launcher that closes fd 2 (sys.stderr None): the first line a bar wrote raised AttributeError, and training
    died with exit status 1 and no word, its traceback having nowhere to go."""
    from capsnet._progress import progress_bar

    monkeypatch.setattr(sys, "stderr", None)
    assert list(progress_bar(range(5), desc="train")) == [0, 1, 2, 3, 4]
    bar = progress_bar(total=3, desc="eval", leave=False)
    bar.update(3)
    bar.close()


def test_no_home_folder_is_a_clear_error_and_a_relative_xdg_cache_is_ignored(monkeypatch, tmp_path):
    """An arbitrary-uid container (HOME unset, no password entry): Path.home()'s RuntimeError was a traceback even
    with --data-dir given (the "not found" message named the cache). A relative XDG_CACHE_HOME made folders in the
    working folder; the XDG spec has it ignored."""
    from capsnet.data import DataError
    from capsnet.data.sets import cache_root, download_hint

    def nowhere():
        raise RuntimeError("Could not determine home directory.")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr(Path, "home", staticmethod(nowhere))
    with pytest.raises(DataError, match="there is no home folder to keep data sets in .*set CAPSNET_DATA or "
                                        "--data-dir"):
        cache_root()
    assert "download them into ~/.cache/capsnet" in download_hint("argument", tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")
    with pytest.raises(DataError):  # ignored: the home folder decides, and there is none here
        cache_root()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "capsnet"


def test_compiling_for_the_cpu_without_a_cpp_compiler_is_said_before_any_work(tmp_path, capsys):
    """A slim container image: TorchInductor's InvalidCxxCompiler came at the first training step, 154 lines of
    traceback, after the data was loaded and config.json written."""
    import torch._inductor.config as inductor

    from capsnet.runtime import require_compiler

    # torch's own patch, undone by torch: monkeypatch's undo deleted the entry (its setattr found no attribute of
    # that name to restore), and every later reader in the process (require_compiler) met "cpp.cxx does not exist"
    with inductor.patch({"cpp.cxx": (None, str(tmp_path / "no-such-g++"))}):  # Inductor's search list
        assert cli.main(["train", "--dataset", "mnist-sample", "--compile", "default", "--epochs", "1",
                         "--out", str(tmp_path / "run"), "--device", "cpu", "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--compile default (TorchInductor) on the CPU needs a C++ compiler" in err
        assert "use --compile aot_eager" in err and not (tmp_path / "run").exists()
        for command in (["experiment", "routing", "--models", "capsnet", "--datasets", "mnist-sample", "--out",
                         str(tmp_path / "x")], ["bench", "--batch-size", "2"]):  # the other commands that compile
            assert cli.main([*command, "--compile", "default", "--device", "cpu"]) == 2
            assert "needs a C++ compiler" in capsys.readouterr().err and not (tmp_path / "x").exists()
        # the library's training calls too (they met Inductor's error at the first step), before the run's folder
        from capsnet.gan import fit_gan
        from capsnet.models import CapsNetConfig, CapsPix2pixConfig
        from capsnet.train import TrainConfig, fit

        for train, config, dataset in ((fit, CapsNetConfig(), "mnist-sample"),
                                       (fit_gan, CapsPix2pixConfig(), "mnist-sample-skeleton")):
            for compile in (True, "default", "max-autotune"):
                with pytest.raises(ValueError, match="needs a C\\+\\+ compiler"):
                    train(config, TrainConfig(dataset=dataset, epochs=1), tmp_path / "lib",
                          device=torch.device("cpu"), compile=compile, progress=False)
                assert not (tmp_path / "lib").exists()
        require_compiler("aot_eager", "cpu")  # no C++: no compiler needed
        require_compiler(False, "cpu")
        with pytest.raises(ValueError, match="max-autotune"):
            require_compiler("max-autotune", "cpu")
    # the way to a compiler as the platform has it (it said "apt install g++" on Windows and macOS too; a review of
    # portability, 2026-12-02)
    from capsnet.runtime import compiler_hint

    assert "Developer Command Prompt, where cl is on PATH" in compiler_hint("win32")
    assert compiler_hint("darwin") == "xcode-select --install" and compiler_hint("linux") == "e.g. apt install g++"
    assert "(e.g. apt install g++)" in err


def test_an_unusable_inductor_cache_folder_is_named_by_its_variable(monkeypatch, tmp_path, capsys):
    """TORCHINDUCTOR_CACHE_DIR under a file: the error ended "check the paths given", of a path no flag gave."""
    # Inductor's config made its cache folder when first imported: imported under the bad variable, it failed half
    # way and torch could not import it again in this process (every later compiling test of the worker failed), so
    # it is imported here first, and the folder is made when the model compiles
    importlib.import_module("torch._inductor.config")

    (tmp_path / "file").write_text("")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "file" / "cache"))
    assert cli.main(["train", "--dataset", "mnist-sample", "--epochs", "1", "--batch-size", "8", "--train-size", "16",
                     "--conv1-channels", "8", "--primary-types", "2", "--compile", "default", "--device", "cpu",
                     "--out", str(tmp_path / "run"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err == (f"capsnet train: error: TorchInductor's cache folder {tmp_path / 'file' / 'cache'} "
                   f"(TORCHINDUCTOR_CACHE_DIR) cannot be used: Not a directory: {tmp_path / 'file' / 'cache'}; set "
                   f"TORCHINDUCTOR_CACHE_DIR to a folder you can write to, or train uncompiled (--compile none)\n")
    # a cache folder that holds the run too ($HOME): the run's own paths, a full disk and a command that does not
    # compile are not blamed on the cache (a review of the change)
    import argparse
    import errno

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    run = argparse.Namespace(compile="default", out=str(tmp_path / "run"), data_dir=None)
    denied = OSError(errno.EACCES, "Permission denied", str(tmp_path / "run" / "last.safetensors"))
    assert cli._path_error(denied, run).endswith("; check the paths given")
    assert "TorchInductor" in cli._path_error(OSError(errno.EACCES, "Permission denied", str(tmp_path / "c")), run)
    assert "check the paths" in cli._path_error(OSError(errno.EACCES, "Permission denied", str(tmp_path / "c")),
                                                argparse.Namespace(command="eval"))
    full = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "c"))
    assert cli._path_error(full, run).startswith(f"cannot write {tmp_path / 'c'}: No space left on device; free")


def _with_handler(monkeypatch, command, handler):
    arguments, _, help_, description = cli._COMMANDS[command]
    monkeypatch.setitem(cli._COMMANDS, command, (arguments, handler, help_, description))


def test_running_out_of_memory_is_one_line_that_names_the_batch_size(monkeypatch, capsys):
    """train and eval under a memory limit ended in the allocator's traceback (predict already said it in a line)."""
    def oom(args):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] data. DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 6400000000 bytes. Error code 12 (Cannot allocate memory)")
    _with_handler(monkeypatch, "eval", oom)
    assert cli.main(["eval", "--checkpoint", "pretrained:capsnet-mnist-small"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("capsnet eval: error: out of memory (") and "lower --batch-size" in err
    assert err.count("\n") == 1

    _with_handler(monkeypatch, "figures", oom)  # a command without --batch-size is not told to lower it
    assert cli.main(["figures", "--checkpoint", "pretrained:capsnet-mnist-small"]) == 2
    err = capsys.readouterr().err
    assert "--batch-size" not in err and "give fewer or smaller inputs" in err

    def other(args):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")
    _with_handler(monkeypatch, "routings", other)
    with pytest.raises(RuntimeError, match="mat1"):  # a bug stays a traceback
        cli.main(["routings"])


def test_worker_processes_that_cannot_start_say_so_and_what_to_do(monkeypatch):
    """experiment --jobs 2 where /dev/shm is read-only: "Read-only file system; check the paths given", naming no
    path (every path given was fine)."""
    import concurrent.futures
    import multiprocessing

    from capsnet.experiments import _FreshProcesses

    def no_shm(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")
    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", no_shm)
    with pytest.raises(ValueError, match=r"cannot start worker processes for --jobs \(Read-only file system: "
                                         r"Python's multiprocessing needs a writable /dev/shm here\); run with "
                                         r"--jobs 1"):
        _FreshProcesses(multiprocessing.get_context("spawn")).submit(print, "x")
