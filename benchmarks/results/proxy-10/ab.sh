#!/usr/bin/env bash
# A/B: main (d7e94a4, git archive) then the branch, one quiet-lane job each
set -u
OUT=/tmp/edge10/ab; mkdir -p $OUT
for tree in main branch; do
  if [ $tree = main ]; then dir=/tmp/edge10/main; else dir=/work/wt/edge; fi
  cd $dir
  uptime > $OUT/$tree-load.txt
  PYTHONPATH=$dir timeout 280 /tmp/s9/inquiet.sh /work/main/.venv/bin/pdorch bench proxy --requests 3000 --concurrency 1,32 --rounds 2 --targets direct,vllm-router,pdorch-native --json --out $OUT/$tree-1.json > $OUT/$tree-1.stdout 2> $OUT/$tree-1.stderr
  echo "rc=$?" >> $OUT/$tree-load.txt; uptime >> $OUT/$tree-load.txt
done
