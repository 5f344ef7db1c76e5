"""Training throughput in one process and in two torchrun processes (DDP over gloo), on real MNIST.

Each setting is a real `capsnet train` run in its own processes: plain (no
process group), or `torchrun --standalone --nproc_per_node N -m capsnet
train` (DistributedDataParallel, gloo on the CPU). The same global batch,
seed and data in every setting, so every run trains the same steps; images/s
is the last epoch's `train_images_per_s` from metrics.jsonl (rank 0's clock,
every rank's images; the first epoch pays for warming up), the median of
--repeats runs with min and max. The weights column is how far each
setting's final weights are from the first setting's (max |difference|): the
correctness check that goes with the speed.

On a machine with fewer cores than processes x threads this measures
correctness and the cost of the communication, not a speed-up.

    python benchmarks/distributed.py --data-dir DIR [--train-size 1024] [--epochs 2] [--repeats 3] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from capsnet.bench import environment, write_record
from capsnet.checkpoint import load_checkpoint

# (label, processes (0: plain `capsnet train`, no torchrun), threads per process)
SETTINGS = [("one process, 2 threads", 0, 2), ("one process, 1 thread", 0, 1),
            ("torchrun, 1 process, 2 threads", 1, 2), ("torchrun, 2 processes, 1 thread each", 2, 1)]


def command(processes: int, args: list[str]) -> list[str]:
    if not processes:
        return [sys.executable, "-m", "capsnet", "train", *args]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
            "-m", "capsnet", "train", *args]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", default=os.environ.get("CAPSNET_DATA"), help="folder holding mnist/")
    p.add_argument("--train-size", type=int, default=1024)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64, help="the global batch")
    p.add_argument("--model-flags", default="--conv1-channels 64 --primary-types 8",
                   help="capsnet train flags of the model (default: a narrower CapsNet than the paper's)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default=None, help="also write the environment and every row here")
    a = p.parse_args()
    train = ["--dataset", "mnist", "--train-size", str(a.train_size), "--test-size", "256", "--epochs",
             str(a.epochs), "--batch-size", str(a.batch_size), "--seed", "0", "--no-progress",
             *shlex.split(a.model_flags)] + (["--data-dir", a.data_dir] if a.data_dir else [])
    rows, reference = [], None
    with tempfile.TemporaryDirectory() as tmp:
        for label, processes, threads in SETTINGS:
            speeds, losses, gaps = [], [], []
            for k in range(a.repeats):
                out = Path(tmp) / f"{processes}-{threads}-{k}"
                env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
                r = subprocess.run(command(processes, [*train, "--out", str(out)]), env=env, capture_output=True,
                                   text=True)
                if r.returncode:
                    sys.exit(f"{label} failed:\n{r.stderr[-3000:]}")
                last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
                speeds.append(last["train_images_per_s"])
                losses.append(last["train_loss"])
                weights = load_checkpoint(out, "last").model_state
                reference = reference or weights
                gaps.append(max((weights[n] - reference[n]).abs().max().item() for n in weights))
                print(f"{label}, run {k + 1}: {speeds[-1]:.1f} images/s", file=sys.stderr, flush=True)
            rows.append({"setting": label, "processes": max(processes, 1), "threads_per_process": threads,
                         "torchrun": bool(processes), "images_per_s": speeds, "train_loss": losses,
                         "max_weight_difference": max(gaps)})
    print("| setting | images/s, median (min-max) | last epoch's train loss | weights vs the first row, max abs |")
    print("| --- | ---: | ---: | ---: |")
    for r in rows:
        s = r["images_per_s"]
        print(f"| {r['setting']} | {statistics.median(s):.1f} ({min(s):.1f}-{max(s):.1f}) | "
              f"{statistics.median(r['train_loss']):.6f} | {r['max_weight_difference']:.1e} |")
    if a.json:
        write_record(a.json, shlex.join(["python", "benchmarks/distributed.py", *sys.argv[1:]]), environment(), rows)
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
