#!/usr/bin/env bash
# The next GPU sitting (10 minutes), prepared 2026-11-26 after benchmarks/results/gpu-h200-2026-11-26:
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
mkdir -p "$OUT/logs"
timeout 200 "$PY" "$REPO/benchmarks/speed_variants.py" --device cuda --batch-size 128 512 \
    --variants base gemm-primary whole-step-graph --compile reduce-overhead --dtype bf16 --repeats 20 \
    --steps-per-timing 10 --json "$OUT/speed_variants.json" > "$OUT/logs/speed_variants.log" 2>&1
echo "speed_variants exit $? at ${SECONDS} s" >> "$OUT/logs/speed_variants.log"
bash "$REPO/benchmarks/gpu_families.sh" "$OUT/families" "$DATA" $((END - SECONDS - 20))
