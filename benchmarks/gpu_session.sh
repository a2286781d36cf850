#!/usr/bin/env bash
# One device-tool call: every GPU check of layoutlab, time-boxed step by step, in the order
# of what matters most. Results go to $OUT/results.tgz (re-packed after each step, so a
# command stopped at its limit still returns what finished) and the whole log to $OUT/log.
#
#   bash benchmarks/gpu_session.sh             # on the GPU machine (BACKEND=gpu)
#   SMOKE=1 BACKEND=cpu bash benchmarks/gpu_session.sh   # a dry run of the commands, tiny
#
#   ONLY='^(train|bench_resnet18_cifar_train)$' ...  # only the steps whose names match
#
# A GPU machine without network gets the wheels its image lacks in .whl/ (git-ignored), made
# beforehand with `pip download --no-deps --only-binary=:all: --python-version 3.12
# --platform manylinux2014_x86_64 -d .whl tensorboardX flax==0.12.8`.
set -u
OUT=${OUT:-$(mktemp -d)}
BACKEND=${BACKEND:-gpu}
SMOKE=${SMOKE:-0}
ONLY=${ONLY:-.}  # a regex of the step names to run (all by default)
SUITE_S=${SUITE_S:-150} BENCH_S=${BENCH_S:-150}  # limits of the CPU suite and each bench step
# Only the log and one archive go to $OUT: the device tool returns at most 8 files.
R=$(mktemp -d)/results
mkdir -p "$R"
exec > >(tee -a "$OUT/log") 2>&1
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false MPLBACKEND=Agg
export LAYOUTLAB_AUTOTUNE_CACHE=$R/autotune.json
T0=$(date +%s)
# Every step ends by this many seconds after the start (the device call's own limit).
DEADLINE=$(( T0 + ${BUDGET_S:-570} ))
# Steps run in parallel: each packs into its own temporary name, then renames (atomic).
pack() { tar -C "${R%/results}" -czf "$OUT/r$BASHPID.tmp" results 2>/dev/null; mv -f "$OUT/r$BASHPID.tmp" "$OUT/results.tgz"; }
step() {  # step NAME SECONDS CMD...: one time-boxed step, its output in the log and in $R/NAME.txt
    local name=$1 limit=$2 left=$(( DEADLINE - $(date +%s) ))
    shift 2
    [[ $name =~ $ONLY ]] || return 0
    if [ "$left" -lt 20 ]; then echo "=== $name skipped: ${left}s left"; return; fi
    [ "$left" -lt "$limit" ] && limit=$left
    echo "=== $name (limit ${limit}s, t=$(( $(date +%s) - T0 ))s)"
    timeout --kill-after=5 "$limit" "$@" > "$R/$name.txt" 2>&1
    local rc=$?
    cat "$R/$name.txt"
    echo "=== $name rc=$rc (t=$(( $(date +%s) - T0 ))s)"
    pack
}

if [ -d .whl ]; then
    # tensorboardX always (the image lacks it); flax only where the image's is older.
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
        .whl/tensorboard[xX]*.whl || exit 1
    if ! python3 -c "import flax, sys; v=tuple(map(int, flax.__version__.split('.')[:3])); sys.exit(v < (0, 12, 8))"; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/flax-*.whl || exit 1
    fi
    export PYTHONPATH=/tmp/site
fi
# The CLI as a user gets it, without the network: no dependency resolution.
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$R/install.txt" 2>&1 \
    || { cat "$R/install.txt"; export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}; }
# `timeout` runs programs, not shell functions: the CLI as a command line.
LL=(python3 -c 'import sys; from layoutlab.cli import main; sys.exit(main())')

{
    date -u; uname -a; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1
    python3 -c "import jax, jaxlib, flax, optax, numpy, orbax.checkpoint as o, sys; print(sys.version.split()[0], 'jax', jax.__version__, 'jaxlib', jaxlib.__version__, 'flax', flax.__version__, 'optax', optax.__version__, 'numpy', numpy.__version__, 'orbax', o.__version__); print(jax.devices())"
    python3 -c "import torch; print('torch', torch.__version__, torch.cuda.is_available(), torch.backends.cudnn.version())"
    lscpu | grep -E "Model name|^CPU\(s\)"
} > "$R/versions.txt" 2>&1
cat "$R/versions.txt"
# Fail fast (the machine stays warm a short while for a rerun) if the backend is missing.
python3 -c "import jax; assert jax.devices('$BACKEND'), 'no $BACKEND'" || { pack; exit 3; }
"${LL[@]}" models > /dev/null || { echo "layoutlab does not import"; pack; exit 3; }

if [ "$SMOKE" = 1 ]; then
    R18=(--model resnet18 --stem cifar --tiny) C18=(--model resnet18 --model-arg stem=cifar --tiny) R50=(--model resnet50 --stem imagenet --tiny)
    B18=8 B50=2 IMG50=32 TRAIN=(--steps 4) PAR=2
else
    R18=(--model resnet18 --stem cifar) C18=(--model resnet18 --model-arg stem=cifar) R50=(--model resnet50 --stem imagenet)
    B18=128 B50=64 IMG50=224 TRAIN=() PAR=10
fi
W=$(mktemp -d)

# Phase 1, in parallel (correctness, not timing): GPU-marked tests, the main job and what
# a user does with its run, inspect in both layouts, compare of the policies, and the CPU
# suite under this machine's newer jax.
step gpu_tests 200 python3 -m pytest -q -o addopts="-ra -p no:benchmark" -W default \
    -m gpu tests/xla/test_xla_inspect.py tests/xla/test_xla_cli.py tests/train/test_remat.py tests/train/test_train_cli.py &
pids=($!)
{
    step train 150 "${LL[@]}" train --backend "$BACKEND" --workdir "$W/digits" --quiet "${TRAIN[@]}"
    step evaluate 60 "${LL[@]}" evaluate --workdir "$W/digits" --out "$W/eval"
    step export 60 "${LL[@]}" export --workdir "$W/digits" --out "$R/digits_model.jax"
} &
pids+=($!)
{
    for p in fp32 mixed_bf16; do
        step "inspect_${p}_train" 120 "${LL[@]}" inspect "${R18[@]}" --backend "$BACKEND" --mode train \
            --precision $p --batch-size $B18 --compare-layouts --auto-layout
    done
    for l in NHWC NCHW; do
        step "inspect_${l}_fp32_train_json" 90 "${LL[@]}" inspect "${R18[@]}" --backend "$BACKEND" \
            --mode train --layout $l --batch-size $B18 --json-file "$R/inspect_resnet18_${l}_fp32_train_gpu.json"
    done
} &
pids+=($!)
{
    for p in mixed_bf16 mixed_fp16; do
        step "compare_${p}_vs_fp32" 120 "${LL[@]}" compare "${C18[@]}" --against fp32 --precision $p \
            --mode train --grads --batch-size 8
    done
    step compare_nchw_vs_nhwc 90 "${LL[@]}" compare "${C18[@]}" --against layout --layout NCHW --grads --batch-size 8
} &
pids+=($!)
if [ "$SMOKE" != 1 ]; then
    # The image has neither nbmake nor a working Sphinx, and no network to install them.
    step cpu_suite_jax_new "$SUITE_S" env JAX_PLATFORMS=cpu python3 -m pytest -q -rfE --tb=short -n $PAR \
        -o addopts="-p no:benchmark --dist loadscope" -p no:cacheprovider --ignore=notebooks --ignore=tests/repo/test_docs.py --maxfail=20 tests &
    pids+=($!)
fi
# Not a bare `wait`: it would also wait for the log's tee.
wait "${pids[@]}"
echo "phase 1 done at t=$(( $(date +%s) - T0 ))s"

# Phase 2, alone on the machine: timings. PyTorch eager beside (cudnn.benchmark, autocast,
# TF32 stated); torch.compile's Inductor builds take minutes per cell on this budget.
BENCH=(--backend "$BACKEND" --layouts NHWC,NCHW --torch --no-roofline --no-plots
       --warmup 3 --time-budget 4)
for m in infer train; do
    step bench_resnet18_cifar_$m "$BENCH_S" "${LL[@]}" bench "${R18[@]}" --image-size 32 "${BENCH[@]}" \
        --modes $m --precisions fp32,mixed_bf16,mixed_fp16 --batch-sizes $B18 --out "$R/bench_resnet18_cifar_$m"
done
step bench_resnet50_imagenet 160 "${LL[@]}" bench "${R50[@]}" --image-size $IMG50 "${BENCH[@]}" --modes infer,train \
    --precisions fp32,mixed_bf16 --batch-sizes $B50 --out "$R/bench_resnet50_imagenet"
step bench_resnet18_cifar_small_batch 120 "${LL[@]}" bench "${R18[@]}" --image-size 32 "${BENCH[@]}" --modes infer,train \
    --precisions fp32,mixed_bf16 --batch-sizes 1,8 --out "$R/bench_resnet18_cifar_b1_8"

# Phase 3 (a later session): the CPU-motivated rules of round 6 on the GPU. Both apply on
# every backend; these check their numbers there and time each form against XLA's own.
# Then the host's 16 cores as another CPU kind for issue 31's small batches.
step gpu_numerics 120 python3 -m pytest -q -rfE --tb=short -o addopts="-p no:benchmark" -p no:cacheprovider \
    tests/nn/test_conv_transpose_matmul.py tests/nn/test_dense_grad.py tests/nn/test_nn_vs_numpy.py tests/train/test_gpu_platform.py
step ab_conv_transpose_layers_gpu 80 python3 benchmarks/conv_transpose.py --part layers --backend "$BACKEND"
step ab_dense_layer_gpu 40 python3 benchmarks/dense_input_gradient.py --part layer --backend "$BACKEND"
step ab_conv_transpose_unet_train_b8_gpu 90 python3 benchmarks/conv_transpose.py --part steps --mode train \
    --batch 8 --time-budget 10 --backend "$BACKEND"
step ab_dense_vgg_train_b1_gpu 80 python3 benchmarks/dense_input_gradient.py --part steps --batch 1 \
    --time-budget 10 --backend "$BACKEND"
# The mixed-precision training group alone: its eight cases compile for minutes.
step bench_resnet18_cifar_train_mixed 300 "${LL[@]}" bench "${R18[@]}" --image-size 32 "${BENCH[@]}" \
    --modes train --precisions mixed_bf16,mixed_fp16 --batch-sizes $B18 --out "$R/bench_resnet18_cifar_train_mixed"
step cpu16_resnet18_small_batch 200 env JAX_PLATFORMS=cpu "${LL[@]}" bench "${R18[@]}" --image-size 32 \
    --backend cpu --layouts NHWC --precisions fp32 --batch-sizes 1,8 --modes infer,train --torch \
    --baseline-plain --no-roofline --no-plots --time-budget 6 --out "$R/cpu16_resnet18_cifar_b1_8"
echo "all done at t=$(( $(date +%s) - T0 ))s"
