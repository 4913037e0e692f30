#!/usr/bin/env bash
# The timed runs of router-straggler-vec, each in the quiet lane. Run from the route worktree:
#   bash <this file> <round> [reverse]
# order: main off, main on, branch off, branch on; `reverse`: branch on, branch off, main on,
# main off (rounds alternate so no configuration always runs in the same slot).
set -euo pipefail
R=${1:-1}
D=benchmarks/results/router-straggler-vec
ARGS=(--prompt-tokens 8192 --replicas 64,256,1024 --iterations 300 --ingest-blocks 0 --json)
PY=/work/main/.venv/bin/python
PD=/work/main/.venv/bin/pdorch
main_off() { PYTHONPATH=/work/main /tmp/s9/inquiet.sh $PD bench router "${ARGS[@]}" --out $D/main-off-$R.json >/dev/null; }
main_on() { PYTHONPATH=/work/main /tmp/s9/inquiet.sh $PY $D/main_policy.py '{"remaining_decode": true}' "${ARGS[@]}" --out $D/main-on-$R.json >/dev/null; }
branch_off() { PYTHONPATH=$PWD /tmp/s9/inquiet.sh $PD bench router --policy token_load "${ARGS[@]}" --out $D/branch-off-$R.json >/dev/null; }
branch_on() { PYTHONPATH=$PWD /tmp/s9/inquiet.sh $PD bench router --policy token_load@remaining_decode=true "${ARGS[@]}" --out $D/branch-on-$R.json >/dev/null; }
if [ "${2:-}" = reverse ]; then
  branch_on; branch_off; main_on; main_off
else
  main_off; main_on; branch_off; branch_on
fi
