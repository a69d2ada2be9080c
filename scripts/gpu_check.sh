#!/bin/sh
# Everything the GPU issue checks, in one call on a lent GPU machine
# (docs/cuda.md, "Checking on a GPU"). Two halves:
#
#   scripts/gpu_check.sh prepare   here, on a Debian 12 machine with CUDA's
#                                  toolkit: builds build-cuda, bundles what the
#                                  GPU machine lacks into out/gpu (Open MPI and
#                                  OpenBLAS, the binaries, token shards, llm.c's
#                                  train_gpt2cu when LLMC_DIR is given)
#   scripts/gpu_check.sh run       there (the bundle carried as out/gpu): the
#                                  benchmarks one after another with the GPU to
#                                  themselves, then the tests side by side;
#                                  writes $OUT/summary.txt (default
#                                  out/gpu/result) and prints it last
#
# prepare's inputs (environment):
#   LLMC_DIR            a checkout of github.com/karpathy/llm.c (optional: no
#                       llm.c benchmark without it); copied to a temporary
#                       folder and built there with its Makefile (USE_CUDNN=1,
#                       GPU_COMPUTE_CAPABILITY=90, one GPU: NO_MULTI_GPU=1
#                       NO_USE_MPI=1), never into this tree. Two changes make it
#                       build with CUDA 13 and without a driver here: its
#                       fallback cudaMemAdvise takes a cudaMemLocation (CUDA 13's
#                       signature; only reached when cudaMalloc fails), and
#                       -lnvidia-ml links against an empty stub (llm.c uses NVML
#                       only where nvml.h is installed; the driver's library is
#                       loaded there)
#   CUDNN_FRONTEND_DIR  a checkout of github.com/NVIDIA/cudnn-frontend for
#                       llm.c's flash attention (v1.12.0 was used: later ones
#                       need NVRTC); without it llm.c builds without cuDNN
# run's knobs: GPU_CHECK_B (sequences per step in the benchmarks, default
# 16), GPU_CHECK_TESTS (default "passes serial oracle train grids moe"),
# GPU_CHECK_BENCH (default "fourfold llmc torch"), GPU_CHECK_TEST_TIMEOUT
# (seconds for the whole test phase, default 240).
set -u
cd "$(dirname "$0")/.."
G=out/gpu
mode=${1:-run}

prepare() {
    set -e
    scripts/build.sh build-cuda -DCMAKE_BUILD_TYPE=Release -DFF_WERROR=ON -DFF_CUDA=ON \
        -DFF_NATIVE=OFF
    mkdir -p "$G/build/tests" "$G/data"
    cp build-cuda/fourfold "$G/build/"
    cp build-cuda/tests/test_gpt build-cuda/tests/test_passes "$G/build/tests/"
    [ -f "$G/ffdeps/setup.sh" ] || scripts/bundle_runtime.sh "$G/ffdeps"
    if [ ! -f "$G/data/fortunes_train.bin" ]; then
        . scripts/env.sh
        mpirun -np 1 build-cuda/fourfold tokenize --doc-sep % --out "$G/data/fortunes" \
            $(find /usr/share/games/fortunes -type f ! -name '*.*' | sort) >/dev/null
    fi
    if [ -n "${LLMC_DIR:-}" ]; then
        W=$(mktemp -d)
        cp -r "$LLMC_DIR"/. "$W"
        rm -rf "$W/.git"
        sed -i 's/cudaMemAdvise(\*out, bytes, cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId)/cudaMemAdvise(*out, bytes, cudaMemAdviseSetPreferredLocation, cudaMemLocation{cudaMemLocationTypeHost, 0})/' \
            "$W/llmc/cuda_utils.cuh"
        mkdir -p "$W/stub"
        echo "" | cc -shared -x c - -Wl,-soname,libnvidia-ml.so.1 -o "$W/stub/libnvidia-ml.so"
        cudnn=USE_CUDNN=0
        if [ -n "${CUDNN_FRONTEND_DIR:-}" ]; then
            cudnn="USE_CUDNN=1 CUDNN_FRONTEND_PATH=$CUDNN_FRONTEND_DIR/include"
        fi
        # shellcheck disable=SC2086
        (cd "$W" && LIBRARY_PATH=$W/stub:/usr/local/cuda/lib64 PATH=/usr/local/cuda/bin:$PATH \
            make train_gpt2cu $cudnn GPU_COMPUTE_CAPABILITY=90 NO_MULTI_GPU=1 NO_USE_MPI=1 \
            >"$W/build.log" 2>&1) || { tail -20 "$W/build.log"; exit 1; }
        mkdir -p "$G/llmc"
        cp "$W/train_gpt2cu" "$G/llmc/"
        (cd "$LLMC_DIR" && git rev-parse --short HEAD 2>/dev/null || echo unknown) >"$G/llmc/commit"
        echo "$cudnn" >"$G/llmc/cudnn"
        rm -rf "$W"
    fi
    git rev-parse --short HEAD >"$G/commit"
    git status --porcelain --untracked-files=no | grep -q . && echo "+changes" >>"$G/commit"
    du -sh "$G"
    echo "gpu_check: prepared $G; on the GPU machine: scripts/gpu_check.sh run (carry $G)"
}

# ---- run ------------------------------------------------------------------------------
OUT=${OUT:-$G/result}
S=$OUT/summary.txt
say() { echo "$*" >>"$S"; }

bench_fourfold() { # fp32 GPT-2 124M on one GPU: tokens/s of the last steps, FF_CUDA_PROFILE
    FF_CUDA_PROFILE=1 timeout 120 mpirun -np 1 "$G/build/fourfold" train --model gpt2-124m \
        --seq 1024 --batch "$B" --steps 6 --device cuda --data "$G/data/fortunes_train.bin" \
        --val-every 0 --val-batches 1 --overwrite --out "$OUT/ff124m" \
        >"$OUT/bench_fourfold.log" 2>&1
    rc=$?
    tps=$(python3 -c "
import json, statistics
r = [x for x in map(json.loads, open('$OUT/ff124m/log.jsonl')) if x.get('type') == 'step']
print(round(statistics.median(x['tokens_per_s'] for x in r[2:])))" 2>/dev/null)
    say "bench fourfold fp32 124M B=$B T=1024: rc $rc, ${tps:-?} tokens/s (median of steps 3-6)"
}

bench_llmc() {
    [ -x "$G/llmc/train_gpt2cu" ] || { say "bench llm.c: not prepared"; return; }
    d=$(mktemp -d)
    ln -s "$PWD/$G/data/fortunes_train.bin" "$d/t_train.bin"
    ln -s "$PWD/$G/data/fortunes_val.bin" "$d/t_val.bin"
    (cd "$d" && timeout 120 "$OLDPWD/$G/llmc/train_gpt2cu" -i "$d/t_train.bin" -j "$d/t_val.bin" \
        -e d12 -b "$B" -t 1024 -x 30 -v 1000 -m 1 -s 0 -h 0) >"$OUT/bench_llmc.log" 2>&1
    rc=$?
    tps=$(python3 -c "
import re, statistics
ms = [float(m.group(1)) for m in re.finditer(r'\| ([0-9.]+) ms \|', open('$OUT/bench_llmc.log').read())]
print(round($B * 1024 / statistics.median(ms[5:]) * 1e3))" 2>/dev/null)
    say "bench llm.c $(cat "$G/llmc/commit") bf16 ($(cat "$G/llmc/cudnn")) B=$B T=1024: rc $rc," \
        "${tps:-?} tokens/s (median step of 6-30)"
}

bench_torch() {
    timeout 240 python3 bench/gpt_torch_bench.py --device cuda --amp bf16 --sdpa --compile \
        --V 50304 --B "$B" --T 1024 --warmup 3 --iters 10 --gemm-rate 8192 \
        >"$OUT/bench_torch.log" 2>&1
    rc=$?
    line=$(grep '"peer"' "$OUT/bench_torch.log" | python3 -c "
import json, sys
r = json.loads(sys.stdin.read())
print(f\"{r['tokens_per_s']:.0f} tokens/s ({r['median_ms']:.1f} ms), torch {r['torch']}\")" 2>/dev/null)
    gemm=$(grep '"gemm"' "$OUT/bench_torch.log" | python3 -c "
import json, sys
r = json.loads(sys.stdin.read())['gemm']
print(f\"{r['dtype']} {r['n']}^3 product {r['median_flops'] / 1e12:.1f} TFLOP/s\")" 2>/dev/null)
    say "bench torch.compile bf16 sdpa B=$B T=1024: rc $rc, ${line:-?}; ${gemm:-no gemm rate}"
}

run() {
    mkdir -p "$OUT"
    : >"$S"
    if ! nvidia-smi -L >/dev/null 2>&1; then
        echo "gpu_check: no GPU (nvidia-smi lists none)" | tee "$S"
        exit 0
    fi
    [ -f "$G/ffdeps/setup.sh" ] || { echo "gpu_check: no $G (run prepare, carry $G)" | tee "$S"; exit 1; }
    . "$G/ffdeps/setup.sh" >/dev/null
    export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64
    # cuDNN where the system has none of its own: a pip-installed PyTorch's
    if ! ldconfig -p | grep -q libcudnn.so.9 && [ ! -e /usr/local/cuda/lib64/libcudnn.so.9 ]; then
        d=$(python3 -c 'import nvidia.cudnn, os; print(os.path.dirname(nvidia.cudnn.__file__))' \
            2>/dev/null) && LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d/lib
    fi
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    B=${GPU_CHECK_B:-16}
    t0=$(date +%s)
    say "gpu_check $(date -u +%FT%TZ), commit $(cat "$G/commit" | tr '\n' ' ')"
    say "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader)"
    say "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc)"
    say "python: $(python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())' 2>&1 | tail -1)"
    say "libraries: $(ldconfig -p | grep -oE 'lib(cudnn|nccl|cublasLt)\.so\.[0-9.]+' | sort -u | tr '\n' ' ')" \
        "$(ls /usr/local/cuda/lib64 2>/dev/null | grep -oE 'lib(cudnn|nccl)\.so\.[0-9.]+' | sort -u | tr '\n' ' ')"
    for b in ${GPU_CHECK_BENCH:-fourfold llmc torch}; do
        "bench_$b"
    done
    say "benchmarks took $(($(date +%s) - t0)) s"
    # the tests side by side (they assert results, not times)
    t1=$(date +%s)
    pids=""
    for t in ${GPU_CHECK_TESTS:-passes serial oracle train grids moe}; do
        FF_BUILD=$G/build FF_CUDA_TESTS=$t FF_DATA=$G/data/fortunes_train.bin \
            FF_CUDA_TIMEOUT=${GPU_CHECK_TEST_TIMEOUT:-240} \
            sh scripts/test_cuda.sh >"$OUT/test_$t.log" 2>&1 &
        pids="$pids $!:$t"
    done
    for p in $pids; do
        wait "${p%%:*}"
        rc=$?
        t=${p#*:}
        [ "$rc" = 0 ] && r=PASS || r=FAIL
        say "test $t: $r (rc $rc)"
        grep -E "^== |worst|passed|FAIL|error|step |median" "$OUT/test_$t.log" | grep -v "^test_cuda" |
            head -12 | sed 's/^/    /' >>"$S"
    done
    say "tests took $(($(date +%s) - t1)) s"
    grep "CUDA profile" "$OUT/bench_fourfold.log" 2>/dev/null | sort -k8 -g | tail -12 |
        sed 's/^/    /' >>"$S"
    cat "$S"
}

case $mode in
prepare) prepare ;;
run) run ;;
*) echo "usage: scripts/gpu_check.sh prepare|run" >&2; exit 2 ;;
esac
