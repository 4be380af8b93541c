# shellcheck shell=bash
# Stage runner for .ci/run (sourced): `stage NAME CMD...` runs CMD, prints its
# seconds, and holds them to NAME's budget in .ci/budgets. CMD runs as
# `CMD || rc=$?`, where bash ignores set -e: a function given as CMD must
# return its first failure itself. A failing command
# ends the run at once (after the report); a stage over its budget is reported
# and fails the run at the end, once every stage's seconds are known.
STAGE_NAMES=()
STAGE_SECS=()
STAGE_OVER=()
CI_START=$SECONDS

budget_of() {  # budget_of NAME: seconds, from .ci/budgets ("NAME SECONDS" lines)
  awk -v n="$1" '$1 == n { print $2; found = 1 } END { if (!found) print "" }' "$ROOT/.ci/budgets"
}

stages_report() {
  local i budget total=$((SECONDS - CI_START)) limit
  limit=$(budget_of total)
  echo "== stages (seconds / budget)"
  for i in "${!STAGE_NAMES[@]}"; do
    budget=$(budget_of "${STAGE_NAMES[$i]}")
    printf '%-12s %6s / %-6s %s\n' "${STAGE_NAMES[$i]}" "${STAGE_SECS[$i]}" "${budget:-none}" "${STAGE_OVER[$i]}"
  done
  printf '%-12s %6s / %-6s\n' total "$total" "${limit:-none}"
  if [ -n "$limit" ] && [ "$total" -gt "$limit" ]; then
    echo "== CI took ${total} s, over its ${limit} s budget (.ci/budgets): make room before adding more"
    return 1
  fi
  for i in "${!STAGE_OVER[@]}"; do
    if [ -n "${STAGE_OVER[$i]}" ]; then
      echo "== ${STAGE_NAMES[$i]} ran over its budget (.ci/budgets): make room in it, or move the budget with a reason"
      return 1
    fi
  done
  echo "== every stage within its budget"
}

stage() {  # stage NAME CMD...
  local name=$1 t0 rc=0 budget
  shift
  budget=$(budget_of "$name")
  if [ -z "$budget" ]; then
    echo "== stage $name has no budget in .ci/budgets" >&2
    return 1
  fi
  echo "== $name (budget ${budget} s)"
  t0=$SECONDS
  "$@" || rc=$?
  STAGE_NAMES+=("$name")
  STAGE_SECS+=("$((SECONDS - t0))")
  if [ $((SECONDS - t0)) -gt "$budget" ]; then STAGE_OVER+=("OVER BUDGET"); else STAGE_OVER+=(""); fi
  echo "== $name: $((SECONDS - t0)) s (budget ${budget} s)"
  if [ "$rc" != 0 ]; then
    echo "== $name failed (exit $rc)"
    stages_report || true
    exit "$rc"
  fi
}
