#!/usr/bin/env bash
# Everything a GPU session owes, in ONE device call:
#   run(command="bash bench/gpu_session.sh", timeout_s=600)
#
# The steps, in the order of evidence per second (each under its own cap; the
# caps add up to the budget, checked before anything runs):
#   env            versions and tools (GPU, driver, torch, nvcc, setuptools, compute-sanitizer)
#   build          the CUDA extension for sm_90 only, MAX_JOBS = cores; on failure the first
#                  compiler errors are printed, not pip's tail
#   has-cuda       fp8comm._C.has_cuda and a GPU torch can see
#   codec-cast-tests  the bit-for-bit CUDA codec and cast tests, and Fp8Linear's GEMMs (named files)
#   codec-bench    quantize / dequantize GB/s (E4M3 and MXFP4) against a device-to-device copy of the same bytes
#   linear-bench   Llama-8B shapes: BF16, FP8 with eager casts, FP8 with the fused casts
#   comm-bench     fp8nccl against nccl at world size 1, up to 256 MiB, rows written as they finish
#   model          the performance model fed with the measured codec figures (modeled)
# then two lanes side by side, after the benchmarks so that neither disturbs them:
#   tests lane     cuda-streams (no host syncs, CUDA graph), cuda-backend (fp8nccl at world
#                  size 1), cuda-eager-init (real NCCL), cuda-multirank (2-4 ranks, gloo transport)
#   sanitizer lane memcheck over the codec and cast tests; racecheck over the cast kernels,
#                  the only ones with shared memory
#
# Results come back flat in $OUT (the device tool returns at most 8 files, at most
# two folders down): the summary, one tarball of logs, and one JSON per benchmark.
# Every benchmark table is printed again just before the summary, which is last.
# Copy the JSONs to bench/results/$MACHINE/ (model.json to
# bench/results/modeled/model-$MACHINE.json) and commit them with this command.
#
#   bash bench/gpu_session.sh [selftest | selftest-pass]
# selftest, selftest-pass: no GPU needed; deliberately failing / passing steps
# through the same step runner (tests/tools/test_gpu_session_script.py).
# FP8COMM_GPU_SESSION_DRYRUN=1 prints the plan and each step's command instead
# of running it. FP8COMM_GPU_SESSION_BUDGET_S (default 560) is the script's own
# clock: each step's cap is cut to what is left, so the summary always comes back.
set -Eeuo pipefail
trap 'echo "== gpu_session.sh line $LINENO: command failed (exit $?)" >&2' ERR
cd "$(dirname "$0")/.."

MODE=${1:-session}
case "$MODE" in
  session | selftest | selftest-pass) ;;
  *)
    echo "usage: bash bench/gpu_session.sh [selftest|selftest-pass]" >&2
    exit 2
    ;;
esac

OUT=${OUT:-/tmp/fp8comm-gpu}
LOGS="$OUT/logs"
mkdir -p "$OUT"
rm -rf "$LOGS"
mkdir -p "$LOGS"
WORK=$(mktemp -d)
CORES=$(nproc)
export PYTHONUNBUFFERED=1
DAY=$(date +%F)
START=$(date +%s)
BUDGET=${FP8COMM_GPU_SESSION_BUDGET_S:-560}
DEADLINE=$((START + BUDGET))
RESERVE_S=10   # kept back for the tables, the summary and the log archive
DRYRUN=${FP8COMM_GPU_SESSION_DRYRUN:-0}
SANITIZER_ERROR_RC=86

# Each step's cap in seconds. SERIAL runs first, one step at a time; then the
# two LANES run side by side. The plan's length is SERIAL + the longer lane.
declare -A CAP=(
  [env]=15 [build]=190 [has-cuda]=20 [codec-cast-tests]=50
  [codec-bench]=40 [linear-bench]=45 [comm-bench]=40 [model]=10
  [cuda-streams]=30 [cuda-backend]=45 [cuda-eager-init]=25 [cuda-multirank]=40
  [memcheck]=75 [racecheck]=45
)
SERIAL=(env build has-cuda codec-cast-tests codec-bench linear-bench comm-bench model)
TESTS_LANE=(cuda-streams cuda-backend cuda-eager-init cuda-multirank)
SANITIZER_LANE=(memcheck racecheck)
# What comes back in $OUT besides the summary and the logs tarball.
RESULTS=(codec.json linear.json comm-1rank.json model.json)
# The CUDA test files; each is run by exactly one test step above.
CODEC_CAST_TESTS=(tests/codec/test_codec_cuda.py tests/nn/test_fused_cast_cuda.py)
GEMM_TESTS=(tests/nn/test_linear_cuda.py)
SHARED_MEMORY_TESTS=(tests/nn/test_fused_cast_cuda.py)

sum_caps() {
  local total=0 name
  for name in "$@"; do total=$((total + CAP[$name])); done
  echo "$total"
}
PLAN_SERIAL=$(sum_caps "${SERIAL[@]}")
PLAN_TESTS=$(sum_caps "${TESTS_LANE[@]}")
PLAN_SANITIZERS=$(sum_caps "${SANITIZER_LANE[@]}")
PLAN_TOTAL=$((PLAN_SERIAL + (PLAN_TESTS > PLAN_SANITIZERS ? PLAN_TESTS : PLAN_SANITIZERS) + RESERVE_S))

if [[ $MODE == selftest* ]]; then
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
if [ "$MODE" = session ]; then PREFIX="$DAY-gpu-session-$GPU"; else PREFIX="$DAY-gpu-session-$MODE-$GPU"; fi

STEPS=()     # step names, in the order they were started
BG_PIDS=()   # steps running in the background
BG_STEPS=()
TABLES=()    # "STEP LINES": benchmark logs whose tail is printed before the summary

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

passed() {  # passed NAME...: every step PASS (or DRY in a dry run)
  local name s
  for name in "$@"; do
    s=$(status_of "$name")
    [ "$s" = PASS ] || [ "$s" = DRY ] || return 1
  done
}

register() { STEPS+=("$1"); }

# exec_step NAME CMD...: runs CMD with stdout and stderr in $LOGS/NAME.log
# under the step's cap, or less if the budget has less left. Sets STEP_RC
# (CMD's status; 124/137 on a timeout; "no-time" if it was not started),
# STEP_LIMIT and STEP_SECS. Returns 0.
exec_step() {
  local name=$1 limit=${CAP[$1]} left t0
  shift
  STEP_SECS=0
  left=$((DEADLINE - $(date +%s) - RESERVE_S))
  if [ "$left" -lt 5 ]; then
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
  timeout --kill-after=10 "$limit" "$@" >"$LOGS/$name.log" 2>&1 </dev/null || STEP_RC=$?
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

# cmd_step NAME CMD...: a plain command.
cmd_step() {
  local name=$1
  shift
  register "$name"
  exec_step "$name" "$@"
  if record_unfinished "$name"; then
    [ "$STEP_RC" = dry ] || show_log_tail "$name" 30
  elif [ "$STEP_RC" = 0 ]; then
    record "$name" PASS "$STEP_SECS" ""
  else
    show_log_tail "$name" 30
    record "$name" FAIL "$STEP_SECS" "exit $STEP_RC"
  fi
}

# bench_step NAME TABLE_LINES CMD...: a benchmark; the last TABLE_LINES of its
# log (its table) are printed again before the summary.
bench_step() {
  local name=$1 lines=$2
  shift 2
  cmd_step "$name" "$@"
  TABLES+=("$name $lines")
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
    grep -E '^(FAILED|ERROR) ' "$LOGS/$name.log" 2>/dev/null | head -15 | sed 's/^/   | /' || true
    show_log_tail "$name" 15
    record "$name" FAIL "$STEP_SECS" "exit $STEP_RC: $summary"
  elif [ -z "$counts" ]; then
    show_log_tail "$name" 20
    record "$name" FAIL "$STEP_SECS" "no junit XML written"
  elif [ $((tests - skipped)) -le 0 ]; then
    show_log_tail "$name" 20
    record "$name" FAIL "$STEP_SECS" "no test ran ($summary)"
  else
    record "$name" PASS "$STEP_SECS" "$summary"
  fi
}

# pytest_step NAME PYTEST_ARGS...
pytest_step() {
  local name=$1
  shift
  register "$name"
  exec_step "$name" python3 -m pytest -q -p no:cacheprovider -rfEs --junitxml="$LOGS/$name.xml" "$@"
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

# sanitizer_step TOOL PYTEST_ARGS...: pytest under compute-sanitizer,
# checking the fp8comm kernels only (the others run uninstrumented). Its
# reports go to $LOGS/TOOL-report.log: on stdout pytest would capture them.
sanitizer_step() {
  local tool=$1 san report unsupported
  shift
  report="$LOGS/$tool-report.log"
  register "$tool"
  if ! san=$(find_sanitizer); then
    record "$tool" SKIP 0 \
      "compute-sanitizer not found (PATH, \$CUDA_HOME/bin, \$CUDA_PATH/bin, /usr/local/cuda/bin): $tool not run"
    return 0
  fi
  # No caching allocator under memcheck, so an access past a tensor's end is
  # outside any allocation rather than inside a cached block.
  exec_step "$tool" env PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
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

# lane_bg FUNCTION STEP...: runs FUNCTION (which runs STEP... one after the
# other) in the background; its output is printed when join_bg collects it.
lane_bg() {
  local fn=$1 name
  shift
  for name in "$@"; do register "$name"; done  # here: the subshell's own registrations are lost with it
  ("$fn") >"$WORK/$fn.report" 2>&1 &
  BG_PIDS+=("$!")
  BG_STEPS+=("$fn")
  log "$fn ($*) started"
}

join_bg() {
  local i
  for i in "${!BG_PIDS[@]}"; do
    wait "${BG_PIDS[$i]}" || true
    echo "== ${BG_STEPS[$i]}:"
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
print_tables() {
  local entry name lines
  for entry in "${TABLES[@]}"; do
    read -r name lines <<<"$entry"
    if [ "$(status_of "$name")" = PASS ] && [ -f "$LOGS/$name.log" ]; then
      echo "== table: $name"
      tail -n "$lines" "$LOGS/$name.log"
    fi
  done
}

finish() {
  local rc=$? name status secs detail failed=() skipped=() line final
  trap - EXIT ERR
  set +e
  join_bg
  print_tables
  {
    echo "== summary: $MODE on $GPU ($MACHINE), $DAY, $(($(date +%s) - START)) s of a ${BUDGET} s budget"
    for name in "${STEPS[@]}"; do
      if [ -f "$WORK/$name.status" ]; then
        IFS=$'\t' read -r status secs detail <"$WORK/$name.status"
      else
        status=FAIL secs=0 detail="no result recorded (the script stopped before it finished)"
      fi
      printf '%-8s %-18s %5s s  %s\n' "$status" "$name" "$secs" "$detail"
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
    for name in "${RESULTS[@]}"; do
      if [ -f "$OUT/$name" ]; then echo "== result: $OUT/$name"; fi
    done
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

# ---------------------------------------------------------------- the session
write_helpers() {
  cat >"$WORK/env.sh" <<'SH'
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv || echo "nvidia-smi failed"
python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "gpu visible", torch.cuda.is_available())'
python3 -c 'import setuptools; print("setuptools", setuptools.__version__)'
if command -v nvcc >/dev/null; then nvcc --version | tail -2; else echo "nvcc not on PATH"; fi
echo "compute-sanitizer: $(command -v compute-sanitizer || echo 'not on PATH')"
echo "cores: $(nproc)"
python3 -c 'import torch; assert torch.cuda.is_available(), "torch sees no GPU"'
SH
  cat >"$WORK/has_cuda.py" <<'PY'
import torch

import fp8comm

assert torch.cuda.is_available(), "torch sees no GPU"
assert fp8comm._C.has_cuda, "fp8comm was built without CUDA: see the 'fp8comm setup:' lines of build.log"
print("fp8comm with CUDA on", torch.cuda.get_device_name())
PY
}

build_step() {
  register build
  exec_step build env TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS="$CORES" \
    python3 -m pip install -v --no-build-isolation --no-deps -e .
  if record_unfinished build; then
    [ "$STEP_RC" = dry ] || grep -m 20 -E 'error:|error [A-Z]+[0-9]+|FAILED:' "$LOGS/build.log" | sed 's/^/   | /' || true
    return 0
  fi
  # setup.py's plan, and its warning if it built without CUDA (pip -v keeps them in build.log)
  grep -h "fp8comm setup:" "$LOGS/build.log" 2>/dev/null | sed 's/^/   | /' || true
  if [ "$STEP_RC" = 0 ]; then
    record build PASS "$STEP_SECS" ""
  else
    # the first compiler errors, not pip's tail
    grep -m 20 -E 'error:|error [A-Z]+[0-9]+|FAILED:' "$LOGS/build.log" | sed 's/^/   | /' || show_log_tail build 30
    record build FAIL "$STEP_SECS" "exit $STEP_RC"
  fi
}

tests_lane() {
  pytest_step cuda-streams tests/backend/test_cuda_streams.py
  pytest_step cuda-backend -m "not soak" tests/backend/test_backend_cuda.py
  # its own process: a world eagerly connected to NCCL, split, then destroyed
  pytest_step cuda-eager-init tests/backend/test_eager_init_cuda.py
  pytest_step cuda-multirank tests/backend/test_cuda_multirank.py
}

sanitizer_lane() {
  # torch.compile's compilation adds minutes under a sanitizer and no kernels of
  # ours that the other tests do not run, so the sanitizers leave it out.
  sanitizer_step memcheck "${CODEC_CAST_TESTS[@]}" -k "not compile"
  sanitizer_step racecheck "${SHARED_MEMORY_TESTS[@]}" -k "not compile"
}

session() {
  write_helpers
  cmd_step env bash "$WORK/env.sh"
  show_log_tail env 12
  build_step
  if passed build; then
    cmd_step has-cuda python3 "$WORK/has_cuda.py"
  else
    not_run "needs the build" has-cuda
  fi
  if ! passed build has-cuda; then
    not_run "needs a CUDA build of fp8comm (build or has-cuda failed)" \
      "${SERIAL[@]:3}" "${TESTS_LANE[@]}" "${SANITIZER_LANE[@]}"
    return 0
  fi
  pytest_step codec-cast-tests "${CODEC_CAST_TESTS[@]}" "${GEMM_TESTS[@]}"
  bench_step codec-bench 48 python3 bench/codec.py --device cuda --sizes 1M,16M,64M,256M --wire-format e4m3,mxfp4 --json "$OUT/codec.json"
  bench_step linear-bench 30 python3 bench/linear.py --reps 10 --casts --json "$OUT/linear.json"
  bench_step comm-bench 50 torchrun --nproc_per_node=1 -m fp8comm.bench.comm --max-bytes 256M --reps 10 \
    --json "$OUT/comm-1rank.json"
  if passed codec-bench; then
    bench_step model 30 python3 bench/model.py --codec-json "$OUT/codec.json" --json "$OUT/model.json"
  else
    not_run "needs the codec bench's JSON" model
  fi
  lane_bg tests_lane "${TESTS_LANE[@]}"
  lane_bg sanitizer_lane "${SANITIZER_LANE[@]}"
  join_bg
}

# Steps that exercise the runner itself without a GPU: a lane of a passing
# pytest run (failing in `selftest`) beside the main line; in `selftest` also a
# failing run, one whose only test skips, a command that runs past its
# timeout; a passing pytest run under compute-sanitizer (a SKIP when none is
# found; tests/tools/test_gpu_session_script.py puts a stand-in on PATH); and a
# step after them all, which must still run.
selftest_lane() {
  local dir="$WORK/selftest" background=test_pass.py
  if [ "$MODE" = selftest ]; then background=test_fail.py; fi
  pytest_step selftest-background --rootdir="$dir" -c "$dir/pytest.ini" "$dir/$background"
}

selftest() {
  local dir="$WORK/selftest"
  mkdir -p "$dir"
  printf '[pytest]\n' >"$dir/pytest.ini"
  printf 'def test_passes():\n    assert 1 + 1 == 2\n' >"$dir/test_pass.py"
  printf 'def test_fails():\n    assert 1 + 1 == 3\n' >"$dir/test_fail.py"
  printf 'import pytest\n\n\ndef test_skips():\n    pytest.skip("needs a GPU")\n' >"$dir/test_skip.py"
  local cfg=(--rootdir="$dir" -c "$dir/pytest.ini")
  CAP+=([selftest-background]=120 [selftest-pass]=120 [selftest-fail]=120 [selftest-all-skipped]=120
    [selftest-timeout]=1 [selftest-after]=30 [memcheck]=120)
  lane_bg selftest_lane selftest-background
  pytest_step selftest-pass "${cfg[@]}" "$dir/test_pass.py"
  if [ "$MODE" = selftest ]; then
    pytest_step selftest-fail "${cfg[@]}" "$dir/test_fail.py"
    pytest_step selftest-all-skipped "${cfg[@]}" "$dir/test_skip.py"
    cmd_step selftest-timeout sleep 30
  fi
  sanitizer_step memcheck "${cfg[@]}" "$dir/test_pass.py"
  cmd_step selftest-after true
  join_bg
}

log "$MODE on $GPU ($MACHINE); results in $OUT"
if [ "$MODE" = session ]; then
  log "plan: serial ${PLAN_SERIAL} s + lanes max(tests ${PLAN_TESTS} s, sanitizers ${PLAN_SANITIZERS} s)" \
    "+ reserve ${RESERVE_S} s = ${PLAN_TOTAL} s of a ${BUDGET} s budget"
  log "results: ${RESULTS[*]} (+ the summary and the logs tarball)"
  if [ "$PLAN_TOTAL" -gt "$BUDGET" ]; then
    echo "== the caps add up to ${PLAN_TOTAL} s, more than the ${BUDGET} s budget: shorten a step's cap" >&2
    exit 2
  fi
  session
else
  selftest
fi
