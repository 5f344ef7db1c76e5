#!/usr/bin/env bash
# The next GPU sitting's first command (about 6.5 minutes), prepared 2026-11-26 after
# benchmarks/results/gpu-h200-2026-11-26; then, in a second command, benchmarks/gpu_families.sh OUT DATA SECONDS with
# what is left of the session (it wants at least 5 minutes to mean anything).
#   0. `capsnet train --preset fast --seed 0`, now that compile_model keeps the full batches on their static graph
#      (the preset's epochs ran at 65,500 images/s against the bench's 74,000; target: 25 epochs in <= 20 s);
#   1. benchmarks/speed_variants.py, bf16, CUDA graphs, paired against the shipped model: both convolutions, or the
#      primary capsules' alone, as matrix products over unfolded windows (gemm-convs, gemm-primary: new), and the
#      whole step in one CUDA graph (its agreement with eager training, miscounted last time); batch 128, then 512.
# usage: benchmarks/gpu_sitting4.sh OUT DATA_DIR
set -uo pipefail
OUT=${1:?usage: gpu_sitting4.sh OUT DATA_DIR}
DATA=${2:?usage: gpu_sitting4.sh OUT DATA_DIR}
REPO=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$REPO/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
mkdir -p "$OUT/logs" "$OUT/preset-seed0"
# commit, torch, the device and its name (the suite's record), then the driver
"$PY" "$REPO/benchmarks/gpu_suite.py" environment --device cuda --out "$OUT/environment.json" \
    > "$OUT/logs/env.log" 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> "$OUT/logs/env.log" 2>&1
RUN=$(mktemp -d)/preset-seed0  # the checkpoint off OUT (it would not come back); a new run every time
timeout 120 "$PY" -m capsnet train --out "$RUN" --preset fast --seed 0 --data-dir "$DATA" --device cuda \
    --no-progress > "$OUT/logs/preset-seed0.log" 2>&1
echo "preset exit $? at ${SECONDS} s" >> "$OUT/logs/preset-seed0.log"
cp "$RUN"/config.json "$RUN"/metrics.jsonl "$OUT/preset-seed0/" 2>/dev/null
rm -rf "$(dirname "$RUN")"  # its checkpoints: the records are in OUT
SV=(--device cuda --compile reduce-overhead --dtype bf16 --repeats 20 --steps-per-timing 10)
timeout 170 "$PY" "$REPO/benchmarks/speed_variants.py" "${SV[@]}" --batch-size 128 \
    --variants base gemm-primary gemm-convs whole-step-graph --json "$OUT/speed_variants-128.json" \
    > "$OUT/logs/speed_variants-128.log" 2>&1
echo "exit $? at ${SECONDS} s" >> "$OUT/logs/speed_variants-128.log"
timeout 130 "$PY" "$REPO/benchmarks/speed_variants.py" "${SV[@]}" --batch-size 512 \
    --variants base gemm-convs whole-step-graph --json "$OUT/speed_variants-512.json" \
    > "$OUT/logs/speed_variants-512.log" 2>&1
echo "exit $? at ${SECONDS} s" >> "$OUT/logs/speed_variants-512.log"
