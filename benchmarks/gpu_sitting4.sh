#!/usr/bin/env bash
# The next GPU sitting (10 minutes), prepared 2026-11-26 after benchmarks/results/gpu-h200-2026-11-26:
#   0. `capsnet train --preset fast --seed 0`, now that compile_model keeps the full batches on their static graph
#      (the preset's epochs ran at 65,500 images/s against the bench's 74,000; target: 25 epochs in <= 20 s);
#   1. benchmarks/speed_variants.py, batch 128 and 512, bf16, CUDA graphs: the primary capsules' convolution as one
#      matrix product (gemm-primary, new) and the whole step in one CUDA graph (its agreement with eager training,
#      miscounted last time, and its batch-512 speed), paired against the shipped model; cut at 200 s;
#   2. benchmarks/gpu_families.sh for the rest: the family's accuracy runs side by side until the sitting's end.
# usage: benchmarks/gpu_sitting4.sh OUT DATA_DIR [SECONDS]   (SECONDS: the sitting's end, default 560 from the start)
set -uo pipefail
OUT=${1:?usage: gpu_sitting4.sh OUT DATA_DIR [SECONDS]}
DATA=${2:?usage: gpu_sitting4.sh OUT DATA_DIR [SECONDS]}
END=${3:-560}
REPO=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$REPO/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
mkdir -p "$OUT/logs" "$OUT/preset-seed0"
timeout 120 "$PY" -m capsnet train --out /tmp/preset-seed0 --preset fast --seed 0 --data-dir "$DATA" --device cuda \
    --no-progress > "$OUT/logs/preset-seed0.log" 2>&1
echo "preset exit $? at ${SECONDS} s" >> "$OUT/logs/preset-seed0.log"
cp /tmp/preset-seed0/config.json /tmp/preset-seed0/metrics.jsonl "$OUT/preset-seed0/" 2>/dev/null
timeout 200 "$PY" "$REPO/benchmarks/speed_variants.py" --device cuda --batch-size 128 512 \
    --variants base gemm-primary whole-step-graph --compile reduce-overhead --dtype bf16 --repeats 20 \
    --steps-per-timing 10 --json "$OUT/speed_variants.json" > "$OUT/logs/speed_variants.log" 2>&1
echo "speed_variants exit $? at ${SECONDS} s" >> "$OUT/logs/speed_variants.log"
bash "$REPO/benchmarks/gpu_families.sh" "$OUT/families" "$DATA" $((END - SECONDS - 20))
