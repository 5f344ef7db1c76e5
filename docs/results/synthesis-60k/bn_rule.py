"""pix2pix scored under the paper's test-time batch norm beside capsnet's.

Isola et al. 2017, section 3.3: "we apply batch normalization using the statistics of the test batch, rather than
aggregated statistics of the training batch ... when the batch size is set to 1, [this] has been termed instance
normalization". capsnet's pix2pix generates with its batch norm's running statistics (an image independent of the
rest of its batch; the runs train at batch 16). This scores each run's last weights both ways on the first
--test-size test pairs, noise (dropout) seed 0 and the run's judge as `capsnet eval` uses them: "running" is
`capsnet eval`'s figure; "test batch of 1" runs every batch norm of the generator on the image's own statistics
(batch size 1, so each image alone; the running statistics are left as they are). Only the seed-0 L1, SSIM and
judge accuracy are reported (the 8-draw scores are skipped, to save time). Usage:

    python bn_rule.py RUN_DIR [RUN_DIR ...] [--test-size 1000] [--which last] [--data-dir DIR] [--json OUT]
"""
import argparse
import contextlib
import json

from torch import nn

import capsnet.synthesis
from capsnet.synthesis import evaluate_synthesis_checkpoint

capsnet.synthesis.SPREAD_SIZE = 2  # the noise-seed draws are not reported here: the seed-0 scores alone, quickly

p = argparse.ArgumentParser()
p.add_argument("runs", nargs="+")
p.add_argument("--test-size", type=int, default=1000)
p.add_argument("--which", default="last")
p.add_argument("--data-dir")
p.add_argument("--json")
args = p.parse_args()


@contextlib.contextmanager
def test_batch_statistics():
    """Every BatchNorm2d normalises by its input's own statistics and leaves its running ones alone."""
    original = nn.BatchNorm2d.forward

    def forward(self, x):
        return nn.functional.batch_norm(x, None, None, self.weight, self.bias, True, 0.0, self.eps)

    nn.BatchNorm2d.forward = forward
    try:
        yield
    finally:
        nn.BatchNorm2d.forward = original


rows = []
for run in args.runs:
    for rule, batch, ctx in (("running", 64, contextlib.nullcontext), ("test batch of 1", 1, test_batch_statistics)):
        with ctx():
            ev = evaluate_synthesis_checkpoint(run, which=args.which, test_size=args.test_size, root=args.data_dir,
                                               batch_size=batch)
        r = ev.results[""].as_dict()
        row = {"run": run, "rule": rule, **{k: r[k] for k in ("l1", "ssim", "judge_accuracy") if k in r}}
        rows.append(row)
        print(f"{run:40s} {rule:16s} L1 {row['l1']:.4f}  SSIM {row['ssim']:.4f}  judge "
              f"{row.get('judge_accuracy', float('nan')):.4f}", flush=True)
if args.json:
    with open(args.json, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
