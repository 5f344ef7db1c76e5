#!/bin/bash
# CapsNet with each routing (docs/results/routing-family.md, "CapsNet with each routing"), from the repository root.
# Run on 2026-11-29 at commit 0df44cc, one thread each, one after the other (another training ran on the other core).
set -e
export OMP_NUM_THREADS=1
small="--conv1-channels 32 --primary-types 8 --data-dir ../shared/data --seed 0 --no-progress"
# the start: EM in CapsNet from CapsNet's start for it (ROUTING_STARTS) and from EMRouting's own defaults
capsnet train --routing em $small --train-size 2000 --test-size 500 --epochs 2 --out runs/capsnet-routings/probe-em-start
capsnet train --routing em $small --train-size 2000 --test-size 500 --epochs 2 \
    --model-option 'routing_options={"beta_a_init": 0}' --model-option digit_init_std=0.01 \
    --out runs/capsnet-routings/probe-em-defaults
# the same network under each routing: 3 epochs of all 60,000 digits, scored on all 10,000 test digits
for r in dynamic self-attention em; do
  capsnet train --routing $r $small --epochs 3 --out runs/capsnet-routings/$r
done
