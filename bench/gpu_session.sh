#!/usr/bin/env bash
# Everything a GPU session owes, in two device calls of <= 10 minutes each:
#   run(command="bash bench/gpu_session.sh tests", timeout_s=590)   # build + CUDA tests
#   run(command="bash bench/gpu_session.sh bench", timeout_s=590)   # benchmarks (build kept while warm)
# (no argument: both, if the machine is fast enough for one call). Every
# result lands in $OUT (the device tool brings it back) with the device named.
# Copy the JSON files to bench/results/ and commit them.
set -uo pipefail
OUT=${OUT:-/tmp/fp8comm-gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MAX_JOBS=16
DAY=$(date +%F)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' ' '-' | tr -cd 'A-Za-z0-9.-')
log() { echo "== $(date +%T) $*"; }

log "build"
nvidia-smi -L; python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
time python3 -m pip install --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1 \
  || { tail -50 "$OUT/build.log"; exit 1; }
python3 -c 'import fp8comm; assert fp8comm._C.has_cuda, "built without CUDA"; print("fp8comm with CUDA")'

STAGE=${1:-all}
if [ "$STAGE" = tests ] || [ "$STAGE" = all ]; then
log "CUDA tests"
timeout 400 python3 -m pytest -m cuda tests -q -p no:cacheprovider 2>&1 | tee "$OUT/cuda-tests.log" | tail -40
fi
[ "$STAGE" = tests ] && { log "done"; exit 0; }

log "codec bench"
timeout 120 python3 bench/codec.py --device cuda --sizes 1M,4M,16M,64M,256M \
  --json "$OUT/$DAY-codec-$GPU.json" | tail -32

log "comm bench, world size 1 (codec + launch overhead vs nccl)"
timeout 120 torchrun --nproc_per_node=1 bench/comm.py --max-bytes 1G --reps 20 \
  --json "$OUT/$DAY-comm-$GPU-ws1.json" 2>/dev/null | tail -95

log "linear bench"
timeout 120 python3 bench/linear.py --json "$OUT/$DAY-linear-$GPU.json" | tail -14

log "linear bench with the fused casts (FP8COMM_FUSED_CAST=1), and the casts alone: fused vs eager"
FP8COMM_FUSED_CAST=1 timeout 150 python3 bench/linear.py --casts --json "$OUT/$DAY-linear-fused-cast-$GPU.json" | tail -30

log "model with the measured codec"
python3 bench/model.py --codec-json "$OUT/$DAY-codec-$GPU.json" --json "$OUT/$DAY-model-$GPU.json" | head -12
log "done"
