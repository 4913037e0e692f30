#!/bin/bash
# proxy-9's timed runs, each its own quiet-lane job (/tmp/s9/inquiet.sh, each under 3 min), in
# this order: the A/B (main vs the branch, whole answers, each exported with
# `git archive <commit> | tar -x -C DIR` and run from its own tree by PYTHONPATH, alternated),
# then the branch's whole answers with every target, then its 256-token streams (one job per C).
# Usage: run.sh MAIN_COMMIT BRANCH_COMMIT
set -u
B=/work/main/.venv/bin
T=/tmp/proxy9
R=/work/wt/proxy/benchmarks/results
mkdir -p $T/base $T/branch
(cd /work/wt/proxy && git archive "$1" | tar -x -C $T/base && git archive "$2" | tar -x -C $T/branch)
q() {  # name, dir, command...
  local name=$1 dir=$2; shift 2
  cd "$dir" && PYTHONPATH=$dir /tmp/s9/inquiet.sh bash -c "echo $name-start \$(date -u +%H:%M:%S) load \$(cut -d' ' -f1-3 /proc/loadavg) >> $T/quiet_times.txt; timeout 180 $* > $T/$name.out 2> $T/$name.err; echo $name-end \$(date -u +%H:%M:%S) rc \$? load \$(cut -d' ' -f1-3 /proc/loadavg) >> $T/quiet_times.txt"
}
for i in 1 2 3; do
  for side in base branch; do
    q ab-$side-$i $T/$side $B/pdorch bench proxy --requests 1000 --concurrency 1,32 --rounds 2 --targets vllm-router,pdorch-native --json --out $R/proxy-9-ab/ab-$side-$i.json
  done
done
q whole $T/branch $B/pdorch bench proxy --requests 1000 --concurrency 1,32 --rounds 4 --targets direct,vllm-router,pdorch-aiohttp,pdorch-native --json --out $R/proxy-9-whole.json
for c in 1 32 256; do
  n=$([ $c = 1 ] && echo 512 || echo 1024)
  q stream-c$c $T/branch $B/pdorch bench proxy --stream --max-tokens 256 --requests $n --warmup 16 --concurrency $c --rounds 2 --targets direct,vllm-router,pdorch-native --json --out $R/proxy-9-stream-c$c.json
done
echo done >> $T/quiet_times.txt
