#!/usr/bin/env bash
# One GPU sitting of 10 minutes for issue 16 (2026-11-26), after the H200 follow-up of 2026-11-25
# (benchmarks/results/gpu-h200-2026-11-25), every step time-limited so the results always come back:
#   1. the speed table's headline rows again, now as throughput (10 steps a timing: every earlier GPU figure timed one
#      step, host sync included): `capsnet bench`, the paper's CapsNet, 3 rounds, bf16, CUDA graphs, batch 128 and 512;
#   2. benchmarks/speed_variants.py at batch 128: cuDNN's algorithm search, and the whole training step (forward, loss,
#      backward, capturable fused Adam) in one CUDA graph, paired against the shipped model (never run on a GPU);
#   3. the paper's MNIST figure (<= 0.25%, Sabour et al. 2017, Table 1): one seed of `--preset fast` for as many epochs
#      as the rest of the 10 minutes holds (about 0.95 s an epoch on an H200), evaluated 10 times.
# usage: benchmarks/gpu_sitting3.sh OUT DATA_DIR [SECONDS]   (SECONDS: the sitting's end, default 560 from the start)
set -uo pipefail
OUT=${1:?usage: gpu_sitting3.sh OUT DATA_DIR [SECONDS]}
DATA=${2:?usage: gpu_sitting3.sh OUT DATA_DIR [SECONDS]}
END=${3:-560}
REPO=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$REPO/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
mkdir -p "$OUT/logs"
stamp() { echo "$1: $(date -u +"%F %T UTC") (${SECONDS} s)" >> "$OUT/logs/steps.log"; }
{
    echo "commit $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    "$PY" -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
} > "$OUT/logs/env.log" 2>&1

stamp bench
timeout 150 "$PY" -m capsnet bench --device cuda --batch-size 128 512 --routing-iterations 3 --dtype bf16 --repeats 5 \
    --compile reduce-overhead --baseline '' --json "$OUT/bench-graphs.json" > "$OUT/logs/bench.log" 2>&1
echo "exit $?" >> "$OUT/logs/bench.log"

stamp speed-variants
timeout 170 "$PY" benchmarks/speed_variants.py --device cuda --batch-size 128 \
    --variants base cudnn-benchmark whole-step-graph --compile reduce-overhead --dtype bf16 --repeats 20 \
    --steps-per-timing 10 --json "$OUT/speed_variants.json" > "$OUT/logs/speed_variants.log" 2>&1
echo "exit $?" >> "$OUT/logs/speed_variants.log"

stamp paper-mnist
left=$((END - SECONDS))
epochs=$(((left - 55) * 100 / 100))  # ~0.95 s an epoch plus ~45 s of start, compiling and the 10 evaluations
((epochs > 300)) && epochs=300
if ((epochs >= 30)); then
    echo "epochs $epochs ($left s left)" >> "$OUT/logs/steps.log"
    timeout $((left - 5)) "$PY" -m capsnet train --out "$OUT/runs/paper-e$epochs-seed0" --preset fast --epochs "$epochs" \
        --eval-every $(((epochs + 9) / 10)) --seed 0 --data-dir "$DATA" --device cuda --no-progress \
        > "$OUT/logs/paper-mnist.log" 2>&1
    echo "exit $?" >> "$OUT/logs/paper-mnist.log"
fi
stamp done
find "$OUT" -name '*.safetensors' -delete
