#!/usr/bin/env bash
# Issue 16's preset with the weights' moving average: a second command for the next GPU sitting (about 4 minutes),
# after benchmarks/gpu_families.sh (segmentation and synthesis). Prepared 2026-11-26 after
# benchmarks/results/gpu-h100-2026-11-26, where the preset's epochs 2-25 took 20.0 s on an H100 (71,900
# images/s) and ended at 0.36% for seed 0 (0.33 / 0.37 / 0.33% for seeds 0-2 on 2026-11-25): the speed is
# about there, the error is not (target: <= 0.33% in <= 20 s). The preset's last steps run at a learning rate near 0
# on one batch at a time; an exponential moving average of the weights (--ema-decay, what is scored and saved;
# training unchanged) is the usual cheap gain of a short schedule's final figure. Seeds 0-2, each with and without
# it, one run at a time (their times are the target's), alternating so the two kinds see the same card.
# usage: benchmarks/gpu_sitting5.sh OUT DATA_DIR   (DEVICE=cpu SMOKE=1: 1 epoch of 1,024 digits a run, a test)
set -uo pipefail
OUT=${1:?usage: gpu_sitting5.sh OUT DATA_DIR}
DATA=${2:?usage: gpu_sitting5.sh OUT DATA_DIR}
REPO=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$REPO/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
SIZE=()
[ "${SMOKE:-0}" = 1 ] && SIZE=(--epochs 1 --train-size 1024 --test-size 256 --warmup-steps 1 --compile aot_eager --amp none)
mkdir -p "$OUT/logs"
"$PY" "$REPO/benchmarks/gpu_suite.py" environment --device "$DEVICE" --out "$OUT/environment.json" \
    > "$OUT/logs/env.log" 2>&1
RUNS=$(mktemp -d)  # checkpoints off OUT (they would not come back)
for seed in 0 1 2; do
    for ema in 0 0.999; do
        name=preset-ema$ema-seed$seed
        echo "$name: capsnet train --preset fast --ema-decay $ema --seed $seed ${SIZE[*]}" >> "$OUT/logs/commands.log"
        timeout 150 "$PY" -m capsnet train --out "$RUNS/$name" --preset fast --ema-decay $ema --seed $seed \
            --data-dir "$DATA" --device "$DEVICE" --no-progress "${SIZE[@]}" > "$OUT/logs/$name.log" 2>&1
        echo "exit $? at ${SECONDS} s" >> "$OUT/logs/$name.log"
        mkdir -p "$OUT/$name"
        cp "$RUNS/$name"/config.json "$RUNS/$name"/metrics.jsonl "$OUT/$name/" 2>/dev/null
        rm -rf "${RUNS:?}/$name"  # its checkpoints: the records are in OUT
    done
done
rmdir "$RUNS" 2>/dev/null || true
