#!/usr/bin/env bash
set -u
OUT=/tmp/edge10/ab
run() { tree=$1; n=$2; if [ $tree = main ]; then dir=/tmp/edge10/main; else dir=/work/wt/edge; fi
  cd $dir; uptime >> $OUT/$tree-load.txt
  PYTHONPATH=$dir timeout 280 /tmp/s9/inquiet.sh /work/main/.venv/bin/pdorch bench proxy --requests 3000 --concurrency 1,32 --rounds 2 --targets direct,vllm-router,pdorch-native --json --out $OUT/$tree-$n.json > $OUT/$tree-$n.stdout 2> $OUT/$tree-$n.stderr
  echo "$n rc=$?" >> $OUT/$tree-load.txt; uptime >> $OUT/$tree-load.txt; }
run branch 2; run main 2; run main 3; run branch 3
cd /work/wt/edge; uptime > $OUT/stream-load.txt
PYTHONPATH=/work/wt/edge timeout 290 /tmp/s9/inquiet.sh /work/main/.venv/bin/pdorch bench proxy --stream --max-tokens 256 --requests 1024 --warmup 16 --concurrency 1,32,256 --rounds 2 --targets direct,vllm-router,pdorch-native --json --out $OUT/branch-stream.json > $OUT/stream.stdout 2> $OUT/stream.stderr
echo "rc=$?" >> $OUT/stream-load.txt; uptime >> $OUT/stream-load.txt
