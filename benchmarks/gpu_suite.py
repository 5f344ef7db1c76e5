"""The helper of benchmarks/gpu_suite.sh: the environment record, the index of a results folder, the bundle.

    python benchmarks/gpu_suite.py environment --device cuda --out DIR/environment.json
    python benchmarks/gpu_suite.py report DIR        # DIR/README.md (the index) and DIR/summary.json
    python benchmarks/gpu_suite.py bundle DIR FILE   # DIR without its checkpoints, as FILE (.tar.gz)

The report reads only what the suite wrote (steps.tsv, commands.tsv, invocations.tsv, environment.json, the bench
JSON, the runs' config.json and metrics.jsonl, the experiments' results.md), so it runs after every step in a
fraction of a second and never imports torch. Training seconds come from each epoch's ``train_images_per_s``:
an epoch took (training examples) / (its images/s); the first epoch includes compiling, so "steady" is every
epoch at the median speed of the epochs after the first.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tarfile
from pathlib import Path
from typing import Any

__all__ = ["read_tsv", "final_record", "training_seconds", "mean_std", "run_row", "render_index", "write_report",
           "bundle"]

TRAIN_EXAMPLES = {"mnist": 60_000, "fashion-mnist": 60_000}  # full training splits, for the seconds of an epoch
TARGETS = {"fast": "<= 0.33% final test error after <= 20 s of training (H100)",
           "parity": "bf16 within 0.05 points of fp32, same seed",
           "paper": "<= 0.25% test error (Sabour et al. 2017, Table 1) within 10 minutes"}


# ------------------------------------------------------------------------------------------ reading


def read_tsv(path: Path) -> list[list[str]]:
    """The rows of a tab-separated file the suite appends to ([] when it does not exist yet)."""
    if not path.is_file():
        return []
    return [line.split("\t") for line in path.read_text().splitlines() if line.strip()]


def _records(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def final_record(run_dir: Path) -> dict[str, Any] | None:
    """The run's last evaluated epoch (its final test figures), or None when it has none yet."""
    evaluated = [r for r in _records(run_dir) if "test_error" in r]
    return evaluated[-1] if evaluated else None


def training_seconds(run_dir: Path) -> tuple[float | None, float | None]:
    """(all epochs, first one's compiling included; every epoch at the median speed of the later ones) in seconds;
    None where the run's training examples are unknown (a data set not in ``TRAIN_EXAMPLES``) or too few epochs."""
    records = _records(run_dir)
    config_path = run_dir / "config.json"
    if not records or not config_path.is_file():
        return None, None
    cfg = json.loads(config_path.read_text())["train_config"]
    full = TRAIN_EXAMPLES.get(cfg["dataset"])
    if full is None:
        return None, None
    n = (cfg["train_size"] or full) - cfg["val_size"]
    speeds = [r["train_images_per_s"] for r in records]
    total = sum(n / s for s in speeds)
    steady = len(speeds) * n / statistics.median(speeds[1:]) if len(speeds) > 1 else None
    return total, steady


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def run_row(run_dir: Path) -> dict[str, Any]:
    """One training run's final figures: test error (%), epochs, training seconds, the last epoch's images/s."""
    final = final_record(run_dir)
    total, steady = training_seconds(run_dir)
    row: dict[str, Any] = {"run": run_dir.name, "finished": final is not None}
    if final is not None:
        row |= {"test_error_pct": 100 * final["test_error"], "epochs": final["epoch"], "steps": final["step"],
                "train_s": total, "steady_train_s": steady, "images_per_s": final["train_images_per_s"]}
    return row


def _seed(run_dir: Path) -> int:
    return int(run_dir.name.rsplit("seed", 1)[1])


# ------------------------------------------------------------------------------------------ rendering


def _fmt(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def _runs_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| run | test error | epochs | training s (all epochs) | training s (steady) | last epoch images/s |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        if not r["finished"]:
            lines.append(f"| {r['run']} | not finished | | | | |")
            continue
        lines.append(f"| {r['run']} | {r['test_error_pct']:.2f}% | {r['epochs']} | {_fmt(r['train_s'])} "
                     f"| {_fmt(r['steady_train_s'])} | {r['images_per_s']:,.0f} |")
    done = [r for r in rows if r["finished"]]
    if len(done) > 1:
        err, err_sd = mean_std([r["test_error_pct"] for r in done])
        line = f"| mean ± std ({len(done)} runs) | {err:.2f}% ± {err_sd:.2f} | |"
        for key in ("train_s", "steady_train_s"):
            values = [r[key] for r in done if r[key] is not None]
            line += " {:.1f} ± {:.1f} |".format(*mean_std(values)) if len(values) == len(done) else " - |"
        lines.append(line + " |")
    return lines


def _bench_table(path: Path) -> list[str]:
    rows = [r for r in json.loads(path.read_text())["rows"] if r["impl"] == "capsnet"]
    steps = sorted({r.get("steps_per_timing", 1) for r in rows})  # rows before 2026-11-26: one step a timing
    lines = [f"`{json.loads(path.read_text())['command']}`", "",
             f"Steps per timing: {', '.join(map(str, steps))} (1: a step's latency; more: queued, throughput).", "",
             "| mode | batch | rounds | dtype | images/s, median (min-max) | peak MB | x baseline |",
             "| --- | ---: | ---: | --- | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['mode']} | {r['batch']} | {r['rounds']} | {r['dtype']} | {r['images_per_s']:,.0f} "
                     f"({r['images_per_s_min']:,.0f}-{r['images_per_s_max']:,.0f}) | {_fmt(r.get('peak_mem_mb'), '.0f')} "
                     f"| {_fmt(r.get('ratio'), '.2f')} |")
    return lines


def _step(stem: str) -> str:
    """The suite step whose log holds a family JSON's table: families/routing-family-bf16.json -> routing-family."""
    return stem.removesuffix("-bf16")


def _paper_numbers(experiment: str) -> str:
    try:
        from capsnet.experiments import PAPER  # imports torch: only when an experiment has results
    except ImportError:
        return ""
    found = [f"{model} {text}" for (name, model), text in PAPER.items() if name == experiment]
    return f"The paper: {'; '.join(found)}." if found else ""


def render_index(out: Path) -> tuple[str, dict[str, Any]]:
    """The index of a results folder (markdown) and its summary (JSON-ready): environment, steps, commands, results."""
    env = json.loads((out / "environment.json").read_text()) if (out / "environment.json").is_file() else {}
    steps: dict[str, list[str]] = {}
    for name, *rest in read_tsv(out / "steps.tsv"):
        steps[name] = rest  # the latest record of each step
    commands: dict[str, list[str]] = {}
    for name, command in read_tsv(out / "commands.tsv"):
        commands.setdefault(name, []).append(command)
    summary: dict[str, Any] = {"environment": env, "steps": {k: v[0] for k, v in steps.items()}}

    lines = ["# GPU suite results", "",
             "Made by `benchmarks/gpu_suite.sh` (issue 16); rewritten after every step. GPU minutes are the script's "
             "estimates, seconds are measured.", ""]
    if env:
        lines += [f"- commit {env.get('git_commit')}{' (with uncommitted changes)' if env.get('git_dirty') else ''}, "
                  f"torch {env.get('torch')}, Python {env.get('python')}",
                  f"- device {env.get('device')}: {env.get('device_name')}; CPU {env.get('cpu')}, "
                  f"{env.get('cpu_count')} cores", f"- environment recorded {env.get('date')}"]
    started = []
    for k, (when, cmd) in enumerate(read_tsv(out / "invocations.tsv"), 1):
        path = out / "environments" / f"{k}.json"
        own = json.loads(path.read_text()) if path.is_file() else {}
        started.append({"started": when, "command": cmd, "environment": own})
        ran = (f" (commit {own.get('git_commit')}{', with uncommitted changes' if own.get('git_dirty') else ''}, "
               f"torch {own.get('torch')}, device {own.get('device')}: {own.get('device_name')})") if own else ""
        lines.append(f"- started {when}: `{cmd}`{ran}")
    summary["invocations"] = started
    lines += ["", "## Steps", "", "| step | status | seconds | estimate, GPU min | note |", "| --- | --- | ---: | ---: | --- |"]
    lines += [f"| {name} | {status} | {seconds} | {estimate} | {note} |"
              for name, (status, seconds, estimate, note) in steps.items()]

    results: list[str] = []
    bench = sorted((out / "bench").glob("*.json"))
    if bench:
        results += ["### Speed (`capsnet bench`, capsnet's rows)", ""]
        for path in bench:
            results += [f"{path.stem}: [{path.name}](bench/{path.name})", ""] + _bench_table(path) + [""]
    variants = out / "speed" / "variants.json"
    if variants.is_file():
        results += ["### Speed leads (`benchmarks/speed_variants.py`, paired)", "",
                    "[variants.json](speed/variants.json), table in [logs/speed-variants.log](logs/speed-variants.log)",
                    ""]
    fast = sorted((out / "runs").glob("fast-seed*"), key=_seed)
    if fast:
        rows = [run_row(p) for p in fast]
        summary["fast_preset"] = rows
        results += ["### `capsnet train --preset fast`", "", f"Target: {TARGETS['fast']}.", ""] + _runs_table(rows) + [""]
    bf16, fp32 = out / "runs" / "fast-seed0", out / "runs" / "fast-fp32-seed0"
    if fp32.is_dir():
        a, b = final_record(bf16), final_record(fp32)
        results += ["### bf16 against fp32 (the preset, seed 0)", "", f"Target: {TARGETS['parity']}.", ""]
        if a and b:
            diff = 100 * (a["test_error"] - b["test_error"])
            summary["parity"] = {"bf16_error_pct": 100 * a["test_error"], "fp32_error_pct": 100 * b["test_error"],
                                 "difference_points": diff, "within_0.05": abs(diff) <= 0.05}
            results += [f"bf16 {100 * a['test_error']:.2f}%, fp32 {100 * b['test_error']:.2f}%: a difference of "
                        f"{diff:+.2f} points ({'within' if abs(diff) <= 0.05 else 'NOT within'} 0.05). One seed: "
                        f"seed-to-seed spread (above) is of the same order.", ""]
        else:
            results += ["not both finished", ""]
    paper = sorted((out / "runs").glob("paper-e*-seed*"), key=lambda p: (p.name.split("-seed")[0], _seed(p)))
    if paper:
        rows = [run_row(p) for p in paper]
        summary["paper_mnist"] = rows
        results += ["### The paper's MNIST figure (the preset's recipe, longer)", "", f"Target: {TARGETS['paper']}.",
                    ""] + _runs_table(rows) + [""]
    for experiment in ("multimnist", "affine", "less-data"):
        table = out / "experiments" / experiment / "results.md"
        if table.is_file():
            results += [f"### `capsnet experiment {experiment}`", "", table.read_text().strip(), "",
                        _paper_numbers(experiment), ""]
    families = sorted((out / "families").glob("*.json"))
    if families:
        results += ["### Other families", ""] + [f"- {p.stem}: [{p.name}](families/{p.name}), table in "
                                                 f"[logs/{_step(p.stem)}.log](logs/{_step(p.stem)}.log)"
                                                 for p in families] + [""]
    if results:
        lines += ["", "## Results", ""] + results
    lines += ["", "## Commands", "", "Run from the repository root with `PYTHONPATH=src` (this checkout's capsnet), in "
              "order; each step's output is in `logs/STEP.log`.", ""]
    for name, cmds in commands.items():
        lines += [f"{name}:", "", "```"] + cmds + ["```", ""]
    return "\n".join(lines).rstrip() + "\n", summary


def write_report(out: Path) -> Path:
    text, summary = render_index(out)
    (out / "README.md").write_text(text)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return out / "README.md"


def bundle(out: Path, target: Path) -> Path:
    """``out`` as a .tar.gz without its checkpoints (*.safetensors), for carrying the results off the machine."""
    with tarfile.open(target, "w:gz") as tar:
        for path in sorted(out.rglob("*")):
            if path.is_file() and path.suffix != ".safetensors" and path != target:
                tar.add(path, arcname=str(Path(out.name) / path.relative_to(out)))
    return target


def environment(device: str) -> dict[str, Any]:
    """``capsnet.bench.environment()`` with the device the suite runs on and its name."""
    import torch

    from capsnet.bench import environment as bench_environment

    env = bench_environment() | {"device": device}
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise SystemExit(f"--device {device}: this torch ({torch.__version__}) sees no CUDA device; run on a GPU "
                             f"machine or with --device cpu")
        env["device_name"] = torch.cuda.get_device_name(torch.device(device))
        env["cuda"] = torch.version.cuda
    else:
        env["device_name"] = env["cpu"]
    return env


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser("environment", help="write the environment record (JSON)")
    e.add_argument("--device", required=True)
    e.add_argument("--out", required=True, type=Path)
    r = sub.add_parser("report", help="write DIR/README.md and DIR/summary.json")
    r.add_argument("dir", type=Path)
    b = sub.add_parser("bundle", help="pack DIR, checkpoints left out, into a .tar.gz")
    b.add_argument("dir", type=Path)
    b.add_argument("target", type=Path)
    args = p.parse_args(argv)
    if args.command == "environment":
        env = environment(args.device)
        args.out.write_text(json.dumps(env, indent=1) + "\n")
        print(" ".join(f"{k}={v}" for k, v in env.items()))
    elif args.command == "report":
        print(f"wrote {write_report(args.dir)}")
    else:
        print(f"wrote {bundle(args.dir, args.target)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
