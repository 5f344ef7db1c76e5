"""Training steps of registered models with the C library's allocator as it comes and as ``capsnet train`` tunes it
(``capsnet.memory.keep_freed_memory()``, ``--allocator keep``): what a Python caller of ``capsnet.train.fit`` gains by
calling it first.

The setting is the process's, so each measurement is a fresh process: for each model, ``--rounds`` pairs of
processes, one of each allocator, taking turns to go first. A process builds the model at its registered sizes
(seeded), runs one untimed step and ``--steps`` timed ones (forward, the model's loss, backward, Adam) on one seeded
batch, and reports the median step's wall and thread CPU time. The ratio is default / keep per round: above 1,
keeping freed memory is faster. Run it with ``OMP_NUM_THREADS=1`` for steadier numbers.

    OMP_NUM_THREADS=1 python benchmarks/allocator_steps.py [--models em-capsnet-small capsnet] [--batch-size 16]
                                                            [--steps 4] [--rounds 2] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

from capsnet.bench import markdown_table, publish, show_spread, spread
from capsnet.models import MODELS

CHILD = r"""
import json, statistics, sys, time
import torch
if sys.argv[2] == "keep":
    from capsnet.memory import keep_freed_memory
    assert keep_freed_memory(), "this C library is not glibc: nothing to compare"
from capsnet.models import create_model, model_spec
name, batch, steps = sys.argv[1], int(sys.argv[3]), int(sys.argv[4])
torch.manual_seed(0)
spec, model = model_spec(name), create_model(name)
c = model.config
g = torch.Generator().manual_seed(1)
x = torch.rand(batch, c.in_channels, c.input_height, c.input_width, generator=g)
y = torch.randint(0, c.num_classes, (batch,), generator=g)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
walls, threads = [], []
for step in range(steps + 1):
    wall, thread = time.perf_counter(), time.thread_time()
    loss, _ = spec.loss(model, x, y, None, recon_weight=0.0005, progress=0.5)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if step:  # the first step allocates for the first time under either setting
        walls.append(time.perf_counter() - wall)
        threads.append(time.thread_time() - thread)
print(json.dumps({"wall_s": statistics.median(walls), "thread_s": statistics.median(threads)}))
"""


def measure(name: str, allocator: str, batch: int, steps: int) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", CHILD, name, allocator, str(batch), str(steps)], capture_output=True,
                          text=True)
    if done.returncode:
        raise SystemExit(f"{name} under --allocator {allocator} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["em-capsnet-small", "capsnet"],
                   choices=[n for n, s in MODELS.items() if s.kind == "classification"])
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json", default=None, help="write the table and its context here")
    args = p.parse_args()
    rows = []
    for name in args.models:
        got: dict[str, list[dict[str, float]]] = {"default": [], "keep": []}
        for r in range(args.rounds):
            for allocator in ("default", "keep") if r % 2 == 0 else ("keep", "default"):
                got[allocator].append(measure(name, allocator, args.batch_size, args.steps))
        row = {"model": name, "batch": args.batch_size, "steps": args.steps, "rounds": args.rounds}
        for clock in ("wall", "thread"):
            for allocator, runs in got.items():
                row[f"{allocator}_{clock}_s"] = statistics.median(m[f"{clock}_s"] for m in runs)
            row.update(spread([d[f"{clock}_s"] / k[f"{clock}_s"] for d, k in zip(got["default"], got["keep"])],
                              f"{clock}_ratio"))
        rows.append(row)
        print(f"{name}: default / keep {row['wall_ratio']:.2f} (wall), {row['thread_ratio']:.2f} (thread)",
              file=sys.stderr, flush=True)
    publish("benchmarks/allocator_steps.py", rows, markdown_table(
        ["model", "batch", "step, default allocator (wall / thread CPU)", "step, kept memory (wall / thread CPU)",
         "default / keep, wall: median (min-max)", "default / keep, thread CPU"],
        ([r["model"], r["batch"], f"{r['default_wall_s']:.3f} / {r['default_thread_s']:.3f} s",
          f"{r['keep_wall_s']:.3f} / {r['keep_thread_s']:.3f} s", show_spread(r, "wall_ratio"),
          show_spread(r, "thread_ratio")] for r in rows)), args.json)


if __name__ == "__main__":
    main()
