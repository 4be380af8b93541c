#!/usr/bin/env bash
# Everything a GPU session owes, in ONE device call:
#   run(command="bash bench/gpu_session.sh", timeout_s=600)
# With less device time left (status's budget_left_s, known before the call),
# give the script what the command will really get, and the call a little more:
#   run(command="FP8COMM_GPU_SESSION_BUDGET_S=B bash bench/gpu_session.sh", timeout_s=B+30)
# where B is budget_left_s less the machine's start when none is warm, at most 560 (README,
# "On a lent GPU"). A budget below the plan drops steps, lowest value first
# (DROP_ORDER), then scales the caps of the steps after the build to fit.
#
# The steps, in the order of evidence per second (each under its own cap):
#   env            one Python process: GPU and compute mode, Python.h, c++/gcc, ninja, nvcc,
#                  libcudart, setuptools, site-packages, compute-sanitizer, torch; fails naming what is missing
#   build          `setup.py build_ext --inplace` for sm_90 (no pip, no index, nothing written
#                  outside the tree), judged by the extension importing from the tree with has_cuda;
#                  on failure the first compiler errors, then nvcc-check (the kernels compiled without
#                  torch, as .ci/nvcc_check does), since a .cpp error stops ninja before any .cu
#   codec-cast-tests  the bit-for-bit CUDA codec and cast tests, and Fp8Linear's GEMMs (named files)
#   codec-bench    quantize / dequantize GB/s (every wire format, and stochastic rounding) against a
#                  device-to-device copy of the same bytes
#   linear-bench   Llama-8B shapes: BF16, FP8 with eager casts, FP8 with the fused casts
#   comm-bench     fp8nccl against nccl at world size 1, up to 256 MiB, rows written as they finish
#   model          the performance model fed with the measured E4M3 codec figures (modeled)
# then three lanes side by side, after the benchmarks so that none disturbs them:
#   tests          cuda-streams (no host syncs, CUDA graph), cuda-backend (fp8nccl at world
#                  size 1), cuda-eager-init (real NCCL)
#   multirank      cuda-multirank (2-4 ranks, gloo transport)
#   sanitizers     memcheck and racecheck over a subset (MEMCHECK_K, RACECHECK_K)
# Every pytest step runs verbose with a per-test timeout and a results log written test
# by test (bench/gpu_session/gpu_session_guard.py), so a step cut at its cap still says
# what passed and which test was running; a sanitizer step cut at its cap keeps the
# errors it had found.
#
# Results come back flat in $OUT (the device tool returns at most 8 files, at most
# two folders down): the summary, one tarball of logs, and one JSON per benchmark.
# The summary and the tarball are rewritten after every step, so a command killed
# at any moment leaves a readable summary (RUNNING: the step it was in; PENDING:
# not started); the logs themselves stay outside $OUT. Every benchmark table is
# printed again just before the final summary, which is last.
# Copy the JSONs to bench/results/$MACHINE/ (model.json to
# bench/results/modeled/model-$MACHINE.json) and commit them with this command.
#
#   bash bench/gpu_session.sh [selftest | selftest-pass]
# selftest, selftest-pass: no GPU needed; deliberately failing / passing steps
# through the same step runner (tests/tools/test_gpu_session_script.py).
# FP8COMM_GPU_SESSION_DRYRUN=1 prints the plan and each step's command instead
# of running it. FP8COMM_GPU_SESSION_BUDGET_S (default 560) is the script's own
# clock: each step's cap is also cut to what is left, so the summary always comes back.
# FP8COMM_GPU_SESSION_CAPS="STEP=S,..." sets steps' caps (before the budget is fitted).
# For the self-tests only: FP8COMM_GPU_SESSION_SNAPSHOTS=DIR copies $OUT there after
# each step; FP8COMM_GPU_SESSION_KILL_AFTER=STEP kills the script's process group
# (SIGKILL) right after STEP, as a device call's limit would.
set -Eeuo pipefail
trap 'echo "== gpu_session.sh line $LINENO: command failed (exit $?)" >&2' ERR
cd "$(dirname "$0")/.."
ROOT=$PWD

MODE=${1:-session}
case "$MODE" in
  session | selftest | selftest-pass) ;;
  *)
    echo "usage: bash bench/gpu_session.sh [selftest|selftest-pass]" >&2
    exit 2
    ;;
esac
BUDGET=${FP8COMM_GPU_SESSION_BUDGET_S:-560}
if ! [[ $BUDGET =~ ^[0-9]+$ ]]; then
  echo "usage: FP8COMM_GPU_SESSION_BUDGET_S is whole seconds, not '$BUDGET'" >&2
  exit 2
fi

OUT=${OUT:-/tmp/fp8comm-gpu}
mkdir -p "$OUT"
rm -rf "$OUT/logs"  # an older layout's
WORK=$(mktemp -d)
LOGS="$WORK/logs"   # archived into $OUT after every step: $OUT never holds more than 8 files
mkdir -p "$LOGS"
touch "$WORK/steps"
CORES=$(nproc)
# No package index on the device machine, and nothing that pip would wait for.
export PYTHONUNBUFFERED=1 PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# The in-tree package (bench/*.py puts bench/ first on sys.path) and the pytest plugin.
export PYTHONPATH="$ROOT:$ROOT/bench/gpu_session${PYTHONPATH:+:$PYTHONPATH}"
DAY=$(date +%F)
START=$(date +%s)
DEADLINE=$((START + BUDGET))
RESERVE_S=10   # kept back for the tables, the summary and the log archive
DRYRUN=${FP8COMM_GPU_SESSION_DRYRUN:-0}
SNAPSHOTS=${FP8COMM_GPU_SESSION_SNAPSHOTS:-}
KILL_AFTER=${FP8COMM_GPU_SESSION_KILL_AFTER:-}
CAP_OVERRIDES=${FP8COMM_GPU_SESSION_CAPS:-}
SANITIZER_ERROR_RC=86
HAVE_FLOCK=0
if command -v flock >/dev/null; then HAVE_FLOCK=1; fi

# Each step's cap in seconds. SERIAL runs first, one step at a time; then the
# LANES run side by side. The plan's length is SERIAL + the longest lane.
declare -A CAP=(
  [env]=40 [build]=150 [codec-cast-tests]=80
  [codec-bench]=35 [linear-bench]=30 [comm-bench]=30 [model]=10
  [cuda-streams]=35 [cuda-backend]=55 [cuda-eager-init]=30
  [cuda-multirank]=130
  [memcheck]=85 [racecheck]=70
  [nvcc-check]=60  # only in place of the steps a failed build leaves out: not in the plan
)
SERIAL=(env build codec-cast-tests codec-bench linear-bench comm-bench model)
LANES=(tests multirank sanitizers)
declare -A LANE_STEPS=(
  [tests]="cuda-streams cuda-backend cuda-eager-init"
  [multirank]="cuda-multirank"
  [sanitizers]="memcheck racecheck"
)
# Never scaled: a cold start and a compile take what they take.
FIXED=(env build)
# A budget below the plan drops steps in this order, lowest value first (the
# build and codec-cast-tests never), until the other caps need scaling by no
# less than SCALE_MIN percent.
DROP_ORDER=(racecheck comm-bench cuda-eager-init linear-bench memcheck cuda-multirank model cuda-backend
  cuda-streams codec-bench)
SCALE_MIN=75
# What comes back in $OUT besides the summary and the logs tarball.
RESULTS=(codec.json linear.json comm-1rank.json model.json)
# The CUDA test files; each is run by exactly one test step above.
CODEC_CAST_TESTS=(tests/codec/test_codec_cuda.py tests/nn/test_fused_cast_cuda.py)
GEMM_TESTS=(tests/nn/test_linear_cuda.py)
SHARED_MEMORY_TESTS=(tests/nn/test_fused_cast_cuda.py)
# The sanitizers' subset (of some 900 codec and cast cases): no torch.compile (minutes
# of compiling, no kernel of ours the rest does not run), no hypothesis; float16 left
# out (bfloat16's 2-byte paths), e5m2 and the casts' second FP8 dtype (e4m3's paths
# with another table), and for memcheck the 1M-element cases (the tails are in the
# small sizes). Each test's time is in the results log, to size these from.
# Racecheck leaves out Fp8Linear's tests: it stops on a hardware exception in
# cuBLASLt's FP8 GEMM (though it checks only our kernels), and their casts are
# the kernels the other cast tests run.
MEMCHECK_K="not compile and not hypothesis and not dtype2 and not e5m2 and not fp8_dtype1 and not 1048576 and not 1048583"
RACECHECK_K="not compile and not dtype2 and not fp8_dtype1 and not fp8_linear"

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

BG_PIDS=()   # lanes running in the background
BG_STEPS=()
TABLES=()    # "STEP<TAB>LINES<TAB>REGEX": benchmark tables printed again before the summary
DROPPED=()
SCALE=100
PLAN_LINE=""
SIGNALED=""

log() { echo "== $(date +%T) $*"; }

# ---------------------------------------------------------------- the plan
apply_cap_overrides() {
  local entry
  for entry in ${CAP_OVERRIDES//,/ }; do
    if ! [[ $entry =~ ^[A-Za-z0-9-]+=[0-9]+$ ]] || [ -z "${CAP[${entry%%=*}]:-}" ]; then
      echo "usage: FP8COMM_GPU_SESSION_CAPS is STEP=SECONDS,... of known steps, not '$entry'" >&2
      exit 2
    fi
    CAP[${entry%%=*}]=${entry#*=}
  done
}

kept() { [ "$(status_of "$1")" != DROPPED ] && ! [[ " ${DROPPED[*]} " == *" $1 "* ]]; }

sum_kept() {
  local total=0 name
  for name in "$@"; do
    if kept "$name"; then total=$((total + CAP[$name])); fi
  done
  echo "$total"
}

lane_length() {
  local steps
  read -r -a steps <<<"${LANE_STEPS[$1]}"
  sum_kept "${steps[@]}"
}

plan_total() {
  local longest=0 lane len
  for lane in "${LANES[@]}"; do
    len=$(lane_length "$lane")
    if [ "$len" -gt "$longest" ]; then longest=$len; fi
  done
  echo $(($(sum_kept "${SERIAL[@]}") + longest + RESERVE_S))
}

# Drops steps in DROP_ORDER until the caps after the build need scaling by no
# less than SCALE_MIN percent, then scales them (never above their own).
fit_budget() {
  local fixed scalable avail name
  fixed=$(sum_kept "${FIXED[@]}")
  for name in "${DROP_ORDER[@]}" ""; do
    scalable=$(($(plan_total) - RESERVE_S - fixed))
    avail=$((BUDGET - RESERVE_S - fixed))
    if [ "$scalable" -le "$avail" ]; then
      SCALE=100
      break
    fi
    SCALE=0
    if [ "$avail" -gt 0 ]; then SCALE=$((avail * 100 / scalable)); fi
    if [ "$SCALE" -ge "$SCALE_MIN" ] || [ -z "$name" ]; then break; fi
    DROPPED+=("$name")
  done
  if [ "$SCALE" -lt 100 ]; then
    for name in "${!CAP[@]}"; do
      if [[ " ${FIXED[*]} nvcc-check " != *" $name "* ]]; then
        CAP[$name]=$((CAP[$name] * SCALE / 100))
        if [ "${CAP[$name]}" -lt 5 ]; then CAP[$name]=5; fi
      fi
    done
  fi
}

plan_summary() {
  local lanes="" lane
  for lane in "${LANES[@]}"; do lanes+="${lanes:+, }$lane $(lane_length "$lane") s"; done
  echo "serial $(sum_kept "${SERIAL[@]}") s + lanes max($lanes) + reserve ${RESERVE_S} s" \
    "= $(plan_total) s of a ${BUDGET} s budget"
}

# ---------------------------------------------------------------- step runner
# A step's result is a line in $WORK/NAME.status: STATUS<TAB>SECONDS<TAB>DETAIL.
# STATUS: PASS; FAIL (fails the command); SKIP (a tool this machine lacks);
# NOT-RUN (a step it needs failed, which already fails the command); DROPPED
# (left out to fit the budget); DRY; RUNNING (started, no result yet).
# $WORK/steps lists the steps in the summary's order.
register() {  # register NAME [AFTER]: adds NAME to the summary (after AFTER), once
  touch "$WORK/steps"
  if grep -qxF "$1" "$WORK/steps"; then return 0; fi
  if [ -n "${2:-}" ] && grep -qxF "$2" "$WORK/steps"; then
    awk -v after="$2" -v name="$1" '{ print } $0 == after { print name }' "$WORK/steps" >"$WORK/steps.tmp"
    mv "$WORK/steps.tmp" "$WORK/steps"
  else
    echo "$1" >>"$WORK/steps"
  fi
}

record() {
  # written aside, then renamed: a summary written meanwhile reads the old line or the new
  printf '%s\t%s\t%s\n' "$2" "$3" "$4" >"$WORK/$1.status.$BASHPID"
  mv -f "$WORK/$1.status.$BASHPID" "$WORK/$1.status"
  if [ "$2" = PASS ] || [ "$2" = DRY ]; then
    log "$2 $1 ($3 s) $4"
  elif [ "$2" != RUNNING ]; then
    log "$2 $1 ($3 s): $4"
  fi
  write_outputs 0 "$1-$2"
  if [ "$2" != RUNNING ] && [ "$1" = "$KILL_AFTER" ]; then
    log "FP8COMM_GPU_SESSION_KILL_AFTER=$1: killing the script's process group"
    kill -KILL 0
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

# begin_step NAME: registers NAME; returns 1 if it was dropped to fit the budget.
begin_step() {
  register "$1"
  [ "$(status_of "$1")" != DROPPED ]
}

# limit_of NAME: the step's cap, or what the budget has left if less; 0 if too little is left.
limit_of() {
  local limit=${CAP[$1]} left
  left=$((DEADLINE - $(date +%s) - RESERVE_S))
  if [ "$left" -lt 5 ]; then
    echo 0
  elif [ "$limit" -gt "$left" ]; then
    echo "$left"
  else
    echo "$limit"
  fi
}

# exec_step NAME CMD...: runs CMD with stdout and stderr in $LOGS/NAME.log
# under limit_of NAME. Sets STEP_RC (CMD's status; 124/137 on a timeout;
# "no-time" if it was not started; "dry"), STEP_LIMIT and STEP_SECS. Returns 0.
exec_step() {
  local name=$1 t0
  shift
  STEP_SECS=0
  STEP_LIMIT=$(limit_of "$name")
  if [ "$STEP_LIMIT" = 0 ]; then
    STEP_RC=no-time
    return 0
  fi
  log "$name (limit ${STEP_LIMIT} s): $*"
  if [ "$DRYRUN" = 1 ]; then
    STEP_RC=dry
    return 0
  fi
  record "$name" RUNNING 0 "started at $(($(date +%s) - START)) s, limit ${STEP_LIMIT} s: no result yet"
  t0=$(date +%s)
  STEP_RC=0
  # timeout signals the whole process group: pytest's spawned ranks and torchrun's workers too.
  timeout --kill-after=5 "$STEP_LIMIT" "$@" >"$LOGS/$name.log" 2>&1 </dev/null || STEP_RC=$?
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
  begin_step "$name" || return 0
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

# bench_step NAME TABLE_LINES TABLE_REGEX CMD...: a benchmark; the lines matching
# TABLE_REGEX among the last TABLE_LINES of its log (its table) are printed
# again before the summary.
bench_step() {
  local name=$1 lines=$2 regex=$3
  shift 3
  cmd_step "$name" "$@"
  TABLES+=("$name"$'\t'"$lines"$'\t'"$regex")
}

# pytest_counts NAME: "passed failed errors skipped" from the results log, or nothing.
pytest_counts() {
  [ -f "$LOGS/$1.results" ] || return 0
  awk -F'\t' '$1 == "PASSED" { p++ } $1 == "FAILED" { f++ } $1 == "ERROR" { e++ }
    $1 == "SKIPPED" || $1 == "XFAIL" { s++ } END { print p + 0, f + 0, e + 0, s + 0 }' "$LOGS/$1.results"
}

# pytest_running NAME: the test that had started and not ended (a run cut short).
pytest_running() {
  [ -f "$LOGS/$1.results" ] || return 0
  awk -F'\t' '$1 == "START" { open[$2] = NR; last = $2; next }
    NF >= 3 { delete open[$3] } END { if (last in open) print last }' "$LOGS/$1.results"
}

pytest_slowest() {  # pytest_slowest NAME: the longest test's seconds and name
  [ -f "$LOGS/$1.results" ] || return 0
  awk -F'\t' '$1 != "START" && NF >= 3 && $2 + 0 >= max { max = $2 + 0; name = $3 }
    END { if (max >= 1) printf "%.1f s %s\n", max, name }' "$LOGS/$1.results"
}

# Records a pytest run from its exit status and its results log. A run in
# which no test ran (all skipped, none collected) fails: on a GPU machine that
# means the CUDA tests did not run at all.
record_pytest() {
  local name=$1 counts passed=0 failed=0 errors=0 skipped=0 summary running slowest
  counts=$(pytest_counts "$name")
  if [ -n "$counts" ]; then read -r passed failed errors skipped <<<"$counts"; fi
  summary="$passed passed, $failed failed, $errors errors, $skipped skipped"
  slowest=$(pytest_slowest "$name")
  if [ -n "$slowest" ]; then slowest="; slowest ${slowest%% *} s"; fi
  case "$STEP_RC" in
    124 | 137)
      running=$(pytest_running "$name")
      grep -E '^(FAILED|ERROR)' "$LOGS/$name.results" 2>/dev/null | head -15 | sed 's/^/   | /' || true
      show_log_tail "$name" 15
      record "$name" FAIL "$STEP_SECS" \
        "timed out after ${STEP_LIMIT} s: $summary${running:+; running: $running}$slowest"
      ;;
    0)
      if [ -z "$counts" ]; then
        show_log_tail "$name" 20
        record "$name" FAIL "$STEP_SECS" "no results log written"
      elif [ $((passed + failed + errors)) -le 0 ]; then
        show_log_tail "$name" 20
        record "$name" FAIL "$STEP_SECS" "no test ran ($summary)"
      else
        record "$name" PASS "$STEP_SECS" "$summary$slowest"
      fi
      ;;
    *)
      running=$(pytest_running "$name")
      grep -E '^(FAILED|ERROR)' "$LOGS/$name.results" 2>/dev/null | head -15 | sed 's/^/   | /' || true
      show_log_tail "$name" 15
      record "$name" FAIL "$STEP_SECS" "exit $STEP_RC: $summary${running:+; ended during: $running}$slowest"
      ;;
  esac
}

# pytest_args NAME: the options every pytest step runs with: verbose progress
# in the log, a per-test timeout (half the step's limit, or TEST_TIMEOUT[NAME]),
# the results log and the junit XML.
declare -A TEST_TIMEOUT=()
TEST_TIMEOUT_GRACE=10
pytest_args() {
  local name=$1 limit per_test
  limit=$(limit_of "$name")
  per_test=${TEST_TIMEOUT[$name]:-$((limit / 2 > 10 ? limit / 2 : 10))}
  PYTEST_ARGS=(-m pytest -v -p no:cacheprovider -p gpu_session_guard --results-log="$LOGS/$name.results"
    --test-timeout="$per_test" --test-timeout-grace="$TEST_TIMEOUT_GRACE" --durations=10 -rfEs
    --junitxml="$LOGS/$name.xml")
  # On the GPU: every case of both tiers (a GPU is rare), in this process (one
  # GPU; the results log is this process's), not pyproject's xdist workers.
  if [ "$MODE" = session ]; then PYTEST_ARGS+=(--tier all -n 0); fi
}

# pytest_step NAME PYTEST_ARGS...
pytest_step() {
  local name=$1
  shift
  begin_step "$name" || return 0
  pytest_args "$name"
  exec_step "$name" python3 "${PYTEST_ARGS[@]}" "$@"
  case "$STEP_RC" in
    dry | no-time) record_unfinished "$name" ;;
    *) record_pytest "$name" ;;
  esac
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

# The errors in a compute-sanitizer report: its headline lines, not their
# stack frames (indented) nor its banner and summaries.
sanitizer_errors() {
  grep -E '^=+ [^ ]' "$1" 2>/dev/null |
    grep -vE 'COMPUTE-SANITIZER|ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY|Target application returned|[Nn]ot supported' ||
    true
}

# sanitizer_step TOOL PYTEST_ARGS...: pytest under compute-sanitizer,
# checking the fp8comm kernels only (the others run uninstrumented). Its
# reports go to $LOGS/TOOL-report.log: on stdout pytest would capture them.
sanitizer_step() {
  local tool=$1 san report unsupported errors found
  shift
  report="$LOGS/$tool-report.log"
  begin_step "$tool" || return 0
  if ! san=$(find_sanitizer); then
    record "$tool" SKIP 0 \
      "compute-sanitizer not found (PATH, \$CUDA_HOME/bin, \$CUDA_PATH/bin, /usr/local/cuda/bin): $tool not run"
    return 0
  fi
  pytest_args "$tool"
  # No caching allocator under memcheck, so an access past a tensor's end is
  # outside any allocation rather than inside a cached block.
  exec_step "$tool" env PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
    "$san" --tool "$tool" --error-exitcode "$SANITIZER_ERROR_RC" --kernel-name kns=fp8comm --log-file "$report" \
    python3 "${PYTEST_ARGS[@]}" "$@"
  case "$STEP_RC" in dry | no-time)
    record_unfinished "$tool"
    return 0
    ;;
  esac
  errors=$(sanitizer_errors "$report")
  unsupported=$(cat "$report" "$LOGS/$tool.log" 2>/dev/null | grep -m1 -E '^=+ .*[Nn]ot supported' || true)
  if [ "$STEP_RC" != 0 ] && [ -n "$unsupported" ]; then
    record "$tool" SKIP "$STEP_SECS" "compute-sanitizer cannot run on this machine: $unsupported"
  elif [ "$STEP_RC" = "$SANITIZER_ERROR_RC" ] || { [ -n "$errors" ] && [[ $STEP_RC =~ ^(124|137)$ ]]; }; then
    # also after a timeout: the errors found before it are kept
    printf '%s\n' "$errors" | head -40 | sed 's/^/   | /'
    found=$(grep -m1 'ERROR SUMMARY' "$report" 2>/dev/null || printf '%s\n' "$errors" | head -1)
    if [ "$STEP_RC" != "$SANITIZER_ERROR_RC" ]; then
      record "$tool" FAIL "$STEP_SECS" \
        "timed out after ${STEP_LIMIT} s; compute-sanitizer had found $(printf '%s\n' "$errors" | grep -c .) errors: $found"
    else
      record "$tool" FAIL "$STEP_SECS" "compute-sanitizer found errors: $found"
    fi
  else
    record_pytest "$tool"
    if [ "$(status_of "$tool")" = PASS ]; then
      log "   $tool: $(grep -m1 'ERROR SUMMARY' "$report" 2>/dev/null || echo 'no ERROR SUMMARY line')"
    fi
  fi
}

# build_step NAME BUILD_CMD... -- CHECK_CMD...: the build, judged by CHECK_CMD
# (the extension imports from the tree with has_cuda) rather than BUILD_CMD's
# status: an extension built and importable counts even if BUILD_CMD failed
# after writing it.
build_step() {
  local name=$1 verdict
  shift
  begin_step "$name" || return 0
  exec_step "$name" bash "$WORK/build.sh" "$@"
  if record_unfinished "$name"; then
    [ "$STEP_RC" = dry ] || grep -m 20 -E 'error:|error [A-Z]+[0-9]+|FAILED:' "$LOGS/$name.log" | sed 's/^/   | /' || true
    return 0
  fi
  # setup.py's plan, and its warning if it built without CUDA
  grep -h "fp8comm setup:" "$LOGS/$name.log" 2>/dev/null | sed 's/^/   | /' || true
  verdict=$(grep '^== build: ' "$LOGS/$name.log" | tail -n 1 | sed 's/^== build: //' || true)
  if [ "$STEP_RC" = 0 ]; then
    tail -n 1 "$LOGS/$name.log" | sed 's/^/   | /'
    if [[ $verdict != "counted as built"* ]]; then verdict=""; fi
    record "$name" PASS "$STEP_SECS" "$verdict"
  else
    # the first compiler errors, not the build's tail
    grep -m 20 -E 'error:|error [A-Z]+[0-9]+|FAILED:' "$LOGS/$name.log" | sed 's/^/   | /' || show_log_tail "$name" 30
    record "$name" FAIL "$STEP_SECS" "exit $STEP_RC: $verdict"
  fi
}

# kernels_step NAME AFTER TOOL CMD...: after a failed build, the CUDA sources
# compiled without torch (a .cpp error stops ninja before any .cu compiles),
# shown right after the build in the summary; a SKIP without TOOL.
kernels_step() {
  local name=$1 after=$2 tool=$3
  shift 3
  register "$name" "$after"
  if ! command -v "$tool" >/dev/null; then
    record "$name" SKIP 0 "$tool not found: the kernels' compile status is unknown"
    return 0
  fi
  cmd_step "$name" "$@"
}

# env_step NAME CMD...: the environment check; its findings are printed whole.
env_step() {
  local name=$1
  shift
  begin_step "$name" || return 0
  exec_step "$name" "$@"
  if record_unfinished "$name"; then
    [ "$STEP_RC" = dry ] || show_log_tail "$name" 40
    return 0
  fi
  show_log_tail "$name" 40
  if [ "$STEP_RC" = 0 ]; then
    record "$name" PASS "$STEP_SECS" ""
  else
    record "$name" FAIL "$STEP_SECS" \
      "$(grep -m1 '^env: missing:' "$LOGS/$name.log" | sed 's/^env: //' || echo "exit $STEP_RC")"
  fi
  if [ -s "$WORK/path_extra" ]; then
    PATH="$(head -1 "$WORK/path_extra"):$PATH"
    export PATH
  fi
}

# lane_bg NAME FUNCTION: runs FUNCTION (its steps one after the other) in the
# background; its output is printed when join_bg collects it.
lane_bg() {
  local lane=$1 fn=$2 steps name any=0
  read -r -a steps <<<"${LANE_STEPS[$lane]}"
  for name in "${steps[@]}"; do
    register "$name"
    if kept "$name"; then any=1; fi
  done
  if [ "$any" = 0 ]; then return 0; fi
  ("$fn") >"$WORK/$fn.report" 2>&1 &
  BG_PIDS+=("$!")
  BG_STEPS+=("$fn")
  log "$lane lane (${LANE_STEPS[$lane]}) started"
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
    if kept "$name"; then record "$name" NOT-RUN 0 "$why"; fi
  done
}

# ---------------------------------------------------------------- what comes back
# summary_text FINAL: the summary, from the status files alone (the lanes write it too).
summary_text() {
  local final=$1 name status secs detail failed=() skipped=() dropped=() now
  now=$(($(date +%s) - START))
  echo "== summary: $MODE on $GPU ($MACHINE), $DAY, $now s of a ${BUDGET} s budget"
  if [ "$final" = 0 ]; then
    echo "== not final: rewritten after each step; if nothing follows, the command was stopped" \
      "in the step marked RUNNING, and the PENDING steps never started"
  fi
  while read -r name; do
    if [ -f "$WORK/$name.status" ]; then
      IFS=$'\t' read -r status secs detail <"$WORK/$name.status"
    else
      status=PENDING secs=0 detail=""
    fi
    if [ "$final" = 1 ] && { [ "$status" = PENDING ] || [ "$status" = RUNNING ]; }; then
      status=FAIL secs=0 detail="no result recorded (the script stopped before it finished)"
    fi
    printf '%-8s %-20s %5s s  %s\n' "$status" "$name" "$secs" "$detail"
    case "$status" in
      FAIL) failed+=("$name") ;;
      SKIP) skipped+=("$name") ;;
      DROPPED) dropped+=("$name") ;;
    esac
  done <"$WORK/steps"
  echo "== plan: $PLAN_LINE"
  if [ "$final" = 1 ] && [ "$FINAL_RC" != 0 ]; then
    echo "== the script itself stopped with exit $FINAL_RC${SIGNALED:+ ($SIGNALED)} (see the line reported above)"
  fi
  if [ ${#failed[@]} -gt 0 ]; then
    echo "== FAILED: ${failed[*]}"
  elif [ "$final" = 1 ] && [ "$FINAL_RC" = 0 ]; then
    echo "== no step failed"
  fi
  if [ ${#skipped[@]} -gt 0 ]; then
    echo "== SKIPPED, for a tool this machine lacks: ${skipped[*]}"
  fi
  if [ ${#dropped[@]} -gt 0 ]; then
    echo "== DROPPED to fit the ${BUDGET} s budget: ${dropped[*]}"
  fi
  for name in "${RESULTS[@]}"; do
    if [ -f "$OUT/$name" ]; then echo "== result: $OUT/$name"; fi
  done
  echo "== logs, junit XML, per-test results, sanitizer reports: $OUT/$PREFIX-logs.tar.gz"
}

# write_outputs FINAL [TAG]: the summary and the logs tarball, each replaced
# whole (written aside, then renamed), one writer at a time.
write_outputs() {
  local final=$1 tag=${2:-}
  (
    if [ "$HAVE_FLOCK" = 1 ]; then flock 9 || true; fi
    summary_text "$final" >"$WORK/summary.$BASHPID" && mv -f "$WORK/summary.$BASHPID" "$OUT/$PREFIX.txt"
    # tar's exit 1: a log grew while it was read (a lane still running); the archive is whole
    rc=0
    tar -czf "$WORK/logs.$BASHPID.tar.gz" -C "$WORK" logs 2>/dev/null || rc=$?
    if [ "$rc" -le 1 ]; then mv -f "$WORK/logs.$BASHPID.tar.gz" "$OUT/$PREFIX-logs.tar.gz"; fi
    if [ -n "$SNAPSHOTS" ] && [ -n "$tag" ]; then
      snap="$SNAPSHOTS/$(printf '%03d' "$(find "$SNAPSHOTS" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)")-$tag"
      mkdir -p "$snap"
      cp -p "$OUT"/* "$snap/" 2>/dev/null || true
    fi
  ) 9>"$WORK/outputs.lock" || log "could not write the summary or the logs tarball"
}

print_tables() {
  local entry name lines regex
  for entry in "${TABLES[@]}"; do
    IFS=$'\t' read -r name lines regex <<<"$entry"
    if [ "$(status_of "$name")" = PASS ] && [ -f "$LOGS/$name.log" ]; then
      echo "== table: $name"
      tail -n "$lines" "$LOGS/$name.log" | grep -E "$regex" || true
    fi
  done
}

FINAL_RC=0
finish() {
  FINAL_RC=$?
  local failed
  trap - EXIT ERR TERM INT
  set +e
  if [ -n "$SIGNALED" ]; then
    kill "${BG_PIDS[@]}" 2>/dev/null
  else
    join_bg
  fi
  print_tables
  write_outputs 1
  cat "$OUT/$PREFIX.txt"
  failed=$(grep -c '^FAIL ' "$OUT/$PREFIX.txt")
  rm -rf "$WORK"
  if [ "$FINAL_RC" != 0 ]; then exit "$FINAL_RC"; fi
  if [ "$failed" -gt 0 ]; then exit 1; fi
  exit 0
}
trap finish EXIT
trap 'SIGNALED="stopped by SIGTERM"; exit 143' TERM
trap 'SIGNALED="stopped by SIGINT"; exit 130' INT

# ---------------------------------------------------------------- the session
write_helpers() {
  # build.sh BUILD_CMD... -- CHECK_CMD...: BUILD_CMD, then CHECK_CMD, which
  # decides; after a failed BUILD_CMD only an extension written by it counts.
  cat >"$WORK/build.sh" <<'SH'
build=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do build+=("$1"); shift; done
shift
stamp=$(mktemp)
rc=0
"${build[@]}" || rc=$?
echo "== build: the build command exited $rc; the import check: $*"
if [ "$rc" = 0 ]; then
  "$@" && exit 0
  echo "== build: the build command passed, but the import check failed"
  exit 1
fi
if FP8COMM_BUILT_AFTER=$stamp "$@"; then
  echo "== build: counted as built: the build command exited $rc, but the extension it wrote imports with has_cuda"
  exit 0
fi
echo "== build: the build command exited $rc and the import check failed"
exit "$rc"
SH
  cat >"$WORK/has_cuda.py" <<'PY'
import os

import fp8comm

path = os.path.realpath(fp8comm._C.__file__)
assert path.startswith(os.path.realpath(os.getcwd()) + os.sep), f"fp8comm._C imported from {path}, not this tree"
stamp = os.environ.get("FP8COMM_BUILT_AFTER")
assert not stamp or os.path.getmtime(path) >= os.path.getmtime(stamp), f"{path} is older than this build"
assert fp8comm._C.has_cuda, "fp8comm was built without CUDA: see the 'fp8comm setup:' lines of build.log"
print("fp8comm._C with CUDA:", path)
PY
}

tests_lane() {
  pytest_step cuda-streams tests/backend/test_cuda_streams.py
  pytest_step cuda-backend -m "not soak" tests/backend/test_backend_cuda.py
  # its own process: a world eagerly connected to NCCL, split, then destroyed
  pytest_step cuda-eager-init tests/backend/test_eager_init_cuda.py
}

multirank_lane() {
  pytest_step cuda-multirank tests/backend/test_cuda_multirank.py
}

sanitizer_lane() {
  sanitizer_step memcheck "${CODEC_CAST_TESTS[@]}" -k "$MEMCHECK_K"
  sanitizer_step racecheck "${SHARED_MEMORY_TESTS[@]}" -k "$RACECHECK_K"
}

session() {
  local name lane_steps=() steps
  for name in "${LANES[@]}"; do
    read -r -a steps <<<"${LANE_STEPS[$name]}"
    lane_steps+=("${steps[@]}")
  done
  # the whole plan in the summary from the start: a kill leaves its PENDING steps listed
  for name in "${SERIAL[@]}" "${lane_steps[@]}"; do register "$name"; done
  for name in "${DROPPED[@]}"; do record "$name" DROPPED 0 "left out to fit the ${BUDGET} s budget (DROP_ORDER)"; done
  write_helpers
  env_step env python3 bench/gpu_session/env_check.py --path-file "$WORK/path_extra"
  build_step build env TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS="$CORES" python3 setup.py build_ext --inplace \
    -- python3 "$WORK/has_cuda.py"
  if ! passed build; then
    kernels_step nvcc-check build nvcc bash .ci/nvcc_check
    not_run "needs a CUDA build of fp8comm (the build failed)" "${SERIAL[@]:2}" "${lane_steps[@]}"
    return 0
  fi
  pytest_step codec-cast-tests "${CODEC_CAST_TESTS[@]}" "${GEMM_TESTS[@]}"
  # the model reads the E4M3 rows: those are the ones printed again
  bench_step codec-bench 200 '^op |^[^ ]+ +e4m3 ' python3 bench/codec.py --device cuda --sizes 1M,16M,64M,256M \
    --wire-format e4m3,mxfp4,nvfp4 --stochastic --json "$OUT/codec.json"
  bench_step linear-bench 30 . python3 bench/linear.py --reps 10 --casts --json "$OUT/linear.json"
  bench_step comm-bench 50 . torchrun --nproc_per_node=1 -m fp8comm.bench.comm --max-bytes 256M --reps 10 \
    --json "$OUT/comm-1rank.json"
  if ! kept model || passed codec-bench; then
    bench_step model 30 . python3 bench/model.py --codec-json "$OUT/codec.json" --json "$OUT/model.json"
  else
    not_run "needs the codec bench's JSON" model
  fi
  lane_bg tests tests_lane
  lane_bg multirank multirank_lane
  lane_bg sanitizers sanitizer_lane
  join_bg
}

# Steps that exercise the runner itself without a GPU: a lane of a passing
# pytest run (failing in `selftest`) beside the main line; the build judged
# by its import check (stand-in commands: in `selftest` both fail and the
# kernels' compile runs after it; in `selftest-pass` the build command fails
# after writing an extension that imports, which counts); in `selftest` also
# the env check with nothing on PATH, a failing run, one whose only test
# skips, a hung test that its per-test timeout fails while the run goes on,
# and a run cut at its step's cap; a passing pytest run under
# compute-sanitizer (a SKIP when none is found; the CPU tests put a stand-in
# on PATH); and a step after them all, which must still run.
selftest_lane() {
  local dir="$WORK/selftest" background=test_pass.py
  if [ "$MODE" = selftest ]; then background=test_fail.py; fi
  pytest_step selftest-background --rootdir="$dir" -c "$dir/pytest.ini" "$dir/$background"
}

selftest() {
  local dir="$WORK/selftest" py
  mkdir -p "$dir" "$WORK/empty-path"
  printf '[pytest]\n' >"$dir/pytest.ini"
  printf 'def test_passes():\n    assert 1 + 1 == 2\n' >"$dir/test_pass.py"
  printf 'def test_fails():\n    assert 1 + 1 == 3\n' >"$dir/test_fail.py"
  printf 'import pytest\n\n\ndef test_skips():\n    pytest.skip("needs a GPU")\n' >"$dir/test_skip.py"
  cat >"$dir/test_hang.py" <<'PY'
import time


def test_passes():
    pass


def test_hangs():
    time.sleep(60)


def test_after_the_hang():
    pass
PY
  local cfg=(--rootdir="$dir" -c "$dir/pytest.ini")
  CAP+=([selftest-background]=120 [selftest-env]=30 [selftest-build]=30 [selftest-nvcc-check]=30
    [selftest-pass]=120 [selftest-fail]=120 [selftest-all-skipped]=120 [selftest-hang]=60
    [selftest-cut]=6 [selftest-after]=30 [memcheck]=120)
  TEST_TIMEOUT+=([selftest-hang]=1 [selftest-cut]=60)
  apply_cap_overrides
  TEST_TIMEOUT_GRACE=2
  # a quick pytest start: only the plugins named with -p (gpu_session_guard)
  export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
  write_helpers
  lane_bg_selftest
  if [ "$MODE" = selftest ]; then
    py=$(python3 -c 'import sys; print(sys.executable)')
    env_step selftest-env env PATH="$WORK/empty-path" "$py" bench/gpu_session/env_check.py --no-torch
    build_step selftest-build bash -c 'echo "csrc/stand-in.cpp:1:1: error: a stand-in compile error"; exit 1' \
      -- false
    if ! passed selftest-build; then kernels_step selftest-nvcc-check selftest-build echo echo "nvcc -c csrc/stand-in.cu"; fi
  else
    build_step selftest-build bash -c 'echo "error: could not write to site-packages (a stand-in)"; exit 1' -- true
  fi
  pytest_step selftest-pass "${cfg[@]}" "$dir/test_pass.py"
  if [ "$MODE" = selftest ]; then
    pytest_step selftest-fail "${cfg[@]}" "$dir/test_fail.py"
    pytest_step selftest-all-skipped "${cfg[@]}" "$dir/test_skip.py"
    pytest_step selftest-hang "${cfg[@]}" "$dir/test_hang.py"
    pytest_step selftest-cut "${cfg[@]}" "$dir/test_hang.py"
  fi
  sanitizer_step memcheck "${cfg[@]}" "$dir/test_pass.py"
  cmd_step selftest-after true
  join_bg
}

lane_bg_selftest() {
  LANE_STEPS[selftest]=selftest-background
  lane_bg selftest selftest_lane
}

log "$MODE on $GPU ($MACHINE); results in $OUT"
if [ "$MODE" = session ]; then
  apply_cap_overrides
  fit_budget
  PLAN_LINE=$(plan_summary)
  log "plan: $PLAN_LINE"
  if [ ${#DROPPED[@]} -gt 0 ]; then
    log "plan: dropped to fit the ${BUDGET} s budget, in DROP_ORDER: ${DROPPED[*]}"
  fi
  if [ "$SCALE" -lt 100 ]; then
    log "plan: the caps after the build scaled to ${SCALE} % to fit the ${BUDGET} s budget"
  fi
  if [ "$SCALE" -lt "$SCALE_MIN" ]; then
    log "plan: WARNING: ${BUDGET} s is less than env, the build and the codec tests need; they may not finish"
  fi
  log "results: ${RESULTS[*]} (+ the summary and the logs tarball)"
  session
else
  PLAN_LINE="selftest: no plan"
  selftest
fi
