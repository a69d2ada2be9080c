#!/bin/sh
# The CUDA backend's tests (docs/cuda.md), on a machine with an NVIDIA GPU:
#   1. the serial model on the GPU against the CPU's (test_gpt, 1x1x1x1);
#   2. every grid of 8 ranks on the GPU (the 8 ranks share it) against the
#      CPU's serial model, dense and MoE (test_gpt small8/moe8 all);
#   3. the serial model on the GPU against PyTorch in float64 (gpt_oracle.sh);
#   4. 200 training steps of the tiny preset on the GPU and on the CPU, both
#      fp32: the losses' differences and the step rates (printed).
# Prints "no GPU" and exits 0 where nvidia-smi lists none. The build folder
# (FF_BUILD, default build-cuda) is configured with -DFF_CUDA=ON unless it
# exists. FF_PYTHON: a python3 with torch (default: the one on the PATH);
# FF_DATA: training shards for test 4 (default: the corpus `fourfold train`
# makes from the fortune files, out/corpus); FF_CUDA_TESTS: the tests to run
# (default "serial grids oracle moe train").
#   usage: scripts/test_cuda.sh
set -u
cd "$(dirname "$0")/.."
if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "test_cuda: no GPU (nvidia-smi lists none): skipped"
    exit 0
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
B=${FF_BUILD:-build-cuda}
if [ ! -x "$B/fourfold" ]; then
    scripts/build.sh "$B" -DCMAKE_BUILD_TYPE=Release -DFF_WERROR=ON -DFF_CUDA=ON || exit 1
fi
export FF_PYTHON=${FF_PYTHON:-$(command -v python3)}
MPI="mpirun --oversubscribe"
failed=0
TESTS=${FF_CUDA_TESTS:-serial grids oracle moe train}
want() { case " $TESTS " in *" $1 "*) return 0 ;; esac; return 1; }
run() { # name, command...
    name=$1
    shift
    t0=$(date +%s)
    if timeout "${FF_CUDA_TIMEOUT:-600}" "$@" >"/tmp/ff_cuda_$name.log" 2>&1; then
        r=passed
    else
        r=FAILED
        failed=1
    fi
    echo "== $name: $r ($(($(date +%s) - t0)) s)"
    grep -E "model |serial|grids|worst|passed|FAIL|error|CUDA|step +[0-9]+ |compare" \
        "/tmp/ff_cuda_$name.log" | head -40
}
export FF_DEVICE=cuda
want serial && run serial_gpu_vs_cpu $MPI -np 1 "$B/tests/test_gpt" small8 1x1x1x1
want grids && run grids8_dense $MPI -np 8 "$B/tests/test_gpt" small8 all
want oracle && run oracle sh tests/gpt_oracle.sh "$B/tests/test_gpt" mpirun .
want moe && run grids8_moe $MPI -np 8 "$B/tests/test_gpt" moe8 all
unset FF_DEVICE
# training: 200 steps on each device, the GPU's losses against the CPU's
# (a measurement: rounding differences grow over the steps; test 1 is the
# bound), and the median step rate of each
want train && for dev in cpu cuda; do
    timeout "${FF_CUDA_TIMEOUT:-600}" $MPI -np 1 "$B/fourfold" train --model tiny --steps 200 --device $dev --overwrite \
        --data "${FF_DATA:-out/corpus/fortunes_train.bin}" \
        --out "/tmp/ff_cuda_train_$dev" >"/tmp/ff_cuda_train_$dev.log" 2>&1 ||
        { echo "== train on $dev: FAILED"; tail -5 "/tmp/ff_cuda_train_$dev.log"; failed=1; }
done
want train && grep "device " /tmp/ff_cuda_train_cuda.log
want train && "$FF_PYTHON" - <<'EOF'
import json, statistics
def steps(dev):
    with open(f"/tmp/ff_cuda_train_{dev}/log.jsonl") as f:
        return [r for r in map(json.loads, f) if r.get("type") == "step"]
c, g = steps("cpu"), steps("cuda")
for s in (1, 10, 50, 100, 200):
    if s <= min(len(c), len(g)):
        a, b = c[s - 1]["loss"], g[s - 1]["loss"]
        print(f"   step {s:3d}: loss cpu {a:.8f} gpu {b:.8f} relative difference {abs(a - b) / a:.2e}")
for n, r in (("cpu", c), ("gpu", g)):
    print(f"   {n}: median {statistics.median(x['tokens_per_s'] for x in r[5:]):.0f} tokens/s")
EOF
[ "$failed" = 0 ] && echo "test_cuda: passed" || echo "test_cuda: FAILED"
exit "$failed"
