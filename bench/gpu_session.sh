#!/usr/bin/env bash
# Everything a GPU session owes, in two device calls of < 10 minutes each:
#   run(command="bash bench/gpu_session.sh tests", timeout_s=600)   # build + CUDA tests + sanitizers
#   run(command="bash bench/gpu_session.sh bench", timeout_s=600)   # build (kept while warm) + benchmarks
#
# Stages:
#   tests   build; the CUDA tests (pytest -m cuda); the multi-rank CUDA tests
#           (tests/backend/test_cuda_multirank.py, 2-4 processes on one GPU, gloo as
#           the CUDA transport); no host syncs and CUDA-graph capture
#           (tests/backend/test_cuda_streams.py); eager init with real NCCL:
#           init_process_group(device_id=...), split_group, new_group, DeviceMesh,
#           barrier (tests/backend/test_eager_init_cuda.py); compute-sanitizer
#           memcheck and racecheck over the codec CUDA tests (run alongside the others).
#   bench   build; codec, comm (world size 1), linear and model benchmarks.
#   all     both (only if the machine is fast enough for one call).
#   selftest, selftest-pass
#           no GPU needed: deliberately failing / passing steps through the
#           same step runner (tests/tools/test_gpu_session_script.py runs them).
# FP8COMM_GPU_SESSION_DRYRUN=1 prints each step's command instead of running it.
#
# Every step runs under a timeout, with its output in its own log; pytest
# steps write junit XML. A step that fails, times out, or whose tests were all
# skipped makes the whole command exit nonzero, but the later steps that do
# not depend on it still run. The script keeps its own clock
# (FP8COMM_GPU_SESSION_BUDGET_S, default 560 s) and cuts each step's timeout to
# what is left, so it always ends with its summary inside the call's limit.
#
# Results in $OUT (the device tool brings back at most 8 files):
#   $DAY-gpu-session-$STAGE-$GPU.txt           the summary (also printed last)
#   $DAY-gpu-session-$STAGE-$GPU-logs.tar.gz   logs/: every step's log, junit XML, sanitizer reports
#   bench/results/$MACHINE/{codec,comm-1rank,linear,linear-fused-cast}.json
#   bench/results/modeled/model-$MACHINE.json  benchmark results, laid out as the repository's
#                                               bench/results/ (its README): copy them over it and commit
# $MACHINE names the GPU as bench/results/ does: gpu-h100-80gb-hbm3 for an "NVIDIA H100 80GB HBM3".
set -Eeuo pipefail
trap 'echo "== gpu_session.sh line $LINENO: command failed (exit $?)" >&2' ERR
cd "$(dirname "$0")/.."

STAGE=${1:-all}
case "$STAGE" in
  tests | bench | all | selftest | selftest-pass) ;;
  *)
    echo "usage: bash bench/gpu_session.sh [tests|bench|all|selftest|selftest-pass]" >&2
    exit 2
    ;;
esac

OUT=${OUT:-/tmp/fp8comm-gpu}
LOGS="$OUT/logs"
mkdir -p "$OUT"
rm -rf "$LOGS"
mkdir -p "$LOGS"
WORK=$(mktemp -d)
export PYTHONUNBUFFERED=1 MAX_JOBS=16
DAY=$(date +%F)
START=$(date +%s)
BUDGET=${FP8COMM_GPU_SESSION_BUDGET_S:-560}
DEADLINE=$((START + BUDGET))
RESERVE_S=15   # kept back for the summary and the log archive
DRYRUN=${FP8COMM_GPU_SESSION_DRYRUN:-0}
SANITIZER_ERROR_RC=86

if [[ $STAGE == selftest* ]]; then
  GPU=selftest
else
  GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr ' ' '-' |
    tr -cd 'A-Za-z0-9.-' || true)
  GPU=${GPU:-unknown-gpu}
fi
if [ "$GPU" = unknown-gpu ]; then
  MACHINE=gpu-unknown
else
  MACHINE=gpu-$(printf '%s' "$GPU" | tr '[:upper:]' '[:lower:]' | sed 's/^nvidia-//')
fi
PREFIX="$DAY-gpu-session-$STAGE-$GPU"

STEPS=()     # step names, in the order they were started
BG_PIDS=()   # steps running in the background
BG_STEPS=()

log() { echo "== $(date +%T) $*"; }

# ---------------------------------------------------------------- step runner
# A step's result is a line in $WORK/NAME.status: STATUS<TAB>SECONDS<TAB>DETAIL.
# STATUS: PASS; FAIL (fails the command); SKIP (a tool this machine lacks);
# NOT-RUN (a step it needs failed, which already fails the command); DRY.
record() {
  printf '%s\t%s\t%s\n' "$2" "$3" "$4" >"$WORK/$1.status"
  if [ "$2" = PASS ] || [ "$2" = DRY ]; then
    log "$2 $1 ($3 s) $4"
  else
    log "$2 $1 ($3 s): $4"
  fi
}

status_of() {
  if [ -f "$WORK/$1.status" ]; then cut -f1 "$WORK/$1.status"; else echo MISSING; fi
}

register() { STEPS+=("$1"); }

# exec_step NAME LIMIT_S CMD...: runs CMD with stdout and stderr in $LOGS/NAME.log
# under a timeout of LIMIT_S, or less if the budget has less left. Sets
# STEP_RC (CMD's status; 124/137 on a timeout; "no-time" if it was not
# started), STEP_LIMIT and STEP_SECS. Returns 0.
exec_step() {
  local name=$1 limit=$2 left t0
  shift 2
  STEP_SECS=0
  left=$((DEADLINE - $(date +%s) - RESERVE_S))
  if [ "$left" -lt 10 ]; then
    STEP_RC=no-time
    STEP_LIMIT=0
    return 0
  fi
  if [ "$limit" -gt "$left" ]; then limit=$left; fi
  STEP_LIMIT=$limit
  log "$name (limit ${limit} s): $*"
  if [ "$DRYRUN" = 1 ]; then
    STEP_RC=dry
    return 0
  fi
  t0=$(date +%s)
  STEP_RC=0
  # timeout signals the whole process group: pytest's spawned ranks and torchrun's workers too.
  timeout --kill-after=15 "$limit" "$@" >"$LOGS/$name.log" 2>&1 </dev/null || STEP_RC=$?
  STEP_SECS=$(($(date +%s) - t0))
}

# Records the outcome of a step whose STEP_RC is not 0; returns 0 if it was handled.
record_unfinished() {
  local name=$1
  case "$STEP_RC" in
    no-time) record "$name" FAIL 0 "not run: the session's ${BUDGET} s budget is spent" ;;
    dry) record "$name" DRY 0 "" ;;
    124 | 137) record "$name" FAIL "$STEP_SECS" "timed out after ${STEP_LIMIT} s" ;;
    *) return 1 ;;
  esac
}

show_log_tail() {  # show_log_tail NAME LINES
  if [ "$2" -gt 0 ] && [ -f "$LOGS/$1.log" ]; then tail -n "$2" "$LOGS/$1.log" | sed 's/^/   | /'; fi
}

# cmd_step NAME LIMIT_S SHOW CMD...: a plain command; SHOW lines of its log are printed when it passes.
cmd_step() {
  local name=$1 limit=$2 show=$3
  shift 3
  register "$name"
  exec_step "$name" "$limit" "$@"
  if record_unfinished "$name"; then
    [ "$STEP_RC" = dry ] || show_log_tail "$name" 40
  elif [ "$STEP_RC" = 0 ]; then
    show_log_tail "$name" "$show"
    record "$name" PASS "$STEP_SECS" ""
  else
    show_log_tail "$name" 40
    record "$name" FAIL "$STEP_SECS" "exit $STEP_RC"
  fi
}

junit_counts() {  # junit_counts XML: prints "tests failures errors skipped", or nothing
  python3 - "$1" <<'PY' 2>/dev/null || true
import sys
import xml.etree.ElementTree as ET

root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
print(*(sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")))
PY
}

# Records a finished pytest run from its exit status and its junit XML. A run
# in which no test ran (all skipped, none collected) fails: on a GPU machine
# that means the CUDA tests did not run at all.
record_pytest() {
  local name=$1 counts tests=0 failures=0 errors=0 skipped=0 summary
  counts=$(junit_counts "$LOGS/$name.xml")
  if [ -n "$counts" ]; then read -r tests failures errors skipped <<<"$counts"; fi
  summary="$((tests - failures - errors - skipped)) passed, $failures failed, $errors errors, $skipped skipped"
  if [ "$STEP_RC" != 0 ]; then
    show_log_tail "$name" 40
    record "$name" FAIL "$STEP_SECS" "exit $STEP_RC: $summary"
  elif [ -z "$counts" ]; then
    show_log_tail "$name" 40
    record "$name" FAIL "$STEP_SECS" "no junit XML written"
  elif [ $((tests - skipped)) -le 0 ]; then
    show_log_tail "$name" 20
    record "$name" FAIL "$STEP_SECS" "no test ran ($summary)"
  else
    show_log_tail "$name" 1
    record "$name" PASS "$STEP_SECS" "$summary"
  fi
}

# pytest_step NAME LIMIT_S PYTEST_ARGS...
pytest_step() {
  local name=$1 limit=$2
  shift 2
  register "$name"
  exec_step "$name" "$limit" python3 -m pytest -q -p no:cacheprovider -rfEs --junitxml="$LOGS/$name.xml" "$@"
  if ! record_unfinished "$name"; then record_pytest "$name"; fi
}

find_sanitizer() {
  local c
  for c in "$(command -v compute-sanitizer || true)" "${CUDA_HOME:+$CUDA_HOME/bin/compute-sanitizer}" \
    "${CUDA_PATH:+$CUDA_PATH/bin/compute-sanitizer}" /usr/local/cuda/bin/compute-sanitizer; do
    if [ -n "$c" ] && [ -x "$c" ]; then
      echo "$c"
      return 0
    fi
  done
  return 1
}

# sanitizer_step TOOL LIMIT_S PYTEST_ARGS...: pytest under compute-sanitizer,
# checking the fp8comm kernels only (the others run uninstrumented). Its
# reports go to $LOGS/TOOL-report.log: on stdout pytest would capture them.
sanitizer_step() {
  local tool=$1 limit=$2 san report unsupported
  shift 2
  report="$LOGS/$tool-report.log"
  register "$tool"
  if ! san=$(find_sanitizer); then
    record "$tool" SKIP 0 \
      "compute-sanitizer not found (PATH, \$CUDA_HOME/bin, \$CUDA_PATH/bin, /usr/local/cuda/bin): $tool not run"
    return 0
  fi
  # No caching allocator under memcheck, so an access past a tensor's end is
  # outside any allocation rather than inside a cached block.
  exec_step "$tool" "$limit" env PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
    "$san" --tool "$tool" --error-exitcode "$SANITIZER_ERROR_RC" --kernel-name kns=fp8comm --log-file "$report" \
    python3 -m pytest -q -p no:cacheprovider -rfEs --junitxml="$LOGS/$tool.xml" "$@"
  if record_unfinished "$tool"; then return 0; fi
  unsupported=$(cat "$report" "$LOGS/$tool.log" 2>/dev/null | grep -m1 -E '^=+ .*[Nn]ot supported' || true)
  if [ "$STEP_RC" != 0 ] && [ -n "$unsupported" ]; then
    record "$tool" SKIP "$STEP_SECS" "compute-sanitizer cannot run on this machine: $unsupported"
  elif [ "$STEP_RC" = "$SANITIZER_ERROR_RC" ]; then
    grep -E '^=+ ' "$report" 2>/dev/null | head -40 | sed 's/^/   | /' || true
    record "$tool" FAIL "$STEP_SECS" \
      "compute-sanitizer found errors: $(grep -m1 'ERROR SUMMARY' "$report" 2>/dev/null || echo 'see the report')"
  else
    record_pytest "$tool"
    if [ "$(status_of "$tool")" = PASS ]; then
      log "   $tool: $(grep -m1 'ERROR SUMMARY' "$report" 2>/dev/null || echo 'no ERROR SUMMARY line')"
    fi
  fi
}

# step_bg FUNCTION NAME ARGS...: runs a step function in the background; its
# report is printed when join_bg collects it.
step_bg() {
  local fn=$1 name=$2
  shift 2
  register "$name"  # here: the subshell's own registration is lost with it
  ("$fn" "$name" "$@") >"$WORK/$name.report" 2>&1 &
  BG_PIDS+=("$!")
  BG_STEPS+=("$name")
  log "$name started in the background"
}

join_bg() {
  local i
  for i in "${!BG_PIDS[@]}"; do
    wait "${BG_PIDS[$i]}" || true
    echo "== background step ${BG_STEPS[$i]}:"
    cat "$WORK/${BG_STEPS[$i]}.report" 2>/dev/null || true
  done
  BG_PIDS=()
  BG_STEPS=()
}

not_run() {  # not_run WHY NAME...
  local why=$1 name
  shift
  for name in "$@"; do
    register "$name"
    record "$name" NOT-RUN 0 "$why"
  done
}

# ---------------------------------------------------------------- the end
finish() {
  local rc=$? name status secs detail failed=() skipped=() line final
  trap - EXIT ERR
  set +e
  join_bg
  {
    echo "== summary: stage $STAGE on $GPU, $DAY, $(($(date +%s) - START)) s of a ${BUDGET} s budget"
    for name in "${STEPS[@]}"; do
      if [ -f "$WORK/$name.status" ]; then
        IFS=$'\t' read -r status secs detail <"$WORK/$name.status"
      else
        status=FAIL secs=0 detail="no result recorded (the script stopped before it finished)"
      fi
      printf '%-8s %-28s %5s s  %s\n' "$status" "$name" "$secs" "$detail"
      if [ "$status" = FAIL ]; then failed+=("$name"); fi
      if [ "$status" = SKIP ]; then skipped+=("$name"); fi
    done
    if [ "$rc" != 0 ]; then
      echo "== the script itself stopped with exit $rc (see the line reported above)"
    fi
    if [ ${#failed[@]} -gt 0 ]; then
      echo "== FAILED: ${failed[*]}"
    elif [ "$rc" = 0 ]; then
      echo "== no step failed"
    fi
    if [ ${#skipped[@]} -gt 0 ]; then
      echo "== SKIPPED, for a tool this machine lacks: ${skipped[*]}"
    fi
  } >"$OUT/$PREFIX.txt"
  if tar -czf "$OUT/$PREFIX-logs.tar.gz" -C "$OUT" logs; then
    rm -rf "$LOGS"
    line="== logs, junit XML, sanitizer reports: $OUT/$PREFIX-logs.tar.gz"
  else
    line="== could not archive $LOGS"
  fi
  echo "$line" >>"$OUT/$PREFIX.txt"
  cat "$OUT/$PREFIX.txt"
  rm -rf "$WORK"
  final=0
  if [ ${#failed[@]} -gt 0 ]; then final=1; fi
  if [ "$rc" != 0 ]; then final=$rc; fi
  exit "$final"
}
trap finish EXIT

# ---------------------------------------------------------------- stages
build_steps() {
  cat >"$WORK/env.sh" <<'SH'
set -e
nvidia-smi
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
python3 -c 'import torch; assert torch.cuda.is_available(), "torch sees no GPU"'
if command -v nvcc >/dev/null; then nvcc --version | tail -2; else echo "nvcc not on PATH"; fi
SH
  cat >"$WORK/has_cuda.py" <<'PY'
import torch

import fp8comm

assert torch.cuda.is_available(), "torch sees no GPU"
assert fp8comm._C.has_cuda, "fp8comm was built without CUDA: see the 'fp8comm setup:' lines of build.log"
print("fp8comm with CUDA on", torch.cuda.get_device_name())
PY
  cmd_step env 90 30 bash "$WORK/env.sh"
  cmd_step build 330 0 python3 -m pip install -v --no-build-isolation --no-deps -e .
  # setup.py's plan, and its warning if it built without CUDA (pip -v keeps them in build.log)
  grep -h "fp8comm setup:" "$LOGS/build.log" 2>/dev/null | sed 's/^/   | /' || true
  cmd_step has-cuda 90 1 python3 "$WORK/has_cuda.py"
}

# keep_result STEP PATH: copies PATH (relative to the repository) to $OUT/PATH
# if STEP passed, so that what comes back is only what this session measured.
keep_result() {
  if [ "$(status_of "$1")" = PASS ] && [ -f "$2" ]; then
    mkdir -p "$OUT/$(dirname "$2")"
    cp "$2" "$OUT/$2"
  fi
}

have_cuda_build() {
  [ "$(status_of build)" = PASS ] || [ "$(status_of build)" = DRY ] || return 1
  [ "$(status_of has-cuda)" = PASS ] || [ "$(status_of has-cuda)" = DRY ]
}

CODEC_CUDA_TESTS=(tests/codec/test_codec_cuda.py tests/nn/test_fused_cast_cuda.py)

tests_stage() {
  if ! have_cuda_build; then
    not_run "needs a CUDA build of fp8comm (build or has-cuda failed)" \
      cuda-tests cuda-streams cuda-multirank cuda-eager-init memcheck racecheck
    return 0
  fi
  # torch.compile's compilation adds minutes under a sanitizer and no kernels of
  # ours that the other tests do not run, so the sanitizers leave it out.
  step_bg sanitizer_step memcheck 300 "${CODEC_CUDA_TESTS[@]}" -k "not compile"
  step_bg sanitizer_step racecheck 300 "${CODEC_CUDA_TESTS[@]}" -k "not compile"
  pytest_step cuda-tests 300 -m cuda tests \
    --ignore=tests/backend/test_cuda_multirank.py --ignore=tests/backend/test_cuda_streams.py \
    --ignore=tests/backend/test_eager_init_cuda.py
  pytest_step cuda-streams 150 -m cuda tests/backend/test_cuda_streams.py
  pytest_step cuda-multirank 240 -m cuda tests/backend/test_cuda_multirank.py
  # its own process: a world eagerly connected to NCCL, split, then destroyed
  pytest_step cuda-eager-init 120 -m cuda tests/backend/test_eager_init_cuda.py
  join_bg
}

bench_stage() {
  if ! have_cuda_build; then
    not_run "needs a CUDA build of fp8comm (build or has-cuda failed)" \
      codec-bench comm-bench-ws1 linear-bench linear-fused-cast-bench model
    return 0
  fi
  # Each benchmark writes into the repository's layout, so that its JSON records
  # the command as run from the repository; keep_result copies it to $OUT.
  local results="bench/results/$MACHINE" model_json="bench/results/modeled/model-$MACHINE.json"
  cmd_step codec-bench 120 32 python3 bench/codec.py --device cuda --sizes 1M,4M,16M,64M,256M \
    --json "$results/codec.json"
  keep_result codec-bench "$results/codec.json"
  # codec + launch overhead against nccl
  cmd_step comm-bench-ws1 120 40 torchrun --nproc_per_node=1 -m fp8comm.bench.comm --max-bytes 1G --reps 20 \
    --json "$results/comm-1rank.json"
  keep_result comm-bench-ws1 "$results/comm-1rank.json"
  cmd_step linear-bench 120 14 python3 bench/linear.py --json "$results/linear.json"
  keep_result linear-bench "$results/linear.json"
  # the fused casts (FP8COMM_FUSED_CAST=1), and the casts alone: fused against eager
  cmd_step linear-fused-cast-bench 150 30 env FP8COMM_FUSED_CAST=1 python3 bench/linear.py --casts \
    --json "$results/linear-fused-cast.json"
  keep_result linear-fused-cast-bench "$results/linear-fused-cast.json"
  if [ "$(status_of codec-bench)" = PASS ] || [ "$(status_of codec-bench)" = DRY ]; then
    cmd_step model 60 12 python3 bench/model.py --codec-json "$results/codec.json" --json "$model_json"
    keep_result model "$model_json"
  else
    not_run "needs the codec bench's JSON" model
  fi
}

# Steps that exercise the runner itself without a GPU: a passing pytest run
# and one in the background (failing in `selftest`); in `selftest` also a
# failing one, one whose only test skips, a command that runs past its
# timeout; a passing pytest run under compute-sanitizer (a SKIP when none is
# found; tests/tools/test_gpu_session_script.py puts a stand-in on PATH); and a step
# after them all, which must still run.
selftest_stage() {
  local dir="$WORK/selftest"
  mkdir -p "$dir"
  printf '[pytest]\n' >"$dir/pytest.ini"
  printf 'def test_passes():\n    assert 1 + 1 == 2\n' >"$dir/test_pass.py"
  printf 'def test_fails():\n    assert 1 + 1 == 3\n' >"$dir/test_fail.py"
  printf 'import pytest\n\n\ndef test_skips():\n    pytest.skip("needs a GPU")\n' >"$dir/test_skip.py"
  local cfg=(--rootdir="$dir" -c "$dir/pytest.ini") background=test_pass.py
  if [ "$STAGE" = selftest ]; then background=test_fail.py; fi
  step_bg pytest_step selftest-background 120 "${cfg[@]}" "$dir/$background"
  pytest_step selftest-pass 120 "${cfg[@]}" "$dir/test_pass.py"
  if [ "$STAGE" = selftest ]; then
    pytest_step selftest-fail 120 "${cfg[@]}" "$dir/test_fail.py"
    pytest_step selftest-all-skipped 120 "${cfg[@]}" "$dir/test_skip.py"
    cmd_step selftest-timeout 1 0 sleep 30
  fi
  sanitizer_step memcheck 120 "${cfg[@]}" "$dir/test_pass.py"
  cmd_step selftest-after 30 0 true
  join_bg
}

log "stage $STAGE on $GPU; results in $OUT"
case "$STAGE" in
  tests)
    build_steps
    tests_stage
    ;;
  bench)
    build_steps
    bench_stage
    ;;
  all)
    build_steps
    tests_stage
    bench_stage
    ;;
  selftest | selftest-pass)
    selftest_stage
    ;;
esac
