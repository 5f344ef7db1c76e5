"""benchmarks/gpu_suite.sh, the GPU programme of issue 16, and its helper benchmarks/gpu_suite.py.

The whole script runs end to end on the CPU at its --tiny sizes (slow: about two minutes here); the flags, a
failing step and the index are checked in seconds; the helper's arithmetic against values worked out by hand.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

from capsnet.checkpoint import load_checkpoint, save_checkpoint
from capsnet.train import TrainConfig, fit

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_suite.sh"
STEPS = ["env", "cuda-tests", "bench-eager", "bench-compiled", "speed-variants", "fast-preset", "bf16-parity", "paper-mnist",
         "multimnist", "affine", "less-data", "routing-family", "segmentation", "synthesis"]


def _helper():
    spec = importlib.util.spec_from_file_location("gpu_suite", ROOT / "benchmarks" / "gpu_suite.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


suite = _helper()


def run_suite(*args, timeout=900, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env={**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", **env})


def steps(out: Path) -> dict[str, str]:
    """Each step's latest status in steps.tsv."""
    return {name: status for name, status, *_ in suite.read_tsv(out / "steps.tsv")}


# ------------------------------------------------------------------------------------------ the flags


@pytest.mark.parametrize("args, fragment", [
    (["--frobnicate"], "unknown argument '--frobnicate'"),
    (["--device", "tpu"], "--device must be cpu, cuda or cuda:N, not 'tpu'"),
    (["--only", "env,warp-drive"], "--only: unknown step 'warp-drive'"),
    (["--out"], "--out needs a value"),
    (["--data-dir", "/nonexistent/data"], "--data-dir /nonexistent/data is not a folder"),
])
def test_bad_flags_give_the_usage_and_exit_2(tmp_path, args, fragment):
    r = run_suite(*args, "--out", tmp_path / "out") if args != ["--out"] else run_suite(*args)
    assert r.returncode == 2, r.stderr
    assert fragment in r.stderr and "usage: benchmarks/gpu_suite.sh" in r.stderr
    assert not (tmp_path / "out").exists()  # nothing written before the flags are checked


def test_help_lists_every_step():
    r = run_suite("--help")
    assert r.returncode == 0 and "usage: benchmarks/gpu_suite.sh" in r.stdout
    assert all(name in r.stdout for name in STEPS)


@pytest.mark.e2e
def test_only_runs_the_steps_named_and_skips_the_cuda_tests_on_a_cpu(tmp_path):
    out = tmp_path / "out"
    r = run_suite("--tiny", "--device", "cpu", "--out", out, "--only", "env, cuda-tests")
    assert r.returncode == 0, r.stdout + r.stderr
    assert steps(out) == {"env": "ok", "cuda-tests": "skipped"}
    assert "cuda-tests: skipped: the requires_cuda tests need a CUDA device" in r.stdout
    env = json.loads((out / "environment.json").read_text())
    assert env["device"] == "cpu" and env["torch"] == torch.__version__
    index = (out / "README.md").read_text()
    assert f"torch {torch.__version__}" in index and "device cpu" in index and "commit " in index
    assert "benchmarks/gpu_suite.py environment --device cpu" in index  # the command, as it ran
    r = run_suite("--tiny", "--device", "cpu", "--out", out, "--only", "env")  # a later sitting: done, not rerun
    assert r.returncode == 0 and "env: done in an earlier sitting" in r.stdout
    assert len(suite.read_tsv(out / "commands.tsv")) == 1
    # each sitting's own environment, though the env step ran only in the first (a later one, on another machine,
    # was indexed with none: a review, 2026-12-01)
    index = (out / "README.md").read_text()
    started = [line for line in index.splitlines() if line.startswith("- started ")]
    assert len(started) == 2 and all(f"torch {torch.__version__}, device cpu: " in line for line in started)
    summary = json.loads((out / "summary.json").read_text())
    assert [i["environment"]["device"] for i in summary["invocations"]] == ["cpu", "cpu"]
    assert summary["invocations"][1]["command"].endswith("--only env")


@pytest.mark.e2e
def test_a_sitting_without_the_env_step_still_records_its_environment(tmp_path):
    out = tmp_path / "out"
    r = run_suite("--tiny", "--device", "cpu", "--out", out, "--only", "cuda-tests")
    assert r.returncode == 0, r.stdout + r.stderr
    assert not (out / "environment.json").exists()
    own = json.loads((out / "environments" / "1.json").read_text())
    assert own["device"] == "cpu" and own["torch"] == torch.__version__
    assert f"--only cuda-tests` (commit {own['git_commit']}" in (out / "README.md").read_text()


@pytest.mark.e2e
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA, where --device cuda fails")
def test_a_failed_step_is_reported_the_rest_run_and_the_exit_is_1(tmp_path):
    out = tmp_path / "out"
    r = run_suite("--tiny", "--out", out, "--only", "env,bench-eager")  # --device cuda, the default
    assert r.returncode == 1
    assert steps(out) == {"env": "failed", "bench-eager": "failed"}  # the first failed, the second still ran
    assert "FAILED: env bench-eager" in r.stderr
    assert "sees no CUDA device" in (out / "logs" / "env.log").read_text()
    assert "| bench-eager | failed |" in (out / "README.md").read_text()


# ------------------------------------------------------------------------------------------ the whole programme


@pytest.mark.slow
def test_the_whole_suite_runs_tiny_on_the_cpu(tmp_path, data_root):
    out, bundle = tmp_path / "results", tmp_path / "results.tar.gz"
    # a paper-mnist run cut short in an earlier sitting: epoch 1 of its 2 checkpointed; the suite resumes it
    cut = out / "runs" / "paper-e2-seed0"
    from capsnet.models import CapsNetConfig

    fit(CapsNetConfig(conv1_channels=8, primary_types=2, decoder_hidden=(32, 64)),
        TrainConfig(dataset="mnist", epochs=1, batch_size=16, train_size=64, test_size=32, lr_schedule="linear",
                    warmup_steps=1), cut, device="cpu", data_root=data_root, progress=False)
    ckpt = load_checkpoint(cut, "last")
    save_checkpoint(cut / "last.safetensors", dataclasses.replace(ckpt, train_config={**ckpt.train_config,
                                                                                      "epochs": 2}))

    r = run_suite("--tiny", "--device", "cpu", "--out", out, "--data-dir", data_root, "--bundle", bundle)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert steps(out) == {name: "skipped" if name == "cuda-tests" else "ok" for name in STEPS}
    for f in ["README.md", "summary.json", "environment.json", "commands.tsv", "steps.tsv", "bench/eager.json",
              "bench/compiled.json", "bench/compiled-graphs.json", "speed/variants.json", "experiments/multimnist/results.md",
              "experiments/affine/results.md", "experiments/less-data/results.md", "families/routing-family.json", "families/segmentation.json",
              "families/synthesis.json"] + [f"logs/{name}.log" for name in STEPS if name != "cuda-tests"]:
        assert (out / f).is_file(), f
    for seed in (0, 1, 2):
        for run in (f"fast-seed{seed}", f"paper-e2-seed{seed}"):
            assert (out / "runs" / run / "last.safetensors").is_file(), run
    # the preset's runs carry its recipe, shrunk by the typed flags
    cfg = json.loads((out / "runs" / "fast-seed1" / "config.json").read_text())["train_config"]
    assert (cfg["lr_schedule"], cfg["amp"], cfg["lr"], cfg["seed"]) == ("linear", "bf16", 4e-3, 1)
    fp32 = json.loads((out / "runs" / "fast-fp32-seed0" / "config.json").read_text())["train_config"]
    assert fp32 == {**json.loads((out / "runs" / "fast-seed0" / "config.json").read_text())["train_config"],
                    "amp": "none"}
    # the cut-short run resumed with its own settings to its 2 epochs
    resumed = [c for step, c in suite.read_tsv(out / "commands.tsv") if "paper-e2-seed0" in c]
    assert len(resumed) == 1 and "--resume" in resumed[0] and "--preset" not in resumed[0]
    assert load_checkpoint(cut, "last").state["epoch"] == 2
    # the index: environment, every step with its commands, the results
    summary = json.loads((out / "summary.json").read_text())
    assert [r["run"] for r in summary["fast_preset"]] == ["fast-seed0", "fast-seed1", "fast-seed2"]
    assert all(r["finished"] and 0 <= r["test_error_pct"] <= 100 for r in summary["fast_preset"])
    assert "difference_points" in summary["parity"]
    index = (out / "README.md").read_text()
    assert f"torch {torch.__version__}" in index and "device cpu" in index
    assert all(f"\n{name}:\n" in index for name in STEPS if name != "cuda-tests")  # each step's commands
    assert "The paper: capsnet 5.2% error; baseline 8.1% error." in index
    assert "[variants.json](speed/variants.json)" in index
    # the bundle holds everything but the checkpoints
    with tarfile.open(bundle) as tar:
        names = tar.getnames()
    assert "results/README.md" in names and "results/runs/fast-seed0/metrics.jsonl" in names
    assert not any(n.endswith(".safetensors") for n in names)


# ------------------------------------------------------------------------------------------ the helper


def _run_dir(path: Path, *, train_size: int, val_size: int, speeds: list[float], errors: list[float | None]) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model": "capsnet", "train_config": TrainConfig(
        train_size=train_size, val_size=val_size).to_dict()}))
    records = [{"epoch": k + 1, "step": 10 * (k + 1), "train_images_per_s": s} | ({} if e is None else {"test_error": e})
               for k, (s, e) in enumerate(zip(speeds, errors))]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_training_seconds_and_final_figures_by_hand(tmp_path):
    run = _run_dir(tmp_path / "fast-seed0", train_size=0, val_size=0, speeds=[1000.0, 3000.0, 2000.0],
                   errors=[None, 0.004, 0.003])
    total, steady = suite.training_seconds(run)
    assert total == pytest.approx(60 + 20 + 30)  # 60,000 digits at 1,000, 3,000 and 2,000 images/s
    assert steady == pytest.approx(3 * 60_000 / 2500)  # every epoch at the median of the later ones
    assert suite.final_record(run)["epoch"] == 3
    row = suite.run_row(run)
    assert row["test_error_pct"] == pytest.approx(0.3) and row["epochs"] == 3 and row["images_per_s"] == 2000.0
    small = _run_dir(tmp_path / "small", train_size=1000, val_size=200, speeds=[400.0], errors=[0.5])
    assert suite.training_seconds(small) == (pytest.approx(2.0), None)  # 800 examples; one epoch: no steady figure
    assert suite.run_row(_run_dir(tmp_path / "cut", train_size=0, val_size=0, speeds=[1.0], errors=[None])) == \
        {"run": "cut", "finished": False}


def test_mean_and_spread():
    assert suite.mean_std([0.3, 0.5]) == (pytest.approx(0.4), pytest.approx(2 ** 0.5 * 0.1))
    assert suite.mean_std([0.3]) == (0.3, 0.0)


def test_the_index_of_a_partial_folder(tmp_path):
    out = tmp_path / "out"
    for seed, err in ((0, 0.0031), (1, 0.0035)):
        _run_dir(out / "runs" / f"fast-seed{seed}", train_size=0, val_size=0, speeds=[3000.0, 60000.0], errors=[None, err])
    _run_dir(out / "runs" / "fast-fp32-seed0", train_size=0, val_size=0, speeds=[2000.0, 30000.0], errors=[None, 0.0030])
    (out / "steps.tsv").write_text("fast-preset\tfailed\t40\t5\texit status 1\nfast-preset\tok\t35\t5\t\n")
    (out / "commands.tsv").write_text("fast-preset\tpython3 -m capsnet train --preset fast --seed 0\n")
    text, summary = suite.render_index(out)
    assert "| fast-preset | ok | 35 | 5 |  |" in text and "| fast-preset | failed" not in text  # the latest record
    assert "| mean ± std (2 runs) | 0.33% ± 0.03 |" in text
    assert summary["parity"]["difference_points"] == pytest.approx(0.01) and summary["parity"]["within_0.05"]
    assert "python3 -m capsnet train --preset fast --seed 0" in text


def test_a_bf16_family_table_links_its_steps_log(tmp_path):
    out = tmp_path / "out"
    (out / "families").mkdir(parents=True)
    for name in ("segmentation.json", "segmentation-bf16.json"):
        (out / "families" / name).write_text("{}")
    text, _ = suite.render_index(out)
    assert ("- segmentation-bf16: [segmentation-bf16.json](families/segmentation-bf16.json), table in "
            "[logs/segmentation.log](logs/segmentation.log)") in text
