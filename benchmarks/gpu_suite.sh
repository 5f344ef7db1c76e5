#!/usr/bin/env bash
# The GPU programme of issue 16 in one script: the speed table, the 20-second MNIST preset over 3 seeds, bf16 against
# fp32, the paper's MNIST figure, the paper's other experiments at the budget that fits, the other families' rows and
# the CUDA tests. Every result goes under one folder (--out), indexed in OUT/README.md with each command, the commit,
# the torch version and the device (rewritten after every step by benchmarks/gpu_suite.py report).
#
# A failed step is recorded and reported and the next one runs; the script exits 1 at the end if any step failed
# (2 for bad flags). A step that succeeded is not rerun when the script is started again with the same --out: a later
# sitting continues with the rest, and the training runs of a step that was cut short resume from their own last
# checkpoint (`capsnet train --resume`; the experiments resume their runs themselves) where it is still on disk.
#
# GPU time: each step's figure below is what it took on one H100 on 2026-11-25 (benchmarks/results/gpu-h100-2026-11-25,
# torch 2.11; 16.8 minutes in all), rounded up, except where a step has grown since: bench-eager and bench-compiled
# (10 steps a timing since 2026-11-26, and the CUDA-graph rows), speed-variants (new), fast-preset (now batch 512
# with CUDA graphs: faster) and paper-mnist (now 100 epochs: a projection from the preset's 64,000 images/s). In all
# about 26 minutes. One command may run for 10 minutes at most, and a session has been lent 15 to 30 minutes of
# device time, starts included; a new session's machine has none of the last one's files, so plan by --only:
#   A. --only env,cuda-tests,bench-compiled,speed-variants     (about 8 min: the speed targets)
#      --only fast-preset,bf16-parity                          (about 3.5 min, the same --out)
#   B. --only paper-mnist,multimnist                           (about 7.5 min)
#   C. --only bench-eager,affine,less-data,routing-family,segmentation,synthesis   (about 7 min)
# On one machine, the same --out skips what an earlier sitting finished and resumes a training run cut short.
# After the second H200 sitting (2026-11-26, benchmarks/results/gpu-h200-2026-11-26) two shorter scripts come first:
#   benchmarks/gpu_sitting4.sh OUT DATA          (about 6.5 min: the preset with static-shape compiling, speed variants)
#   benchmarks/gpu_families.sh OUT DATA SECONDS  (the rest: the family's accuracy runs and the 0.25% probes side by
#                                                 side; ONLY=paper,segmentation,... picks groups, default
#                                                 segmentation,synthesis since the third sitting, on an H100)
# Both ran in the third sitting; the next is benchmarks/README.md's "The next sitting, prepared".
set -euo pipefail

usage() {
    cat <<'EOF'
usage: benchmarks/gpu_suite.sh [--device DEVICE] [--out DIR] [--data-dir DIR] [--tiny] [--only STEP,...]
                               [--bundle FILE.tar.gz]

The GPU programme of issue 16: speed table, `capsnet train --preset fast` over 3 seeds, bf16 vs fp32, the paper's
MNIST figure and other experiments, the other families' benchmark rows, the requires_cuda tests.

  --device DEVICE   cuda (default), cuda:N or cpu
  --out DIR         folder for every result (default: benchmarks/gpu-results/<UTC date>); started again with the same
                    folder, the steps that succeeded are skipped and cut-short training runs resume
  --data-dir DIR    data root holding mnist/ (default: capsnet's: $CAPSNET_DATA, else its cache)
  --tiny            sizes that run on a CPU in a few minutes: a test of the script, not a measurement (on a
                    GPU, a smoke test of every step before the real sizes)
  --only STEPS      comma-separated steps to run (default: all), from:
                    env cuda-tests bench-eager bench-compiled speed-variants fast-preset bf16-parity paper-mnist
                    multimnist affine less-data routing-family segmentation synthesis
  --bundle FILE     at the end, also pack the results (all but the checkpoints) into FILE (.tar.gz)
  -h, --help        this help

Environment: PYTHON (default python3) runs capsnet from this checkout's src/; PAPER_EPOCHS, MULTI_EPOCHS,
AFFINE_EPOCHS, LESS_STEPS override those budgets (see the script). Exit status: 0 when every step ran or was skipped,
1 when a step failed (the others still ran), 2 for bad flags.
EOF
}

STEPS=(env cuda-tests bench-eager bench-compiled speed-variants fast-preset bf16-parity paper-mnist multimnist affine
       less-data routing-family segmentation synthesis)

abspath() { case $1 in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$PWD/$1" ;; esac; }
die_usage() { echo "gpu_suite.sh: error: $1" >&2; usage >&2; exit 2; }

ARGS=("$@")
DEVICE=cuda OUT="" DATA_DIR="" TINY=0 ONLY="" BUNDLE=""
while (($#)); do
    case $1 in
        --device|--out|--data-dir|--only|--bundle)
            (($# >= 2)) || die_usage "$1 needs a value"
            case $1 in
                --device) DEVICE=$2 ;; --out) OUT=$(abspath "$2") ;; --data-dir) DATA_DIR=$(abspath "$2") ;;
                --only) ONLY=$2 ;; --bundle) BUNDLE=$(abspath "$2") ;;
            esac
            shift 2 ;;
        --tiny) TINY=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) die_usage "unknown argument '$1'" ;;
    esac
done
[[ $DEVICE =~ ^(cpu|cuda(:[0-9]+)?)$ ]] || die_usage "--device must be cpu, cuda or cuda:N, not '$DEVICE'"
ONLY=${ONLY// /}
for s in ${ONLY//,/ }; do
    [[ " ${STEPS[*]} " == *" $s "* ]] || die_usage "--only: unknown step '$s'; steps are: ${STEPS[*]}"
done
if [[ -n $DATA_DIR ]]; then
    [[ -d $DATA_DIR ]] || die_usage "--data-dir $DATA_DIR is not a folder"
    DATA_DIR=$(cd "$DATA_DIR" && pwd)
fi

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
OUT=${OUT:-$REPO/benchmarks/gpu-results/$(date -u +%Y-%m-%d)}
PY=${PYTHON:-python3}
export PYTHONPATH="$REPO/src${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's capsnet, installed or not
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/logs" "$OUT/bench" "$OUT/speed" "$OUT/runs" "$OUT/experiments" "$OUT/families"

# ------------------------------------------------------------------------------------------ sizes
# Full sizes (the programme) and tiny ones (CPU, a test of the script). The budgets can be raised once the speed
# table is known: a run longer than one 10-minute sitting resumes from its checkpoint in the next on the same disk.
COMMON=(--device "$DEVICE" --no-progress)
if [[ -n $DATA_DIR ]]; then COMMON+=(--data-dir "$DATA_DIR"); fi
if ((TINY)); then
    # on a GPU, --tiny is a smoke test of the whole programme, Inductor included (~3 min); on a CPU, AOTAutograd
    # without Inductor's C++ compiling, which takes minutes there
    if [[ $DEVICE == cpu ]]; then COMPILE=aot_eager; else COMPILE=reduce-overhead; fi
    BENCH_EAGER=(--batch-size 2 --routing-iterations 1 --dtype fp32 bf16 --repeats 1)
    BENCH_COMPILED=(--batch-size 2 --routing-iterations 1 --dtype fp32 --repeats 1 --compile "$COMPILE")
    BENCH_COMPILED_FP32=()
    BENCH_COMPILED_GRAPHS=(--batch-size 2 --routing-iterations 1 --dtype fp32 --repeats 1 --compile "$COMPILE")
    SPEED_VARIANTS=(--batch-size 2 --compile none --dtype fp32 --repeats 1 --steps-per-timing 2)
    PROFILE_BY_OP=(--batch-size 2 --dtype fp32)
    SEEDS="0 1 2"
    PAPER_EPOCHS=${PAPER_EPOCHS:-2}
    MULTI_EPOCHS=${MULTI_EPOCHS:-1} AFFINE_EPOCHS=${AFFINE_EPOCHS:-1} LESS_STEPS=${LESS_STEPS:-2}
    # a narrow CapsNet (and CNN baseline), few examples, a warm-up shorter than the few steps
    SMALL=(--test-size 32 --batch-size 16 --conv1-channels 8 --primary-types 2)
    TRAIN_SMALL=(--train-size 64 "${SMALL[@]}" --warmup-steps 1 --model-option 'decoder_hidden=[32,64]')
    FAST_EPOCHS=(--epochs 1)
    LESS_SMALL=("${SMALL[@]}" --cnn-channels 8 8 8 --cnn-hidden 16 16 --sizes 32 64)
    EXPERIMENT_SMALL=(--train-size 64 "${SMALL[@]}" --cnn-channels 8 8 8 --cnn-hidden 16 16)
    ROUTING_FAMILY=(--batch-size 2 --repeats 1 --models capsnet capsnet:em em-capsnet-small efficient-capsnet
                    inverted-capsnet)
    SEGMENTATION=(--size 32 --batch-size 2 --repeats 1 --big 0)  # the U-Net's batch norm needs 2 at its 2x2 bottom
    SYNTHESIS=(--size 32 --batch-size 2 --repeats 1)  # the PatchGAN needs sides of at least 24
else
    BENCH_EAGER=(--batch-size 32 128 512 --routing-iterations 1 3 5 --dtype fp32 bf16 --repeats 5)
    BENCH_COMPILED=(--batch-size 128 512 --routing-iterations 3 --dtype bf16 --repeats 5 --compile default)
    BENCH_COMPILED_FP32=(--batch-size 128 --routing-iterations 3 --dtype fp32 --repeats 5 --compile default)
    # CUDA graphs: at batch 128 the "default" compiled step waits on kernel launches (H100, 2026-11-25: 21,000 vs
    # 31,000 images/s); the preset's mode, so its runs and their resumes use it too
    BENCH_COMPILED_GRAPHS=(--batch-size 128 256 512 --routing-iterations 3 --dtype bf16 --repeats 5
                           --compile reduce-overhead)
    COMPILE=reduce-overhead
    SPEED_VARIANTS=(--batch-size 128 512 --compile reduce-overhead --dtype bf16 --repeats 20 --steps-per-timing 10)
    PROFILE_BY_OP=(--batch-size 512 --dtype bf16)
    SEEDS="0 1 2"
    PAPER_EPOCHS=${PAPER_EPOCHS:-100}  # ~95 s of training a seed at 64,000 images/s; 10 minutes is ~600 epochs
    MULTI_EPOCHS=${MULTI_EPOCHS:-10} AFFINE_EPOCHS=${AFFINE_EPOCHS:-5} LESS_STEPS=${LESS_STEPS:-1000}
    TRAIN_SMALL=()
    FAST_EPOCHS=()  # the preset's 25
    EXPERIMENT_SMALL=(--batch-size 128)
    LESS_SMALL=(--batch-size 128)
    # the registered family, and the paper's CapsNet with its digit capsules routed by EM and self-attention
    ROUTING_FAMILY=(--batch-size 64 --repeats 5 --models capsnet capsnet:em capsnet:self-attention em-capsnet-small
                    em-capsnet efficient-capsnet inverted-capsnet)
    SEGMENTATION=(--size 64 --batch-size 8 --repeats 5 --big 512)
    SYNTHESIS=(--size 32 --batch-size 16 --repeats 5)
fi

# ------------------------------------------------------------------------------------------ bookkeeping
FAILED=()
STEP="" EST="" LOG="" STEP_START=0 STEP_RC=0

quote() { local q; printf -v q '%q ' "$@"; printf '%s' "${q% }"; }

step() {  # step NAME EST_MIN: whether NAME runs now (not left out by --only, not done in an earlier sitting)
    STEP=$1 EST=$2 LOG=$OUT/logs/$1.log STEP_RC=0 STEP_START=$SECONDS
    [[ -z $ONLY || ",$ONLY," == *",$STEP,"* ]] || return 1
    if grep -q "^$STEP"$'\t'"ok"$'\t' "$OUT/steps.tsv" 2>/dev/null; then
        echo "== $STEP: done in an earlier sitting (see $OUT/steps.tsv); skipped"
        return 1
    fi
    echo "== $STEP (estimate: $EST GPU min; log: $LOG)"
}

run() {  # run CMD...: echo, record and run one command of the step, its output to the terminal and the step's log
    local rc=0
    echo "+ $(quote "$@")" | tee -a "$LOG"
    printf '%s\t%s\n' "$STEP" "$(quote "$@")" >>"$OUT/commands.tsv"
    if "$@" 2>&1 | tee -a "$LOG"; then rc=0; else rc=$?; fi
    if ((rc)); then
        echo "!! $STEP: exit status $rc from: $(quote "$@")" | tee -a "$LOG"
        STEP_RC=$rc
    fi
}

finish() {  # record the step's status, rewrite the index
    local status=ok note=""
    if ((STEP_RC)); then status="failed" note="exit status $STEP_RC (see logs/$STEP.log)"; FAILED+=("$STEP"); fi
    printf '%s\t%s\t%s\t%s\t%s\n' "$STEP" "$status" "$((SECONDS - STEP_START))" "$EST" "$note" >>"$OUT/steps.tsv"
    echo "== $STEP: $status in $((SECONDS - STEP_START)) s"
    report
}

skip() {  # skip REASON: record the step as skipped (it runs again next time)
    printf '%s\t%s\t%s\t%s\t%s\n' "$STEP" "skipped" 0 "$EST" "$1" >>"$OUT/steps.tsv"
    echo "== $STEP: skipped: $1"
    report
}

report() {
    "$PY" benchmarks/gpu_suite.py report "$OUT" >/dev/null || { echo "!! the report of $OUT failed"; FAILED+=("report"); }
}

train() {  # train RUN_DIR ARGS...: a new `capsnet train` run with ARGS, or the resume of RUN_DIR's own if it has one
    local dir=$1; shift
    if [[ -f $dir/last.safetensors ]]; then  # cut short in an earlier sitting: its own settings, not ARGS
        run "$PY" -m capsnet train --out "$dir" --resume --compile "$COMPILE" "${COMMON[@]}"
    else
        run "$PY" -m capsnet train --out "$dir" "$@" "${COMMON[@]}"
    fi
}

has_device_flag() { "$PY" "$1" --help 2>/dev/null | grep -q -- '--device'; }

printf '%s\t%s\n' "$(date -u '+%Y-%m-%d %H:%M:%S UTC')" "$(quote benchmarks/gpu_suite.sh "${ARGS[@]}")" \
    >>"$OUT/invocations.tsv"
# every invocation's own environment (commit, torch, device), whatever --only runs: a later sitting, on another
# machine, skips the env step, and the index listed only the first sitting's
mkdir -p "$OUT/environments"
"$PY" benchmarks/gpu_suite.py environment --device "$DEVICE" \
    --out "$OUT/environments/$(wc -l <"$OUT/invocations.tsv" | tr -d ' ').json" >/dev/null \
    || echo "!! the environment of this invocation was not recorded (see the message above)"
if ((TINY)); then
    echo "gpu_suite: device $DEVICE, results in $OUT (tiny sizes: a test of the script, not a measurement)"
else
    echo "gpu_suite: device $DEVICE, results in $OUT"
fi

# ------------------------------------------------------------------------------------------ steps

# What the results depend on: commit, torch, CUDA devices (capsnet.bench.environment). ~0.2 min.
if step env 0.2; then
    run "$PY" benchmarks/gpu_suite.py environment --device "$DEVICE" --out "$OUT/environment.json"
    if command -v nvidia-smi >/dev/null; then run nvidia-smi; fi
    finish
fi

# The CUDA checks (tests marked requires_cuda; CI leaves them out). ~0.5 min.
if step cuda-tests 0.5; then
    if [[ $DEVICE == cpu ]]; then
        skip "the requires_cuda tests need a CUDA device (--device cpu)"
    else
        # the tests that read real data find it in --data-dir (else beside the checkout, ../shared/data)
        test_env=()
        if [[ -n $DATA_DIR ]]; then test_env=(CAPSNET_TEST_DATA="$DATA_DIR"); fi
        run env "${test_env[@]}" "$PY" -m pytest -m requires_cuda -p no:cacheprovider -q -rs \
            --junitxml "$OUT/cuda-tests.xml" tests
        finish
    fi
fi

# The speed table, eager: batch 32/128/512 x routing rounds 1/3/5 x fp32/bf16 (18 row sets: capsnet, the tutorial
# baseline and the conv floor, training and inference), 5 timings of 10 steps each. ~2.5 min (0.7 at 1 step a timing).
if step bench-eager 2.5; then
    run "$PY" -m capsnet bench --device "$DEVICE" "${BENCH_EAGER[@]}" --json "$OUT/bench/eager.json"
    finish
fi

# The speed table, compiled (one torch.compile per row set and mode, about a minute each, hence fewer rows): the
# paper's 3 rounds, bf16 at batch 128 and 512, fp32 at 128; the baseline, eager, is in bench-eager; then
# the preset's CUDA graphs (reduce-overhead) at batch 128/256/512. ~3.5 min.
if step bench-compiled 3.5; then
    run "$PY" -m capsnet bench --device "$DEVICE" "${BENCH_COMPILED[@]}" --baseline '' \
        --json "$OUT/bench/compiled.json"
    if ((${#BENCH_COMPILED_FP32[@]})); then
        run "$PY" -m capsnet bench --device "$DEVICE" "${BENCH_COMPILED_FP32[@]}" --baseline '' \
            --json "$OUT/bench/compiled-fp32.json"
    fi
    if ((${#BENCH_COMPILED_GRAPHS[@]})); then
        run "$PY" -m capsnet bench --device "$DEVICE" "${BENCH_COMPILED_GRAPHS[@]}" --baseline '' \
            --json "$OUT/bench/compiled-graphs.json"
    fi
    finish
fi

# Speed leads, paired against the shipped model in one process (benchmarks/speed_variants.py), bf16, batch 128 and 512,
# 10 steps a timing, the model compiled with the preset's mode: cuDNN's algorithm search
# (torch.backends.cudnn.benchmark) for the two 9x9 convolutions, and the whole training step (forward, loss, backward,
# Adam) in one CUDA graph. (Channels-last and the votes as a fused reduction changed nothing on an H200, 2026-11-25.)
# Six compiles of ~35 s; cut at 5 minutes (rows are written after each batch size). ~3.5 min.
if step speed-variants 3.5; then
    run timeout 300 "$PY" benchmarks/speed_variants.py --device "$DEVICE" "${SPEED_VARIANTS[@]}" \
        --variants base cudnn-benchmark whole-step-graph \
        --json "$OUT/speed/variants.json"
    # where an eager step's GPU time goes, by operation and input shape (which part of the model each is)
    run "$PY" benchmarks/profile_step.py --device "$DEVICE" "${PROFILE_BY_OP[@]}" --compile none --by-op --rows 30
    finish
fi

# The 20-second preset, 3 seeds (target: <= 0.33% final test error after <= 20 s of training). Each: 25 epochs at
# ~64,000 images/s (H100, 2026-11-25) = ~23 s, plus ~5 s of compiling and the start. ~2.5 min.
if step fast-preset 2.5; then
    for seed in $SEEDS; do
        train "$OUT/runs/fast-seed$seed" --preset fast --seed "$seed" --compile "$COMPILE" "${FAST_EPOCHS[@]}" \
            "${TRAIN_SMALL[@]}"
    done
    finish
fi

# bf16 costs no accuracy: the preset in fp32 on seed 0, against fast-seed0 (target: within 0.05 points). ~1 min.
if step bf16-parity 1; then
    train "$OUT/runs/fast-fp32-seed0" --preset fast --amp none --seed 0 --compile "$COMPILE" "${FAST_EPOCHS[@]}" \
        "${TRAIN_SMALL[@]}"
    finish
fi

# The paper's MNIST figure (<= 0.25%, Sabour et al. 2017, Table 1) within 10 minutes: the preset's recipe for
# PAPER_EPOCHS epochs, evaluated (and checkpointed) 10 times, 3 seeds. At 40 epochs of the first preset (batch 256,
# "default" compile) it gave 0.36% in ~55 s a seed; 100 of this one take ~1.8 min a seed: ~5.5 min.
if step paper-mnist 5.5; then
    for seed in $SEEDS; do
        train "$OUT/runs/paper-e$PAPER_EPOCHS-seed$seed" --preset fast --epochs "$PAPER_EPOCHS" \
            --eval-every $(((PAPER_EPOCHS + 9) / 10)) --seed "$seed" --compile "$COMPILE" "${TRAIN_SMALL[@]}"
    done
    finish
fi

# The paper's other experiments, CapsNet against the CNN baseline, eager bf16 (short runs: compiling each would cost
# as much as it saves). Their run directories resume themselves when started again.
# MultiMNIST (section 6; paper: 5.2% vs 8.1%): 60,000 pairs an epoch, CapsNet ~11,000 pairs/s
# and the baseline ~15,000 (H100, eager bf16). ~2 min at 10 epochs.
if step multimnist 2; then
    run "$PY" -m capsnet experiment multimnist --out "$OUT/experiments/multimnist" --epochs "$MULTI_EPOCHS" --amp bf16 \
        "${EXPERIMENT_SMALL[@]}" "${COMMON[@]}"
    finish
fi

# Affine robustness (section 5.2; paper: 79% vs 66% on affNIST at ~99.2% translated): 40x40, CapsNet ~11,000
# images/s and the baseline ~13,500 (H100, eager bf16). ~1.5 min at 5 epochs.
if step affine 1.5; then
    run "$PY" -m capsnet experiment affine --out "$OUT/experiments/affine" --epochs "$AFFINE_EPOCHS" --amp bf16 \
        "${EXPERIMENT_SMALL[@]}" "${COMMON[@]}"
    finish
fi

# Less data: 500 ... 60,000 training digits, every run LESS_STEPS steps of batch 128, both models (10 runs).
# ~2.2 min at 1,000 steps.
if step less-data 2.2; then
    run "$PY" -m capsnet experiment less-data --out "$OUT/experiments/less-data" --steps "$LESS_STEPS" --amp bf16 \
        "${LESS_SMALL[@]}" "${COMMON[@]}"
    finish
fi

# The other families' rows: the routing family, SegCaps beside the U-Net, CapsPix2pix beside pix2pix, each script
# on --device (a script without the flag would time the CPU: on a GPU it is skipped with that message), fp32 and
# bf16. ~0.3 min each on a GPU.
for family in routing-family segmentation synthesis; do
    script=benchmarks/${family/-/_}.py
    case $family in
        routing-family) sizes=("${ROUTING_FAMILY[@]}") ;;
        segmentation) sizes=("${SEGMENTATION[@]}") ;;
        synthesis) sizes=("${SYNTHESIS[@]}") ;;
    esac
    if step "$family" 0.3; then
        if has_device_flag "$script"; then
            run "$PY" "$script" --device "$DEVICE" "${sizes[@]}" --json "$OUT/families/$family.json"
            if ((!TINY)); then  # and under bf16 autocast, as --amp bf16 trains
                run "$PY" "$script" --device "$DEVICE" "${sizes[@]}" --dtype bf16 --json "$OUT/families/$family-bf16.json"
            fi
            finish
        elif [[ $DEVICE == cpu ]]; then
            run "$PY" "$script" "${sizes[@]}" --json "$OUT/families/$family.json"
            finish
        else
            skip "$script has no --device flag: its rows would be CPU rows"
        fi
    fi
done

# ------------------------------------------------------------------------------------------ the end
report  # this invocation in the index even where every step it named was done before
if [[ -n $BUNDLE ]]; then
    "$PY" benchmarks/gpu_suite.py bundle "$OUT" "$BUNDLE" || FAILED+=("bundle")
fi
echo "gpu_suite: index $OUT/README.md"
if ((${#FAILED[@]})); then
    echo "gpu_suite: FAILED: ${FAILED[*]} (logs in $OUT/logs)" >&2
    exit 1
fi
echo "gpu_suite: every step ran or was skipped"
