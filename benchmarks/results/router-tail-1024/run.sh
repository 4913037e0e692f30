#!/usr/bin/env bash
# The timed runs of router-tail-1024, each job in the quiet lane. From the route worktree:
#   bash <this file> <round> [reverse]
# main: /work/main (shipped profile, remaining_decode on, identity scan per pick);
# branch: this tree (same profile, the table synced from the ColumnBuilder's RowVersions);
# branch-off: this tree with remaining_decode=false (the term off).
set -euo pipefail
R=${1:-1}
D=benchmarks/results/router-tail-1024
ARGS=(--prompt-tokens 8192 --replicas 256,1024 --iterations 300 --ingest-blocks 0 --json)
PD=/work/main/.venv/bin/pdorch
main() { PYTHONPATH=/work/main /tmp/s9/inquiet.sh $PD bench router "${ARGS[@]}" --out $D/main-$R.json >/dev/null; }
branch() { PYTHONPATH=$PWD /tmp/s9/inquiet.sh $PD bench router "${ARGS[@]}" --out $D/branch-$R.json >/dev/null; }
branch_off() { PYTHONPATH=$PWD /tmp/s9/inquiet.sh $PD bench router --policy token_load@remaining_decode=false "${ARGS[@]}" --out $D/branch-off-$R.json >/dev/null; }
if [ "${2:-}" = reverse ]; then
  branch_off; branch; main
else
  main; branch; branch_off
fi
