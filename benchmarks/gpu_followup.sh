#!/usr/bin/env bash
# A short GPU sitting (about 7 minutes) after benchmarks/gpu_suite.sh's first full run (issue 16): what that run left
# open, every step time-limited so the results always come back.
#   1. the CNN baseline's MultiMNIST (10 epochs) and affine (5 epochs) rows again, now that it trains with its
#      200-step warm-up (the H100 run's baseline sat at chance: docs/results.md, "The CNN baseline on larger inputs");
#      eager bf16 batch 128 as in the suite; both experiments at once (accuracy only, nothing timed);
#   2. the requires_cuda tests (one, CUDA graphs in training, never run on a GPU before);
#   3. benchmarks/speed_variants.py: channels-last and the votes as a fused reduction, paired against the shipped
#      model, compiled with CUDA graphs, bf16, batch 128 and 512 (the variants pinned since the script gained more;
#      its "peak MB" column was then a replay's peak of the whole device, since replaced by each variant's own).
# usage: benchmarks/gpu_followup.sh OUT DATA_DIR   (then OUT holds logs/, experiments/, speed_variants.json)
set -uo pipefail
OUT=${1:?usage: gpu_followup.sh OUT DATA_DIR}
DATA=${2:?usage: gpu_followup.sh OUT DATA_DIR}
REPO=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$REPO/src${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
mkdir -p "$OUT/logs"
stamp() { date -u +"%F %T UTC"; }
{
    echo "commit $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown), started $(stamp)"
    "$PY" -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
} > "$OUT/logs/env.log" 2>&1

echo "experiments: $(stamp)" >> "$OUT/logs/steps.log"
for exp in multimnist affine; do
    epochs=10; [[ $exp == affine ]] && epochs=5
    timeout 200 "$PY" -m capsnet experiment "$exp" --models baseline --out "$OUT/experiments/$exp" --epochs "$epochs" \
        --amp bf16 --batch-size 128 --device cuda --no-progress --data-dir "$DATA" > "$OUT/logs/$exp.log" 2>&1 &
done
wait
echo "cuda-tests: $(stamp)" >> "$OUT/logs/steps.log"
CAPSNET_TEST_DATA="$DATA" timeout 90 "$PY" -m pytest -m requires_cuda -p no:cacheprovider -q -rs tests \
    > "$OUT/logs/cuda-tests.log" 2>&1
echo "speed-variants: $(stamp)" >> "$OUT/logs/steps.log"
timeout "${SPEED_LIMIT:-230}" "$PY" benchmarks/speed_variants.py --device cuda --batch-size 128 512 \
    --variants base channels-last mulsum channels-last+mulsum \
    --compile reduce-overhead --dtype bf16 --repeats 30 --json "$OUT/speed_variants.json" \
    > "$OUT/logs/speed_variants.log" 2>&1
echo "done: $(stamp)" >> "$OUT/logs/steps.log"
find "$OUT" -name '*.safetensors' -delete
