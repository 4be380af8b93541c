#!/usr/bin/env bash
# Everything a GPU session owes, in ONE device call (README, "On a lent GPU"):
#   run(command="bash bench/gpu_session.sh", timeout_s=600)
#   run(command="FP8COMM_GPU_SESSION_BUDGET_S=B bash bench/gpu_session.sh", timeout_s=B+30)
# A thin wrapper: the runner is bench/gpu_session/ (its step table in steps.py,
# the budget's plan in plan.py; modes, variables and results in main.py).
#   bash bench/gpu_session.sh [selftest | selftest-pass]
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 bench/gpu_session/__main__.py "$@"
